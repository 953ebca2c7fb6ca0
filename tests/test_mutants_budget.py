"""A drifted claims ledger is reported (tests/test_mutants.py asserts that every budget mutant is caught)."""
from dataclasses import replace

import pytest

from dsv4spec.spec import claims


@pytest.mark.parametrize("claim_id,change", [("v41-890", dict(stated=889)),                     # drifted value
                                              ("masked-scores-zero", dict(verdict=claims.REPRODUCED)),
                                              ("sixteen-pages", dict(rule="IDX.NO_SUCH_RULE"))])
def test_a_drifted_ledger_is_reported(monkeypatch, claim_id, change):
    assert claims.problems() == []
    drifted = tuple(replace(c, **change) if c.id == claim_id else c for c in claims.CLAIMS)
    monkeypatch.setattr(claims, "CLAIMS", drifted)
    assert any(claim_id in p for p in claims.problems())
