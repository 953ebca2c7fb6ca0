"""Checks of the V4.1 candidate pool (POOL.*) and the layer roles (LAYER.*).

Operation contract (torch CPU tensors in and out; a target provides any subset):

    candidate_blocks(scores f32 [T, W], compress_lens int64 [T], topk_blocks=2048, block_size=8)
        -> bool [T, W]
        select_candidate_blocks: scores at s ≥ compress_lens[t] are −inf (the causal mask);
        blocks of 8 padded with −inf, block score = max, block (compress_lens − 1) // 8 pinned to
        +inf (none when compress_lens = 0), top min(topk_blocks, n_blocks) blocks, −inf blocks
        dropped, the kept blocks' positions cut at W.
    reindex_topk(q [T,H,D], k [S,D], w [T,H], visible int64 [T], pool bool [T,S], topk: int)
        -> int64 [T, topk]
        BF16 index scores (as index_scores), −inf outside pool ∩ visible, top-k in V4.1 order
        (ascending positions, min(topk, |pool ∩ visible|) valid entries, then −1).
    layer_role(model: str, layer: int) -> spec.pool.Role (kind, kv_source, topk_source, pool_source)

Bad input (compress_lens outside [0, W], finite scores past compress_lens, NaN, a pool of another
shape, topk outside [0, S], an unknown model or layer) raises ValueError/TypeError.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import indexer as spec_indexer
from ..spec import pool as spec
from ..spec.models import PROFILES, profile
from ..spec.rules import V4
from .compare import as_numpy
from .indexer import ScoreCase, _t, expected_scores, make_score_case
from .ranking import TOPK_CLAUSES, assert_pool, assert_topk
from .checking import check, forall

__all__ = ["OPS", "PoolCase", "pool_cases"]

OPS = {
    "candidate_blocks": "candidate_blocks(scores [T,W], compress_lens [T], topk_blocks=2048, block_size=8) "
                        "-> bool [T,W]",
    "reindex_topk": "reindex_topk(q [T,H,D], k [S,D], w [T,H], visible [T], pool bool [T,S], topk) -> int64 [T,topk]",
    "layer_role": "layer_role(model, layer) -> Role(kind, kv_source, topk_source, pool_source)",
}


@dataclass
class PoolCase:
    """Candidate-source scores [T, W] (−inf past compress_lens) and the selection parameters."""
    label: str
    scores: np.ndarray
    compress_lens: np.ndarray
    topk_blocks: int
    block_size: int = spec.BLOCK_SIZE

    def __repr__(self):
        lens = self.compress_lens.tolist()
        return (f"PoolCase({self.label!r}, T={self.scores.shape[0]} W={self.scores.shape[1]}, "
                f"compress_lens={lens if len(lens) <= 8 else lens[:8] + ['…']}, topk_blocks={self.topk_blocks})")


POOL_KINDS = ("normal", "equal", "few_values", "weak_newest", "prefill", "minus_inf_blocks")


def make_pool(kind: str, seed: int, T: int, W: int, topk_blocks: int) -> PoolCase:
    rng = np.random.default_rng(seed)
    scores = spec_indexer.round_bf16(rng.standard_normal((T, W)))
    lens = rng.integers(0, W + 1, T)
    lens[rng.integers(0, T)] = W
    if rng.random() < 0.3:
        lens[rng.integers(0, T)] = 0
    if kind == "equal":
        scores[:] = 0.5
    elif kind == "few_values":
        scores = rng.integers(-2, 3, (T, W)) * 0.25
    elif kind == "weak_newest":             # the newest block scores below every older block
        for t, n in enumerate(lens):
            last = spec.newest_block(int(n))
            if last >= 0:
                scores[t, last * 8: n] = -100.0
    elif kind == "prefill":                 # ratio-1 prefill rows: compress_lens = start + t + 1
        start = int(rng.integers(0, max(1, W - T + 1)))
        lens = np.minimum(start + np.arange(1, T + 1), W)
    elif kind == "minus_inf_blocks":        # whole reachable blocks already −inf
        blocks = rng.random((T, -(-W // 8))) < 0.4
        scores = np.where(np.repeat(blocks, 8, axis=1)[:, :W], -np.inf, scores)
    scores = np.where(spec_indexer.visibility_mask(lens, W), scores, -np.inf)
    return PoolCase(f"{kind}/seed={seed}", scores, lens.astype(np.int64), topk_blocks)


@st.composite
def pool_cases(draw, kinds=POOL_KINDS, capacity: bool = False):
    """With `capacity`, one draw in 4 is a full-size row at 16383, 16384 or 16385 reachable positions."""
    if capacity and draw(st.integers(0, 3)) == 0:
        return wide_case(draw(st.sampled_from((16383, 16384, 16385))), draw(st.sampled_from(("normal", "weak_newest"))),
                         draw(st.integers(1, 9)))
    k8 = draw(st.integers(0, 9))
    W = draw(st.sampled_from((max(1, 8 * k8 - 1), max(1, 8 * k8), 8 * k8 + 1))) + draw(st.sampled_from((0, 0, 13)))
    return make_pool(draw(st.sampled_from(kinds)), draw(st.integers(0, 2 ** 32 - 1)), draw(st.integers(1, 5)),
                     W, draw(st.sampled_from((1, 2, 3, 5, spec.TOPK_BLOCKS))))


def wide_case(n: int, kind: str = "normal", extra: int = 9) -> PoolCase:
    """One decode-like row with n reachable positions at full size (2048 blocks of 8)."""
    scores = spec_indexer.round_bf16(np.random.default_rng(n).standard_normal((1, n + extra)))
    if kind == "weak_newest":
        scores[0, spec.newest_block(n) * 8: n] = -100.0
    scores[0, n:] = -np.inf
    return PoolCase(f"{kind}, {n} reachable", scores, np.array([n]), spec.TOPK_BLOCKS)


WIDE = tuple(dict(case=wide_case(n)) for n in (16383, 16384, 16385, 16392, 16393)) + (
    dict(case=wide_case(16390, "weak_newest")),)
EDGE = (dict(case=make_pool("prefill", 0, 20, 20, 2048)), dict(case=make_pool("weak_newest", 1, 3, 61, 3)),
        dict(case=PoolCase("compress_lens 0", np.full((2, 17), -np.inf), np.array([0, 0]), 2048)),
        dict(case=make_pool("minus_inf_blocks", 1, 3, 45, 3)))


def _pool(target, case: PoolCase) -> np.ndarray:
    return as_numpy(target.candidate_blocks(_t(case.scores), _t(case.compress_lens, torch.int64),
                                            case.topk_blocks, case.block_size))


def _pool_check(target, case: PoolCase, clauses, what: str):
    assert_pool(_pool(target, case), case.scores, case.compress_lens, case.topk_blocks, case.block_size,
                clauses=clauses, pin_empty=target.variant("pool_pin_empty"), what=f"{what} [{case!r}]")


@check("POOL.BLOCK_SCORE", ops=("candidate_blocks",))
@forall(*EDGE, case=pool_cases(("normal", "few_values", "weak_newest", "minus_inf_blocks")))
def kept_block_scores_are_the_top_block_maxima(target, case):
    _pool_check(target, case, ("selection",), "POOL.BLOCK_SCORE (block score = max of 8)")


@check("POOL.PIN_NEWEST", ops=("candidate_blocks",))
@forall(*EDGE, WIDE[-1], case=pool_cases(("weak_newest", "prefill")))
def newest_block_is_always_kept(target, case):
    _pool_check(target, case, ("newest",), "POOL.PIN_NEWEST")


@check("POOL.PIN_EMPTY", ops=("candidate_blocks",))
@forall(*EDGE, case=pool_cases(("normal", "prefill")))
def nothing_is_pinned_without_reachable_positions(target, case):
    _pool_check(target, case, ("empty",), f"POOL.PIN_EMPTY (pool_pin_empty={target.variant('pool_pin_empty')})")


@check("POOL.PIN_COUNTS", ops=("candidate_blocks",))
@forall(*EDGE, WIDE[-1], case=pool_cases(("weak_newest",)))
def pinned_block_is_one_of_the_topk_blocks(target, case):
    _pool_check(target, case, ("size",), "POOL.PIN_COUNTS (at most topk_blocks blocks, the pinned one included)")


@check("POOL.TOPK_BLOCKS", ops=("candidate_blocks",))
@forall(*EDGE, *WIDE, case=pool_cases(capacity=True))
def pool_is_a_topk_of_blocks(target, case):
    clauses = ("selection",) + (("lowest_index",) if target.variant("topk_ties") == "lowest_index" else ())
    _pool_check(target, case, clauses, f"POOL.TOPK_BLOCKS (topk_ties={target.variant('topk_ties')})")


@check("POOL.DROP_INF", ops=("candidate_blocks",))
@forall(*EDGE, case=pool_cases(("prefill", "minus_inf_blocks", "normal")))
def pool_blocks_hold_reachable_positions(target, case):
    _pool_check(target, case, ("reachable",), "POOL.DROP_INF")


@check("POOL.MASK", ops=("candidate_blocks",))
@forall(*EDGE, case=pool_cases())
def pool_is_a_mask_of_whole_blocks(target, case):
    _pool_check(target, case, ("shape", "whole_blocks"), "POOL.MASK")


@check("POOL.SIZE", ops=("candidate_blocks",))
@forall(*EDGE, *WIDE, case=pool_cases(capacity=True))
def pool_holds_at_most_16384_positions(target, case):
    _pool_check(target, case, ("size",), "POOL.SIZE")
    got = _pool(target, case)
    capacity = case.topk_blocks * case.block_size
    for t, n in enumerate(case.compress_lens):
        reachable = int(got[t, :n].sum())
        least = _least_reachable(case.scores[t], int(n), case.topk_blocks, case.block_size)
        if n > capacity and reachable < least:
            raise AssertionError(f"POOL.SIZE: row {t} of {case!r}: {reachable} reachable candidates of {n}, "
                                 f"expected ≥ {least} (capacity − {case.block_size} + 1 = "
                                 f"{capacity - case.block_size + 1} less the blocks scoring −inf)")


def _least_reachable(row: np.ndarray, n: int, topk_blocks: int, block_size: int) -> int:
    """The reachable positions a pool must hold: those of the newest block, plus a whole block for
    each of the topk_blocks − 1 best older blocks — only those with a finite maximum, since
    POOL.DROP_INF drops the rest."""
    newest = spec.newest_block(n, block_size)
    if newest < 0:
        return 0
    older = row[: newest * block_size].reshape(newest, block_size)
    finite = int(np.isfinite(older.max(axis=1, initial=-np.inf)).sum())
    return n - newest * block_size + block_size * min(topk_blocks - 1, finite)


@check("POOL.ALL_REACHABLE", ops=("candidate_blocks",))
@forall(*WIDE, *EDGE, case=pool_cases(("normal", "few_values", "prefill", "weak_newest"), capacity=True))
def every_reachable_position_is_a_candidate_iff_n_le_capacity(target, case):
    got = _pool(target, case)
    capacity = case.topk_blocks * case.block_size
    for t, n in enumerate(case.compress_lens):
        if not np.isfinite(case.scores[t, :n]).all():
            continue
        everything = bool(got[t, :n].all())
        if everything != (n <= capacity):
            raise AssertionError(
                f"POOL.ALL_REACHABLE: row {t} of {case!r}: {int(got[t, :n].sum())} of {n} reachable positions "
                f"are candidates; all of them must be iff n ≤ {capacity} (≤, not <)")


@dataclass
class ReindexCase:
    scores: ScoreCase
    pool: np.ndarray
    topk: int

    def __repr__(self):
        return f"ReindexCase({self.scores!r}, pool density {self.pool.mean():.2f}, topk={self.topk})"


@st.composite
def reindex_cases(draw, wide: bool = False):
    """A re-index layer's own q and w over the candidate source's K and pool; with `wide`, one draw
    in 6 over a pruned pool (16385 to 16400 reachable positions).

    Only pools made by candidate selection are in the official domain: the source's reachable
    scores are finite, so a pool keeps ≥ min(visible, 8·(topk_blocks − 1) + 1) visible positions
    and k stays within that (as 512 ≤ 16377 in the model)."""
    if wide and draw(st.integers(0, 5)) == 0:
        return wide_reindex_case(draw(st.integers(16385, 16400)))
    kinds = st.sampled_from(("normal", "relu_zero", "ties"))
    T, H, S = draw(st.integers(1, 4)), draw(st.sampled_from((1, 4, 32))), draw(st.integers(1, 48))
    source = make_score_case(draw(kinds), draw(st.integers(0, 2 ** 32 - 1)), T, H, 16, S)
    own = make_score_case(draw(kinds), draw(st.integers(0, 2 ** 32 - 1)), T, H, 16, S)
    topk_blocks = draw(st.sampled_from((1, 2, 3, 5, spec.TOPK_BLOCKS)))
    layer20 = spec_indexer.index_scores(source.q, source.k, source.w, source.visible)
    pool = spec.candidate_blocks(layer20, source.visible, topk_blocks)
    k = draw(st.integers(0, min(S, spec.BLOCK_SIZE * (topk_blocks - 1) + 1)))
    return ReindexCase(ScoreCase(f"{own.label} over the pool of {source.label}, topk_blocks={topk_blocks}",
                                 own.q, source.k, own.w, source.visible), pool, k)


def wide_reindex_case(n: int = 16400) -> ReindexCase:
    """Layer 20's pool at n reachable positions (pruned), then a re-index layer's own scores."""
    source = make_score_case("normal", n, 1, 2, 16, n)
    source.visible[:] = n
    layer20 = spec_indexer.index_scores(source.q, source.k, source.w, source.visible)
    pool = spec.candidate_blocks(layer20, source.visible)
    own = make_score_case("normal", n + 1, 1, 2, 16, n)
    own = ScoreCase("re-index layer over layer 20's pool", own.q, source.k, own.w, source.visible)
    return ReindexCase(own, pool, 512)


@check("POOL.REINDEX", ops=("reindex_topk",))
@forall(dict(case=wide_reindex_case()), case=reindex_cases(wide=True))
def reindex_topk_stays_inside_the_pool(target, case):
    sc = case.scores
    got = target.reindex_topk(*sc.torch(), torch.from_numpy(case.pool), case.topk)
    ref, tol = expected_scores(target, sc)
    eligible = case.pool & spec_indexer.visibility_mask(sc.visible, sc.k.shape[0])
    ties = target.variant("topk_ties")
    clauses = tuple(c for c in TOPK_CLAUSES if c != "lowest_index" or ties == "lowest_index")
    assert_topk(got, np.where(eligible, ref, -np.inf), eligible, case.topk, "position", tol=tol, clauses=clauses,
                what=f"POOL.REINDEX (topk_ties={ties}) [{case!r}]")


# ------------------------------------------------------------------------------------------------
# LAYER
# ------------------------------------------------------------------------------------------------
def _roles_check(target, models, rule_id):
    for name in models:
        m = profile(name)
        for layer in range(len(m.compress_ratios)):
            got = target.layer_role(name, layer)
            want = spec.layer_role(m, layer)
            if tuple(got) != tuple(want):
                raise AssertionError(f"{rule_id}: {name} layer {layer} (ratio {m.ratio(layer)}): got {tuple(got)}, "
                                     f"expected {want}")


@check("LAYER.V4", ops=("layer_role",))
def v4_roles(target):
    _roles_check(target, V4, "LAYER.V4")


@check("LAYER.V41", ops=("layer_role",))
def v41_roles(target):
    _roles_check(target, [m for m in PROFILES if PROFILES[m].candidate_source_layer >= 0], "LAYER.V41")


def judge_pinned_newest(target, case, out):
    """A recorded candidate-source layer's pool (check-trace, trace/judge.py): the block of each
    query's newest reachable position is in it."""
    m = profile(case.model)
    visible = spec_indexer.index_visible(case.positions, m.ratio(case.layer))
    assert_pool(out["candidates"], out["scores"], visible, m.candidate_topk_blocks, m.candidate_block_size,
                clauses=("newest",), what=f"POOL.PIN_NEWEST: layer {case.layer}'s pool of its own scores [{case!r}]")
