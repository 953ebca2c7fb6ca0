"""The runner's contract: how outcomes map to statuses, and the exit status of a verify run."""
from types import SimpleNamespace

import pytest

from dsv4spec.properties.suite import (ERROR, FAIL, NOT_IMPLEMENTED, PASS, exit_status, run_rule,
                                       verify)
from dsv4spec.properties.target import Target, load_target
from mutants import mutant


def test_a_target_without_the_operation_is_not_implemented_never_failed():
    row = run_rule("FP4.KV.SCALE", Target(SimpleNamespace(NAME="empty"), "empty"))
    assert row.status == NOT_IMPLEMENTED and "fp4_e4m3_quantize" in row.detail


def test_an_exception_other_than_an_assertion_is_an_error_with_its_message():
    def broken(x):
        raise RuntimeError("device lost")

    row = run_rule("FP4.KV.SCALE", Target(mutant("raises", fp4_e4m3_quantize=broken), "m"))
    assert row.status == ERROR and "device lost" in row.detail
    assert row.reproduce.startswith("dsv4spec verify --target m --rules FP4.KV.SCALE")


def test_exit_status_counts_only_targets_that_claim_conformance():
    bad = mutant("zero-scales", fp4_e4m3_quantize=lambda x: (lambda p, s: (p, s * 0))(
        *load_target("impl").fp4_e4m3_quantize(x)))
    claiming, casting = Target(bad, "a", name="a"), Target(bad, "b", name="b")
    casting.claims_conformance = False
    rows = verify([claiming, casting], ["FP4.KV.SCALE"])
    assert [r.status for r in rows] == [FAIL, FAIL]
    assert exit_status(rows, [claiming, casting]) == 1
    assert exit_status([r for r in rows if r.target == "b"], [casting]) == 0


def test_impl_passes_and_claims_conformance():
    impl = load_target("impl")
    assert impl.claims_conformance
    assert run_rule("FP4.KV.SCALE", impl).status == PASS


def test_declaring_an_unknown_knob_or_value_is_an_error():
    with pytest.raises(ValueError, match="unknown variant knob"):
        Target(SimpleNamespace(VARIANTS={"no_such_knob": "x"}), "t")
    with pytest.raises(ValueError, match="has no value"):
        Target(SimpleNamespace(VARIANTS={"e2m1_ties": "sideways"}), "t")
