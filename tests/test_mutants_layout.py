"""Implementation-defined layout choices: detected when undeclared, VARIANT when declared, never
FAIL; a layout mistake next to such a choice still fails (tests/test_mutants.py: every mutant)."""
import pytest

from dsv4spec.properties.suite import run_rule
from dsv4spec.properties.target import Target
from mutants import layout

CHOICES = sorted(layout.CHOICES)


@pytest.mark.parametrize("name", CHOICES)
def test_an_undeclared_choice_is_detected_not_failed(name):
    rule_id, knob, value, provider = layout.build_choice(name)
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert (row.status, row.detail) == ("VARIANT", f"detected: {knob}={value}")


@pytest.mark.parametrize("name", CHOICES)
def test_a_declared_choice_passes_as_variant(name):
    rule_id, knob, value, provider = layout.build_choice(name)
    provider.VARIANTS = {knob: value}
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert (row.status, row.detail) == ("VARIANT", f"passes under declared {knob}={value}")


def test_a_choice_declared_otherwise_fails():
    """Scales first while declaring payload_tail_scales: the target contradicts its declaration."""
    rule_id, knob, _, provider = layout.build_choice("layout-scales-first-undeclared")
    provider.VARIANTS = {knob: "payload_tail_scales"}
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert row.status == "FAIL" and row.detail.startswith("matches entry_field_order=scales_first (undeclared)")


def test_the_unpack_rule_follows_an_undeclared_order():
    """LAYOUT.UNPACK has no knob of its own; the scales-first target's unpacking is right for its order."""
    _, _, _, provider = layout.build_choice("layout-scales-first-undeclared")
    row = run_rule("LAYOUT.UNPACK", Target(provider, provider.NAME))
    assert (row.status, row.detail) == ("VARIANT", "detected: entry_field_order=scales_first")


def test_the_v4_rope_habit_is_a_named_deviation_of_v41_main():
    """LAYOUT.V41.MAIN is normative: V4.1's code quantizes the RoPE dims with the rest (V41-model
    L758-760).  Keeping them in BF16 fails undeclared, naming the deviation, and is VARIANT declared."""
    rule_id, provider = layout.build("layout-v41-rope-bf16-undeclared")
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert row.status == "FAIL" and row.detail.startswith("matches v41_main_rope=bf16 (undeclared)")
    provider.VARIANTS = {"v41_main_rope": "bf16"}
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert (row.status, row.detail) == ("VARIANT", "passes under declared v41_main_rope=bf16")


def test_an_undeclared_scale_floor_reads_variant_on_the_field_order_too():
    """Issue 40: act_quant's floor on amax changes the 656-byte entry's bytes wherever a tile's amax is
    below 448·1e-4 (LAYOUT.ORDER's quiet example); the variant search tries that knob alone, not only
    beside another field order, and names it.  A byte-order mistake beside it still fails the order."""
    from dsv4spec.properties.layout import quiet_entry
    from dsv4spec.spec import layout as spec
    x = quiet_entry("v32_mla_kv")
    assert not (spec.pack("v32_mla_kv", x, {"v32_mla_scale_floor": "amax"}) == spec.pack("v32_mla_kv", x, {})).all()
    _, knob, value, provider = layout.build_choice("layout-v32-mla-act-quant-floor-undeclared")
    row = run_rule("LAYOUT.ORDER", Target(provider, provider.NAME))
    assert (row.status, row.detail) == ("VARIANT", f"detected: {knob}={value}")
    rule_id, provider = layout.build("layout-v32-mla-act-quant-floor-tail-big-endian")
    assert rule_id == "LAYOUT.ORDER" and run_rule(rule_id, Target(provider, provider.NAME)).status == "FAIL"
