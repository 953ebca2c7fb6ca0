"""official.indexer: the indexer operations as the official code computes them.

Transcribed from the V4 / V4.1 `Indexer` and `rotate_activation` (V4-model L247-251, L380-432; V41-model L488-580): every
tensor of the score is BF16 (einsum, ReLU, the weighted product, the head sum), the prefill mask
is filled with −inf, and top-k is torch.topk with whatever ties it picks — sorted by score in V4,
unsorted then sorted by position in V4.1 — returned as int32 with −1 for the invisible slots.
Inputs arrive as float32 tensors holding BF16 values and are cast to BF16 first, as the model
holds them.  Nothing is validated: the official code checks nothing.
"""
from __future__ import annotations

import torch

from ..spec.models import profile

__all__ = ["hadamard", "index_rotate", "index_weights", "index_weights_v32", "index_scores", "index_scores_fp4",
           "index_visible", "index_topk"]

BF16 = torch.bfloat16
MINUS_INF = float("-inf")


def _hadamard_transform(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fast_hadamard_transform.hadamard_transform, emulated: the BF16 input widened to fp32, the
    radix-2 butterfly (lowest index bit first), times scale, rounded back to the input dtype."""
    d = x.shape[-1]
    y = x.float().reshape(-1, d)
    span = 1
    while span < d:
        pairs = y.view(-1, d // (2 * span), 2, span)
        y = torch.cat((pairs[:, :, :1] + pairs[:, :, 1:], pairs[:, :, :1] - pairs[:, :, 1:]), dim=2).view(-1, d)
        span *= 2
    return (y * scale).to(x.dtype).view(x.shape)


def rotate_activation(x: torch.Tensor) -> torch.Tensor:
    """V4 model.py: assert BF16, then hadamard_transform(x, scale=d^-0.5)."""
    assert x.dtype == BF16
    return _hadamard_transform(x, x.size(-1) ** -0.5)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    return rotate_activation(x.to(BF16)).float()


def index_rotate(x: torch.Tensor, model: str) -> torch.Tensor:
    """V3.2 and V4 rotate indexer q and k; V4.1 has no rotate_activation."""
    x = x.to(BF16)
    return (rotate_activation(x) if profile(model).hadamard else x).float()


def index_weights(raw_w: torch.Tensor, model: str) -> torch.Tensor:
    """weights_proj(x) · (softmax_scale · n_heads^-0.5): a BF16 tensor times a Python float."""
    m = profile(model)
    softmax_scale = m.index_head_dim ** -0.5
    return (raw_w.to(BF16) * (softmax_scale * m.index_n_heads ** -0.5)).float()


def index_weights_v32(raw_w: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    """V3.2 Indexer.forward: weights_proj(x) · n_heads^-0.5 (BF16), then .unsqueeze(-1) · q_scale ·
    softmax_scale (fp32)."""
    m = profile("v3.2")
    weights = raw_w.to(BF16) * m.index_n_heads ** -0.5
    weights = weights.unsqueeze(-1) * q_scale.float().unsqueeze(-1) * m.index_head_dim ** -0.5
    return weights.squeeze(-1)


def _prefill_mask(visible: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] >= visible[:, None]


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor,
                 score_dtype: str = "bf16") -> torch.Tensor:
    """einsum → relu_ → × weights → sum over heads, in BF16 (V4/V4.1) or fp32 (V3.2's kernel);
    −inf filled past the visible entries."""
    dtype = BF16 if score_dtype == "bf16" else torch.float32
    q, k, w = q.to(dtype)[None], k.to(dtype)[None], w.to(dtype)[None]
    index_score = torch.einsum("bshd,btd->bsht", q, k)
    index_score = (index_score.relu_() * w.unsqueeze(-1)).sum(dim=2)[0]
    index_score = index_score.masked_fill(_prefill_mask(visible, k.shape[1]), MINUS_INF)
    return index_score.float()


FP4_TABLE = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _fp4_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The in-place fp4_act_quant result: E2M1 value × E8M0 scale per 32, held in BF16
    (element 2i in the low nibble)."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    values = FP4_TABLE[codes].unflatten(-1, (-1, 32))
    scale = scales.view(torch.float8_e8m0fnu).float()[..., None]
    return (values * scale).flatten(-2).to(BF16)


def index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible) -> torch.Tensor:
    return index_scores(_fp4_dequantize(q_packed, q_scales), _fp4_dequantize(k_packed, k_scales), w, visible)


def index_visible(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """Prefill: arange(1, s + 1) // ratio; decode: end_pos // ratio with end_pos = p + 1."""
    return (positions + 1) // ratio


def index_topk(scores: torch.Tensor, visible: torch.Tensor, k: int, order: str) -> torch.Tensor:
    """V4: topk (sorted by score), invisible picks → −1.  V4.1: topk(sorted=False), sorted by
    position, invisible picks → −1 (they sort to the tail).  int32.

    The official takes min(index_topk, end_pos // ratio) picks (V4-model L427, V4.1 Indexer.forward),
    its score row being end_pos // ratio wide.  This operation knows no model, so the caller's k
    stands for index_topk and the width of `scores` for end_pos // ratio: k is derived the official
    way and must be what the caller passed (the contract keeps k within [0, S]); index_layer
    (official.path) derives it from the model itself."""
    topk = min(k, scores.shape[1])
    assert topk == k, f"index_topk: k = {k} but the official takes min(index_topk, end_pos // ratio) = {topk}"
    k = topk
    index_score = scores.to(BF16).masked_fill(_prefill_mask(visible, scores.shape[1]), MINUS_INF)
    compress_lens = visible[:, None]
    if order == "position":
        topk_idxs = index_score.topk(k, dim=-1, sorted=False).indices
        topk_idxs = topk_idxs.sort(dim=-1).values
    else:
        topk_idxs = index_score.topk(k, dim=-1).indices
    return torch.where(topk_idxs < compress_lens, topk_idxs, -1).int()
