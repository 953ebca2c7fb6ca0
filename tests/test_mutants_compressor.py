"""Every compressor mutant is reported FAIL on the rule it breaks."""
import pytest

from mutants import compressor


@pytest.mark.parametrize("name", sorted(compressor.MUTANTS))
def test_mutant_is_caught(name, assert_caught):
    rule_id, provider = compressor.build(name)
    assert_caught(provider, rule_id)
