"""V4.1 candidate pool and re-index top-k, readable reference in torch (CPU); layer roles."""
from __future__ import annotations

import torch

from ..spec import pool as spec
from ..spec.models import profile
from .indexer import _tensor, _visibility_mask, _visible, index_scores
from .topk import _topk_from

__all__ = ["candidate_blocks", "reindex_topk", "layer_role"]


def candidate_blocks(scores: torch.Tensor, compress_lens: torch.Tensor, topk_blocks: int = spec.TOPK_BLOCKS,
                     block_size: int = spec.BLOCK_SIZE) -> torch.Tensor:
    """select_candidate_blocks: bool [T, W], whole blocks of the top min(topk_blocks, n_blocks)."""
    op = "candidate_blocks"
    scores = _tensor(op, "scores", scores, 2, floating=True).float()
    T, W = scores.shape
    lens = _visible(op, compress_lens, T, W, "compress_lens")
    for name, v in (("topk_blocks", topk_blocks), ("block_size", block_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{op}: {name} must be a positive int, got {v!r}")
    if not torch.all(scores.masked_fill(_visibility_mask(lens, W), float("-inf")) == float("-inf")):
        raise ValueError(f"{op}: scores at positions ≥ compress_lens must be −inf (the causal mask)")

    n_blocks = -(-W // block_size)
    padded = torch.full((T, n_blocks * block_size), float("-inf"))
    padded[:, :W] = scores
    block_max = padded.view(T, n_blocks, block_size).amax(dim=2)
    newest = torch.div(lens - 1, block_size, rounding_mode="floor")        # −1 when nothing is reachable
    pinned = torch.arange(n_blocks)[None, :] == newest[:, None]
    block_max = block_max.masked_fill(pinned, float("inf"))
    top = torch.sort(block_max, dim=1, descending=True, stable=True)
    chosen = top.indices[:, : min(topk_blocks, n_blocks)]
    keep = torch.zeros((T, n_blocks), dtype=torch.bool)
    keep.scatter_(1, chosen, top.values[:, : chosen.shape[1]] > float("-inf"))
    return keep.repeat_interleave(block_size, dim=1)[:, :W]


def reindex_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor,
                 pool: torch.Tensor, topk: int) -> torch.Tensor:
    """A re-index layer: BF16 scores, −inf outside the pool, top-k in V4.1 order (−1 at the tail)."""
    op = "reindex_topk"
    scores = index_scores(q, k, w, visible, "bf16")
    pool = _tensor(op, "pool", pool, 2, boolean=True)
    if pool.shape != scores.shape:
        raise ValueError(f"{op}: pool has shape {tuple(pool.shape)}, expected the scores' [T, S] = "
                         f"{list(scores.shape)}")
    if not isinstance(topk, int) or topk < 0 or topk > scores.shape[1]:
        raise ValueError(f"{op}: topk must be an int in [0, {scores.shape[1]}] (the row width), got {topk!r}")
    visible = _visible(op, visible, *scores.shape)
    eligible = pool & _visibility_mask(visible, scores.shape[1])
    return _topk_from(scores.masked_fill(~eligible, float("-inf")), eligible, topk, "position")


def layer_role(model: str, layer: int) -> spec.Role:
    """The sparse-attention role of one layer (spec.pool.Role)."""
    return spec.layer_role(profile(model), layer)
