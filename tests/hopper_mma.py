"""An FP8 tensor core's sum as FP8.LINEAR models Hopper's (DeepSeek-V3 §3.3.2, "around 14 bits"): 32
products a step; each addend, and the accumulator, aligned to the largest of them and cut toward zero to
`fraction_bits` below its leading bit.  On an H100 it came within 3·10^-5 of DeepGEMM's MQA logits
(docs/PRODUCTION.md, 2026-12-07 evening), not bit for bit: a stand-in for the rules' bounds, not a golden."""
import torch


def mma_sum(products: torch.Tensor, fraction_bits: int = 13) -> torch.Tensor:
    """Σ over the last axis of exact float64 products, as the modelled MMA sums them."""
    acc = torch.zeros(products.shape[:-1], dtype=torch.float64)
    for step in range(0, products.shape[-1], 32):
        terms = torch.cat([acc[..., None], products[..., step:step + 32]], -1)
        top = terms.abs().amax(-1, keepdim=True)
        ulp = torch.where(top > 0, torch.exp2(torch.floor(torch.log2(top)) - fraction_bits), torch.ones_like(top))
        acc = (torch.trunc(terms / ulp) * ulp).sum(-1)
    return acc
