"""Every budget mutant is reported FAIL on the rule it breaks."""
import pytest

from mutants import budget


@pytest.mark.parametrize("name", sorted(budget.MUTANTS))
def test_mutant_is_caught(name, assert_caught):
    rule_id, provider = budget.build(name)
    assert_caught(provider, rule_id)
