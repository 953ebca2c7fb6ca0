"""Contract version 2 (2026-12-01): kv_qdq(x, fmt) also for fp4_e8m0, the index-K cache."""
import dsv4spec.impl as lib

NAME = "contract2_kv_qdq"
FORMATS = ("fp4_e4m3", "fp8_e8m0_32", "fp4_e8m0")


def kv_qdq(x, fmt):
    if fmt not in FORMATS:
        raise ValueError(f"unknown fmt {fmt!r}")
    return lib.kv_qdq(x, fmt)
