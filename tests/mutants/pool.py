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
    """(name, the rule it must fail, the target provider): each mutant's rule, then those of ALSO."""
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()] + [
        (name, rule_id, MUTANTS[name][0]) for name, rules in ALSO.items() for rule_id in rules]


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


# Clause mutants (issue 22: each changes one clause of its rule's statement; properties/clauses.py).
def _floored_block_count(scores, lens, topk_blocks=2048, block_size=8):
    """floor(W/8) blocks instead of ceil(W/8): the partial tail block is never a candidate."""
    W = scores.shape[1]
    whole = W // block_size * block_size
    keep = torch.zeros(scores.shape, dtype=torch.bool)
    if whole:
        keep[:, :whole] = ref.candidate_blocks(scores[:, :whole].contiguous(), lens.clamp(max=whole), topk_blocks,
                                               block_size)
    return keep


def _mask_not_cut(scores, lens, topk_blocks=2048, block_size=8):
    """The block mask expanded to whole blocks and not cut at W ([T, ceil(W/8)·8])."""
    keep = ref.candidate_blocks(scores, lens, topk_blocks, block_size)
    nb = -(-scores.shape[1] // block_size)
    blocks = torch.zeros((scores.shape[0], nb * block_size), dtype=torch.bool)
    blocks[:, :scores.shape[1]] = keep
    return blocks.view(-1, nb, block_size).any(2).repeat_interleave(block_size, 1)


def _reindex_in_score_order(q, k, w, visible, pool, topk):
    """The re-index top-k left in descending score order (V4's order), not V4.1's ascending positions."""
    from dsv4spec.impl.indexer import index_scores
    from dsv4spec.impl.topk import _topk_from
    scores = index_scores(q, k, w, visible, "bf16")
    eligible = pool & (torch.arange(scores.shape[1])[None, :] < visible[:, None])
    return _topk_from(scores.masked_fill(~eligible, float("-inf")), eligible, topk, "score")


def _reindex_ignoring_visibility(q, k, w, visible, pool, topk):
    """The pool taken as the eligible set, without ∩ visible: the pinned newest block's positions past
    compress_lens are taken once the visible ones run out."""
    from dsv4spec.impl.indexer import index_scores
    from dsv4spec.impl.topk import _topk_from
    scores = index_scores(q, k, w, visible, "bf16")
    return _topk_from(scores.masked_fill(~pool, float("-inf")), pool.clone(), topk, "position")


def _reindex_masking_after_topk(q, k, w, visible, pool, topk):
    """The top-k taken over every visible position and only then cut to the pool (fewer than k kept)."""
    chosen = ref.reindex_topk(q, k, w, visible, torch.ones_like(pool), topk)
    inside = torch.gather(pool, 1, chosen.clamp(min=0)) & (chosen >= 0)
    kept = torch.where(inside, chosen, torch.full_like(chosen, torch.iinfo(chosen.dtype).max)).sort(1).values
    return torch.where(kept == torch.iinfo(chosen.dtype).max, -1, kept)


def _reindex_highest_ties(q, k, w, visible, pool, topk):
    """The re-index top-k taking the HIGHEST of tied positions (a reversed scan), ascending order kept."""
    from dsv4spec.impl.indexer import index_scores
    from dsv4spec.impl.topk import _topk_from
    scores = index_scores(q, k, w, visible, "bf16")
    eligible = pool & (torch.arange(scores.shape[1])[None, :] < visible[:, None])
    S = scores.shape[1]
    chosen = _topk_from(scores.masked_fill(~eligible, float("-inf")).flip(1), eligible.flip(1), topk, "position")
    chosen = torch.where(chosen >= 0, S - 1 - chosen, torch.full_like(chosen, S)).sort(1).values
    return torch.where(chosen == S, -1, chosen)


def _blocks_ascending(scores, lens, topk_blocks=2048, block_size=8):
    """The blocks with the SMALLEST scores kept (topk(largest=False)), the pin kept as +inf."""
    scores = scores.float()
    T, W = scores.shape
    nb = -(-W // block_size)
    padded = torch.full((T, nb * block_size), float("-inf"))
    padded[:, :W] = scores
    bmax = padded.view(T, nb, block_size).amax(2)
    pinned = torch.arange(nb)[None, :] == torch.div(lens - 1, block_size, rounding_mode="floor")[:, None]
    bmax = bmax.masked_fill(pinned, float("inf"))
    key = torch.where(torch.isfinite(bmax), -bmax, bmax)      # finite scores reversed, ±inf where they were
    top = torch.sort(key, dim=1, descending=True, stable=True)
    n = min(topk_blocks, nb)
    keep = torch.zeros((T, nb), dtype=torch.bool)
    keep.scatter_(1, top.indices[:, :n], top.values[:, :n] > float("-inf"))
    return keep.repeat_interleave(block_size, 1)[:, :W]


def _role_as(change):
    """layer_role with `change(model, layer, role)` returning the role for the layers it alters."""
    return lambda model, layer: change(model, layer, ref.layer_role(model, layer)) or ref.layer_role(model, layer)


MUTANTS.update({
    "blocks_floor_w_over_8": (mutant("blocks_floor_w_over_8", candidate_blocks=_floored_block_count),
                              "POOL.BLOCK_SCORE"),
    "smallest_blocks_kept": (mutant("smallest_blocks_kept", candidate_blocks=_blocks_ascending), "POOL.TOPK_BLOCKS"),
    "mask_not_cut_at_w": (mutant("mask_not_cut_at_w", candidate_blocks=_mask_not_cut), "POOL.MASK"),
    "reindex_in_score_order": (mutant("reindex_in_score_order", reindex_topk=_reindex_in_score_order), "POOL.REINDEX"),
    "reindex_ignores_visibility": (mutant("reindex_ignores_visibility", reindex_topk=_reindex_ignoring_visibility),
                                   "POOL.REINDEX"),
    "reindex_ties_highest_declared_lowest": (mutant("reindex_ties_highest_declared_lowest",
                                                    variants={"topk_ties": "lowest_index"},
                                                    reindex_topk=_reindex_highest_ties), "POOL.REINDEX"),
    "reindex_masks_after_topk": (mutant("reindex_masks_after_topk", reindex_topk=_reindex_masking_after_topk),
                                 "POOL.REINDEX"),
    "csa_as_hca": (mutant("csa_as_hca", layer_role=_role_as(
        lambda m, layer, r: spec.Role("hca", layer) if r.kind == "csa" else None)), "LAYER.V4"),
    "window_layer_with_hca": (mutant("window_layer_with_hca", layer_role=_role_as(
        lambda m, layer, r: spec.Role("hca", layer) if r.kind == "window" and m.startswith("v4-")
        and layer < len(profile(m).compress_ratios) - 1 else None)),
        "LAYER.V4"),
    "v4_mtp_layer_as_csa": (mutant("v4_mtp_layer_as_csa", layer_role=_role_as(
        lambda m, layer, r: spec.Role("csa", layer, layer) if m.startswith("v4-")
        and layer == len(profile(m).compress_ratios) - 1 else None)), "LAYER.V4"),
    "v41_last_layers_reuse": (mutant("v41_last_layers_reuse", layer_role=_role_as(
        lambda m, layer, r: spec.Role("reuse", 20, 36) if m.startswith("v4.1") and layer >= 40 else None)),
        "LAYER.V41"),
    "v41_kv_source_8_reuses_2": (mutant("v41_kv_source_8_reuses_2", layer_role=_role_as(
        lambda m, layer, r: spec.Role("reuse", 2, 2) if m.startswith("v4.1") and layer == 8 else None)),
        "LAYER.V41"),
    "candidate_source_as_index_source": (mutant("candidate_source_as_index_source", layer_role=_role_as(
        lambda m, layer, r: spec.Role("index_source", 20, 20) if r.kind == "candidate_source" else None)),
        "LAYER.V41"),
    "candidate_source_masked_to_itself": (mutant("candidate_source_masked_to_itself", layer_role=_role_as(
        lambda m, layer, r: r._replace(pool_source=layer) if r.kind == "candidate_source" else None)),
        "LAYER.V41"),
    "reuse_takes_the_kv_sources_topk": (mutant("reuse_takes_the_kv_sources_topk", layer_role=_role_as(
        lambda m, layer, r: r._replace(topk_source=r.kv_source) if r.kind == "reuse" else None)), "LAYER.V41"),
})

# Further rules a mutant breaks (one clause each; the catalogue lists each (mutant, rule) pair).
ALSO = {
    "newest_not_pinned": ("POOL.BLOCK_SCORE",),
    "pads_with_zero": ("POOL.BLOCK_SCORE",),
    "twice_the_blocks": ("POOL.PIN_COUNTS", "POOL.TOPK_BLOCKS", "POOL.ALL_REACHABLE"),
    "prunes_one_block_early": ("POOL.TOPK_BLOCKS", "POOL.SIZE"),
    "minus_inf_blocks_kept": ("POOL.TOPK_BLOCKS",),
    "newest_block_n_div_8": ("POOL.DROP_INF",),
}
