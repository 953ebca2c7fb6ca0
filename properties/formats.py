"""Checks of the element formats (FMT.*): the casts every codec is built from.

Operations checked (all take and return CPU tensors):

    e2m1_encode(x f32) -> uint8 codes       e2m1_decode(codes uint8) -> f32
    e4m3_encode(x f32) -> uint8             e4m3_decode(uint8) -> f32
    e8m0_decode(uint8) -> f32               bf16_round(x f32) -> f32 (value of the nearest bf16)

The decoders are checked exhaustively (16 and 256 codes), bf16_round on every BF16 pattern and the
fp32 neighbours of every rounding boundary, the encoders on dense sweeps around every decision
boundary plus Hypothesis draws biased toward ties, ulps, subnormals and saturation.  These are the
only operations the `ml_dtypes` and `torch` cast targets provide, so their rows judge those casts.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import formats as F
from ..spec import quant as Q
from . import boundaries as B
from .compare import as_numpy, assert_bytes_equal, assert_equal
from .checking import check, forall

__all__ = ["e2m1_text", "e4m3_text", "e8m0_text", "packed_text", "f32_text", "spec_knobs",
           "edge_f32", "tensor", "neighbours", "f32_arrays", "fit", "fed"]

# ---------------------------------------------------------------------------------------------
# Decoding a code for a failure message
# ---------------------------------------------------------------------------------------------


def e2m1_text(code: int) -> str:
    code = int(code)
    if code > 15:
        return f"not a nibble ({code})"
    return f"s={code >> 3} e={(code >> 1) & 3:02b} m={code & 1} ({float(F.E2M1_VALUES[code]):g})"


def e4m3_text(byte: int) -> str:
    byte = int(byte) & 0xFF
    value = float(F.e4m3_decode(np.array([byte]))[0])
    return f"s={byte >> 7} e={(byte >> 3) & 0xF:04b} m={byte & 7:03b} ({value!r})"


def e8m0_text(byte: int) -> str:
    byte = int(byte) & 0xFF
    return "NaN" if byte == 0xFF else f"2^{byte - 127}"


def packed_text(byte: int) -> str:
    byte = int(byte) & 0xFF
    return f"[lo {e2m1_text(byte & 0xF)} | hi {e2m1_text(byte >> 4)}]"


def f32_text(bits: int) -> str:
    bits = int(bits) & 0xFFFFFFFF
    value = float(F.f32_from_bits(np.array([bits]))[0])
    return f"s={bits >> 31} e={(bits >> 23) & 0xFF:08b} m={bits & 0x7FFFFF:023b} ({value!r})"


def spec_knobs(target, fn) -> dict:
    """The knob values `target` is expected to follow, for the keyword arguments of spec `fn`."""
    return {name: target.variant(name) for name, p in inspect.signature(fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


BF16_MAX = float(F.f32_from_bits(np.array([0x7F7F << 16]))[0])


def fit(target, op: str, x) -> np.ndarray:
    """x as values `op` of `target` can receive: rounded to its declared input dtype (spec's exact
    BF16 rounding, a finite value staying finite: beyond the largest BF16 it becomes ±BF16_MAX;
    float32 leaves x as it is)."""
    x = np.asarray(x, dtype=np.float32)
    if target.input_dtype(op) != "bfloat16":
        return x
    with np.errstate(invalid="ignore"):
        big = np.isfinite(x) & (np.abs(x) > BF16_MAX)
    return np.where(big, np.copysign(np.float32(BF16_MAX), x), F.bf16_round(x)).astype(np.float32)


def fed(target, op: str, x) -> tuple[np.ndarray, torch.Tensor]:
    """(the values `op` receives, a tensor of its declared input dtype holding exactly them)."""
    x = fit(target, op, x)
    t = tensor(x)
    return x, (t.to(torch.bfloat16) if target.input_dtype(op) == "bfloat16" else t)


def _value_context(x):
    flat = np.asarray(x, dtype=np.float32)
    return lambda idx: f"input {flat[idx]!r} (fp32 bits 0x{int(F.f32_bits(flat[idx])[0]):08x})"


# ---------------------------------------------------------------------------------------------
# Edge-biased fp32 strategies
# ---------------------------------------------------------------------------------------------


def neighbours(values, ulps: int = 2) -> np.ndarray:
    """Each fp32 value and its ±1..ulps neighbours, both signs."""
    v = np.asarray(values, dtype=np.float32)
    bits = F.f32_bits(np.abs(v))
    around = np.concatenate([bits + d for d in range(-ulps, ulps + 1)])
    around = F.f32_from_bits(np.clip(around, 0, 0x7F7FFFFF))
    return np.concatenate([around, -around])


E2M1_EDGES = neighbours(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES + (6.5, 7.0, 8.0, 12.0))
E4M3_GRID = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8)))
E4M3_MIDPOINTS = (E4M3_GRID[1:] + E4M3_GRID[:-1]) / 2        # exact in fp32 (one more bit)
E4M3_EDGES = neighbours(np.concatenate([E4M3_GRID, E4M3_MIDPOINTS, [464.0, 480.0, 2.0 ** -10]]))


def edge_f32(edges, *, lo=None, hi=None):
    """fp32 values: the given edges, their scalings by 2^k, and arbitrary fp32s, all in [lo, hi]."""
    anywhere = st.floats(width=32, allow_nan=False, allow_infinity=False,
                         min_value=lo, max_value=hi)
    pick = st.sampled_from([float(e) for e in edges if (lo is None or e >= lo) and (hi is None or e <= hi)])
    return st.one_of(pick, anywhere)


def f32_arrays(elements, max_size: int = 64, min_size: int = 16):
    """Arrays of the elements, at least min_size of them, so that each example draws many edges."""
    return st.lists(elements, min_size=min_size, max_size=max_size).map(lambda v: np.array(v, dtype=np.float32))


def grouped_f32(groups, *, signed: bool = True):
    """fp32 values from groups of points (each group one boundary): a group uniformly, then a point,
    then (signed) a sign."""
    groups = [[float(v) for v in g] for g in groups if len(g)]
    value = st.one_of([st.sampled_from(g) for g in groups])
    return either_sign(value) if signed else value


def either_sign(values):
    """v or −v, each half the time (a flatmap per element costs 5× the draws' time)."""
    return st.tuples(values, st.booleans()).map(lambda vs: -vs[0] if vs[1] else vs[0])


# ---------------------------------------------------------------------------------------------
# E2M1
# ---------------------------------------------------------------------------------------------

E2M1_TIES_AT_SCALE_1 = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
                                 -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0], dtype=np.float32)


def _check_e2m1_encode(target, x, what, zero_sign=False):
    """The target's codes against the spec's; ±0 alike, or (zero_sign) only the sign of the codes
    that are zero on both sides: each check judges its own clause."""
    x, t = fed(target, "e2m1_encode", x)
    expected = F.e2m1_encode(x, **{"ties": target.variant("e2m1_ties"),
                                   "overflow": target.variant("e2m1_overflow"),
                                   "zero_sign": target.variant("e2m1_zero_sign")}).astype(np.int64)
    actual = as_numpy(target.e2m1_encode(t)).astype(np.int64)
    zero = ((actual & 7) == 0) & ((expected & 7) == 0)
    actual = np.where(zero != zero_sign, expected, actual)
    assert_bytes_equal(actual, expected, what=what, decode=e2m1_text, context=_value_context(x))


@check("FMT.E2M1.VALUES", ops=("e2m1_decode",))
def e2m1_decodes_all_16_codes(target):
    codes = np.arange(16, dtype=np.uint8)
    assert_equal(target.e2m1_decode(tensor(codes)), F.E2M1_VALUES,
                 what="FMT.E2M1.VALUES: e2m1_decode(code)",
                 context=lambda idx: f"code {e2m1_text(idx[0])}")


@check("FMT.E2M1.RNE", ops=("e2m1_encode",))
def e2m1_encode_every_boundary(target):
    """Every fp32 within 2 ulps of each boundary and magnitude, |x| ≤ 6 (beyond is FMT.E2M1.SATURATE's)."""
    x = fit(target, "e2m1_encode", E2M1_EDGES)
    x = x[np.abs(x) <= 6]
    _check_e2m1_encode(target, x, "FMT.E2M1.RNE: e2m1_encode near the decision boundaries")


@check("FMT.E2M1.RNE", ops=("e2m1_encode",))
@forall(dict(x=E2M1_TIES_AT_SCALE_1), x=f32_arrays(st.one_of(edge_f32(E2M1_EDGES, lo=-6.0, hi=6.0),
                                                       grouped_f32(B.E2M1_TIE_GROUPS[:-1]))))
def e2m1_encode_rounds_to_nearest_even(target, x):
    _check_e2m1_encode(target, x, "FMT.E2M1.RNE: e2m1_encode")


@check("FMT.E2M1.SATURATE", ops=("e2m1_encode",))
@forall(dict(x=np.array([6.25, 7.0, -7.0, 8.0, 12.0, 1e30, -3.4e38], dtype=np.float32)), dict(x=B.E2M1_SATURATE),
        x=f32_arrays(either_sign(st.one_of(edge_f32(E2M1_EDGES[E2M1_EDGES > 6], lo=6.0),
                                       grouped_f32(B.E2M1_TIE_GROUPS[-3:]),
                                       st.floats(min_value=6.0, width=32, exclude_min=True, allow_infinity=False)))))
def e2m1_encode_saturates(target, x):
    _check_e2m1_encode(target, x, "FMT.E2M1.SATURATE: e2m1_encode of |x| > 6")


@check("FMT.E2M1.ZERO_SIGN", ops=("e2m1_encode",))
@forall(dict(x=np.array([-0.0, -0.25, -0.1, -2.0 ** -149, 0.0], dtype=np.float32)), dict(x=B.E2M1_ZERO_SIGN),
        x=f32_arrays(st.one_of(edge_f32(np.array([-0.0, -0.25, -2.0 ** -149, -1e-30]), lo=-0.25, hi=0.0),
                               grouped_f32([[0.0], *B.beside([0.25])], signed=False).map(lambda v: -v))))
def e2m1_encode_keeps_negative_zero(target, x):
    _check_e2m1_encode(target, x, "FMT.E2M1.ZERO_SIGN: e2m1_encode of −0.25 ≤ x ≤ 0", zero_sign=True)


# ---------------------------------------------------------------------------------------------
# E4M3
# ---------------------------------------------------------------------------------------------


def _check_e4m3_encode(target, x, what):
    x, t = fed(target, "e4m3_encode", x)
    expected = F.e4m3_encode(x, overflow=target.variant("e4m3_overflow"))
    actual = as_numpy(target.e4m3_encode(t)).astype(np.int64)
    nan = (expected & 0x7F) == 0x7F                 # any NaN code will do: 0x7F or 0xFF
    actual = np.where(nan & ((actual & 0x7F) == 0x7F), expected, actual)
    assert_bytes_equal(actual, expected, what=what, decode=e4m3_text, context=_value_context(x))


@check("FMT.E4M3.VALUES", ops=("e4m3_decode",))
def e4m3_decodes_all_256_bytes(target):
    codes = np.arange(256, dtype=np.uint8)
    assert_equal(target.e4m3_decode(tensor(codes)), F.e4m3_decode(codes),
                 what="FMT.E4M3.VALUES: e4m3_decode(byte)", context=lambda idx: e4m3_text(idx[0]))


@check("FMT.E4M3.RNE", ops=("e4m3_encode",))
def e4m3_encode_every_boundary(target):
    """Every fp32 within 2 ulps of each E4M3 value and of each midpoint, |x| ≤ 464."""
    x = E4M3_EDGES[np.abs(E4M3_EDGES) <= 464]
    _check_e4m3_encode(target, x, "FMT.E4M3.RNE: e4m3_encode near the grid and its midpoints")


@check("FMT.E4M3.RNE", ops=("e4m3_encode",))
@forall(dict(x=np.array([2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -149, -2.0 ** -149, -0.0, 0.0,
                         1.0625, 1.1875, 0.01, 0.05 / 6, 464.0, -464.0], dtype=np.float32)),
        x=f32_arrays(st.one_of(edge_f32(E4M3_EDGES, lo=-464.0, hi=464.0), grouped_f32(B.E4M3_MIDPOINT_GROUPS))))
def e4m3_encode_rounds_to_nearest_even(target, x):
    _check_e4m3_encode(target, x, "FMT.E4M3.RNE: e4m3_encode")


@check("FMT.E4M3.SATFINITE", ops=("e4m3_encode",))
@forall(dict(x=np.array([464.00003, 480.0, -480.0, 1e6, np.inf, -np.inf, 3.4e38], dtype=np.float32)),
        dict(x=B.E4M3_SATFINITE),
        x=f32_arrays(st.one_of(either_sign(st.floats(min_value=464.0, exclude_min=True, width=32)),
                               st.sampled_from([464.00003, 479.99997, 480.0, 2785.0 / 6]),
                               grouped_f32([*B.beside([448.0])[1:], *B.beside([464.0])[:2], [np.inf], [np.nan]]))))
def e4m3_encode_saturates(target, x):
    _check_e4m3_encode(target, x, "FMT.E4M3.SATFINITE: e4m3_encode of |x| > 464")


@check("FMT.E4M3.SATFINITE", ops=("e4m3_encode",))
def e4m3_encode_nan_only_from_nan(target):
    """Quiet and signalling NaNs of both signs: 0x7F, or 0xFF when the sign bit is set — the sign of
    the NaN the target is given (a BF16 target receives torch's conversion, which may change it)."""
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001], dtype=np.int64)
    given = fed(target, "e4m3_encode", F.f32_from_bits(bits))[1]
    actual = as_numpy(target.e4m3_encode(given)).astype(np.int64)
    expected = 0x7F | as_numpy(torch.signbit(given)).astype(np.int64) << 7
    assert np.array_equal(actual, expected), \
        f"FMT.E4M3.SATFINITE: e4m3_encode(NaN) gave {[hex(a) for a in actual]}, expected {[hex(e) for e in expected]}"


# ---------------------------------------------------------------------------------------------
# E8M0, BF16
# ---------------------------------------------------------------------------------------------


@check("FMT.E8M0.VALUES", ops=("e8m0_decode",))
def e8m0_decodes_all_256_bytes(target):
    codes = np.arange(256, dtype=np.uint8)
    assert_equal(target.e8m0_decode(tensor(codes)), F.e8m0_decode(codes),
                 what="FMT.E8M0.VALUES: e8m0_decode(byte)", context=lambda idx: e8m0_text(idx[0]))


def _check_bf16(target, x, what):
    x, t = fed(target, "bf16_round", x)
    expected = F.f32_bits(F.bf16_round(x))
    actual = F.f32_bits(as_numpy(target.bf16_round(t)))
    nan = np.isnan(F.bf16_round(x))
    actual = np.where(nan & np.isnan(F.f32_from_bits(actual)), expected, actual)  # any NaN will do
    assert_bytes_equal(actual, expected, what=what, decode=f32_text, context=_value_context(x),
                       values=F.f32_from_bits, inputs=x)


@check("FMT.BF16.RNE", ops=("bf16_round",))
def bf16_round_every_pattern_and_its_midpoints(target):
    """All 65536 BF16 patterns, each with the low halves 0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF (low half 1
    on 0x7F80: the NaN whose payload is only the lowest bit, which a NaN test on the upper bits misses)."""
    high = np.arange(1 << 16, dtype=np.int64) << 16
    x = F.f32_from_bits(np.concatenate([high + low for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]))
    _check_bf16(target, x, "FMT.BF16.RNE: bf16_round")


@check("FMT.BF16.RNE", ops=("bf16_round",))
@forall(x=f32_arrays(st.floats(width=32, allow_nan=True, allow_infinity=True)))
def bf16_round_any_fp32(target, x):
    _check_bf16(target, x, "FMT.BF16.RNE: bf16_round")


# ---------------------------------------------------------------------------------------------
# ceil(log2), through the E8M0 scale bytes of the power-of-two codecs
# ---------------------------------------------------------------------------------------------


def ceil_log2_sweep(max_value: float, lowest: float) -> np.ndarray:
    """Block amaxes max_value·2^k and 7/8·2^k multiples, ±1 ulp, over the whole range above lowest."""
    k = np.arange(-149, 128, dtype=np.float64)
    bases = np.concatenate([max_value * 2.0 ** k, 7 * 2.0 ** k, 8 * 2.0 ** k])
    bases = bases[(bases >= lowest) & (bases < 3.0e38)].astype(np.float32)
    return np.abs(neighbours(bases, ulps=1))


def _check_single_element_scales(target, op, quantize, expected_scale, block, amax, what):
    amax = fit(target, op, amax)
    x = np.zeros((amax.size, block), dtype=np.float32)
    x[np.arange(amax.size), np.arange(amax.size) % block] = amax
    x[1::2] *= -1
    scales = quantize(fed(target, op, x)[1])[1]
    expected = expected_scale(amax)
    assert_bytes_equal(as_numpy(scales).reshape(-1), expected, what=what, decode=e8m0_text,
                       context=lambda idx: f"single nonzero block, amax {amax[idx[0]]!r}")


@check("FMT.CEIL_LOG2", ops=("fp4_e8m0_quantize",))
def ceil_log2_of_the_fp4_scale(target):
    amax = ceil_log2_sweep(6.0, 6 * 2.0 ** -126)
    knobs = spec_knobs(target, Q.fp4_e8m0_scale)
    _check_single_element_scales(target, "fp4_e8m0_quantize", target.fp4_e8m0_quantize,
                                 lambda a: Q.fp4_e8m0_scale(a, **knobs), Q.FP4_IDX_BLOCK, amax,
                                 "FMT.CEIL_LOG2: E8M0 scale of fp4_e8m0_quantize (amax·fl32(1/6))")


@check("FMT.CEIL_LOG2", ops=("fp8_quantize",))
def ceil_log2_of_the_fp8_scale(target):
    amax = ceil_log2_sweep(448.0, 1e-4)
    knobs = spec_knobs(target, Q.fp8_scale)
    _check_single_element_scales(target, "fp8_quantize", lambda x: target.fp8_quantize(x, 32),
                                 lambda a: Q.fp8_scale(a, **knobs), 32, amax,
                                 "FMT.CEIL_LOG2: E8M0 scale of fp8_quantize (amax·fl32(1/448))")
