"""Sparse attention (ATTN.*): from the index lists to the attention output.

The layer's attention (V4-model L483-534, V41-model L765-781) takes the main q [T, H, 512], the KV
rows kv = [window KV | compressed KV] (K = V, one latent head), the learned sink [H] (fp32) and the
concatenated index list [T, K] (PATH.CONCAT), and calls the kernel `sparse_attn` (V4-kernel
L277-367; V4.1 as ported, V41-kernel L296-403):

    s_j  = fl32(fl32(q · kv[i_j]) · scale),  scale = fl32(head_dim^-0.5)      (−inf where i_j = −1)
    the list is cut into blocks of 64 in list order; block t has the running max
    m_t  = max(m_{t−1}, max_{j in t} s_j),   m_0 = −inf (V4) or −1e30 (V4.1)
    p_j  = bf16(exp(s_j − m_t))              j in block t: rounded against the RUNNING max
    N    = Σ_t exp(m_t − M) Σ_{j in t} p_j · kv[i_j]       (fp32, rescaled by exp(m_{t−1} − m_t))
    L    = Σ_j exp(s_j − M) + exp(sink − M)   (the fp32 probabilities, before their rounding)
    o    = bf16(N / L),                       M = the last running max

then de-rotates the RoPE tail of o with the conjugate (apply_rotary_emb(..., inverse=True)).

Exactness.  `reference` computes the equations above in float64 with the official rounding of
every p_j (blocks of 64 in list order); that is the definition.  A conforming result is one BF16
value of the interval [bf16(o* − E), bf16(o* + E)] where E (`tolerance`) bounds every other
rounding a correct kernel makes: the fp32 dot products (zero when every partial sum is exact),
the scale product, fp32 exp and its argument, the rescales, the fp32 sums in any order, the
division, and flushed subnormals; where another blocking than the official one is admitted (the
`attn_order` knob) or the official rounding of p_j lies within that error of a BF16 midpoint, the
term of p_j widens to 2^-7 of its weight (two BF16 roundings apart).
"""
from __future__ import annotations

import math

import numpy as np

from .indexer import bf16_quantum, round_bf16
from .models import Model, profile
from .rules import INFORMATIVE, V4, V4_ALL, V41, knob, rule, shared_tolerance

BLOCK = 64                      # indices per block of the online softmax (V4-kernel L290)
PAD_HEADS = 16                  # V4's launcher pads fewer heads to 16 (V4-kernel L359-367)
V41_INIT = float(np.float32(-1e30))          # V4.1's running max starts finite (K41:352-355)
EXP_OVERFLOW = 128 * math.log(2)             # fp32 exp(x) is inf above this (≈ 88.72)
EXP_UNDETERMINED = 0.01                      # sink − M this close to the overflow: either result
U32 = 2.0 ** -23                             # per fp32 operation, generously (tensor cores included)

SOURCE_KERNEL = "V4-kernel L277-352 (sparse_attn_kernel: blocks of 64, online softmax, sink)"


def kernel(lines: str, note: str) -> str:
    return f"V4-kernel {lines} ({note})"


SOURCE_LAUNCH = "V4-kernel L355-367 (sparse_attn: heads padded to 16, then narrowed)"
SOURCE_V41_KERNEL = "V41-kernel L296-403 (sparse_attn, as ported K41:296-403)"
SOURCE_V4_CALL = "V4-model L528-534 (sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale), then inverse RoPE)"
SOURCE_V41_CALL = "V41-model L780-781 (the same call, then inverse RoPE)"
SOURCE_SCALE = "V4-model L464 (softmax_scale = head_dim ** -0.5)"
SOURCE_V41_SCALE = "V41-model L651 (softmax_scale = head_dim**-0.5)"

ATTN_ORDER = knob("attn_order", "blocks64", {
    "list_order": "blocks of another width, still in list order (another tile width)",
    "split": "chunks of the list reduced separately and merged (split-K / flash-decoding): each "
             "probability rounded against its chunk's running max",
}, """Which running max each probability is rounded against before the second product: the
official kernel's blocks of 64 in list order, or another blocking.  Checks of the other ATTN rules
admit every list-order blocking; ATTN.PROB.ORDER holds the official one.""")


ATTN_SCORES = knob("attn_scores", "fp32", {
    "bf16": "attention logits from a BF16 matmul (torch.matmul of BF16 q and KV: fp32 sums rounded to "
            "BF16), then scaled (in BF16 or fp32), where the kernel keeps the gemm's fp32 acc_s and scales it "
            "in fp32 (V4-kernel L328-330)",
}, """Whether the scores s_j stay fp32 (the official kernel) or, declared, come from a BF16 matmul: each
score then admits two BF16 roundings (2^-8 of |s| each) more.""")

ATTN_PROBS = knob("attn_probs", "unnormalized", {
    "normalized": "probabilities normalised before the BF16 cast: p_j = bf16(exp(s_j − M) / L) with L the "
                  "full denominator (the sink's term included), then o = bf16(Σ p_j · v_j), where the kernel "
                  "rounds the unnormalised exp(s_j − m_t) to BF16 and divides the fp32 sum last "
                  "(V4-kernel L340, L346-348)",
}, """Which probabilities are rounded to BF16 before the second product: the official unnormalised ones
(divided by the fp32 denominator at the end), or, declared, the normalised softmax (a framework's
softmax then a BF16 matmul): every weight then admits one BF16 rounding of itself.""")


KV_QDQ = knob("kv_qdq", "qdq", {
    "none": "a port without the QAT simulation of the main KV: the window and compressed KV read as rotated, "
            "BF16, with no FP8 QDQ (V4-model L506, L372: act_quant(kv[..., :-rd], 64, …, True); V41-model "
            "L706-707) and no V4.1 FP4 QDQ (V41-model L758-760)",
}, """Whether attention reads the main KV quantized and dequantized in place (V4 FP8/64 on the NoPE
channels, V4.1 FP8/32 window and FP4 E4M3/16 compressed) or, declared, the rotated BF16 KV itself:
the layer's kv_window and cmp are then judged equal to kv_rot and cmp_rot, every other stage on the
target's own values.""", declared_only=True)


def running_max_init(model: Model) -> float:
    """m_0: −inf in V4's kernel, −1e30 (fp32) in V4.1's."""
    if model.name in V41:
        return V41_INIT
    if model.name in V4:
        return -math.inf
    raise ValueError(f"{model.name}: its sparse attention is outside these rules; expected a V4 or V4.1 model")


def softmax_scale(model: Model) -> float:
    """head_dim^-0.5 on every layer, as the fp32 constant the kernel multiplies by; no YaRN factor."""
    return float(np.float32(model.head_dim ** -0.5))


# ------------------------------------------------------------------------------------------------
# the definition
# ------------------------------------------------------------------------------------------------
def _gathered(kv, indices) -> tuple[np.ndarray, np.ndarray]:
    """(rows [T, K, D] with −1 read as 0, valid [T, K])."""
    kv, indices = np.asarray(kv, dtype=np.float64), np.asarray(indices, dtype=np.int64)
    valid = indices != -1
    rows = kv[np.where(valid, indices, 0)]
    rows[~valid] = 0.0
    return rows, valid


def scores(q, kv, indices, scale) -> np.ndarray:
    """s [T, H, K] = scale · (q · kv[i]) in float64, −inf where i = −1."""
    return _scores(q, *_gathered(kv, indices), scale)


def _scores(q, rows, valid, scale) -> np.ndarray:
    s = np.einsum("thd,tkd->thk", np.asarray(q, dtype=np.float64), rows) * float(np.float32(scale))
    return np.where(valid[:, None, :], s, -np.inf)


def running_maxima(s, init: float) -> np.ndarray:
    """m [T, H, K]: the running max of each element's block of 64 (list order), starting at init."""
    T, H, K = s.shape
    nb = -(-K // BLOCK)
    padded = np.full((T, H, nb * BLOCK), -np.inf)
    padded[..., :K] = s
    block_max = padded.reshape(T, H, nb, BLOCK).max(-1)
    m = np.maximum.accumulate(np.concatenate([np.full((T, H, 1), init), block_max], -1), -1)[..., 1:]
    return np.repeat(m, BLOCK, -1)[..., :K]


def _exp(x) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(x)


def probabilities(s, m) -> np.ndarray:
    """p_j = bf16(exp(s_j − m_j)) against the given maxima (NaN where both are −inf)."""
    with np.errstate(invalid="ignore"):
        return round_bf16(_exp(s - m))


def _parts(q, kv, sink, indices, scale, init):
    rows, valid = _gathered(kv, indices)
    s = _scores(q, rows, valid, scale)
    m = running_maxima(s, init)
    M = m[..., -1:] if s.shape[-1] else np.full(s.shape[:2] + (1,), init)
    with np.errstate(invalid="ignore", over="ignore"):
        shift = _exp(m - M)                                   # exp(m_t − M): the rescales' product
        weight = probabilities(s, m) * shift                  # [T, H, K]
        sink_arg = np.asarray(sink, dtype=np.float64)[None, :, None] - M
        sink_term = np.where(sink_arg > EXP_OVERFLOW, np.inf, _exp(sink_arg))
        denominator = np.nansum(_exp(s - M), -1, keepdims=True) + sink_term
    nan_rows = (m[..., :1] == -np.inf) if s.shape[-1] else np.zeros_like(M, dtype=bool)   # V4: exp(−inf + inf)
    return rows, s, m, M, weight, denominator, sink_term, nan_rows


def reference(q, kv, sink, indices, scale, init: float) -> np.ndarray:
    """o* [T, H, D] before the final BF16 rounding (float64; NaN on rows V4's kernel makes NaN)."""
    rows, _, _, _, weight, denominator, _, nan_rows = _parts(q, kv, sink, indices, scale, init)
    return _output(rows, weight, denominator, nan_rows)


def _output(rows, weight, denominator, nan_rows) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        numerator = np.einsum("thk,tkd->thd", np.nan_to_num(weight, nan=0.0), rows)
        o = numerator / denominator
    return np.where(nan_rows, np.nan, o)


def sparse_attention(q, kv, sink, indices, scale, model: Model) -> np.ndarray:
    """bf16(o*): the official output, where it is determined (see `bounds`)."""
    return round_bf16(reference(q, kv, sink, indices, scale, running_max_init(model)))


# ------------------------------------------------------------------------------------------------
# the comparison policy
# ------------------------------------------------------------------------------------------------
def _lowest_bit(x) -> np.ndarray:
    """The largest power of two dividing each value (inf for 0): every value is a multiple of it."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    n = (np.abs(m) * 2.0 ** 53).astype(np.int64)
    return np.where(n != 0, np.ldexp((n & -n).astype(np.float64), e - 53), np.inf)


def _dot_error(q, kv, indices, rows) -> np.ndarray:
    """|fl32(q·k) − q·k| bound [T, H, K]: 0 when every product is a multiple of the smallest product
    quantum and the sum of magnitudes stays below 2^22 of it (all partial sums exact in fp32, with two
    bits to spare for a tensor core's alignment); else D·2^-23·Σ|q_i k_i|.  The quantum reads only
    the channels some head of the token's q reads (a product with q_i = 0 is 0, and adding it rounds
    nothing).  rows: _gathered(kv, indices)'s."""
    q, rows = np.asarray(q, dtype=np.float64), np.asarray(rows, dtype=np.float64)
    mag = np.einsum("thd,tkd->thk", np.abs(q), np.abs(rows))
    read = (q != 0).any(1)                                                   # [T, D]
    unit = _lowest_bit(q).min(-1)[..., None] * _row_quanta(kv, indices, read)[:, None, :]
    exact = (mag == 0) | (mag < 2.0 ** 22 * unit)
    return np.where(exact, 0.0, q.shape[-1] * U32 * mag)


def _row_quanta(kv, indices, read) -> np.ndarray:
    """[T, K]: the lowest bit among the channels token t reads of the entry its slot k names (inf
    at −1): taken per entry, then gathered (an entry serves many slots)."""
    bits = _lowest_bit(np.asarray(kv, dtype=np.float64))                     # [E, D]
    indices = np.asarray(indices, dtype=np.int64)
    valid = indices != -1
    safe = np.where(valid, indices, 0)
    if read.all():
        per_slot = bits.min(-1)[safe]
    else:
        per_slot = np.where(read[:, None, :], bits[safe], np.inf).min(-1)
    return np.where(valid, per_slot, np.inf)


BF16_ROUNDING = 2.0 ** -8     # |bf16(v) − v| ≤ 2^-8·|v|


def bounds(q, kv, sink, indices, scale, init: float, order: str = "blocks64", scores: str = "fp32",
           probs: str = "unnormalized"):
    """(lo, hi) [T, H, D]: the admitted BF16 outputs are those of [bf16(lo), bf16(hi)].

    order: 'blocks64' the official rounding; 'list' any blocking in list order (an element whose
    list prefix already holds the row max is rounded against that max under every blocking);
    'any' any chunking (every element below the max may be rounded against another max).
    scores 'bf16' (the knob attn_scores): each score within two BF16 roundings more (a BF16 matmul,
    then the scale); probs 'normalized' (attn_probs): every weight may be one BF16 rounding of its
    normalised value, 2^-7 of its exact weight from the official one."""
    if order not in ("blocks64", "list", "any"):
        raise ValueError(f"order must be 'blocks64', 'list' or 'any', got {order!r}")
    if scores not in ATTN_SCORES.values or probs not in ATTN_PROBS.values:
        raise ValueError(f"scores must be one of {ATTN_SCORES.values}, probs one of {ATTN_PROBS.values}")
    rows, s, m, M, weight, denominator, sink_term, nan_rows = _parts(q, kv, sink, indices, scale, init)
    o = _output(rows, weight, denominator, nan_rows)
    valid = np.isfinite(s)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = np.where(valid, float(np.float32(scale)) * _dot_error(q, kv, indices, rows) + np.abs(s) * U32, 0.0)
        if scores == "bf16":
            ds = ds + np.where(valid, np.abs(s) * 2 * BF16_ROUNDING * (1 + BF16_ROUNDING), 0.0)
        ds_max = ds.max(-1, keepdims=True) if s.shape[-1] else np.zeros_like(M)
        real = np.where(valid & (m > V41_INIT), m, np.nan)                 # maxima of real scores
        first = np.nanmin(np.where(np.isnan(real), np.inf, real), -1, keepdims=True)
        blocks = -(-s.shape[-1] // BLOCK) + 1
        rescale = blocks * 4 * U32 + np.where(np.isfinite(first), M - first, 0.0) * 2 * U32
        arg = np.where(valid, np.abs(s - m), 0.0)
        eps = 1.01 * (ds + ds_max) + 4 * U32 + arg * 2 * U32 + rescale          # per weight, relative
        if scores == "bf16":                  # exp(δ) − 1 where δ is no longer small
            eps = np.expm1(eps)
        exact_w = np.where(valid, _exp(s - M), 0.0)                             # exp(s_j − M)
        p_exact = _exp(s - m)
        undetermined = valid & (round_bf16(p_exact * (1 - eps)) != round_bf16(p_exact * (1 + eps)))
        if probs == "normalized":
            band = valid
        elif order == "blocks64":
            band = undetermined
        elif order == "list":
            prefix = np.maximum.accumulate(np.where(valid, s, -np.inf), -1)
            band = undetermined | (valid & (prefix < M))
        else:
            band = undetermined | (valid & (s < M))
        K = s.shape[-1]
        gamma = (K + blocks + 2) * U32
        per = np.nan_to_num(weight) * (eps + gamma) + np.where(band, 2.0 ** -7 * exact_w, 0.0)
        numerator_error = np.einsum("thk,tkd->thd", per, np.abs(rows)) + 2.0 ** -110 * np.einsum(
            "thk,tkd->thd", valid * 1.0, np.abs(rows))
        sink_eps = 4 * U32 + np.abs(np.asarray(sink, dtype=np.float64)[None, :, None] - M) * 2 * U32
        moved = 1.01 * np.nanmax(np.where(valid, 2 * ds_max + 4 * U32 + arg * 2 * U32, 0.0), -1, keepdims=True,
                                 initial=0.0)
        denominator_eps = (gamma + (np.expm1(moved) if scores == "bf16" else moved)
                           + np.where(np.isfinite(sink_term), sink_term * sink_eps, 0.0) / denominator)
        E = numerator_error / denominator + np.abs(o) * (2 * denominator_eps + 4 * U32) + 2.0 ** -126
        E = np.where(np.isinf(denominator) | nan_rows, 0.0, E)
        near = np.abs(np.asarray(sink, dtype=np.float64)[None, :, None] - M - EXP_OVERFLOW) < EXP_UNDETERMINED
        E = np.where(near, np.inf, E)
    return o - E, o + E


def admitted(got, lo, hi) -> np.ndarray:
    """Elements of got that are BF16 values inside [bf16(lo), bf16(hi)] (NaN where lo is NaN)."""
    got = np.asarray(got, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        inside = (got >= round_bf16(lo)) & (got <= round_bf16(hi)) & (round_bf16(got) == got)
        return np.where(np.isnan(lo), np.isnan(got), inside)


# ------------------------------------------------------------------------------------------------
# the q before attention and the output after it
# ------------------------------------------------------------------------------------------------
def q_rescale(q, model: Model) -> np.ndarray:
    """V4: each head of the main q times bf16(rsqrt(bf16(mean(bf16(q²))) + eps)), BF16 steps
    (a BF16 tensor's ops); V4.1: unchanged."""
    q = np.asarray(q, dtype=np.float64)
    if model.name in V41:
        return q
    running_max_init(model)
    mean = round_bf16(round_bf16(q * q).mean(-1, keepdims=True))
    r = round_bf16(1.0 / np.sqrt(round_bf16(mean + model.norm_eps)))
    return round_bf16(q * r)


def q_rescale_factors(q, model: Model) -> tuple[np.ndarray, np.ndarray]:
    """V4: (lo, hi) [..., 1], BF16: the factors r a conforming rescale may use for each head, every
    BF16 value from lo to hi.  r = bf16(rsqrt(bf16(bf16(mean) + eps))): the mean an fp32 sum of the
    BF16 squares in any order (relative 512·2^-23 at most), the add a round to fp32 then BF16, the
    rsqrt within 2^-8 + 2^-16 before its BF16 rounding (torch's CPU kernel for one BF16 value
    rounds the square root to BF16 before the reciprocal; a GPU's rsqrtf is within 2^-22)."""
    if model.name in V41:
        raise ValueError(f"{model.name}: V4.1 does not rescale q; expected a V4 model")
    running_max_init(model)
    q = np.asarray(q, dtype=np.float64)
    mean = round_bf16(q * q).mean(-1, keepdims=True)
    sum_error = q.shape[-1] * 2.0 ** -23
    added = [round_bf16(round_bf16(mean * (1 + sign * sum_error)) + model.norm_eps) * (1 + sign * 2.0 ** -23)
             for sign in (-1, 1)]
    rsqrt_error = 2.0 ** -8 + 2.0 ** -16
    return (round_bf16(1 / np.sqrt(added[1]) * (1 - rsqrt_error)),
            round_bf16(1 / np.sqrt(added[0]) * (1 + rsqrt_error)))


def q_rescale_admitted(got, q, model: Model) -> np.ndarray:
    """[..., 1]: whether each head of got is bf16(q · r), element by element, for one factor r of
    `q_rescale_factors` (the same r for the whole head)."""
    q, got = np.asarray(q, dtype=np.float64), np.asarray(got, dtype=np.float64)
    r, hi = q_rescale_factors(q, model)
    ok = np.zeros(r.shape, dtype=bool)
    for _ in range(16):                  # a handful of BF16 values apart at most
        ok |= (round_bf16(q * r) == got).all(-1, keepdims=True) & (r <= hi)
        if (r >= hi).all():
            return ok
        r = r + bf16_quantum(r)
    raise AssertionError("q_rescale_factors: more than 16 admitted factors; the bounds are wrong")


def derotation_freqs(freqs) -> np.ndarray:
    """The conjugate table: angles fl32(p·(−f)) = −fl32(p·f) exactly, so de-rotating is rotating by −f."""
    return -np.asarray(freqs, dtype=np.float32)


def _groups(o, wo_a) -> tuple[np.ndarray, np.ndarray]:
    """o [T, H, D] as [T, g, H·D/g] and wo_a [g·r, H·D/g] as [g, r, H·D/g] (g from the widths)."""
    o, wo_a = np.asarray(o, np.float64), np.asarray(wo_a, np.float64)
    g = o[0].size // wo_a.shape[1]
    return o.reshape(o.shape[0], g, -1), wo_a.reshape(g, -1, wo_a.shape[1])


def grouped_matmul(o, wo_a, fn) -> np.ndarray:
    """[T, g, r]: fn(o of group i, its r rows of wo_a) for each group (fn: path.matmul, or its tolerance)."""
    x, w = _groups(o, wo_a)
    return np.stack([fn(x[:, i], w[i]) for i in range(w.shape[0])], 1)


def model_of(name: str) -> Model:
    m = profile(name)
    running_max_init(m)
    return m


# ------------------------------------------------------------------------------------------------
# rules
# ------------------------------------------------------------------------------------------------
_TOL = shared_tolerance("attention output", """
the interval [bf16(o* − E), bf16(o* + E)] around the official float64 value o*: E sums,
over the listed rows, each weight times |v| times (the fp32 score error, 0 when the dot's partial
sums are exact with two bits to spare and else D·2^-23·Σ|q·k|, plus 2^-23·|s| for the scale product; fp32 exp within
4·2^-23 plus 2·2^-23 of its argument; the rescales' 4·2^-23 per block plus 2·2^-23·(M − m_1);
(K + blocks + 2)·2^-23 for fp32 sums in any order; 2^-110 of |v| for probabilities flushed to 0),
the denominator's own error times |o*|, the division (4·2^-23, an approximate GPU division
included), and 2^-126 for a flushed subnormal output.  A probability whose official BF16 rounding is within
that error of a midpoint, or whose running max differs under another list-order blocking (its list
prefix does not yet hold the row max), may be one BF16 rounding away: 2^-7 of its exact weight.
Why this admits every block and accumulation order yet fails the mistakes: on the checks' inputs
the dot products are exact and the row max comes first, so every list-order blocking rounds every
probability against the same max and E is ~K·2^-23 of the output, while fp32 probabilities move
each weight by up to 2^-8 (one-sided on the probes), a missing sink or a sink in the numerator by
its weight exp(sink − M)/L (the probes give it ≥ 1/8), and a wrong scale every exponent.""")

rule("ATTN.GATHER", "The list names KV rows; −1 contributes nothing",
     """Entry j of a query's list selects row kv[i_j] of [window KV | compressed KV] for both the
     score and the value; an entry −1 (anywhere in the list) has score −inf and its row is read as
     0, so it adds nothing to the numerator or the denominator.  Any other index is a valid row.""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL,
     sources=(SOURCE_KERNEL, kernel("L322-327", "−1 reads 0, scores −inf"), SOURCE_V41_KERNEL, SOURCE_V4_CALL,
              SOURCE_V41_CALL))

rule("ATTN.SCORE", "Scores are fp32 dot products of BF16 q and KV, times the scale passed in",
     """s_j = fl32(fl32(q · kv[i_j]) · scale) with q and kv BF16 (tensor-core products, fp32
     accumulation), scale the fp32 value of the `scale` argument; the scores are never rounded to
     BF16.  A port whose logits come from a BF16 matmul declares attn_scores=bf16 (departing from
     V4-kernel L328-330): each score is then admitted within two BF16 roundings.""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL, knob="attn_scores",
     sources=(kernel("L328-330", "gemm into fp32 acc_s, then *= scale"), "V41-kernel L365-368 (as ported)"))

rule("ATTN.SCALE", "softmax_scale = head_dim^-0.5 = 512^-0.5, no YaRN factor",
     """Every attention layer passes softmax_scale = head_dim^-0.5 (512^-0.5 ≈ 0.0442) to the
     kernel, V4 and V4.1 alike, with or without compression: no YaRN attention factor (DeepSeek-V3's
     mscale = 0.1·ln(factor) + 1, squared into its scale) enters, although the compressed layers'
     RoPE uses YaRN.""",
     applies_to=V4_ALL, policy="tolerance", tolerance="2^-23 relative: the fp32 constant",
     sources=(SOURCE_SCALE, SOURCE_V41_SCALE, "V4-model L199-229 (YaRN changes the frequencies only)"))

rule("ATTN.INIT", "The running max starts at −inf (V4) or −1e30 (V4.1)",
     """V4.1's kernel starts the running max at −1e30: a first block of 64 entries all −1 adds
     exp(−inf + 1e30) = 0 and leaves no trace, and a row with no valid entry gives 0 (the sink term
     exp(sink + 1e30) = inf in the denominator).  V4's kernel starts at −inf: such a block would make
     the row NaN (exp(−inf + inf)), but V4's lists always begin with a valid window entry
     (get_window_topk_idxs), so V4 is checked only on lists whose first entry is valid.  V4.1's
     decode lists do begin with −1 while the window ring fills (the ring listed oldest first).""",
     applies_to=V4_ALL, policy="tolerance", tolerance="that of ATTN.GATHER; exact 0 for rows without a valid entry",
     sources=("V4-kernel L318 (T.fill(scores_max, -T.infinity))", "V41-kernel L352-355 (−1e30, as ported)",
              "V4-model L255-265 (the window list starts valid)", "V41-model L409-426 (ring oldest first; −1 while filling)"))

rule("ATTN.PROB.BF16", "Probabilities are rounded to BF16 for the second product, not for the sum",
     """The probabilities exp(s_j − m_t) enter the denominator in fp32 and are rounded to BF16
     (RNE) before the product with the KV rows (tensor-core P·V, fp32 accumulation); neither the
     fp32 probabilities nor a sum of the rounded ones is the official result.  A port that normalises
     the probabilities before the BF16 cast (softmax, then a BF16 P·V) declares attn_probs=normalized
     (departing from V4-kernel L340 and L346-348): each weight is then admitted within one BF16 rounding
     of its normalised value.""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL, knob="attn_probs",
     sources=(kernel("L336-343", "reduce_sum of the fp32 acc_s, then T.copy to the BF16 acc_s_cast"),
              "V41-kernel L377 (as ported)"))

rule("ATTN.PROB.ORDER", "Each probability is rounded against the running max of its block of 64, in list order",
     """Block t holds list entries 64t .. 64t + 63; p_j = bf16(exp(s_j − m_t)) with m_t the running
     max after block t (not the final max M), and the rounded value is later rescaled by
     exp(m_t − M) in fp32.  The exact result therefore depends on the list order and the block
     width: a list whose max comes in a later block rounds its early probabilities differently
     from one rounded against M.""",
     applies_to=V4_ALL, policy="tolerance", knob="attn_order",
     tolerance="that of ATTN.GATHER with no widening for another blocking (only for undetermined roundings)",
     sources=(kernel("L290, L321-343", "blocks of 64 in list order, the running max"), "V41-kernel L328, L377 (as ported)"))

rule("ATTN.RESCALE", "fp32 accumulators rescaled by exp(m_{t−1} − m_t) when the max grows",
     """The sum of probabilities and the output accumulator are fp32, and both are multiplied by
     exp(m_{t−1} − m_t) before block t is added; the final max M is the last running max.""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL,
     sources=(kernel("L331-343", "scores_scale = exp(prev − new) on sum_exp and acc_o"),))

rule("ATTN.SINK", "The sink adds exp(sink − M) to the denominator only",
     """After the last block the per-head sink (fp32, not scaled by softmax_scale) adds
     exp(sink_h − M) to the denominator; it has no value row and adds nothing to the numerator.  A
     sink far below every score changes nothing; one far above drives the output to 0 (exp
     overflows to inf in fp32 for sink − M > 88.72, giving exactly 0).""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL,
     sources=(kernel("L345-346", "sum_exp += exp(attn_sink − scores_max)"), "V41-kernel L382-383 (as ported)"))

rule("ATTN.HEADS", "Heads are independent; V4 pads fewer than 16 to 16",
     """V4's launcher pads q with zero heads and the sink with zeros up to 16 heads and drops them
     after; every reduction of the kernel is per head, so the padding is not observable: a head's
     output depends only on its own q, its sink, the KV and the list.  Stated for completeness;
     the checks run 1 to 20 heads.""",
     applies_to=V4_ALL, policy="tolerance", status=INFORMATIVE, sources=(SOURCE_LAUNCH,))

rule("ATTN.OUTPUT", "The output is the numerator divided by the denominator, written BF16",
     """o = N / L in fp32 (a division, per element), rounded once to BF16: the output tensor holds
     BF16 values.""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL,
     sources=(kernel("L347-350", "acc_o /= sum_exp, copied to the BF16 output"), SOURCE_V41_KERNEL))

knob("attention_form", "sparse_list", {
    "dense_mask": "attention through a mask over the gathered rows [window rows | compressed rows], as many frameworks "
                  "do: each row attended at most once, so a repeated list entry cannot be expressed"},
    """How a target attends the rows its lists name: the official kernel walks the list entry by entry
(a row listed twice is attended twice); a dense mask over the gathered rows marks each row once.
The official lists never repeat a row (PATH.CONCAT), so the two agree on every official call; a
dense-mask target's ATTN.DUPLICATES is judged in the layer, on the tokens held in both caches.
Undeclared, a port whose answer to a repeated entry is the mask's (each listed row once) FAILs
ATTN.DUPLICATES, named "matches attention_form=dense_mask".""")


rule("ATTN.DUPLICATES", "No de-duplication: each entry is attended, an index listed twice twice, a token in both caches twice",
     """The kernel handles each list entry independently: a row named by two entries contributes
     two scores to the denominator and twice its value to the numerator.  The official lists never
     name a row twice (the window indices lie below the offset and the compressed ones at or above
     it, PATH.CONCAT, and the indexer's lists have no duplicates); a port's list may.  One token is
     nevertheless attended twice, once per cache: in V4.1's ratio-1 layers compressed entry j is
     token j, and with at most 512 entries every entry is listed, so each of the last 128 tokens
     is attended as its FP8 window row and again as its FP4 compressed row; V4's compressed entries,
     each pooling the ratio tokens of its group, overlap the window rows of those tokens the same way.
     These are distinct rows with distinct values, and a port that drops one of them (de-duplicating
     window and compressed rows of the same token) departs from the official output.  A target that
     attends through a dense mask (attention_form=dense_mask, declared) cannot express a repeated
     entry: its attention kernel is not asked for one, and the rule is judged in its layer (the
     attention output of V4.1's ratio-1 prefill, where each recent token is in both caches).""",
     applies_to=V4_ALL, policy="tolerance", tolerance=_TOL, knob="attention_form",
     sources=(kernel("L322-327", "each entry on its own"), "V41-model L409-426 (order within a row does not matter)",
              "V4-model L509, L514 (offset, then [window | compressed] concatenated)",
              "V41-model L462 (ratio 1: one token per entry, no pooling)",
              "V41-model L752-754 (entry j stands at position j·ratio)"))

rule("ATTN.V32", "V3.2 attends through a dense softmax over its index mask (not checked)",
     """V3.2 has no sparse kernel: it scores every cached token in fp32 (prefill: q·k of the full
     heads, the key's NoPE part up-projected from the latent; decode: the absorbed form, q's NoPE
     part times the up-projection against the latent cache plus its RoPE part against the RoPE cache), times softmax_scale; adds an index mask, −inf
     everywhere but 0 at the indexer's top-k positions (a scatter: a position listed twice is
     attended once), plus the causal mask in prefill; takes an fp32 softmax, casts the
     probabilities to BF16 and sums the values (decode: the latent cache, then the up-projection's
     value rows).  No sink, no running max, no BF16 logits.  Out of scope: the attention rules judge the
     V4/V4.1 sparse attention operation (index lists, a sink, BF16 probabilities against a running
     max), which V3.2 never calls; its dense form is torch's fp32 softmax and einsum over a mask
     made from the top-k list, so what this suite checks of V3.2 ends at that list (IDX.TOPK.V32,
     PATH.V32) and the cache entries an engine writes (LAYOUT.V32.MLA, LAYOUT.V32.INDEX_K).""",
     applies_to=("v3.2",), policy="structural", status=INFORMATIVE,
     sources=("V32-model L563-578 (prefill: fp32 scores, index mask plus the causal mask, fp32 softmax, "
              "probabilities cast to the activations' BF16, einsum with v)",
              "V32-model L579-595 (decode: the absorbed form against kv_cache and pe_cache, the same mask "
              "and softmax)", "V32-model L906 (the default dtype is BF16)"))

rule("ATTN.DEROTATE", "The output's RoPE tail is de-rotated with the conjugate at the query's position",
     """After sparse attention the last 64 channels of each head of o are rotated by e^(−i·p·f_i)
     (apply_rotary_emb(o[..., -64:], freqs_cis, inverse=True): the conjugate table), p the
     query's position and f the layer's table; channels 0-447 pass unchanged.  This is the check
     of ROPE.INVERSE.""",
     applies_to=V4_ALL, policy="tolerance", tolerance="that of ROPE.ROUNDING, with the conjugate angle",
     sources=("V4-model L534", "V41-model L781", "V4-model L232-244 (inverse: freqs_cis.conj())"))

rule("ATTN.Q_NORM", "V4 rescales each head of the main q to unit RMS, in BF16 steps; V4.1 does not",
     """V4 multiplies each head of q = wq_b(qr) (BF16) by r = rsqrt(mean(q²) + norm_eps) before
     RoPE, in BF16 tensor ops: the square, the mean (an fp32 sum, rounded once), the add and the
     rsqrt each rounded to BF16, so r is a BF16 value, and the product q·r of two BF16 values is
     rounded once to BF16.  A rescale computed in fp32 and rounded once at the end (r never rounded)
     is not the official result.  V4.1's Attention.forward has no such step (q goes from wq_b
     straight to RoPE).""",
     applies_to=V4_ALL, policy="tolerance",
     tolerance="""V4: got = bf16(q·r) element by element, with one factor r per head, r any BF16
     value from bf16(ρ_lo) to bf16(ρ_hi): ρ = rsqrt(bf16(bf16(m) + eps)), m the mean of the BF16
     squares within 512·2^-23 (its fp32 sum in any order), the add within 2^-23 before its BF16
     rounding, and the rsqrt within 2^-8 + 2^-16 before its own (torch's CPU kernel rounds the
     square root of a lone BF16 value to BF16 before taking the reciprocal; a GPU's rsqrtf is within
     2^-22); the product itself has no tolerance.  V4.1: the exact identity.""",
     sources=("V4-model L497-498 (q from wq_b in BF16; q *= rsqrt(q.square().mean(-1) + eps), BF16 tensors)",
              "V41-model L770-772 (q from wq_b, then RoPE)"))

rule("ATTN.LAYER", "Every stage of a layer's attention, each on the stage before it",
     """A layer operation returns index_layer's stages (PATH.LAYER; a V4.1 layer that reuses its
     index source's lists instead returns window_idx and indices, the window list and the source's
     top-k source_topk shifted by the window rows, PATH.CONCAT) and then, by name: from the
     attention input x, the q latent wq_a(x) (q_latent), its RMSNorm (q_norm), the main q
     wq_b(q_norm) (q_attn), the window KV projection wkv(x) (kv_proj) and its RMSNorm (kv_normed),
     where wq_a, wq_b and wkv are FP8 linears (E4M3 weights: act_quant of their input, then the
     block-scaled FP8 GEMM, FP8.LINEAR) and the RMSNorms are computed in fp32 and written BF16
     (eps = norm_eps); the main q after V4's rescale (q_rescale), rotated (q_attn_rot); the new tokens' window KV rotated (kv_rot)
     and as attention reads it (kv_window); on a layer that writes its compressed KV in prefill,
     the entries rotated at j·ratio (cmp_rot) and read (cmp); the rows attention gathers from, [window
     rows | compressed rows] with decode's new row in ring slot start_pos mod 128 (kv; under window_layout=position_order
     the last min(p+1, 128) window rows in position order, PATH.CONCAT); the sparse
     attention output (o) and its de-rotation (o_derot); then, from x, the output projections: o_derot
     cut into o_groups runs of heads, each times its o_lora_rank rows of the BF16 wo_a (an einsum: fp32
     sums in any order, one BF16 rounding; o_lora [T, groups, o_lora_rank], judged here by
     matmul_tolerance per group), and wo_b of o_lora flattened, an FP8 linear as wq_a (out [T, dim],
     FP8.LINEAR).  Each is judged by its own rule on the
     target's own output of the stage before (teacher forcing), so every stage has its own verdict:
     the report names every stage that breaks a rule, the earliest first, and the stages a target's
     declared contract version withheld as not judged.  The checks run 16 of the layer's heads (ATTN.HEADS: heads are
     independent), in 2 groups of 8 heads with o_lora_rank 64; cases of more than 32 tokens start from the normed q and KV, given.
     Steps a port leaves out on purpose are declared, and their stages judged as the port computes them:
     without the KV's QDQ (kv_qdq=none, departing from V4-model L506, L372), kv_window = kv_rot and cmp =
     cmp_rot; with BF16 linears (fp8_linears=bf16, departing from V4-model L116-118), q_latent, q_attn,
     kv_proj and out are BF16 matmuls of the dequantized weights (matmul_tolerance).""",
     applies_to=V4_ALL, policy="tolerance", knob="kv_qdq", tolerance="each stage's own rule's tolerance; the RMSNorms (D + 8)·2^-24 relative before the BF16 rounding, as PATH.K.NORM; "
               "o_lora matmul_tolerance per group",
     sources=("V4-model L483-534 (Attention.forward)",
              "V4-model L457-463, L777 (wq_a, wq_b, wkv of the default dtype float8_e4m3fn; wo_a BF16)",
              "V4-model L496-497, L502-503 (q = wq_b(q_norm(wq_a(x))); kv = kv_norm(wkv(x)))",
              "V41-model L640-650, L705 (the same FP8 linears, act_quant per 32; kv_norm(wkv(x)))", "V41-model L700-781 (_window_kv, _compress_kv, forward)",
              "V41-model L725-726, L763 (a layer that is not a source reads the published top-k and compressed KV)",
              "V4-model L372, L506 (FP8/64 on the NoPE channels)", "V41-model L707, L760 (FP8/32; FP4 E4M3/16)",
              "V4-model L62-63, L462-463, L537-542 (o_groups, o_lora_rank; wo_a BF16, wo_b of the default dtype; "
              "o in groups times wo_a by einsum, then wo_b)",
              "V41-model L645-650, L785-788 (the same wo_a, wo_b and grouped einsum; wo_b an FP8 linear per 32)"))


def row_parallel_bounds(partials) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of the fp32 all-reduce of the ranks' BF16 partials y_r (ATTN.TP.REDUCE): the exact sum
    (float64 holds a sum of a few BF16 values exactly) ± (W − 1)·2^-24·Σ|y_r|, one fp32 rounding per
    addition in any order; the output is a BF16 value inside [bf16(lo), bf16(hi)] (admitted)."""
    y = np.asarray(partials, np.float64)
    err = (y.shape[0] - 1) * 2.0 ** -24 * np.abs(y).sum(0)
    return y.sum(0) - err, y.sum(0) + err


rule("ATTN.TP.REDUCE", "Tensor parallelism: wo_b's partials all-reduced in fp32, then one BF16 rounding",
     """At tensor-parallel world size W > 1 the output projection wo_b is a RowParallelLinear: rank r
     holds its o_groups·o_lora_rank / W input features (its heads' o_lora) and the matching columns of
     wo_b, computes its partial y_r, the FP8 linear (FP8.LINEAR) of its slice of o_lora and of wo_b,
     written BF16, and the ranks' partials are cast to fp32, summed by the all-reduce and cast back to BF16 once:
     out = bf16(Σ_r fp32(y_r)), the same on every rank.  A sum in BF16 (rounded after each rank) or
     a partial kept in fp32 is not the official result.  At W = 1 there is no all-reduce: out is
     wo_b's FP8 linear itself (FP8.LINEAR).  The heads split across ranks change no other stage: each
     rank's stages are those of its own heads, judged by their own rules.""",
     applies_to=V4_ALL, policy="tolerance",
     tolerance="the exact sum ± (W − 1)·2^-24·Σ_r|y_r| (the collective's fp32 additions in any order), "
               "then any BF16 value between the BF16 roundings of the two ends",
     sources=("V4-model L166-180 (RowParallelLinear: linear() in BF16, y.float(), dist.all_reduce, type_as(x))",
              "V41-model L271-278 (the same RowParallelLinear.forward)",
              "V4-model L463 (wo_b = RowParallelLinear(n_groups·o_lora_rank, dim))"))
