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
    # ---- HAD -------------------------------------------------------------------------------------
    "HAD.MATRIX": (
        c("H the Sylvester (natural-order) Hadamard matrix H[i, j] = (−1)^popcount(i AND j)",
          "hadamard_random_signs", check="hadamard_maps_basis_vectors_to_scaled_columns"),
        c("scale 128^-0.5", "hadamard_unnormalized", check="hadamard_maps_basis_vectors_to_scaled_columns")),
    "HAD.ROUNDING": (c("Each output element is BF16-representable", "hadamard_not_rounded"),),
    "HAD.ABSENT_V41": (c("index_rotate(x, 'v4.1-flash') returns x unchanged", "hadamard_in_v41"),),
    # ---- LAYER -----------------------------------------------------------------------------------
    "LAYER.V4": (c("a ratio-128 (HCA) layer has no indexer", "hca_with_indexer"),),
    "LAYER.V41": (c("24, 28, 32, 36 read layer 20's KV and index K, mask their own scores to layer 20's pool",
                    "reindex_as_reuse"),),
    # ---- CMP -------------------------------------------------------------------------------------
    "CMP.GROUPS": (c("An incomplete group emits nothing", "cmp-partial-group-emitted",
                     check="prefill_emits_one_entry_per_complete_group"),),
    "CMP.CAUSAL": (c("Entry j depends only on tokens at positions < (j+1)·m", "cmp-overlap-looks-ahead"),),
    "CMP.OVERLAP": (
        c("slots 0-3 are group j-1's tokens through the FIRST d channels, slots 4-7 are group j's tokens "
          "through the SECOND d channels", "cmp-overlap-halves-swapped"),
        c("Group 0 has no previous group: its slots 0-3 hold kv = 0 and score = -inf", "cmp-group0-previous-score-0")),
    "CMP.APE": (c("wgate·x_t + ape[t mod m]", "cmp-ape-dropped"),),
    "CMP.GATE": (c("sum over the window's slots of softmax(score)·kv", "cmp-mean-pool"),),
    "CMP.RATIO1": (c("entry_t = RoPE(RMSNorm(wkv·x_t), position t)", "cmp-ratio1-unnormalized"),),
    "CMP.NORM": (
        c("y = w · p / sqrt(mean(p^2) + eps)", "cmp-norm-skipped"),
        c("eps = norm_eps of the model (1e-6 for V4, 1e-20 for V4.1)", "cmp-eps-1e-6-everywhere")),
    "CMP.ROPE": (c("the position of the FIRST token of the group", "cmp-rope-at-last-token"),),
    "CMP.STREAM": (c("for V4 ratio 4, the previous group's window half", "cmp-feed-forgets-previous-window",
                     check="prefill_then_decode_matches_prefill"),),
    "CMP.STATE": (
        c("an fp32 kv state and an fp32 score state", "cmp-state-in-bf16"),
        c("kv 0 and score −inf before anything is written", "cmp-state-scores-from-0")),
    # ---- LAYOUT ----------------------------------------------------------------------------------
    "LAYOUT.V4.MAIN": (c("The 584th byte pads the scales to 8 B", "layout-v4-pad-byte-missing", check="size"),),
    "LAYOUT.INDEX_K": (c("with one E8M0 scale per 32 (4 B): 68 bytes", "layout-index-k-scales-padded-to-8", check="size"),),
    "LAYOUT.V41.MAIN": (c("RoPE dims included, is FP4 E2M1 (256 B) with one E4M3 scale per 16 (32 B): 288 bytes",
                          "layout-v41-rope-bf16-undeclared", "layout-v41-rope-bf16-declared-fp4", check="size"),),
    "LAYOUT.V41.SWA": (c("(post-RoPE, RoPE dims included) is FP8 E4M3 (512 B)", "layout-swa-rope-kept-bf16", check="size"),),
    "LAYOUT.V32.INDEX_K": (c("its one power-of-two scale (per 128) stored as an FP32 (4 B)",
                             "layout-v32-scale-as-e8m0-byte", check="size"),),
    "LAYOUT.ORDER": (c("BF16 and FP32 elements little-endian", "layout-bf16-tail-big-endian"),),
    "LAYOUT.UNPACK": (c("E2M1 or E4M3 value times the scale", "layout-unpack-e8m0-bias-126"),),
    "LAYOUT.REJECT": (c("or that holds a NaN scale", "layout-unpack-accepts-nan-scales"),),
    # ---- BUDGET ----------------------------------------------------------------------------------
    "BUDGET.KV_BYTES": (
        c("/ compress ratio", "budget-hca-counted-at-ratio-4"),
        c("HCA layers store no index K", "budget-index-k-on-hca-layers"),
        c("only the KV source layers 2, 8, 14, 20 store KV", "budget-sharing-ignored")),
    "BUDGET.WINDOW": (c("128·528 = 67584 B in V4.1 (the SWA layout)", "budget-v41-window-in-v4-layout"),),
    "BUDGET.INDEX_WORK": (c("never the candidate source 20", "budget-pool-at-layer-20"),),
    "BUDGET.ATTN_WORK": (c("(q·k and p·v over the shared 512-dim K = V)", "budget-attention-qk-only"),),
    # ---- ROPE ------------------------------------------------------------------------------------
    "ROPE.THETA": (c("θ = compress_rope_theta = 160000 when the layer's compress ratio is > 0", "base_10000_on_compressed"),),
    "ROPE.YARN": (c("On a layer with a compress ratio, f_i is multiplied by ramp_i/16 + (1 − ramp_i)", "yarn_missing"),),
    "ROPE.SHARED": (c("An indexer does not have a RoPE configuration of its own", "indexer_without_yarn"),),
    "ROPE.PAIRS": (
        c("interleaved, not the half-split 'NeoX' pairing (i, i + 32)", "half_split_pairing"),
        c("multiplied by e^(+i·p·f_i)", "conjugate_rotation")),
    "ROPE.SLICE": (c("RoPE rotates x[..., −64:] of every head", "rotates_first_64"),),
    "ROPE.ROUNDING": (c("written back as BF16", "rotation_left_fp32"),),
    "ROPE.POSITIONS": (c("Compressed entry j (main KV, index K) is rotated at j·ratio", "k_rope_at_j"),),
    # ---- PATH ------------------------------------------------------------------------------------
    "PATH.WINDOW": (
        c("row i lists the positions max(0, i−127) … i", "window_127", "window_129"),
        c("−1 for the 128 − min(p+1, 128) slots not yet filled", "ring_unfilled_zero")),
    "PATH.HCA": (c("offset = s in prefill, 128 in decode", "hca_without_offset"),),
    "PATH.CONCAT": (c("valid compressed indices shifted by the offset of the compressed block", "concat_without_offset"),),
    "PATH.ORDER": (c("rotated first and quantized second", "quantize_before_rope", check="rotated_first_then_quantized"),),
    "PATH.QDQ": (
        c("x̂ equals dequantize(quantize(x)) bit for bit", "qdq_skipped", check="attention_reads_the_exact_fp4_e4m3_values"),
        c("(E4M3 scale per 16)", "nvfp4_second_scale", check="attention_reads_the_exact_fp4_e4m3_values")),
    "PATH.K.CACHE": (c("so k̂ is dequantize(quantize(k)) bit for bit", "index_k_cache_unquantized"),),
    "PATH.WINDOW.RING": (c("each to slot p mod 128", "window_ring_in_prefill_order"),),
    "PATH.POOL_SCAN": (c("the pinned partial newest block included", "pool_scan_skips_partial_block",
                         check="pinned_partial_block_is_scanned"),),
    "PATH.Q.PROJ": (c("bf16(ŵ · qr) of the dequantized weight — a BF16 projection — is not it",
                      "q_projection_in_bf16", "q_projection_scales_after_the_sum"),),
    "PATH.K.PROJ": (c("the index key of compressed entry j is bf16(wk · latent_j)", "k_projection_accumulates_in_bf16"),),
    "PATH.K.NORM": (c("k_normed = bf16(w · k / sqrt(mean(k²) + eps))", "k_before_its_norm"),),
    "PATH.HADAMARD": (c("In V4 the FP4 stage quantizes Hadamard(q_rot) and Hadamard(k_rot)", "hadamard_skipped_in_v4"),),
    "PATH.W.PROJ": (c("The raw head weights are bf16(weights_proj · x)", "linear_accumulates_in_bf16"),),
    "PATH.LAYER": (c("Each is judged by its own rule on the target's own output of the stage before",
                     "layer_k_before_its_norm", "layer_q_projection_in_bf16"),),
    # ---- ATTN ------------------------------------------------------------------------------------
    "ATTN.GATHER": (c("an entry −1 (anywhere in the list) has score −inf and its row is read as 0",
                      "minus_one_reads_row_0"),),
    "ATTN.DUPLICATES": (c("a row named by two entries contributes two scores to the denominator and twice its "
                          "value to the numerator", "duplicates_removed"),),
    "ATTN.INIT": (c("V4.1's kernel starts the running max at −1e30", "running_max_from_minus_inf_on_v41",
                    check="running_max_start"),),
    "ATTN.SCORE": (
        c("the scores are never rounded to BF16", "scores_rounded_to_bf16"),
        c("scale the fp32 value of the `scale` argument", "scale_argument_ignored")),
    "ATTN.SCALE": (
        c("no YaRN attention factor", "yarn_factor_in_the_scale"),
        c("softmax_scale = head_dim^-0.5", "scale_of_the_nope_dims")),
    "ATTN.PROB.BF16": (c("are rounded to BF16 (RNE) before the product with the KV rows", "fp32_probabilities"),),
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
    "ATTN.DEROTATE": (c("rotated by e^(−i·p·f_i)", "derotation_by_plus_p"),),
    "ATTN.Q_NORM": (
        c("V4 multiplies each head of q = wq_b(qr) (BF16) by rsqrt(mean(q²) + norm_eps)", "q_not_rescaled_on_v4"),
        c("V4.1's Attention.forward has no such step", "q_rescaled_on_v41")),
    "ATTN.LAYER": (c("Each is judged by its own rule on the target's own output of the stage before (teacher forcing)",
                     "layer_q_not_rescaled_on_v4", "layer_window_kv_not_quantized", "layer_compressed_kv_not_quantized",
                     "layer_attention_without_sink", "layer_output_not_derotated"),),
}
FAMILIES = ("HAD", "CMP", "LAYOUT", "BUDGET", "LAYER", "ROPE", "PATH", "ATTN")   # listed clause by clause


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
