"""Teeth: every mutant in tests/mutants/ is reported FAIL on the rule it breaks (in the ci profile)."""
import zlib

import pytest

from dsv4spec.properties.suite import FAIL, run_rule
from dsv4spec.properties.target import Target
from mutants import catalogue

CATALOGUE = catalogue()


# Caught only after several layer cases (20-40 s each on the CI machine): make thorough runs them.
# ATTN.LAYER keeps its teeth in make test through its two cheapest layer mutants (a KV cache not
# quantized, window and compressed), tests/test_attn.py's one-case sample of the de-duplication,
# and tests/test_golden_attn.py's planted mistakes at each stage.
THOROUGH = {("layer_window_and_compressed_rows_deduplicated", "ATTN.LAYER"),
            ("layer_output_not_derotated", "ATTN.LAYER"), ("layer_q_not_rescaled_on_v4", "ATTN.LAYER"),
            ("layer_attention_without_sink", "ATTN.LAYER"),
            ("declared_kv_without_qdq_attention_without_sink", "ATTN.LAYER")}


def _one_a_rule(rows) -> set:
    """make test keeps one mutant a rule (its teeth): the first by a CRC of its id among those not
    thorough already; make thorough runs every (mutant, rule) pair."""
    kept: dict = {}
    for name, rule_id, _ in sorted(rows, key=lambda r: (zlib.crc32(f"{r[0]}-{r[1]}".encode()), r[0], r[1])):
        if (name, rule_id) not in THOROUGH:
            kept.setdefault(rule_id, name)
    return {(n, r) for n, r, _ in rows if kept.get(r) != n}


LONG_TAIL = THOROUGH | _one_a_rule(CATALOGUE)
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
