"""A CPU stand-in for sgl-kernel's top-k (tests only): fast_topk_v2 with the library's signature
(sgl-kernel/python/sgl_kernel/top_k.py, fast_topk_v2), choosing with dsv4spec.impl.indexer and
returning the chosen indices in descending position order, as a kernel need not sort them; like the
library, it takes k = 2048 only (top_k.py asserts topk == 2048)."""
import torch

from dsv4spec.impl.indexer import index_topk

__version__ = "fake"
DSV4SPEC_CPU_STANDIN = True


def fast_topk_v2(score, lengths, topk, row_starts=None):
    assert topk == 2048, "fast_topk_v2 is only optimized for deepseek v3.2 model, where topk=2048"
    assert score.dtype == torch.float32 and score.dim() == 2 and row_starts is None
    chosen = index_topk(score, lengths.long(), topk, "position")
    valid = (chosen >= 0).sum(dim=1)
    flipped = chosen.clone()
    for row, count in enumerate(valid.tolist()):
        flipped[row, :count] = chosen[row, :count].flip(0)
    return flipped.to(torch.int32)
