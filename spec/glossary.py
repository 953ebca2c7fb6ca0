"""The glossary of SPEC.md: every term a statement uses, defined once.

`undefined` finds the terms of a text that the glossary lacks: every backticked word, every
code-style identifier (a name with an underscore, or a name called as a function) and every word of
TERMS, after removing what
SPEC.md defines elsewhere (rule ids, variant knobs and their values, file paths) and subscripted
math variables (p_h, w_h, ramp_i).  tests/test_registry.py applies it to every statement.
"""
from __future__ import annotations

import re

GLOSSARY: dict[str, str] = {
    # --- number formats and roundings
    "fp32": "IEEE 754 binary32: 1 sign, 8 exponent and 23 mantissa bits.",
    "fl32": "fl32(v): v rounded to the nearest fp32, ties to even, as one IEEE fp32 operation rounds "
            "(fl32(1/6) is the fp32 nearest to 1/6, slightly above it).",
    "BF16": "bfloat16: the upper 16 bits of an fp32 (8 exponent, 7 mantissa bits).",
    "bf16": "bf16(x): x rounded to the nearest BF16 value, ties to even (FMT.BF16.RNE).",
    "FP4": "the E2M1 format of 4-bit payloads; 'FP4 E8M0/32' is E2M1 values with one E8M0 scale per "
           "block of 32, 'FP4 E4M3/16' with one E4M3 scale per 16.",
    "FP8": "the E4M3 format of 8-bit payloads, as act_quant writes them.",
    "E2M1": "4-bit float (1 sign, 2 exponent, 1 mantissa bit): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; "
            "no Inf or NaN (FMT.E2M1.VALUES).",
    "E4M3": "8-bit float float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits): largest "
            "finite 448, subnormals m·2^-9, NaN 0x7F/0xFF, no Inf (FMT.E4M3.VALUES).",
    "E8M0": "8-bit unsigned power of two float8_e8m0fnu: byte b is 2^(b − 127), 0xFF is NaN "
            "(FMT.E8M0.VALUES).",
    "RNE": "round to nearest, ties to even: the representable value nearest to x; at an exact midpoint, "
           "the one whose last significand bit (or code) is even.",
    "E4M3_RNE": "E4M3_RNE(v): the E4M3 value nearest to the fp32 v, ties to even, saturating at ±448 "
                "(FMT.E4M3.RNE, FMT.E4M3.SATFINITE).",
    "satfinite": "a saturating conversion: a magnitude above the largest finite value becomes that value "
                 "(±448 in E4M3, ±6 in E2M1), never Inf or NaN.",
    "ulp": "unit in the last place: the spacing of a format's values at a magnitude; ulp(v) in BF16 is "
           "2^(e − 7) for |v| in [2^e, 2^(e+1)).",
    "BF16 ulp": "the ulp of BF16 at a value: 2^(e − 7) for |v| in [2^e, 2^(e+1)).",
    "ulp_bf16": "ulp_bf16(v): the BF16 ulp at v.",
    "FP4_TABLE": "the 16 values of the E2M1 codes, in code order (FMT.E2M1.VALUES).",
    "float4_e2m1fn_x2": "the torch dtype of two E2M1 codes packed in a byte.",
    "float8_e4m3fn": "the torch dtype of E4M3.",
    "float8_e8m0fnu": "the torch dtype of E8M0.",
    "ceil_log2": "ceil_log2(v): ⌈log2 v⌉ of a positive fp32 v, computed from its bits (FMT.CEIL_LOG2).",
    "max_elem": "the largest magnitude of a payload format: 6 for E2M1, 448 for E4M3.",
    "emax_elem": "the OCP MX name for the exponent of max_elem's binade: 2 for E2M1, 8 for E4M3.",
    "popcount": "popcount(n): the number of set bits of the integer n.",
    "clamp": "clamp(x, a, b) = min(max(x, a), b).",
    "rms": "rms(v) = sqrt(mean(v²)) over the last dimension.",
    # --- quantization
    "amax": "the largest magnitude max|x| of a block, in fp32.",
    "block": "the consecutive elements of the last dimension that share one scale (16, 32, 64 or 128); "
             "in the V4.1 pool, 8 consecutive compressed positions.",
    "scale": "the per-block factor s: an element is stored as the code of x/s and read back as the "
             "code's value times s.",
    "QDQ": "quantize-dequantize: x replaced, in place, by the dequantization of its quantization, kept "
           "as BF16 (the reference keeps its caches this way).",
    "quantize": "quantize(x): the codes and scales a codec gives x.",
    "dequantize": "dequantize(codes, scales): each code's value times its block's scale.",
    "act_quant": "the official FP8 quantizer: E4M3 values with one scale per block, the scale rounded "
                 "up to a power of two when scale_fmt is 'ue8m0' (FP8.*).",
    "scale_fmt": "act_quant's argument: 'ue8m0' rounds each scale up to a power of two.",
    "in_dtype": "an official kernel's input dtype parameter.",
    "out_dtype": "an official kernel's output (storage) dtype parameter.",
    "kv_scale": "document 003's name for the index K's dequantization factor.",
    "fp8_index": "V3.2's TileLang indexer-score kernel (fp32 throughout).",
    "softmax_scale": "the main attention's score factor, head_dim^-0.5 (no YaRN factor in V4 or V4.1).",
    "get_window_topk_idxs": "the official function building each token's window list (ring slots in decode, −1 where unfilled).",
    "rsqrt": "rsqrt(v) = 1 / sqrt(v).",
    "index_layer": "the suite's layer operation of the index path: every stage of one layer's indexer by name (PATH.LAYER).",
    "q_attn_rot": "ATTN.LAYER's stage: the main q after RoPE.",
    "q_latent": "ATTN.LAYER's stage: wq_a(x), the q latent before its RMSNorm q_norm.",
    "q_attn": "ATTN.LAYER's stage: the main q heads, wq_b(q_norm), before V4's rescale.",
    "kv_proj": "ATTN.LAYER's stage: wkv(x), the window KV before its RMSNorm.",
    "kv_normed": "ATTN.LAYER's stage: kv_norm(wkv(x)), the window KV before RoPE.",
    "wkv": "the main attention's KV projection from x to one 512-wide latent head (an FP8 linear).",
    "kv_rot": "ATTN.LAYER's stage: the new tokens' window KV after RoPE.",
    "kv_window": "ATTN.LAYER's stage: the window KV as attention reads it (after the in-place QDQ).",
    "cmp_rot": "ATTN.LAYER's stage: the compressed entries rotated at j·ratio.",
    "o_derot": "ATTN.LAYER's stage: the attention output with its RoPE tail de-rotated (ATTN.DEROTATE).",
    "o_lora": "ATTN.LAYER's stage: o_derot in o_groups runs of heads, each times its rows of the BF16 wo_a.",
    "o_groups": "the head groups of the output projection wo_a: 8 (V4-Flash, V4.1), 16 (V4-Pro).",
    "o_lora_rank": "wo_a's output width per head group, 1024; wo_b reads o_groups·o_lora_rank.",
    "wo_a": "the main attention's grouped output projection, BF16 [o_groups·o_lora_rank, n_heads·head_dim/o_groups].",
    "wo_b": "the main attention's last projection, from o_lora to dim (an FP8 linear).",
    "window_idx": "PATH.LAYER's stage: each token's window list (PATH.WINDOW).",
    "source_topk": "ATTN.LAYER's input on a V4.1 reuse layer: the top-k its index source took (entries, −1 at the tail).",
    "fp8_block_size": "V4.1's FP8 block, 32: act_quant's block and the side of the weight's square scale blocks (V4: block_size, 128).",
    "fp8_gemm": "the official TileLang GEMM of E4M3 operands with block scales: per K block an fp32 dot times both scales, summed in fp32, written BF16.",
    "fp8_linear_error": "FP8.LINEAR's tolerance per output element (stated in full under FP8.LINEAR).",
    # --- positions, layers, roles
    "ratio": "a layer's compress ratio m: the tokens pooled into one compressed entry (0: window only; "
             "V4 4 and 128; V4.1 2 and 1; V3.2's indexer scores tokens, ratio 1).",
    "window": "the sliding window: the uncompressed KV of the last window_size tokens, which every layer "
              "attends to.",
    "window_size": "the sliding-window length, 128 (a config key).",
    "compressed entry": "one KV (or index-K) vector pooled from a group of ratio tokens (CMP.*); entry j "
                        "pools tokens j·ratio … j·ratio + ratio − 1 (V4 ratio 4: also the group before).",
    "entry": "a compressed entry, or one cached vector as bytes (LAYOUT.*).",
    "latent": "the compressor's output for one group: the normed pooled vector (V4.1: before RoPE).",
    "visible": "visible(p) = (p + 1) // ratio: the compressed entries the query at position p sees "
               "(IDX.VISIBLE).",
    "compress_lens": "the official V4.1 name for the visible count: (p + 1) // ratio per query in "
                     "prefill, end_pos // ratio in decode.",
    "start_pos": "the absolute position of a call's first token (0 in prefill).",
    "end_pos": "start_pos plus the call's token count: one past its last position.",
    "prefill": "the first call: every prompt token at once, from start_pos 0.",
    "decode": "a call with one token at start_pos > 0, after the prefill.",
    "chunked_prefill": "the extension of a prefill in chunks starting at any position (outside the official "
                       "domain, checked only for targets that declare it).",
    "streaming": "the extension of a compressor fed chunks of any size after the first (outside the official "
                 "domain, checked only for targets that declare it).",
    "offset": "the number of window KV rows placed before the compressed block of attention's KV: the "
              "token count s in prefill, window_size = 128 in decode.",
    "top-k": "the k largest scores of a row, by torch.topk.",
    "topk": "torch.topk: the k largest values of a row and their indices.",
    "tie": "equal scores (or block maxima) competing for the last top-k slots.",
    "pool": "the V4.1 candidate pool: per query, the positions of the top 2048 blocks of 8 compressed "
            "positions by block score at the candidate source, the newest block pinned (POOL.*).",
    "candidate": "a compressed position inside the V4.1 pool.",
    "candidate source": "V4.1 layer 20: scores every visible position and builds the pool.",
    "KV source": "a V4.1 layer that owns its compressed KV and index K (2, 8, 14, 20).",
    "index source": "a V4.1 layer that runs its own indexer (2, 8, 14, 20, 24, 28, 32, 36).",
    "re-index": "a V4.1 index source after the candidate source (24, 28, 32, 36): its top-k is taken "
                "inside the pool.",
    "CSA": "a V4 compressed sparse attention layer: ratio 4, its own indexer and top-k.",
    "HCA": "a V4 heavily compressed attention layer: ratio 128, no indexer, every visible entry.",
    "SWA": "sliding-window attention; the V4.1 window KV.",
    "MTP": "V4's multi-token-prediction draft layer, appended after the backbone.",
    "DSpark": "V4.1's draft layers, appended after the backbone.",
    "NoPE": "the dims of a head that RoPE leaves alone (all but the last 64).",
    "YaRN": "the RoPE frequency scaling of compressed layers (ROPE.YARN).",
    "TP": "tensor parallelism: heads split over ranks, partial scores summed by an all-reduce.",
    "all-reduce": "the sum of one tensor over every rank, the result on every rank.",
    "differs": "a rule's record of what a source document claims instead and why the rule differs "
               "(rendered as 'Differs from the source documents').",
    "teacher forcing": "judging each stage on the target's own output of the stage before, so that a "
                       "rounding difference upstream is never blamed downstream.",
    "n_blocks": "the number of blocks of 8 of a row of scores: ceil(W / 8).",
    "topk_blocks": "the blocks the pool keeps, 2048 (config candidate_topk_blocks).",
    "block_size": "the pool's block of compressed positions, 8 (config candidate_block_size).",
    # --- configuration fields
    "index_topk": "k of the indexer top-k: 512 (V4-Flash, V4.1), 1024 (V4-Pro), 2048 (V3.2).",
    "index_n_heads": "the indexer's query heads: 64 (V3.2, V4), 32 (V4.1).",
    "index_head_dim": "the indexer's head dim, 128.",
    "n_heads": "heads; in the indexer, index_n_heads over all ranks (not the local count).",
    "head_dim": "the main attention head dim, 512 (K = V shared).",
    "rope_dim": "the rotated dims of a head, 64 (config rope_head_dim).",
    "q_lora_rank": "the width of the q latent qr: 1024 (V4-Flash), 1536 (V4-Pro, V3.2), 1280 (V4.1).",
    "norm_eps": "the RMSNorm epsilon: 1e-6 (V3.2, V4), 1e-20 (V4.1).",
    "rope_theta": "RoPE base of window-only layers, 10000.",
    "compress_rope_theta": "RoPE base of layers with a compress ratio, 160000.",
    "beta_fast": "YaRN's fast-rotation bound, 32.",
    "beta_slow": "YaRN's slow-rotation bound, 1.",
    "score_dtype": "the dtype of every step of the indexer score: BF16 (V4, V4.1) or fp32 (V3.2).",
    # --- official code names
    "apply_rotary_emb": "the official RoPE: pairs of adjacent channels rotated as complex numbers, in place.",
    "rotate_activation": "the official Hadamard rotation (fast_hadamard_transform, scale d^-0.5).",
    "fast_hadamard_transform": "the CUDA library the official rotate_activation calls.",
    "freqs_cis": "the official table of e^(i·p·f) per position p, one per layer.",
    "view_as_complex": "torch: a [..., 2] real tensor read as complex numbers.",
    "unflatten": "torch: one dimension split into several.",
    "repeat_interleave": "torch: every element repeated n times in place.",
    "masked_fill": "torch: the elements where a mask holds replaced by a value.",
    "split": "torch: a tensor cut into consecutive parts along a dimension.",
    "softmax": "softmax(s)_i = e^(s_i) / Σ_j e^(s_j).",
    "Hadamard": "the Sylvester Hadamard matrix H[i, j] = (−1)^popcount(i AND j) (HAD.MATRIX).",
    "RMSNorm": "y = w · x / sqrt(mean(x²) + eps), computed in fp32.",
    "LayerNorm": "y = w · (x − mean(x)) / sqrt(var(x) + eps) + b (V3.2's index K).",
    "ReLU": "ReLU(v) = max(v, 0).",
    "RoPE": "rotary position embedding: channel pairs rotated by angle position · frequency (ROPE.*).",
    "weights_proj": "the indexer's BF16 Linear from the attention input to one weight per head.",
    "wq_a": "the main attention's q down-projection.",
    "wq_b": "the up-projection from the q latent qr to the (index) query heads.",
    "wk": "the V4.1 (and V3.2) index-K projection.",
    "q_norm": "the RMSNorm of the q latent: qr = q_norm(wq_a(x)).",
    "q_rescale": "V4's per-head rescale of the main q, q · rsqrt(mean(q²) + eps) after wq_b (ATTN.Q_NORM); "
                 "ATTN.LAYER's stage of that name.  Not q_norm.",
    "k_norm": "the RMSNorm of the V4.1 index K (V3.2: a LayerNorm).",
    "attn_norm": "the RMSNorm before a layer's attention; its output is the attention input x.",
    "q_nope": "the NoPE part of a V3.2 index query.",
    # --- this suite's names
    "entry_tolerance": "the compressor's tolerance per element (stated in full under CMP.NORM).",
    "hadamard_tolerance": "HAD.ROUNDING's tolerance.",
    "index_score_tolerance": "IDX.SCORE.ROUNDING's tolerance.",
    "matmul_tolerance": "a BF16 matmul's tolerance: fp32 accumulation in any order, then one BF16 rounding.",
    "rms_norm_tolerance": "PATH.K.NORM's tolerance.",
    "index_rotate": "the spec's index rotation: Hadamard for V3.2 and V4, the identity for V4.1.",
    "index_scores_fp4": "the suite's operation scoring packed FP4 q and k.",
    "kv_rows": "the spec's shift of top-k entries to rows of [window | compressed] KV.",
    "entry_unpack": "the suite's operation that unpacks entry bytes to values (LAYOUT.*).",
    "candidate_blocks": "the suite's operation returning the pool as a bool mask.",
    "q_rot": "the index query after RoPE.",
    "k_rot": "the index key after RoPE.",
    "k_normed": "the V4.1 index key after k_norm.",
}

# Words of the statements' prose that need a definition too (the identifiers are found by pattern).
TERMS = ("fp32", "BF16", "FP4", "FP8", "E2M1", "E4M3", "E8M0", "RNE", "satfinite", "ulp", "BF16 ulp", "amax",
         "block", "scale", "QDQ", "ratio", "window", "compressed entry", "entry", "latent", "visible", "prefill",
         "decode", "offset", "top-k", "tie", "pool", "candidate", "candidate source", "KV source", "index source",
         "re-index", "CSA", "HCA", "SWA", "MTP", "DSpark", "NoPE", "YaRN", "TP", "all-reduce",
         "teacher forcing", "streaming", "Hadamard", "RMSNorm", "LayerNorm", "ReLU", "RoPE")

MATH = {"min", "max", "ceil", "floor", "log2", "log2f", "ln", "sqrt", "exp", "mean", "var", "sign", "O"}
_IDENT = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")
_CALL = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)\(")
_SUBSCRIPT = re.compile(r"[A-Za-z]+_[A-Za-z0-9]{1,2}")      # p_h, w_h, ramp_i, W_ck: math notation


def terms(text: str, defined_elsewhere: tuple[str, ...] = ()) -> set[str]:
    """The glossary-style terms a text uses: identifiers, called names and TERMS words, leaving out
    the strings SPEC.md defines elsewhere (rule ids, knobs, knob values) and file paths."""
    for s in sorted(defined_elsewhere, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(s)}(?![\w])", " ", text)
    text = re.sub(r"\S+\.(?:py|md)\b", " ", text)
    found = set(re.findall(r"`([^`]+)`", text))
    found |= {m for m in _IDENT.findall(text) if not _SUBSCRIPT.fullmatch(m)}
    found |= {m for m in _CALL.findall(text) if m not in MATH and len(m) > 1}
    found |= {t for t in TERMS if re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text)}
    return found


def undefined(text: str, defined_elsewhere: tuple[str, ...] = ()) -> set[str]:
    return terms(text, defined_elsewhere) - set(GLOSSARY)


def render() -> list[str]:
    """The Glossary section of SPEC.md."""
    out = ["## Glossary", "", "Every term the statements use (rule ids, variant knobs and model profiles "
           "are defined in their own sections).", ""]
    out += [f"- **{term}**: {text}" for term, text in sorted(GLOSSARY.items(), key=lambda kv: kv[0].lower())]
    return out + [""]
