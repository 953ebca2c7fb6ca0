"""Checks of the FP4 and FP8 codecs (FP4.*, FP8.*): the operation contract a target implements.

Operations (CPU torch tensors; values float32 or bfloat16, contiguous, last dimension a multiple of
the block; codes and bytes uint8):

    e2m1_encode(x)                 -> codes uint8 [...]         nearest E2M1 code, ties to even, ±6 saturation
    e2m1_decode(codes)             -> f32 [...]                 FP4_TABLE[code]
    e4m3_encode(x)                 -> uint8 [...]               nearest float8_e4m3fn, satfinite
    e4m3_decode(b)                 -> f32 [...]                 value of a float8_e4m3fn byte (0x7F/0xFF NaN)
    e8m0_decode(b)                 -> f32 [...]                 2^(b − 127), 0xFF NaN
    bf16_round(x)                  -> f32 [...]                 value of the nearest bfloat16 (RNE)
    fp4_pack(codes [..., n])       -> uint8 [..., n/2]          element 2i low nibble, 2i+1 high nibble
    fp4_unpack(packed [..., n/2])  -> codes uint8 [..., n]      inverse of fp4_pack
    fp4_e4m3_quantize(x [..., 16k])  -> (packed [..., 8k], E4M3 scales [..., k])     V4.1 main KV
    fp4_e4m3_dequantize(packed, scales) -> f32 [..., 16k]       E2M1 value × E4M3 scale
    fp4_e8m0_quantize(x [..., 32k])  -> (packed [..., 16k], E8M0 scales [..., k])    indexer Q/K
    fp4_e8m0_dequantize(packed, scales) -> f32 [..., 32k]       E2M1 value × 2^(b − 127)
    fp8_quantize(x [..., b·k], block)   -> (E4M3 [..., b·k], E8M0 scales [..., k])   act_quant
    fp8_dequantize(q, scales, block)    -> f32 [..., b·k]       E4M3 value × 2^(b − 127)
    fp8_qdq(x [..., b·k], block)        -> f32 [..., b·k]       the in-place act_quant QDQ result
    fp8_linear(x [..., K], w [N, K], w_scale [ceil(N/b), K/b], block) -> f32 [..., N]   (BF16 values)
        the Linear of an E4M3 weight: x BF16 values, w E4M3 bytes, w_scale E8M0 bytes (uint8, or
        the torch float8_e4m3fn / float8_e8m0fnu tensors of a checkpoint); act_quant, block-scaled GEMM

The quantizers' values arrive in the dtype the target declares for them (runner/target.py): a
BF16-only quantizer gets BF16 tensors holding BF16 values, the official domain.  A NaN or ±Inf in a
quantizer's input may do anything to its own block, never to the others (FP4.NONFINITE,
FP8.NONFINITE); raising ValueError instead is allowed and reported.  The rules are in spec/quant.py.

Payload checks judge the codes against the target's OWN scale bytes, so a wrong scale is reported
once, on its scale rule, and not again on every value rule.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import formats as F
from ..spec import quant as Q
from ..spec.indexer import bf16_quantum
from ..spec.path import matmul, matmul_tolerance
from ..spec.rules import KNOBS, V4, V41
from .compare import as_numpy, assert_bytes_equal, assert_equal, assert_same_shape, assert_within
from . import boundaries as B
from .formats import (e2m1_text, e4m3_text, e8m0_text, fed, fit, packed_text, spec_knobs, tensor)
from .checking import check, declared_choice, detected, forall

OPS = {
    "e2m1_encode": "e2m1_encode(x f32) -> uint8 codes: nearest E2M1, ties to even, saturating at ±6, −0 kept",
    "e2m1_decode": "e2m1_decode(codes uint8) -> f32: FP4_TABLE[code]",
    "e4m3_encode": "e4m3_encode(x f32) -> uint8: nearest float8_e4m3fn (RNE), saturating at ±448, NaN -> 0x7F",
    "e4m3_decode": "e4m3_decode(uint8) -> f32: value of a float8_e4m3fn byte",
    "e8m0_decode": "e8m0_decode(uint8) -> f32: 2^(b − 127), 0xFF -> NaN",
    "bf16_round": "bf16_round(x f32) -> f32: value of the nearest bfloat16 (RNE)",
    "fp4_pack": "fp4_pack(codes uint8 [..., n]) -> uint8 [..., n/2]: element 2i in the low nibble",
    "fp4_unpack": "fp4_unpack(packed uint8 [..., n/2]) -> uint8 codes [..., n]",
    "fp4_e4m3_quantize": "fp4_e4m3_quantize(x [..., 16k]) -> (packed uint8 [..., 8k], E4M3 scales uint8 "
                         "[..., k]): V4.1 main KV",
    "fp4_e4m3_dequantize": "fp4_e4m3_dequantize(packed, scales) -> f32 [..., 16k]",
    "fp4_e8m0_quantize": "fp4_e8m0_quantize(x [..., 32k]) -> (packed uint8 [..., 16k], E8M0 scales uint8 "
                         "[..., k]): indexer Q/K",
    "fp4_e8m0_dequantize": "fp4_e8m0_dequantize(packed, scales) -> f32 [..., 32k]",
    "fp8_quantize": "fp8_quantize(x [..., b·k], block: int) -> (E4M3 uint8 [..., b·k], E8M0 uint8 [..., k]): "
                    "act_quant",
    "fp8_dequantize": "fp8_dequantize(q, scales, block: int) -> f32 [..., b·k]",
    "fp8_qdq": "fp8_qdq(x [..., b·k], block: int) -> f32: the in-place act_quant result (quantize, dequantize)",
    "fp8_linear": "fp8_linear(x [..., K], w E4M3 uint8 [N, K], w_scale E8M0 uint8 [ceil(N/b), K/b], block: int) "
                  "-> f32 [..., N] (BF16 values): act_quant then the block-scaled FP8 GEMM",
}
__all__ = ["OPS", "codec_input", "make_block", "e4m3_codes", "fp8_weight", "fp8_linear_bounds",
           "assert_fp8_linear"]

F32 = np.float32
KV, IDX = Q.FP4_KV_BLOCK, Q.FP4_IDX_BLOCK
FP8_BLOCK_SHAPES = ((448, 64), (512, 32), (128, 128))      # V4 main KV, V4.1 SWA, V3.2 indexer

# ---------------------------------------------------------------------------------------------
# Edge vectors on the codecs' decision boundaries
# ---------------------------------------------------------------------------------------------


def padded(values, n: int) -> np.ndarray:
    x = np.zeros(n, dtype=F32)
    x[:len(values)] = values
    return x


TIES_AT_SCALE_1 = [6.0, 0.75, 1.75, 3.5, 0.25, 1.25, 2.5, 5.0, -0.75, -1.75, -3.5, -0.25, -1.25, -2.5,
                   -5.0, -6.0]
FLOAT_LOG2_EDGE = [96.00000762939453, 10.0]                    # scale 32 and 10 -> 16
SMALL_KV_BLOCK = [0.05, 0.01]                                  # scale 2^-7, 0.01 -> 0.01171875
DIV_VS_RECIPROCAL = ([0.17578125, 0.03662109375], [0.08203125, 0.02392577938735485])
# BF16 blocks that still tell x / s from x · fl32(1/s): amax 6s with s = 15·2^k (E4M3 mantissa 111),
# and x / s exactly on the E2M1 ties 1.25, 2.5, 5, where fl32(1/s) > 1/s tips the product above the
# tie.  An exhaustive search over every BF16 x and every E4M3 scale finds exactly these 42 (14 scales ×
# 3 ties; tests/test_quant.py repeats it); a subnormal, a normal and the largest such scale are kept.
DIV_VS_RECIPROCAL_BF16 = ([0.17578125, 0.03662109375, 0.0732421875, 0.146484375],
                          [5.625, 1.171875, 2.34375, 4.6875], [1440.0, 300.0, 600.0, 1200.0])
KV_SCALE_OVERFLOW = [2785.0, -2785.0, 2700.0, 1000.0, -0.5]   # scale saturates at 448
ULP = np.finfo(F32).eps


def amax_edges(top: float) -> list[float]:
    """amax at top·2^k, ±1 ulp, 7·2^k and 8·2^k − 1 ulp for a few k, both ends of the range."""
    out = []
    for k in (-126, -120, -9, -1, 0, 1, 8, 100, 120):
        for base in (top, 7.0, 8.0):
            with np.errstate(over="ignore"):
                v = F32(base * 2.0 ** k)
            if np.isfinite(v) and v > 0:
                out += [float(np.nextafter(v, F32(0))), float(v), float(np.nextafter(v, F32(np.inf)))]
    return out


# ---------------------------------------------------------------------------------------------
# Block strategies biased toward the edges
# ---------------------------------------------------------------------------------------------

KINDS = ("normal", "ties", "amax_edge", "zero", "single", "subnormal", "tiny", "huge", "grid",
         "log2_edge", "div_recip", "negzero", "floor", "saturated", "ties_beside", "amax_point",
         "floor_point", "saturation_point", "grid_beside")
# The range class, by codec (codec_of): the amax floor and the scale a floor block gets; a saturated
# block's scale (E4M3's 448).
FLOOR_OF_CODEC = {"kv": (6 * 2.0 ** -9, 2.0 ** -9), "idx": (6 * 2.0 ** -126, 2.0 ** -126), "fp8": (1e-4, 2.0 ** -22)}
SATURATED_SCALE, SATURATION_AMAX = 448.0, 6 * 464.0


def codec_of(block: int, top: float) -> str:
    return "fp8" if top == 448.0 else "kv" if block == KV else "idx"


def _amax_among(rng, block: int, amax, filler: float = 1.0) -> np.ndarray:
    """A block whose amax is `amax` (at a random position and sign) among smaller values."""
    x = rng.uniform(-filler, filler, block) * amax
    x[rng.integers(block)] = amax * rng.choice([-1.0, 1.0])
    return x


def _pick(rng, groups) -> float:
    """A point of one of the groups (each group one boundary), the group uniformly."""
    group = groups[rng.integers(len(groups))]
    return float(group[rng.integers(len(group))])


def make_block(kind: str, block: int, k: int, seed: int, top: float = 6.0) -> np.ndarray:
    """One block of `block` fp32 values of the given kind, at scale 2^k (top: the element max)."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** k
    signs = rng.choice([-1.0, 1.0], block)
    if kind == "normal":
        x = rng.standard_normal(block) * scale
    elif kind == "ties":            # amax top·2^k makes the scale 2^k: every value is on a tie
        x = signs * rng.choice(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES, block) * scale
        x[rng.integers(block)] = top * scale
    elif kind == "grid":            # E4M3 grid values and midpoints, relative to the block's top
        grid = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8)))
        x = signs * rng.choice(np.concatenate([grid, (grid[1:] + grid[:-1]) / 2]), block) * scale
        x[0] = top * scale if top == 448.0 else x[0]
    elif kind == "amax_edge":
        base = F32(rng.choice([top, 7.0, 8.0, 5.0, 6.5]) * scale)
        amax = np.nextafter(base, F32(rng.choice([0.0, np.inf]))) if rng.random() < 0.6 else base
        x = rng.uniform(-1, 1, block) * amax
        x[rng.integers(block)] = amax * rng.choice([-1.0, 1.0])
    elif kind == "zero":
        x = signs * 0.0
    elif kind == "single":
        x = signs * 0.0
        x[rng.integers(block)] = rng.standard_normal() * scale
    elif kind == "subnormal":
        x = signs * rng.integers(0, 1 << 23, block) * 2.0 ** -149
    elif kind == "tiny":            # around the amax floors: 6·2^-9 (KV), 1e-4 (FP8), 6·2^-126 (IDX)
        floor = rng.choice([6 * 2.0 ** -9, 1e-4, 6 * 2.0 ** -126, 6 * 2.0 ** -6])
        x = signs * rng.uniform(0, 2, block) * floor
    elif kind == "huge":
        x = signs * np.exp2(rng.uniform(11, 127.5, block))
    elif kind == "log2_edge":
        x = padded(FLOAT_LOG2_EDGE, block) * scale
    elif kind == "div_recip":
        pools = (DIV_VS_RECIPROCAL[1:], DIV_VS_RECIPROCAL[:1] + DIV_VS_RECIPROCAL_BF16)   # subnormal, normal scale
        pool = pools[rng.integers(2)]
        x = padded(pool[rng.integers(len(pool))], block) * (1.0 if rng.random() < 0.5 else scale)
    elif kind == "floor":           # below the amax floor: E2M1 ties and values of the floor scale, subnormals
        floor, s = FLOOR_OF_CODEC[codec_of(block, top)]
        ceiling = rng.choice([1.5, 3.0, 6.0])          # amax/s below 3 tells the floor from no floor
        points = np.array([v for v in F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES if v < ceiling])
        x = signs * rng.choice(points, block) * s
        x[rng.random(block) < 0.25] = signs[0] * rng.integers(0, 1 << 23) * 2.0 ** -149
        x = np.clip(x, -np.nextafter(floor, 0), np.nextafter(floor, 0))
    elif kind == "saturated":       # amax/6 above 464: the scale saturates at 448, values on its ties
        x = signs * rng.choice(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES, block) * SATURATED_SCALE
        x[rng.integers(block)] = np.nextafter(SATURATION_AMAX, np.inf) * np.exp2(rng.uniform(0, 30))
    elif kind == "ties_beside":     # amax top·2^k (scale 2^k), values on E2M1 ties and one ulp beside
        x = signs * np.array([_pick(rng, B.E2M1_TIE_GROUPS) for _ in range(block)]) * scale
        x[rng.integers(block)] = top * scale
    elif kind == "grid_beside":     # amax top·2^k, values on E4M3 midpoints of every class and one ulp beside
        x = signs * np.array([_pick(rng, B.E4M3_MIDPOINT_GROUPS + B.E4M3_TOP_GROUPS) for _ in range(block)]) * scale
        x[rng.integers(block)] = top * scale
    elif kind in ("amax_point", "floor_point"):   # amax on one of the scale's (the floor's) boundaries
        points = (B.AMAX_POINTS if kind == "amax_point" else B.FLOOR_POINTS)[codec_of(block, top)]
        x = _amax_among(rng, block, _pick(rng, points), rng.choice([0.5, 1.0]))
    elif kind == "saturation_point":
        x = _amax_among(rng, block, _pick(rng, B.SATURATION_POINTS))
    elif kind == "negzero":         # negative values that round to zero, −0, the −0.25 tie, and one amax
        x = -rng.uniform(0, 0.26, block) * scale
        x[rng.integers(block, size=3)] = -np.array([_pick(rng, B.beside([0.25])) for _ in range(3)]) * scale
        x[rng.integers(block)] = -2.0 ** max(k - 130, -149)
        x[rng.integers(block)] = -0.0
        x[rng.integers(block)] = top * scale
    else:
        raise ValueError(kind)
    with np.errstate(over="ignore"):
        x = x.astype(F32)
    return np.where(np.isfinite(x), x, F32(3e38) * np.sign(x)).astype(F32)


@st.composite
def codec_input(draw, block: int, kinds=KINDS, k_range=(-20, 20), top: float = 6.0,
                max_blocks: int = 4):
    """x[*lead, nb·block] whose blocks are drawn kind by kind."""
    lead = draw(st.sampled_from([(1,), (2,), (3,), (2, 2)]))
    nb = draw(st.integers(1, max_blocks))
    rows = int(np.prod(lead))
    x = np.stack([np.stack([make_block(draw(st.sampled_from(kinds)), block, draw(st.integers(*k_range)),
                                       draw(st.integers(0, 2 ** 32 - 1)), top)
                            for _ in range(nb)]) for _ in range(rows)])
    return x.reshape(*lead, nb * block)


def into_range(x: np.ndarray, block: int, lo: float, hi: float = np.inf, keep_zero: bool = False) -> np.ndarray:
    """Each block scaled by a power of two so that lo ≤ amax ≤ hi (an all-zero block becomes 1s
    unless keep_zero)."""
    xb = Q.blocks(x, block).astype(np.float64)
    amax = np.abs(xb).max(-1, keepdims=True)
    if not keep_zero:
        xb = np.where(amax == 0, 1.0, xb)
    amax = np.where(amax == 0, 1.0, amax)
    with np.errstate(divide="ignore"):
        up = np.clip(np.ceil(np.log2(lo / amax)), 0, None)
        down = np.clip(np.ceil(np.log2(amax / hi)), 0, None)
    return Q.unblock(np.ldexp(xb, (up - down).astype(np.int64))).astype(F32)


def with_block(block_choices, **kw):
    """(block, x) pairs: a block size, then an input made of such blocks."""
    return st.sampled_from(block_choices).flatmap(lambda b: st.tuples(st.just(b), codec_input(b, **kw)))


# ---------------------------------------------------------------------------------------------
# Comparing a codec's output
# ---------------------------------------------------------------------------------------------


def _block_context(x, block, scales=None, scale_text=None):
    xb = Q.blocks(x, block)

    def describe(idx, element_axis=True):
        lead, j = idx[:-1], idx[-1]
        b = j // block if element_axis else j
        values = xb[lead + (b,)]
        shown = ", ".join(f"{v!r}" for v in values[:8].tolist()) + (", …" if block > 8 else "")
        text = f"block {lead + (b,)} = [{shown}], amax {np.abs(values).max()!r}"
        if scales is not None:
            text += f", target's scale {scale_text(int(np.asarray(scales)[lead + (b,)]))}"
        return text
    return describe


def _check_scales(actual, expected, x, block, what, decode):
    describe = _block_context(x, block)
    assert_bytes_equal(actual, expected, what=what, decode=decode,
                       context=lambda idx: describe(idx, element_axis=False))


def _judged(codes, expected, ratio, clause: str):
    """The target's codes where `clause` decides them, the expected ones elsewhere:
    "codes" every element with |x/s| ≤ 6, ±0 alike; "zero_sign" only the codes that are zero on
    both sides; "clamp" only the elements with |x/s| > 6.  (The sign of a zero is FP4.E2M1.ZERO_SIGN's,
    what lies beyond ±6 FP4.KV.CLAMP's.)"""
    zero = ((codes & 7) == 0) & ((expected & 7) == 0)
    beyond = ~(np.abs(ratio) <= F.E2M1_MAX)
    judged = {"codes": ~beyond & ~zero, "zero_sign": zero, "clamp": beyond}[clause]
    return np.where(judged, codes, expected)


def _check_fp4_codes(target, packed, expected_codes, x, s, block, scales, scale_text, what, clause):
    """The target's codes against the expected ones, on what `clause` judges.  Read in the declared
    nibble order, or in the other one if that one agrees: the order is FP4.PACK.NIBBLE's verdict."""
    packed = as_numpy(packed)
    assert_same_shape(packed, np.empty(expected_codes.shape[:-1] + (expected_codes.shape[-1] // 2,)), what)
    ratio = Q.unblock(Q.blocks(x, block) / s[..., None])
    valid = np.repeat(~np.isnan(s), block, axis=-1)       # a NaN scale leaves its block unspecified
    expected_codes = expected_codes.astype(np.int64)

    def judged(order):
        codes = Q.fp4_unpack(packed, nibble_order=order).astype(np.int64)
        return np.where(valid, _judged(codes, expected_codes, ratio, clause), expected_codes)
    declared = target.variant("nibble_order")
    codes = judged(declared)
    other = judged("high_first" if declared == "low_first" else "low_first")
    if np.array_equal(other, expected_codes):
        codes = other
    assert_bytes_equal(codes, expected_codes, what=what, decode=e2m1_text,
                       context=_block_context(x, block, scales, scale_text))


def _kv_payload(target, x, what, clause="codes", ties=None):
    """ties: the target's own codes of the E2M1 ties at scale 1 (_own_ties); where given, an element
    whose x/s (as the knobs expect it computed) is exactly a tie is expected to get the target's own
    code for that tie, so the tie rule (FP4.E2M1.RNE's) stays out of the verdict."""
    x, t = fed(target, "fp4_e4m3_quantize", x)
    packed, scales = target.fp4_e4m3_quantize(t)
    scales = as_numpy(scales).astype(np.uint8)
    s = F.e4m3_decode(scales)
    knobs = spec_knobs(target, Q.e2m1_codes)
    expected = Q.unblock(Q.e2m1_codes(Q.blocks(x, KV), s, **knobs))
    if ties is not None:
        r = Q.blocks(x, KV) / s[..., None] if knobs["scale_apply"] == "divide" else \
            Q.blocks(x, KV) * (F32(1) / s[..., None])
        r = Q.unblock(r)
        for value, code in ties.items():
            expected = np.where(np.abs(r) == value, code | (np.signbit(r) << 3), expected)
    _check_fp4_codes(target, packed, expected, x, s, KV, scales, e4m3_text, what, clause)


def _own_ties(target) -> dict:
    """{tie: the target's magnitude code} for the E2M1 ties 0.25 … 5, read off its own quantization
    of a block with amax 6 (scale exactly 1 under any E4M3 scale rule).  Each tie shares its byte
    with a zero, so the reading does not depend on the nibble order (FP4.PACK.NIBBLE's clause)."""
    pairs = np.stack([[6.0, *F.E2M1_BOUNDARIES], np.zeros(8)], -1).reshape(-1)
    x, t = fed(target, "fp4_e4m3_quantize", pairs[None].astype(F32))
    packed = as_numpy(target.fp4_e4m3_quantize(t)[0]).astype(np.int64)[0]
    return {F32(b): int((byte | byte >> 4) & 7) for b, byte in zip(F.E2M1_BOUNDARIES, packed[1:8])}


def _idx_payload(target, x, what, clause="codes"):
    x, t = fed(target, "fp4_e8m0_quantize", x)
    packed, scales = target.fp4_e8m0_quantize(t)
    scales = as_numpy(scales).astype(np.uint8)
    s = F.e8m0_decode(scales)
    knobs = {k: v for k, v in spec_knobs(target, Q.e2m1_codes).items() if k != "scale_apply"}
    expected = Q.unblock(Q.e2m1_codes(Q.blocks(x, IDX), s, **knobs))
    _check_fp4_codes(target, packed, expected, x, s, IDX, scales, e8m0_text, what, clause)


def _kv_scales(target, x, what):
    x, t = fed(target, "fp4_e4m3_quantize", x)
    scales = target.fp4_e4m3_quantize(t)[1]
    expected = Q.fp4_e4m3_scale(Q.block_amax(Q.blocks(x, KV)), **spec_knobs(target, Q.fp4_e4m3_scale))
    _check_scales(scales, expected, x, KV, what, e4m3_text)


def _idx_scales(target, x, what):
    x, t = fed(target, "fp4_e8m0_quantize", x)
    scales = target.fp4_e8m0_quantize(t)[1]
    expected = Q.fp4_e8m0_scale(Q.block_amax(Q.blocks(x, IDX)), **spec_knobs(target, Q.fp4_e8m0_scale))
    _check_scales(scales, expected, x, IDX, what, e8m0_text)


def _fp8_scales(target, x, block, what):
    x, t = fed(target, "fp8_quantize", x)
    scales = target.fp8_quantize(t, block)[1]
    expected = Q.fp8_scale(Q.block_amax(Q.blocks(x, block)), **spec_knobs(target, Q.fp8_scale))
    _check_scales(scales, expected, x, block, what, e8m0_text)


# ---------------------------------------------------------------------------------------------
# FP4: packing
# ---------------------------------------------------------------------------------------------


@check("FP4.PACK.NIBBLE", ops=("fp4_pack", "fp4_unpack"))
@forall(codes=st.lists(st.integers(0, 15), min_size=1, max_size=32).map(
    lambda v: np.array(v + v[:len(v) % 2], dtype=np.uint8)))
def fp4_pack_puts_the_even_element_low(target, codes):
    order = target.variant("nibble_order")
    expected = Q.fp4_pack(codes, nibble_order=order)
    assert_bytes_equal(target.fp4_pack(tensor(codes)), expected, what="FP4.PACK.NIBBLE: fp4_pack",
                       decode=packed_text, context=lambda idx: f"codes {codes[2 * idx[-1]:2 * idx[-1] + 2]}")
    assert_bytes_equal(target.fp4_unpack(tensor(expected)), codes, what="FP4.PACK.NIBBLE: fp4_unpack",
                       decode=e2m1_text, context=lambda idx: f"packed byte {packed_text(expected[idx[-1] // 2])}")


def pairs_apart(rng, block: int, nb: int, k_range) -> np.ndarray:
    """Blocks of pairs (x[2i], x[2i+1]) = ±(a, a/4) or ±(a/4, a) with independent signs, a the block's
    amax: under any scale within a factor 4 of the right one both codes are nonzero and the larger
    magnitude gets the larger code, so the pair's nibbles say which element went where."""
    a = rng.uniform(1, 2, (3, nb, 1)) * np.exp2(rng.integers(*k_range, (3, nb, 1)))
    big_first = rng.random((3, nb, block // 2)) < 0.5
    even = np.where(big_first, a, a / 4)
    odd = np.where(big_first, a / 4, a)
    pairs = np.stack([even, odd], -1) * rng.choice([-1.0, 1.0], (3, nb, block // 2, 2))
    return pairs.reshape(3, nb * block).astype(F32)


def _check_nibble_order(target, op, x, what):
    """Judged on the target's own codes: the nibble its declared order gives element j must carry
    x[j]'s sign, and the larger element of each pair the larger magnitude code."""
    x, t = fed(target, op, x)
    codes = Q.fp4_unpack(as_numpy(getattr(target, op)(t)[0]), nibble_order=target.variant("nibble_order"))
    assert_same_shape(codes, x, what)
    codes = codes.astype(np.int64)
    sign_ok = (codes >> 3 == 1) == np.signbit(x)
    mag = codes & 7
    order_ok = (mag[..., 0::2] > mag[..., 1::2]) == (np.abs(x[..., 0::2]) > np.abs(x[..., 1::2]))
    bad = ~(sign_ok[..., 0::2] & sign_ok[..., 1::2] & order_ok)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        byte = int(as_numpy(getattr(target, op)(t)[0])[i, j])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} bytes hold their pair out of order; "
                             f"first at ({i}, {j}): elements {x[i, 2 * j]!r}, {x[i, 2 * j + 1]!r} packed "
                             f"as 0x{byte:02x} {packed_text(byte)} (expected nibble_order="
                             f"{target.variant('nibble_order')})")


@check("FP4.PACK.NIBBLE", ops=("fp4_e8m0_quantize",))
@forall(rng=st.integers(0, 2 ** 32 - 1).map(np.random.default_rng))
def fp4_e8m0_quantizer_packs_the_even_element_low(target, rng):
    _check_nibble_order(target, "fp4_e8m0_quantize", pairs_apart(rng, IDX, 2, (-12, 100)),
                        "FP4.PACK.NIBBLE: fp4_e8m0_quantize payload")


@check("FP4.PACK.NIBBLE", ops=("fp4_e4m3_quantize",))
@forall(rng=st.integers(0, 2 ** 32 - 1).map(np.random.default_rng))
def fp4_e4m3_quantizer_packs_the_even_element_low(target, rng):
    _check_nibble_order(target, "fp4_e4m3_quantize", pairs_apart(rng, KV, 2, (-4, 8)),
                        "FP4.PACK.NIBBLE: fp4_e4m3_quantize payload")


# ---------------------------------------------------------------------------------------------
# FP4: the E2M1 rounding inside both codecs
# ---------------------------------------------------------------------------------------------

_TIES_KV = dict(x=padded(TIES_AT_SCALE_1, KV)[None])
_TIES_IDX = dict(x=np.concatenate([padded(TIES_AT_SCALE_1, IDX)[None], padded(TIES_AT_SCALE_1, IDX)[None] * 2 ** -20], -1))


@check("FP4.E2M1.RNE", ops=("fp4_e4m3_quantize",))
@forall(_TIES_KV, dict(x=B.E2M1_KV_TIES), dict(x=B.KV_RANGE),
        x=codec_input(KV, kinds=("ties", "ties", "floor", "saturated"), k_range=(-9, 8)))
def fp4_e4m3_rounds_ties_to_even(target, x):
    _kv_payload(target, x, "FP4.E2M1.RNE: fp4_e4m3_quantize codes")


@check("FP4.E2M1.RNE", ops=("fp4_e8m0_quantize",))
@forall(_TIES_IDX, dict(x=B.E2M1_IDX), dict(x=B.IDX_RANGE),
        x=codec_input(IDX, kinds=("ties", "ties_beside", "ties_beside", "grid", "normal", "floor", "subnormal"),
                      k_range=(-100, 100)))
def fp4_e8m0_rounds_ties_to_even(target, x):
    _idx_payload(target, x, "FP4.E2M1.RNE: fp4_e8m0_quantize codes")


@check("FP4.E2M1.ZERO_SIGN", ops=("fp4_e4m3_quantize",))
@forall(dict(x=padded([6.0, -0.0, -0.1, -0.25, -1e-30], KV)[None]), dict(x=B.NEGATIVE_ZERO_KV),
        x=codec_input(KV, kinds=("negzero", "negzero", "floor", "saturated"), k_range=(-9, 8)))
def fp4_e4m3_keeps_negative_zero(target, x):
    _kv_payload(target, x, "FP4.E2M1.ZERO_SIGN: fp4_e4m3_quantize codes of zeros", "zero_sign")


@check("FP4.E2M1.ZERO_SIGN", ops=("fp4_e8m0_quantize",))
@forall(dict(x=padded([6.0, -0.0, -0.1, -0.25, -1e-30], IDX)[None]), dict(x=B.NEGATIVE_ZERO_IDX),
        x=codec_input(IDX, kinds=("negzero", "zero", "floor", "subnormal"), k_range=(-100, 100)))
def fp4_e8m0_keeps_negative_zero(target, x):
    _idx_payload(target, x, "FP4.E2M1.ZERO_SIGN: fp4_e8m0_quantize codes of zeros", "zero_sign")


# ---------------------------------------------------------------------------------------------
# FP4: V4.1 main KV (E4M3 scale per 16)
# ---------------------------------------------------------------------------------------------

# amax = 6 × each midpoint between neighbouring normal E4M3 values: amax/6 is an exact tie of the
# scale's rounding (to the even mantissa), and every such amax is a BF16 value.
_E4M3_NORMAL = np.abs(F.e4m3_decode(np.arange(0x08, 0x7F, dtype=np.uint8)))
KV_SCALE_TIES = (6 * (_E4M3_NORMAL[1:] + _E4M3_NORMAL[:-1]) / 2).astype(F32)

KV_FLOOR = 6 * 2.0 ** -9
# amax at 6·448 and one ulp below: the largest scale by rounding (FP4.KV.SCALE); one ulp above: FP4.KV.SATURATE
_AT_448 = np.array([np.nextafter(F32(2688), F32(0)), F32(2688), np.nextafter(F32(2688), F32(np.inf))], F32)
_AT_448_SCALE = _AT_448[:2, None] * np.eye(KV, dtype=F32)[0]
_KV_SCALE_EXAMPLES = [dict(x=padded(SMALL_KV_BLOCK, KV)[None]),
                      dict(x=KV_SCALE_TIES[:, None] * np.eye(KV, dtype=F32)[0]),
                      dict(x=np.array(amax_edges(6.0)[:-2], F32).reshape(-1, 1) * np.eye(KV, dtype=F32)[0])]


@check("FP4.KV.SCALE", ops=("fp4_e4m3_quantize",))
@forall(*_KV_SCALE_EXAMPLES, dict(x=B.KV_SCALE), dict(x=B.KV_FLOOR), dict(x=_AT_448_SCALE), x=codec_input(KV, kinds=("normal", "amax_edge", "grid", "single", "ties",
                                                        "div_recip", "log2_edge", *["amax_point"] * 7), k_range=(-6, 8)))
def fp4_e4m3_scale_is_nearest_e4m3_of_amax_over_6(target, x):
    x = into_range(fit(target, "fp4_e4m3_quantize", x), KV, KV_FLOOR, 2688.0)   # from the floor (subnormal scales too) to 448
    _kv_scales(target, x, "FP4.KV.SCALE: fp4_e4m3_quantize scale bytes")


@check("FP4.KV.FLOOR", ops=("fp4_e4m3_quantize",))
@forall(dict(x=np.zeros((2, 2 * KV), F32)), dict(x=padded([6 * 2.0 ** -9, -0.0, 2.0 ** -149], KV)[None]),
        dict(x=padded([0.0115966796875, 2.0 ** -133, -0.005859375], KV)[None]), dict(x=B.KV_FLOOR),
        x=codec_input(KV, kinds=("zero", "tiny", "subnormal", "single", "floor_point", "floor_point"), k_range=(-40, -8)))
def fp4_e4m3_scale_floor(target, x):
    """Blocks at or below the floor only: their scale is 2^-9 whatever the rounding of amax/6."""
    x = into_range(fit(target, "fp4_e4m3_quantize", x), KV, 0.0, KV_FLOOR, keep_zero=True)
    _kv_scales(target, x, "FP4.KV.FLOOR: fp4_e4m3_quantize scale bytes of blocks with amax ≤ 6·2^-9")


@check("FP4.KV.SATURATE", ops=("fp4_e4m3_quantize",))
@forall(dict(x=padded(KV_SCALE_OVERFLOW, KV)[None]),
        dict(x=padded([2800.0, -2784.0, 3.3895313892515355e38, 2816.0], KV)[None]),  # BF16: amax/6 > 464
        dict(x=padded([464 * 6.0, 464 * 6.0 + 0.01, 3e38], KV)[None]), dict(x=B.KV_SATURATE),
        dict(x=_AT_448[2:, None] * np.eye(KV, dtype=F32)[0]),
        x=codec_input(KV, kinds=("huge", "amax_edge", "saturation_point", "saturation_point"), k_range=(9, 120)))
def fp4_e4m3_scale_saturates(target, x):
    """Blocks with amax/6 above 448 only: below, the scale's rounding is FP4.KV.SCALE's."""
    x = into_range(fit(target, "fp4_e4m3_quantize", x), KV, float(_AT_448[2]))
    _kv_scales(target, x, "FP4.KV.SATURATE: fp4_e4m3_quantize scale bytes of blocks with amax/6 > 448")


@check("FP4.KV.DIVIDE", ops=("fp4_e4m3_quantize",))
@forall(*[dict(x=padded(v, KV)[None]) for v in DIV_VS_RECIPROCAL + DIV_VS_RECIPROCAL_BF16],
        dict(x=padded(SMALL_KV_BLOCK, KV)[None]), dict(x=B.E2M1_KV), dict(x=B.KV_RANGE),
        x=codec_input(KV, kinds=("div_recip", "normal", "amax_edge", "floor", "saturated", "ties_beside",
                                 "ties_beside"), k_range=(-12, 8)))
def fp4_e4m3_divides_by_the_rounded_scale(target, x):
    _kv_payload(target, x, "FP4.KV.DIVIDE: fp4_e4m3_quantize codes", ties=_own_ties(target))


@check("FP4.KV.CLAMP", ops=("fp4_e4m3_quantize",))
@forall(dict(x=padded(KV_SCALE_OVERFLOW, KV)[None]), dict(x=padded([5.0, -5.0, 4.9], KV)[None]),
        dict(x=padded([1e4, -3500.0, 3136.0, 100.0], KV)[None]), dict(x=B.E2M1_KV), dict(x=B.KV_RANGE),
        x=codec_input(KV, kinds=("amax_edge", "huge", "normal", "saturated", "ties_beside"), k_range=(-6, 14)))
def fp4_e4m3_clamps_before_the_cast(target, x):
    _kv_payload(target, x, "FP4.KV.CLAMP: fp4_e4m3_quantize codes of |x/s| > 6", "clamp")


# ---------------------------------------------------------------------------------------------
# FP4: indexer (E8M0 scale per 32)
# ---------------------------------------------------------------------------------------------


@check("FP4.IDX.SCALE", ops=("fp4_e8m0_quantize",))
@forall(dict(x=padded(FLOAT_LOG2_EDGE, IDX)[None]), dict(x=B.IDX_SCALE),
        dict(x=np.array(amax_edges(6.0), F32).reshape(-1, 1) * np.eye(IDX, dtype=F32)[0]),
        x=codec_input(IDX, kinds=("normal", "amax_edge", "single", "log2_edge", "grid", "huge",
                                  *["amax_point"] * 6), k_range=(-120, 120)))
def fp4_e8m0_scale_is_pow2_ceil(target, x):
    x = fit(target, "fp4_e8m0_quantize", x)
    x = np.where(np.abs(x).max(-1, keepdims=True) >= 6 * 2.0 ** -126, x, F32(1.0))   # above the floor
    _idx_scales(target, x, "FP4.IDX.SCALE: fp4_e8m0_quantize scale bytes")


@check("FP4.IDX.FLOOR", ops=("fp4_e8m0_quantize",))
@forall(dict(x=np.zeros((2, 2 * IDX), F32)), dict(x=padded([-0.0, 2.0 ** -149, 6 * 2.0 ** -127], IDX)[None]),
        dict(x=B.IDX_FLOOR),
        # amax in (3, 6)·2^-126: the floor gives byte 1, as does no floor at all (amax·fl32(1/6) is
        # then a subnormal in (2^-127, 2^-126]); a byte one too low is neither
        dict(x=np.array([5, 4, 3.5, -5.5], F32)[:, None] * 2.0 ** -126 * np.eye(IDX, dtype=F32)[0]),
        x=codec_input(IDX, kinds=("zero", "subnormal", "tiny", "floor_point"), k_range=(-140, -120)))
def fp4_e8m0_amax_floor(target, x):
    x = fit(target, "fp4_e8m0_quantize", x)
    x = np.where(np.abs(x).max(-1, keepdims=True) < 6 * 2.0 ** -126, x, F32(0.0))
    _idx_scales(target, x, "FP4.IDX.FLOOR: fp4_e8m0_quantize scale bytes of tiny blocks")


# ---------------------------------------------------------------------------------------------
# FP4: dequantization, non-finite input
# ---------------------------------------------------------------------------------------------

_random_bytes = st.integers(0, 2 ** 32 - 1).map(lambda seed: np.random.default_rng(seed))


@check("FP4.DEQUANT", ops=("fp4_e4m3_dequantize",))
@forall(rng=_random_bytes)
def fp4_e4m3_dequantize_is_exact(target, rng):
    packed = rng.integers(0, 256, (3, 2 * KV), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (3, 4), dtype=np.uint8)        # every finite positive E4M3
    expected = Q.fp4_e4m3_dequantize(packed, scales, nibble_order=target.variant("nibble_order"))
    assert_equal(target.fp4_e4m3_dequantize(tensor(packed), tensor(scales)), expected,
                 what="FP4.DEQUANT: fp4_e4m3_dequantize",
                 context=lambda idx: f"scale {e4m3_text(scales[idx[0], idx[-1] // KV])}, "
                                     f"byte {packed_text(packed[idx[0], idx[-1] // 2])}")


@check("FP4.DEQUANT", ops=("fp4_e8m0_dequantize",))
@forall(rng=_random_bytes)
def fp4_e8m0_dequantize_is_exact(target, rng):
    packed = rng.integers(0, 256, (3, 2 * IDX), dtype=np.uint8)
    scales = rng.integers(0, 255, (3, 4), dtype=np.uint8)
    scales[0, :2] = 0, 254                                       # both ends of E8M0, every time
    expected = Q.fp4_e8m0_dequantize(packed, scales, nibble_order=target.variant("nibble_order"))
    assert_equal(target.fp4_e8m0_dequantize(tensor(packed), tensor(scales)), expected,
                 what="FP4.DEQUANT: fp4_e8m0_dequantize",
                 context=lambda idx: f"scale {e8m0_text(scales[idx[0], idx[-1] // IDX])}, "
                                     f"byte {packed_text(packed[idx[0], idx[-1] // 2])}")


NONFINITE = (np.nan, np.inf, -np.inf)


def _check_nonfinite(target, op, quantize, block, rule_id, rng):
    """NaN/±Inf in a few blocks: every other block is quantized exactly as with the non-finite
    values replaced by 0 (the target's own output on that input), or the call raises ValueError.

    Only a target that declares nonfinite_input is held to one of the two; otherwise the one it
    makes is reported (suite.detected).
    """
    x = rng.standard_normal((3, 4 * block)) * np.exp2(rng.integers(-8, 8, (3, 4))).repeat(block, -1)
    x = fit(target, op, x)
    bad = np.zeros((3, 4), bool)
    for _ in range(rng.integers(1, 3)):
        row, b = rng.integers(3), rng.integers(4)
        x[row, b * block + rng.integers(block)] = rng.choice(NONFINITE)
        bad[row, b] = True
    declared = target.declared.get("nonfinite_input")
    where = f"{x[~np.isfinite(x)].tolist()} in blocks {np.argwhere(bad).tolist()}"
    try:
        got = [as_numpy(a) for a in quantize(fed(target, op, x)[1])]
    except ValueError:
        if declared == "block_local":
            raise AssertionError(f"{rule_id}: declares nonfinite_input=block_local but raised ValueError "
                                 f"on {where}") from None
        detected("nonfinite_input", "reject")
        return
    if declared == "reject":
        raise AssertionError(f"{rule_id}: declares nonfinite_input=reject but accepted {where}")
    clean = [as_numpy(a) for a in quantize(fed(target, op, np.where(np.isfinite(x), x, F32(0)))[1])]
    for actual, expected, name in zip(got, clean, ("payload", "scales")):
        assert_same_shape(actual, expected, f"{rule_id}: {name}")
        per = actual.shape[-1] // 4
        keep = np.repeat(~bad, per, axis=-1)                      # a bad block may hold anything
        assert_bytes_equal(np.where(keep, actual, expected), expected,
                           what=f"{rule_id}: {name} of the blocks without NaN/Inf, against the same "
                                f"input with them replaced by 0 ({where})")
    detected("nonfinite_input", "block_local")


@check("FP4.NONFINITE", ops=("fp4_e4m3_quantize",))
@forall(rng=_random_bytes)
def fp4_e4m3_nonfinite_stays_in_its_block(target, rng):
    _check_nonfinite(target, "fp4_e4m3_quantize", target.fp4_e4m3_quantize, KV, "FP4.NONFINITE", rng)


@check("FP4.NONFINITE", ops=("fp4_e8m0_quantize",))
@forall(rng=_random_bytes)
def fp4_e8m0_nonfinite_stays_in_its_block(target, rng):
    _check_nonfinite(target, "fp4_e8m0_quantize", target.fp4_e8m0_quantize, IDX, "FP4.NONFINITE", rng)


# ---------------------------------------------------------------------------------------------
# FP8 act_quant
# ---------------------------------------------------------------------------------------------

_FP8_BLOCKS = [b for _, b in FP8_BLOCK_SHAPES]
_fp8_block = st.sampled_from(_FP8_BLOCKS)
# the models whose code quantizes in FP8 blocks of each size: V4.1 32 (fp8_block_size), V4 64 (the
# main KV's NoPE dims) and 128 (its linears), V3.2 128 (its indexer and linears)
FP8_BLOCK_MODELS = {32: V41, 64: V4, 128: ("v3.2",) + V4}


def _asked_block(target, block: int):
    target.asked_for(*FP8_BLOCK_MODELS[block])


_FP8_TIES = [240.0, 1.0625, 1.1875, 17.0, -17.0, 2.0 ** -10, 3 * 2.0 ** -10, 232.0, -0.0]


@check("FP8.SCALE", ops=("fp8_quantize",))
@forall(dict(case=(32, np.array(amax_edges(448.0), F32).reshape(-1, 1) * np.eye(32, dtype=F32)[0])),
        dict(case=(64, padded(FLOAT_LOG2_EDGE, 64)[None] * 2 ** 5)), dict(case=(32, B.FP8_SCALE)),
        case=with_block(_FP8_BLOCKS, kinds=("normal", "amax_edge", "single", "log2_edge", "grid", "huge",
                                            *["amax_point"] * 12), k_range=(-10, 120), top=448.0, max_blocks=2))
def fp8_scale_is_pow2_ceil(target, case):
    block, x = case
    _asked_block(target, block)
    x = into_range(fit(target, "fp8_quantize", x), block, F32(1e-4))  # at or above the amax floor
    _fp8_scales(target, x, block, "FP8.SCALE: fp8_quantize scale bytes")


@check("FP8.FLOOR", ops=("fp8_quantize",))
@forall(dict(case=(32, np.zeros((2, 64), F32))), dict(case=(128, padded([-0.0, 2.0 ** -149, 9.9e-5], 128)[None])),
        dict(case=(64, B.FP8_FLOOR)),
        case=with_block(_FP8_BLOCKS, kinds=("zero", "subnormal", "tiny", "single", "floor_point", "floor_point"),
                        k_range=(-60, -14), top=448.0, max_blocks=2))
def fp8_amax_floor(target, case):
    block, x = case
    _asked_block(target, block)
    x = fit(target, "fp8_quantize", x)
    x = np.where(np.abs(Q.blocks(x, block)).max(-1, keepdims=True) < F32(1e-4), Q.blocks(x, block), F32(0))
    _fp8_scales(target, Q.unblock(x), block, "FP8.FLOOR: fp8_quantize scale bytes of tiny blocks")


@check("FP8.E4M3", ops=("fp8_quantize",))
@forall(dict(case=(32, padded(_FP8_TIES, 32)[None])), dict(case=(32, B.FP8_MIDPOINTS[32])),
        case=with_block(_FP8_BLOCKS, kinds=("grid", "normal", "amax_edge", "subnormal", "negzero", "grid_beside",
                                            "grid_beside", "floor"), k_range=(-30, 30), top=448.0, max_blocks=2))
def fp8_values_are_e4m3_of_x_over_s(target, case):
    block, x = case
    _asked_block(target, block)
    x, t = fed(target, "fp8_quantize", x)
    q, scales = target.fp8_quantize(t, block)
    scales = as_numpy(scales).astype(np.uint8)
    expected = Q.unblock(F.e4m3_encode(Q.fp8_ratio(Q.blocks(x, block), F.e8m0_decode(scales)),
                                       overflow=target.variant("e4m3_overflow")))
    assert_bytes_equal(q, expected, what="FP8.E4M3: fp8_quantize values", decode=e4m3_text,
                       context=_block_context(x, block, scales, e8m0_text))


@check("FP8.DEQUANT", ops=("fp8_dequantize",))
@forall(rng=_random_bytes, block=_fp8_block)
def fp8_dequantize_is_exact(target, rng, block):
    _asked_block(target, block)
    q = rng.integers(0, 256, (2, 2 * block), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x7E                                  # NaN codes are not produced
    scales = rng.integers(0, 255, (2, 2), dtype=np.uint8)
    scales[0] = 0, 254                                           # both ends of E8M0, every time
    assert_equal(target.fp8_dequantize(tensor(q), tensor(scales), block), Q.fp8_dequantize(q, scales, block),
                 what="FP8.DEQUANT: fp8_dequantize",
                 context=lambda idx: f"byte {e4m3_text(q[idx])}, scale {e8m0_text(scales[idx[0], idx[-1] // block])}")


@check("FP8.BLOCKS", ops=("fp8_quantize",))
@forall(shape=st.sampled_from(FP8_BLOCK_SHAPES), rng=_random_bytes)
def fp8_blocks_of_each_model(target, shape, rng):
    """One block's pattern repeated, each copy times its own power of two: one scale per block, each
    scale byte following its block's power of two, every block's values the same.  Judged on the
    target's own scales and values, whatever its scale and rounding rules."""
    n, block = shape
    _asked_block(target, block)
    pattern = rng.standard_normal(block) + 2 * np.sign(rng.standard_normal(block))
    pattern = fit(target, "fp8_quantize", F.bf16_round(pattern) if rng.random() < 0.5 else pattern)
    k = rng.integers(-8, 9, 2 * n // block)                         # two rows of blocks
    x, t = fed(target, "fp8_quantize", (pattern * np.exp2(k)[:, None]).reshape(2, n))
    q, scales = (as_numpy(a).astype(np.int64) for a in target.fp8_quantize(t, block))
    what = f"FP8.BLOCKS: {n} dims in blocks of {block}, two rows"
    assert_same_shape(scales, np.empty((2, n // block)), f"{what}: scales")
    assert_same_shape(q, x, f"{what}: values")
    assert_equal(scales.reshape(-1) - scales[0, 0], k - k[0], what=f"{what}: scale byte of block j − of "
                 f"block 0 (block j is block 0 times 2^(k_j − k_0), k = {k.tolist()})")
    q = q.reshape(2 * n // block, block)
    assert_bytes_equal(q, np.broadcast_to(q[0], q.shape), what=f"{what}: values of block j against block 0",
                       decode=e4m3_text)


@check("FP8.V4_INPLACE", ops=("fp8_qdq",))
@forall(dict(case=(64, B.FP8_MIDPOINTS[64])), case=with_block([64, 32], kinds=("normal", "grid", "amax_edge", "grid_beside"),
                                                             k_range=(-10, 10), top=448.0, max_blocks=2))
def fp8_qdq_rounds_through_e4m3(target, case):
    """Both official kernel revisions conform: a target that declares none is held to either, and
    the one it matches is reported (suite.detected)."""
    block, x = case
    x, t = fed(target, "fp8_qdq", x)
    actual = as_numpy(target.fp8_qdq(t, block))
    knobs = spec_knobs(target, Q.fp8_qdq)
    if "v4_fp8_inplace" not in target.declared:
        for value in KNOBS["v4_fp8_inplace"].values:
            if np.array_equal(actual, Q.fp8_qdq(x, block, **{**knobs, "v4_fp8_inplace": value}), equal_nan=True):
                detected("v4_fp8_inplace", value)
                return
    assert_equal(actual, Q.fp8_qdq(x, block, **knobs), what="FP8.V4_INPLACE: fp8_qdq",
                 context=lambda idx: f"input {x[idx]!r}")


@check("FP8.NONFINITE", ops=("fp8_quantize",))
@forall(rng=_random_bytes, block=_fp8_block)
def fp8_nonfinite_stays_in_its_block(target, rng, block):
    _asked_block(target, block)
    _check_nonfinite(target, "fp8_quantize", lambda t: target.fp8_quantize(t, block), block, "FP8.NONFINITE",
                     rng)



# ---------------------------------------------------------------------------------------------
# The FP8 linear
# ---------------------------------------------------------------------------------------------

@functools.cache
def _e4m3_table() -> np.ndarray:
    """F.e4m3_encode of each fp32 pattern hi·2^16 (at 2·hi) and hi·2^16 + 1 (at 2·hi + 1)."""
    hi = np.arange(2 ** 16, dtype=np.uint32) << np.uint32(16)
    return F.e4m3_encode(np.stack([hi, hi | np.uint32(1)], -1).ravel().view(F32))


def e4m3_codes(x) -> np.ndarray:
    """F.e4m3_encode(x) (satfinite) bit for bit, looked up (the drawn FP8 weights are millions of
    values a layer case): every E4M3 rounding boundary (a midpoint, 464) and the NaN/Inf split have
    their low 16 fp32 bits zero, so a code is set by the top 16 bits and whether the low 16 are zero.
    tests/test_quant.py matches it to the spec on every 16-bit prefix."""
    bits = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    index = (bits >> np.uint32(15)) | np.uint32(1)
    index ^= (bits & np.uint32(0xFFFF)) == 0
    return _e4m3_table()[index]


_CHUNK = 2 ** 16                        # values a slice of an FP8 weight is drawn in


def fp8_weight(rng, n: int, k: int, block: int, exponents=(-14, -8)) -> tuple[np.ndarray, np.ndarray]:
    """A checkpoint-like E4M3 weight [n, k]: normal values with their amax near 448, and one E8M0
    scale per block×block block, 2^e with e uniform in `exponents` (so the blocks' scales differ)."""
    codes = np.empty((n, k), np.uint8)
    rows = max(1, _CHUNK // k)          # drawn a slice of rows at a time: the same draws, in cache
    for r in range(0, n, rows):
        values = rng.standard_normal((min(rows, n - r), k))
        values *= 128
        codes[r:r + rows] = e4m3_codes(np.clip(values, -448, 448, out=values).astype(F32))
    lo, hi = exponents
    scales = (127 + rng.integers(lo, hi + 1, (-(-n // block), k // block))).astype(np.uint8)
    return codes, scales


def fp8_activation(rng, shape, spread: int = 3) -> np.ndarray:
    """BF16 normal rows, each run of 32 times its own 2^j, j in ±spread: the act scales differ from
    block to block, and inside a block of 128 small runs sit beside the one that sets the scale."""
    k = shape[-1]
    j = rng.integers(-spread, spread + 1, (*shape[:-1], k // 32))
    return F.bf16_round((rng.standard_normal(shape) * np.exp2(np.repeat(j, 32, axis=-1))).astype(F32))


def fp8_linear_bounds(x, w, w_scale, block: int) -> tuple[np.ndarray, np.ndarray]:
    """FP8.LINEAR's Σ_k s_k·S_k (after the spec's act_quant of x) and the tolerance around it."""
    blocks = Q.fp8_linear_blocks(x, w, w_scale, block)
    exact = Q.fp8_linear_exact(x, w, w_scale, block, blocks)
    err = Q.fp8_linear_error(x, w, w_scale, block, blocks)
    return exact, bf16_quantum(np.abs(exact) + err) + err


def assert_fp8_linear(got, x, w, w_scale, block: int, what: str, shape=None, bounds=None):
    """got within FP8.LINEAR's tolerance of Σ_k s_k·S_k (after the spec's act_quant of x), BF16;
    `bounds`: fp8_linear_bounds(x, w, w_scale, block) when computed before."""
    exact, tol = bounds if bounds is not None else fp8_linear_bounds(x, w, w_scale, block)
    if shape is not None:
        exact, tol = exact.reshape(shape), tol.reshape(shape)
    assert_within(as_numpy(got), exact, tol, what=what, bf16=True,
                  note=f" (the FP8 GEMM writes BF16: Σ_k s_k·S_k of the act_quant-ed x, block {block})")


def assert_linear(target, got, x, w, w_scale, block: int, what: str, shape=None, bounds=None):
    """A linear the official code runs in FP8 (FP8.LINEAR), or, for a target declaring
    fp8_linears=bf16, the BF16 matmul of the dequantized weight: bf16(ŵ · x) within matmul_tolerance
    (then returns "fp8_linears=bf16", the choice the judgement read)."""
    if declared_choice(target, "fp8_linears") != "bf16":
        return assert_fp8_linear(got, x, w, w_scale, block, what, shape, bounds)
    w_hat, x = Q.fp8_weight_dequantize(w, w_scale, block), np.asarray(x, np.float64)
    want, tol = matmul(x, w_hat), matmul_tolerance(x, w_hat)
    if shape is not None:
        want, tol = want.reshape(shape), tol.reshape(shape)
    assert_within(as_numpy(got), want, tol, what=what, bf16=True,
                  note=" (fp8_linears=bf16 declared: bf16(ŵ · x) of the dequantized weight, fp32 sums, no act_quant)")
    return "fp8_linears=bf16"


def with_block_outlier(rng, x, w, w_scale, block: int, exponent: int, small: str):
    """One run of 32 activations (the same in every row) times 2^exponent, and the weights over it
    made small so the rest of the row decides the sum: `small` "zero" gives those weight columns E4M3
    zeros and their K block the largest scale of its weight rows (so the run's neighbours in a block
    of 128 weigh as much as any block); "scale" lowers the E8M0 scale of that K block by exponent + 8.
    act_quant per block keeps every other block exact; a scale shared with the outlier (per row, per
    tensor, a block of 128 where it is 32) puts the others' values among E4M3 subnormals or 0."""
    run = int(rng.integers(x.shape[-1] // 32))
    x, w, w_scale = x.copy(), w.copy(), w_scale.copy()
    x[..., run * 32:(run + 1) * 32] *= np.float32(2.0 ** exponent)
    if small == "zero":
        w[:, run * 32:(run + 1) * 32] = 0
        w_scale[:, run * 32 // block] = w_scale.max(axis=1)
    else:
        w_scale[:, run * 32 // block] -= np.uint8(exponent + 8)
    return x, w, w_scale


@check("FP8.LINEAR", ops=("fp8_linear",))
@forall(dict(seed=0, model="v4-flash", shape=(2, 8, 2), spread=3, outlier=None),
        dict(seed=1, model="v4.1-flash", shape=(2, 40, 3), spread=3, outlier=None),
        dict(seed=2, model="v4-flash", shape=(2, 4, 1), spread=8, outlier=None),
        dict(seed=3, model="v4-flash", shape=(2, 2, 1), spread=3, outlier=(16, "zero")),
        dict(seed=4, model="v4.1-flash", shape=(2, 4, 1), spread=3, outlier=(20, "scale")),
        seed=st.integers(0, 2 ** 32 - 1), model=st.sampled_from(tuple(Q.FP8_LINEAR_BLOCK)),
        shape=st.tuples(st.integers(1, 2), st.integers(2, 6), st.integers(1, 2)), spread=st.sampled_from((3, 8)),
        outlier=st.one_of(st.none(), st.tuples(st.integers(16, 22), st.sampled_from(("zero", "scale")))))
def fp8_linear_is_block_scaled(target, seed, model, shape, spread, outlier):
    """shape = (rows, K blocks, N blocks) at the model's block size; spread 8 puts runs of 32 up to
    2^16 apart, so some act_quant values are E4M3 subnormals; outlier = (e, small): one run of 32
    times 2^e over small weights (with_block_outlier), where act_quant's span decides the result."""
    target.asked_for(model)
    rows, kb, nb = shape
    block = Q.FP8_LINEAR_BLOCK[model]
    rng = np.random.default_rng(seed)
    w, w_scale = fp8_weight(rng, nb * block, kb * block, block)
    x = fp8_activation(rng, (rows, kb * block), spread)
    if outlier is not None:
        x, w, w_scale = with_block_outlier(rng, x, w, w_scale, block, *outlier)
    x, t = fed(target, "fp8_linear", x)
    got = target.fp8_linear(t, tensor(w), tensor(w_scale), block)
    assert_linear(target, got, x, w, w_scale, block, f"FP8.LINEAR ({model}, block {block}, x {list(x.shape)}, "
                                                 f"w [{nb * block}, {kb * block}]"
                                                 + (f", a run of 32 times 2^{outlier[0]} over {outlier[1]} weights"
                                                    if outlier else "") + ")")
