"""Every budget mutant is reported FAIL on the rule it breaks; a drifted claims ledger is reported."""
from dataclasses import replace

import pytest

from dsv4spec.spec import claims
from mutants import budget

CAUGHT_ON = {
    "budget-hca-counted-at-ratio-4": "BUDGET.KV_BYTES",
    "budget-index-k-on-hca-layers": "BUDGET.KV_BYTES",
    "budget-sharing-ignored": "BUDGET.KV_BYTES",
    "budget-pool-at-layer-20": "BUDGET.INDEX_WORK",
    "budget-v41-window-in-v4-layout": "BUDGET.WINDOW",
    "budget-attention-qk-only": "BUDGET.ATTN_WORK",
}


def test_the_catalogue_is_complete():
    assert {name: rule for name, (rule, _) in budget.MUTANTS.items()} == CAUGHT_ON


@pytest.mark.parametrize("name,rule_id", sorted(CAUGHT_ON.items()))
def test_mutant_is_caught(name, rule_id, assert_caught):
    _, provider = budget.build(name)
    assert_caught(provider, rule_id)


@pytest.mark.parametrize("claim_id,change", [("v41-890", dict(stated=889)),                     # drifted value
                                              ("masked-scores-zero", dict(verdict=claims.REPRODUCED)),
                                              ("sixteen-pages", dict(rule="IDX.NO_SUCH_RULE"))])
def test_a_drifted_ledger_is_reported(monkeypatch, claim_id, change):
    assert claims.problems() == []
    drifted = tuple(replace(c, **change) if c.id == claim_id else c for c in claims.CLAIMS)
    monkeypatch.setattr(claims, "CLAIMS", drifted)
    assert any(claim_id in p for p in claims.problems())
