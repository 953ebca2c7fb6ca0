"""Contract version 2, wrong: its fp4_e8m0 takes the E4M3 scale per 16 of the main KV's format."""
import dsv4spec.impl as lib

NAME = "contract2_kv_qdq_wrong"


def kv_qdq(x, fmt):
    if fmt not in ("fp4_e4m3", "fp8_e8m0_32", "fp4_e8m0"):
        raise ValueError(f"unknown fmt {fmt!r}")
    return lib.kv_qdq(x, "fp4_e4m3" if fmt == "fp4_e8m0" else fmt)
