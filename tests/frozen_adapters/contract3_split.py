"""Contract version 3 (2026-12-01): one operation per format."""
import dsv4spec.impl as lib

NAME = "contract3_split"


def kv_qdq_fp4_e4m3(x):
    return lib.kv_qdq(x, "fp4_e4m3")


def kv_qdq_fp8_e8m0_32(x):
    return lib.kv_qdq(x, "fp8_e8m0_32")


def kv_qdq_fp4_e8m0(x):
    return lib.kv_qdq(x, "fp4_e8m0")
