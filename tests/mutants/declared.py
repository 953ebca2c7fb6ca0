"""Ports that leave a step out or make a precision choice on purpose (issue 40), and mutants of them.

Each port below computes what a correct port making that choice computes; declaring the choice
(VARIANTS) it reads VARIANT with every other stage judged, undeclared it FAILs where the choice
departs from the official code.  The mutants declare the choice and break something else: they
must FAIL there."""
import contextlib
from unittest import mock

import torch

import dsv4spec.impl as impl
from dsv4spec.impl import attn as attn_ref
from dsv4spec.impl import compressor as compressor_ref
from dsv4spec.impl import path as path_ref
from dsv4spec.impl import rope as rope_ref

from . import mutant
from .attn import _attention, softmax_then_bf16
from .quant import fp8_linear_without_act_quant

_fp8_projection = attn_ref._fp8_projection
_dequantize = path_ref.fp4_e8m0_dequantize


def _bf16_projection(op, inputs, name, x, rows, block):
    """Every main-attention linear a BF16 matmul of the dequantized weight."""
    return fp8_linear_without_act_quant(x, inputs[name], inputs[f"{name}_scale"], block)


def _kept(x):
    """The index q or k 'quantized' by a port without the QDQ: itself (no payload, no scales)."""
    return x.clone(), torch.zeros(0)


def _dequantized(payload, scales):
    """The FP4 caches a port is given (bytes) dequantized; its own BF16 operands as they are."""
    return _dequantize(payload, scales) if payload.dtype == torch.uint8 else payload.float()


# the helpers each choice replaces: (impl/path.py's, impl/attn.py's)
CHOICES = {
    "fp8_linears": ({"fp8_linear": fp8_linear_without_act_quant}, {"_fp8_projection": _bf16_projection}),
    "index_qdq": ({"fp4_e8m0_quantize": _kept, "fp4_e8m0_dequantize": _dequantized}, {}),
    "index_hadamard": ({"hadamard": lambda x: x.clone()}, {}),
    "kv_qdq": ({}, {"window_kv_qdq": lambda x, model: x, "compressed_kv_qdq": lambda x, model: x}),
}
VALUES = {"fp8_linears": "bf16", "index_qdq": "none", "index_hadamard": "none", "kv_qdq": "none"}
NO_PAYLOAD = ("q_packed", "q_scales", "k_packed", "k_scales")


def _patched(knobs, extra_attn=None):
    path_helpers, attn_helpers = {}, dict(extra_attn or {})
    for knob in knobs:
        path_helpers.update(CHOICES[knob][0])
        attn_helpers.update(CHOICES[knob][1])
    stack = contextlib.ExitStack()
    for module, helpers in ((path_ref, path_helpers), (attn_ref, attn_helpers)):
        if helpers:
            stack.enter_context(mock.patch.multiple(module, **helpers))
    return stack


def _without_payload(knobs, out: dict) -> dict:
    """A port without the index QDQ writes no FP4 payload of its own q and k."""
    if "index_qdq" in knobs:
        for name in NO_PAYLOAD:
            if name in out and out[name].dtype != torch.uint8:
                del out[name]
    return out


def port(knobs: tuple, declared: bool = True, extra_attn=None, name: str | None = None):
    """impl with the choices `knobs` made (declared or not), and impl/attn.py's helpers `extra_attn`
    replaced too (a mistake elsewhere)."""
    def index_layer(inputs, *, model, layer, start_pos=0):
        with _patched(knobs, extra_attn):
            return _without_payload(knobs, path_ref.index_layer(inputs, model=model, layer=layer, start_pos=start_pos))

    def attention_layer(inputs, *, model, layer, start_pos=0):
        with _patched(knobs, extra_attn):
            return _without_payload(knobs, attn_ref.attention_layer(inputs, model=model, layer=layer,
                                                                    start_pos=start_pos))

    ops = dict(index_layer=index_layer, attention_layer=attention_layer, CONTRACT=7)
    if "fp8_linears" in knobs:
        ops["fp8_linear"] = fp8_linear_without_act_quant
    name = name or "+".join(knobs) + ("" if declared else "-undeclared")
    return mutant(name, variants={k: VALUES[k] for k in knobs} if declared else {}, **ops)


def _no_sink(**options):
    return lambda q, kv, sink, indices, scale, *, model: _attention(q, kv, sink, indices, scale, model=model,
                                                                    sink_mode="none", **options)


def _normalized_sink_scaled(q, kv, sink, indices, scale, *, model):
    return softmax_then_bf16(q, kv, sink * scale, indices, scale, model=model)


# declared ports of the precision choices of sparse attention
ATTENTION = {
    "attn_scores": mutant("bf16_logits", variants={"attn_scores": "bf16"},
                          sparse_attention=lambda q, kv, sink, indices, scale, *, model: _attention(
                              q, kv, sink, indices, scale, model=model, scores="bf16")),
    "attn_probs": mutant("normalized_probabilities", variants={"attn_probs": "normalized"},
                         sparse_attention=softmax_then_bf16),
}


_rope_table = rope_ref.rope_table


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _bf16_table(positions, freqs):
    """The official complex64 table's cos and sin, each rounded to BF16 (rope_table=bf16)."""
    return tuple(_bf16(t) for t in _rope_table(positions, freqs))


def _compressor_rope_bf16_table(y, positions, freqs):
    """impl's compressor rotation with its cos and sin rounded to BF16."""
    rd = 2 * freqs.shape[0]
    if rd == 0:
        return y
    angle = positions.to(torch.float32)[:, None] * freqs
    cos, sin = _bf16(angle.cos()), _bf16(angle.sin())
    a, b = y[..., -rd::2], y[..., -rd + 1::2]
    out = y.clone()
    out[..., -rd::2] = a * cos - b * sin
    out[..., -rd + 1::2] = a * sin + b * cos
    return out


ROPE_BF16_PATCHES = ((rope_ref, {"rope_table": _bf16_table}), (attn_ref, {"rope_table": _bf16_table}),
                     (compressor_ref, {"_rope": _compressor_rope_bf16_table}))
ROTATING_OPS = ("rope_rotate", "attention_output", "rope_quantize", "index_layer", "attention_layer", "compress",
                "compressor_state", "compressor_feed")


def _under(patches, fn):
    def call(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            for module, helpers in patches:
                stack.enter_context(mock.patch.multiple(module, **helpers))
            return fn(*args, **kwargs)
    return call


def rotate_in_bf16(x, positions, freqs):
    """A framework's rotation: a BF16 tensor times the BF16 cos/sin table, each product and the sum
    rounded to BF16 (rope_table=bf16)."""
    rd = 2 * freqs.shape[0]
    cos, sin = (t.bfloat16().view(x.shape[0], *([1] * (x.dim() - 2)), rd // 2) for t in _bf16_table(positions, freqs))
    x = x.bfloat16()
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    out = x.clone()
    out[..., -rd::2] = a * cos - b * sin
    out[..., -rd + 1::2] = a * sin + b * cos
    return out.float()


def bf16_rope_table(declared: bool = True, name: str = "bf16_rope_table", **overrides):
    """impl multiplying by a BF16 cos/sin table everywhere it rotates (rope_table=bf16)."""
    ops = {op: _under(ROPE_BF16_PATCHES, overrides.pop(op, getattr(impl, op))) for op in ROTATING_OPS}
    return mutant(name, variants={"rope_table": "bf16"} if declared else {}, CONTRACT=7, **ops, **overrides)


def compress_pooling_in_bf16(x, params, *, model, ratio, drop_ape=False):
    """impl's compress with its pooling in BF16 (compressor_pooling=bf16): kv and the scores
    rounded to BF16, the softmax written BF16, each product BF16, the slot sum reduced by torch in BF16."""
    spec = compressor_ref.spec
    if not spec.has_gate(ratio):
        return impl.compress(x, params, model=model, ratio=ratio)
    groups, cutoff = x.shape[1] // ratio, x.shape[1] // ratio * ratio
    kv = (x @ params["wkv"].T).bfloat16()
    score = x @ params["wgate"].T
    if spec.has_ape(model) and not drop_ape:
        score = score + params["ape"][torch.arange(x.shape[1]) % ratio]
    kv, score = kv[:, :cutoff].unflatten(1, (groups, ratio)), score.bfloat16()[:, :cutoff].unflatten(1, (groups, ratio))
    if spec.overlaps(model, ratio):
        kv, score = compressor_ref._overlap_windows(kv, 0.0), compressor_ref._overlap_windows(score, float("-inf"))
    pooled = (kv * score.softmax(dim=2)).sum(dim=2).float()
    normed = compressor_ref._rms_norm(pooled, params["norm"], compressor_ref.profile(model).norm_eps)
    return compressor_ref._rope(normed, torch.arange(groups) * ratio, params["rope_freqs"])


BF16_POOLING = mutant("bf16_pooling", variants={"compressor_pooling": "bf16"}, compress=compress_pooling_in_bf16)


def catalogue() -> list[tuple]:
    return [
        ("declared_bf16_logits_without_sink", "ATTN.SINK",
         mutant("declared_bf16_logits_without_sink", variants={"attn_scores": "bf16"},
                sparse_attention=_no_sink(scores="bf16"))),
        ("declared_normalized_probabilities_sink_scaled", "ATTN.SINK",
         mutant("declared_normalized_probabilities_sink_scaled", variants={"attn_probs": "normalized"},
                sparse_attention=_normalized_sink_scaled)),
        ("declared_bf16_linears_fp8_linear_with_act_quant_dropped_scales", "FP8.LINEAR",
         mutant("declared_bf16_linears_fp8_linear_unscaled", variants={"fp8_linears": "bf16"},
                fp8_linear=lambda x, w, w_scale, block: fp8_linear_without_act_quant(
                    x, w, torch.full_like(w_scale, 127), block))),
        ("declared_kv_without_qdq_attention_without_sink", "ATTN.LAYER",
         port(("kv_qdq",), extra_attn={"sparse_attention": _no_sink()},
              name="declared_kv_without_qdq_attention_without_sink")),
        ("declared_bf16_rope_table_derotation_by_plus_p", "ATTN.DEROTATE",
         bf16_rope_table(name="declared_bf16_rope_table_derotation_by_plus_p",
                         attention_output=lambda o, positions, freqs: impl.attention_output(o, positions, -freqs))),
        # undeclared, a BF16 table is seen where the probes turn a pair to nearly 0 (rope.table_rows,
        # compressor.table_showing)
        ("undeclared_bf16_rope_table", "ROPE.PAIRS", bf16_rope_table(False, "undeclared_bf16_rope_table")),
        ("undeclared_bf16_rope_table", "CMP.ROPE", bf16_rope_table(False, "undeclared_bf16_rope_table")),
        ("declared_bf16_pooling_without_ape", "CMP.APE",
         mutant("declared_bf16_pooling_without_ape", variants={"compressor_pooling": "bf16"},
                compress=lambda x, params, *, model, ratio: compress_pooling_in_bf16(x, params, model=model, ratio=ratio,
                                                                                     drop_ape=True))),
    ]
