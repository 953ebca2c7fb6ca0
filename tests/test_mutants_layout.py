"""Variant naming on the layout mutants (tests/test_mutants.py asserts that every mutant is caught)."""
import pytest

from dsv4spec.properties.suite import run_rule
from dsv4spec.properties.target import Target
from mutants import layout


@pytest.mark.parametrize("name,knob_value", [("layout-scales-first-undeclared", "entry_field_order=scales_first"),
                                             ("layout-v41-rope-bf16-undeclared", "v41_main_rope=bf16")])
def test_undeclared_variant_is_named(name, knob_value):
    rule_id, provider = layout.build(name)
    row = run_rule(rule_id, Target(provider, provider.NAME))
    assert f"matches {knob_value}" in row.detail


@pytest.mark.parametrize("name,knob,value,rule_id", [
    ("layout-scales-first-undeclared", "entry_field_order", "scales_first", "LAYOUT.ORDER"),
    ("layout-v41-rope-bf16-undeclared", "v41_main_rope", "bf16", "LAYOUT.V41.MAIN")])
def test_declared_variant_passes_as_variant(name, knob, value, rule_id):
    _, provider = layout.build(name)
    provider.VARIANTS = {knob: value}
    assert run_rule(rule_id, Target(provider, provider.NAME)).status == "VARIANT"
