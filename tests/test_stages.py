"""A layer rule reports every broken stage, not the first (issue 40): each stage is judged from the
target's own stage before, so two mistakes in two stages are both named, in every report format,
and the cause line names the earliest."""
import json
from pathlib import Path
from unittest import mock

import pytest

import dsv4spec.impl as impl
from dsv4spec.properties import attn as checks
from dsv4spec.properties import path as path_checks
from dsv4spec.properties import report, suite
from dsv4spec.properties.causes import FIRST_BROKEN
from dsv4spec.properties.path import FIXED_LAYERS
from dsv4spec.properties.stages import StageFailures, report as report_stages, summary
from dsv4spec.properties.target import Target
from mutants import attn as attn_mutants
from mutants import declared as declared_mutants
from mutants import mutant
from mutants import path as path_mutants

SCHEMA = Path(report.__file__).with_name("report.schema.json")



def _wq_a_in_bf16(op, inputs, name, x, rows, block):
    if name != "attn_wq_a":
        return attn_mutants._fp8_projection(op, inputs, name, x, rows, block)
    return attn_mutants.fp8_linear_without_act_quant(x, inputs[name], inputs[f"{name}_scale"], block)


# wq_a a BF16 GEMM (q_latent, FP8.LINEAR) and attention without its sink (o, ATTN.PROB.ORDER)
TWO_MISTAKES = mutant("wq_a_in_bf16_and_no_sink", CONTRACT=7, attention_layer=attn_mutants._layer_with(
    _fp8_projection=_wq_a_in_bf16, sparse_attention=attn_mutants._variant(sink_mode="none")))


def _case():
    return checks.attention_case(FIXED_LAYERS[0], True, True)         # V4 CSA prefill from x: every stage


def _broken(verdicts):
    return [(v["stage"], v["rule"]) for v in verdicts if v["status"] == "FAIL"]


def test_two_mistakes_in_two_stages_are_both_named_and_a_correct_target_passes():
    verdicts = checks.attention_stage_verdicts(Target(TWO_MISTAKES, "two"), _case())
    assert _broken(verdicts) == [("q_latent", "FP8.LINEAR"), ("o", "ATTN.PROB.ORDER")]
    assert all(v["status"] == "PASS" for v in checks.attention_stage_verdicts(Target(impl, "impl"), _case()))


def test_the_index_path_names_every_broken_stage_too():
    """PATH.LAYER: the Hadamard skipped (q_had, k_had) and the lists without their offset (indices)."""
    provider = mutant("two", index_layer=path_mutants._layer_with(
        hadamard=lambda x: x.clone(), attention_index=path_mutants._concat_no_offset))
    case = path_checks.layer_case(FIXED_LAYERS[0])
    assert _broken(path_checks.stage_verdicts(Target(provider, "two"), case)) == [
        ("q_had", "PATH.HADAMARD"), ("k_had", "PATH.HADAMARD"), ("indices", "PATH.CONCAT")]
    assert path_checks.first_broken_stage(Target(impl, "impl"), case) is None


def test_the_failure_names_the_earliest_stage_first_then_every_other():
    verdicts = checks.attention_stage_verdicts(Target(TWO_MISTAKES, "two"), _case())
    with pytest.raises(StageFailures) as raised:
        report_stages("ATTN.LAYER", _case(), verdicts)
    first, line, *rest = str(raised.value).splitlines()
    assert FIRST_BROKEN.search(first).groups() == ("q_latent", "FP8.LINEAR")        # the cause line
    assert "2 of" in first and "o (ATTN.PROB.ORDER)" in first
    assert line.startswith("stage by stage: ") and "q_latent FAIL" in line and "o FAIL" in line and "kv PASS" in line
    assert any(r.startswith("also broken, stage 'o' (ATTN.PROB.ORDER)") for r in rest)
    assert raised.value.stages == verdicts


def _row(provider, name):
    """ATTN.LAYER's row for `provider` through the runner, on the one case of _case()."""
    def one_case(target):
        report_stages("ATTN.LAYER", _case(), checks.attention_stage_verdicts(target, _case()))
    chk = suite.Check("ATTN.LAYER", "one_case", one_case, ("attention_layer",))
    with mock.patch.object(suite, "checks_for", lambda rule_id: [chk]):
        return suite.run_rule("ATTN.LAYER", Target(provider, name))


def test_every_report_format_shows_each_broken_stage():
    row = _row(TWO_MISTAKES, "two")
    assert row.status == "FAIL" and _broken(row.stages) == [("q_latent", "FP8.LINEAR"), ("o", "ATTN.PROB.ORDER")]
    header = {"profile": "ci", "seed": None}
    for text in (report.terminal([row]), report.to_junit([row], header), report.to_markdown([row])):
        assert "first broken stage 'q_latent' (FP8.LINEAR)" in text and "also broken, stage 'o'" in text
        assert "o FAIL" in text
    data = json.loads(report.to_json([row], {}))
    assert data["schema_version"] == 4
    assert _broken(data["results"][0]["stages"]) == _broken(row.stages)
    schema = json.loads(SCHEMA.read_text())
    schema = {**schema, "properties": {**schema["properties"], "header": {}}}
    pytest.importorskip("jsonschema").validate({**data, "header": {}}, schema)


def test_a_correct_target_passes_with_every_stage_passing():
    row = _row(impl, "impl")
    assert row.status == "PASS" and row.stages and {v["status"] for v in row.stages} == {"PASS"}


NORMALIZED_LAYER = mutant("normalized_probabilities_layer", CONTRACT=7, variants={"attn_probs": "normalized"},
                          attention_layer=attn_mutants._layer_with(sparse_attention=attn_mutants.softmax_then_bf16))
# (the port, the choice it declares, stages judged under it): every other stage reads PASS
UNDER_A_CHOICE = [(NORMALIZED_LAYER, "attn_probs=normalized", {"o"}),
                  (declared_mutants.bf16_rope_table(), "rope_table=bf16", {"q_rot", "q_attn_rot", "kv_rot", "o_derot"})]


@pytest.mark.parametrize("provider, choice, stages", UNDER_A_CHOICE, ids=["attn_probs", "rope_table"])
def test_a_stage_judged_under_a_declared_choice_reads_variant_in_every_format(provider, choice, stages):
    row = _row(provider, provider.NAME)
    under = {v["stage"]: v["detail"] for v in row.stages if v["status"] == "VARIANT"}
    assert row.status == "VARIANT" and set(under) >= stages and set(under.values()) == {choice}, row.stages
    assert {v["status"] for v in row.stages if v["stage"] not in under} == {"PASS"}
    for text in (report.terminal([row]), report.to_junit([row], {"profile": "ci", "seed": None}),
                 report.to_markdown([row])):
        assert "stages VARIANT: " in text and all(f"{stage} ({choice})" in text for stage in stages), text
    data = json.loads(report.to_json([row], {}))
    assert data["results"][0]["stages"] == row.stages
    schema = json.loads(SCHEMA.read_text())
    schema = {**schema, "properties": {**schema["properties"], "header": {}}}
    pytest.importorskip("jsonschema").validate({**data, "header": {}}, schema)


def test_the_stage_by_stage_line_shows_a_variant_stage_with_its_choice():
    provider, choice, _ = UNDER_A_CHOICE[0]
    verdicts = checks.attention_stage_verdicts(Target(provider, provider.NAME), _case())
    assert f"o VARIANT ({choice})" in summary(verdicts) and "o_derot PASS" in summary(verdicts)


def test_kept_references_are_found_by_content_and_dropped_past_the_budget():
    """A reference is computed once for inputs of the same bytes (another array object), again for
    other bytes, dtype or shape, and the least recently used is dropped past the byte budget."""
    import numpy as np
    from dsv4spec.properties.stages import Kept
    computed = []

    def compute(x):
        computed.append(x)
        return (np.zeros(128),)                 # 1 KiB a value

    kept, x = Kept(2048), np.arange(4.0)
    first = kept.get(lambda: compute(x), x, "o")
    assert kept.get(lambda: compute(x), x.copy(), "o") is first and len(computed) == 1
    for other in (x + 1, x.astype(np.float32), x.reshape(2, 2)):
        kept.get(lambda: compute(other), other, "o")
    assert len(computed) == 4 and len(kept.values) == 2
    kept.get(lambda: compute(x), x, "o")
    assert len(computed) == 5


def _stage_check(*examples):
    """A check whose one layer case breaks stage 'o' (its judge reads attn_order) and passes stage
    'q_rot' (its judge reads rope_table): on its explicit examples, else on a drawn one."""
    from hypothesis import strategies as st
    from dsv4spec.properties.stages import judge_every_stage

    def judge_o(target, case, out):
        raise AssertionError(f"o broken under attn_order={target.variant('attn_order')}")

    def judge_q_rot(target, case, out):
        target.variant("rope_table")

    @suite.forall(*examples, n=st.integers(0, 3))
    def one_case(target, n):
        stages = [("q_rot", "ROPE.POSITIONS", judge_q_rot), ("o", "ATTN.PROB.ORDER", judge_o)]
        report_stages("ATTN.LAYER", "case", judge_every_stage(stages, target, "case", {}))
    return suite.Check("ATTN.LAYER", "one_case", one_case, ())


def test_a_stage_failed_on_an_explicit_example_stands_under_the_knobs_its_judge_did_not_read():
    """Naming a variant skips a run the failure survives: the explicit example's broken stage read
    attn_order alone, so a rope_table choice leaves it broken and an attn_order one may not."""
    outcome = suite.run_check(_stage_check(dict(n=0), dict(n=1)), Target(impl, "impl"))
    assert outcome.status == "FAIL" and outcome.standing == (frozenset({"attn_order"}),)
    assert suite._still_failing([("rope_table", "bf16")], [outcome])
    assert not suite._still_failing([("attn_order", "list")], [outcome])
    assert not suite._still_failing([("rope_table", "bf16"), ("attn_order", "list")], [outcome])


def test_a_stage_failed_on_a_drawn_example_stands_under_nothing():
    """A drawn (and shrunk) counterexample may be one a run without shrinking never draws."""
    outcome = suite.run_check(_stage_check(), Target(impl, "impl"))
    assert outcome.status == "FAIL" and outcome.standing == ()
    assert not suite._still_failing([("rope_table", "bf16")], [outcome])
