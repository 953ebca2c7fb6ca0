"""The indexer path put together (PATH.*): the index Q/K pipeline stage by stage, the order of
RoPE and quantization, what main attention reads, and the index lists attention is given.

One layer's path (V4-model L380-433, L475-509; V4.1 upstream L488-580, L680-760):

    qr       = q_norm(wq_a(x))                               BF16, [T, q_lora_rank] (the main attention's)
    q        = FP8.LINEAR(qr, wq_b, wq_b.scale)              [T, H, 128]; act_quant, E4M3 GEMM, BF16
    q_rot    = RoPE(q[..., -64:]) at the token positions     ROPE.*
    q_had    = Hadamard(q_rot)                               V4 only (HAD.*); V4.1 skips it
    q_fp4    = FP4 E2M1, E8M0 per 32, of q_had (V4) or q_rot (V4.1)
    V4.1 K   k = bf16(wk · latent); k_normed = k_norm(k); k_rot = RoPE at j·ratio; FP4 E8M0/32
    V4 K     the indexer's own compressor entry (CMP.*), RoPE at j·ratio, Hadamard, FP4 E8M0/32
    w_raw    = bf16(weights_proj · x); weights = IDX.WEIGHT.SCALE of w_raw
    scores   = IDX.SCORE.FP4 of (q_fp4, k_fp4, weights); top-k (IDX.TOPK.*); V4.1 pool (POOL.*)
    indices  = [window list | compressed list + offset]      what sparse attention gathers

wq_b enters as the checkpoint stores it: E4M3 bytes [H·128, q_lora_rank] and E8M0 bytes per b×b
block (b = 128 in V4, 32 in V4.1), and the official linear() runs the FP8 GEMM (FP8.LINEAR).  wk
and weights_proj are BF16 Linears (dtype=torch.bfloat16 in the official code), given as BF16
tensors: a BF16 matmul accumulates in fp32 in any order and rounds once (`matmul_tolerance`).
The index lists are exact integers.
"""
from __future__ import annotations

import numpy as np

from .indexer import bf16_quantum, round_bf16
from .quant import F32, fp4_e4m3_dequantize, fp4_e4m3_quantize, fp4_e8m0_dequantize, fp4_e8m0_quantize
from .formats import e2m1_decode, e2m1_encode, e4m3_decode, e4m3_encode
from .rules import INFORMATIVE, V4, V41, V4_ALL, knob, rule

V32 = ("v3.2",)
WINDOW = 128
U32 = 2.0 ** -24
SRC_V4_IDX = "V4-model L380-433 (Indexer)"
SRC_V41_IDX = "V41-model L488-580 (Indexer; K and q L541-552)"
SRC_ORDER = ("V41-model L758-760 (main KV: RoPE, then FP4 E4M3/16)", "V41-model L706-707 (window: RoPE, then FP8/32)",
             "V4-model L504-506", "V4-model L367-372", "V41-model L544-546, L550-552 (index K and q: RoPE, then FP4)")
SRC_LISTS = ("V4-model L254-265 (get_window_topk_idxs)", "V4-model L268-276 (get_compress_topk_idxs)",
             "V41-model L409-426 (get_window_topk_idxs)", "V41-model L774-778 (the window list, then the compressed one)")


# ------------------------------------------------------------------------------------------------
# the BF16 stages
# ------------------------------------------------------------------------------------------------
def matmul(x, w) -> np.ndarray:
    """bf16(x · wᵀ) of BF16 x [..., K] and w [N, K], exact before the one rounding."""
    return round_bf16(np.asarray(x, np.float64) @ np.asarray(w, np.float64).T)


def matmul_tolerance(x, w) -> np.ndarray:
    """fp32 accumulation in any order (K·2^-24·Σ|x||w|), then one BF16 ulp of the rounded value."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    acc = x.shape[-1] * U32 * (np.abs(x) @ np.abs(w).T)
    return bf16_quantum(np.abs(x @ w.T) + acc) + acc


def rms_norm(x, weight, eps: float) -> np.ndarray:
    """The official RMSNorm of BF16 x: bf16(w · x / sqrt(mean(x²) + eps)), exact before rounding."""
    x = np.asarray(x, np.float64)
    return round_bf16(_rms_exact(x, weight, eps))


def _rms_exact(x, weight, eps):
    return np.asarray(weight, np.float64) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rms_norm_tolerance(x, weight, eps: float) -> np.ndarray:
    """The distance from rms_norm of the BF16 roundings of every value within the fp32 error of the
    exact one ((D + 8)·2^-24 relative: mean of squares, rsqrt, two products): 0, or one BF16 ulp
    where that error reaches a rounding midpoint."""
    x = np.asarray(x, np.float64)
    exact = _rms_exact(x, weight, eps)
    err = np.abs(exact) * (x.shape[-1] + 8) * U32
    ref = round_bf16(exact)
    return np.maximum(np.abs(round_bf16(exact - err) - ref), np.abs(round_bf16(exact + err) - ref))


# ------------------------------------------------------------------------------------------------
# index lists
# ------------------------------------------------------------------------------------------------
def token_positions(seqlen: int, start_pos: int) -> np.ndarray:
    return start_pos + np.arange(seqlen, dtype=np.int64)


def window_index(seqlen: int, start_pos: int, window: int = WINDOW, layout: str = "ring") -> np.ndarray:
    """The window rows each query reads (decode slots listed in ascending order).

    Prefill (start_pos 0): row i holds i−127 … i clipped at 0, −1 after them, width min(s, 128);
    rows index the prefill's own KV.  Decode: one row of `window` ring slots; slots not filled yet
    (positions > start_pos) are −1; in window_layout position_order the rows 0 … W−1 of the last
    W = min(p+1, 128) positions, oldest first."""
    if start_pos and layout == "position_order":
        return np.arange(min(start_pos + 1, window))[None, :]
    if start_pos == 0:
        i = np.arange(seqlen)[:, None]
        rows = np.maximum(i - window + 1, 0) + np.arange(min(seqlen, window))[None, :]
        return np.where(rows > i, -1, rows)
    filled = min(start_pos + 1, window)
    slots = np.full(window, -1, dtype=np.int64)
    slots[:filled] = np.sort(np.arange(start_pos + 1 - filled, start_pos + 1) % window)
    return slots[None, :]


def kv_offset(seqlen: int, start_pos: int, window: int = WINDOW, layout: str = "ring") -> int:
    """Rows of window KV placed before the compressed block: the prefill's s, or the ring's 128
    (window_layout position_order: the min(p+1, 128) rows it keeps)."""
    if start_pos and layout == "position_order":
        return min(start_pos + 1, window)
    return seqlen if start_pos == 0 else window


def window_rows(ring, start_pos: int, layout: str = "ring", window: int = WINDOW):
    """Decode's window rows as attention gathers them, from the ring (new row written): the ring
    itself, or (position_order) the rows of positions p−W+1 … p in that order."""
    if layout != "position_order":
        return ring
    return ring[np.arange(start_pos + 1 - min(start_pos + 1, window), start_pos + 1) % window]


def compressed_index(seqlen: int, start_pos: int, ratio: int, window: int = WINDOW, layout: str = "ring") -> np.ndarray:
    """HCA (no indexer): every visible compressed entry, ascending, + the block's offset; −1 in
    prefill for entries not yet visible.  Decode: one row of (start_pos + 1) // ratio entries."""
    offset = kv_offset(seqlen, start_pos, window, layout)
    if start_pos > 0:
        return (np.arange((start_pos + 1) // ratio) + offset)[None, :]
    j = np.arange(seqlen // ratio)[None, :]
    visible = (np.arange(1, seqlen + 1) // ratio)[:, None]
    return np.where(j >= visible, -1, j + offset)


def attention_index(window_list, compressed_rows, seqlen: int, start_pos: int,
                    window: int = WINDOW, layout: str = "ring") -> np.ndarray:
    """What sparse attention gathers: [window list | compressed list], the compressed entries
    (indexer top-k, −1 kept) shifted by the offset of the compressed block."""
    compressed_rows = np.asarray(compressed_rows, dtype=np.int64)
    shifted = np.where(compressed_rows >= 0, compressed_rows + kv_offset(seqlen, start_pos, window, layout), -1)
    window_list = np.broadcast_to(np.asarray(window_list, dtype=np.int64), (shifted.shape[0], np.shape(window_list)[-1]))
    return np.concatenate([window_list, shifted], axis=-1)


# ------------------------------------------------------------------------------------------------
# what main attention reads; the NVFP4-style variant
# ------------------------------------------------------------------------------------------------
def kv_qdq(x) -> np.ndarray:
    """The V4.1 main KV as the in-place QDQ writes it back: E2M1 value × E4M3 scale, exact in BF16
    (at most 2 + 4 significant bits, exponents inside BF16's range)."""
    return fp4_e4m3_dequantize(*fp4_e4m3_quantize(x)).astype(np.float64)


NVFP4_GLOBAL = F32(6.0 * 448.0)


def kv_qdq_per_tensor(x) -> np.ndarray:
    """The NVFP4 recipe this suite models for the `per_tensor` variant: g = fl32(amax(x) / 2688)
    (1 when x is all zero), block scale E4M3(amax_b / 6 / g), x̂ = bf16(E2M1(x / (s_b·g)) · s_b · g)."""
    x = np.asarray(x, dtype=F32)
    g = F32(np.abs(x).max(initial=0.0)) / NVFP4_GLOBAL
    g = g if g > 0 else F32(1.0)
    xb = x.reshape(*x.shape[:-1], -1, 16)
    s = e4m3_decode(e4m3_encode(np.abs(xb).max(axis=-1) / F32(6.0) / g))
    full = (s * g)[..., None].astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(full > 0, xb / np.where(full > 0, full, F32(1.0)), F32(0.0))
    codes = e2m1_decode(e2m1_encode(np.clip(ratio, F32(-6.0), F32(6.0)).astype(F32)))
    return round_bf16((codes * full).reshape(x.shape).astype(np.float64))     # written back as BF16


knob("window_layout", "ring",
     {"position_order": "decode keeps the last W = min(p+1, 128) window rows in position order (a "
                        "sliding window, not a ring: the common choice of frameworks), the compressed "
                        "rows right after them: the same tokens attended, the offset W"},
     """Where decode's window KV rows sit among the rows attention gathers from.  Canonical: ring —
     the official 128 ring slots (position q in slot q mod 128), the compressed block after all 128
     (V4-model L509, L514).  The window list, the offset of the compressed list (PATH.WINDOW,
     PATH.CONCAT, PATH.HCA) and the layer's gathered rows (ATTN.LAYER's kv) follow the declared
     layout; the tokens attended are the same.""")


knob("kv_second_scale", "none",
     {"per_tensor": "an NVFP4-style per-tensor fp32 scale g = amax/(6·448) over the E4M3 block "
                    "scales, as quantizers built on NVFP4 keep it"},
     """Whether the V4.1 main-KV codec has a second-level (per-tensor) scale.  Canonical: none —
     the official codec keeps only the E4M3 scale per 16.""")


# ------------------------------------------------------------------------------------------------
# rules
# ------------------------------------------------------------------------------------------------
rule("PATH.Q.LATENT", "The index q reads the main attention's q latent, normed",
     """The indexer's q starts from qr = q_norm(wq_a(x)), the main attention's BF16 q latent of
     width q_lora_rank (1024 V4-Flash, 1536 V4-Pro, 1280 V4.1-Flash) after its RMSNorm; the layer
     check takes qr as an input.""",
     applies_to=V4_ALL, policy="exact", status=INFORMATIVE,
     sources=("V4-model L496 (qr = q = self.q_norm(self.wq_a(x)))", "V4-model L411", SRC_V41_IDX,
              "V4-model L58, L457-458 (q_lora_rank; wq_a, q_norm)", "doc-003 §4 stage 2 L112-126"),
     differs="""Document 003 (§4 stage 2) forms the index query from c_t^Q = h_t·W^DQ with no
     RMSNorm and quantizes it with no RoPE and no Hadamard; the official q latent is normed
     (q_norm) and the index q is rotated, and in V4 Hadamard-transformed, before FP4.""")

rule("PATH.Q.PROJ", "Index q = the FP8 linear of qr by wq_b (E4M3, block scales), one head of 128 per index head",
     """q = FP8.LINEAR(qr, wq_b) unflattened to [T, H, 128]: wq_b is a float8_e4m3fn Linear
     [index_n_heads·128, q_lora_rank] (64 heads in V4, 32 in V4.1) with E8M0 block scales, so qr is
     act_quant-ed to E4M3 with a power-of-two scale per b (128 in V4, 32 in V4.1) and the block-scaled
     GEMM writes BF16.  bf16(ŵ · qr) of the dequantized weight — a BF16 projection — is not it.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=("V4-model L393 (wq_b = ColumnParallelLinear(q_lora_rank, n_heads·head_dim): default dtype)",
              "V4-model L411-412", "V4-model L108-118", "V41-model L514 (wq_b)", "V41-model L181-207",
              SRC_V41_IDX),
     tolerance="FP8.LINEAR's (fp8_linear_error): its MMA model inside a K block, the fp32 adds across "
               "blocks, one BF16 ulp.")

rule("PATH.K.PROJ", "V4.1 index K = bf16(wk · latent) from the compressor's normed latent",
     """In V4.1 KV-source layers (2, 8, 14, 20) the index key of compressed entry j is
     bf16(wk · latent_j): wk is a BF16 Linear 512 → 128 and latent_j the compressor's output — the
     RoPE-free, RMS-normed BF16 latent, not the rotated or quantized cache entry, and not the
     pooled vector before the compressor's norm.""",
     applies_to=V41, policy="tolerance", sources=(SRC_V41_IDX, "V41-model L518 (wk: BF16 Linear head_dim → index_head_dim)",
                                               "V41-model L544 (k = k_norm(wk(latent)))", "V41-model L485 (the latent: norm(kv))"),
     tolerance="matmul_tolerance: fp32 accumulation in any order, K·2^-24·Σ|latent||w|, plus one BF16 ulp")

rule("PATH.K.NORM", "V4.1 index K is RMS-normed (k_norm, eps 1e-20) before RoPE",
     """k_normed = bf16(w · k / sqrt(mean(k²) + eps)) over the 128 dims of each entry, with the
     k_norm weight w and eps = norm_eps = 1e-20, computed in fp32 and written back BF16.""",
     applies_to=V41, policy="tolerance", sources=(SRC_V41_IDX, "V41-model L519 (k_norm: RMSNorm(index_head_dim, norm_eps))",
                                               "V41-config (norm_eps 1e-20)"),
     tolerance="""The BF16 rounding of any value within (D + 8)·2^-24 relative of the exact one (the
     fp32 mean of squares, rsqrt and products; rms_norm_tolerance): exact, or one BF16 ulp off where
     that error reaches a rounding midpoint.  A BF16 rounding of the normed value before the weight
     multiplies it lands outside on a fair share of entries.""")

knob("index_hadamard", "applied",
     {"none": "a port without the Hadamard of the V4 index q and k (V4-model L414 q = rotate_activation(q), "
              "L369 kv = rotate_activation(kv)): the FP4 stage (or, with index_qdq=none, the scores) reads "
              "the rotated index q and k themselves"},
     """Whether a V4 port applies the Hadamard to the index q and k after RoPE (V4.1 has none either way).
     Declared none, the layer's Hadamard stages are judged equal to the rotated q and k (or absent).""", declared_only=True)

knob("index_qdq", "qdq",
     {"none": "a port without the QAT simulation of the indexer: no FP4 QDQ of the index q and k (the "
              "in-place FP4 QDQ of V4-model L416 and L370, V41-model L544-546, L550-552): the scores read the "
              "BF16 q and k (after the Hadamard in V4, after RoPE in V4.1)"},
     """Whether the index q and k are FP4-quantized (E2M1 with an E8M0 scale per 32, dequantized in place)
     before the scores.  Declared none, the layer writes no FP4 payload or scales of its own q and k,
     PATH.ORDER's FP4 stages are not asked, and the scores are judged as IDX.SCORE.FP4's of the BF16 q and k
     the target wrote; a re-index layer still scores the FP4 cache it is given.""", declared_only=True)

rule("PATH.HADAMARD", "V4 rotates index q and k with the Hadamard after RoPE; V4.1 does not",
     """In V4 the FP4 stage quantizes Hadamard(q_rot) and Hadamard(k_rot) (HAD.MATRIX,
     HAD.ROUNDING); in V4.1 it quantizes q_rot and k_rot themselves.  V3.2 rotates with the
     Hadamard too, then quantizes to FP8 per 128 (PATH.V32).  A V4 port without the Hadamard declares
     index_hadamard=none (departing from V4-model L414, L369): its Hadamard stages are then the rotated
     q and k themselves.""",
     applies_to=V4_ALL, policy="tolerance", knob="index_hadamard",
     sources=("V4-model L413-416", "V4-model L367-370", SRC_V41_IDX, "V32-model L465-466"),
     tolerance="that of HAD.ROUNDING on the target's own q_rot and k_rot")

rule("PATH.ORDER", "Quantization comes after RoPE",
     """Every cache entry and index operand is rotated first and quantized second: the V4.1 main KV
     (RoPE on the last 64 dims, then FP4 E4M3/16 over all 512), the V4.1 window KV (RoPE, then FP8
     E4M3 with E8M0 per 32 over all 512), and the index q and k (RoPE [, Hadamard], then FP4 E8M0/32).
     The quantized bytes are those of the rotated BF16 values, bit for bit.  A port without the index
     FP4 QDQ (index_qdq=none, departing from V4-model L416 and L370) has no index FP4 stage to order.""",
     applies_to=V4_ALL, policy="bytes", knob="index_qdq", sources=SRC_ORDER + (SRC_V41_IDX, SRC_V4_IDX))

rule("PATH.W.PROJ", "Raw head weights = bf16(weights_proj · x)",
     """The raw head weights are bf16(weights_proj · x) with weights_proj a BF16 [index_n_heads,
     dim] Linear of the attention input x (after attn_norm); they are then scaled as
     IDX.WEIGHT.SCALE states.""",
     applies_to=V4_ALL, policy="tolerance", sources=("V4-model L394", "V4-model L418", SRC_V41_IDX, "V41-model L515, L555 (weights_proj BF16; weights_proj(x))"),
     tolerance="matmul_tolerance, as PATH.K.PROJ")

rule("PATH.QDQ", "Main attention reads x̂ = E2M1 · s, written back in BF16, exactly",
     """The reference keeps the caches in BF16 and quantizes them in place: the V4.1 main KV entry
     attention reads is x̂ = e2m1 · s (E4M3 scale per 16), the V4.1 window entry q · 2^e (FP8 E4M3,
     E8M0 per 32).  Both products are exact in BF16 (at most 6 significant bits, in range), so
     x̂ equals dequantize(quantize(x)) bit for bit; nothing multiplies 4-bit or 8-bit codes inside
     attention.""",
     applies_to=V41, policy="exact", knob="kv_second_scale",
     sources=("V41-model L758-760 (fp4_act_quant in place)", "V41-model L706-707 (act_quant in place)",
              "V41-kernel-port L106-107, L135-137 (in place: E4M3 or E2M1 value × scale, written back BF16)"))

rule("PATH.WINDOW", "Window list: prefill i−127 … i; decode the ring of 128, −1 where unfilled",
     """Prefill (start_pos 0, s tokens): row i lists the positions max(0, i−127) … i, each once, and
     −1 in the remaining min(s, 128) − (that count) columns.  Decode at start_pos p: one row of 128
     ring slots holding each slot q mod 128 for q in max(0, p−127) … p once and −1 for the
     128 − min(p+1, 128) slots not yet filled.  This rule fixes the set of entries of each row and
     is checked as such.  The order is not free for attention: V4 pads −1 at the end and V4.1 lists
     the ring oldest first, so its decode row starts with the 127 − p unfilled slots (−1) while
     p < 127.  V4's sparse attention starts its running max at −inf, so a row whose first block of
     64 indices is all −1 (the V4.1 decode row for p ≤ 63) gives NaN there (exp(−inf − (−inf))),
     where V4.1's kernel, starting at −1e30, gives the block weight 0; and under either kernel the order moves
     the BF16 rounding of the probabilities, which are rounded against the running maximum of the
     blocks seen so far.  A target's list is therefore judged with the order of its own model by the
     attention rules, not here.""",
     applies_to=V4_ALL, policy="exact",
     sources=SRC_LISTS + ("V4-model L64 (window_size 128)", "V4-kernel L318 (scores_max filled with −inf)",
                          "V4-kernel L321-343 (blocks of 64: running max, probabilities cast to BF16 before p·v)",
                          "V41-kernel L352-355 (the V4.1 running max starts at −1e30)", "V41-kernel-port L227-228 (scores_max = −1e30)"))

rule("PATH.HCA", "Compressed-only list: ascending, −1 until visible, plus the block's offset",
     """A layer with a compress ratio and no indexer (V4 HCA, ratio 128) attends to every visible
     compressed entry: prefill row i lists j + offset for j < (i+1)//ratio in ascending j and −1 for
     the other s//ratio − (i+1)//ratio columns; decode lists j + 128 for j < (p+1)//ratio.
     offset = s in prefill, 128 in decode (the window rows before the compressed block; min(p+1, 128)
     under window_layout=position_order, PATH.CONCAT).""",
     applies_to=V4, policy="exact", sources=SRC_LISTS + ("V4-model L509 (offset)", "V4-model L513 (get_compress_topk_idxs)"))

rule("PATH.CONCAT", "Attention gathers [window list | compressed list + offset]",
     """The index list attention receives is the window list followed by the compressed list (the
     indexer's top-k, or the HCA list): valid compressed indices shifted by the offset of the
     compressed block (s in prefill, 128 in decode), −1 kept as −1, of width min(s, 128) + k in
     prefill and 128 + k in decode.  The official code casts the list to int32 (V4-model L515); the
     contract takes int32 or int64 indices (PROTOCOL.md), so the values are what this rule judges.
     A target that keeps decode's window rows in position order (window_layout=position_order, declared)
     attends the same tokens: its window list is 0 … W−1 for the last W = min(p+1, 128) positions,
     oldest first, and its offset W.""",
     applies_to=V4_ALL, policy="exact", knob="window_layout",
     sources=SRC_LISTS + ("V4-model L428-432, L509", "V4-model L515 (topk_idxs.int())", SRC_V41_IDX))

rule("PATH.POOL_SCAN", "A kernel that scores only the pool selects what scoring everything selects",
     """A re-index kernel that computes scores only at pool positions (and treats the rest as −inf)
     must return a valid top-k of the scores the reference computes everywhere and then masks
     (masked_fill(~candidates, −inf)): same count, only visible pool positions, and a selection
     that is a top-k of the pool-restricted scores (tie-aware), the pinned partial newest block
     included.""",
     applies_to=V41, policy="tie-aware",
     sources=("V41-model L555-557, L575 (scores all N, then masked_fill(~candidates, −inf))",
              "V41-model L604-610 (the pool: the pinned newest block included)"))

rule("PATH.LAYER", "Every stage of a layer's indexer path, each on the stage before it",
     """A layer operation (V4 CSA, HCA and window layers; V4.1 candidate source 20 and re-index 24)
     returns its intermediates by name.  Each is judged by its own rule on the target's own output
     of the stage before (teacher forcing), so a rounding difference upstream is never blamed
     downstream, and every stage has its own verdict: the report names every stage that breaks a
     rule, each with that rule, the earliest first.  A step the port leaves out on
     purpose is declared and its stage judged as the port computes it: the index FP4 QDQ (index_qdq=none,
     departing from V4-model L416, L370: the scores of the BF16 q and k), the Hadamard (index_hadamard=none,
     V4-model L414, L369), the FP8 wq_b (fp8_linears=bf16, V4-model L116-118: a BF16 matmul).""",
     applies_to=V4_ALL, policy="tolerance",
     sources=(SRC_V4_IDX, SRC_V41_IDX, "V4-model L484-514 (Attention.forward to the index list)",
              "V41-model L739-778 (_compress_kv and forward to the index list)"),
     tolerance="each stage's own rule's tolerance")

rule("PATH.V32", "V3.2's index pipeline differs",
     """V3.2 (no compression): k = LayerNorm(wk(x)) on every token; RoPE on the FIRST 64 dims
     (interleaved in the GitHub code, half-split in the later HF code); Hadamard on q and k; then FP8
     E4M3 with one power-of-two scale per 128 stored as fp32; scores fp32.""",
     applies_to=V32, policy="exact", status=INFORMATIVE,
     sources=("V32-model L431-480 (Indexer)", "V32-model L443, L457-470 (LayerNorm k; RoPE on the first dims; "
              "Hadamard; FP8 with fp32 scales)"))



# ------------------------------------------------------------------------------------------------
# what the caches hold: the window ring, the index-K cache
# ------------------------------------------------------------------------------------------------
def window_ring(prefill: int, decoded: int, window: int = WINDOW) -> np.ndarray:
    """The position whose window KV each ring slot holds after a prefill of `prefill` tokens from
    position 0 and `decoded` one-token steps; −1 where nothing was written.  Position p sits in
    slot p mod window, and only the last `window` positions survive."""
    ring = np.full(window, -1, dtype=np.int64)
    end = prefill + decoded
    for p in range(max(0, end - window), end):
        ring[p % window] = p
    return ring


rule("PATH.WINDOW.RING", "The window KV ring: position p in slot p mod 128, the last 128 kept",
     """The window KV is a ring of 128 slots.  The prefill of s tokens (from position 0) writes
     positions max(0, s−128) … s−1, each to slot p mod 128 (s ≤ 128: slots 0 … s−1); its own
     attention reads the prefill's KV directly, not the ring.  Decode at position p writes slot
     p mod 128 and attention reads all 128 slots, through the slot list of PATH.WINDOW.  After a
     prefill and any number of decode steps, slot q holds the newest position ≡ q (mod 128), or
     nothing yet (−1).""",
     applies_to=V4_ALL, policy="exact",
     sources=("V4-model L518-523 (prefill: the last 128 tokens, split at s mod 128)",
              "V4-model L529-533 (decode: slot start_pos mod 128; attention reads the ring)",
              "V41-model L708-719 (_window_kv: the same ring)", "V4-model L254-265 (the slots listed)"))


def index_k_cache(k) -> np.ndarray:
    """V4/V4.1: what the index-K cache holds for rotated keys k [..., 128]: FP4 E2M1 × E8M0/32,
    dequantized, exact in BF16."""
    return fp4_e8m0_dequantize(*fp4_e8m0_quantize(k)).astype(np.float64)


rule("PATH.K.CACHE", "The index-K cache: BF16 QDQ values in V4/V4.1, FP8 bytes and an fp32 scale in V3.2",
     """The indexer scores against its K cache.  V4 and V4.1 keep it in BF16 and quantize in
     place: entry j holds k̂ = E2M1 · 2^e (FP4 with one E8M0 scale per 32) of the rotated key (V4:
     after the Hadamard), exact in BF16, so k̂ is dequantize(quantize(k)) bit for bit.  V4's
     indexer fills its own cache from its compressor; in V4.1 only the KV-source layers 2, 8, 14
     and 20 own an index-K cache, and index sources 24, 28, 32 and 36 score against the one layer
     20 published (LAYER.V41); which cache a V4.1 indexer scores at a given step is PATH.K.PUBLISHED's.  V3.2 keeps, per token, the E4M3 bytes of act_quant(k, 128) in a
     float8_e4m3fn cache and their power-of-two scale in an fp32 cache (the bytes: LAYOUT.V32.INDEX_K,
     which checks this clause).""",
     applies_to=V32 + V4_ALL, policy="exact",
     sources=("V4-model L399 (kv_cache of the default dtype)", "V4-model L814 (the default dtype BF16)",
              "V4-model L368-376 (Hadamard, fp4_act_quant in place, written to the cache)",
              "V4-model L420 (scores read the cache)", "V41-model L500 (owns_k: the KV sources)",
              "V41-model L517-525 (k_cache)", "V41-model L544-548 (fp4_act_quant in place, published)",
              "V41-model L554 (every index source reads the published cache)",
              "V32-model L448-449 (k_cache float8_e4m3fn, k_scale_cache fp32)", "V32-model L468-470 (k_fp8 and k_scale written per token)"))


# ------------------------------------------------------------------------------------------------
# which index-K cache a V4.1 indexer scores: the one published last
# ------------------------------------------------------------------------------------------------
def reads_published_k(model, layer: int, seqlen: int, start_pos: int) -> bool:
    """Whether a V4.1 KV-source layer scores the cache another layer published, not its own: a
    decode step (seqlen 1, start_pos > 0) at which its compressor completes no group (ratio > 1 and
    (start_pos + 1) mod ratio ≠ 0), so it publishes nothing and the last publication stands."""
    if model.candidate_source_layer < 0 or layer not in model.kv_source_layers:
        return False
    ratio = model.ratio(layer)
    return start_pos > 0 and seqlen == 1 and ratio > 1 and (start_pos + 1) % ratio != 0


def last_publisher(model) -> int:
    """The layer whose index-K cache stands published when a step starts: the last KV source of
    the backbone (V4.1-Flash: 20, ratio 1, which publishes at every step)."""
    return max(model.kv_source_layers)


def published_k_rows(model, start_pos: int) -> int:
    """Rows of the last publisher's cache written before the step at start_pos (its entries of
    positions 0 … start_pos − 1)."""
    return start_pos // model.ratio(last_publisher(model))


knob("index_k_read", "published",
     {"own": "each KV-source layer scores its own index-K cache at every step, fresh (a port that keeps "
             "one cache per layer and reads it directly)"},
     """Which index-K cache a V4.1 KV-source indexer scores at a decode step where its compressor
     completes no group.  Canonical: published — the cache published last (layer 20's), as the
     official code reads it.""")

rule("PATH.K.PUBLISHED", "A V4.1 indexer scores the index-K cache published last, not always its own",
     """A V4.1 KV-source layer publishes its index-K cache only at a step where its compressor
     completes a group, and every indexer scores the first end_pos // ratio rows of the cache
     published last, with its own ratio.  Prefill and odd decode positions: the ratio-2 sources
     2, 8 and 14 complete a group and score their own cache.  At an even decode position p they
     complete none, the cache published last is layer 20's (ratio 1, written up to position p − 1
     at the step before), and they score its rows 0 … p/2 − 1 — the index keys of tokens 0 …
     p/2 − 1, rotated at their own positions — in place of their own entries.  Their compressed
     KV, their q and head weights stay their own; their top-k, and the lists of the layers that
     reuse it, follow those scores.  The selection differs from the own cache's once more than
     index_topk = 512 entries are visible (p ≥ 1026): below, every visible entry is taken.  Layer
     20 publishes at every step and the re-index layers own no cache: both always score layer
     20's current one.  V4 indexers keep their own cache.  Tensor parallelism changes none of
     this: the index K is not sharded (wk a Linear, k_norm an RMSNorm, the compressor's wkv and
     wgate Linears: every rank computes, writes and publishes the same cache, into its own
     process's shared slot), only the index heads are (IDX.SCORE.TP); so each rank scores its own
     copy of the cache published last with its heads, and its all-reduced scores are those of
     that cache's keys.""",
     applies_to=V41, policy="tolerance", knob="index_k_read",
     sources=("V41-model L461-462 (ratio 1: a latent every step)",
              "V41-model L476-484 (decode at ratio > 1: a latent only when (start_pos + 1) % ratio == 0, else None)",
              "V41-model L537-548 (the cache written and published only when the latent is not None)",
              "V41-model L554 (index_k = the published cache's first end_pos // ratio rows)",
              "V41-model L500, L517-525 (owns_k: the KV sources keep a cache)",
              "V41-model L746-748 (the compressed KV: the layer's own at every step)",
              "V41-model L725-726, L736 (the reuse layers take the index source's top-k)",
              "V4-model L399, L420 (V4: each indexer scores its own kv_cache)",
              "V41-model L446-448, L518-519 (the compressor's wkv, wgate and the indexer's wk Linear, k_norm "
              "RMSNorm: not sharded)",
              "V41-model L508, L514-515 (the index heads sharded: n_local_heads, ColumnParallel wq_b, weights_proj)",
              "V41-model L548, L554 (shared_attn.index_k: each process's own)",
              "V41-model L558-559 (the scores all-reduced over the ranks)"),
     tolerance="IDX.SCORE.FP4's on the scored keys (W > 1: IDX.SCORE.TP's); the top-k tie-aware "
               "(IDX.TOPK.SELECTION)")
