"""Every candidate-pool and layer-role mutant is reported FAIL on the rule it breaks."""
import pytest

from mutants.pool import MUTANTS

CAUGHT_ON = [
    ("newest_not_pinned", "POOL.PIN_NEWEST"),
    ("pinned_as_2049th", "POOL.PIN_COUNTS"),
    ("truncating_division", "POOL.PIN_EMPTY"),
    ("minus_inf_blocks_kept", "POOL.DROP_INF"),
    ("prunes_one_block_early", "POOL.ALL_REACHABLE"),
    ("block_score_first_position", "POOL.BLOCK_SCORE"),
    ("best_position_only", "POOL.MASK"),
    ("twice_the_blocks", "POOL.SIZE"),
    ("block_ties_highest_declared_lowest", "POOL.TOPK_BLOCKS"),
    ("reindex_ignores_pool", "POOL.REINDEX"),
    ("hca_with_indexer", "LAYER.V4"),
    ("reindex_as_reuse", "LAYER.V41"),
]


def test_table_matches_the_catalogue():
    assert {(n, MUTANTS[n][1]) for n, _ in CAUGHT_ON} == set(CAUGHT_ON)
    assert {n for n, _ in CAUGHT_ON} == set(MUTANTS)


@pytest.mark.parametrize("name, rule_id", CAUGHT_ON)
def test_mutant_is_caught(assert_caught, name, rule_id):
    assert_caught(MUTANTS[name][0], rule_id)


def test_truncating_division_is_named_as_the_known_variant():
    from dsv4spec.properties.suite import run_rule
    from dsv4spec.properties.target import Target
    row = run_rule("POOL.PIN_EMPTY", Target(MUTANTS["truncating_division"][0], "m"), "ci")
    assert "matches pool_pin_empty=block0" in row.detail, row.detail
