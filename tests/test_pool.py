"""Candidate pool and layer roles: impl passes every POOL/LAYER rule; hand-derived vectors; role
tables counted by hand from the configs (the LAYER rules' sources); bad input is refused clearly."""
import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
from dsv4spec.properties.pool import wide_case
from dsv4spec.properties.ranking import assert_pool
from dsv4spec.spec import pool as spec
from dsv4spec.spec.models import PROFILES, V3_2, V4_1_FLASH, V4_FLASH, V4_PRO

def test_newest_block_uses_floor_division():
    assert [spec.newest_block(n) for n in (0, 1, 8, 9, 16, 16384, 16385)] == [-1, 0, 0, 1, 1, 2047, 2048]


def _prefill(rows: int):
    scores = np.where(np.arange(rows)[None, :] <= np.arange(rows)[:, None], 1.0, -np.inf)
    return scores, np.arange(1, rows + 1)


def test_twenty_row_prefill_keeps_62_unreachable_positions():
    """V41-model L583-610: row t (compress_lens t+1, W = 20) keeps blocks 0..t//8, i.e.
    min(20, 8·(t//8 + 1)) positions; minus the t+1 reachable ones: 28 + 28 + 6 = 62."""
    scores, lens = _prefill(20)
    for pool in (spec.candidate_blocks(scores, lens),
                 impl.candidate_blocks(torch.tensor(scores, dtype=torch.float32), torch.tensor(lens)).numpy()):
        assert int(pool.sum() - lens.sum()) == 62
        assert all(pool[t, : t + 1].all() for t in range(20))


@pytest.mark.parametrize("n, pruned", [(16383, False), (16384, False), (16385, True), (16392, True), (16393, True)])
def test_all_reachable_boundary_is_inclusive(n, pruned):
    case = wide_case(n)
    got = impl.candidate_blocks(torch.tensor(case.scores, dtype=torch.float32), torch.tensor(case.compress_lens))
    got = got.numpy()[0]
    assert (not got[:n].all()) == pruned
    assert got.sum() <= 16384 and got[:n].sum() >= min(n, 16377)
    blocks = -(-n // 8)
    assert np.array_equal(got, spec.candidate_blocks(case.scores, case.compress_lens)[0])
    assert (blocks <= 2048) != pruned


def test_pinned_block_takes_one_of_the_slots():
    """3 reachable blocks, topk_blocks 2, newest block worst: pool = best old block + newest block."""
    scores = np.array([[5.0] * 8 + [4.0] * 8 + [-9.0] * 3])
    pool = spec.candidate_blocks(scores, np.array([19]), topk_blocks=2)
    assert pool[0].tolist() == [True] * 8 + [False] * 8 + [True] * 3


def test_ranking_checker_sees_each_clause():
    scores, lens = _prefill(12)
    good = spec.candidate_blocks(scores, lens)
    assert_pool(good, scores, lens, 2048, 8)
    broken = good.copy()
    broken[:, 0] = False
    with pytest.raises(AssertionError, match="whole_blocks"):
        assert_pool(broken, scores, lens, 2048, 8, clauses=("whole_blocks",))
    with pytest.raises(AssertionError, match="newest"):
        assert_pool(np.zeros_like(good), scores, lens, 2048, 8, clauses=("newest",))


def test_v41_role_table():
    """The V4.1 roles from its config (LAYER.V41's sources), row by row."""
    roles = spec.layer_roles(V4_1_FLASH)
    kinds = [r.kind for r in roles]
    assert [i for i, k in enumerate(kinds) if k == "window"] == [0, 1, 40, 41, 42]
    assert [i for i, k in enumerate(kinds) if k == "index_source"] == [2, 8, 14]
    assert [i for i, k in enumerate(kinds) if k == "candidate_source"] == [20]
    assert [i for i, k in enumerate(kinds) if k == "reindex"] == [24, 28, 32, 36]
    for i in (3, 7, 9, 13, 15, 19):
        assert roles[i] == spec.Role("reuse", i - (i - 2) % 6, i - (i - 2) % 6)
    for i in (21, 23):
        assert roles[i] == spec.Role("reuse", 20, 20)
    for i in (25, 27, 29, 31, 33, 35, 37, 39):
        assert roles[i] == spec.Role("reuse", 20, i - (i % 4))
    for i in (24, 28, 32, 36):
        assert roles[i] == spec.Role("reindex", 20, i, 20)
    assert roles[20] == spec.Role("candidate_source", 20, 20)       # its own top-k is unrestricted


@pytest.mark.parametrize("model", list(PROFILES.values()), ids=list(PROFILES))
def test_role_invariants_over_all_layers(model):
    roles = spec.layer_roles(model)
    assert len(roles) == len(model.compress_ratios)
    for layer, role in enumerate(roles):
        assert role.kind in spec.ROLE_KINDS
        assert (role.kind == "window") == (model.ratio(layer) == 0)
        assert role.kv_source <= layer and role.topk_source <= layer and role.pool_source < max(layer, 1)
        if role.topk_source >= 0:
            assert spec.has_indexer(roles[role.topk_source])
        if role.pool_source >= 0:
            assert roles[role.pool_source].kind == "candidate_source"
        if model in (V4_FLASH, V4_PRO):
            assert spec.has_indexer(role) == (model.ratio(layer) == 4)
            assert (role.kind == "hca") == (model.ratio(layer) == 128)


def test_v4_counts():
    """From the configs' compress_ratios: V4-Flash 21 CSA + 20 HCA; V4-Pro 30 CSA + 31 HCA (MTP excluded)."""
    for model, csa, hca in ((V4_FLASH, 21, 20), (V4_PRO, 30, 31)):
        kinds = [r.kind for r in spec.layer_roles(model)[: model.n_layers]]
        assert (kinds.count("csa"), kinds.count("hca")) == (csa, hca)
    assert {r.kind for r in spec.layer_roles(V3_2)} == {"dsa"}


BAD = [
    (lambda: impl.candidate_blocks(torch.zeros(2, 8), torch.tensor([9, 0])), "compress_lens must lie in [0, 8]"),
    (lambda: impl.candidate_blocks(torch.zeros(2, 8), torch.tensor([3, 8])), "must be −inf"),
    (lambda: impl.candidate_blocks(torch.zeros(2, 8), torch.tensor([8])), "expected one per query (2)"),
    (lambda: impl.candidate_blocks(torch.full((1, 8), float("nan")), torch.tensor([8])), "contains NaN"),
    (lambda: impl.reindex_topk(torch.zeros(1, 1, 16), torch.zeros(4, 16), torch.zeros(1, 1), torch.tensor([4]),
                               torch.ones(1, 5, dtype=torch.bool), 2), "pool has shape (1, 5)"),
    (lambda: impl.reindex_topk(torch.zeros(1, 1, 16), torch.zeros(4, 16), torch.zeros(1, 1), torch.tensor([4]),
                               torch.ones(1, 4, dtype=torch.bool), 5), "topk must be an int in [0, 4]"),
    (lambda: impl.layer_role("v4.1-flash", 43), "has layers 0..42"),
]


@pytest.mark.parametrize("call, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert message in str(e.value)


# ------------------------------------------------------------------------------------------------
# No false alarms (issue 7): the official transcription passes; the boundaries that made it fail
# ------------------------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402

from dsv4spec import official  # noqa: E402
from dsv4spec.properties.indexer import expected_scores  # noqa: E402
from dsv4spec.properties.pool import PoolCase, _least_reachable, reindex_cases, wide_reindex_case  # noqa: E402
from dsv4spec.properties.ranking import TOPK_CLAUSES, assert_topk  # noqa: E402
from dsv4spec.properties.suite import PASS, run_rule  # noqa: E402
from dsv4spec.properties.target import load_target  # noqa: E402
from dsv4spec.spec import indexer as spec_indexer  # noqa: E402


def test_reindex_accepts_any_tie_breaking_on_the_wide_pool():
    """The issue's wide example: 4282 pool positions tie at score 0 for the last of 512 slots;
    torch.topk takes some of them, not the lowest-indexed ones, and that conforms (topk_ties any)."""
    case = wide_reindex_case()
    sc = case.scores
    ref, tol = expected_scores(load_target("official"), sc)
    eligible = case.pool & spec_indexer.visibility_mask(sc.visible, sc.k.shape[0])
    pooled = np.where(eligible, ref, -np.inf)[0]
    kth = np.sort(pooled)[::-1][case.topk - 1]
    assert kth == 0.0 and int(np.sum(pooled == 0.0)) == 4282
    got = official.reindex_topk(*sc.torch(), torch.from_numpy(case.pool), case.topk)
    args = (got, pooled[None], eligible, case.topk, "position")
    assert_topk(*args, tol=tol, clauses=tuple(c for c in TOPK_CLAUSES if c != "lowest_index"))
    with pytest.raises(AssertionError, match="lowest_index"):         # what the old check demanded
        assert_topk(*args, tol=tol, clauses=("lowest_index",))
    assert run_rule("POOL.REINDEX", load_target("official")).status == PASS


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=reindex_cases())
def test_reindex_pools_come_from_candidate_selection(case):
    """Only pools made by candidate selection are in the domain: never fewer than min(k, visible)
    visible pool positions (a random sparse pool was, and the official code fails it)."""
    eligible = case.pool & spec_indexer.visibility_mask(case.scores.visible, case.scores.k.shape[0])
    assert (eligible.sum(axis=1) >= np.minimum(case.topk, case.scores.visible)).all()


def test_pool_size_floor_discounts_blocks_that_score_minus_inf():
    """topk_blocks 3, 40 reachable positions, blocks 0–2 all −inf: the pool is the newest block and
    block 3 — 16 reachable positions, below capacity − 7 = 17 and right (POOL.DROP_INF)."""
    scores = np.zeros((1, 40))
    scores[0, :24] = -np.inf
    case = PoolCase("−inf older blocks", scores, np.array([40]), 3)
    for target in (official, impl):
        got = target.candidate_blocks(torch.tensor(scores, dtype=torch.float32), torch.tensor([40]), 3).numpy()
        assert got[0].tolist() == [False] * 24 + [True] * 16
    assert _least_reachable(scores[0], 40, 3, 8) == 16 < 3 * 8 - 8 + 1
    assert _least_reachable(np.zeros(40), 40, 3, 8) == 24 and _least_reachable(scores[0], 0, 3, 8) == 0
    assert case.topk_blocks * case.block_size == 24
    assert run_rule("POOL.SIZE", load_target("official")).status == PASS


def test_official_passes_the_pool_and_role_rules():
    for rule_id in ("POOL.TOPK_BLOCKS", "POOL.PIN_EMPTY", "POOL.DROP_INF", "LAYER.V4", "LAYER.V41"):
        assert run_rule(rule_id, load_target("official")).status == PASS, rule_id
