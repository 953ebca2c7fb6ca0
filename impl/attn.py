"""Sparse attention, readable torch (CPU): the online softmax over blocks of 64 list entries.

Operations (contract in dsv4spec.properties.attn):

    sparse_attention(q [T, H, D], kv [N, D], sink [H], indices int [T, K], scale, *, model) -> f32 [T, H, D]
        BF16 values: Σ_j p_j·kv[i_j] / (Σ_j exp(s_j − M) + exp(sink − M)), p_j rounded to BF16
        against the running max of its block of 64; −1 entries contribute nothing.
    attention_scale(model, layer) -> float       head_dim^-0.5
    attention_q(q [T, H, D], *, model) -> f32    V4: each head rescaled to unit RMS (BF16 ops); V4.1: q
    attention_output(o [T, H, D], positions int64 [T], freqs f32 [d/2]) -> f32
        the last 2·len(freqs) channels de-rotated by the conjugate table.
    attention_layer(inputs: dict, *, model, layer, start_pos) -> dict of stages
        index_layer's stages, then the attention's (see attention_layer).
"""
from __future__ import annotations

import torch

from ..spec import attn as spec
from ..spec import pool as spec_pool
from ..spec.models import profile
from ..spec import layout as spec_layout
from .indexer import _bf16, _bf16_values, _tensor
from .layout import entry_unpack
from ..spec.quant import FP8_LINEAR_BLOCK
from .path import _rms_norm, attention_index, bf16_layer_input, index_layer, kv_qdq, layer_input, window_index
from .quant import fp8_linear, fp8_qdq
from .rope import rope_freqs, rope_rotate, rope_table

__all__ = ["sparse_attention", "sparse_attention_cache", "attention_scale", "attention_q", "attention_output",
           "attention_layer", "row_parallel_reduce"]


def _model(op: str, model: str):
    try:
        return spec.model_of(model)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None


def check_attention_inputs(op, q, kv, sink, indices, scale):
    """The inputs as (q, kv, sink, indices int64, scale fp32), validated; errors name what was expected."""
    q = _bf16_values(op, "q", _tensor(op, "q", q, 3, floating=True))
    kv = _bf16_values(op, "kv", _tensor(op, "kv", kv, 2, floating=True))
    sink = _tensor(op, "sink", sink, 1, floating=True).float()
    indices = _tensor(op, "indices", indices, 2, integer=True).to(torch.int64)
    T, H, D = q.shape
    if kv.shape[1] != D:
        raise ValueError(f"{op}: kv rows must have q's head dim {D}, got kv {tuple(kv.shape)}")
    if sink.shape[0] != H:
        raise ValueError(f"{op}: sink must have one value per head ({H}), got {sink.shape[0]}")
    if indices.shape[0] != T:
        raise ValueError(f"{op}: indices must be [T={T}, K], got {tuple(indices.shape)}")
    if ((indices < -1) | (indices >= kv.shape[0])).any():
        raise ValueError(f"{op}: indices must be −1 or rows 0..{kv.shape[0] - 1} of kv")
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"{op}: scale must be a positive float, got {scale!r}")
    return q, kv, sink, indices, torch.tensor(scale, dtype=torch.float32)


def sparse_attention(q, kv, sink, indices, scale, *, model: str) -> torch.Tensor:
    """Blocks of 64 entries in list order: scores, running max, BF16 probabilities, rescaled sums."""
    op = "sparse_attention"
    init = spec.running_max_init(_model(op, model))
    q, kv, sink, indices, scale = check_attention_inputs(op, q, kv, sink, indices, scale)
    T, H, D = q.shape
    acc = torch.zeros(T, H, D)
    total = torch.zeros(T, H)
    m = torch.full((T, H), init)
    for start in range(0, indices.shape[1], spec.BLOCK):
        idx = indices[:, start:start + spec.BLOCK]
        valid = idx != -1
        rows = kv[idx.clamp_min(0)] * valid[..., None]                          # [T, B, D]
        s = torch.einsum("thd,tbd->thb", q, rows) * scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        rescale = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        total = total * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + torch.einsum("thb,tbd->thd", _bf16(p), rows)
        m = m_new
    total = total + torch.exp(sink[None, :] - m)
    return _bf16(acc / total[..., None])


def sparse_attention_cache(q, cache, form, sink, indices, scale, *, model: str) -> torch.Tensor:
    """sparse_attention over a packed cache: each entry unpacked by its LAYOUT rule and kept in BF16 (as
    the reference keeps its caches after the in-place QDQ), the keys all its dims, the values its first 512."""
    kind, paged = spec_layout.cache_form(form)
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8:
        raise TypeError("sparse_attention_cache: cache must be a uint8 tensor")
    entries = torch.from_numpy(spec_layout.from_pages(kind, cache.numpy())) if paged else cache
    kv = _bf16(entry_unpack(kind, entries))
    return sparse_attention(q, kv, sink, indices, scale, model=model)[..., :spec_layout.CACHE_VALUE_DIMS]


def attention_scale(model: str, layer: int) -> float:
    """softmax_scale = head_dim^-0.5 on every layer (no YaRN factor)."""
    m = _model("attention_scale", model)
    if not 0 <= layer < len(m.compress_ratios):
        raise ValueError(f"attention_scale: {model} has layers 0..{len(m.compress_ratios) - 1}, got {layer}")
    return spec.softmax_scale(m)


def attention_q(q, *, model: str) -> torch.Tensor:
    """V4: q · rsqrt(mean(q²) + eps) per head, every step a BF16 tensor op; V4.1: q unchanged."""
    op = "attention_q"
    m = _model(op, model)
    q = _bf16_values(op, "q", _tensor(op, "q", q, floating=True))
    if model in spec.V41:
        return q
    qb = q.to(torch.bfloat16)
    return (qb * torch.rsqrt(qb.square().mean(-1, keepdim=True) + m.norm_eps)).float()


def attention_output(o, positions, freqs) -> torch.Tensor:
    """The last 2·len(freqs) channels of each head turned by e^(−i·fl32(p·f)): y = x·conj(e^(iθ))."""
    op = "attention_output"
    o = _bf16_values(op, "o", _tensor(op, "o", o, 3, floating=True))
    positions = _tensor(op, "positions", positions, 1, integer=True)
    freqs = _tensor(op, "freqs", freqs, 1, floating=True).float()
    rd = 2 * freqs.shape[0]
    if o.shape[0] != positions.shape[0] or rd > o.shape[-1]:
        raise ValueError(f"{op}: o must be [T, H, D ≥ {rd}] with one position per token; got o "
                         f"{tuple(o.shape)} and {positions.shape[0]} positions")
    cos, sin = (t[:, None, :] for t in rope_table(positions, freqs))
    a, b = o[..., -rd::2], o[..., -rd + 1::2]
    out = o.clone()
    out[..., -rd::2] = _bf16(a * cos + b * sin)
    out[..., -rd + 1::2] = _bf16(b * cos - a * sin)
    return out


# ------------------------------------------------------------------------------------------------
# the layer: from the index path's lists to the de-rotated output (teacher-forced)
# ------------------------------------------------------------------------------------------------
def window_kv_qdq(x: torch.Tensor, model: str) -> torch.Tensor:
    """What attention reads of the window KV: V4 FP8 E8M0/64 on the 448 NoPE channels (RoPE tail
    BF16), V4.1 FP8 E8M0/32 on the whole vector."""
    if model in spec.V4:
        return torch.cat([fp8_qdq(x[..., :-64].contiguous(), 64), x[..., -64:]], -1)
    return fp8_qdq(x, 32)


def compressed_kv_qdq(x: torch.Tensor, model: str) -> torch.Tensor:
    """What attention reads of a compressed entry: V4 as its window KV, V4.1 FP4 E4M3/16 (PATH.QDQ)."""
    return window_kv_qdq(x, model) if model in spec.V4 else kv_qdq(x, "fp4_e4m3")


def attention_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    """index_layer's stages (a V4.1 reuse layer: window_idx, and indices from the index source's
    top-k `source_topk`), then the attention's, each from the stage before:

    from the attention input x (when the inputs hold attn_wq_a; else q_attn and kv_normed are given, the
    contract before version 6): q_latent = wq_a(x), q_norm (its RMSNorm), q_attn = wq_b(q_norm)
    (FP8 linears, the heads of the given wq_b), kv_proj = wkv(x) (FP8 linear) and kv_normed (its
    RMSNorm); the weights are the inputs attn_wq_a, attn_q_norm, attn_wq_b, attn_wkv, attn_kv_norm (E4M3
    weights with their E8M0 scales `name`_scale); then q_rescale (attention_q of q_attn), q_attn_rot (RoPE at the tokens' positions), kv_rot and
    kv_window (the new tokens' kv_normed rotated, then QDQ), cmp_rot and cmp (prefill on a layer that
    compresses its KV: the entries kv_entries rotated at j·ratio, then QDQ; otherwise the cache
    kv_cache as attention reads it), kv ([window rows | compressed rows]; decode: the ring
    window_cache with the new row at start_pos % 128), o (sparse attention over the lists
    `indices`, the sink `sink`), o_derot (attention_output); then, when the inputs hold attn_wo_a
    (contract 7), o_lora (o_derot's head groups times the BF16 attn_wo_a) and out = wo_b(o_lora)
    (FP8 linear, the E4M3 attn_wo_b with attn_wo_b_scale)."""
    op = "attention_layer"
    m = _model(op, model)
    out = _lists(op, inputs, model, layer, start_pos)
    T = out["window_idx"].shape[0]
    positions = torch.arange(start_pos, start_pos + T)
    freqs = rope_freqs(model, layer, "q")
    if "attn_wq_a" in inputs:
        out.update(projections(op, inputs, m, T))
    q = out["q_attn"] if "q_attn" in out else bf16_layer_input(op, inputs, "q_attn", (T, None, m.head_dim))
    sink = layer_input(op, inputs, "sink", (q.shape[1],)).float()
    out["q_rescale"] = attention_q(q, model=model)
    out["q_attn_rot"] = rope_rotate(out["q_rescale"], positions, freqs)
    kv_new = out["kv_normed"] if "kv_normed" in out else bf16_layer_input(op, inputs, "kv_normed", (T, m.head_dim))
    out["kv_rot"] = rope_rotate(kv_new, positions, rope_freqs(model, layer, "window_kv"))
    out["kv_window"] = window_kv_qdq(out["kv_rot"], model)
    ring = None if start_pos == 0 else bf16_layer_input(op, inputs, "window_cache", (m.window, m.head_dim))
    ratio = m.ratio(layer)
    if ratio:
        E = (start_pos + T) // ratio
        if start_pos == 0 and compresses_here(m, layer):
            entries = bf16_layer_input(op, inputs, "kv_entries", (E, m.head_dim))
            out["cmp_rot"] = rope_rotate(entries, torch.arange(E) * ratio, rope_freqs(model, layer, "compressed_kv"))
            out["cmp"] = compressed_kv_qdq(out["cmp_rot"], model)
        else:
            out["cmp"] = bf16_layer_input(op, inputs, "kv_cache", (E, m.head_dim))
    out["kv"] = attended_rows(out["kv_window"], ring, out.get("cmp"), start_pos)
    out["o"] = sparse_attention(out["q_attn_rot"], out["kv"], sink, out["indices"], spec.softmax_scale(m), model=model)
    out["o_derot"] = attention_output(out["o"], positions, freqs)
    if "attn_wo_a" in inputs:
        out.update(output_projections(op, inputs, out["o_derot"], m))
    return out


def _fp8_projection(op: str, inputs: dict, name: str, x: torch.Tensor, rows, block: int) -> torch.Tensor:
    """FP8.LINEAR of x by the E4M3 weight `name` [rows, K] and its E8M0 scales `name`_scale."""
    k = x.shape[-1]
    w = layer_input(op, inputs, name, (rows, k))
    w_scale = layer_input(op, inputs, f"{name}_scale", (-(-w.shape[0] // block), k // block))
    return fp8_linear(x, w, w_scale, block)


def projections(op: str, inputs: dict, m, T: int) -> dict:
    """The main q and the window KV from the attention input x: q_latent = wq_a(x), q_norm,
    q_attn = wq_b(q_norm) as [T, heads, head_dim], kv_proj = wkv(x), kv_normed; FP8 linears."""
    b = FP8_LINEAR_BLOCK[m.name]
    x = bf16_layer_input(op, inputs, "x", (T, m.dim))
    out = {"q_latent": _fp8_projection(op, inputs, "attn_wq_a", x, m.q_lora_rank, b)}
    out["q_norm"] = _rms_norm(out["q_latent"], layer_input(op, inputs, "attn_q_norm", (m.q_lora_rank,)).float(), m.norm_eps)
    q = _fp8_projection(op, inputs, "attn_wq_b", out["q_norm"], None, b)
    if q.shape[-1] % m.head_dim:
        raise ValueError(f"{op}: wq_b must have a multiple of head_dim = {m.head_dim} rows, got {q.shape[-1]}")
    out["q_attn"] = q.view(T, -1, m.head_dim)
    out["kv_proj"] = _fp8_projection(op, inputs, "attn_wkv", x, m.head_dim, b)
    out["kv_normed"] = _rms_norm(out["kv_proj"], layer_input(op, inputs, "attn_kv_norm", (m.head_dim,)).float(), m.norm_eps)
    return out


def output_projections(op: str, inputs: dict, o: torch.Tensor, m) -> dict:
    """o_lora = wo_a per head group of o [T, H, D] (BF16 wo_a [g·r, H·D/g]), out = wo_b(o_lora
    flattened), an FP8 linear to [T, dim]."""
    wo_a = bf16_layer_input(op, inputs, "attn_wo_a", (None, None))
    width = o[0].numel()
    if width % wo_a.shape[1] or wo_a.shape[0] % (width // wo_a.shape[1]):
        raise ValueError(f"{op}: wo_a must be [groups·o_lora_rank, H·D/groups], got {tuple(wo_a.shape)} "
                         f"for o {tuple(o.shape)}")
    o_lora = grouped_product(o, wo_a)
    return {"o_lora": o_lora,
            "out": _fp8_projection(op, inputs, "attn_wo_b", o_lora.flatten(1), m.dim, FP8_LINEAR_BLOCK[m.name])}


def grouped_product(o: torch.Tensor, wo_a: torch.Tensor) -> torch.Tensor:
    """[T, g, r]: bf16(o_i · wo_a_iᵀ) in fp32, o_i the i-th of g equal runs of heads, wo_a_i the i-th run of r rows."""
    g = o[0].numel() // wo_a.shape[1]
    return _bf16(torch.einsum("tgd,grd->tgr", o.reshape(o.shape[0], g, -1), wo_a.view(g, -1, wo_a.shape[1])))


def attended_rows(new: torch.Tensor, ring, compressed, start_pos: int) -> torch.Tensor:
    """The rows the lists index: [window rows | compressed rows]; the window rows are the new
    tokens' (prefill) or the ring with the new row written to slot start_pos mod its size (decode)."""
    if ring is not None:
        ring = ring.clone()
        ring[start_pos % ring.shape[0]] = new[0]
    rows = new if ring is None else ring
    return rows if compressed is None else torch.cat([rows, compressed])


def _lists(op: str, inputs: dict, model: str, layer: int, start_pos: int) -> dict:
    """index_layer's stages; a V4.1 layer that reuses its index source's lists (LAYER.V41) has only
    window_idx and indices, [window | the source's top-k source_topk + offset]."""
    if spec_pool.layer_role(profile(model), layer).kind != "reuse":
        return index_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    T = (layer_input(op, inputs, "x", (None, None)) if "attn_wq_a" in inputs
         else bf16_layer_input(op, inputs, "kv_normed", (None, profile(model).head_dim))).shape[0]
    window = window_index(T, start_pos)
    topk = _tensor(op, "source_topk", layer_input(op, inputs, "source_topk", (T, None)), integer=True)
    return {"window_idx": window, "indices": attention_index(window, topk, T, start_pos)}


def compresses_here(m, layer: int) -> bool:
    """Whether the layer writes its own compressed KV (V4: every compressed layer; V4.1: the KV sources)."""
    return m.ratio(layer) > 0 and (m.name in spec.V4 or layer in m.kv_source_layers)


def row_parallel_reduce(partials: torch.Tensor) -> torch.Tensor:
    """ATTN.TP.REDUCE: out = bf16(Σ_r fp32(y_r)) of the ranks' BF16 partials [W, T, dim]."""
    return _bf16(_bf16(partials).sum(0))
