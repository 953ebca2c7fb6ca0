"""Lightning indexer: Hadamard rotation (HAD.*), scores, visibility and top-k (IDX.*).

The indexer scores every visible compressed KV entry s for every query t,

    I[t, s] = Σ_h  w[t, h] · ReLU( q[t, h] · k[s] ),

and keeps the k best entries.  The definitions below are exact: dot products of BF16 values and
sums of BF16 values are formed in float64 (exact for any inputs whose products span fewer than
~40 binades, which every generated input does), and every rounding to BF16 is written out as
round-to-nearest-even on the exact value.  A framework cast never defines a rounding here.

Sources: V4-model L247-251, L380-433 (rotate_activation, Indexer), V41-model L488-580 (Indexer),
V32-model L431-480 (Indexer); doc-002 (V4 lightning indexer) and doc-003 (V4 indexer walk-through).
"""
from __future__ import annotations

import functools

import numpy as np

from .models import Model
from .rules import IMPLEMENTATION_DEFINED, INFORMATIVE, V4, V41, V4_ALL, knob, rule

V32 = ("v3.2",)

# ------------------------------------------------------------------------------------------------
# BF16, written out (8 significant bits, exponent range of fp32, round to nearest, ties to even)
# ------------------------------------------------------------------------------------------------
BF16_MIN_EXP = -126          # smallest normal exponent; subnormals are multiples of 2^-133
BF16_MANTISSA_BITS = 7


FLOAT64_BIAS, FLOAT64_MANTISSA_BITS, FLOAT64_TOP_FIELD = 1023, 52, 0x7FF


def bf16_quantum(x) -> np.ndarray:
    """The spacing of BF16 numbers at |x| (one BF16 ulp); 2^-133 below the normal range (0 and NaN too),
    2^-7 at ±inf.  Read from x's float64 exponent field: a normal a = 1.f·2^(field − 1023)."""
    a = np.asarray(x, dtype=np.float64)
    shape, a = a.shape, a.reshape(-1)
    field = (a.view(np.uint64) >> np.uint64(FLOAT64_MANTISSA_BITS)) & np.uint64(FLOAT64_TOP_FIELD)
    np.maximum(field, np.uint64(FLOAT64_BIAS + BF16_MIN_EXP), out=field)
    special = field == FLOAT64_TOP_FIELD                                              # ±inf, NaN
    if special.any():
        field[special] = np.where(np.isnan(a[special]), FLOAT64_BIAS + BF16_MIN_EXP, FLOAT64_BIAS)
    field -= np.uint64(BF16_MANTISSA_BITS)
    field <<= np.uint64(FLOAT64_MANTISSA_BITS)
    return field.view(np.float64).reshape(shape)[()]


def round_bf16(x) -> np.ndarray:
    """Round exact (float64) values to the nearest BF16 value, ties to even; overflow gives ±inf."""
    x = np.asarray(x, dtype=np.float64)
    q = bf16_quantum(x)
    y = np.rint(x / q) * q                    # x/q is exact (q is a power of two); rint ties to even
    y = np.where(np.abs(y) >= 2.0 ** 128, np.copysign(np.inf, x), y)
    return np.where(np.isfinite(x), y, x)


def is_bf16(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return (round_bf16(x) == x) | np.isnan(x)


def round_fp32(x) -> np.ndarray:
    """IEEE binary32 round-to-nearest-even of float64 values (numpy's conversion is IEEE RNE)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


# ------------------------------------------------------------------------------------------------
# HAD: the Hadamard rotation of indexer q and k (V3.2, V4; not V4.1)
# ------------------------------------------------------------------------------------------------
HADAMARD_DIM = 128
HADAMARD_SCALE = HADAMARD_DIM ** -0.5


@functools.lru_cache(maxsize=None)
def sylvester_hadamard(d: int = HADAMARD_DIM) -> np.ndarray:
    """H[i, j] = (−1)^popcount(i & j): the Sylvester construction H_2n = [[H, H], [H, −H]]."""
    i = np.arange(d)
    bits = np.bitwise_and.outer(i, i)
    parity = np.zeros_like(bits)
    while bits.any():
        parity ^= bits & 1
        bits >>= 1
    matrix = 1 - 2 * parity
    matrix.setflags(write=False)
    return matrix


def hadamard(x) -> np.ndarray:
    """bf16( H·x / √128 ) over the last dimension; x holds BF16 values."""
    x = np.asarray(x, dtype=np.float64)
    return round_bf16((x @ sylvester_hadamard(x.shape[-1]).T) * HADAMARD_SCALE)


def hadamard_tolerance(x) -> np.ndarray:
    """One BF16 ulp of the result, plus the fp32 butterfly's accumulation bound (7 stages)."""
    x = np.asarray(x, dtype=np.float64)
    exact = (x @ sylvester_hadamard(x.shape[-1]).T) * HADAMARD_SCALE
    l1 = np.abs(x).sum(axis=-1, keepdims=True) * HADAMARD_SCALE
    return bf16_quantum(exact) + 2.0 ** -20 * l1


def rotates_index_qk(model: Model) -> bool:
    return model.hadamard


rule("HAD.MATRIX", "Sylvester Hadamard, orthonormal, no random signs",
     """The rotation is y = H·x / √128 over the 128 indexer dimensions, with H the Sylvester
     (natural-order) Hadamard matrix H[i, j] = (−1)^popcount(i AND j) and scale 128^-0.5.  There
     is no random sign vector and no permutation: basis vector e_j maps to column j of H times
     bf16(128^-0.5) = ±0.08837890625.""",
     applies_to=V32 + V4, policy="exact",
     sources=("V4-model L247-251", "V32-model L424-428", "doc-002 Q&A 7 L27"),
     differs="""Document 002 (Q&A 7) speaks of a *random* Hadamard rotation and the V4 docstring says
     'randomized'; the code calls fast_hadamard_transform with scale d^-0.5 and applies no signs
     or permutation, so the rotation is deterministic.""")

rule("HAD.ROUNDING", "Hadamard output rounded to BF16",
     """Input and output are BF16.  Each output element is BF16-representable and lies within one
     BF16 ulp of the exact value H·x/√128, plus 2^-20·‖x‖₁/√128 for the fp32 butterfly's
     accumulation order.""",
     applies_to=V32 + V4, policy="tolerance",
     sources=("V4-model L247-251 (BF16 asserted on input, output in x's dtype)", "V32-model L424-428 (the same)"),
     tolerance="""|y − H·x/√128| ≤ ulp_bf16(H·x/√128) + 2^-20·‖x‖₁/√128 per element (hadamard_tolerance):
     the final rounding to BF16 is at most half an ulp, doubled to admit a flipped rounding when the
     fp32 value lies near a BF16 midpoint; each of the 7 fp32 butterfly stages and the scaling
     rounds by at most 2^-24 of a partial sum bounded by ‖x‖₁, 8·2^-24 < 2^-20.""")

rule("HAD.PLACEMENT", "Hadamard on indexer q and k after RoPE, before quantization",
     """In V4 the rotation is applied to the indexer query after RoPE on its last 64 dims, and to
     the indexer's compressed key (the compressor's RMSNorm → RoPE on the last 64 dims → rotation),
     both immediately before their FP4 E8M0/32 quantization.  In V3.2 the query's RoPE is on its
     FIRST 64 dims (q_pe, q_nope = split(q, [64, 64])), and the key is LayerNorm(wk(x)) of every
     token — not a compressed entry — with RoPE on its first 64 dims; both are then rotated and
     quantized to FP8 per 128.  It is never applied to the main attention q or KV.""",
     applies_to=V32 + V4, policy="structural", status=INFORMATIVE,
     sources=("V4-model L362-370, L413-416", "V32-model L443 (k_norm = LayerNorm(head_dim))",
              "V32-model L457-464 (q_pe first; k = k_norm(wk(x)), k_pe first)", "V32-model L465-468",
              "doc-003 §11.1 L345-353 (rotate_activation(q) before fp4_act_quant)", "doc-002 design trade-offs L8"))

rule("HAD.ABSENT_V41", "No Hadamard rotation in V4.1",
     """V4.1 applies no rotation to indexer q or k: index_rotate(x, 'v4.1-flash') returns x
     unchanged.  Its model.py has no rotate_activation and no fast_hadamard_transform import: the
     index K, RoPE(k_norm(wk(latent))), and the index Q, RoPE(wq_b(qr)), go straight to FP4.  The
     source documents describe the rotation for V4 only (documents 002 and 003); document 000
     (V4.1) does not mention it.""",
     applies_to=V41, policy="exact",
     sources=("V41-model L541-552", "V41-model L1-21 (the imports: no fast_hadamard_transform)"))


def index_rotate(x, model: Model) -> np.ndarray:
    return hadamard(x) if rotates_index_qk(model) else np.asarray(x, dtype=np.float64)


# ------------------------------------------------------------------------------------------------
# IDX: weights, scores
# ------------------------------------------------------------------------------------------------
def index_weights(raw, model: Model) -> np.ndarray:
    """bf16( raw · fl32(c) ) with c = index_head_dim^-0.5 · index_n_heads^-0.5.

    The product of a BF16 tensor and a Python scalar is formed in fp32 and rounded to BF16
    (two roundings; c is 1/64 exactly for V4.1, so both are exact there)."""
    c = round_fp32(model.index_weight_scale)
    return round_bf16(round_fp32(np.asarray(raw, dtype=np.float64) * c))


def index_weights_once(raw, model: Model) -> np.ndarray:
    """bf16( raw · fl32(c) ) rounded once from the exact product (8 x 24 significant bits: exact in
    float64) -- the other accepted reading of IDX.WEIGHT.SCALE."""
    return round_bf16(np.asarray(raw, dtype=np.float64) * round_fp32(model.index_weight_scale))


WEIGHT_FP32_ROUNDINGS = 8     # an fp32 weight: the factors and each product rounded, in any factorisation


def weights_accepted(got, raw, factor: float, rounding: str = "bf16_steps") -> np.ndarray:
    """Where got is an accepted weight raw · factor under score_rounding = `rounding`: one of the two
    BF16 roundings of raw · fl32(factor); under fp32 or fp32_then_bf16 also any fp32 evaluation
    (within 8 fp32 roundings of the exact product: 8·2^-24 relative, 8·2^-149 below the normal range)."""
    got, raw = np.asarray(got, dtype=np.float64), np.asarray(raw, dtype=np.float64)
    product = round_fp32(raw * round_fp32(factor))                   # exact in float64, then fl32
    bf16 = (got == round_bf16(product)) | (got == round_bf16(raw * round_fp32(factor)))
    if rounding == "bf16_steps":
        return bf16
    exact = raw * factor
    return bf16 | (np.abs(got - exact) <= WEIGHT_FP32_ROUNDINGS * (2.0 ** -24 * np.abs(exact) + 2.0 ** -149))


def index_weights_accepted(got, raw, model: Model, rounding: str = "bf16_steps") -> np.ndarray:
    """Where got is an accepted weight raw · c under score_rounding = `rounding` (IDX.WEIGHT.SCALE)."""
    return weights_accepted(got, raw, model.index_weight_scale, rounding)


def refactored_weights_accepted(got, raw, model: Model, rounding: str = "bf16_steps") -> np.ndarray:
    """The same for weights carrying n^-0.5 alone, 128^-0.5 applied to the scores instead."""
    return weights_accepted(got, raw, model.index_n_heads ** -0.5, rounding)


rule("IDX.WEIGHT.SCALE", "Head weights carry index_head_dim^-0.5 · index_n_heads^-0.5",
     """w[t, h] = bf16(fl32(weights_proj(x)[t, h] · fl32(128^-0.5 · n^-0.5))) with n the global
     index_n_heads: the factor is 1/64 exactly for V4.1 (n = 32) and 2^-6.5 ≈ 0.011049 for V4
     (n = 64).  No other factor enters the score.  Compared exactly: the official double rounding
     or a single rounding of the exact product, nothing else.  A target declaring
     score_rounding=fp32 or fp32_then_bf16 may keep the weight in fp32 (never rounded to BF16):
     any fp32 evaluation of the product is accepted too; and in its layer, weights carrying
     n^-0.5 alone, with 128^-0.5 applied to the scores instead (the same product in fp32,
     refactored), the layer's scores then judged as the target's weights times fl32(128^-0.5).""",
     applies_to=V4_ALL, policy="tolerance",
     sources=("V4-model L395, L418", "V41-model L513, L555", "V4-model L387 (n_heads = index_n_heads, global)",
              "V41-config (index_n_heads 32, index_head_dim 128)",
              "doc-003 §4 stage 3 L143, L155", "doc-003 §11.1 L359 (weights_proj(x) · softmax_scale · n_heads^-0.5)"),
     tolerance="""Two accepted results per element, no ulp slack: the official product rounds twice
     (fp32, then BF16), a port may round the exact product once (they differ by at most one BF16
     ulp).  A factor itself rounded to BF16 (0.0110473633 for V4 instead of fl32(2^-6.5) =
     0.0110485433) moves the product by 1.1e-4 relative and lands outside both on about 3 % of
     elements, which a one-ulp tolerance could not see.  An fp32 weight (score_rounding=fp32): within
     8 fp32 roundings of the exact product (8·2^-24 relative, 8·2^-149 absolute where it underflows),
     which holds every factorisation (the factor's roundings and each product's); a factor rounded
     to BF16 stays outside.""",
     differs="""Document 003 (§4 stage 3) puts a 1/√c^I factor on each head's dot product and a
     kv_scale after the head sum (the V3.2 arrangement); in V4 and V4.1 the whole factor
     128^-0.5·n^-0.5 is folded into the head weights, as the code quoted in its own §11.1 does, and
     nothing multiplies the summed score.""")


def index_weights_v32(raw, q_scale, model: Model) -> np.ndarray:
    """V3.2: fl32( bf16(raw · fl32(n^-0.5)) · q_scale · fl32(128^-0.5) ), the fp32 weight that
    fp8_index multiplies into each head's ReLU'd FP8 dot (q_scale: head h's FP8 scale)."""
    heads = round_bf16(round_fp32(np.asarray(raw, dtype=np.float64) * round_fp32(model.index_n_heads ** -0.5)))
    with_q = round_fp32(heads * np.asarray(q_scale, dtype=np.float64))
    return round_fp32(with_q * round_fp32(model.index_head_dim ** -0.5))


rule("IDX.WEIGHT.V32", "V3.2 head weights: BF16 weights, then the q scale and the softmax scale in fp32",
     """V3.2's head weight is w[t, h] = fl32(fl32(bf16(raw[t, h] · n^-0.5) · s_q[t, h]) · fl32(128^-0.5)):
     raw = weights_proj(x) is BF16, the factor n^-0.5 (n = 64 heads: 2^-3, exact) is applied to that
     BF16 tensor, and the product with head h's fp32 FP8 scale s_q (a power of two, from
     act_quant(q, 128)) and the softmax scale 128^-0.5 is fp32, never rounded to BF16.  The key's
     FP8 scale s_k multiplies after the head sum: I[t, s] = s_k[s] · Σ_h ReLU(q8[t, h] · k8[s]) ·
     w[t, h], in fp32.  Every factor but 128^-0.5 is a power of two, so the order changes no bit (the placement of s_k included, which
     no check can see); what a port must match is one fp32 rounding of the weight, which carries
     q's scale — not V4's BF16 weight raw · 128^-0.5 · n^-0.5 (IDX.WEIGHT.SCALE).""",
     applies_to=V32, policy="exact",
     sources=("V32-model L444 (weights_proj BF16)", "V32-model L467 (q_fp8, q_scale = act_quant(q, 128))",
              "V32-model L471-473 (weights · n^-0.5, then · q_scale · softmax_scale, then fp8_index)",
              "V32-kernel L240-247 (ReLU, · q_s, head sum, · k_s)"))

SCORE_DTYPES = ("bf16", "fp32")

knob("score_rounding", "bf16_steps",
     {"fp32": "the score kept in fp32 throughout (as V3.2, and ports that skip the BF16 tensors)",
      "fp32_then_bf16": "fp32 dot, ReLU, weighting and head sum, then one cast to BF16 "
                        "(an engine choice; document 003 §4 stage 4)"},
     """How the V4/V4.1 index score is rounded.  Canonical: each step is a BF16 tensor — the
     per-head dot accumulated in fp32 then rounded, ReLU, the weighted product rounded, the head
     sum accumulated in fp32 then rounded.""")


def _score_terms(q, k, w):
    q, k, w = (np.asarray(a, dtype=np.float64) for a in (q, k, w))
    dots = np.einsum("thd,sd->ths", q, k)                       # exact: products of BF16 values
    l1 = np.einsum("thd,sd->ths", np.abs(q), np.abs(k))
    return dots, l1, w[:, :, None]


def index_scores(q, k, w, visible, score_dtype: str = "bf16") -> np.ndarray:
    """The index score [T, S]; −inf where s ≥ visible[t].

    bf16 (V4, V4.1):  s_h = bf16(q_h·k);  r_h = ReLU(s_h);  p_h = bf16(r_h·w_h);  I = bf16(Σ_h p_h)
    fp32 (V3.2):      I = Σ_h w_h · ReLU(q_h·k), exact here, fp32 in the official kernel."""
    dots, _, w = _score_terms(q, k, w)
    if score_dtype == "bf16":
        p = round_bf16(np.maximum(round_bf16(dots), 0.0) * w)
        scores = round_bf16(p.sum(axis=1))
    elif score_dtype == "fp32":
        scores = (np.maximum(dots, 0.0) * w).sum(axis=1)
    else:
        raise ValueError(f"score_dtype must be one of {SCORE_DTYPES}, got {score_dtype!r}")
    return np.where(visibility_mask(visible, scores.shape[1]), scores, -np.inf)


def index_score_tolerance(q, k, w, score_dtype: str = "bf16") -> np.ndarray:
    """The allowed |target − reference| per score [T, S] (applies to finite references).

    bf16: F + 2 BF16 ulps of M + F, M = max(|I|, max_h |p_h|), plus H·2^-24·Σ_h |p_h| for the fp32
          head sum.  F sums, over the heads whose dot the fp32 accumulation may round either way
          (some value within D·2^-24·Σ_d |q·k| of the exact dot rounds to another BF16 value),
          |w_h| times the spread of those roundings plus one ulp of the head's product: each such
          head may flip.  Two ulps cover the roundings of the two sums (the target's possibly one
          binade up).  With no such head this is 2 ulps of M.
    fp32: (D + H)·2^-24 · Σ_h |w_h| · Σ_d |q_hd·k_d|, the recursive-summation bound, plus the
          underflow Σ_h |w_h|·min(D·2^-150, Σ_d |q_hd·k_d|) + H·2^-149: a product (or fused add)
          whose result is subnormal loses at most half the spacing 2^-150 and at most its own size
          (the accumulator beside it is representable); a sum of subnormals is exact; a head's dot
          error is then scaled by |w_h|, and the H weighted terms may underflow too."""
    if score_dtype == "bf16":
        dots, l1, w3 = _score_terms(q, k, w)
        reach = np.asarray(q).shape[-1] * 2.0 ** -24 * l1          # fp32, any order: products are exact
        spread = np.abs(round_bf16(dots + reach) - round_bf16(dots - reach))
        p = _head_terms(q, k, w)
        moved = np.abs(w3) * spread
        flips = np.where(spread > 0, moved + bf16_quantum(np.abs(p) + moved), 0.0).sum(axis=1)
        head_sum = p.shape[1] * 2.0 ** -24 * np.abs(p).sum(axis=1)
        return flips + 2.0 * bf16_quantum(index_score_magnitude(q, k, w) + flips) + head_sum
    _, l1, w3 = _score_terms(q, k, w)
    heads, dim = np.asarray(q).shape[1], np.asarray(q).shape[-1]
    underflow = (np.abs(w3) * np.minimum(dim * 2.0 ** -150, l1)).sum(axis=1) + heads * 2.0 ** -149
    return (heads + dim) * 2.0 ** -24 * weighted_l1(q, k, w) + underflow * (1 + 2.0 ** -20)


def weighted_l1(q, k, w) -> np.ndarray:
    """Σ_h |w_h| · Σ_d |q_hd·k_d| [T, S]: what an fp32 score's roundings are relative to."""
    _, l1, w = _score_terms(q, k, w)
    return (np.abs(w) * l1).sum(axis=1)


def _head_terms(q, k, w) -> np.ndarray:
    """p_h = bf16(ReLU(bf16(q_h·k))·w_h) [T, H, S]."""
    dots, _, w = _score_terms(q, k, w)
    return round_bf16(np.maximum(round_bf16(dots), 0.0) * w)


def index_score_magnitude(q, k, w) -> np.ndarray:
    """M = max(|I|, max_h |p_h|) [T, S]."""
    p = _head_terms(q, k, w)
    return np.maximum(np.abs(round_bf16(p.sum(axis=1))), np.abs(p).max(axis=1, initial=0.0))


def index_score_allreduce_tolerance(q, k, w, shards) -> np.ndarray:
    """What the BF16 all-reduce of head-sharded scores adds to the shards' own bounds [T, S].

    A shard's definition bf16(Σ_{h∈i} p_h) is within ulp(M_i)/2 ≤ ulp(M_i) of its exact sum; each of
    the n − 1 BF16 additions rounds by at most half an ulp of a running sum, and every running sum
    is below 2A with A = Σ_h |p_h| (the shards' errors are a few ulps of M_i ≤ A), so by at most
    ulp(A); the full score I is within ulp(A)/2 ≤ ulp(A) of Σ_h p_h.  Total Σ_i ulp(M_i) + n·ulp(A).
    The bound is in ulps of the shards and of Σ|p_h|, not of I: shard partials may cancel."""
    q, w = np.asarray(q, dtype=np.float64), np.asarray(w, dtype=np.float64)
    total = len(shards) * bf16_quantum(np.abs(_head_terms(q, k, w)).sum(axis=1))
    for heads in shards:
        total = total + bf16_quantum(index_score_magnitude(q[:, heads], k, w[:, heads]))
    return total


rule("IDX.SCORE.FORMULA", "Score = Σ_h w_h · ReLU(q_h · k)",
     """I[t, s] = Σ_h w[t, h] · ReLU(q[t, h]·k[s]): the ReLU applies to each head's dot product
     before the (signed) head weight multiplies it; heads are then summed.  Compared with the
     tolerance of IDX.SCORE.ROUNDING (bf16) or the fp32 summation bound (fp32).""",
     applies_to=V32 + V4_ALL, policy="tolerance",
     sources=("V4-model L420-421", "V41-model L555-557", "V32-kernel L240-247", "V32-model L471-473",
              "doc-002 Q&A 3 L19"),
     tolerance="""2^-5 · Σ_h |w_h|·|q_h·k| of the exact fp32 formula, whatever the rounding scheme:
     BF16 steps move each head term by less than 3·2^-8 of its size and the sum by 2^-8 of Σ|terms|,
     well inside 2^-5; a ReLU applied after the weight or a missing head moves a score by a whole
     term.""")

rule("IDX.SCORE.ROUNDING", "V4/V4.1 score is BF16 at every step",
     """With q, k, w BF16: s_h = bf16(Σ_d q·k accumulated in fp32); r_h = ReLU(s_h);
     p_h = bf16(r_h·w_h); I = bf16(Σ_h p_h accumulated in fp32).  A target's score must lie
     within the tolerance below of this definition: 2 BF16 ulps of M = max(|I|, max_h |p_h|),
     widened only by the heads whose fp32 dot may round to another BF16 value.  Measured on the
     CPU, the official torch expression differed from the definition in 1 of 16384 scores by one
     ulp (summation order), and once by 2 BF16 ulps of a head's partial (17.81250047: 17.75 in
     torch, 17.875 rounded exactly).  The TP all-reduce of the head-sharded partial scores is also
     BF16.""",
     applies_to=V4_ALL, policy="tolerance", knob="score_rounding",
     tolerance="""F + 2·ulp(M + F) + H·2^-24·Σ_h |p_h| (index_score_tolerance; ulp: the BF16
     spacing).  A head's dot accumulated in fp32 in any order is within D·2^-24·Σ_d |q_d·k_d| of the
     exact dot (the products of BF16 values are exact in fp32); where that interval holds values
     rounding to different BF16 numbers, the head's rounding may flip, moving p_h by |w_h| times the
     spread of those roundings plus one ulp of p_h's own rounding; F sums that over the heads that
     may flip (none in most scores).  Two ulps of M + F cover the final roundings of the target's and
     the definition's head sums (the target's possibly one binade up), and H·2^-24·Σ|p_h| the fp32
     head sum.  Measured: the official BF16 einsum expression stays within 1 ulp of M on 1500
     random cases, 300 of each score kind (tests/test_indexer.py keeps 150 of them), and a thorough
     run found it 3 ulps of M away where one head's dot lay 2·10^8 below a midpoint and its fp32
     sum above it (a permanent example; 2 ulps of M was too tight).""",
     sources=("V4-model L420-423", "V41-model L555-557",
              "V4-model L394, L411 (weights_proj BF16; wq_b output in the default BF16)",
              "doc-003 §4 stage 4 L163-165", "doc-003 §10.1 L292-294"),
     differs="""Document 003 (§4 stage 4, §10.1, quoting the paper) computes the score in fp32 and
     casts it to BF16 once before top-k.  The reference has no fp32 buffer: q, k and the weights are BF16 tensors, so the
     einsum output, the weighted product and the head sum are each rounded to BF16.  The two differ
     when signed head weights cancel: 32 heads alternating w = ±1 with dots 1+3·2^-9 and 1+2^-9
     give 0.125 in BF16 steps and 0.0625 in fp32-then-cast.  The one-cast form is an engine choice,
     declared as score_rounding=fp32_then_bf16.""")

rule("IDX.SCORE.V32_FP32", "V3.2 score is fp32 throughout",
     """V3.2's fp8_index kernel keeps the logits, the ReLU, the weighting and the head sum in
     fp32 (score_dtype='fp32'): no step rounds to BF16.  Compared within (D + H)·2^-24 ·
     Σ_h |w_h|·Σ_d |q·k| + Σ_h |w_h|·min(D·2^-150, Σ_d |q·k|) + H·2^-149 of the exact value (the
     second and third terms: underflow).  From E4M3 q and k (the FP8 score operation and its cache form) the
     dots are FP8 tensor-core products (T.gemm of the FP8 tiles), whose accumulator is not fp32's: those
     forms are judged on codes whose dots any accumulator of 11 or more fraction bits keeps exact.""",
     applies_to=V32, policy="tolerance",
     sources=("V32-kernel L231-238 (T.gemm of the FP8 k and q tiles into fp32 logits)", "V32-kernel L240-247",
              "V32-model L471-473 (fp32 weights × q_scale × softmax_scale into fp8_index)"),
     tolerance="""(D + H)·2^-24 · Σ_h |w_h|·Σ_d |q·k|: the recursive-summation bound of fp32 for the D-term
     dot and the H-term head sum in any order (each addition rounds by 2^-24 of a partial sum bounded
     by the sum of magnitudes).  Underflow adds Σ_h |w_h|·min(D·2^-150, Σ_d |q·k|) + H·2^-149: a
     product or fused add whose result is subnormal loses at most 2^-150 and at most its own size (a
     sum of subnormals is exact), each head's dot error is scaled by its |w_h|, and each of the H
     weighted terms may underflow too.  Weighting the dots' underflow by |w_h| matters: a faithful
     fp32 evaluation with dots near 2^-140 and |w_h| = 2^20 lies 76-2301 times beyond an unweighted
     (D + H)·2^-149.  The FP8 forms: an FP8 MMA on Hopper keeps about 13 fraction bits in its
     accumulator (FP8.LINEAR; DeepSeek-V3 §3.3.2), so on arbitrary codes its dots are not fp32's.
     DeepGEMM's FP8 MQA logits gave 248.9140625 for an exact 248.8213 on an H200 and, on an H100,
     1166689.5 for 1167853.2 where every product was positive: 4.08·2^-12 of Σ|q·k| over the four
     32-product steps of D = 128, beyond any bound of 2^-12 a step (2026-12-07).  The FP8 forms draw q
     rows of ±2^a and ±2^(a+1) and k rows of one binade: every product is a multiple of g = 2^(a+b−3) of at
     most 30g, every partial sum of 128 below 2^12·g, so the MMA is exact in any order and the fp32
     bound above judges the rest, in which a BF16 rounding of the score (up to 2^-9 of it) departs.""")

rule("IDX.SCORE.FP4", "FP4 scores equal the scores of the dequantized q and k",
     """index_scores_fp4 on packed E2M1 q and k with E8M0 scales per 32 is the BF16 score of the
     dequantized values (code value · 2^(byte − 127)), with the tolerance of IDX.SCORE.ROUNDING.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=("V4-model L413-416, L420-421 (q, k FP4-simulated, then the BF16 einsum)", "V41-model L546-557",
              "V4-kernel L165-172 (the in-place FP4 QDQ writes E2M1 value × scale back in BF16)"),
     tolerance="""That of IDX.SCORE.ROUNDING on the dequantized values, which are exact in BF16 (a 2-bit
     E2M1 significand times a power of two).""")

rule("IDX.SCORE.TP", "Head-sharded partial scores sum to the full score",
     """Splitting the heads over n tensor-parallel shards (each with its slice of q and w, the
     weights keeping the global factor), scoring each shard and adding the partial BF16 scores
     gives the full score within the tolerance below: the weight factor uses the global head count,
     never the local one.""",
     applies_to=V4_ALL, policy="tolerance",
     tolerance="""Σ_i (τ_i + ulp(M_i)) + n·ulp(A) (ulp: the BF16 spacing), with M_i the IDX.SCORE.ROUNDING
     magnitude of shard i and A = Σ_h |p_h|: each shard's score is within its IDX.SCORE.ROUNDING
     tolerance τ_i of its definition, which is within ulp(M_i)/2 of the exact partial sum; each of the n − 1 BF16
     additions of the all-reduce rounds by at most ulp(A) (every running sum is below 2A), and the
     full score is within ulp(A) of Σ_h p_h.  The bound is not relative to the full score, because
     shard partials can cancel: 16 head terms of 0.5 and 0.50390625 sum to 8 + 7·2^-8, which BF16
     rounds to 8, and 16 of −0.5 to −8, so the all-reduce gives 0.0 where the full score is 7·2^-8
     (a permanent example; a thorough run had found 0.0 against 0.00958).""",
     sources=("V4-model L387-388 (n_heads global, n_local_heads = n_heads // world_size)",
              "V4-model L418 (the weight factor uses the global n_heads)", "V4-model L422-423 (the all-reduce)",
              "V41-model L507-508 (the same head counts)", "V41-model L555 (the same factor)",
              "V41-model L558-559 (the all-reduce)"))


# ------------------------------------------------------------------------------------------------
# IDX: visibility and mask
# ------------------------------------------------------------------------------------------------
def index_visible(positions, ratio: int) -> np.ndarray:
    """Entries visible to the query at absolute position p: j < (p + 1) // ratio."""
    return (np.asarray(positions, dtype=np.int64) + 1) // ratio


def visibility_mask(visible, width: int) -> np.ndarray:
    return np.arange(width)[None, :] < np.asarray(visible, dtype=np.int64)[:, None]


rule("IDX.VISIBLE", "A query at position p sees compressed entries j < (p+1)//ratio",
     """The V4 and V4.1 indexers score compressed entries, not tokens (V3.2, at ratio 1, scores
     tokens).  Entry j pools the group of tokens
     [j·ratio, (j+1)·ratio) (at V4 ratio 4 also the group before it) and exists once its group is
     complete, so the query at absolute position p sees visible(p) = (p + 1) // ratio entries.
     One-chunk prefill from position 0 (query i = position i) and single-token decode
     (end_pos // ratio entries, end_pos = p + 1) give the same count.  Extension `chunked_prefill`
     (beyond the official domain, checked only for targets that declare it): a prefill chunk starting at
     any position gives the same count too.""",
     applies_to=V32 + V4_ALL, policy="exact",
     sources=("V4-model L424-426", "V41-model L563-567",
              "V4-model L427 (k = min(index_topk, end_pos // ratio) in decode)",
              "doc-003 §9.2 L276-280", "doc-003 §10.4 L329"),
     differs="""Document 003 (§9.2, §10.4) says the smallest scoring unit is a single token and
     counts the top-1024 as 1024 tokens, 1024 ÷ 64 = 16 pages of 64 tokens.  V4 scores compressed
     entries: at ratio 4 each pools 8 tokens (its own group of 4 and, through the overlap, the 4
     before), so the top-1024 entries stand for the 4096 tokens of their groups, and a 64-token
     page holds 16 entries.  The 1024 entries lie anywhere in the context: they span between 64
     and min(1024, N/64) pages (up to 1024 at N = 2^20), not 16.""")

rule("IDX.MASK", "Invisible entries score −inf, never 0",
     """Every score at s ≥ visible[t] is −inf and every score at s < visible[t] is finite.  A
     masked score of 0 would rank above every visible entry whose weighted ReLU sum is negative.""",
     applies_to=V32 + V4_ALL, policy="exact",
     sources=("V4-model L424-426 (the mask adds −inf)", "V41-model L563-567",
              "doc-003 §9.1 L262-267"),
     differs="""Document 003 (§9.1) says the scores of later positions are 'set to 0' (its own code adds
     −inf).  The reference adds −inf; with signed head weights a score can be negative, so a 0
     would let a future entry outrank visible ones.""")

rule("IDX.CHUNK", "Decode, chunked and one-chunk prefill scores agree",
     """The scores of a query depend only on its own q, w and visible count: the row of a query
     computed alone (decode: the first end_pos//ratio entries, none masked) equals that query's row
     of a one-chunk prefill, with −inf at exactly the same positions, given the same keys (which
     cache a V4.1 decode step scores: PATH.K.PUBLISHED).  Extension `chunked_prefill`
     (beyond the official domain, checked only for targets that declare it): so does its row inside any
     chunk of queries.""",
     applies_to=V4_ALL, policy="tolerance",
     tolerance="""Twice the IDX.SCORE.ROUNDING bound: both rows are a target's own scores, each within it of
     the definition.""",
     sources=("V4-model L420-432 (decode scores end_pos//ratio entries unmasked)", "V41-model L563-567",
              "V41-model L554 (decode reads end_pos // ratio index keys)"))


# ------------------------------------------------------------------------------------------------
# IDX: top-k
# ------------------------------------------------------------------------------------------------
TOPK_ORDERS = ("score", "position")

knob("topk_order", "official",
     {"score": "descending score in every version (V4's order used for V4.1 too)",
      "position": "ascending position in every version (V4.1's order used for V4 too)"},
     """Order of the returned top-k indices.  Canonical: the caller's order — V4 'score'
     (torch.topk sorted=True), V4.1 'position' (sorted ascending after topk).""")

knob("topk_ties", "any",
     {"lowest_index": "among equal scores the lowest position is taken (stable sort)"},
     """Which of several equal scores (or equal block maxima) fill the last top-k slots.
     Canonical: any of them (torch.topk differs between CPU and CUDA).""")


def topk_width(index_topk: int, end_pos: int, ratio: int) -> int:
    """Columns of the top-k result: min(index_topk, end_pos // ratio)."""
    return min(index_topk, end_pos // ratio)


def index_topk(scores, visible, k: int, order: str) -> np.ndarray:
    """The k best visible entries per row, −1 after the min(k, visible) valid ones.

    Ties are broken by the lowest index (one of the allowed choices; see IDX.TOPK.TIES)."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.full((scores.shape[0], k), -1, dtype=np.int64)
    for t, row in enumerate(scores):
        n = min(k, int(visible[t]))
        best = np.lexsort((np.arange(int(visible[t])), -row[: int(visible[t])]))[:n]
        out[t, :n] = np.sort(best) if order == "position" else best
    return out


def kv_rows(indices, offset: int) -> np.ndarray:
    """Top-k entries as rows of the concatenated [window | compressed] KV; −1 stays −1."""
    indices = np.asarray(indices)
    return np.where(indices >= 0, indices + offset, -1)


rule("IDX.TOPK.COUNT", "k = min(index_topk, end_pos//ratio); min(k, visible) valid entries",
     """The result has k = min(index_topk, end_pos // ratio) columns (0 columns when nothing is
     compressed yet: V4.1 returns an empty index tensor); row t holds min(k, visible[t]) valid
     indices, each in [0, visible[t]), distinct, and −1 in the remaining columns.""",
     applies_to=V4_ALL, policy="tie-aware",
     sources=("V4-model L427-432", "V41-model L488-580 (Indexer.forward)", "V41-model L578-580",
              "V41-model L729-730 (nothing compressed yet: an empty index tensor)"))

rule("IDX.TOPK.PAD", "−1 only as trailing padding",
     """−1 marks the slots left when visible[t] < k, and only those: it never appears before a
     valid index, in V4 as in V4.1.  Neither produces −1 in decode: there the scores span
     end_pos // ratio = compress_lens entries, all visible, and k ≤ that width, so every slot is
     valid.  −1 appears only in prefill rows with fewer than k visible entries.""",
     applies_to=V4_ALL, policy="tie-aware",
     sources=("V4-model L428-432", "V41-model L580 (where(idx < compress_lens, idx + offset, −1))",
              "V41-model L579 (sorted ascending: invalid indices, the largest, come last)"))

rule("IDX.TOPK.ORDER", "V4: descending score; V4.1: ascending position",
     """V4 returns the valid indices in descending score order (torch.topk sorted=True; equal
     scores in any order); V4.1 returns them in strictly ascending position order (topk with
     sorted=False, then sorted by index).""",
     applies_to=V4_ALL, policy="tie-aware", knob="topk_order",
     sources=("V4-model L427 (sorted=True)", "V41-model L579 (topk sorted=False, then sorted by index)"))

rule("IDX.TOPK.SELECTION", "The chosen entries are a top-k of the visible scores",
     """The multiset of reference scores at the chosen indices equals the multiset of the
     min(k, visible) largest visible reference scores.  Where the target computes the scores
     itself, an index whose reference score is within the score tolerance of the k-th score is
     also accepted.  Index lists are never compared: this comparison is the suite's own decision,
     since torch.topk leaves open which of equal scores it returns.""",
     applies_to=V4_ALL, policy="tie-aware",
     sources=("V4-model L427", "V41-model L579"))

rule("IDX.TOPK.TIES", "Ties are implementation-defined",
     """Which of several equal scores fill the last top-k slots is implementation-defined (ReLU
     zeros and colliding BF16 scores make exact ties common).  A target declaring
     topk_ties=lowest_index must take the lowest tied positions.  The official code calls
     torch.topk, which does not specify the order among equal values (CPU and CUDA pick different
     tied positions); canonical 'any' and the knob's other value are this suite's choices.""",
     applies_to=V4_ALL, policy="tie-aware", status=IMPLEMENTATION_DEFINED, knob="topk_ties",
     sources=("V4-model L427 (index_score.topk)", "V41-model L579 (index_score.topk(..., sorted=False))",
              "V41-model L607 (the block top-k of the pool)"))

rule("IDX.TOPK.OFFSET", "Indices are shifted past the window KV",
     """Valid indices are offset by the number of window KV rows placed before the compressed
     block: the sequence length in prefill and window_size = 128 in decode (V4 and V4.1); −1
     stays −1 (kv_rows).""",
     applies_to=V4_ALL, policy="exact", status=INFORMATIVE,
     sources=("V4-model L428-432, L509 (offset)", "V41-model L776 (offset = the window list's kv.size(1))", "V41-model L580"))

rule("IDX.TOPK.V32", "V3.2 top-k: min(2048, end_pos), by score, no −1",
     """V3.2 indexes tokens (ratio 1) and takes topk(min(2048, end_pos)) sorted by score; masked
     future slots are not replaced by −1 but re-masked inside attention.""",
     applies_to=V32, policy="tie-aware", status=INFORMATIVE,
     sources=("V32-model L431-480", "V32-kernel L199-274", "V32-model L476 (topk(min(index_topk, end_pos)))"))

rule("IDX.TOPK.TP", "Tensor parallelism: V3.2 checks a replicated top-k; V4/V4.1 trust identical all-reduces",
     """V3.2's indexer is not sharded: its wq_b and weights_proj are plain (replicated) linears,
     so every rank computes every index head and the whole score, with no all-reduce; each rank
     takes its top-k, broadcasts rank 0's indices and asserts that its own equal them, so the
     broadcast checks that the replicated computations agree, and a rank whose scores differ stops
     the run.  V4 and V4.1 shard the index heads (wq_b and weights_proj column-parallel) and
     neither broadcast nor compare: every rank all-reduces the head-sharded scores (IDX.SCORE.TP)
     and takes its own top-k, relying on the all-reduce giving every rank the same bits and
     torch.topk the same indices for the same input.  A tensor-parallel port must therefore give
     every rank bit-identical scores, or choose on one rank and broadcast.  Informative: one
     process sees one rank, and each rank's result is judged by the IDX.TOPK rules; a trace of
     every rank (check-trace) is judged on it: each rank's top-k lists, as sets per token, are
     rank 0's.""",
     applies_to=V32 + V4_ALL, policy="tie-aware", status=INFORMATIVE,
     sources=("V32-model L441, L444 (wq_b and weights_proj: Linear, not ColumnParallelLinear)",
              "V32-model L455-476 (all heads scored, no all_reduce)",
              "V32-model L476-479 (topk, broadcast from rank 0, assert equal)",
              "V4-model L393-394 (wq_b, weights_proj column-parallel)",
              "V4-model L422-423 (all_reduce), L427 (each rank's topk)",
              "V41-model L558-559 (all_reduce)", "V41-model L578-579 (each rank's topk)"))
