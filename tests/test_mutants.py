"""Teeth: every mutant in tests/mutants/ is reported FAIL on the rule it breaks (in the ci profile)."""
import zlib

import pytest

from dsv4spec.properties.suite import FAIL, run_rule
from dsv4spec.properties.target import Target
from mutants import catalogue

CATALOGUE = catalogue()


# An ATTN.LAYER mutant runs the rule's 24 explicit layer cases whatever stage it breaks (20-40 CPU s
# each on the CI machine): make thorough runs them all.  In make test the rule keeps its teeth in
# tests/test_attn.py: test_the_layer_check_names_the_planted_stage judges every layer mutant with the
# check's own stage judges, on a whole case, and names the stage it planted; test_golden_attn.py plants
# a mistake at each stage of the golden layers.
TEETH_ELSEWHERE = {"ATTN.LAYER"}


def _one_a_rule(rows) -> set:
    """make test keeps one mutant a rule (its teeth), the first by a CRC of its id, but for the rules
    whose teeth are elsewhere in make test; make thorough runs every (mutant, rule) pair."""
    kept: dict = {}
    for name, rule_id, _ in sorted(rows, key=lambda r: (zlib.crc32(f"{r[0]}-{r[1]}".encode()), r[0], r[1])):
        if rule_id not in TEETH_ELSEWHERE:
            kept.setdefault(rule_id, name)
    return {(n, r) for n, r, _ in rows if kept.get(r) != n}


LONG_TAIL = _one_a_rule(CATALOGUE)
MARKED = [pytest.param(*row, marks=pytest.mark.thorough) if row[:2] in LONG_TAIL else row for row in CATALOGUE]


@pytest.mark.parametrize("name, rule_id, provider", MARKED, ids=[f"{n}-{r}" for n, r, _ in CATALOGUE])
def test_mutant_is_caught(name, rule_id, provider):
    row = run_rule(rule_id, Target(provider, name))
    assert row.status == FAIL, f"mutant {name} survived {rule_id}: {row.status} {row.detail}"


def test_mutant_names_are_unique():
    names = [(n, r) for n, r, _ in CATALOGUE]
    assert len(names) == len(set(names))


def test_the_status_page_counts_the_mutants_and_the_pairs():
    """docs/STATUS.md states the distinct mutants and the (mutant, rule) pairs separately, both current."""
    import re
    from pathlib import Path
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "STATUS.md").read_text().split())
    distinct = int(re.search(r"(\d+) distinct mutants", text).group(1))
    pairs = int(re.search(r"(\d+) \(mutant, rule\) pairs", text).group(1))
    assert (distinct, pairs) == (len({n for n, _, _ in CATALOGUE}), len(CATALOGUE))
