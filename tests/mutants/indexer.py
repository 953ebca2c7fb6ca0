"""Indexer mutants: one realistic mistake each, with the rule that must report it."""
import torch

from dsv4spec.impl import indexer as ref
from dsv4spec.spec.models import profile

from . import mutant


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _scores(q, k, w, visible, score_dtype="bf16", *, relu_after_weight=False, masked_value=float("-inf"),
            one_cast=False, fp32_rounds=False):
    dots = torch.einsum("thd,sd->ths", q.float(), k.float())
    w = w.float()[:, :, None]
    if score_dtype == "bf16" and not one_cast or fp32_rounds:
        p = _bf16(torch.relu(w * _bf16(dots))) if relu_after_weight else _bf16(torch.relu(_bf16(dots)) * w)
        s = _bf16(p.sum(1))
    else:
        s = (torch.relu(dots) * w).sum(1)
        s = _bf16(s) if one_cast else s
    invisible = torch.arange(k.shape[0])[None, :] >= visible[:, None]
    return s.masked_fill(invisible, masked_value)


def _hadamard(x, scale=ref.spec.HADAMARD_SCALE, signs=None, rounded=True):
    x = x.float()
    if signs is not None:
        x = x * signs
    h = torch.tensor(ref.spec.sylvester_hadamard(), dtype=torch.float32)
    y = (x @ h.T) * scale
    return _bf16(y) if rounded else y


_SIGNS = torch.where(torch.arange(128) % 3 == 0, -1.0, 1.0)


def _topk(scores, visible, k, order, *, force=None, pad_first=False, unpadded=False, key=None, highest_ties=False):
    scores = scores.float()
    order = force or order
    T, S = scores.shape
    invisible = torch.arange(S)[None, :] >= visible[:, None]
    masked = scores.masked_fill(invisible, float("-inf"))
    if key is not None:
        masked = key(masked)
    if highest_ties:
        masked = masked.flip(1)
    idx = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :k]
    if highest_ties:
        idx = S - 1 - idx
    if unpadded:                                       # V3.2 style: no −1, masked picks kept
        return torch.sort(idx, dim=1).values if order == "position" else idx
    valid = idx < visible[:, None]
    idx = torch.where(valid, idx, -1)
    if order == "position":
        big = torch.where(idx < 0, S if not pad_first else -1, idx)
        idx = torch.sort(big, dim=1).values
        idx = torch.where((idx == S) | (idx < 0), -1, idx)
    return idx


def _decode_drops_newest(q, k, w, visible, score_dtype="bf16"):
    if q.shape[0] == 1:
        visible = (visible - 1).clamp(min=0)
    return ref.index_scores(q, k, w, visible, score_dtype)


def _local_head_factor(q, k, w, visible, score_dtype="bf16"):
    """Weights renormalized by the local head count (calibrated for 32 heads)."""
    return ref.index_scores(q, k, _bf16(w * (32 / q.shape[1]) ** 0.5), visible, score_dtype)


def _fp4_nibbles_swapped(q_packed, q_scales, k_packed, k_scales, w, visible):
    swap = lambda p: (p >> 4) | ((p & 0xF) << 4)  # noqa: E731
    return ref.index_scores_fp4(q_packed, q_scales, swap(k_packed), k_scales, w, visible)  # K reader only


def _fp8_scores_in_bf16(q_codes, k_codes, k_scale, w, visible):
    """V3.2's FP8 logits with V4's BF16 score steps, the weights rounded to BF16 (the newer models' habit)."""
    k = ref.e4m3_decode(k_codes) * k_scale.float()[:, None]
    return ref.index_scores(ref.e4m3_decode(q_codes), k, w.bfloat16().float(), visible, "bf16")


def _fp8_cache_scale_as_e8m0(q_codes, cache, form, w, visible):
    """V3.2's indexer K cache whose fp32 scale is decoded from its exponent bits with a bias of 128, not 127."""
    import numpy as np
    from dsv4spec.spec import layout as spec_layout
    entries = spec_layout.cache_entries(form, cache.numpy())
    exponent = (entries[:, 131].astype(np.int64) & 0x7F) * 2 + (entries[:, 130] >> 7)    # the fp32 exponent bits
    k = ref.e4m3_decode(torch.from_numpy(entries[:, :128].copy())) * torch.from_numpy(2.0 ** (exponent - 128.0)).float()[:, None]
    return ref.index_scores(ref.e4m3_decode(q_codes), k, w, visible, "fp32")


MUTANTS = {
    # name: (provider, rule it must fail)
    "visible_p_floor": (mutant("visible_p_floor", index_visible=lambda p, r: torch.div(p, r, rounding_mode="floor")),
                        "IDX.VISIBLE"),
    "visible_p_plus_2": (mutant("visible_p_plus_2", index_visible=lambda p, r: torch.div(p + 2, r, rounding_mode="floor")),
                         "IDX.VISIBLE"),
    "relu_after_weight": (mutant("relu_after_weight", index_scores=lambda *a: _scores(*a, relu_after_weight=True)),
                          "IDX.SCORE.FORMULA"),
    "weight_factor_missing": (mutant("weight_factor_missing", index_weights=lambda raw, model: _bf16(raw.float())),
                              "IDX.WEIGHT.SCALE"),
    "weight_factor_bf16": (mutant("weight_factor_bf16", index_weights=lambda raw, model: _bf16(
        raw.float() * _bf16(torch.tensor(ref.profile(model).index_weight_scale)))), "IDX.WEIGHT.SCALE"),
    "weight_factor_local_heads": (mutant("weight_factor_local_heads", index_scores=_local_head_factor), "IDX.SCORE.TP"),
    "masked_scores_zero": (mutant("masked_scores_zero", index_scores=lambda *a: _scores(*a, masked_value=0.0)),
                           "IDX.MASK"),
    "fp32_then_one_cast": (mutant("fp32_then_one_cast", index_scores=lambda *a: _scores(*a, one_cast=True)),
                           "IDX.SCORE.ROUNDING"),
    "v32_rounded_to_bf16": (mutant("v32_rounded_to_bf16", index_scores=lambda *a: _scores(*a, fp32_rounds=True)),
                            "IDX.SCORE.V32_FP32"),
    "fp4_k_nibbles_swapped": (mutant("fp4_k_nibbles_swapped", index_scores_fp4=_fp4_nibbles_swapped), "IDX.SCORE.FP4"),
    "fp8_scores_rounded_to_bf16": (mutant("fp8_scores_rounded_to_bf16", index_scores_fp8=_fp8_scores_in_bf16),
                                   "IDX.SCORE.V32_FP32"),
    "fp8_cache_scale_as_e8m0": (mutant("fp8_cache_scale_as_e8m0", index_scores_fp8_cache=_fp8_cache_scale_as_e8m0),
                                "IDX.SCORE.V32_FP32"),
    "decode_drops_newest": (mutant("decode_drops_newest", index_scores=_decode_drops_newest), "IDX.CHUNK"),
    "hadamard_unnormalized": (mutant("hadamard_unnormalized", hadamard=lambda x: _hadamard(x, scale=1.0)),
                              "HAD.MATRIX"),
    "hadamard_random_signs": (mutant("hadamard_random_signs", hadamard=lambda x: _hadamard(x, signs=_SIGNS)),
                              "HAD.MATRIX"),
    "hadamard_not_rounded": (mutant("hadamard_not_rounded", hadamard=lambda x: _hadamard(x, rounded=False)),
                             "HAD.ROUNDING"),
    "hadamard_in_v41": (mutant("hadamard_in_v41", index_rotate=lambda x, model: _hadamard(x)), "HAD.ABSENT_V41"),
    "v4_order_in_v41": (mutant("v4_order_in_v41", index_topk=lambda s, v, k, o: _topk(s, v, k, o, force="score")),
                        "IDX.TOPK.ORDER"),
    "minus_one_first": (mutant("minus_one_first", index_topk=lambda s, v, k, o: _topk(s, v, k, o, pad_first=True)),
                        "IDX.TOPK.PAD"),
    "no_minus_one": (mutant("no_minus_one", index_topk=lambda s, v, k, o: _topk(s, v, k, o, unpadded=True)),
                     "IDX.TOPK.COUNT"),
    "topk_of_magnitude": (mutant("topk_of_magnitude", index_topk=lambda s, v, k, o: _topk(
        s, v, k, o, key=lambda m: torch.where(torch.isinf(m), m, m.abs()))), "IDX.TOPK.SELECTION"),
    "ties_highest_declared_lowest": (mutant("ties_highest_declared_lowest", variants={"topk_ties": "lowest_index"},
                                            index_topk=lambda s, v, k, o: _topk(s, v, k, o, highest_ties=True)),
                                     "IDX.TOPK.TIES"),
}


def _scale_after_relu(q, k, raw_w, visible, model):
    """softmax_scale on the ReLU'd score and the head factor on the raw weights (a serving fork's
    factorisation): equal in real arithmetic, rounded differently."""
    m = profile(model)
    w = _bf16(raw_w.float() * m.index_n_heads ** -0.5)
    return _bf16(ref.index_scores(q, k, w, visible) * m.index_head_dim ** -0.5)


MUTANTS["scale_after_relu"] = (mutant("scale_after_relu", index_scores_raw=_scale_after_relu), "IDX.WEIGHT.SCALE")


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()]


# Boundary mutants (issue 8; tests/mutants/BOUNDARIES.md).
def _head_sum_in_bf16(q, k, w, visible, score_dtype="bf16"):
    """Heads accumulated one by one in BF16 (each partial sum rounded) instead of fp32 then one rounding."""
    if score_dtype != "bf16":
        return ref.index_scores(q, k, w, visible, score_dtype)
    p = _bf16(torch.relu(_bf16(torch.einsum("thd,sd->ths", q.float(), k.float()))) * w.float()[:, :, None])
    s = torch.zeros_like(p[:, 0])
    for h in range(p.shape[1]):
        s = _bf16(s + p[:, h])
    invisible = torch.arange(k.shape[0])[None, :] >= visible[:, None]
    return s.masked_fill(invisible, float("-inf"))


MUTANTS.update({
    "head_sum_in_bf16": (mutant("head_sum_in_bf16", index_scores=_head_sum_in_bf16), "IDX.SCORE.ROUNDING"),
    "masked_scores_finfo_min": (mutant("masked_scores_finfo_min", index_scores=lambda *a: _scores(
        *a, masked_value=torch.finfo(torch.float32).min)), "IDX.MASK"),
    "topk_ties_keep_fewer": (mutant("topk_ties_keep_fewer", index_topk=lambda s, v, k, o: _topk_ties_dropped(
        s, v, k, o)), "IDX.TOPK.COUNT"),
})


def _topk_ties_dropped(scores, visible, k, order):
    """A threshold top-k: where a tie straddles the k-th place, the tied entries are dropped (−1)."""
    idx = ref.index_topk(scores, visible, k, order)
    out = idx.clone()
    for t in range(idx.shape[0]):
        n, row, chosen = int(visible[t]), scores[t].float(), idx[t]
        if 0 < k < n:
            kth = torch.sort(row[:n], descending=True).values[k - 1]
            picked = chosen >= 0
            if (row[:n] == kth).sum() > (row[chosen[picked]] == kth).sum():
                out[t] = torch.where(picked & (row[chosen.clamp(min=0)] == kth), -1, chosen)
    return _pad_tail(out)


def _pad_tail(idx):
    out = torch.full_like(idx, -1)
    for t, row in enumerate(idx):
        valid = row[row >= 0]
        out[t, :valid.numel()] = valid
    return out


def _topk_of_fp16(scores, visible, k, order):
    """Top-k ranked on the scores cast to fp16 (an engine's half-precision logits): BF16 scores
    beyond ±65504 become ±inf and below 2^-24 become 0, so distinct scores tie."""
    return _topk(scores.to(torch.float16).float(), visible, k, order)


MUTANTS.update({
    "topk_of_fp16_scores": (mutant("topk_of_fp16_scores", index_topk=_topk_of_fp16), "IDX.TOPK.SELECTION"),
})


def _relu_of_head_sum(q, k, w, visible, score_dtype="bf16"):
    """ReLU applied once to the weighted head sum instead of to each head's dot."""
    dots = _bf16(torch.einsum("thd,sd->ths", q.float(), k.float()))
    s = _bf16(torch.relu(_bf16(_bf16(dots * w.float()[:, :, None]).sum(1))))
    invisible = torch.arange(k.shape[0])[None, :] >= visible[:, None]
    return s.masked_fill(invisible, float("-inf"))


MUTANTS.update({
    "relu_of_head_sum": (mutant("relu_of_head_sum", index_scores=_relu_of_head_sum), "IDX.SCORE.FORMULA"),
    "pads_with_index_zero": (mutant("pads_with_index_zero", index_topk=lambda s, v, k, o: ref.index_topk(
        s, v, k, o).clamp(min=0)), "IDX.TOPK.PAD"),
})


def _flushed(x):
    """GPU fast-math (FTZ): a subnormal result flushed to zero, sign kept."""
    return torch.where(x.abs() < 2.0 ** -126, x * 0, x)


MUTANTS.update({
    # fast-math weights: subnormal head weights flushed to zero (BF16 and fp32 hold them)
    "weights_subnormal_flushed": (mutant("weights_subnormal_flushed", index_weights=lambda raw, model: _flushed(
        ref.index_weights(raw, model))), "IDX.WEIGHT.SCALE"),
    "v32_weights_subnormal_flushed": (mutant("v32_weights_subnormal_flushed", index_weights_v32=lambda raw, qs:
                                             _flushed(ref.index_weights_v32(raw, qs))), "IDX.WEIGHT.V32"),
    # V3.2's weight rounded to BF16 at the end, as V4's folded weight is
    "v32_weights_in_bf16": (mutant("v32_weights_in_bf16", index_weights_v32=lambda raw, qs: _bf16(
        ref.index_weights_v32(raw, qs))), "IDX.WEIGHT.V32"),
    # the FP8 q scale left out of the weight (applied nowhere)
    "v32_weights_without_q_scale": (mutant("v32_weights_without_q_scale", index_weights_v32=lambda raw, qs:
                                           ref.index_weights_v32(raw, torch.ones_like(qs))), "IDX.WEIGHT.V32"),
})


# Every clause reachable (issue 22): one mutant per statement clause no mutant above changes alone.
def _bit_reversed(x):
    idx = torch.tensor([int(f"{i:07b}"[::-1], 2) for i in range(128)])
    return x[..., idx]


def _hadamard_blocks_of_64(x):
    """Two 64-point transforms (a kernel's tile) scaled by 64^-0.5, not one over the 128 dims."""
    h = torch.tensor(ref.spec.sylvester_hadamard(), dtype=torch.float32)[:64, :64]
    xb = x.float().reshape(*x.shape[:-1], 2, 64)
    return _bf16((xb @ h.T * 0.125).flatten(-2))


def _hadamard_butterfly_in_bf16(x):
    """The butterfly with each of its 7 stages rounded to BF16 (a BF16 working tensor)."""
    y = x.float().reshape(-1, 128).clone()
    h = 1
    while h < 128:
        y = y.view(-1, 128 // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = _bf16(torch.stack((a + b, a - b), dim=2))
        h *= 2
    return _bf16(y.reshape(x.shape) * ref.spec.HADAMARD_SCALE)


def _weights(raw, factor, rounded=True):
    w = raw.float() * torch.tensor(factor, dtype=torch.float32)
    return _bf16(w) if rounded else w


def _v32_weights(raw, q_scale, *, head_factor=True, softmax_scale=True):
    heads = _bf16(raw.float() * (64 ** -0.5 if head_factor else 1.0))
    w = (heads.double() * q_scale.double()).float()
    return w * torch.tensor(128 ** -0.5, dtype=torch.float32) if softmax_scale else w


def _scores_rounded(q, k, w, visible, score_dtype="bf16", *, dot_bf16=True, sum_bf16=True, mask_shift=0):
    if score_dtype != "bf16":
        return ref.index_scores(q, k, w, visible, score_dtype)
    dots = torch.einsum("thd,sd->ths", q.float(), k.float())
    p = _bf16(torch.relu(_bf16(dots) if dot_bf16 else dots) * w.float()[:, :, None])
    s = _bf16(p.sum(1)) if sum_bf16 else p.sum(1)
    invisible = torch.arange(k.shape[0])[None, :] >= (visible[:, None] + mask_shift)
    return s.masked_fill(invisible, float("-inf"))


def _dot_accumulated_in_bf16(q, k, w, visible, score_dtype="bf16"):
    """Each head's dot accumulated in a BF16 register (every partial sum rounded), not in fp32."""
    if score_dtype != "bf16":
        return ref.index_scores(q, k, w, visible, score_dtype)
    q, k = q.float(), k.float()
    dots = torch.zeros(q.shape[0], q.shape[1], k.shape[0])
    for d in range(q.shape[2]):
        dots = _bf16(dots + q[:, :, d, None] * k[None, None, :, d])
    s = _bf16((_bf16(torch.relu(dots) * w.float()[:, :, None])).sum(1))
    return s.masked_fill(torch.arange(k.shape[0])[None, :] >= visible[:, None], float("-inf"))


def _topk_merge_duplicates(scores, visible, k, order):
    """A top-k merged from two halves that keeps a tied entry twice: the last valid slot repeats the first."""
    idx = ref.index_topk(scores, visible, k, order).clone()
    for t in range(idx.shape[0]):
        valid = int((idx[t] >= 0).sum())
        if valid >= 2:
            idx[t, valid - 1] = idx[t, 0]
    return idx


def _fp4_k_scale_bias_128(q_packed, q_scales, k_packed, k_scales, w, visible):
    """The K reader decodes its E8M0 scales as 2^(byte − 128)."""
    return ref.index_scores_fp4(q_packed, q_scales, k_packed, (k_scales.to(torch.int64) - 1).clamp(min=0).to(
        torch.uint8), w, visible)


MUTANTS.update({
    "hadamard_bit_reversed_order": (mutant("hadamard_bit_reversed_order", hadamard=lambda x: _bit_reversed(
        _hadamard(x))), "HAD.MATRIX"),
    "hadamard_blocks_of_64": (mutant("hadamard_blocks_of_64", hadamard=_hadamard_blocks_of_64), "HAD.MATRIX"),
    "hadamard_butterfly_in_bf16": (mutant("hadamard_butterfly_in_bf16", hadamard=_hadamard_butterfly_in_bf16),
                                   "HAD.ROUNDING"),
    # the factor of the main attention's head count (n_heads), not index_n_heads
    "weight_factor_attention_heads": (mutant("weight_factor_attention_heads", index_weights=lambda raw, model: _weights(
        raw, (profile(model).index_head_dim * profile(model).n_heads) ** -0.5)), "IDX.WEIGHT.SCALE"),
    "weight_factor_without_head_dim": (mutant("weight_factor_without_head_dim", index_weights=lambda raw, model:
                                              _weights(raw, profile(model).index_n_heads ** -0.5)), "IDX.WEIGHT.SCALE"),
    "weights_left_fp32": (mutant("weights_left_fp32", index_weights=lambda raw, model: _weights(
        raw, profile(model).index_weight_scale, rounded=False)), "IDX.WEIGHT.SCALE"),
    "v32_weights_without_head_factor": (mutant("v32_weights_without_head_factor", index_weights_v32=lambda raw, qs:
                                               _v32_weights(raw, qs, head_factor=False)), "IDX.WEIGHT.V32"),
    "v32_weights_without_softmax_scale": (mutant("v32_weights_without_softmax_scale", index_weights_v32=lambda raw, qs:
                                                 _v32_weights(raw, qs, softmax_scale=False)), "IDX.WEIGHT.V32"),
    "dot_accumulated_in_bf16": (mutant("dot_accumulated_in_bf16", index_scores=_dot_accumulated_in_bf16),
                                "IDX.SCORE.ROUNDING"),
    # V4.1's habit in V3.2 and V4: the indexer q and k not rotated
    "index_rotate_identity": (mutant("index_rotate_identity", index_rotate=lambda x, model: _bf16(x.float())),
                                    "HAD.MATRIX"),
    "dot_left_fp32": (mutant("dot_left_fp32", index_scores=lambda *a: _scores_rounded(*a, dot_bf16=False)),
                      "IDX.SCORE.ROUNDING"),
    "score_left_fp32": (mutant("score_left_fp32", index_scores=lambda *a: _scores_rounded(*a, sum_bf16=False)),
                        "IDX.SCORE.ROUNDING"),
    "fp4_k_scale_bias_128": (mutant("fp4_k_scale_bias_128", index_scores_fp4=_fp4_k_scale_bias_128), "IDX.SCORE.FP4"),
    "mask_leaves_first_invisible": (mutant("mask_leaves_first_invisible", index_scores=lambda *a: _scores_rounded(
        *a, mask_shift=1)), "IDX.MASK"),
    "mask_hides_newest_visible": (mutant("mask_hides_newest_visible", index_scores=lambda *a: _scores_rounded(
        *a, mask_shift=-1)), "IDX.MASK"),
    "v41_order_in_v4": (mutant("v41_order_in_v4", index_topk=lambda s, v, k, o: _topk(s, v, k, o, force="position")),
                        "IDX.TOPK.ORDER"),
    "topk_merge_duplicates": (mutant("topk_merge_duplicates", index_topk=_topk_merge_duplicates), "IDX.TOPK.COUNT"),
    "fp4_scores_left_fp32": (mutant("fp4_scores_left_fp32", index_scores_fp4=lambda qp, qs, kp, ks, w, v: _scores_rounded(
        ref.fp4_e8m0_dequantize(qp, qs), ref.fp4_e8m0_dequantize(kp, ks), w, v, sum_bf16=False)), "IDX.SCORE.FP4"),
    # a result of max(k, 1) columns: nothing compressed yet gives one column of −1, not an empty tensor
    "topk_k0_one_column": (mutant("topk_k0_one_column", index_topk=lambda s, v, k, o: ref.index_topk(s, v, k, o) if k
                                  else torch.full((s.shape[0], 1), -1, dtype=torch.int64)), "IDX.TOPK.COUNT"),
})


# A port of V3.2 alone (MODELS = ("v3.2",)): fp32 scores whatever dtype is asked (its indexer has
# one), entries of V3.2's two kinds only, FP8 in blocks of 128 only.  `scores` replaces its scoring (a mistake on V3.2).
V32_KINDS = ("v32_index_k", "v32_mla_kv")


def v32_port(name="v32_port", scores=lambda q, k, w, visible: ref.index_scores(q, k, w, visible, "fp32")):
    import dsv4spec.impl as impl

    def v32_kind(op):
        def call(kind, x):
            if kind not in V32_KINDS:
                raise ValueError(f"a V3.2 port packs {V32_KINDS}, not {kind!r}")
            return op(kind, x)
        return call
    def fp8_quantize(x, block):
        if block != 128:
            raise ValueError(f"a V3.2 port quantizes in blocks of 128, not {block}")
        return impl.fp8_quantize(x, block)
    return mutant(name, base=object(), MODELS=("v3.2",), index_visible=impl.index_visible, fp8_quantize=fp8_quantize,
                  index_scores=lambda q, k, w, visible, score_dtype="fp32": scores(q, k, w, visible),
                  entry_pack=v32_kind(impl.entry_pack), entry_unpack=v32_kind(impl.entry_unpack))


def _v32_scores_rounded_to_bf16(q, k, w, visible):
    """V4's habit in a V3.2 port: the scores rounded to BF16 at every step."""
    return ref.index_scores(q, k, w, visible, "bf16")


# Ports keeping the index score in fp32 (score_rounding=fp32 declared): weights raw · factor in fp32,
# never rounded to BF16 (issue 40); `heads` the head count of the factor (the global one is right).
def fp32_score_port(name="fp32_scores", heads=lambda m: m.index_n_heads):
    def index_weights(raw, model):
        m = profile(model)
        return raw.float() * (m.index_head_dim * heads(m)) ** -0.5
    return mutant(name, variants={"score_rounding": "fp32"}, index_weights=index_weights, index_layer=None,
                  index_scores=lambda q, k, w, visible, score_dtype="bf16": ref.index_scores(q, k, w, visible, "fp32"))


MUTANTS["fp32_weights_of_a_shards_heads"] = (fp32_score_port("fp32_weights_of_a_shards_heads",
                                                             heads=lambda m: m.index_n_heads // 2), "IDX.WEIGHT.SCALE")
