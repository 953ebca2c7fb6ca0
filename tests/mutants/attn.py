"""Sparse attention mutants: one realistic mistake each, with the rule that must report it."""
import contextlib
import math
from unittest import mock

import torch

from dsv4spec.impl import attn as ref
from dsv4spec.impl import path as path_ref
from dsv4spec.impl import rope as rope_ref

from . import mutant
from . import path as path_mutants
from .quant import fp8_linear_act_block_of_the_other_model, fp8_linear_without_act_quant


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _attention(q, kv, sink, indices, scale, *, model, sink_mode="denominator", init=None, probs="bf16",
               maxima="running", dedupe=False, gather="masked", scores="fp32", fixed_scale=None,
               rescale_acc=True, output="bf16", rescale_total=True, block=None, sink_scaled=False,
               total_of="fp32"):
    """impl's online softmax with one step done another way."""
    q, kv, sink, indices, scale = ref.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    if fixed_scale is not None:
        scale = torch.tensor(fixed_scale, dtype=torch.float32)
    if dedupe:
        indices = indices.clone()
        for row in indices:
            seen = set()
            for j, i in enumerate(row.tolist()):
                if i in seen:
                    row[j] = -1
                seen.add(i)
    if gather == "tail_only":                   # −1 taken as padding at the tail: the list cut at its first −1
        indices = indices.clone()
        for row in indices:
            first = (row == -1).nonzero()
            if first.numel():
                row[int(first[0]):] = -1
        gather = "masked"
    T, H, D = q.shape
    if maxima == "global":                      # every probability rounded against the final max
        valid = indices != -1
        s_all = torch.einsum("thd,tkd->thk", q, kv[indices.clamp_min(0)]) * scale
        final = s_all.masked_fill(~valid[:, None, :], float("-inf")).amax(-1)
    if sink_scaled:                             # the sink treated as a score: times softmax_scale
        sink = sink * scale
    block = block or ref.spec.BLOCK
    acc, total = torch.zeros(T, H, D), torch.zeros(T, H)
    m = torch.full((T, H), ref.spec.running_max_init(ref.spec.model_of(model)) if init is None else init)
    for start in range(0, indices.shape[1], block):
        idx = indices[:, start:start + block]
        valid = idx != -1
        rows = kv[idx.clamp_min(0)] * (valid[..., None] if gather == "masked" else 1.0)
        s = torch.einsum("thd,tbd->thb", q, rows) * scale
        s = _bf16(s) if scores == "bf16" else s
        if gather == "masked":
            s = s.masked_fill(~valid[:, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        rescale = torch.exp(m - m_new)
        if maxima == "global":
            p = torch.exp(s - m_new[..., None])
            pv = _bf16(torch.exp(s - final[..., None])) * torch.exp(final - m_new)[..., None]
        else:
            p = torch.exp(s - m_new[..., None])
            pv = p if probs == "fp32" else _truncated_bf16(p) if probs == "truncated" else _bf16(p)
        summed = pv if total_of == "rounded" else p
        total = (total * rescale if rescale_total else total) + summed.sum(-1)
        acc = (acc * rescale[..., None] if rescale_acc else acc) + torch.einsum("thb,tbd->thd", pv, rows)
        m = m_new
    sink_term = torch.exp(sink[None, :] - m)
    if sink_mode != "none":
        total = total + sink_term
    if sink_mode == "numerator":
        acc = acc + sink_term[..., None]
    out = acc / total[..., None]
    return out if output == "fp32" else _bf16(out)


def softmax_then_bf16(q, kv, sink, indices, scale, *, model):
    """A framework's attention: fp32 scores, the softmax over [scores | sink] in fp32 (normalised),
    the probabilities cast to BF16, then a BF16 P·V with fp32 sums (attn_probs=normalized)."""
    q, kv, sink, indices, scale = ref.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    valid = indices != -1
    rows = kv[indices.clamp_min(0)] * valid[..., None]
    s = (torch.einsum("thd,tkd->thk", q, rows) * scale).masked_fill(~valid[:, None, :], float("-inf"))
    init = torch.tensor(ref.spec.running_max_init(ref.spec.model_of(model)))
    M = torch.maximum(s.amax(-1), init)
    e = torch.exp(s - M[..., None])
    total = e.sum(-1) + torch.exp(sink[None, :] - M)
    return _bf16(torch.einsum("thk,tkd->thd", _bf16(e / total[..., None]), rows))


def _truncated_bf16(x):
    """BF16 by dropping the low 16 bits (round toward zero), not RNE."""
    return (x.contiguous().view(torch.int32) & -65536).view(torch.float32)


def _variant(**options):
    return lambda q, kv, sink, indices, scale, *, model: _attention(q, kv, sink, indices, scale, model=model,
                                                                    **options)


def _scale_with_yarn_mscale(model, layer):
    """DeepSeek-V3's attention factor (0.1·ln(16) + 1)² carried over to the compressed layers."""
    factor = (0.1 * math.log(16) + 1) ** 2 if ref.spec.model_of(model).ratio(layer) else 1.0
    return ref.attention_scale(model, layer) * factor


def _scale_of_the_nope_dims(model, layer):
    """448^-0.5: the scale of the NoPE channels alone, not of the whole 512-dim head."""
    return 448 ** -0.5


def _q_norm_always(q, *, model):
    return ref.attention_q(q, model="v4-flash")


def _q_norm_never(q, *, model):
    return ref.attention_q(q, model="v4.1-flash")


def _q_norm_with_eps(eps):
    def attention_q(q, *, model):
        """V4's q rescale with another eps (V4.1's 1e-20) in place of norm_eps = 1e-6."""
        if model in ref.spec.V41:
            return q.float()
        qb = q.to(torch.bfloat16)
        return (qb * torch.rsqrt(qb.square().mean(-1, keepdim=True) + eps)).float()
    return attention_q


def _q_norm_in_fp32(q, *, model):
    """V4's q rescale computed in fp32 and left unrounded."""
    qf = q.float()
    if model in ref.spec.V41:
        return qf
    return qf * torch.rsqrt(qf.square().mean(-1, keepdim=True) + ref.spec.model_of(model).norm_eps)


def _q_norm_in_fp32_rounded_once(q, *, model):
    """V4's q rescale computed in fp32 (the factor never rounded to BF16), the product rounded once."""
    return _q_norm_in_fp32(q, model=model).to(torch.bfloat16).float()


def _derotate_first_64(o, positions, freqs):
    """The de-rotation applied to channels 0..63 instead of the last 64."""
    o = o.float()
    rd = 2 * freqs.shape[0]
    head = ref.attention_output(o[..., :rd].contiguous(), positions, freqs)
    return torch.cat([head, o[..., rd:]], -1)


def _derotate_plus(o, positions, freqs):
    return ref.attention_output(o, positions, -freqs)


def _layer_with(**patches):
    """impl's attention_layer with one of its steps done another way (every other stage follows
    from the target's own broken one, as the teacher-forced check expects)."""
    def attention_layer(inputs, *, model, layer, start_pos=0):
        with mock.patch.multiple(ref, **patches):
            return ref.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    return attention_layer


def _layer_deduplicating_tokens(inputs, *, model, layer, start_pos=0):
    """impl's attention_layer that drops a ratio-1 compressed entry (entry j is token j) whose token
    also has a window row in the query's window (j > position − 128): each token attended once."""
    m = ref.spec.model_of(model)
    if m.ratio(layer) != 1:
        return ref.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    attend = ref.sparse_attention

    def sparse_attention(q, kv, sink, indices, scale, *, model):
        T, entries = q.shape[0], start_pos + q.shape[0]
        offset = kv.shape[0] - entries
        token = indices.long() - offset
        position = torch.arange(start_pos, start_pos + T)[:, None]
        in_window = (indices >= offset) & (token > position - m.window)
        return attend(q, kv, sink, torch.where(in_window, -1, indices), scale, model=model)

    with mock.patch.object(ref, "sparse_attention", sparse_attention):
        return ref.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)


_fp8_projection = ref._fp8_projection


def _bf16_projection_at(weight):
    """impl's attention_layer whose projection by `weight` is a BF16 GEMM (the dequantized weight
    times x, no act_quant): a port that runs the main attention's linears in BF16."""
    def projection(op, inputs, name, x, rows, block):
        if name != weight:
            return _fp8_projection(op, inputs, name, x, rows, block)
        return fp8_linear_without_act_quant(x, inputs[name], inputs[f"{name}_scale"], block)
    return _layer_with(_fp8_projection=projection)


def _act_quant_per_128_at(weight):
    """impl's attention_layer whose FP8 linear by `weight` takes act_quant per 128 in V4.1 (V4's
    block_size; the weight's blocks of 32 stay right): a port that kept V4's act block."""
    def projection(op, inputs, name, x, rows, block):
        if name != weight or block != 32:
            return _fp8_projection(op, inputs, name, x, rows, block)
        return fp8_linear_act_block_of_the_other_model(x, inputs[name], inputs[f"{name}_scale"], block)
    return _layer_with(_fp8_projection=projection)


_rms_norm = ref._rms_norm


def _rms_norm_with_v4_eps(x, weight, eps):
    """The attention's RMSNorms with V4's norm_eps 1e-6 whatever the model's (V4.1's is 1e-20)."""
    return _rms_norm(x, weight, 1e-6)


_grouped_product = ref.grouped_product
OUTPUT_CONTRACT = 7     # the output projections' mutants declare it: only then is a layer given wo_a and wo_b


def _wo_a_product_in_fp32(o, wo_a):
    """The grouped product of o and wo_a left in fp32 (a port whose einsum accumulates and returns fp32)."""
    g = o[0].numel() // wo_a.shape[1]
    return torch.einsum("tgd,grd->tgr", o.reshape(o.shape[0], g, -1), wo_a.view(g, -1, wo_a.shape[1]))


def _wo_a_heads_round_robin(o, wo_a):
    """The heads dealt to the groups in turn (head h to group h mod g), not in runs of H/g."""
    g = o[0].numel() // wo_a.shape[1]
    return _grouped_product(o.unflatten(1, (-1, g)).transpose(1, 2), wo_a)


_attention_output = ref.attention_output


class LayerWithoutTable:
    """A port that wraps its attention block and nothing else (no rope_freqs): its rotations are judged
    on the spec's fp32 table and its slack.  `derotate_at` moves the de-rotation's positions."""
    CONTRACT = OUTPUT_CONTRACT

    def __init__(self, derotate_at=lambda positions: positions):
        self.attention_layer = _layer_with(
            attention_output=lambda o, positions, freqs: _attention_output(o, derotate_at(positions), freqs))


# the stage each layer mutant breaks first (tests/test_attn.py asserts the check names it)
LAYER_STAGE = {"layer_wq_a_in_bf16": "q_latent", "layer_wq_b_in_bf16": "q_attn", "layer_wkv_in_bf16": "kv_proj",
               "layer_q_not_rescaled_on_v4": "q_rescale", "layer_window_kv_not_quantized": "kv_window",
               "layer_compressed_kv_not_quantized": "cmp", "layer_attention_without_sink": "o",
               "layer_output_not_derotated": "o_derot", "layer_wo_a_product_in_fp32": "o_lora",
               "layer_wo_a_heads_round_robin": "o_lora", "layer_wo_b_in_bf16": "out",
               "layer_wkv_act_quant_per_128_on_v41": "kv_proj", "layer_wo_b_act_quant_per_128_on_v41": "out",
               "layer_norm_eps_of_v4_on_v41": "q_norm"}


def _int32_lists_read_as_row_0(q, kv, sink, indices, scale, *, model):
    """A port whose gather of an int32, expanded index reads every listed row as row 0 (as torch's
    gather once did); int64 lists are read right."""
    if indices.dtype == torch.int32:
        indices = torch.where(indices == -1, indices, torch.zeros_like(indices))
    return ref.sparse_attention(q, kv, sink, indices, scale, model=model)


def _reduce_in_bf16(partials):
    """The all-reduce summed in BF16: a rounding after each rank's addition."""
    y = partials[0].to(torch.bfloat16)
    for rank in partials[1:]:
        y = y + rank.to(torch.bfloat16)
    return y.float()


def _m(name, rule_id, **ops):
    return name, (mutant(name, **ops), rule_id)


def _cache_attention_without_sink(q, cache, form, sink, indices, scale, *, model):
    """Attention over the packed cache with the sink left out of the denominator."""
    return ref.sparse_attention_cache(q, cache, form, torch.full_like(sink, -math.inf), indices, scale, model=model)


MUTANTS = dict([
    _m("minus_one_reads_row_0", "ATTN.GATHER", sparse_attention=_variant(gather="clamped")),
    _m("all_reduce_in_bf16", "ATTN.TP.REDUCE", row_parallel_reduce=_reduce_in_bf16),
    _m("all_reduce_left_fp32", "ATTN.TP.REDUCE", row_parallel_reduce=lambda partials: partials.float().sum(0)),
    _m("duplicates_removed", "ATTN.DUPLICATES", sparse_attention=_variant(dedupe=True)),
    # judged as sparse_attention through sparse_attention_cache (a target with only the cache form)
    _m("cache_attention_without_sink", "ATTN.SINK", sparse_attention=None,
       sparse_attention_cache=_cache_attention_without_sink),
    _m("running_max_from_minus_inf_on_v41", "ATTN.INIT", sparse_attention=_variant(init=float("-inf"))),
    _m("scores_rounded_to_bf16", "ATTN.SCORE", sparse_attention=_variant(scores="bf16")),
    _m("scale_argument_ignored", "ATTN.SCORE", sparse_attention=_variant(fixed_scale=512 ** -0.5)),
    _m("yarn_factor_in_the_scale", "ATTN.SCALE", attention_scale=_scale_with_yarn_mscale),
    _m("scale_of_the_nope_dims", "ATTN.SCALE", attention_scale=_scale_of_the_nope_dims),
    _m("fp32_probabilities", "ATTN.PROB.BF16", sparse_attention=_variant(probs="fp32")),
    _m("probabilities_rounded_against_the_global_max", "ATTN.PROB.ORDER", sparse_attention=_variant(maxima="global")),
    _m("output_accumulator_not_rescaled", "ATTN.RESCALE", sparse_attention=_variant(rescale_acc=False)),
    _m("denominator_not_rescaled", "ATTN.RESCALE", sparse_attention=_variant(rescale_total=False)),
    _m("probabilities_in_blocks_of_32", "ATTN.PROB.ORDER", sparse_attention=_variant(block=32)),
    _m("sink_scaled_by_softmax_scale", "ATTN.SINK", sparse_attention=_variant(sink_scaled=True)),
    _m("no_sink", "ATTN.SINK", sparse_attention=_variant(sink_mode="none")),
    _m("sink_in_the_numerator", "ATTN.SINK", sparse_attention=_variant(sink_mode="numerator")),
    _m("output_left_fp32", "ATTN.OUTPUT", sparse_attention=_variant(output="fp32")),
    _m("derotation_by_plus_p", "ATTN.DEROTATE", attention_output=_derotate_plus),
    _m("minus_one_only_at_the_tail", "ATTN.GATHER", sparse_attention=_variant(gather="tail_only")),
    _m("int32_lists_read_as_row_0", "ATTN.GATHER", sparse_attention=_int32_lists_read_as_row_0),
    _m("probabilities_truncated_to_bf16", "ATTN.PROB.BF16", sparse_attention=_variant(probs="truncated")),
    _m("denominator_of_the_rounded_probabilities", "ATTN.PROB.BF16", sparse_attention=_variant(total_of="rounded")),
    _m("derotates_the_first_64", "ATTN.DEROTATE", attention_output=_derotate_first_64),
    _m("q_norm_eps_1e-20_on_v4", "ATTN.Q_NORM", attention_q=_q_norm_with_eps(1e-20)),
    _m("q_rescaled_on_v41", "ATTN.Q_NORM", attention_q=_q_norm_always),
    _m("q_not_rescaled_on_v4", "ATTN.Q_NORM", attention_q=_q_norm_never),
    _m("q_rescaled_in_fp32_on_v4", "ATTN.Q_NORM", attention_q=_q_norm_in_fp32),
    _m("q_rescaled_in_fp32_rounded_once_on_v4", "ATTN.Q_NORM", attention_q=_q_norm_in_fp32_rounded_once),
    _m("layer_q_not_rescaled_on_v4", "ATTN.LAYER", attention_layer=_layer_with(attention_q=lambda q, *, model: q)),
    _m("layer_window_kv_not_quantized", "ATTN.LAYER",
       attention_layer=_layer_with(window_kv_qdq=lambda x, model: x)),
    _m("layer_compressed_kv_not_quantized", "ATTN.LAYER",
       attention_layer=_layer_with(compressed_kv_qdq=lambda x, model: x)),
    _m("layer_attention_without_sink", "ATTN.LAYER",
       attention_layer=_layer_with(sparse_attention=_variant(sink_mode="none"))),
    _m("layer_window_and_compressed_rows_deduplicated", "ATTN.LAYER", attention_layer=_layer_deduplicating_tokens),
    _m("layer_wq_a_in_bf16", "ATTN.LAYER", attention_layer=_bf16_projection_at("attn_wq_a")),
    _m("layer_wq_b_in_bf16", "ATTN.LAYER", attention_layer=_bf16_projection_at("attn_wq_b")),
    _m("layer_wkv_in_bf16", "ATTN.LAYER", attention_layer=_bf16_projection_at("attn_wkv")),
    _m("layer_output_not_derotated", "ATTN.LAYER",
       attention_layer=_layer_with(attention_output=lambda o, positions, freqs: o)),
    _m("layer_wo_a_product_in_fp32", "ATTN.LAYER", CONTRACT=OUTPUT_CONTRACT, attention_layer=_layer_with(grouped_product=_wo_a_product_in_fp32)),
    _m("layer_wo_a_heads_round_robin", "ATTN.LAYER", CONTRACT=OUTPUT_CONTRACT, attention_layer=_layer_with(grouped_product=_wo_a_heads_round_robin)),
    _m("layer_wo_b_in_bf16", "ATTN.LAYER", CONTRACT=OUTPUT_CONTRACT, attention_layer=_bf16_projection_at("attn_wo_b")),
    _m("layer_wkv_act_quant_per_128_on_v41", "ATTN.LAYER", attention_layer=_act_quant_per_128_at("attn_wkv")),
    _m("layer_wo_b_act_quant_per_128_on_v41", "ATTN.LAYER", CONTRACT=OUTPUT_CONTRACT,
       attention_layer=_act_quant_per_128_at("attn_wo_b")),
    _m("layer_norm_eps_of_v4_on_v41", "ATTN.LAYER", attention_layer=_layer_with(_rms_norm=_rms_norm_with_v4_eps)),
])


def _planted(path_helpers=None, **attn_helpers):
    """impl's attention_layer with helpers of impl/path.py (the index path) and of impl/attn.py
    replaced while it runs."""
    def attention_layer(inputs, *, model, layer, start_pos=0):
        with contextlib.ExitStack() as stack:
            for module, helpers in ((path_ref, path_helpers), (ref, attn_helpers)):
                if helpers:
                    stack.enter_context(mock.patch.multiple(module, **helpers))
            return ref.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    return attention_layer


def _freqs_doubled_for(wrong_use):
    def rope_freqs(model, layer, use="q"):
        freqs = rope_ref.rope_freqs(model, layer, use)
        return freqs * 2 if use == wrong_use else freqs
    return rope_freqs


_attended_rows = ref.attended_rows


def _compressed_first(new, ring, compressed, start_pos):
    rows = _attended_rows(new, ring, None, start_pos)
    return rows if compressed is None else torch.cat([compressed, rows])


def _ring_slot_after(new, ring, compressed, start_pos):
    return _attended_rows(new, ring, compressed, start_pos + 1)


# ------------------------------------------------------------------------------------------------
# decode's window rows in position order (window_layout=position_order): a correct port, and one
# attending a wrong token
# ------------------------------------------------------------------------------------------------
_ring_window_index, _kv_offset = path_ref.window_index, path_ref.spec.kv_offset
POSITION_ORDER = {"window_layout": "position_order"}


def _last_positions(start_pos, newest):
    """The positions a position-ordered window keeps at decode, oldest first (newest: p included)."""
    end = start_pos + 1 if newest else start_pos
    return torch.arange(max(0, end - 128), end)


def _in_position_order(fn, newest=True):
    """impl's `fn` with decode's window kept as the last positions in order: the list 0 … W−1, the
    rows of those positions, the compressed rows (and the offset) after the W of them."""
    def window_index(seqlen, start_pos):
        if start_pos == 0:
            return _ring_window_index(seqlen, 0)
        return torch.arange(_last_positions(start_pos, newest).numel())[None, :].int()

    def kv_offset(seqlen, start_pos, window=128, layout="ring"):
        return seqlen if start_pos == 0 else _last_positions(start_pos, newest).numel()

    def attended_rows(new, ring, compressed, start_pos):
        if ring is None:
            return _attended_rows(new, ring, compressed, start_pos)
        if newest:
            ring = ring.clone()
            ring[start_pos % ring.shape[0]] = new[0]
        rows = ring[_last_positions(start_pos, newest) % ring.shape[0]]
        return rows if compressed is None else torch.cat([rows, compressed])

    def in_order(*args, **kwargs):
        with mock.patch.multiple(path_ref, window_index=window_index), \
                mock.patch.multiple(ref, window_index=window_index, attended_rows=attended_rows), \
                mock.patch.object(path_ref.spec, "kv_offset", kv_offset):
            return fn(*args, **kwargs)
    return in_order


def _position_ordered_port(name, newest=True):
    def late(module, op):           # looked up while the patches hold (window_index is one of them)
        return lambda *args, **kwargs: getattr(module, op)(*args, **kwargs)
    ops = {op: path_ref for op in ("window_index", "compressed_index", "attention_index", "index_layer")}
    ops["attention_layer"] = ref
    return mutant(name, variants=POSITION_ORDER,
                  **{op: _in_position_order(late(module, op), newest) for op, module in ops.items()})


POSITION_ORDERED = _position_ordered_port("position_ordered_window")
MUTANTS.update([("layer_position_ordered_window_without_the_newest_token",
                 (_position_ordered_port("layer_position_ordered_window_without_the_newest_token", False),
                  "ATTN.LAYER"))])


# ------------------------------------------------------------------------------------------------
# attention through a dense mask over the gathered rows (attention_form=dense_mask)
# ------------------------------------------------------------------------------------------------
_sparse_attention = ref.sparse_attention
DENSE_MASK = {"attention_form": "dense_mask", "attn_order": "split"}


def _dense_mask_attention(q, kv, sink, indices, scale, *, model):
    """Attention over the rows marked in a dense mask: each listed row once, in row order (a repeated
    entry is one mask bit)."""
    marked = [sorted(set(row) - {-1}) for row in indices.tolist()]
    rows = torch.tensor([m + [-1] * (indices.shape[1] - len(m)) for m in marked], dtype=indices.dtype)
    return _sparse_attention(q, kv, sink, rows, scale, model=model)


def _repeated_rows_dropped(q, kv, sink, indices, scale, *, model):
    """A wrong de-duplication: a row listed more than once is not attended at all (a mask attends it once)."""
    rows = indices.clone()
    for row in rows:
        values, counts = row.unique(return_counts=True)
        row[torch.isin(row, values[counts > 1])] = -1
    return _sparse_attention(q, kv, sink, rows, scale, model=model)


def _dense_mask_port(name, deduplicated=False):
    attend = _layer_deduplicating_tokens if deduplicated else ref.attention_layer

    def attention_layer(inputs, *, model, layer, start_pos=0):
        with mock.patch.object(ref, "sparse_attention", _dense_mask_attention):
            return attend(inputs, model=model, layer=layer, start_pos=start_pos)
    return mutant(name, variants=DENSE_MASK, sparse_attention=_dense_mask_attention, attention_layer=attention_layer)


DENSE_MASK_PORT = _dense_mask_port("dense_mask_attention")
MUTANTS["dense_mask_attending_a_token_once"] = (_dense_mask_port("dense_mask_attending_a_token_once", True),
                                               "ATTN.DUPLICATES")


# Mutants planted at one stage of each part of the layer, for the test that the layer check names
# that stage (tests/test_attn.py): not in the catalogue, since each breaks a rule that its own
# family's mutants cover.  name -> (provider, the stage named, the case: PLANT_CASES)
STAGE_PLANTS = {name: (mutant(name, attention_layer=layer), stage, where) for name, layer, stage, where in (
    ("index_q_projection_in_bf16", _planted({"fp8_linear": fp8_linear_without_act_quant}), "q", "prefill"),
    ("head_weights_accumulated_in_bf16", _planted({"_project": path_mutants._bf16_accumulation}), "w_raw", "prefill"),
    ("index_q_rope_at_twice_the_angle", _planted({"rope_freqs": _freqs_doubled_for("index_q")}), "q_rot", "prefill"),
    ("hadamard_skipped", _planted({"hadamard": lambda x: x.clone()}), "q_had", "prefill"),
    ("unfilled_ring_slots_as_row_0", _planted({"window_index": lambda s, p: path_mutants._window(s, p, unfilled=0)}),
     "window_idx", "decode"),
    ("lists_without_offset", _planted({"attention_index": path_mutants._concat_no_offset}), "indices", "prefill"),
    ("main_q_rope_at_twice_the_angle", _planted(rope_freqs=_freqs_doubled_for("q")), "q_attn_rot", "prefill"),
    ("window_kv_rope_at_twice_the_angle", _planted(rope_freqs=_freqs_doubled_for("window_kv")), "kv_rot", "prefill"),
    ("compressed_kv_rope_at_twice_the_angle", _planted(rope_freqs=_freqs_doubled_for("compressed_kv")), "cmp_rot",
     "prefill"),
    ("compressed_rows_before_the_window", _planted(attended_rows=_compressed_first), "kv", "prefill"),
    ("new_row_in_the_next_ring_slot", _planted(attended_rows=_ring_slot_after), "kv", "decode"),
    ("reused_lists_without_offset", _planted(attention_index=path_mutants._concat_no_offset), "indices", "reuse"),
)}
# (model, layer, start_pos) of each plant's case in properties.attn.attention_layer_cases()
PLANT_CASES = {"prefill": ("v4-flash", 2, 0), "decode": ("v4-flash", 2, 27), "reuse": ("v4.1-flash", 5, 30)}


def catalogue() -> list[tuple]:
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()]
