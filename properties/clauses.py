"""The clauses of each rule's statement, each beside the check that fails when that clause alone
changes and the catalogue mutants (tests/mutants) that change it.

A clause is quoted from the rule's statement in spec/ (its words, whitespace aside: a test holds
every quote to its statement); `mutants` names the catalogue entries that break exactly that
clause, each of which tests/test_mutants.py requires to FAIL on the rule; `check` is the rule's
check that fails (None: the rule has one check).  A clause without a mutant is a gap: nothing
shows that a change of it alone is caught.  `dsv4spec coverage --clauses` prints the listing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Clause:
    text: str                    # the statement's words
    mutants: tuple[str, ...]     # catalogue mutants that change this clause alone
    check: str | None = None     # the check that fails (None: the rule's only check)


def c(text: str, *mutants: str, check: str | None = None) -> Clause:
    return Clause(text, mutants, check)


CLAUSES: dict[str, tuple[Clause, ...]] = {
    # ---- FMT -------------------------------------------------------------------------------------
    "FMT.E2M1.VALUES": (
        c("FP4_TABLE[c] = [0, .5, 1, 1.5, 2, 3, 4, 6", "e2m1_decode_no_subnormals"),
        c("bit 3 is the sign", "e2m1_decode_sign_bit_7"),
        c("there is no Inf or NaN", "e2m1_decode_ieee_specials"),
        c("code 8 is −0", "e2m1_decode_positive_zero")),
    "FMT.E2M1.RNE": (
        c("encodes to the nearest E2M1 magnitude", "e2m1_truncating", check="e2m1_encode_every_boundary"),
        c("with x's sign", "e2m1_sign_dropped", check="e2m1_encode_every_boundary"),
        c("an exact tie goes to the even code", "e2m1_ties_toward_zero", "e2m1_ties_away_from_zero",
          check="e2m1_encode_every_boundary"),
        c("(boundaries alternate '>' and '≥': >0.25, ≥0.75, >1.25, ≥1.75, >2.5, ≥3.5, >5)", "e2m1_tie_at_5_up",
          check="e2m1_encode_every_boundary")),
    "FMT.E2M1.SATURATE": (c("A finite x with |x| > 6 encodes to ±6", "e2m1_no_clamp"),
                          c("(code 0x7 or 0xF)", "e2m1_saturates_unsigned")),
    "FMT.E2M1.ZERO_SIGN": (c("−0 and every negative x that rounds to magnitude 0 (x ≥ −0.25) encode to code 0x8 (−0)",
                             "e2m1_zero_sign_lost", "e2m1_sign_from_less_than_zero"),
                           c("(x ≥ −0.25)", "e2m1_negative_quarter_positive_zero")),
    "FMT.E4M3.VALUES": (
        c("(−1)^s · 2^(e−7) · (1 + m/8) for e ≥ 1", "e4m3_decode_bias_8"),
        c("(−1)^s · m · 2^-9 for e = 0", "e4m3_decode_no_subnormals"),
        c("0x7F and 0xFF are NaN", "e4m3_decode_no_nan"),
        c("there is no Inf (float8_e4m3fn)", "e4m3_decode_ieee_specials")),
    "FMT.E4M3.RNE": (
        c("encodes to the nearest E4M3 value", "e4m3_truncating", check="e4m3_encode_every_boundary"),
        c("(subnormals 2^-9 · m included)", "e4m3_flushes_subnormals", check="e4m3_encode_every_boundary"),
        c("ties to the even mantissa", "e4m3_ties_up", check="e4m3_encode_every_boundary"),
        c("keeping the sign (−0 → 0x80)", "e4m3_negative_zero_unsigned", check="e4m3_encode_every_boundary")),
    "FMT.E4M3.SATFINITE": (
        c("A value with |x| > 464 (including ±Inf) encodes to ±448 (0x7E/0xFE)", "e4m3_nan_on_overflow",
          check="e4m3_encode_saturates"),
        c("(including ±Inf)", "e4m3_inf_to_nan", check="e4m3_encode_saturates"),
        c("464 itself is a tie and rounds to the even 448", "e4m3_464_tie_to_nan", check="e4m3_encode_saturates"),
        c("Only a NaN input gives NaN", "e4m3_nan_to_zero", check="e4m3_encode_nan_only_from_nan"),
        c("(0x7F, or 0xFF when its sign is set)", "e4m3_nan_sign_dropped", check="e4m3_encode_nan_only_from_nan")),
    "FMT.E8M0.VALUES": (c("Byte b < 255 decodes to 2^(b − 127)", "e8m0_decode_bias_128"),
                        c("b = 0 is 2^-127, an fp32 subnormal", "e8m0_decode_zero_is_zero"),
                        c("b = 255 is NaN", "e8m0_decode_255_inf")),
    "FMT.CEIL_LOG2": (
        c("exactly 2^k gives k", "e8m0_floor_plus_one", check="ceil_log2_of_the_fp4_scale"),
        c("2^k·(1 + 2^-23) gives k + 1", "e8m0_ocp_floor", check="ceil_log2_of_the_fp4_scale"),
        c("It is computed from the bits, never through a floating log2", "e8m0_float_log2_ceil",
          check="ceil_log2_of_the_fp4_scale")),
    "FMT.BF16.RNE": (c("(round to nearest, ties to even; overflow to ±Inf)", "bf16_truncating", "bf16_ties_away",
                       check="bf16_round_every_pattern_and_its_midpoints"),
                     c("overflow to ±Inf", "bf16_saturating", check="bf16_round_every_pattern_and_its_midpoints"),
                     c("a NaN stays NaN (quiet)", "bf16_nan_to_inf", check="bf16_round_every_pattern_and_its_midpoints"),
                     c("±0 and the sign are kept", "bf16_negative_zero_lost",
                       check="bf16_round_every_pattern_and_its_midpoints")),
    # ---- FP4 -------------------------------------------------------------------------------------
    "FP4.PACK.NIBBLE": (c("p[i] = c[2i] | c[2i+1] << 4", "swapped_nibbles", check="fp4_pack_puts_the_even_element_low"),
                        c("unpacking is the inverse", "unpack_swapped_nibbles", check="fp4_pack_puts_the_even_element_low")),
    "FP4.E2M1.RNE": (
        c("nearest magnitude", "e2m1_truncating", check="fp4_e4m3_rounds_ties_to_even"),
        c("exact ties to the even code", "e2m1_ties_toward_zero", "e2m1_ties_away_from_zero",
          "e2m1_ties_toward_zero_and_positive_zero", check="fp4_e8m0_rounds_ties_to_even"),
        c("the scaled value r = clamp(x/s, −6, 6)", "fp4_ratio_through_bf16", "fp4_flushes_subnormal_inputs",
          "idx_floor_block_against_unfloored_scale", check="fp4_e8m0_rounds_ties_to_even"),
        c("the scaled value r = clamp(x/s, −6, 6)", "kv_saturated_block_against_464", check="fp4_e4m3_rounds_ties_to_even")),
    "FP4.E2M1.ZERO_SIGN": (c("is stored as code 0x8 (−0)", "e2m1_zero_sign_lost", "e2m1_ties_toward_zero_and_positive_zero",
                             check="fp4_e8m0_keeps_negative_zero"),
                           c("(or −0)", "fp4_sign_from_less_than_zero", check="fp4_e4m3_keeps_negative_zero")),
    "FP4.KV.SCALE": (
        c("Per block of 16", "kv_scale_per_32"),
        c("s is rounded to nearest, not up", "kv_scale_rounded_up"),
        c("s = E4M3_RNE(fl32(amax / 6))", "kv_scale_ties_up", "kv_scale_ties_away", "kv_subnormal_scale_ties_away"),
        c("(the correctly rounded fp32 quotient, then FMT.E4M3.RNE)", "kv_scale_reciprocal_6"),
        c("is not a power of two", "kv_scale_pow2")),
    "FP4.KV.FLOOR": (c("amax is clamped below at 6·2^-9 before the division", "kv_scale_floor_2^-6"),
                     c("an all-zero block stores scale byte 0x01 with all codes 0", "kv_zero_block_scale_0")),
    "FP4.KV.SATURATE": (c("When amax/6 > 464", "kv_scale_464_tie_to_nan"),
                        c("the scale saturates to 448 (byte 0x7E), never NaN", "e4m3_nan_on_overflow")),
    "FP4.KV.DIVIDE": (
        c("not x · fl32(1/s)", "kv_reciprocal"),
        c("not x / (amax/6)", "kv_divide_by_unrounded_scale"),
        c("the correctly rounded IEEE fp32 division", "kv_bf16_quotient", "kv_divide_in_bf16"),
        c("with s the ROUNDED E4M3 scale", "kv_saturated_block_against_464")),
    "FP4.KV.CLAMP": (c("an element whose ratio |x|/s exceeds 6 is stored as ±6", "e2m1_no_clamp"),),
    "FP4.IDX.SCALE": (
        c("Per block of 32", "idx_scale_per_16"),
        c("s = 2^FMT.CEIL_LOG2(v)", "e8m0_ocp_floor", "e8m0_float_log2_ceil", "e8m0_scale_one_too_low"),
        c("v = fl32(amax · fl32(1/6))", "idx_amax_in_bf16"),
        c("stored as the E8M0 byte 127 + ceil_log2(v)", "idx_scale_byte_bias_126")),
    "FP4.IDX.FLOOR": (c("amax is clamped below at 6·2^-126", "idx_amax_floor_1e-4", "e8m0_scale_one_too_low",
                        "idx_floor_min_normal"),
                      c("an all-zero block stores byte 0x01 with all codes 0", "idx_zero_block_scale_one")),
    "FP4.DEQUANT": (
        c("x̂ = FP4_TABLE[code] · s in fp32", "fp4_dequant_scale_halved", check="fp4_e4m3_dequantize_is_exact"),
        c("with s the decoded E4M3 or E8M0 scale of the element's block", "fp4_dequant_pow2_by_bits",
          check="fp4_e8m0_dequantize_is_exact"),
        c("of the element's block", "fp4_dequant_scales_tiled", check="fp4_e4m3_dequantize_is_exact"),
        c("−0 stays −0", "fp4_dequant_negative_zero_lost", check="fp4_e4m3_dequantize_is_exact")),
    "FP4.NONFINITE": (c("A NaN or ±Inf in a quantizer's input changes nothing outside its own block",
                        "fp4_nonfinite_poisons_row", "fp4_nan_poisons_row", check="fp4_e8m0_nonfinite_stays_in_its_block"),
                      c("Raising ValueError on such input instead is an allowed choice (nonfinite_input=reject), "
                        "detected and reported", "nonfinite_rejected_against_declaration",
                        check="fp4_e8m0_nonfinite_stays_in_its_block")),
    # ---- FP8 -------------------------------------------------------------------------------------
    "FP8.SCALE": (c("s = 2^FMT.CEIL_LOG2(v) (scale_fmt = 'ue8m0')", "e8m0_ocp_floor", "fp8_ocp_mx_port"),
                  c("v = fl32(amax · fl32(1/448))", "fp8_amax_in_bf16"),
                  c("reported as its E8M0 byte 127 + ceil_log2(v)", "fp8_scale_byte_bias_126")),
    "FP8.FLOOR": (c("amax is clamped below at fl32(1e-4)", "fp8_amax_floor_1e-8", "fp8_ocp_mx_port"),
                  c("the scale of an all-zero block", "fp8_zero_block_scale_one")),
    "FP8.E4M3": (
        c("q = FMT.E4M3.RNE(clamp(fl32(x / s), −448, 448))", "e4m3_truncating", "fp8_ratio_through_bf16",
          "fp8_flushes_subnormals"),
        c("q = FMT.E4M3.RNE(clamp(fl32(x / s), −448, 448))", "fp8_floor_block_against_unfloored_scale")),
    "FP8.DEQUANT": (c("x̂ = E4M3 value · 2^(byte − 127) in fp32", "fp8_dequant_scale_halved", "fp8_dequant_pow2_by_bits"),),
    "FP8.BLOCKS": (c("One scale per block of the last dimension", "fp8_block_ignored", "fp8_one_scale_per_row"),),
    "FP8.V4_INPLACE": (c("the in-place QDQ writes back E4M3_RNE(clamp(x/s, ±448)) · s", "fp8_qdq_through_e5m2",
                         "fp8_qdq_bf16_against_declaration", "fp8_qdq_ratio_through_bf16"),
                       c("the initial release is the declared value bf16", "fp8_qdq_fp8_declared_bf16")),
    "FP8.NONFINITE": (c("every block without NaN or ±Inf is quantized exactly as without them", "fp8_nonfinite_poisons_row"),
                      c("raising ValueError instead is allowed (nonfinite_input=reject)",
                        "nonfinite_rejected_against_declaration")),
    "FP8.LINEAR": (
        c("x is first act_quant-ed", "fp8_linear_without_act_quant"),
        c("per block of b along K", "fp8_linear_act_scale_per_row", "fp8_linear_act_scale_from_global_amax"),
        c("with a power-of-two scale (FP8.SCALE, FP8.E4M3, scale_fmt 'ue8m0')", "fp8_linear_scale_not_pow2"),
        c("the weight is E4M3 [N, K] with one E8M0 scale per b×b block [ceil(N/b), K/b]",
          "fp8_linear_one_weight_scale_row"),
        c("each block's sum is multiplied by the product of its two scales", "fp8_linear_scales_after_the_sum"),
        c("the terms are accumulated in fp32 in K order", "fp8_linear_accumulates_in_bf16"),
        c("the sum is rounded once to BF16", "fp8_linear_output_fp32"),
        c("b = 128 in V4 (block_size), 32 in V4.1 (fp8_block_size, act_quant and weight alike)",
          "fp8_linear_act_block_of_the_other_model")),
    # ---- IDX -------------------------------------------------------------------------------------
    "IDX.WEIGHT.SCALE": (
        c("bf16(fl32(weights_proj(x)[t, h] · fl32(128^-0.5 · n^-0.5)))", "weight_factor_missing", "weight_factor_bf16",
          check="head_weights_carry_the_global_factor"),
        c("w[t, h] = bf16(", "weights_left_fp32", "weights_subnormal_flushed", check="head_weights_carry_the_global_factor"),
        c("fl32(128^-0.5 · n^-0.5)", "weight_factor_without_head_dim", check="head_weights_carry_the_global_factor"),
        c("with n the global index_n_heads", "weight_factor_attention_heads", check="head_weights_carry_the_global_factor"),
        c("the official double rounding or a single rounding of the exact product, nothing else", "scale_after_relu",
          check="raw_weights_carry_the_global_factor_into_the_scores")),
    "IDX.WEIGHT.V32": (
        c("the factor n^-0.5 (n = 64 heads: 2^-3, exact) is applied to that BF16 tensor",
          "v32_weights_without_head_factor"),
        c("the softmax scale 128^-0.5", "v32_weights_without_softmax_scale"),
        c("never rounded to BF16", "v32_weights_in_bf16"),
        c("what a port must match is one fp32 rounding of the weight", "v32_weights_subnormal_flushed"),
        c("which carries q's scale", "v32_weights_without_q_scale")),
    "IDX.SCORE.FORMULA": (c("the ReLU applies to each head's dot product before the (signed) head weight multiplies it",
                            "relu_after_weight", "relu_of_head_sum"),),
    "IDX.SCORE.ROUNDING": (
        c("s_h = bf16(Σ_d q·k accumulated in fp32)", "dot_left_fp32", "dot_accumulated_in_bf16"),
        c("p_h = bf16(r_h·w_h)", "fp32_then_one_cast"),
        c("I = bf16(Σ_h p_h accumulated in fp32)", "head_sum_in_bf16", "score_left_fp32")),
    "IDX.SCORE.V32_FP32": (c("no step rounds to BF16", "v32_rounded_to_bf16"),),
    "IDX.SCORE.FP4": (c("the BF16 score of the dequantized values", "fp4_k_nibbles_swapped", "fp4_scores_left_fp32"),
                      c("(code value · 2^(byte − 127))", "fp4_k_scale_bias_128")),
    "IDX.SCORE.TP": (c("the weight factor uses the global head count, never the local one", "weight_factor_local_heads"),),
    "IDX.VISIBLE": (c("visible(p) = (p + 1) // ratio", "visible_p_floor", "visible_p_plus_2",
                      check="visible_count_in_prefill_and_decode"),),
    "IDX.MASK": (c("Every score at s ≥ visible[t] is −inf", "masked_scores_zero", "masked_scores_finfo_min",
                   "mask_leaves_first_invisible"),
                 c("every score at s < visible[t] is finite", "mask_hides_newest_visible")),
    "IDX.CHUNK": (c("the row of a query computed alone (decode: the first end_pos//ratio entries, none masked) equals "
                    "that query's row of a one-chunk prefill", "decode_drops_newest", check="decode_row_equals_prefill_row"),),
    "IDX.TOPK.COUNT": (c("row t holds min(k, visible[t]) valid indices", "no_minus_one", "topk_ties_keep_fewer"),
                       c("each in [0, visible[t])", "no_minus_one"),
                       c("distinct", "topk_merge_duplicates"),
                       c("(0 columns when nothing is compressed yet: V4.1 returns an empty index tensor)",
                         "topk_k0_one_column")),
    "IDX.TOPK.PAD": (c("it never appears before a valid index", "minus_one_first"),
                     c("−1 marks the slots left when visible[t] < k", "pads_with_index_zero")),
    "IDX.TOPK.ORDER": (c("V4 returns the valid indices in descending score order", "v41_order_in_v4"),
                       c("V4.1 returns them in strictly ascending position order", "v4_order_in_v41"),),
    "IDX.TOPK.SELECTION": (c("the multiset of the min(k, visible) largest visible reference scores", "topk_of_magnitude",
                             "topk_of_fp16_scores"),),
    "IDX.TOPK.TIES": (c("A target declaring topk_ties=lowest_index must take the lowest tied positions",
                        "ties_highest_declared_lowest"),),
    # ---- POOL ------------------------------------------------------------------------------------
    "POOL.BLOCK_SCORE": (
        c("padded with −inf", "pads_with_zero"),
        c("to ceil(W/8) blocks of 8", "blocks_floor_w_over_8"),
        c("a block's score is the maximum of its 8 entries", "block_score_first_position"),
        c("the newest block counted as +inf", "newest_not_pinned")),
    "POOL.PIN_NEWEST": (c("the block (compress_lens − 1) // 8 of the newest reachable position", "newest_block_n_div_8"),
                        c("gets score +inf", "newest_not_pinned")),
    "POOL.PIN_EMPTY": (c("(0 − 1) // 8 = −1 under floor division: no block is pinned", "truncating_division"),),
    "POOL.PIN_COUNTS": (c("it is not an extra block", "pinned_as_2049th"),
                        c("a pool never holds more than 2048 blocks", "twice_the_blocks")),
    "POOL.TOPK_BLOCKS": (
        c("the min(2048, n_blocks) blocks", "twice_the_blocks", "prunes_one_block_early"),
        c("with the largest block scores", "smallest_blocks_kept"),
        c("ties among equal maxima are implementation-defined, topk_ties", "block_ties_highest_declared_lowest"),
        c("minus those scoring −inf", "minus_inf_blocks_kept")),
    "POOL.DROP_INF": (c("A selected block whose score is −inf (no reachable position) is not in the pool",
                        "minus_inf_blocks_kept", "pads_with_zero"),
                      c("positions at or past compress_lens appear only inside the newest block", "newest_block_n_div_8")),
    "POOL.MASK": (c("the union of the kept blocks' 8 positions", "best_position_only"),
                  c("with the shape of the scores [T, W]", "mask_not_cut_at_w"),
                  c("cut at W (repeat_interleave(8)[..., :W])", "mask_not_cut_at_w")),
    "POOL.SIZE": (c("A pool holds at most 2048 · 8 = 16384 positions", "twice_the_blocks"),
                  c("it holds at least 2047 · 8 + 1 = 16377 reachable ones", "prunes_one_block_early")),
    "POOL.ALL_REACHABLE": (c("ceil(N/8) ≤ 2048", "capacity_in_whole_blocks"),
                           c("i.e. N ≤ 16384", "prunes_one_block_early"),
                           c("at N = 16385 some reachable block is pruned", "capacity_in_whole_blocks", "twice_the_blocks")),
    "POOL.REINDEX": (
        c("sets its own scores outside the pool to −inf", "reindex_ignores_pool", "reindex_masks_after_topk"),
        c("with the V4.1 order (ascending positions, −1 at the tail)", "reindex_in_score_order"),
        c("row t holds min(k, |pool ∩ visible|) valid indices", "reindex_masks_after_topk"),
        c("every one a visible pool position", "reindex_ignores_visibility"),
        c("which of equal scores are taken is implementation-defined, topk_ties", "reindex_ties_highest_declared_lowest"),
        c("No position outside the pool is ever selected", "reindex_ignores_pool")),
    # ---- HAD -------------------------------------------------------------------------------------
    "HAD.MATRIX": (
        c("The rotation is y = H·x / √128", "index_rotate_identity", check="index_rotate_is_the_hadamard_in_v32_and_v4"),
        c("over the 128 indexer dimensions", "hadamard_blocks_of_64", check="hadamard_maps_basis_vectors_to_scaled_columns"),
        c("H the Sylvester (natural-order) Hadamard matrix H[i, j] = (−1)^popcount(i AND j)",
          "hadamard_random_signs", check="hadamard_maps_basis_vectors_to_scaled_columns"),
        c("scale 128^-0.5", "hadamard_unnormalized", check="hadamard_maps_basis_vectors_to_scaled_columns"),
        c("There is no random sign vector", "hadamard_random_signs", check="hadamard_maps_basis_vectors_to_scaled_columns"),
        c("no permutation", "hadamard_bit_reversed_order", check="hadamard_maps_basis_vectors_to_scaled_columns")),
    "HAD.ROUNDING": (c("Each output element is BF16-representable", "hadamard_not_rounded"),
                     c("lies within one BF16 ulp of the exact value H·x/√128", "hadamard_butterfly_in_bf16")),
    "HAD.ABSENT_V41": (c("index_rotate(x, 'v4.1-flash') returns x unchanged", "hadamard_in_v41"),),
    # ---- LAYER -----------------------------------------------------------------------------------
    "LAYER.V4": (c("(MTP layer included)", "v4_mtp_layer_as_csa"),
                 c("a ratio-4 (CSA) layer has its own compressor and lightning indexer", "csa_as_hca"),
                 c("a ratio-128 (HCA) layer has no indexer", "hca_with_indexer"),
                 c("a ratio-0 layer attends to its window only", "window_layer_with_hca")),
    "LAYER.V41": (c("layers 0, 1 and 40–42 are window-only", "v41_last_layers_reuse"),
                  c("2, 8, 14 (ratio 2) own their KV and index K and take their own top-512", "v41_kv_source_8_reuses_2"),
                  c("20 (ratio 1) does the same and is the candidate source", "candidate_source_as_index_source"),
                  c("(its own top-512 unrestricted)", "candidate_source_masked_to_itself"),
                  c("24, 28, 32, 36 read layer 20's KV and index K, mask their own scores to layer 20's pool",
                    "reindex_as_reuse"),
                  c("every other layer reuses the KV of the preceding KV source and the top-k of the preceding "
                    "index source", "reuse_takes_the_kv_sources_topk")),
    # ---- CMP -------------------------------------------------------------------------------------
    "CMP.GROUPS": (c("has emitted exactly n // m entries", "cmp-partial-group-emitted",
                     check="prefill_emits_one_entry_per_complete_group"),
                   c("entry j pools tokens j·m .. j·m+m-1 (plus, for V4 ratio 4, the m tokens before them)",
                     "cmp-groups-one-token-early", check="prefill_emits_one_entry_per_complete_group"),
                   c("An incomplete group emits nothing", "cmp-partial-group-emitted",
                     check="prefill_emits_one_entry_per_complete_group")),
    "CMP.CAUSAL": (c("Entry j depends only on tokens at positions < (j+1)·m", "cmp-overlap-looks-ahead"),),
    "CMP.OVERLAP": (
        c("Entry j pools an 8-slot window", "cmp-window-without-previous-group"),
        c("slots 0-3 are group j-1's tokens through the FIRST d channels, slots 4-7 are group j's tokens "
          "through the SECOND d channels", "cmp-overlap-halves-swapped"),
        c("Group 0 has no previous group: its slots 0-3 hold kv = 0 and score = -inf", "cmp-group0-previous-score-0")),
    "CMP.APE": (c("wgate·x_t + ape[t mod m]", "cmp-ape-dropped", "cmp-ape-row-off-by-one"),
                c("Both V4 compressors (ratio 4 and ratio 128) carry an ape", "cmp-ape-dropped-at-ratio-128")),
    "CMP.GATE": (c("sum over the window's slots of softmax(score)·kv", "cmp-mean-pool"),
                 c("the softmax taken over the slots separately for every channel", "cmp-softmax-over-channels"),
                 c("computed in fp32", "cmp-gate-softmax-in-bf16")),
    "CMP.RATIO1": (c("entry_t = RoPE(RMSNorm(wkv·x_t), position t)", "cmp-ratio1-unnormalized",
                     "cmp-ratio1-rope-at-t-plus-1"),
                   c("the projection wkv·x_t is summed in fp32 and rounded once to BF16 before RMSNorm",
                     "cmp-ratio1-projection-in-fp32")),
    "CMP.NORM": (
        c("y = w · p / sqrt(mean(p^2) + eps)", "cmp-norm-skipped"),
        c("with the learned weight w", "cmp-norm-weight-ignored"),
        c("eps = norm_eps of the model (1e-6 for V4, 1e-20 for V4.1)", "cmp-eps-1e-6-everywhere")),
    "CMP.ROPE": (c("The last rope_dim channels", "cmp-rope-first-channels"),
                 c("rotated as adjacent pairs (y[2i], y[2i+1])", "cmp-rope-half-split"),
                 c("the position of the FIRST token of the group", "cmp-rope-at-last-token")),
    "CMP.STREAM": (c("for V4 ratio 4, the previous group's window half", "cmp-feed-forgets-previous-window",
                     check="prefill_then_decode_matches_prefill"),
                   c("so does feeding chunks of any sizes after the first", "cmp-chunks-fed-without-the-state",
                     check="chunked_feeding_matches_prefill")),
    "CMP.STATE": (
        c("an fp32 kv state and an fp32 score state", "cmp-state-in-bf16"),
        c("kv 0 and score −inf before anything is written", "cmp-state-scores-from-0"),
        c("(nothing rounded to BF16 before the pooling)", "cmp-state-in-bf16"),
        c("and at V4 ratio 4 also the last complete group into slots 0 … m−1", "cmp-feed-forgets-previous-window"),
        c("at V4 ratio 4 slots m … 2m−1 then move to 0 … m−1", "cmp-feed-forgets-previous-window"),
        c("A slot never written keeps score −inf and weighs 0", "cmp-state-scores-from-0")),
    # ---- LAYOUT ----------------------------------------------------------------------------------
    "LAYOUT.V4.MAIN": (
        c("448 NoPE dims as FP8 E4M3 (448 B)", "layout-v4-rope-quantized", check="size"),
        c("one E8M0 scale per 64 (7 B)", "layout-v4-scales-per-32", check="size"),
        c("the 64 RoPE dims as BF16 (128 B)", "layout-v4-rope-quantized", check="size"),
        c("The 584th byte pads the scales to 8 B", "layout-v4-pad-byte-missing", check="size"),
        c("Unpacking gives exactly act_quant's dequantization of the NoPE dims", "layout-v4-unpack-e8m0-bias-126",
          check="round_trip"),
        c("the BF16 value of the RoPE dims", "layout-v4-unpack-tail-as-fp16", check="round_trip")),
    "LAYOUT.INDEX_K": (c("FP4 E2M1 (64 B, two per byte)", "layout-index-k-byte-per-code", check="size"),
                       c("with one E8M0 scale per 32 (4 B): 68 bytes", "layout-index-k-scales-padded-to-8", check="size"),
                       c("unpacking gives exactly the FP4 E8M0/32 dequantization", "layout-index-k-unpack-nibbles-swapped",
                         check="round_trip")),
    "LAYOUT.V41.MAIN": (c("RoPE dims included, is FP4 E2M1 (256 B) with one E4M3 scale per 16 (32 B): 288 bytes",
                          "layout-v41-rope-bf16-undeclared", "layout-v41-rope-bf16-declared-fp4", check="size"),
                        c("one E4M3 scale per 16 (32 B)", "layout-v41-main-e8m0-per-32", check="size"),
                        c("no global scale", "layout-v41-main-global-scale", check="size"),
                        c("Keeping the 64 RoPE dims in BF16 (384 B) is the named deviation v41_main_rope=bf16",
                          "layout-v41-rope-bf16-undeclared", check="size"),
                        c("unpacking gives exactly the FP4 E4M3/16 dequantization",
                          "layout-v41-main-unpack-nibbles-swapped", check="round_trip")),
    "LAYOUT.V41.SWA": (c("(post-RoPE, RoPE dims included) is FP8 E4M3 (512 B)", "layout-swa-rope-kept-bf16", check="size"),
                       c("with one E8M0 scale per 32 (16 B)", "layout-swa-scales-per-64", check="size"),
                       c("unpacking gives exactly act_quant's dequantization", "layout-swa-unpack-e8m0-bias-126",
                         check="round_trip")),
    "LAYOUT.V32.INDEX_K": (c("is FP8 E4M3 (128 B)", "layout-v32-index-k-as-v4-fp4", check="size"),
                           c("its one power-of-two scale (per 128) stored as an FP32 (4 B)",
                             "layout-v32-scale-as-e8m0-byte", check="size"),
                           c("unpacking gives exactly the E4M3 value times the scale",
                             "layout-v32-unpack-scale-big-endian", check="round_trip")),
    "LAYOUT.V32.MLA": (c("then the four tiles' scales as FP32 (16 B", "layout-v32-mla-scale-as-bf16", check="size"),
                       c("tile order", "layout-v32-mla-tiles-swapped", check="round_trip"),
                       c("then the 64 RoPE dims as BF16 (128 B)", "layout-v32-mla-rope-first", check="round_trip"),
                       c("the floor is on the scale", "layout-v32-mla-act-quant-floor-declared-scale",
                         check="round_trip"),
                       c("Unpacking gives exactly the E4M3 value times the scale",
                         "layout-v32-mla-unpack-scale-big-endian", check="round_trip")),
    "LAYOUT.ORDER": (c("its fields in the order of entry_field_order (canonical: payload, scales, pad, tail)",
                       "layout-scales-first-declared-payload-first"),
                     c("BF16 and FP32 elements little-endian", "layout-bf16-tail-big-endian", "layout-v32-scale-big-endian"),
                     c("FP4 nibbles per FP4.PACK.NIBBLE", "layout-fp4-nibbles-swapped"),
                     c("pad bytes 0", "layout-pad-bytes-ff")),
    "LAYOUT.UNPACK": (c("E2M1 or E4M3 value times the scale", "layout-unpack-e8m0-bias-126"),
                      c("the BF16 tail's value", "layout-unpack-tail-as-fp16"),
                      c("pad bytes are ignored", "layout-unpack-pad-not-skipped")),
    "LAYOUT.REJECT": (c("a buffer that is not uint8", "layout-unpack-accepts-int8"),
                      c("whose last dimension is not the entry size", "layout-unpack-accepts-longer-entries"),
                      c("or that holds a NaN scale", "layout-unpack-accepts-nan-scales"),
                      c("E4M3 byte 0x7F or 0xFF", "layout-unpack-accepts-e4m3-0xff"),
                      c("an FP32 NaN or Inf", "layout-unpack-accepts-fp32-inf")),
    # ---- BUDGET ----------------------------------------------------------------------------------
    "BUDGET.KV_BYTES": (
        c("/ compress ratio", "budget-hca-counted-at-ratio-4"),
        c("HCA layers store no index K", "budget-index-k-on-hca-layers"),
        c("only the KV source layers 2, 8, 14, 20 store KV", "budget-sharing-ignored"),
        c("the window is not included", "budget-window-only-layers-counted")),
    "BUDGET.WINDOW": (c("128·584 = 74752 B per layer in V4 (the FP8 V4 main layout)", "budget-v4-window-without-pad"),
                      c("128·528 = 67584 B in V4.1 (the SWA layout)", "budget-v41-window-in-v4-layout")),
    "BUDGET.INDEX_WORK": (c("per indexing layer", "budget-indexer-on-hca-layers"),
                          c("(entries scored) · index_n_heads · index_head_dim", "budget-indexer-attention-heads"),
                          c("entries scored = N // ratio", "budget-indexer-entries-rounded-up"),
                          c("bounded by topk_blocks · block_size = 16384", "budget-pool-counted-in-blocks"),
                          c("never the candidate source 20", "budget-pool-at-layer-20")),
    "BUDGET.ATTN_WORK": (c("(q·k and p·v over the shared 512-dim K = V)", "budget-attention-qk-only"),
                         c("min(window, N) window entries", "budget-window-entries-not-capped"),
                         c("min(index_topk, N // ratio) selected entries", "budget-topk-not-capped"),
                         c("or all N // ratio compressed entries (V4 HCA)", "budget-hca-capped-at-topk")),
    # ---- ROPE ------------------------------------------------------------------------------------
    "ROPE.THETA": (c("f_i = θ^(-2i/64) (i = 0..31)", "freqs_theta_to_minus_i_over_64"),
                   c("θ = compress_rope_theta = 160000 when the layer's compress ratio is > 0", "base_10000_on_compressed"),
                   c("whether they own their KV or not", "base_10000_on_reuse_layers"),
                   c("θ = rope_theta = 10000 on ratio-0 (window-only, MTP/DSpark) layers", "base_160000_on_window_layers")),
    "ROPE.YARN": (c("On a layer with a compress ratio, f_i is multiplied by ramp_i/16 + (1 − ramp_i)", "yarn_missing",
                    "yarn_factor_40"),
                  c("ramp_i = clamp((i − low)/(high − low), 0, 1)", "yarn_ramp_unclamped"),
                  c("low = max(floor(c(32)), 0)", "yarn_low_ceil"),
                  c("high = min(ceil(c(1)), 63)", "yarn_high_floor"),
                  c("c(r) = 64·ln(65536/(2πr))/(2 ln θ)", "yarn_original_length_4096"),
                  c("Window-only layers have no YaRN (every multiplier 1)", "yarn_on_window_layers")),
    "ROPE.SHARED": (c("An indexer does not have a RoPE configuration of its own", "indexer_without_yarn"),
                    c("the main q, the window KV, the compressed KV entries and the indexer's q and k get "
                      "bit-identical frequencies", "compressed_kv_table_from_fp64")),
    "ROPE.PAIRS": (
        c("Channel 2i is the real and 2i+1 the imaginary part", "conjugate_rotation"),
        c("interleaved, not the half-split 'NeoX' pairing (i, i + 32)", "half_split_pairing"),
        c("multiplied by e^(+i·p·f_i)", "conjugate_rotation")),
    "ROPE.SLICE": (c("RoPE rotates x[..., −64:] of every head", "rotates_first_64"),
                   c("indexer q and k: 64 NoPE + 64 RoPE", "rotates_channels_448_to_511"),
                   c("every other channel passes bit for bit", "nope_channels_zeroed")),
    "ROPE.ROUNDING": (c("the rotation of BF16 values by angle fl32(fl32(p)·f_i)", "positions_rounded_to_bf16"),
                      c("is computed in fp32 (complex64)", "rotation_in_bf16"),
                      c("written back as BF16", "rotation_left_fp32")),
    "ROPE.POSITIONS": (c("The query (main and index) of token t is rotated at its absolute position start_pos + t",
                         "index_q_rope_from_position_0", check="layer_stages_rope_positions"),
                       c("Compressed entry j (main KV, index K) is rotated at j·ratio", "k_rope_at_j",
                         check="layer_stages_rope_positions"),
                       c("decode start_pos + 1 − ratio", "decode_entry_rotated_at_the_token",
                         check="decode_entry_rotated_at_its_groups_first_token")),
    # ---- PATH ------------------------------------------------------------------------------------
    "PATH.WINDOW": (
        c("row i lists the positions max(0, i−127) … i", "window_127", "window_129"),
        c("each once, and −1 in the remaining min(s, 128) − (that count) columns", "window_pads_with_own_position",
          "window_rows_always_128_wide"),
        c("holding each slot q mod 128 for q in max(0, p−127) … p once", "ring_lists_positions_not_slots"),
        c("−1 for the 128 − min(p+1, 128) slots not yet filled", "ring_unfilled_zero")),
    "PATH.HCA": (c("for j < (i+1)//ratio", "hca_visible_i_over_ratio"),
                 c("in ascending j", "hca_descending"),
                 c("decode lists j + 128 for j < (p+1)//ratio", "hca_visible_i_over_ratio"),
                 c("offset = s in prefill, 128 in decode", "hca_without_offset")),
    "PATH.CONCAT": (c("valid compressed indices shifted by the offset of the compressed block", "concat_without_offset"),
                    c("(s in prefill, 128 in decode)", "concat_offset_128_in_prefill"),
                    c("−1 kept as −1", "concat_shifts_minus_one")),
    "PATH.ORDER": (c("rotated first and quantized second", "quantize_before_rope", check="rotated_first_then_quantized"),
                   c("(RoPE on the last 64 dims, then FP4 E4M3/16 over all 512)", "main_kv_rope_dims_not_quantized",
                     check="rotated_first_then_quantized"),
                   c("(RoPE, then FP8 E4M3 with E8M0 per 32 over all 512)", "window_kv_quantized_per_128_after_rope",
                     check="rotated_first_then_quantized")),
    "PATH.QDQ": (
        c("x̂ equals dequantize(quantize(x)) bit for bit", "qdq_skipped", check="attention_reads_the_exact_fp4_e4m3_values"),
        c("(E4M3 scale per 16)", "nvfp4_second_scale", check="attention_reads_the_exact_fp4_e4m3_values"),
        c("q · 2^e (FP8 E4M3, E8M0 per 32)", "window_kv_scale_per_128", check="attention_reads_the_exact_fp8_e8m0_32_values")),
    "PATH.K.CACHE": (c("so k̂ is dequantize(quantize(k)) bit for bit", "index_k_cache_unquantized"),
                     c("(FP4 with one E8M0 scale per 32)", "index_k_cache_scale_per_128")),
    "PATH.K.PUBLISHED": (c("At an even decode position p they complete none", "sources_score_their_own_index_k"),),
    "PATH.WINDOW.RING": (c("each to slot p mod 128", "window_ring_in_prefill_order"),
                         c("writes positions max(0, s−128) … s−1", "ring_keeps_the_first_128"),
                         c("Decode at position p writes slot p mod 128", "ring_decode_in_the_next_slot"),
                         c("or nothing yet (−1)", "ring_unwritten_slots_zero")),
    "PATH.POOL_SCAN": (c("the pinned partial newest block included", "pool_scan_skips_partial_block",
                         check="pinned_partial_block_is_scanned"),
                       c("same count", "pool_scan_masks_after_topk", check="pool_only_scan_selects_a_masked_topk"),
                       c("only visible pool positions", "pool_scan_ignores_visibility",
                         check="pool_only_scan_selects_a_masked_topk")),
    "PATH.Q.PROJ": (c("unflattened to [T, H, 128]", "q_heads_interleaved", check="layer_stages_path_q_proj"),
                    c("qr is act_quant-ed to E4M3 with a power-of-two scale per b (128 in V4, 32 in V4.1)",
                      "q_act_quant_per_128_on_v41", check="act_quant_per_b_of_the_model"),
                    c("bf16(ŵ · qr) of the dequantized weight — a BF16 projection — is not it",
                      "q_projection_in_bf16", "q_projection_scales_after_the_sum", check="layer_stages_path_q_proj")),
    "PATH.K.PROJ": (c("the index key of compressed entry j is bf16(wk · latent_j)", "k_projection_accumulates_in_bf16"),),
    "PATH.K.NORM": (c("k_normed = bf16(w · k / sqrt(mean(k²) + eps))", "k_before_its_norm",
                      check="layer_stages_path_k_norm"),
                    c("over the 128 dims of each entry", "k_norm_per_half", check="layer_stages_path_k_norm"),
                    c("eps = norm_eps = 1e-20", "k_norm_eps_1e-6", check="k_norm_eps_of_the_model"),
                    c("computed in fp32 and written back BF16", "k_norm_in_bf16_ops", check="layer_stages_path_k_norm")),
    "PATH.HADAMARD": (c("In V4 the FP4 stage quantizes Hadamard(q_rot) and Hadamard(k_rot)", "hadamard_skipped_in_v4"),
                      c("in V4.1 it quantizes q_rot and k_rot themselves", "hadamard_in_v41_index_path")),
    "PATH.W.PROJ": (c("The raw head weights are bf16(weights_proj · x)", "linear_accumulates_in_bf16"),),
    "PATH.LAYER": (c("Each is judged by its own rule on the target's own output of the stage before",
                     "layer_k_before_its_norm", "layer_q_projection_in_bf16"),),
    # ---- ATTN ------------------------------------------------------------------------------------
    "ATTN.GATHER": (c("an entry −1 (anywhere in the list) has score −inf and its row is read as 0",
                      "minus_one_reads_row_0"),
                    c("(anywhere in the list)", "minus_one_only_at_the_tail")),
    "ATTN.DUPLICATES": (c("a row named by two entries contributes two scores to the denominator and twice its "
                          "value to the numerator", "duplicates_removed"),),
    "ATTN.INIT": (c("V4.1's kernel starts the running max at −1e30", "running_max_from_minus_inf_on_v41",
                    check="running_max_start"),
                  c("a row with no valid entry gives 0", "running_max_from_minus_inf_on_v41",
                    check="v41_row_without_a_valid_entry_is_zero")),
    "ATTN.SCORE": (
        c("the scores are never rounded to BF16", "scores_rounded_to_bf16"),
        c("scale the fp32 value of the `scale` argument", "scale_argument_ignored")),
    "ATTN.SCALE": (
        c("no YaRN attention factor", "yarn_factor_in_the_scale"),
        c("softmax_scale = head_dim^-0.5", "scale_of_the_nope_dims")),
    "ATTN.PROB.BF16": (c("are rounded to BF16 (RNE) before the product with the KV rows", "fp32_probabilities"),
                       c("are rounded to BF16 (RNE)", "probabilities_truncated_to_bf16"),
                       c("enter the denominator in fp32", "denominator_of_the_rounded_probabilities")),
    "ATTN.PROB.ORDER": (
        c("with m_t the running max after block t (not the final max M)", "probabilities_rounded_against_the_global_max"),
        c("Block t holds list entries 64t .. 64t + 63", "probabilities_in_blocks_of_32")),
    "ATTN.RESCALE": (
        c("the output accumulator are fp32, and both are multiplied by exp(m_{t−1} − m_t)",
          "output_accumulator_not_rescaled", "denominator_not_rescaled"),),
    "ATTN.SINK": (
        c("adds exp(sink_h − M) to the denominator", "no_sink"),
        c("it has no value row and adds nothing to the numerator", "sink_in_the_numerator"),
        c("the per-head sink (fp32, not scaled by softmax_scale)", "sink_scaled_by_softmax_scale")),
    "ATTN.OUTPUT": (c("rounded once to BF16: the output tensor holds BF16 values", "output_left_fp32"),),
    "ATTN.DEROTATE": (c("the last 64 channels of each head of o", "derotates_the_first_64"),
                      c("rotated by e^(−i·p·f_i)", "derotation_by_plus_p")),
    "ATTN.Q_NORM": (
        c("V4 multiplies each head of q = wq_b(qr) (BF16) by r = rsqrt(mean(q²) + norm_eps)", "q_not_rescaled_on_v4",
          "q_norm_eps_1e-20_on_v4"),
        c("the product q·r of two BF16 values is rounded once to BF16", "q_rescaled_in_fp32_on_v4"),
        c("the add and the rsqrt each rounded to BF16, so r is a BF16 value", "q_rescaled_in_fp32_rounded_once_on_v4"),
        c("V4.1's Attention.forward has no such step", "q_rescaled_on_v41")),
    "ATTN.LAYER": (c("Each is judged by its own rule on the target's own output of the stage before (teacher forcing)",
                     "layer_q_not_rescaled_on_v4", "layer_window_kv_not_quantized", "layer_compressed_kv_not_quantized",
                     "layer_attention_without_sink", "layer_output_not_derotated"),),
}
FAMILIES = ("FMT", "FP4", "FP8", "IDX", "POOL", "HAD", "CMP", "LAYOUT", "BUDGET", "LAYER", "ROPE", "PATH", "ATTN")


def clauses(rule_id: str) -> tuple[Clause, ...]:
    return CLAUSES.get(rule_id, ())


def normalized(text: str) -> str:
    return " ".join(text.split())


def render(rule_id: str, checks: list[str]) -> list[str]:
    """The listing's lines of one rule: each clause, the check that fails and the mutants."""
    lines = []
    for cl in clauses(rule_id):
        check = cl.check or (checks[0] if len(checks) == 1 else "?")
        if cl.mutants:
            lines.append(f"    clause «{cl.text}»: fails {check} ({', '.join(cl.mutants)})")
        else:
            lines.append(f"    GAP    «{cl.text}»: no mutant shows a change of it alone caught")
    return lines
