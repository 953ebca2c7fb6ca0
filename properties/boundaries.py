"""Explicit examples on every decision boundary of the codecs: exactly on it, one fp32 ulp below
and one above, laid out on several rows and several blocks (odd and even positions).

Each function returns inputs built with exact arithmetic (powers of two times fp32 values whose
neighbours are taken from the bit pattern); the checks in quant.py and formats.py carry them as
permanent @examples, and runner/coverage/ lists the boundaries they reach.
"""
from __future__ import annotations

import numpy as np

from ..spec import formats as F

F32 = np.float32


def ulps(values, steps=(-1, 0, 1)) -> np.ndarray:
    """Each positive fp32 value and its neighbours `steps` fp32 ulps away."""
    bits = F.f32_bits(np.asarray(values, dtype=F32))
    return F.f32_from_bits(np.concatenate([bits + d for d in steps]))


def lay_out(blocks: list[np.ndarray], block: int, per_row: int = 3) -> np.ndarray:
    """Blocks (each at most `block` values, zero-padded) in rows of `per_row` blocks."""
    rows = -(-len(blocks) // per_row)
    x = np.zeros((rows * per_row, block), dtype=F32)
    for i, values in enumerate(blocks):
        x[i, :len(values)] = values
    return x.reshape(rows, per_row * block)


def around_top(values, top: float, k: int, block: int, signs=(1.0, -1.0)) -> list[np.ndarray]:
    """Blocks at scale 2^k: the block maximum top·2^k (at an even, then an odd position) and the
    given ratios times 2^k, with alternating signs."""
    scaled = np.asarray(values, dtype=np.float64) * 2.0 ** k
    scaled = scaled * np.resize(np.asarray(signs), scaled.size)
    out = []
    for i, start in enumerate(range(0, scaled.size, block - 1)):
        chunk = list(scaled[start:start + block - 1])
        chunk.insert(i % 2, top * 2.0 ** k)
        out.append(np.array(chunk, dtype=F32))
    return out


def e2m1_ties(block: int, ks, signs=(1.0, -1.0), steps=(-1, 0, 1)) -> np.ndarray:
    """|x|/s on every E2M1 tie (and `steps` ulps beside it), and on 6 and just below, at scales 2^k."""
    ratios = ulps(F.E2M1_BOUNDARIES + (6.0,), steps)
    ratios = ratios[ratios <= 6.0]                   # 6 + 1 ulp would double a power-of-two scale
    blocks = [b for k in ks for b in around_top(ratios, 6.0, k, block, signs)]
    return lay_out(blocks, block)


def negative_zero(block: int) -> np.ndarray:
    """Negative ratios around −0.25 (the tie between −0 and −0.5), −0 and fp32 subnormals, at
    scales 1 and 2^-3."""
    values = [-0.0, -2.0 ** -146, -2.0 ** -130, *(-ulps([0.25]))]
    return lay_out([b for k in (0, -3) for b in around_top(values, 6.0, k, block, signs=(1.0,))], block, per_row=2)


def amax_blocks(amaxes, block: int, filler: float = 0.5) -> np.ndarray:
    """One block per amax (alternating sign, at an odd or even position) among smaller values."""
    blocks = []
    for i, a in enumerate(np.asarray(amaxes, dtype=F32)):
        b = np.full(min(block, 6), F32(a) * F32(filler) / F32(3), dtype=F32)
        b[i % 2] = a if i % 3 else -a
        blocks.append(b)
    return lay_out(blocks, block)


def pow2_edges(top: float, ks) -> np.ndarray:
    """amax top·2^k and one ulp either side."""
    return ulps([top * 2.0 ** k for k in ks])


def e4m3_midpoint_representatives() -> np.ndarray:
    """One E4M3 midpoint of each class: subnormal / normal, lower code even / odd."""
    grid = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8))).astype(np.float64)
    mid = (grid[1:] + grid[:-1]) / 2
    return mid[[2, 5, 20, 41, 100, 125]]            # codes 2|3, 5|6 subnormal; 20|21, 41|42, 100|101, 125|126


def e4m3_midpoints(block: int, ks) -> np.ndarray:
    """|x|/s on E4M3 midpoints of every class, one ulp below and above, and on 448 ± 1 ulp."""
    ratios = ulps(np.concatenate([e4m3_midpoint_representatives(), [448.0]]))
    ratios = ratios[ratios <= 448.0]
    blocks = [b for k in ks for b in around_top(ratios, 448.0, k, block)]
    return lay_out(blocks, block, per_row=2)


# ---------------------------------------------------------------------------------------------
# The example sets the checks carry
# ---------------------------------------------------------------------------------------------

KV, IDX = 16, 32
KV_SCALE_KS = (-9, -3, 0, 4, 8)                      # E4M3 holds 2^k exactly for −9 ≤ k ≤ 8
IDX_SCALE_KS = (-120, -9, 0, 1, 8, 120)
FP8_SCALE_KS = (-22, -9, 0, 1, 8, 118)

E2M1_KV = e2m1_ties(KV, KV_SCALE_KS, signs=(1.0,))   # positive: the KV checks clear small negatives
# Exactly on the ties: one ulp beside a tie, a quotient rounded coarser than fp32 (FP4.KV.DIVIDE's
# clause) lands on the tie, so the E2M1 rule of the KV codec is judged on the ties themselves.
E2M1_KV_TIES = e2m1_ties(KV, KV_SCALE_KS, signs=(1.0,), steps=(0,))
E2M1_IDX = e2m1_ties(IDX, IDX_SCALE_KS)
NEGATIVE_ZERO_KV, NEGATIVE_ZERO_IDX = negative_zero(KV), negative_zero(IDX)


def _midpoints_times_6(subnormal: bool) -> np.ndarray:
    mids = e4m3_midpoint_representatives()
    mids = mids[(mids < 2.0 ** -6) == subnormal]
    return ulps(mids * 6.0)


KV_SCALE = amax_blocks(_midpoints_times_6(False), KV)
KV_FLOOR = amax_blocks(np.concatenate([ulps([6 * 2.0 ** -9]), _midpoints_times_6(True)]), KV)
KV_SATURATE = amax_blocks(ulps([6 * 448.0, 6 * 464.0]), KV)
IDX_SCALE = amax_blocks(np.concatenate([pow2_edges(6.0, IDX_SCALE_KS), ulps([6 * 2.0 ** -126], (0, 1))]), IDX)
IDX_FLOOR = amax_blocks(ulps([6 * 2.0 ** -126], (-1, -2)), IDX)
FP8_SCALE = amax_blocks(np.concatenate([pow2_edges(448.0, FP8_SCALE_KS), ulps([F32(1e-4)], (0, 1))]), 32)
FP8_FLOOR = amax_blocks(ulps([F32(1e-4)], (-1, -2)), 64)
FP8_MIDPOINTS = {block: e4m3_midpoints(block, (-3, 0, 5)) for block in (32, 64)}

E2M1_SATURATE = ulps([6.0], (-1, 0, 1))
E2M1_ZERO_SIGN = -ulps([0.25])
E4M3_SATFINITE = np.concatenate([ulps([448.0], (0, 1)), ulps([464.0])])   # below 448 is rounding (FMT.E4M3.RNE)


def range_class(block: int, floor: float, s: float, saturate: bool) -> np.ndarray:
    """The range class: a floor block (amax just below the floor, amax/s below 3 too) holding E2M1
    ties of the floor scale s, fp32 subnormals among them; with `saturate`, a block whose scale
    saturates at 448 holding the ties of 448."""
    ties = np.asarray(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES[1:-1], dtype=np.float64)
    below = float(np.nextafter(F32(floor), F32(0)))
    blocks = [np.array([below, *(ties[ties < 6] * s), 2.0 ** -149, -2.0 ** -140, 2.0 ** -127], dtype=F32),
              np.array([2.9 * s, *(ties[ties <= 2.5] * s), -2.0 ** -130, 2.0 ** -128], dtype=F32)]
    if saturate:
        blocks.append(np.array([2785.0, *(ties * 448.0), -0.75 * 448.0], dtype=F32))
        blocks.append(np.array([3.0e38, *(-ties * 448.0)], dtype=F32))
    return lay_out([b[:block] for b in blocks], block, per_row=2)


KV_RANGE = range_class(KV, 6 * 2.0 ** -9, 2.0 ** -9, saturate=True)
IDX_RANGE = range_class(IDX, 6 * 2.0 ** -126, 2.0 ** -126, saturate=False)


# ---------------------------------------------------------------------------------------------
# Groups of points for random draws (properties/quant.py's block kinds): a strategy picks a group,
# then a point in it, so each listed boundary (runner/coverage/) is drawn often, not only by
# an @example.  Each group is one boundary: exactly on it, or one ulp below, or one above.
# ---------------------------------------------------------------------------------------------

def beside(values) -> list[np.ndarray]:
    """Three groups: the values exactly, one fp32 ulp below, one above."""
    return [ulps(values, (d,)) for d in (-1, 0, 1)]


def each_beside(values) -> list[np.ndarray]:
    """Three groups for each value (each its own boundary)."""
    return [g for v in values for g in beside([v])]


def just_above_pow2(recip: float, ks) -> np.ndarray:
    """amaxes whose product with fl32(recip) is one ulp above a power of two 2^k."""
    out = []
    for k in ks:
        v = F.f32_from_bits(F.f32_bits(np.array([2.0 ** k], F32)) + 1)[0]
        for a in ulps([float(v) / recip], range(-3, 4)):
            if F32(a) * F32(recip) == v:
                out.append(a)
                break
    return np.array(out, dtype=F32)


def _e4m3_midpoint_classes():
    grid = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8))).astype(np.float64)
    mid, lower = (grid[1:] + grid[:-1]) / 2, np.arange(0x7E)
    return [mid[((lower < 8) == sub) & (lower % 2 == parity)] for sub in (True, False) for parity in (0, 1)]


E4M3_MIDPOINT_CLASSES = _e4m3_midpoint_classes()
E2M1_TIE_GROUPS = each_beside(F.E2M1_BOUNDARIES + (6.0,))
E4M3_MIDPOINT_GROUPS = [g for c in E4M3_MIDPOINT_CLASSES for g in beside(c)]
E4M3_TOP_GROUPS = beside([448.0])[:2]         # the largest E4M3 and one ulp below (above: saturation)
AMAX_POINTS = {      # codec -> amax groups on the scale's decision boundaries
    "kv": [g for c in E4M3_MIDPOINT_CLASSES for g in beside(c * 6)] + beside([6 * 448.0])[:2]
          + [ulps([6 * 2.0 ** -9], (1,))],
    "idx": each_beside([6.0 * 2.0 ** k for k in IDX_SCALE_KS]) + [just_above_pow2(1 / 6, (-100, -9, 0, 9, 100))]
           + [ulps([6 * 2.0 ** -126], (d,)) for d in (0, 1)],
    "fp8": each_beside([448.0 * 2.0 ** k for k in FP8_SCALE_KS]) + [just_above_pow2(1 / 448, (-20, -9, 0, 9, 100))]
           + [ulps([F32(1e-4)], (d,)) for d in (0, 1)],
}
FLOOR_POINTS = {"kv": [ulps([6 * 2.0 ** -9], (d,)) for d in (-1, 0)], "idx": [ulps([6 * 2.0 ** -126], (-1,))],
                "fp8": [ulps([F32(1e-4)], (-1,))]}
SATURATION_POINTS = [ulps([6 * 448.0], (1,))] + beside([6 * 464.0])
