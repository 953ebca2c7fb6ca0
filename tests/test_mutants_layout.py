"""Every layout mutant is reported FAIL on the rule it breaks; an undeclared variant is named."""
import pytest

from dsv4spec.properties.suite import run_rule
from dsv4spec.properties.target import Target
from mutants import layout


CAUGHT_ON = {
    "layout-scales-first-undeclared": "LAYOUT.ORDER",
    "layout-bf16-tail-big-endian": "LAYOUT.ORDER",
    "layout-v4-pad-byte-missing": "LAYOUT.V4.MAIN",
    "layout-v41-rope-bf16-undeclared": "LAYOUT.V41.MAIN",
    "layout-index-k-scales-padded-to-8": "LAYOUT.INDEX_K",
    "layout-swa-rope-kept-bf16": "LAYOUT.V41.SWA",
    "layout-v32-scale-as-e8m0-byte": "LAYOUT.V32.INDEX_K",
    "layout-unpack-accepts-nan-scales": "LAYOUT.REJECT",
    "layout-unpack-e8m0-bias-126": "LAYOUT.UNPACK",
}


def test_the_catalogue_is_complete():
    assert {name: rule for name, (rule, _) in layout.MUTANTS.items()} == CAUGHT_ON


@pytest.mark.parametrize("name,rule_id", sorted(CAUGHT_ON.items()))
def test_mutant_is_caught(name, rule_id, assert_caught):
    _, provider = layout.build(name)
    assert_caught(provider, rule_id)


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
