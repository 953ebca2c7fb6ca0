"""Indexer-path mutants: one realistic mistake each, with the rule that must report it.

Layer mutants replace one stage helper of impl/path.py while the layer runs, so every later stage
is computed from the wrong one, as in a real port."""
from dataclasses import replace
from unittest import mock

import torch

from dsv4spec.impl import path as ref
from dsv4spec.impl import rope as rope_ref
from dsv4spec.spec.models import profile

from . import mutant
from . import pool as pool_mutants
from .quant import fp8_linear_scales_after_the_sum, fp8_linear_without_act_quant


def _layer_with(**helpers):
    def index_layer(inputs, *, model, layer, start_pos=0):
        with mock.patch.multiple(ref, **helpers):
            return ref.index_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    return index_layer


def _window(seqlen, start_pos, *, size=128, unfilled=-1):
    if start_pos == 0:
        i = torch.arange(seqlen)[:, None]
        rows = (i - size + 1).clamp(min=0) + torch.arange(min(seqlen, size))[None, :]
        return torch.where(rows > i, -1, rows).int()
    filled = min(start_pos + 1, 128)
    slots = torch.full((128,), unfilled, dtype=torch.int64)
    slots[:filled] = torch.arange(start_pos + 1 - filled, start_pos + 1).remainder(128).sort().values
    return slots[None, :].int()


def _hca_no_offset(seqlen, start_pos, *, model, layer):
    rows = ref.compressed_index(seqlen, start_pos, model=model, layer=layer)
    return ref._unshift(rows, seqlen, start_pos).int()


def _concat_no_offset(window_rows, compressed_rows, seqlen, start_pos):
    return torch.cat([window_rows.long(), compressed_rows.long()], -1).int()


def _quantize_before_rope(x, positions, freqs, fmt):
    """The cache written from the pre-RoPE values (RoPE left to the reader)."""
    return ref._quantize(x.float(), ref._format("rope_quantize", fmt))


def _nvfp4_qdq(x, fmt):
    if fmt != "fp4_e4m3":
        return ref.kv_qdq(x, fmt)
    from dsv4spec.spec.path import kv_qdq_per_tensor
    return torch.from_numpy(kv_qdq_per_tensor(x.numpy())).float()


def _full_blocks_only(q, k, w, visible, pool, topk):
    """A block-tiled scan that skips the partial newest block (positions past the last multiple of 8)."""
    whole = torch.arange(k.shape[0])[None, :] < (visible // 8 * 8)[:, None]
    return ref.pool_scan_topk(q, k, w, visible, pool & whole, topk)


def _bf16_accumulation(x, w, chunk=32):
    """A BF16 Linear whose running sum is rounded to BF16 after every chunk of 32 products."""
    acc = torch.zeros(x.shape[0], w.shape[0])
    for c in range(0, x.shape[1], chunk):
        acc = (acc + x[:, c:c + chunk] @ w[:, c:c + chunk].T).to(torch.bfloat16).float()
    return acc


MUTANTS = {
    "window_127": (mutant("window_127", window_index=lambda s, p: _window(s, p, size=127)), "PATH.WINDOW"),
    "window_129": (mutant("window_129", window_index=lambda s, p: _window(s, p, size=129)), "PATH.WINDOW"),
    "ring_unfilled_zero": (mutant("ring_unfilled_zero", window_index=lambda s, p: _window(s, p, unfilled=0)),
                           "PATH.WINDOW"),
    "hca_without_offset": (mutant("hca_without_offset", compressed_index=_hca_no_offset), "PATH.HCA"),
    "concat_without_offset": (mutant("concat_without_offset", attention_index=_concat_no_offset), "PATH.CONCAT"),
    # no layer operation: PATH.ORDER is then judged on rope_quantize alone (and the layer check not paid for)
    "quantize_before_rope": (mutant("quantize_before_rope", rope_quantize=_quantize_before_rope, index_layer=None),
                             "PATH.ORDER"),
    "qdq_skipped": (mutant("qdq_skipped", kv_qdq=lambda x, fmt: x.float().clone()), "PATH.QDQ"),
    "nvfp4_second_scale": (mutant("nvfp4_second_scale", kv_qdq=_nvfp4_qdq), "PATH.QDQ"),
    "pool_scan_skips_partial_block": (mutant("pool_scan_skips_partial_block", pool_scan_topk=_full_blocks_only),
                                      "PATH.POOL_SCAN"),
    "k_rope_at_j": (mutant("k_rope_at_j", index_layer=_layer_with(
        _k_positions=lambda n, r: torch.arange(n))), "ROPE.POSITIONS"),
    "k_before_its_norm": (mutant("k_before_its_norm", index_layer=_layer_with(
        _rms_norm=lambda x, w, eps: x.clone())), "PATH.K.NORM"),
    "linear_accumulates_in_bf16": (mutant("linear_accumulates_in_bf16", index_layer=_layer_with(_project=_bf16_accumulation)),
                                   "PATH.W.PROJ"),
    "q_projection_in_bf16": (mutant("q_projection_in_bf16", index_layer=_layer_with(
        fp8_linear=fp8_linear_without_act_quant)), "PATH.Q.PROJ"),
    "q_projection_scales_after_the_sum": (mutant("q_projection_scales_after_the_sum", index_layer=_layer_with(
        fp8_linear=fp8_linear_scales_after_the_sum)), "PATH.Q.PROJ"),
    "hadamard_skipped_in_v4": (mutant("hadamard_skipped_in_v4", index_layer=_layer_with(
        hadamard=lambda x: x.clone())), "PATH.HADAMARD"),
}
MUTANTS["k_projection_accumulates_in_bf16"] = (MUTANTS["linear_accumulates_in_bf16"][0], "PATH.K.PROJ")
MUTANTS["layer_k_before_its_norm"] = (MUTANTS["k_before_its_norm"][0], "PATH.LAYER")
MUTANTS["layer_q_projection_in_bf16"] = (MUTANTS["q_projection_in_bf16"][0], "PATH.LAYER")


def catalogue() -> list[tuple]:
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()]


def _ring_in_prefill_order(prefill, decoded):
    """The prefill's last 128 tokens written to slots 0..127 in order, not to slot p mod 128."""
    if prefill <= 128:
        return ref.window_ring(prefill, decoded)
    ring = torch.arange(prefill - 128, prefill)
    for p in range(prefill, prefill + decoded):
        ring[p % 128] = p
    return ring


MUTANTS.update({
    "index_k_cache_unquantized": (mutant("index_k_cache_unquantized", kv_qdq=lambda x, fmt: x.float().clone()
                                         if fmt == "fp4_e8m0" else ref.kv_qdq(x, fmt)), "PATH.K.CACHE"),
    "window_ring_in_prefill_order": (mutant("window_ring_in_prefill_order", window_ring=_ring_in_prefill_order),
                                     "PATH.WINDOW.RING"),
})


def _decode_entry_at_the_token(inputs, *, model, layer, start_pos=0):
    """A decode step rotates the index-K entry it completes at the token's own position start_pos,
    not at its group's first token start_pos + 1 − ratio: the same at ratio 1 (V4.1's layers 20
    and 24), wrong at ratio 4 and 2 when start_pos mod ratio = ratio − 1 (the fixed V4-Pro and
    V4.1 index-source decodes)."""
    def positions(entries, ratio):
        p = torch.arange(entries) * ratio
        if start_pos and entries and (start_pos + 1) % ratio == 0:
            p[-1] = start_pos
        return p
    with mock.patch.object(ref, "_k_positions", positions):
        return ref.index_layer(inputs, model=model, layer=layer, start_pos=start_pos)


MUTANTS["decode_entry_rotated_at_the_token"] = (mutant("decode_entry_rotated_at_the_token",
                                                       index_layer=_decode_entry_at_the_token), "ROPE.POSITIONS")


def _v4_flash_topk_on_v4_pro(inputs, *, model, layer, start_pos=0):
    """V4-Pro's indexer keeps V4-Flash's top-k, 512 entries, not 1024: the same while a V4-Pro
    layer has at most 512 compressed entries (every fixed case), wrong beyond."""
    real = ref.profile

    def profile(name):
        m = real(name)
        return replace(m, index_topk=real("v4-flash").index_topk) if name == "v4-pro" else m
    with mock.patch.object(ref, "profile", profile):
        return ref.index_layer(inputs, model=model, layer=layer, start_pos=start_pos)


# Caught by drawn layer cases only (tests/test_path.py: the fixed cases pass it; a dev seed fails it),
# so not in the catalogue, whose mutants fail at ci.
SEED_ONLY = {"v4_flash_topk_on_v4_pro": (mutant("v4_flash_topk_on_v4_pro", index_layer=_v4_flash_topk_on_v4_pro),
                                         "PATH.LAYER")}


# Clause mutants (issue 22: each changes one clause of its rule's statement; properties/clauses.py).
def _window_variant(seqlen, start_pos, *, pad_with_own=False, raw_positions=False, width_128=False):
    """window_index with one mistake: the prefill pad columns repeating the row's own position (a
    clamp instead of −1), the decode row listing positions instead of ring slots, or prefill rows
    always 128 wide."""
    if start_pos == 0:
        i = torch.arange(seqlen)[:, None]
        rows = (i - 127).clamp(min=0) + torch.arange(128 if width_128 else min(seqlen, 128))[None, :]
        return torch.where(rows > i, i if pad_with_own else -1, rows).int()
    filled = min(start_pos + 1, 128)
    listed = torch.arange(start_pos + 1 - filled, start_pos + 1)
    slots = torch.full((128,), -1, dtype=torch.int64)
    slots[:filled] = listed if raw_positions else listed.remainder(128).sort().values
    return slots[None, :].int()


def _hca_variant(seqlen, start_pos, *, model, layer, visible_of=lambda p: p + 1, descending=False):
    """compressed_index with entry j visible for j < visible_of(i)//ratio, or listed in descending j."""
    ratio = ref.profile(model).ratio(layer)
    offset = ref.spec.kv_offset(seqlen, start_pos)
    if start_pos > 0:
        rows = (torch.arange(visible_of(start_pos) // ratio) + offset)[None, :]
        return (rows.flip(-1) if descending else rows).int()
    j = torch.arange(seqlen // ratio)[None, :]
    visible = (visible_of(torch.arange(seqlen)) // ratio)[:, None]
    rows = torch.where(j >= visible, -1, j + offset)
    if descending:      # the valid entries newest first, −1 still at the tail
        rows = torch.where(rows >= 0, (visible - 1 - j) + offset, -1)
    return rows.int()


def _concat_variant(window_rows, compressed_rows, seqlen, start_pos, *, offset=None, shift_pads=False):
    """attention_index with the offset fixed, or −1 shifted along with the valid entries."""
    offset = ref.spec.kv_offset(seqlen, start_pos) if offset is None else offset
    compressed_rows = compressed_rows.long()
    shifted = compressed_rows + offset if shift_pads else torch.where(compressed_rows >= 0, compressed_rows + offset, -1)
    return torch.cat([window_rows.long(), shifted], -1).int()


def _ring_variant(prefill, decoded, *, first_128=False, unwritten=-1, decode_slot=0):
    """window_ring keeping the prefill's FIRST 128 positions, marking unwritten slots 0, or writing
    decode position p to slot (p + decode_slot) mod 128."""
    end = prefill + decoded
    ring = torch.full((128,), unwritten, dtype=torch.int64)
    written = torch.arange(0, min(prefill, 128)) if first_128 else torch.arange(max(0, prefill - 128), prefill)
    ring[written % 128] = written
    for p in range(prefill, end):
        ring[(p + decode_slot) % 128] = p
    return ring


def _fp8_blocks_of(block):
    """The window KV quantized with an E8M0 scale per `block` instead of per 32 (the bytes repeated per 32)."""
    def quantize(x, fmt):
        if fmt != "fp8_e8m0_32":
            return ref._quantize(x, fmt)
        q, s = ref.fp8_quantize(x, block)
        return q, s.repeat_interleave(block // 32, -1)
    return quantize


def _index_k_scale_per(block):
    """The index-K cache's QDQ with one power-of-two scale per `block` instead of per 32."""
    from dsv4spec.impl.quant import e2m1_decode, e2m1_encode

    def qdq(x, fmt):
        if fmt != "fp4_e8m0":
            return ref.kv_qdq(x, fmt)
        values = x.float().unflatten(-1, (-1, block))
        amax = values.abs().amax(-1, keepdim=True).clamp(min=6 * 2.0 ** -126)
        scale = torch.exp2(torch.ceil(torch.log2(amax / 6)))
        return (e2m1_decode(e2m1_encode((values / scale).clamp(-6, 6))) * scale).flatten(-2)
    return qdq


_k_norm = ref._rms_norm


def _fp8_linear_act_quant_per_128(x, w, w_scale, block):
    """act_quant of qr per 128 (V4's block) whatever b is, the weight's scales per b kept."""
    from dsv4spec.impl import quant as impl_quant
    real = impl_quant.fp8_quantize

    def per_128(v, b):
        q, s = real(v, 128)
        return q, s.repeat_interleave(128 // b, -1)
    with mock.patch.object(impl_quant, "fp8_quantize", per_128):
        return impl_quant.fp8_linear(x, w, w_scale, block)


def _hadamard_on_v41(model):
    """A profile with the Hadamard on: V4's index path on V4.1 too."""
    return replace(profile(model), hadamard=True)


def _rms_norm_in_bf16(x, w, eps):
    """k_norm in BF16 tensor ops: the square, the mean, the rsqrt and each product rounded to BF16."""
    b = ref._bf16
    return b(w * b(x * b(torch.rsqrt(b(b(x.square()).mean(-1, keepdim=True)) + eps))))


def _q_heads_interleaved(x, w, w_scale, block):
    """q unflattened head-minor: [T, 128, H] transposed, not [T, H, 128]."""
    from dsv4spec.impl.quant import fp8_linear
    q = fp8_linear(x, w, w_scale, block)
    H = w.shape[0] // 128
    return q.unflatten(-1, (128, H)).transpose(-1, -2).flatten(-2)


def _rms_norm_per_half(x, w, eps):
    """k_norm's mean taken over each half of 64 dims instead of all 128."""
    halves = x.unflatten(-1, (2, -1))
    return ref._bf16(w * (halves * torch.rsqrt(halves.square().mean(-1, keepdim=True) + eps)).flatten(-2))


def _main_kv_nope_only(x, positions, freqs, fmt):
    """The V4.1 main KV's FP4 E4M3/16 over the 448 NoPE dims only, the RoPE dims kept apart."""
    if fmt != "fp4_e4m3":
        return ref.rope_quantize(x, positions, freqs, fmt)
    return ref._quantize(ref.rope_rotate(x, positions, freqs)[..., :448].contiguous(), fmt)


def _index_q_rope_from_0(x, positions, freqs):
    """The index q (the [T, H, D] operand) rotated at t instead of start_pos + t."""
    return rope_ref.rope_rotate(x, positions - positions[0] if x.dim() == 3 else positions, freqs)


MUTANTS.update({
    "window_pads_with_own_position": (mutant("window_pads_with_own_position", window_index=lambda s, p: _window_variant(
        s, p, pad_with_own=True)), "PATH.WINDOW"),
    "ring_lists_positions_not_slots": (mutant("ring_lists_positions_not_slots", window_index=lambda s, p: _window_variant(
        s, p, raw_positions=True)), "PATH.WINDOW"),
    "window_rows_always_128_wide": (mutant("window_rows_always_128_wide", window_index=lambda s, p: _window_variant(
        s, p, width_128=True)), "PATH.WINDOW"),
    "hca_visible_i_over_ratio": (mutant("hca_visible_i_over_ratio", compressed_index=lambda s, p, **kw: _hca_variant(
        s, p, visible_of=lambda i: i, **kw)), "PATH.HCA"),
    "hca_descending": (mutant("hca_descending", compressed_index=lambda s, p, **kw: _hca_variant(
        s, p, descending=True, **kw)), "PATH.HCA"),
    "concat_offset_128_in_prefill": (mutant("concat_offset_128_in_prefill", attention_index=lambda w, c, s, p:
                                            _concat_variant(w, c, s, p, offset=128)), "PATH.CONCAT"),
    "concat_shifts_minus_one": (mutant("concat_shifts_minus_one", attention_index=lambda w, c, s, p:
                                       _concat_variant(w, c, s, p, shift_pads=True)), "PATH.CONCAT"),
    "ring_keeps_the_first_128": (mutant("ring_keeps_the_first_128", window_ring=lambda n, d: _ring_variant(
        n, d, first_128=True)), "PATH.WINDOW.RING"),
    "ring_unwritten_slots_zero": (mutant("ring_unwritten_slots_zero", window_ring=lambda n, d: _ring_variant(
        n, d, unwritten=0)), "PATH.WINDOW.RING"),
    "window_kv_scale_per_128": (mutant("window_kv_scale_per_128", kv_qdq=lambda x, fmt: ref._dequantize(
        *_fp8_blocks_of(128)(ref._bf16_values("kv_qdq", "x", x.float()), fmt), fmt)), "PATH.QDQ"),
    "window_kv_quantized_per_128_after_rope": (mutant("window_kv_quantized_per_128_after_rope", index_layer=None,
                                                      rope_quantize=lambda x, p, f, fmt: _fp8_blocks_of(128)(
                                                          ref.rope_rotate(x, p, f), fmt)), "PATH.ORDER"),
    "index_k_cache_scale_per_128": (mutant("index_k_cache_scale_per_128", kv_qdq=_index_k_scale_per(128)),
                                    "PATH.K.CACHE"),
    "pool_scan_ignores_visibility": (mutant("pool_scan_ignores_visibility",
                                            pool_scan_topk=pool_mutants._reindex_ignoring_visibility), "PATH.POOL_SCAN"),
    "pool_scan_masks_after_topk": (mutant("pool_scan_masks_after_topk",
                                          pool_scan_topk=pool_mutants._reindex_masking_after_topk), "PATH.POOL_SCAN"),
    "ring_decode_in_the_next_slot": (mutant("ring_decode_in_the_next_slot", window_ring=lambda n, d: _ring_variant(
        n, d, decode_slot=1)), "PATH.WINDOW.RING"),
    "q_heads_interleaved": (mutant("q_heads_interleaved", index_layer=_layer_with(fp8_linear=_q_heads_interleaved)),
                            "PATH.Q.PROJ"),
    "k_norm_per_half": (mutant("k_norm_per_half", index_layer=_layer_with(_rms_norm=_rms_norm_per_half)), "PATH.K.NORM"),
    "main_kv_rope_dims_not_quantized": (mutant("main_kv_rope_dims_not_quantized", index_layer=None,
                                               rope_quantize=_main_kv_nope_only), "PATH.ORDER"),
    "k_norm_eps_1e-6": (mutant("k_norm_eps_1e-6", index_layer=_layer_with(
        _rms_norm=lambda x, w, eps: _k_norm(x, w, 1e-6))), "PATH.K.NORM"),
    "q_act_quant_per_128_on_v41": (mutant("q_act_quant_per_128_on_v41", index_layer=_layer_with(
        fp8_linear=_fp8_linear_act_quant_per_128)), "PATH.Q.PROJ"),
    "k_norm_in_bf16_ops": (mutant("k_norm_in_bf16_ops", index_layer=_layer_with(_rms_norm=_rms_norm_in_bf16)),
                           "PATH.K.NORM"),
    "hadamard_in_v41_index_path": (mutant("hadamard_in_v41_index_path", index_layer=_layer_with(
        profile=_hadamard_on_v41)), "PATH.HADAMARD"),
    "index_q_rope_from_position_0": (mutant("index_q_rope_from_position_0", index_layer=_layer_with(
        rope_rotate=_index_q_rope_from_0)), "ROPE.POSITIONS"),
})


# A port that keeps one index-K cache per layer and always scores its own, fresh: at even decode
# positions the official V4.1 ratio-2 sources score layer 20's (PATH.K.PUBLISHED).
OWN_INDEX_K = _layer_with(_scored_keys=lambda op, inputs, m, layer, seqlen, start_pos, own_k: own_k)
MUTANTS["sources_score_their_own_index_k"] = (mutant("sources_score_their_own_index_k", index_layer=OWN_INDEX_K),
                                              "PATH.K.PUBLISHED")


# Layers keeping the index score in fp32 (score_rounding=fp32 declared, issue 40): weights never
# rounded to BF16, carrying `weights_factor(m)`; scores in fp32, times `scores_factor(m)` after the sum.
_index_scores = ref.index_scores


def _fp32_score_layer(weights_factor, scores_factor=lambda m: 1.0):
    def index_layer(inputs, *, model, layer, start_pos=0):
        m = profile(model)

        def index_weights(raw, model):
            return raw.float() * weights_factor(m)

        def index_scores(q, k, w, visible, score_dtype="bf16"):
            return _index_scores(q, k, w, visible, "fp32") * scores_factor(m)
        with mock.patch.multiple(ref, index_weights=index_weights, index_scores=index_scores):
            return ref.index_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    return mutant("fp32_scores", variants={"score_rounding": "fp32"}, index_layer=index_layer)


FP32_SCORE_LAYERS = {
    "official": _fp32_score_layer(lambda m: m.index_weight_scale),
    # 128^-0.5 applied to the summed scores, the weights carrying n^-0.5 alone: the same product
    "refactored": _fp32_score_layer(lambda m: m.index_n_heads ** -0.5, lambda m: m.index_head_dim ** -0.5),
}
# mistakes in such layers, and the stage each must fail
FP32_SCORE_LAYER_MISTAKES = {
    "main_head_dim_in_the_factor": (_fp32_score_layer(lambda m: (m.head_dim * m.index_n_heads) ** -0.5), "weights"),
    "refactored_without_the_scores_factor": (_fp32_score_layer(lambda m: m.index_n_heads ** -0.5), "scores"),
}
