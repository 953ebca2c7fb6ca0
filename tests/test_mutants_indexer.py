"""Every indexer mutant is reported FAIL on the rule it breaks (and impl passes those rules)."""
import pytest

from mutants.indexer import MUTANTS

CAUGHT_ON = [
    ("visible_p_floor", "IDX.VISIBLE"),
    ("visible_p_plus_2", "IDX.VISIBLE"),
    ("relu_after_weight", "IDX.SCORE.FORMULA"),
    ("weight_factor_missing", "IDX.WEIGHT.SCALE"),
    ("weight_factor_local_heads", "IDX.SCORE.TP"),
    ("masked_scores_zero", "IDX.MASK"),
    ("fp32_then_one_cast", "IDX.SCORE.ROUNDING"),
    ("v32_rounded_to_bf16", "IDX.SCORE.V32_FP32"),
    ("fp4_k_nibbles_swapped", "IDX.SCORE.FP4"),
    ("decode_drops_newest", "IDX.CHUNK"),
    ("hadamard_unnormalized", "HAD.MATRIX"),
    ("hadamard_random_signs", "HAD.MATRIX"),
    ("hadamard_not_rounded", "HAD.ROUNDING"),
    ("hadamard_in_v41", "HAD.ABSENT_V41"),
    ("v4_order_in_v41", "IDX.TOPK.ORDER"),
    ("minus_one_first", "IDX.TOPK.PAD"),
    ("no_minus_one", "IDX.TOPK.COUNT"),
    ("topk_of_magnitude", "IDX.TOPK.SELECTION"),
    ("ties_highest_declared_lowest", "IDX.TOPK.TIES"),
]


def test_table_matches_the_catalogue():
    assert {(n, MUTANTS[n][1]) for n, _ in CAUGHT_ON} == set(CAUGHT_ON)
    assert {n for n, _ in CAUGHT_ON} == set(MUTANTS)


@pytest.mark.parametrize("name, rule_id", CAUGHT_ON)
def test_mutant_is_caught(assert_caught, name, rule_id):
    assert_caught(MUTANTS[name][0], rule_id)


def test_one_cast_score_is_named_as_the_known_variant():
    from dsv4spec.properties.suite import run_rule
    from dsv4spec.properties.target import Target
    row = run_rule("IDX.SCORE.ROUNDING", Target(MUTANTS["fp32_then_one_cast"][0], "m"), "ci")
    assert "matches score_rounding=fp32_then_bf16" in row.detail, row.detail
