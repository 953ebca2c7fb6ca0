"""The claims ledger keeps every verdict true, and the `claims` command shows it."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from dsv4spec.spec import RULES
from dsv4spec.spec import claims


@pytest.mark.parametrize("c", claims.CLAIMS, ids=lambda c: c.id)
def test_verdict_holds(c):
    if c.verdict == claims.REPRODUCED:
        assert c.matches(), f"{c.id}: computed {c.computed!r}, stated {c.stated!r}"
    elif c.verdict == claims.CORRECTED:
        assert not c.matches() and c.rule in RULES, f"{c.id}: {c.computed!r} vs {c.stated!r}, rule {c.rule}"
    else:
        assert c.verdict == claims.NOT_CHECKABLE and c.compute is None
    assert c.rule is None or c.rule in RULES
    assert c.source.startswith("seed 00")


def test_the_ledger_has_no_problems():
    assert claims.problems() == []


def test_the_brief_claims_are_all_there():
    ids = {c.id for c in claims.CLAIMS}
    for needed in ("pool-capacity", "reindex-1m-ratio", "indexer-forty-percent", "v4-main-584", "v41-main-288",
                   "index-k-4.25-bits", "v41-main-4.5-bits", "v41-890", "v4-flash-3514", "v41-vs-v4-ratio",
                   "rmsnorm-bound", "e4m3-times-e2m1-max", "entries-at-1m", "csa-1152-entries", "csa-core-151m",
                   "sixteen-pages", "indexer-one-eighth", "mqa-one-64th", "masked-scores-zero",
                   "fp4-to-fp8-lossless", "v4-pro-top-1024", "config-table", "recall-99.7", "latency-split"):
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
