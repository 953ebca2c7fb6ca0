"""Variant naming on the quant mutants: an undeclared known variant is named, a declared one is
VARIANT, and checks stay focused (tests/test_mutants.py asserts that every mutant is caught)."""
import pytest

from dsv4spec import impl
from dsv4spec.properties.suite import FAIL, PASS, VARIANT, load_checks, run_rule
from dsv4spec.spec.rules import select
from dsv4spec.properties.target import Target
from mutants import mutant
from mutants.quant import CAUGHT, MUTANTS, e2m1_ties_toward_zero, fp4_idx, fp4_kv, fp8_qdq_through_bf16


# The variant an undeclared mutant must be named as (the knob value the spec can reproduce).
NAMED = {
    ("e2m1_ties_toward_zero", "FMT.E2M1.RNE"): "e2m1_ties=toward_zero",
    ("e2m1_ties_toward_zero", "FP4.E2M1.RNE"): "e2m1_ties=toward_zero",
    ("e2m1_ties_away_from_zero", "FP4.E2M1.RNE"): "e2m1_ties=away_from_zero",
    ("e2m1_zero_sign_lost", "FP4.E2M1.ZERO_SIGN"): "e2m1_zero_sign=positive",
    ("e2m1_no_clamp", "FP4.KV.CLAMP"): "e2m1_overflow=none",
    ("swapped_nibbles", "FP4.PACK.NIBBLE"): "nibble_order=high_first",
    ("e4m3_nan_on_overflow", "FMT.E4M3.SATFINITE"): "e4m3_overflow=nan",
    ("kv_scale_floor_2^-6", "FP4.KV.FLOOR"): "fp4_kv_scale_floor=6x2^-6",
    ("kv_reciprocal", "FP4.KV.DIVIDE"): "scale_apply=reciprocal",
    ("e8m0_ocp_floor", "FP4.IDX.SCALE"): "e8m0_rounding=ocp_floor",
    ("e8m0_float_log2_ceil", "FP4.IDX.SCALE"): "e8m0_rounding=float_log2_ceil",
    ("idx_amax_floor_1e-4", "FP4.IDX.FLOOR"): "fp4_idx_amax_floor=1e-4",
    ("fp8_amax_floor_1e-8", "FP8.FLOOR"): "fp8_amax_floor=1e-8",
    ("kv_scale_rounded_up", "FP4.KV.SCALE"): None,
    ("e8m0_scale_one_too_low", "FP4.IDX.FLOOR"): None,       # not "fp4_idx_amax_floor=none"
    ("e8m0_scale_one_too_low", "FP4.IDX.SCALE"): None,
    ("fp8_ocp_mx_port", "FP8.FLOOR"): "fp8_amax_floor=1e-8 + e8m0_rounding=ocp_floor",
    ("fp8_ocp_mx_port", "FP8.SCALE"): "e8m0_rounding=ocp_floor",
    ("e2m1_ties_toward_zero_and_positive_zero", "FP4.E2M1.RNE"): "e2m1_ties=toward_zero",
    ("e2m1_ties_toward_zero_and_positive_zero", "FP4.E2M1.ZERO_SIGN"): "e2m1_zero_sign=positive",
}


@pytest.mark.parametrize("name,rule_id", sorted(NAMED), ids=[f"{n}-{r}" for n, r in sorted(NAMED)])
def test_undeclared_known_variant_is_named(name, rule_id):
    """Named with every knob it deviates in, together when they meet in one check; never named
    (None) when no combination of known variants explains it."""
    provider = MUTANTS[name]
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert row.status == FAIL, row.detail
    if NAMED[name, rule_id] is None:
        assert "matches" not in row.detail, row.detail
    else:
        assert row.detail.startswith(f"matches {NAMED[name, rule_id]} (undeclared);"), row.detail


def test_every_mutant_is_used():
    assert {n for n, _ in CAUGHT} == set(MUTANTS)


def test_either_official_v4_inplace_revision_conforms_and_is_reported():
    """The initial V4 kernel's BF16 write-back is an allowed choice: VARIANT, detected; declared,
    VARIANT under the declaration."""
    provider = mutant("initial_v4_kernel", fp8_qdq=fp8_qdq_through_bf16)
    row = run_rule("FP8.V4_INPLACE", Target(provider, provider.NAME))
    assert (row.status, row.detail) == (VARIANT, "detected: v4_fp8_inplace=bf16")
    declared = mutant("declares_bf16", variants={"v4_fp8_inplace": "bf16"}, fp8_qdq=provider.fp8_qdq)
    row = run_rule("FP8.V4_INPLACE", Target(declared, declared.NAME))
    assert (row.status, row.detail) == (VARIANT, "passes under declared v4_fp8_inplace=bf16")


@pytest.mark.parametrize("rule_id", ["FMT.E2M1.RNE", "FP4.E2M1.RNE"])
def test_declared_ties_toward_zero_is_variant(rule_id):
    declared = mutant("declares_toward_zero", variants={"e2m1_ties": "toward_zero"},
                      e2m1_encode=e2m1_ties_toward_zero,
                      fp4_e4m3_quantize=lambda x: fp4_kv(x, encode=e2m1_ties_toward_zero),
                      fp4_e8m0_quantize=lambda x: fp4_idx(x, encode=e2m1_ties_toward_zero))
    row = run_rule(rule_id, Target(declared, declared.NAME))
    assert row.status == VARIANT, (row.status, row.detail)
    assert "e2m1_ties=toward_zero" in row.detail


def test_declared_variant_does_not_excuse_the_canonical_impl(monkeypatch):
    """impl declaring toward_zero ties no longer matches what it declares: FAIL, not PASS.  Naming a
    variant asks the reference once a combination: the same row again, and no reference run."""
    from dsv4spec.runner import suite
    asked = []
    reference = suite._reference_expecting
    monkeypatch.setattr(suite, "REFERENCE_PASSES", {})
    monkeypatch.setattr(suite, "_reference_expecting", lambda combo: asked.append(combo) or reference(combo))
    liar = mutant("impl_declaring_toward_zero", variants={"e2m1_ties": "toward_zero"})
    first = run_rule("FMT.E2M1.RNE", Target(liar, liar.NAME))
    assert first.status == FAIL and asked
    again = len(asked)
    second = run_rule("FMT.E2M1.RNE", Target(liar, liar.NAME))
    assert (second.status, second.detail) == (first.status, first.detail) and len(asked) == again


@pytest.mark.parametrize("rule_id", ["FP4.KV.SCALE", "FP4.E2M1.RNE", "FP8.SCALE"])
def test_mutant_of_another_rule_passes(rule_id):
    """Checks are focused: a nibble-order or floor mistake does not fail the scale/ties rules."""
    for name in ("kv_scale_floor_2^-6", "idx_amax_floor_1e-4", "kv_reciprocal"):
        if (name, rule_id) == ("kv_scale_floor_2^-6", "FP4.KV.SCALE"):
            continue    # a 2^-6 floor also mis-scales amax in (6·2^-9, 6·2^-6): subnormal scales, FP4.KV.SCALE's
        provider = MUTANTS[name]
        assert run_rule(rule_id, Target(provider, provider.NAME)).status == PASS, (name, rule_id)


# Each mutant fails exactly these rules of the codec families: every other FMT/FP4/FP8 rule passes
# (or is n/i, or VARIANT for impl's detected choice of rejecting NaN).
FOCUSED = {
    "swapped_nibbles": {"FP4.PACK.NIBBLE"},
    "e2m1_zero_sign_lost": {"FMT.E2M1.ZERO_SIGN", "FP4.E2M1.ZERO_SIGN"},
    "kv_scale_rounded_up": {"FP4.KV.SCALE"},
    "e8m0_scale_one_too_low": {"FMT.CEIL_LOG2", "FP4.IDX.SCALE", "FP4.IDX.FLOOR"},
    "e8m0_ocp_floor": {"FMT.CEIL_LOG2", "FP4.IDX.SCALE", "FP8.SCALE"},
    "e2m1_ties_toward_zero_and_positive_zero": {"FMT.E2M1.RNE", "FMT.E2M1.ZERO_SIGN", "FP4.E2M1.RNE",
                                                "FP4.E2M1.ZERO_SIGN"},
    "kv_reciprocal": {"FP4.KV.DIVIDE"},
    "kv_bf16_quotient": {"FP4.KV.DIVIDE"},
    "e2m1_no_clamp": {"FMT.E2M1.SATURATE", "FP4.KV.CLAMP"},
    "e4m3_truncating": {"FMT.E4M3.RNE", "FP8.E4M3"},
}


@pytest.mark.parametrize("name", sorted(FOCUSED))
def test_mutant_fails_only_its_own_rules(name):
    """One verdict, one place: a nibble order, a scale rule or a zero sign is reported on its own rule
    and passes the families' other rules."""
    provider = MUTANTS[name]
    target = Target(provider, name)
    # a rule none of whose checks calls a changed operation gets impl's verdict (PASS, test_conformance)
    changed = {k for k, v in vars(provider).items() if callable(v) and getattr(impl, k, None) is not v}
    reached = {c.rule_id for c in load_checks() if set(c.ops) & changed}
    failed = {r.id for r in select(["FMT", "FP4", "FP8"])
              if r.id in reached and run_rule(r.id, target).status == FAIL}
    assert failed == FOCUSED[name]
