"""The claims ledger keeps every verdict true, and the `claims` command shows it."""
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4spec.spec import RULES
from dsv4spec.spec import claims, sources
from dsv4spec.spec.models import profile


@pytest.mark.parametrize("c", claims.CLAIMS, ids=lambda c: c.id)
def test_verdict_holds(c):
    if c.verdict == claims.REPRODUCED:
        assert c.matches(), f"{c.id}: computed {c.computed!r}, stated {c.stated!r}"
    elif c.verdict == claims.CORRECTED:
        assert not c.matches() and c.rule in RULES, f"{c.id}: {c.computed!r} vs {c.stated!r}, rule {c.rule}"
    else:
        assert c.verdict == claims.NOT_CHECKABLE and c.compute is None
    assert c.rule is None or c.rule in RULES
    assert c.documents, f"{c.id} cites no source document"
    assert [p for cite in c.sources for p in sources.problems(cite)] == []


def test_the_ledger_has_no_problems():
    assert claims.problems() == []


def test_the_brief_claims_are_all_there():
    ids = {c.id for c in claims.CLAIMS}
    for needed in ("pool-capacity", "reindex-1m-ratio", "indexer-forty-percent", "v4-main-584", "v41-main-288",
                   "index-k-4.25-bits", "v41-main-4.5-bits", "v41-890", "v4-flash-3514", "v41-vs-v4-ratio",
                   "rmsnorm-bound", "e4m3-times-e2m1-max", "entries-at-1m", "csa-1152-entries", "csa-core-151m",
                   "sixteen-pages", "indexer-one-eighth", "mqa-one-64th", "masked-scores-zero",
                   "fp4-to-fp8-lossless", "v4-pro-top-1024", "config-table", "recall-99.7", "latency-split",
                   "scoring-unit-token", "indexer-sub-linear"):
        assert needed in ids


def test_a_drifted_verdict_is_reported(monkeypatch):
    broken = tuple(replace(c, stated=3515) if c.id == "v4-flash-3514" else c for c in claims.CLAIMS)
    monkeypatch.setattr(claims, "CLAIMS", broken)
    assert any("v4-flash-3514" in p for p in claims.problems())
    wrong_rule = tuple(replace(c, rule="IDX.NOPE") if c.id == "masked-scores-zero" else c for c in claims.CLAIMS)
    monkeypatch.setattr(claims, "CLAIMS", wrong_rule)
    assert any("unknown rule IDX.NOPE" in p for p in claims.problems())


def test_cli():
    r = subprocess.run([sys.executable, "-m", "dsv4spec", "claims", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert {d["id"] for d in data} == {c.id for c in claims.CLAIMS}
    assert next(d for d in data if d["id"] == "masked-scores-zero")["computed"] == float("-inf")
    text = subprocess.run([sys.executable, "-m", "dsv4spec", "claims"], capture_output=True, text=True).stdout
    assert "CORRECTED [IDX.MASK]" in text


def _replaced(monkeypatch, claim_id, **changes):
    monkeypatch.setattr(claims, "CLAIMS", tuple(replace(c, **changes) if c.id == claim_id else c
                                                for c in claims.CLAIMS))
    return claims.problems()


def test_a_wrong_citation_is_reported(monkeypatch):
    assert any("not in Sources" in p for p in _replaced(monkeypatch, "swa-128", sources=("seed 003 §1",)))
    assert any("outside §2.1" in p for p in _replaced(monkeypatch, "swa-128", sources=("doc-003 §2.1 L199",)))
    assert any("cites no source document" in p
               for p in _replaced(monkeypatch, "swa-128", sources=("V4-model L64",)))
    assert any("outside the repository" in p
               for p in _replaced(monkeypatch, "swa-128", sources=("doc-003 §6.2 L199", "official-rules.md §7.3")))


def test_the_ledger_and_the_rules_never_contradict(monkeypatch):
    """A corrected claim rests on a rule whose `differs` disputes its document; a reproduced claim
    never rests on such a rule."""
    assert claims.documents_disputed("IDX.MASK") == {"doc-003"}
    assert claims.documents_disputed("POOL.ALL_REACHABLE") == set()
    # reproduced, but the rule it rests on says document 003 is wrong
    assert any("marked reproduced, but LAYOUT.INDEX_K says doc-003 is wrong" in p
               for p in _replaced(monkeypatch, "fp4-halves-fp8", rule="LAYOUT.INDEX_K"))
    # corrected, but the rule it cites disputes nothing in its document
    assert any("says nothing against doc-003" in p
               for p in _replaced(monkeypatch, "masked-scores-zero", rule="IDX.TOPK.SELECTION"))


def test_a_rule_that_stops_disputing_a_corrected_claim_is_reported(monkeypatch):
    monkeypatch.setitem(RULES, "IDX.MASK", replace(RULES["IDX.MASK"], differs=None))
    assert any("masked-scores-zero: marked corrected, but IDX.MASK says nothing" in p for p in claims.problems())


@pytest.mark.parametrize("claim_id, field, value, expected", [
    ("top-1024-covers-4096", "index_topk", 2048, 8192),
    ("sixteen-pages", "index_topk", 2048, (128, 2048)),
    ("v4-random-hadamard", "hadamard", False, "none"),
])
def test_figures_follow_the_model_profile(monkeypatch, claim_id, field, value, expected):
    """No verdict comes from a typed literal: change the profile and the computed value follows."""
    changed = replace(profile("v4-pro"), **{field: value})
    monkeypatch.setattr(claims, "profile", lambda name: changed if name == "v4-pro" else profile(name))
    assert next(c for c in claims.CLAIMS if c.id == claim_id).computed == expected


def test_the_score_rounding_claim_follows_the_score_dtype(monkeypatch):
    assert claims._score_rounding("v4-flash") == "rounded at every step"
    assert claims._score_rounding("v3.2") == "fp32 throughout"
    fp32 = replace(profile("v4-flash"), score_dtype="fp32")
    monkeypatch.setattr(claims, "profile", lambda name: fp32)
    assert next(c for c in claims.CLAIMS if c.id == "score-fp32-then-bf16").computed == "fp32 throughout"


def test_the_findings_page_lists_every_correction_and_the_counts():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "FINDINGS.md").read_text()
    section = readme.split("## What the source documents get wrong", 1)[1].split("\n## ", 1)[0]
    corrected = {c.id for c in claims.CLAIMS if c.verdict == claims.CORRECTED}
    assert set(re.findall(r"`([a-z0-9.-]+)`", section)) & {c.id for c in claims.CLAIMS} == corrected
    counts = {v: sum(c.verdict == v for c in claims.CLAIMS)
              for v in (claims.REPRODUCED, claims.CORRECTED, claims.NOT_CHECKABLE)}
    assert (f"{len(claims.CLAIMS)} claims, {counts[claims.REPRODUCED]} reproduced, "
            f"{counts[claims.CORRECTED]} corrected, {counts[claims.NOT_CHECKABLE]} not checkable") in \
        " ".join(section.split())
