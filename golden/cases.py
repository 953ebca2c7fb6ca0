"""The golden cases: deterministic inputs, the operation that maps them, and how outputs compare.

Inputs are built from a splitmix64 stream written out here (not numpy's generators, whose streams
may change between releases) with integer arithmetic only: every value is assembled from its sign,
exponent and mantissa bits, or is a power of two times a small integer.  No transcendental
function and no platform math library is involved (numpy's SIMD pow differs by an ulp between CPU
dispatch levels), so any machine regenerates the same bits.  Only outputs that are exactly defined
are stored: codes, scale bytes, masks, and scores of inputs whose sums are exact in fp32; each is
checked against spec/'s exact definition when it is generated (store.generate).  The indexer
path's cases (golden/layers.py) store layer stages that every conforming target rounds alike;
their search decides which rows to redraw with float64 math (see there why that cannot move a bit).
The attention layer's cases (golden/attn_layers.py) add inputs under which the attention output
is exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec import attn as spec_attn
from ..spec import formats as F
from ..spec import indexer as spec_indexer
from ..spec import pool as spec_pool
from ..spec import quant as Q
from ..spec.models import profile

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(seed: int, n: int) -> np.ndarray:
    """n pseudo-random uint64 words (Steele, Lea & Flood 2014), computed with wrapping uint64 math."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def random_bits(seed: int, shape, bits: int) -> np.ndarray:
    """The top `bits` bits of each word as int64 in [0, 2^bits)."""
    words = splitmix64(seed, int(np.prod(shape)))
    return (words >> np.uint64(64 - bits)).astype(np.int64).reshape(shape)


def uniform(seed: int, shape) -> np.ndarray:
    """float32 in [0, 1) with 24 random bits each (exact: an integer < 2^24 times 2^-24)."""
    return (random_bits(seed, shape, 24).astype(np.float32) * np.float32(2.0 ** -24))


def bf16_from_fields(sign, exponent, mantissa) -> np.ndarray:
    """float32 values (-1)^sign · 2^exponent · (1 + mantissa/128), assembled from their bits."""
    bits = (np.asarray(sign) << 31) | ((np.asarray(exponent) + 127) << 23) | (np.asarray(mantissa) << 16)
    return F.f32_from_bits(bits)


def bf16_step(values, ulps: int) -> np.ndarray:
    """Each BF16 value moved by `ulps` BF16 ulps away from zero (negative: toward zero)."""
    return F.f32_from_bits(F.f32_bits(values) + (ulps << 16))


E2M1_TIES = np.array(F.E2M1_BOUNDARIES + (F.E2M1_MAX,), dtype=np.float32)


def mixed_magnitudes(seed: int, shape, e_lo: int = -20, e_hi: int = 11) -> np.ndarray:
    """BF16 values ±2^e·(1 + m/128) with e uniform in [e_lo, e_hi] (about 10^-6 … 10^3.5), 5% of
    them exact E2M1 ties at scale 1, and the first 32 values of 10% of the rows zero."""
    sign = random_bits(seed, shape, 1)
    exponent = e_lo + random_bits(seed + 1, shape, 32) % (e_hi - e_lo + 1)
    x = bf16_from_fields(sign, exponent, random_bits(seed + 2, shape, 7))
    pick = random_bits(seed + 3, shape, 16)
    x = np.where(pick % 20 == 0, E2M1_TIES[(pick // 20) % 8], x)
    zero_rows = random_bits(seed + 4, shape[:-1], 16) % 10 == 0
    x[..., :32] = np.where(zero_rows[..., None], np.float32(0), x[..., :32])
    return x.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Edge rows: blocks built on each codec's decision boundaries (spec/formats.py, spec/quant.py)
# ---------------------------------------------------------------------------------------------

def _pow2(k: int) -> float:
    return 2.0 ** k                                    # exact in Python floats for |k| ≤ 1000


def edge_blocks(top: float, ties) -> list[list[float]]:
    """Short blocks (padded with zeros by edge_rows) on the boundaries of a codec whose element
    maximum is `top`: ties at scales 2^k, amax at top·2^k and 7·2^k, 8·2^k one BF16 ulp either side,
    negative values rounding to −0, BF16 subnormals and zeros."""
    out = []
    for k in (-12, -3, 0, 1, 5, 9):
        out.append([top * _pow2(k)] + [t * _pow2(k) * s for t in ties for s in (1.0, -1.0)])
    for k in (-20, -9, -1, 0, 4, 11):
        for base in (top, 7.0, 8.0):
            amax = np.array([base * _pow2(k)], dtype=np.float32)
            for ulps in (-1, 0, 1):
                out.append([float(bf16_step(amax, ulps)[0]), -0.5 * base * _pow2(k)])
    out.append([-0.0, -top * _pow2(-4) / 16, top * _pow2(-4)])
    out.append([float(bf16_from_fields(0, -127, 1)[()]) * m for m in (1, -3, 64, 127)])  # BF16 subnormals
    out.append([0.0])
    return out


def edge_rows(width: int, block: int, top: float, ties) -> np.ndarray:
    """The edge blocks laid out block after block in rows of `width`, odd and even block positions,
    the last row zero-padded."""
    blocks = edge_blocks(top, ties)
    per_row = width // block
    rows = -(-len(blocks) // per_row)
    x = np.zeros((rows * per_row, block), dtype=np.float32)
    for i, values in enumerate(blocks):
        x[i, :len(values)] = np.array(values[:block], dtype=np.float64).astype(np.float32)
    return x.reshape(rows, width)


def codec_input(seed: int, width: int, block: int, top: float, ties) -> np.ndarray:
    return np.concatenate([mixed_magnitudes(seed, (64, width)), edge_rows(width, block, top, ties)])


E4M3_MIDPOINT_TIES = (1.0625, 1.1875, 17.0, 240.0, 232.0, 3 * 2.0 ** -10)   # E4M3 ties at scale 1


@dataclass(frozen=True)
class Case:
    name: str
    rule: str                     # the rule id this case gates
    op: str                       # canonical operation name
    inputs: dict                  # name -> np.ndarray, passed positionally in this order
    args: dict = field(default_factory=dict)   # extra keyword arguments (ints/strings)
    outputs: tuple[str, ...] = ("out",)
    # "mapping": the operation takes the inputs as one dict and returns a dict holding the outputs
    call: str = "positional"
    generated: dict = field(default_factory=dict)      # input name -> its recipe (layers.Weight), not stored
    output_rules: dict = field(default_factory=dict)   # output name -> the rule it gates (default: rule)
    unordered: dict = field(default_factory=dict)      # output -> leading columns whose order in a row is
    #                                                    free (None: all), compared as a multiset per row
    positional: tuple[str, ...] = ()    # args passed positionally after the inputs (the contract's order)
    build: object = None                # () -> the case with its inputs, where they take a search to build
    notes: dict = field(default_factory=dict)   # stage -> why it is determined (or not stored), in the file
    zero_sign_free: tuple[str, ...] = ()          # float outputs whose zeros compare without their sign

    def call_args(self) -> tuple[tuple, dict]:
        """(positional, keyword) arguments after the inputs."""
        return (tuple(self.args[k] for k in self.positional),
                {k: v for k, v in self.args.items() if k not in self.positional})


def permutation_rows(seed: int, rows: int, n: int) -> np.ndarray:
    """Each row a permutation of 1..n (as float32): distinct scores, so top-k and pools are unique."""
    keys = random_bits(seed, (rows, n), 40) * n + np.arange(n)        # distinct integer keys
    return (np.argsort(keys, axis=1, kind="stable") + 1).astype(np.float32)


def fp4_operands(seed: int, rows: int, heads: int, keys: int, dim: int = 128):
    """FP4 q and k with E8M0 scales 2^-1 or 2^0 and weights ±2^-j (j ≤ 3).

    Every product is a multiple of 2^-4 below 36, so each per-head dot (< 2^13) and each head sum
    (< 2^16 in steps of 2^-7) is exact in fp32: any summation order gives the same bits, and the
    BF16 roundings of the rule are then the only roundings."""
    def words(s, shape):
        return random_bits(s, shape, 8).astype(np.uint8)
    q_packed, k_packed = words(seed, (rows, heads, dim // 2)), words(seed + 1, (keys, dim // 2))
    q_scales = 126 + (words(seed + 2, (rows, heads, dim // 32)) & 1)
    k_scales = 126 + (words(seed + 3, (keys, dim // 32)) & 1)
    w_bits = words(seed + 4, (rows, heads)).astype(np.int64)
    w = bf16_from_fields(w_bits >> 3 & 1, -(w_bits & 3), 0)
    return q_packed, q_scales.astype(np.uint8), k_packed, k_scales.astype(np.uint8), w.astype(np.float32)


def built(case: Case) -> Case:
    """The case with its inputs (a layer case is described without them until it is generated)."""
    return case.build() if case.build is not None else case


def codec_cases() -> list[Case]:
    ties_fp4, ties_fp8 = E2M1_TIES[:-1].tolist(), list(E4M3_MIDPOINT_TIES)
    x512 = codec_input(11, 512, 16, 6.0, ties_fp4)
    x128 = codec_input(12, 128, 32, 6.0, ties_fp4)
    x448 = codec_input(13, 448, 64, 448.0, ties_fp8)
    swa = codec_input(14, 512, 32, 448.0, ties_fp8)
    v32 = codec_input(15, 128, 128, 448.0, ties_fp8)
    return [
        Case("fp4_e4m3_kv", "FP4.KV.SCALE", "fp4_e4m3_quantize", {"x": x512}, outputs=("packed", "scales")),
        Case("fp4_e8m0_index", "FP4.IDX.SCALE", "fp4_e8m0_quantize", {"x": x128}, outputs=("packed", "scales")),
        Case("fp8_v4_main_kv", "FP8.SCALE", "fp8_quantize", {"x": x448}, {"block": 64}, ("q", "scales")),
        Case("fp8_v41_swa", "FP8.SCALE", "fp8_quantize", {"x": swa}, {"block": 32}, ("q", "scales")),
        Case("fp8_v32_index", "FP8.SCALE", "fp8_quantize", {"x": v32}, {"block": 128}, ("q", "scales")),
    ]


# ---------------------------------------------------------------------------------------------
# fp32 codec inputs: the scale classes no BF16 amax reaches (runner/coverage/quant.py: pow2_scale,
# kv_midpoints); a target whose quantizers take BF16 is not asked them (store.check_target)
# ---------------------------------------------------------------------------------------------

def _f32_steps(v: float, ulps) -> np.ndarray:
    """The fp32 values `ulps` fp32 ulps above v (away from zero)."""
    return F.f32_from_bits(F.f32_bits(np.float32(v)) + np.asarray(ulps, dtype=np.int64))


def log2_edge_amaxes(top: float, ks) -> list[float]:
    """For each k, the first fp32 amax at or above top·2^k whose v = fl32(amax · fl32(1/top)) is
    one ulp above 2^k: a floating log2 of v rounds to k there, the exact ceil is k + 1
    (FMT.CEIL_LOG2; the product is correctly rounded, the same on every machine)."""
    inverse = np.float32(1) / np.float32(top)
    out = []
    for k in ks:
        amax = _f32_steps(top * _pow2(k), np.arange(64))
        v = amax * inverse
        hit = np.flatnonzero((F.f32_bits(v) & 0x7FFFFF) == 1)
        if hit.size == 0:
            raise RuntimeError(f"log2_edge_amaxes: no fp32 amax near {top}·2^{k} puts v one ulp above 2^{k}")
        out.append(float(amax[hit[0]]))
    return out


def e4m3_reciprocal_amaxes(count: int) -> list[float]:
    """fp32 amaxes near 6·m for E4M3 midpoints m (normal and subnormal) where E4M3(fl32(amax/6))
    differs from E4M3(fl32(amax · fl32(1/6))): the division FP4.KV.SCALE names, told apart from
    the reciprocal product."""
    codes = np.arange(0x01, 0x7E, dtype=np.uint8)
    values = F.e4m3_decode(codes).astype(np.float64)
    midpoints = (values[:-1] + values[1:]) / 2
    sixth = np.float32(1) / np.float32(6)
    out = []
    for m in midpoints:
        amax = _f32_steps(6 * m, np.arange(-4, 5))
        divided, multiplied = amax / np.float32(6), amax * sixth
        differ = F.e4m3_encode(divided) != F.e4m3_encode(multiplied)
        out += [float(a) for a in amax[differ][:1]]
    step = max(len(out) // count, 1)
    return out[::step][:count]


def blocks_of_amaxes(amaxes, block: int, width: int) -> np.ndarray:
    """One block per amax, [amax, −amax/2, amax/3 (rounded to fp32)], laid out `width` wide."""
    x = np.zeros((-(-len(amaxes) * block // width) * (width // block), block), dtype=np.float32)
    for i, a in enumerate(np.asarray(amaxes, dtype=np.float32)):
        x[i, :3] = [a, -a / np.float32(2), a / np.float32(3)]
    return x.reshape(-1, width)


LOG2_KS = (-120, -100, -20, -9, -5, -4, 4, 5, 9, 20, 100, 120)
FP8_LOG2_KS = (-20, -9, -5, -4, 4, 5, 9, 20, 100, 118)         # amax ≥ the floor 1e-4: v ≥ 2^-22


def one_ulp_around(*points) -> list[float]:
    """Each point and the fp32 values one ulp either side (floors and saturation points that are
    not BF16 values, or whose neighbours are not)."""
    return [float(v) for p in points for v in _f32_steps(p, (-1, 0, 1))]


def fp32_codec_cases() -> list[Case]:
    kv = e4m3_reciprocal_amaxes(32) + one_ulp_around(6 * _pow2(-9), 6 * 448.0, 6 * 464.0)
    idx = log2_edge_amaxes(6.0, LOG2_KS) + one_ulp_around(6 * _pow2(-126))
    fp8 = log2_edge_amaxes(448.0, FP8_LOG2_KS) + one_ulp_around(np.float32(1e-4))
    return [
        Case("fp4_e4m3_kv_fp32", "FP4.KV.SCALE", "fp4_e4m3_quantize", {"x": blocks_of_amaxes(kv, 16, 128)},
             outputs=("packed", "scales")),
        Case("fp4_e8m0_index_fp32", "FP4.IDX.SCALE", "fp4_e8m0_quantize", {"x": blocks_of_amaxes(idx, 32, 128)},
             outputs=("packed", "scales")),
        Case("fp8_fp32_log2", "FP8.SCALE", "fp8_quantize", {"x": blocks_of_amaxes(fp8, 32, 128)}, {"block": 32},
             ("q", "scales")),
    ]


def indexer_cases() -> list[Case]:
    q_packed, q_scales, k_packed, k_scales, w = fp4_operands(21, 12, 8, 40)
    visible = np.array([0, 1, 2, 5, 8, 13, 20, 27, 33, 38, 40, 40], dtype=np.int64)
    q = Q.fp4_e8m0_dequantize(q_packed, q_scales)
    k = Q.fp4_e8m0_dequantize(k_packed, k_scales)
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


# ---------------------------------------------------------------------------------------------
# Sparse attention: rows of small integers over 8 (exact fp32 dots), each token's row redrawn until
# every output is one BF16 value under spec.attn's tolerance (so no exp or summation order can
# move a bit)
# ---------------------------------------------------------------------------------------------
ATTN_ROWS = 160


def _attention_row(seed: int, heads: int, dim: int, width: int, pattern: str):
    """One token's q [H, D] and list [K]: kv row 0 (the star) is every head's max at the pattern's
    position; 'first', 'late' (block 2), 'duplicates', 'sprinkled' (−1 entries), 'leading' (a first
    block of 64 all −1), 'none' (all −1)."""
    q = (random_bits(seed, (heads, dim), 5) - 15).astype(np.float64) / 8
    q[:, 0] = (24 + random_bits(seed + 1, heads, 5)) / 8
    keys = random_bits(seed + 2, ATTN_ROWS - 1, 40) * ATTN_ROWS + np.arange(ATTN_ROWS - 1)
    order = 1 + np.argsort(keys, kind="stable")
    row = order[:width].astype(np.int64)
    at = {"late": 140, "leading": 64}.get(pattern, 0)
    row[at] = 0
    if pattern == "duplicates":
        row[1:9] = row[0]
        row[40:60] = row[20:40]
    if pattern == "sprinkled":
        row[1:][random_bits(seed + 3, width - 1, 3)[: width - 1] < 3] = -1
    if pattern == "leading":
        row[:64] = -1
    if pattern == "none":
        row[:] = -1
    return q, row


def attention_case(name: str, model: str, patterns, seed: int, heads: int = 2, dim: int = 16,
                   width: int = 150) -> Case:
    m = profile(model)
    kv = (random_bits(seed, (ATTN_ROWS, dim), 5) - 15).astype(np.float64) / 8
    kv[:, 0] = (random_bits(seed + 1, ATTN_ROWS, 5) - 15) / 16
    kv[0, 0] = 32.0
    sink = np.array([1.0, -2.5] * heads)[:heads]
    scale, init = spec_attn.softmax_scale(m), spec_attn.running_max_init(m)
    qs, rows = [], []
    for t, pattern in enumerate(patterns):
        for tries in range(200):
            q, row = _attention_row(seed + 1000 * (t + 1) + 7 * tries, heads, dim, width, pattern)
            lo, hi = spec_attn.bounds(q[None], kv, sink, row[None], scale, init)
            if np.array_equal(F.f32_bits(spec_indexer.round_bf16(lo)), F.f32_bits(spec_indexer.round_bf16(hi))):
                break
        else:
            raise RuntimeError(f"{name}: no determined row for pattern {pattern!r}")
        qs.append(q)
        rows.append(row)
    inputs = {"q": np.array(qs, np.float32), "kv": kv.astype(np.float32), "sink": sink.astype(np.float32),
              "indices": np.array(rows, np.int64)}
    return Case(name, "ATTN.PROB.ORDER", "sparse_attention", inputs, {"scale": scale, "model": model},
                positional=("scale",))


def attention_cases() -> list[Case]:
    return [attention_case("sparse_attention_v4", "v4-flash", ("first", "late", "duplicates", "sprinkled"), 41),
            attention_case("sparse_attention_v41", "v4.1-flash",
                           ("first", "late", "duplicates", "sprinkled", "leading", "none"), 42)]


# ---------------------------------------------------------------------------------------------
# spec/'s exact definition of each golden operation (the generator checks impl against it)
# ---------------------------------------------------------------------------------------------

def _index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible):
    q, k = Q.fp4_e8m0_dequantize(q_packed, q_scales), Q.fp4_e8m0_dequantize(k_packed, k_scales)
    return spec_indexer.index_scores(q, k, w, visible, "bf16")


def _sparse_attention(q, kv, sink, indices, scale, model):
    return spec_attn.sparse_attention(q, kv, sink, indices, scale, profile(model))


SPEC = {
    "fp4_e4m3_quantize": Q.fp4_e4m3_quantize,
    "fp4_e8m0_quantize": Q.fp4_e8m0_quantize,
    "fp8_quantize": Q.fp8_quantize,
    "index_scores_fp4": _index_scores_fp4,
    "index_scores": spec_indexer.index_scores,
    "index_topk": spec_indexer.index_topk,       # scores of a row are distinct: one valid top-k
    "candidate_blocks": spec_pool.candidate_blocks,
    "sparse_attention": _sparse_attention,
}
