"""The top-k of the readable reference, shared by impl.indexer (index_topk), impl.pool (the re-index)
and impl.path: the k best eligible entries of each row, ties to the lowest index, in score order
(V4) or position order (V4.1), -1 at the tail."""
from __future__ import annotations

import torch


def _best_first(scores: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Column indices per row: eligible ones by descending score, ties by lowest index, then the rest."""
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    ineligible = (~eligible).gather(1, by_score).to(torch.int8)
    return by_score.gather(1, torch.sort(ineligible, dim=1, stable=True).indices)


def _topk_from(scores: torch.Tensor, eligible: torch.Tensor, k: int, order: str) -> torch.Tensor:
    T, S = scores.shape
    if k == 0:
        return torch.empty((T, 0), dtype=torch.int64)
    best = _best_first(scores, eligible)[:, :k]
    count = eligible.sum(dim=1, keepdim=True).clamp(max=k)
    valid = torch.arange(k)[None, :] < count
    if order == "position":
        best = torch.sort(torch.where(valid, best, S), dim=1).values
    return torch.where(valid, best, -1)
