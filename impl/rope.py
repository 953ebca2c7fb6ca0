"""RoPE per layer, readable torch (CPU): the layer's frequency table and the rotation.

Operations (contract in dsv4spec.properties.rope):

    rope_freqs(model, layer, use) -> f32 [rope_dim / 2]
        the table one layer uses for `use` in ("q", "window_kv", "compressed_kv", "index_q", "index_k");
    rope_rotate(x [T, ..., D], positions int64 [T], freqs f32 [d/2]) -> f32 [T, ..., D]
        the last 2·len(freqs) channels rotated as consecutive pairs by fl32(p·f), BF16 values out.
"""
from __future__ import annotations

import torch

from ..spec import rope as spec
from ..spec.models import profile
from .indexer import _bf16, _bf16_values, _tensor

__all__ = ["rope_freqs", "rope_rotate"]


def rope_freqs(model: str, layer: int, use: str = "q") -> torch.Tensor:
    """1/θ^(2i/d) in fp32, blended by YaRN's ramp on layers with a compress ratio (one table per layer)."""
    if use not in spec.USES:
        raise ValueError(f"rope_freqs: use must be one of {spec.USES}, got {use!r}")
    m = profile(model)
    theta, yarn = spec.layer_rope(m, layer)
    d = m.rope_dim
    freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    if yarn:
        smooth = 1 - torch.tensor(spec.ramp(m, theta), dtype=torch.float32)
        freqs = freqs / m.rope.factor * (1 - smooth) + freqs * smooth
    return freqs


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last 2·len(freqs) channels by e^(i·fl32(p·f_i)) in fp32."""
    op = "rope_rotate"
    x = _bf16_values(op, "x", _tensor(op, "x", x, floating=True))
    positions = _tensor(op, "positions", positions, 1, integer=True)
    freqs = _tensor(op, "freqs", freqs, 1, floating=True).float()
    rd = 2 * freqs.shape[0]
    if x.dim() < 2 or x.shape[0] != positions.shape[0]:
        raise ValueError(f"{op}: x must be [T, ..., D] with one position per token; got x {tuple(x.shape)} "
                         f"and {positions.shape[0]} positions")
    if rd > x.shape[-1]:
        raise ValueError(f"{op}: {len(freqs)} frequencies rotate {rd} channels, but x has only {x.shape[-1]}")
    if (positions < 0).any():
        raise ValueError(f"{op}: positions must be ≥ 0")
    cos, sin = (t.view(x.shape[0], *([1] * (x.dim() - 2)), rd // 2) for t in rope_table(positions, freqs))
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    out = x.clone()
    # each product and sum one fp32 rounding (no fused multiply-add), as kernels/path.py does
    out[..., -rd::2] = _bf16(a * cos - b * sin)
    out[..., -rd + 1::2] = _bf16(a * sin + b * cos)
    return out


def rope_table(positions: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, d/2] of the fp32 angles fl32(p·f), from torch.polar as the official table."""
    angle = torch.outer(positions.to(torch.float32), freqs.float())
    table = torch.polar(torch.ones_like(angle), angle)
    return table.real.contiguous(), table.imag.contiguous()
