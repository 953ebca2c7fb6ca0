"""The golden cases: deterministic inputs, the operation that maps them, and how outputs compare.

Inputs come from a splitmix64 stream written out here (not numpy's generators, whose streams may
change between releases), so regenerating on any machine gives the same bits.  Only outputs that
are exactly defined are stored: codes, scale bytes, masks, entry bytes, and scores of inputs whose
sums are exact in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(seed: int, n: int) -> np.ndarray:
    """n pseudo-random uint64 words (Steele, Lea & Flood 2014), computed with wrapping uint64 math."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform(seed: int, shape) -> np.ndarray:
    """float32 in [0, 1) with 24 random bits each."""
    words = splitmix64(seed, int(np.prod(shape)))
    return ((words >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)).reshape(shape)


def mixed_magnitudes(seed: int, shape, lo: float = -6.0, hi: float = 3.5) -> np.ndarray:
    """BF16-representable values sign·2^e·(1+m) with log10-uniform-ish magnitudes in [10^lo, 10^hi],
    zero blocks and exact E2M1 ties sprinkled in."""
    u, v, w = uniform(seed, shape), uniform(seed + 1, shape), uniform(seed + 2, shape)
    x = np.where(v < 0.5, -1.0, 1.0) * 10.0 ** (lo + (hi - lo) * u)
    x = _to_bf16(x.astype(np.float32))
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=np.float32)
    x = np.where(w < 0.05, ties[(w * 160).astype(int) % 8], x)
    x[..., :32] = np.where(uniform(seed + 3, shape[:-1])[..., None] < 0.1, 0.0, x[..., :32])
    return x.astype(np.float32)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


@dataclass(frozen=True)
class Case:
    name: str
    rule: str                     # the rule id this case gates
    op: str                       # canonical operation name
    inputs: dict                  # name -> np.ndarray, passed positionally in this order
    args: dict = field(default_factory=dict)   # extra keyword arguments (ints/strings)
    outputs: tuple[str, ...] = ("out",)


def permutation_rows(seed: int, rows: int, n: int) -> np.ndarray:
    """Each row a permutation of 1..n (as float32): distinct scores, so top-k and pools are unique."""
    return (np.argsort(uniform(seed, (rows, n)), axis=1, kind="stable") + 1).astype(np.float32)


def fp4_operands(seed: int, rows: int, heads: int, keys: int, dim: int = 128):
    """FP4 q and k with E8M0 scales 2^-1 or 2^0 and weights ±2^-j (j ≤ 3).

    Every product is a multiple of 2^-4 below 36, so each per-head dot (< 2^13) and each head sum
    (< 2^16 in steps of 2^-7) is exact in fp32: any summation order gives the same bits, and the
    BF16 roundings of the rule are then the only roundings."""
    words = lambda s, shape: (splitmix64(s, int(np.prod(shape))) >> np.uint64(56)).astype(np.uint8).reshape(shape)
    q_packed, k_packed = words(seed, (rows, heads, dim // 2)), words(seed + 1, (keys, dim // 2))
    q_scales = 126 + (words(seed + 2, (rows, heads, dim // 32)) & 1)
    k_scales = 126 + (words(seed + 3, (keys, dim // 32)) & 1)
    w_bits = words(seed + 4, (rows, heads))
    w = np.where(w_bits & 8, -1.0, 1.0) * 2.0 ** -(w_bits & 3).astype(np.float32)
    return q_packed, q_scales.astype(np.uint8), k_packed, k_scales.astype(np.uint8), w.astype(np.float32)


def cases() -> list[Case]:
    x512 = mixed_magnitudes(11, (64, 512))
    x128 = mixed_magnitudes(12, (64, 128))
    x448 = mixed_magnitudes(13, (64, 448))
    return [
        Case("fp4_e4m3_kv", "FP4.KV.SCALE", "fp4_e4m3_quantize", {"x": x512}, outputs=("packed", "scales")),
        Case("fp4_e8m0_index", "FP4.IDX.SCALE", "fp4_e8m0_quantize", {"x": x128}, outputs=("packed", "scales")),
        Case("fp8_v4_main_kv", "FP8.SCALE", "fp8_quantize", {"x": x448}, {"block": 64}, ("q", "scales")),
        Case("fp8_v41_swa", "FP8.SCALE", "fp8_quantize", {"x": x512}, {"block": 32}, ("q", "scales")),
        Case("fp8_v32_index", "FP8.SCALE", "fp8_quantize", {"x": x128}, {"block": 128}, ("q", "scales")),
        *indexer_cases(),
    ]


def indexer_cases() -> list[Case]:
    from ..impl.quant import fp4_e8m0_dequantize    # the inputs of the value-level score cases
    import torch
    q_packed, q_scales, k_packed, k_scales, w = fp4_operands(21, 12, 8, 40)
    visible = np.array([0, 1, 2, 5, 8, 13, 20, 27, 33, 38, 40, 40], dtype=np.int64)
    q = fp4_e8m0_dequantize(torch.from_numpy(q_packed), torch.from_numpy(q_scales)).numpy()
    k = fp4_e8m0_dequantize(torch.from_numpy(k_packed), torch.from_numpy(k_scales)).numpy()
    scores = permutation_rows(22, 12, 200)
    seen = np.array([0, 1, 7, 8, 9, 31, 32, 33, 64, 150, 199, 200], dtype=np.int64)
    scores[np.arange(200)[None, :] >= seen[:, None]] = -np.inf
    fp4 = {"q_packed": q_packed, "q_scales": q_scales, "k_packed": k_packed, "k_scales": k_scales,
           "w": w, "visible": visible}
    values = {"q": q, "k": k, "w": w, "visible": visible}
    return [
        Case("index_scores_fp4", "IDX.SCORE.FP4", "index_scores_fp4", fp4),
        Case("index_scores_bf16", "IDX.SCORE.ROUNDING", "index_scores", values, {"score_dtype": "bf16"}),
        Case("index_scores_v32_fp32", "IDX.SCORE.V32_FP32", "index_scores", values, {"score_dtype": "fp32"}),
        Case("index_topk_v41", "IDX.TOPK.ORDER", "index_topk", {"scores": scores, "visible": seen},
             {"k": 32, "order": "position"}),
        Case("index_topk_v4", "IDX.TOPK.ORDER", "index_topk", {"scores": scores, "visible": seen},
             {"k": 32, "order": "score"}),
        Case("candidate_blocks", "POOL.TOPK_BLOCKS", "candidate_blocks",
             {"scores": scores, "compress_lens": seen}, {"topk_blocks": 5, "block_size": 8}),
    ]
