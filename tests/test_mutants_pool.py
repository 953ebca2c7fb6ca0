"""Variant naming on the pool mutants (tests/test_mutants.py asserts that every mutant is caught)."""
from mutants.pool import MUTANTS


def test_truncating_division_is_named_as_the_known_variant():
    from dsv4spec.properties.suite import run_rule
    from dsv4spec.properties.target import Target
    row = run_rule("POOL.PIN_EMPTY", Target(MUTANTS["truncating_division"][0], "m"), "ci")
    assert "matches pool_pin_empty=block0" in row.detail, row.detail
