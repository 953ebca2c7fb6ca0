"""official.pool: the pool operations as the official code computes them.

select_candidate_blocks (V41-model L583–610) on the BF16 scores of
the candidate source; a re-index layer's scores masked to the candidates and its V4.1 top-k
(§4.2); the layer roles as the V4 / V4.1 Attention constructors decide them (§4.1, §5.2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec.models import profile
from ..spec.pool import Role
from .indexer import BF16, MINUS_INF, index_scores, index_topk

__all__ = ["candidate_blocks", "reindex_topk", "layer_role"]


def candidate_blocks(scores: torch.Tensor, compress_lens: torch.Tensor, topk_blocks: int = 2048,
                     block_size: int = 8) -> torch.Tensor:
    """Pad with −inf to whole blocks, block max, pin (compress_lens − 1) // block_size (floor
    division: nothing when compress_lens = 0), topk, keep the selected values > −inf, expand."""
    logits = scores.to(BF16)
    width = logits.size(-1)
    padded = F.pad(logits, (0, -width % block_size), value=MINUS_INF)
    block_scores = padded.unflatten(-1, (-1, block_size)).amax(dim=-1)
    num_blocks = block_scores.size(-1)
    last = (compress_lens[:, None] - 1) // block_size
    block_scores = block_scores.masked_fill(torch.arange(num_blocks) == last, float("inf"))
    top = block_scores.topk(min(topk_blocks, num_blocks), dim=-1)
    keep = torch.zeros_like(block_scores, dtype=torch.bool).scatter_(-1, top.indices, top.values > MINUS_INF)
    return keep.repeat_interleave(block_size, dim=-1)[..., :width]


def reindex_topk(q, k, w, visible, pool: torch.Tensor, topk: int) -> torch.Tensor:
    """index_score.masked_fill(~candidates, −inf), then the V4.1 top-k."""
    index_score = index_scores(q, k, w, visible).masked_fill(~pool, MINUS_INF)
    return index_topk(index_score, visible, topk, "position")


def layer_role(model: str, layer: int) -> Role:
    """The V4 Attention builds an indexer when compress_ratio == 4; the V4.1 Attention is a KV
    source, an index source, the candidate source or a reader of the layers before it."""
    args = profile(model)
    ratio = args.compress_ratios[layer]
    if ratio == 0:
        return Role("window")
    if args.candidate_source_layer < 0:
        if not args.window:                       # V3.2: every layer has its own indexer
            return Role("dsa", layer, layer)
        return Role("csa", layer, layer) if ratio == 4 else Role("hca", layer)
    is_backbone = layer < args.n_layers
    is_kv_source = is_backbone and layer in args.kv_source_layers
    is_index_source = is_backbone and layer in args.index_source_layers
    kv = layer if is_kv_source else max(s for s in args.kv_source_layers if s < layer)
    index = layer if is_index_source else max(s for s in args.index_source_layers if s < layer)
    if not is_index_source:
        return Role("reuse", kv, index)
    if layer == args.candidate_source_layer:
        return Role("candidate_source", kv, index)
    if 0 <= args.candidate_source_layer < layer:
        return Role("reindex", kv, index, args.candidate_source_layer)
    return Role("index_source", kv, index)
