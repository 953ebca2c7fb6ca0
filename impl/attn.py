"""Sparse attention, readable torch (CPU): the online softmax over blocks of 64 list entries.

Operations (contract in dsv4spec.properties.attn):

    sparse_attention(q [T, H, D], kv [N, D], sink [H], indices int [T, K], scale, *, model) -> f32 [T, H, D]
        BF16 values: Σ_j p_j·kv[i_j] / (Σ_j exp(s_j − M) + exp(sink − M)), p_j rounded to BF16
        against the running max of its block of 64; −1 entries contribute nothing.
    attention_scale(model, layer) -> float       head_dim^-0.5
    attention_q(q [T, H, D], *, model) -> f32    V4: each head rescaled to unit RMS (BF16 ops); V4.1: q
    attention_output(o [T, H, D], positions int64 [T], freqs f32 [d/2]) -> f32
        the last 2·len(freqs) channels de-rotated by the conjugate table.
"""
from __future__ import annotations

import torch

from ..spec import attn as spec
from .indexer import _bf16, _bf16_values, _tensor
from .rope import rope_table

__all__ = ["sparse_attention", "attention_scale", "attention_q", "attention_output"]


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
