"""Candidate-pool and layer-role mutants: one realistic mistake each, with the rule that must report it."""
import torch

from dsv4spec.impl import pool as ref
from dsv4spec.spec import pool as spec
from dsv4spec.spec.models import profile

from . import mutant


def _blocks(scores, lens, topk_blocks=2048, block_size=8, *, pin=True, trunc_div=False, pin_extra=False,
            keep_inf=False, prune_early=False, block_score="max", whole=True, topk_scale=1, highest_ties=False):
    scores = scores.float()
    T, W = scores.shape
    nb = -(-W // block_size)
    padded = torch.full((T, nb * block_size), float("-inf"))
    padded[:, :W] = scores
    blocks = padded.view(T, nb, block_size)
    bmax = blocks.amax(2) if block_score == "max" else blocks[:, :, 0]
    last = torch.div(lens - 1, block_size, rounding_mode="trunc" if trunc_div else "floor")
    pinned = torch.arange(nb)[None, :] == last[:, None]
    if pin and not pin_extra:
        bmax = bmax.masked_fill(pinned, float("inf"))
    n = min(topk_blocks * topk_scale - (1 if prune_early and nb >= topk_blocks else 0), nb)
    key = bmax.flip(1) if highest_ties else bmax
    top = torch.sort(key, dim=1, descending=True, stable=True)
    idx = top.indices[:, :n]
    if highest_ties:
        idx = nb - 1 - idx
    keep = torch.zeros((T, nb), dtype=torch.bool)
    keep.scatter_(1, idx, torch.ones_like(idx, dtype=torch.bool) if keep_inf else top.values[:, :n] > float("-inf"))
    if pin_extra:                                     # the newest block added on top of the 2048
        keep |= pinned & (lens[:, None] > 0)
    mask = keep.repeat_interleave(block_size, 1)[:, :W]
    if not whole:                                     # only the block's best position marked
        best = padded.view(T, nb, block_size).argmax(2) + torch.arange(nb) * block_size
        point = torch.zeros((T, nb * block_size), dtype=torch.bool)
        point.scatter_(1, best, keep)
        mask = point[:, :W]
    return mask


def _flag(**flags):
    return lambda s, c, tb=2048, bs=8: _blocks(s, c, tb, bs, **flags)


def _reindex_ignoring_pool(q, k, w, visible, pool, topk):
    return ref.reindex_topk(q, k, w, visible, torch.ones_like(pool), topk)


def _hca_with_indexer(model, layer):
    role = ref.layer_role(model, layer)
    return role._replace(kind="csa", topk_source=layer) if role.kind == "hca" else role


def _reindex_as_reuse(model, layer):
    role = ref.layer_role(model, layer)
    return spec.Role("reuse", 20, 20) if role.kind == "reindex" else role


assert profile("v4.1-flash").candidate_source_layer == 20

MUTANTS = {
    "newest_not_pinned": (mutant("newest_not_pinned", candidate_blocks=_flag(pin=False)), "POOL.PIN_NEWEST"),
    "pinned_as_2049th": (mutant("pinned_as_2049th", candidate_blocks=_flag(pin_extra=True)), "POOL.PIN_COUNTS"),
    "truncating_division": (mutant("truncating_division", candidate_blocks=_flag(trunc_div=True)), "POOL.PIN_EMPTY"),
    "minus_inf_blocks_kept": (mutant("minus_inf_blocks_kept", candidate_blocks=_flag(keep_inf=True)), "POOL.DROP_INF"),
    "prunes_one_block_early": (mutant("prunes_one_block_early", candidate_blocks=_flag(prune_early=True)),
                               "POOL.ALL_REACHABLE"),
    "block_score_first_position": (mutant("block_score_first_position", candidate_blocks=_flag(block_score="first")),
                                   "POOL.BLOCK_SCORE"),
    "best_position_only": (mutant("best_position_only", candidate_blocks=_flag(whole=False)), "POOL.MASK"),
    "twice_the_blocks": (mutant("twice_the_blocks", candidate_blocks=_flag(topk_scale=2)), "POOL.SIZE"),
    "block_ties_highest_declared_lowest": (mutant("block_ties_highest_declared_lowest",
                                                  variants={"topk_ties": "lowest_index"},
                                                  candidate_blocks=_flag(highest_ties=True)), "POOL.TOPK_BLOCKS"),
    "reindex_ignores_pool": (mutant("reindex_ignores_pool", reindex_topk=_reindex_ignoring_pool), "POOL.REINDEX"),
    "hca_with_indexer": (mutant("hca_with_indexer", layer_role=_hca_with_indexer), "LAYER.V4"),
    "reindex_as_reuse": (mutant("reindex_as_reuse", layer_role=_reindex_as_reuse), "LAYER.V41"),
}


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()]


# Boundary mutants (issue 8; tests/mutants/BOUNDARIES.md).
def _pin(scores, lens, topk_blocks, block_size, newest_of, pad_value=float("-inf")):
    """select_candidate_blocks with the pinned block `newest_of(compress_lens)` (none at 0) and the
    row padded to whole blocks with `pad_value`."""
    scores = scores.float()
    T, W = scores.shape
    nb = -(-W // block_size)
    padded = torch.full((T, nb * block_size), pad_value)
    padded[:, :W] = scores
    bmax = padded.view(T, nb, block_size).amax(2)
    pinned = torch.arange(nb)[None, :] == torch.where(lens > 0, newest_of(lens), -1)[:, None]
    bmax = bmax.masked_fill(pinned, float("inf"))
    top = torch.sort(bmax, dim=1, descending=True, stable=True)
    n = min(topk_blocks, nb)
    keep = torch.zeros((T, nb), dtype=torch.bool)
    keep.scatter_(1, top.indices[:, :n], top.values[:, :n] > float("-inf"))
    return keep.repeat_interleave(block_size, 1)[:, :W]


def _newest_is_n_div_8(scores, lens, topk_blocks=2048, block_size=8):
    """The pinned block computed as compress_lens // 8: one block too far when compress_lens is a
    multiple of 8 (past the row's end: nothing pinned)."""
    return _pin(scores, lens, topk_blocks, block_size, lambda n: n // block_size)


def _pads_with_zero(scores, lens, topk_blocks=2048, block_size=8):
    """The row padded to whole blocks with F.pad's default 0 instead of −inf."""
    return _pin(scores, lens, topk_blocks, block_size, lambda n: (n - 1) // block_size, pad_value=0.0)


MUTANTS.update({
    "newest_block_n_div_8": (mutant("newest_block_n_div_8", candidate_blocks=_newest_is_n_div_8), "POOL.PIN_NEWEST"),
    "pads_with_zero": (mutant("pads_with_zero", candidate_blocks=_pads_with_zero), "POOL.DROP_INF"),
})


def _capacity_in_whole_blocks(scores, lens, topk_blocks=2048, block_size=8):
    """'Everything fits' decided on compress_lens // 8 ≤ topk_blocks (floor, not ceil): at 16385
    reachable positions all 2049 blocks are kept."""
    keep = ref.candidate_blocks(scores, lens, topk_blocks, block_size)
    fits = (lens // block_size <= topk_blocks)[:, None]
    reachable = torch.arange(scores.shape[1])[None, :] < (-(-lens // block_size) * block_size)[:, None]
    return torch.where(fits, keep | reachable, keep)


MUTANTS.update({
    "capacity_in_whole_blocks": (mutant("capacity_in_whole_blocks", candidate_blocks=_capacity_in_whole_blocks),
                                 "POOL.ALL_REACHABLE"),
})
