"""Every mutant of tests/mutants/quant.py is reported FAIL on the rule it breaks, and variant naming
works: an undeclared known variant is named, a declared one is VARIANT."""
import pytest

from dsv4spec.properties.suite import FAIL, PASS, VARIANT, run_rule
from dsv4spec.properties.target import Target
from mutants import mutant
from mutants.quant import MUTANTS, e2m1_ties_toward_zero, fp4_idx, fp4_kv

CAUGHT = [
    ("e2m1_ties_toward_zero", "FMT.E2M1.RNE"),
    ("e2m1_ties_toward_zero", "FP4.E2M1.RNE"),
    ("e2m1_ties_away_from_zero", "FMT.E2M1.RNE"),
    ("e2m1_ties_away_from_zero", "FP4.E2M1.RNE"),
    ("e2m1_zero_sign_lost", "FMT.E2M1.ZERO_SIGN"),
    ("e2m1_zero_sign_lost", "FP4.E2M1.ZERO_SIGN"),
    ("e2m1_no_clamp", "FMT.E2M1.SATURATE"),
    ("e2m1_no_clamp", "FP4.KV.CLAMP"),
    ("e2m1_decode_positive_zero", "FMT.E2M1.VALUES"),
    ("swapped_nibbles", "FP4.PACK.NIBBLE"),
    ("e4m3_nan_on_overflow", "FMT.E4M3.SATFINITE"),
    ("e4m3_nan_on_overflow", "FP4.KV.SATURATE"),
    ("e4m3_truncating", "FMT.E4M3.RNE"),
    ("e4m3_truncating", "FP8.E4M3"),
    ("e4m3_decode_no_subnormals", "FMT.E4M3.VALUES"),
    ("e8m0_decode_zero_is_zero", "FMT.E8M0.VALUES"),
    ("bf16_truncating", "FMT.BF16.RNE"),
    ("kv_scale_rounded_up", "FP4.KV.SCALE"),
    ("kv_scale_floor_2^-6", "FP4.KV.FLOOR"),
    ("kv_reciprocal", "FP4.KV.DIVIDE"),
    ("e8m0_ocp_floor", "FP4.IDX.SCALE"),
    ("e8m0_ocp_floor", "FP8.SCALE"),
    ("e8m0_ocp_floor", "FMT.CEIL_LOG2"),
    ("e8m0_float_log2_ceil", "FP4.IDX.SCALE"),
    ("e8m0_float_log2_ceil", "FMT.CEIL_LOG2"),
    ("idx_amax_floor_1e-4", "FP4.IDX.FLOOR"),
    ("fp8_amax_floor_1e-8", "FP8.FLOOR"),
    ("fp8_block_ignored", "FP8.BLOCKS"),
    ("fp8_qdq_through_bf16", "FP8.V4_INPLACE"),
    ("fp4_dequant_scale_halved", "FP4.DEQUANT"),
    ("fp8_dequant_scale_halved", "FP8.DEQUANT"),
    ("fp4_accepts_nonfinite", "FP4.NONFINITE"),
    ("fp8_accepts_nonfinite", "FP8.NONFINITE"),
]

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
    ("fp8_qdq_through_bf16", "FP8.V4_INPLACE"): "v4_fp8_inplace=bf16",
    ("fp4_accepts_nonfinite", "FP4.NONFINITE"): "nonfinite_input=block_local",
}


@pytest.mark.parametrize("name,rule_id", CAUGHT, ids=[f"{n}-{r}" for n, r in CAUGHT])
def test_mutant_is_caught(name, rule_id):
    provider = MUTANTS[name]
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert row.status == FAIL, f"mutant {name} survived {rule_id}: {row.status} {row.detail}"
    if (name, rule_id) in NAMED:
        assert f"matches {NAMED[name, rule_id]} (undeclared)" in row.detail, row.detail


def test_every_mutant_is_used():
    assert {n for n, _ in CAUGHT} == set(MUTANTS)


@pytest.mark.parametrize("rule_id", ["FMT.E2M1.RNE", "FP4.E2M1.RNE"])
def test_declared_ties_toward_zero_is_variant(rule_id):
    declared = mutant("declares_toward_zero", variants={"e2m1_ties": "toward_zero"},
                      e2m1_encode=e2m1_ties_toward_zero,
                      fp4_e4m3_quantize=lambda x: fp4_kv(x, encode=e2m1_ties_toward_zero),
                      fp4_e8m0_quantize=lambda x: fp4_idx(x, encode=e2m1_ties_toward_zero))
    row = run_rule(rule_id, Target(declared, declared.NAME))
    assert row.status == VARIANT, (row.status, row.detail)
    assert "e2m1_ties=toward_zero" in row.detail


def test_declared_variant_does_not_excuse_the_canonical_impl():
    """impl declaring toward_zero ties no longer matches what it declares: FAIL, not PASS."""
    liar = mutant("impl_declaring_toward_zero", variants={"e2m1_ties": "toward_zero"})
    assert run_rule("FMT.E2M1.RNE", Target(liar, liar.NAME)).status == FAIL


@pytest.mark.parametrize("rule_id", ["FP4.KV.SCALE", "FP4.E2M1.RNE", "FP8.SCALE"])
def test_mutant_of_another_rule_passes(rule_id):
    """Checks are focused: a nibble-order or floor mistake does not fail the scale/ties rules."""
    for name in ("kv_scale_floor_2^-6", "idx_amax_floor_1e-4", "kv_reciprocal"):
        provider = MUTANTS[name]
        assert run_rule(rule_id, Target(provider, provider.NAME)).status == PASS, (name, rule_id)
