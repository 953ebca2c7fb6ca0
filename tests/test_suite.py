"""The runner's contract: how outcomes map to statuses, and the exit status of a verify run."""
import re
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dsv4spec.impl import quant as impl_quant
from dsv4spec.properties.suite import (ERROR, FAIL, NOT_IMPLEMENTED, PASS, RUN, TIMEOUT, exit_status,
                                       run_rule, verify)
from dsv4spec.properties.target import Target, TargetLoadError, TargetNotFound, load_target
from mutants import mutant


def test_a_target_without_the_operation_is_not_implemented_never_failed():
    row = run_rule("FP4.KV.SCALE", Target(SimpleNamespace(NAME="empty"), "empty"))
    assert row.status == NOT_IMPLEMENTED and "fp4_e4m3_quantize" in row.detail


def test_an_exception_other_than_an_assertion_is_an_error_with_its_message():
    def broken(x):
        raise RuntimeError("device lost")

    row = run_rule("FP4.KV.SCALE", Target(mutant("raises", fp4_e4m3_quantize=broken), "m"))
    assert row.status == ERROR and "device lost" in row.detail
    assert "dsv4spec verify --target m --rules FP4.KV.SCALE --profile ci" in row.reproduce


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


def _ties_away(x):
    """E2M1 quantizers that round every tie away from zero: both checks of FP4.E2M1.RNE fail."""
    return x + torch.sign(x) * 1e-3 * x.abs().amax(-1, keepdim=True) / 6


def test_every_failing_check_of_a_rule_is_listed_the_first_in_full():
    bad = mutant("ties-away", fp4_e4m3_quantize=lambda x: impl_quant.fp4_e4m3_quantize(_ties_away(x)),
                 fp4_e8m0_quantize=lambda x: impl_quant.fp4_e8m0_quantize(_ties_away(x)))
    row = run_rule("FP4.E2M1.RNE", Target(bad, "m"))
    assert row.status == FAIL and list(row.checks.values()) == [FAIL, FAIL]
    first, second = row.checks
    assert row.detail.startswith(f"{first}: FP4.E2M1.RNE") and "counterexample:" in row.detail
    assert f"also failing (1 more check):\n  FAIL {second}: FP4.E2M1.RNE" in row.detail


def test_a_failure_reads_without_hypothesis_internals_and_is_capped():
    bad = mutant("zero-codes", fp4_e8m0_quantize=lambda x: (torch.zeros_like(impl_quant.fp4_e8m0_quantize(x)[0]),
                                                            impl_quant.fp4_e8m0_quantize(x)[1]))
    RUN.seed = 1234
    try:
        rows = [run_rule("FP4.E2M1.RNE", Target(bad, "m"), "dev") for _ in range(2)]
    finally:
        RUN.seed = None
    assert rows[0].detail == rows[1].detail                     # one seed, one verdict
    assert "--profile dev --seed 1234" in rows[0].reproduce
    text = rows[0].detail
    assert not any(word in text for word in ("reproduce_failure", "Hypothesis", "inner("))
    assert len(text.splitlines()) <= 41 and "fp4_e8m0_rounds_ties_to_even(" in text


def _no_narrow_tiles(x, block=128):
    """Fails on some inputs only, with two errors: Hypothesis replays both and reports the first."""
    if block == 64:
        raise RuntimeError(f"no tile of {block} for {x.shape[1]} columns")
    if block == 32:
        raise ValueError(f"block {block} is too narrow")
    return impl_quant.fp8_quantize(x, block)


def test_the_received_call_shown_is_the_counterexamples():
    """The call shown under an error is the one the reported counterexample made, not the last call
    (Hypothesis replays every distinct failure, and reports the first)."""
    row = run_rule("FP8.BLOCKS", Target(mutant("no-narrow-tiles", fp8_quantize=_no_narrow_tiles), "m"))
    assert row.status == ERROR, row.detail
    n, block = map(int, re.search(r"shape=\((\d+), (\d+)\)", row.detail).groups())
    received = re.search(r"the target received: fp8_quantize\(tensor\(float32, shape \[(\d+), (\d+)\].*, (\d+)\)$",
                         row.detail, re.M | re.S)
    assert received and tuple(map(int, received.groups())) == (2, n, block), row.detail


def test_a_variant_that_admits_the_canonical_result_too_is_not_named():
    """fp32 probabilities (no blocking at all) pass ATTN.PROB.ORDER's checks under attn_order=list_order
    only because that reading widens the interval: impl, canonical, passes them as well."""
    from mutants import attn
    row = run_rule("ATTN.PROB.ORDER", Target(attn.MUTANTS["fp32_probabilities"][0], "m"))
    assert row.status == FAIL and "matches" not in row.detail and "list_order" not in row.detail, row.detail


def _flushes_subnormal_inputs(x):
    return impl_quant.bf16_round(torch.where(x.abs() < 2.0 ** -126, x * 0, x))


def _truncates(x):
    return impl_quant.bf16_round(x.view(torch.int32).bitwise_and(-65536).view(torch.float32))


@pytest.mark.parametrize("port, hinted", [(_flushes_subnormal_inputs, True), (_truncates, False)])
def test_subnormals_flushed_to_zero_are_named_in_the_failure(port, hinted):
    row = run_rule("FMT.BF16.RNE", Target(mutant("bf16", bf16_round=port), "m"))
    assert row.status == FAIL, row.detail
    assert ("the mismatches are subnormal values flushed to zero (FTZ/DAZ)" in row.detail) == hinted, row.detail


def test_an_operation_over_its_time_limit_is_a_timeout_that_costs_one_limit():
    def hangs(x):
        time.sleep(30)

    target = Target(mutant("hangs", fp4_e4m3_quantize=hangs), "m")
    target.timeout = 0.5
    start = time.monotonic()
    row = run_rule("FP4.KV.SCALE", target)
    assert row.status == TIMEOUT and "fp4_e4m3_quantize did not return within 0.5 s" in row.detail
    assert "--timeout 0.5" in row.reproduce
    assert run_rule("FP4.KV.FLOOR", target).status == TIMEOUT       # not called again
    assert time.monotonic() - start < 5


# ------------------------------------------------------------------------------------------------
# Finding a target
# ------------------------------------------------------------------------------------------------

MODULE = """
import torch
from dsv4spec.impl import e2m1_encode as _encode
NAME = "mine"
def e2m1_encode(x):
    return _encode(x)
def helper():
    return 1
def make():
    return Port()
class Port:
    NAME = "port"
    def e2m1_encode(self, x):
        return _encode(x)
"""


@pytest.fixture
def in_module_dir(tmp_path, monkeypatch):
    (tmp_path / "mytarget.py").write_text(MODULE)
    (tmp_path / "raising.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("mytarget", "raising"):       # another test's module of that name must not be reused
        sys.modules.pop(name, None)
    yield tmp_path
    for name in ("mytarget", "raising"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("spec, name", [
    ("mytarget", "mine"),                     # a module file in the working directory
    ("mytarget:Port", "port"),                # a class is instantiated
    ("mytarget:make()", "port"),              # a factory is called only when written with ()
    ("mytarget:e2m1_encode", "mytarget:e2m1_encode"),   # a function named like an operation: one operation
])
def test_a_target_is_found_as_documented(in_module_dir, spec, name):
    target = load_target(spec)
    assert target.name == name and target.has("e2m1_encode")
    assert run_rule("FMT.E2M1.RNE", target).status == PASS


@pytest.mark.parametrize("spec, error, message", [
    ("mytarget:helper", TargetNotFound, "not an operation of the contract; write mytarget:helper()"),
    ("mytarget:nothing", TargetNotFound, "has no attribute"),
    ("mytarget.py", TargetNotFound, "write --target mytarget"),
    ("nosuchmodule", TargetNotFound, "unknown target"),
    ("raising", TargetLoadError, "raised on import: RuntimeError: no GPU here"),
    ("mytarget:helper()", TargetNotFound, "provides none of the contract's operations"),   # helper() returned 1
])
def test_a_wrong_target_is_refused_with_its_reason(in_module_dir, spec, error, message):
    with pytest.raises(error, match=message):
        load_target(spec)


def test_one_seed_draws_the_same_examples_whatever_modules_are_loaded(tmp_path, monkeypatch):
    """Hypothesis would mix the literals of newly imported local modules into its examples (so the
    CLI, a worker and pytest drew differently from one seed); the suite draws from the seed alone."""
    drawn = []
    target = Target(mutant("spy", e2m1_encode=lambda x: drawn.append(x.numpy().copy()) or
                           impl_quant.e2m1_encode(x)), "spy")

    def examples():
        drawn.clear()
        RUN.seed = 99
        try:
            run_rule("FMT.E2M1.RNE", target, "dev")
        finally:
            RUN.seed = None
        return [d.tobytes() for d in drawn]

    before = examples()
    (tmp_path / "constants_galore.py").write_text("K = [0.7071067, 3.999999, 12345.678, 2 ** 17 + 3, -1e-38]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("constants_galore")
    assert examples() == before and len(before) > 10


def test_running_a_check_loads_no_hypothesis_profile():
    """The suite applies its settings to its own checks; the session's default profile stays."""
    from hypothesis import settings

    from dsv4spec.properties.suite import checks_for, run_check
    from dsv4spec.properties.target import load_target
    before = settings.get_current_profile_name(), repr(settings.default)
    assert run_check(checks_for("FMT.E2M1.RNE")[0], load_target("impl"), "ci").status == "PASS"
    assert (settings.get_current_profile_name(), repr(settings.default)) == before


def test_a_v41_only_target_is_asked_only_for_what_it_serves():
    """MODELS = ("v4.1-flash",): index_topk is never asked for V4's 'score' order (no ERROR for
    not faking it), and a check calling an operation for a V4 model is n/i, not ERROR."""
    import types

    import dsv4spec.impl as impl

    def position_only(scores, visible, k, order):
        if order != "position":
            raise ValueError(f"this port has only V4.1's order, not {order!r}")
        return impl.index_topk(scores, visible, k, order)

    def v41_weights(raw_w, model):
        if model != "v4.1-flash":
            raise ValueError(f"this port knows only v4.1-flash, not {model}")
        return impl.index_weights(raw_w, model)

    port = Target(types.SimpleNamespace(NAME="v41", MODELS=("v4.1-flash",), index_topk=position_only,
                                        index_weights=v41_weights), "v41")
    for rule_id in ("IDX.TOPK.COUNT", "IDX.TOPK.ORDER", "IDX.TOPK.PAD"):
        row = run_rule(rule_id, port)
        assert row.status == PASS, f"{rule_id}: {row.status} {row.detail}"
    row = run_rule("IDX.WEIGHT.SCALE", port)                  # judged on its V4.1 examples
    assert row.status == PASS and row.checks["head_weights_carry_the_global_factor"] == PASS, row
    v4 = Target(SimpleNamespace(NAME="v4", MODELS=("v4-pro",), index_rotate=impl.index_rotate), "v4")
    row = run_rule("HAD.ABSENT_V41", v4)                      # nothing to ask a V4 port: n/i, not ERROR
    assert row.status == NOT_IMPLEMENTED and "index_rotate for v4.1-flash (MODELS: v4-pro)" in row.detail, row
    with pytest.raises(ValueError, match="MODELS must be a tuple of"):
        Target(types.SimpleNamespace(MODELS="v4.1-flash", index_topk=position_only), "bad")


V4_SCORE_RULES = ("IDX.SCORE.ROUNDING", "IDX.SCORE.TP", "IDX.CHUNK", "IDX.WEIGHT.SCALE", "LAYOUT.V4.MAIN",
                  "FP8.V4_INPLACE")
V32_RULES = ("IDX.SCORE.V32_FP32", "IDX.SCORE.FORMULA", "IDX.MASK", "IDX.VISIBLE", "LAYOUT.ORDER", "LAYOUT.V32.MLA",
             "FP8.SCALE", "FP8.BLOCKS")


def test_a_v32_only_target_is_kept_from_every_rule_and_request_of_other_models():
    """Issue 40: MODELS = ("v3.2",) and fp32 scores whatever dtype is asked.  V4-only rules are n/i
    (IDX.SCORE.ROUNDING failed it: its scores are not BF16); the rules V3.2 shares are asked only
    V3.2's requests (fp32 scores, ratio 1, V3.2's entry kinds, FP8 blocks of 128) and pass; V3.2's
    rounding mistake fails its V3.2 rule."""
    from mutants import indexer
    port = Target(indexer.v32_port(), "v32")
    for rule_id in V4_SCORE_RULES:
        row = run_rule(rule_id, port)
        assert row.status == NOT_IMPLEMENTED and "(MODELS: v3.2)" in row.detail, (rule_id, row)
    for rule_id in V32_RULES:
        row = run_rule(rule_id, port)
        assert row.status == PASS, (rule_id, row)
    wrong = Target(indexer.v32_port("bf16_scores", indexer._v32_scores_rounded_to_bf16), "bf16_scores")
    assert run_rule("IDX.SCORE.V32_FP32", wrong).status == FAIL


def test_the_official_factorisation_is_an_entry_point_checked_by_the_same_rules():
    """A target offering only index_scores_raw (raw weights in) is judged on IDX.WEIGHT.SCALE and the
    IDX.SCORE rules; the same computation passes them."""
    import dsv4spec.impl as impl
    from dsv4spec.spec.models import profile

    def index_scores_raw(q, k, raw_w, visible, model):      # raw_w: any heads (a shard's); the global factor
        w = (raw_w.float() * float(np.float32(profile(model).index_weight_scale))).to(torch.bfloat16).float()
        return impl.index_scores(q, k, w, visible, "fp32" if model == "v3.2" else "bf16")

    raw_only = Target(SimpleNamespace(NAME="raw", index_scores_raw=index_scores_raw), "raw")
    assert raw_only.has("index_scores") and profile("v4.1-flash").index_weight_scale == 2 ** -6
    for rule_id in ("IDX.WEIGHT.SCALE", "IDX.SCORE.FORMULA", "IDX.SCORE.ROUNDING", "IDX.MASK"):
        row = run_rule(rule_id, raw_only)
        assert row.status == PASS, f"{rule_id}: {row.status} {row.detail}"


def test_the_private_hypothesis_hook_the_suite_patches_is_there_and_patched():
    """properties/checking.py turns off Hypothesis's mining of local modules' literals through a private
    hook; in the Hypothesis range pyproject.toml pins, the hook must exist and be patched, or a
    printed seed stops reproducing (this test then names the change); it is patched only while a check
    runs."""
    from hypothesis.internal.conjecture import providers

    from dsv4spec.properties import suite
    assert suite.SEED_ALONE, "hypothesis.internal.conjecture.providers no longer has the hook suite.py patches"
    original = providers._get_local_constants
    with suite.examples_from_the_seed_alone():
        constants = providers._get_local_constants()
        assert all(not getattr(constants, kind) for kind in ("integers", "floats", "bytes", "strings"))
    assert providers._get_local_constants is original, "the hook is given back after a check"


def test_a_check_failing_on_several_examples_reports_each_not_only_the_first():
    """Hypothesis raises a group when examples fail with distinct errors (a layer check's fixed
    cases): the first is described in full, each other one in a line, so no mistake hides behind it."""
    from dsv4spec.properties.suite import _describe
    group = ExceptionGroup("several", [AssertionError("case A: stage q differs\ncounterexample: A"),
                                       AssertionError("case B: stage o differs\ncounterexample: B"),
                                       ValueError("case C: cannot reshape")])
    text = _describe(group)
    assert text.startswith("case A: stage q differs\ncounterexample: A")
    assert "also failing: 2 more examples with another error:\n  case B: stage o differs\n" \
           "  ValueError: case C: cannot reshape" in text
