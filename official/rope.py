"""official.rope: the layer's RoPE table and the rotation as the official code computes them.

precompute_freqs_cis (V4-model L199-229; V4.1 upstream, its ramp guard L384): 1/base^(arange(0, d, 2)/d) in
fp32, YaRN's linear ramp between the correction dims of beta_fast and beta_slow, outer(arange,
freqs) in fp32, polar to complex64.  The ramp's guard is each model's own: V4 adds 0.001 to high
when low == high (linear_ramp_factor), V4.1 divides by max(high − low, 1e-3).  apply_rotary_emb: view_as_complex of consecutive pairs of the float copy,
times the table, copied back into the BF16 tensor in place.
"""
from __future__ import annotations

import math

import torch

from ..spec.models import profile
from ..spec.rules import V4

__all__ = ["rope_freqs", "rope_rotate"]


def _correction_dim(rotations, dim, base, max_seq_len):
    return dim * math.log(max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _ramp_width(low, high, model: str) -> float:
    if model in V4:                         # V4 linear_ramp_factor
        return (high + 0.001 if low == high else high) - low
    return max(high - low, 1e-3)            # V4.1


def _freqs(dim, original_seq_len, base, factor, beta_fast, beta_slow, model: str) -> torch.Tensor:
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if original_seq_len > 0:
        low = max(math.floor(_correction_dim(beta_fast, dim, base, original_seq_len)), 0)
        high = min(math.ceil(_correction_dim(beta_slow, dim, base, original_seq_len)), dim - 1)
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / _ramp_width(low, high, model), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def rope_freqs(model: str, layer: int, use: str = "q") -> torch.Tensor:
    """Attention.__init__: compress_rope_theta with YaRN when the layer compresses, else rope_theta."""
    m = profile(model)
    if m.rope is None or not 0 <= layer < len(m.compress_ratios):
        raise ValueError(f"rope_freqs: expected a V4/V4.1 model and one of its layers, got {model!r} layer {layer!r}")
    r = m.rope
    if m.ratio(layer):
        original_seq_len, theta = r.original_seq_len, r.compress_theta
    else:
        original_seq_len, theta = 0, r.theta
    return _freqs(m.rope_dim, original_seq_len, theta, r.factor, r.beta_fast, r.beta_slow, model)


def freqs_cis(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rows of the complex table: polar(1, outer(position, freqs))."""
    angle = torch.outer(positions, freqs)
    return torch.polar(torch.ones_like(angle), angle)


def apply_rotary_emb(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """In place on x (BF16) [T, ..., rd]: consecutive pairs as complex64 times the table rows."""
    y = x
    z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    table = table.view(z.shape[0], *([1] * (z.dim() - 2)), z.shape[-1])
    y.copy_(torch.view_as_real(z * table).flatten(-2))
    return y


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    rd = 2 * freqs.shape[0]
    y = x.to(torch.bfloat16)
    apply_rotary_emb(y[..., -rd:], freqs_cis(positions, freqs.float()))
    return y.float()
