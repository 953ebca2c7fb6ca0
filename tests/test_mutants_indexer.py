"""Variant naming on the indexer mutants (tests/test_mutants.py asserts that every mutant is caught)."""
from mutants.indexer import MUTANTS


def test_one_cast_score_is_named_as_the_known_variant():
    from dsv4spec.properties.suite import run_rule
    from dsv4spec.properties.target import Target
    row = run_rule("IDX.SCORE.ROUNDING", Target(MUTANTS["fp32_then_one_cast"][0], "m"), "ci")
    assert "matches score_rounding=fp32_then_bf16" in row.detail, row.detail
