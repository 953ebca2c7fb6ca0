"""Steps left out on purpose and precision choices, declared (issue 40): a correct port making the
choice and declaring it reads VARIANT (or passes) with every other stage judged; undeclared it FAILs
on the stage that departs; declared but wrong elsewhere it still FAILs there."""
import numpy as np
import pytest

import dsv4spec.impl as impl
from dsv4spec.properties import attn as checks
from dsv4spec.properties import suite
from dsv4spec.properties.path import FIXED_LAYERS
from dsv4spec.properties.suite import FAIL, PASS, VARIANT, run_rule
from dsv4spec.properties.target import Target
from mutants import declared as D
from mutants import mutant

V4_PREFILL, V41_PREFILL, V4_DECODE = FIXED_LAYERS[0], FIXED_LAYERS[5], ("v4-flash", 2, 1, 27, 11)
# the stage each choice departs at first, undeclared, on the V4 decode from x (index path first)
FIRST_DEPARTING = {"fp8_linears": "q", "index_qdq": "q_fp4", "index_hadamard": "q_had", "kv_qdq": "kv_window"}


def _first_broken(provider, key):
    case = checks.attention_case(key, key[2] <= checks.PROJECTED_TOKENS, True)
    return checks.first_broken_attention_stage(Target(provider, provider.NAME), case)


@pytest.mark.parametrize("knob", sorted(D.CHOICES))
def test_a_declared_step_left_out_passes_every_stage(knob):
    assert _first_broken(D.port((knob,)), V4_DECODE) is None


@pytest.mark.thorough
@pytest.mark.parametrize("key", [V4_PREFILL, V41_PREFILL], ids=["v4-prefill", "v41-prefill"])
def test_every_step_left_out_at_once_passes_the_prefills_from_x(key):
    assert _first_broken(D.port(tuple(D.CHOICES)), key) is None


@pytest.mark.parametrize("knob", sorted(D.CHOICES))
def test_the_same_step_left_out_undeclared_fails_where_it_departs(knob):
    broken = _first_broken(D.port((knob,), declared=False), V4_DECODE)
    assert broken is not None and broken[0] == FIRST_DEPARTING[knob], broken


def test_a_port_declaring_no_kv_qdq_still_fails_a_missing_sink():
    name, rule_id, provider = next(e for e in D.catalogue() if e[0] == "declared_kv_without_qdq_attention_without_sink")
    broken = _first_broken(provider, V4_DECODE)
    assert broken is not None and broken[0] == "o", broken


def test_a_port_declaring_bf16_linears_still_fails_an_unrotated_q():
    provider = D.port(("fp8_linears",), extra_attn={"rope_rotate": lambda x, positions, freqs: x.clone()},
                      name="bf16_linears_without_rope")
    broken = _first_broken(provider, V4_DECODE)
    assert broken is not None and broken[0] == "q_attn_rot", broken


@pytest.mark.parametrize("knob", ["index_hadamard", "index_qdq"])     # kv_qdq, fp8_linears: the two tests above
def test_a_port_declaring_a_step_left_out_still_fails_an_output_not_derotated(knob):
    provider = D.port((knob,), extra_attn={"attention_output": lambda o, positions, freqs: o.clone()},
                      name=f"{knob}_not_derotated")
    broken = _first_broken(provider, V4_DECODE)
    assert broken is not None and broken[0] == "o_derot", broken


def test_a_stage_judged_under_a_declared_choice_names_it():
    case = checks.attention_case(V4_DECODE, True, True)
    provider = D.port(("kv_qdq",))
    target = Target(provider, provider.NAME)
    out = checks.run_attention_layer(target, case)
    judge = dict((name, j) for name, _, _, j in checks.ATTN_STAGES)["kv_window"]
    assert judge(target, case, out) == "kv_qdq=none"
    assert judge(Target(impl, "impl"), case, checks.run_attention_layer(Target(impl, "impl"), case)) is None


@pytest.mark.parametrize("knob", sorted(D.ATTENTION))
def test_a_declared_precision_choice_of_attention_reads_variant_on_every_attn_rule(knob, monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    provider = D.ATTENTION[knob]
    for rule_id in ("ATTN.GATHER", "ATTN.SCORE", "ATTN.PROB.BF16", "ATTN.PROB.ORDER", "ATTN.SINK", "ATTN.OUTPUT"):
        row = run_rule(rule_id, Target(provider, provider.NAME))
        assert row.status == VARIANT and f"{knob}=" in row.detail, (rule_id, row.status, row.detail)


@pytest.mark.parametrize("knob, rule_id", [("attn_scores", "ATTN.SCORE"), ("attn_probs", "ATTN.PROB.BF16")])
def test_the_same_precision_choice_undeclared_fails_its_rule(knob, rule_id, monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    provider = mutant("undeclared", **{"sparse_attention": D.ATTENTION[knob].sparse_attention})
    assert run_rule(rule_id, Target(provider, "undeclared")).status == FAIL


def test_bf16_linears_declared_read_variant_on_fp8_linear(monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 6)
    provider = D.port(("fp8_linears",))
    row = run_rule("FP8.LINEAR", Target(provider, provider.NAME))
    assert row.status == VARIANT and "fp8_linears=bf16" in row.detail, row.detail
    assert run_rule("FP8.LINEAR", Target(D.port(("fp8_linears",), declared=False), "undeclared")).status == FAIL


def test_impl_reads_pass_not_variant(monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 6)
    for rule_id in ("FP8.LINEAR", "ATTN.SCORE", "ATTN.PROB.BF16", "ROPE.PAIRS", "CMP.ROPE"):
        assert run_rule(rule_id, Target(impl, "impl")).status == PASS, rule_id


def test_normalised_probabilities_lie_inside_the_widening_and_outside_the_official_interval():
    """attn_probs=normalized admits one BF16 rounding of each normalised weight: the port's output lies
    inside that interval, and outside the official one (the rounding differs from the kernel's)."""
    case = checks.make_case(5, "v4-flash", 1, 4, 32, 130)
    got = checks.run(D.ATTENTION["attn_probs"], case)
    assert checks.spec.admitted(got, *case.bounds("any", probs="normalized")).all()
    assert not checks.spec.admitted(got, *case.bounds("any")).all()


def test_a_declared_bf16_rope_table_passes_every_rotated_stage_and_undeclared_fails_one():
    assert _first_broken(D.bf16_rope_table(), V4_DECODE) is None
    broken = _first_broken(D.bf16_rope_table(declared=False), V4_DECODE)
    assert broken is not None and broken[1] == "ROPE.POSITIONS", broken


@pytest.mark.parametrize("rule_id", ["ROPE.ROUNDING", "ROPE.PAIRS", "ATTN.DEROTATE", "CMP.ROPE"])
def test_a_declared_bf16_rope_table_reads_variant_on_the_rotations(rule_id, monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    row = run_rule(rule_id, Target(D.bf16_rope_table(), "bf16_rope_table"))
    assert row.status == VARIANT and "rope_table=bf16" in row.detail, row.detail


@pytest.mark.parametrize("rule_id", ["ATTN.DEROTATE"])
def test_the_bf16_rope_table_undeclared_fails_the_rotations(rule_id, monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    assert run_rule(rule_id, Target(D.bf16_rope_table(declared=False), "undeclared")).status == FAIL


@pytest.mark.parametrize("rule_id", ["ROPE.ROUNDING", "ROPE.PAIRS", "CMP.ROPE"])
def test_the_bf16_rope_table_undeclared_fails_where_the_probe_shows_it_and_is_named(rule_id, monkeypatch):
    """The probes turn a pair to nearly 0 (rope.table_rows, compressor.table_showing), where the
    table's own rounding is what remains: undeclared, a BF16 table FAILs there, named."""
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    row = run_rule(rule_id, Target(D.bf16_rope_table(declared=False), "undeclared"))
    assert row.status == FAIL and row.detail.startswith("matches rope_table=bf16 (undeclared); "), row.detail


def test_a_rotation_in_bf16_arithmetic_by_a_declared_bf16_table_reads_variant(monkeypatch):
    """A framework's BF16 tensor times the BF16 table, products and sum in BF16: admitted declared."""
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    provider = mutant("bf16_arithmetic", variants={"rope_table": "bf16"}, rope_rotate=D.rotate_in_bf16)
    row = run_rule("ROPE.PAIRS", Target(provider, "bf16_arithmetic"))
    assert row.status == VARIANT and "rope_table=bf16" in row.detail, row.detail


@pytest.mark.parametrize("rule_id", ["CMP.GATE", "CMP.OVERLAP"])
def test_compressor_pooling_in_bf16_reads_variant_declared_and_fails_undeclared(rule_id, monkeypatch):
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    row = run_rule(rule_id, Target(D.BF16_POOLING, "bf16_pooling"))
    assert row.status == VARIANT and "compressor_pooling=bf16" in row.detail, row.detail
    undeclared = mutant("undeclared", compress=D.compress_pooling_in_bf16)
    assert run_rule(rule_id, Target(undeclared, "undeclared")).status == FAIL


def test_a_difference_is_named_of_precision_or_of_logic():
    from dsv4spec.properties.compare import difference_kind
    exact = np.array([[1.0, -2.0, 0.001, 4.0]])
    assert "of precision" in difference_kind(exact * (1 + 2.0 ** -7), exact)           # two BF16 roundings
    assert "of precision" in difference_kind(exact + [[0, 0, 0.02, 0]], exact)          # small beside its row
    assert "of logic" in difference_kind(exact * [[1, 1, 1, 1.1]], exact)
    assert "of logic" in difference_kind(np.array([[1.0, np.nan]]), np.array([[1.0, 2.0]]))


@pytest.mark.parametrize("options, kind", [(dict(scores="bf16"), "precision"), (dict(sink_mode="none"), "logic")])
def test_an_attention_fail_states_its_kind_in_the_detail(options, kind, monkeypatch):
    from mutants.attn import _variant
    monkeypatch.setattr(suite.RUN, "max_examples", 10)
    rule_id = "ATTN.SCORE" if "scores" in options else "ATTN.SINK"
    row = run_rule(rule_id, Target(mutant("m", sparse_attention=_variant(**options)), "m"))
    assert row.status == FAIL and f"a difference of {kind}" in row.detail, row.detail


def test_a_rotated_stage_judged_under_a_bf16_table_names_it():
    case = checks.attention_case(V4_DECODE, True, True)
    target = Target(D.bf16_rope_table(), "bf16_rope_table")
    out = checks.run_attention_layer(target, case)
    judges = dict((name, j) for name, _, _, j in checks.ATTN_STAGES)
    assert judges["q_attn_rot"](target, case, out) == "rope_table=bf16"
    assert judges["o_derot"](target, case, out) == "rope_table=bf16"
