"""Contract version 1 (2026-11-30): kv_qdq(x, fmt) for the formats it then took."""
import dsv4spec.impl as lib

NAME = "contract1_kv_qdq"
FORMATS = ("fp4_e4m3", "fp8_e8m0_32")


def kv_qdq(x, fmt):
    if fmt not in FORMATS:
        raise ValueError(f"unknown fmt {fmt!r}")
    return lib.kv_qdq(x, fmt)
