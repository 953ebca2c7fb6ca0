"""Every compressor mutant is reported FAIL on the rule it breaks."""
import pytest

from mutants import compressor

CAUGHT_ON = {
    "cmp-partial-group-emitted": "CMP.GROUPS",
    "cmp-overlap-looks-ahead": "CMP.CAUSAL",
    "cmp-overlap-halves-swapped": "CMP.OVERLAP",
    "cmp-group0-previous-score-0": "CMP.OVERLAP",
    "cmp-ape-dropped": "CMP.APE",
    "cmp-mean-pool": "CMP.GATE",
    "cmp-ratio1-unnormalized": "CMP.RATIO1",
    "cmp-eps-1e-6-everywhere": "CMP.NORM",
    "cmp-rope-at-last-token": "CMP.ROPE",
    "cmp-feed-forgets-previous-window": "CMP.STREAM",
}


def test_the_catalogue_is_complete():
    assert {name: rule for name, (rule, _) in compressor.MUTANTS.items()} == CAUGHT_ON


@pytest.mark.parametrize("name,rule_id", sorted(CAUGHT_ON.items()))
def test_mutant_is_caught(name, rule_id, assert_caught):
    _, provider = compressor.build(name)
    assert_caught(provider, rule_id)
