"""Decision coverage: the ci profile reaches every listed boundary of the codec, indexer and pool
rules, and a boundary that no input reaches is reported missed."""
import functools

import numpy as np
import pytest

from dsv4spec.cli import main
from dsv4spec.properties import coverage as C
from dsv4spec.properties.suite import load_checks
from dsv4spec.properties.target import load_target
from dsv4spec.spec import select

RANDOM_REQUIRED = C.REQUIRED                 # families whose random draws reach every boundary often
REQUIRED_RULES = sorted({c.rule_id for c in load_checks() if c.rule_id.split(".")[0] in C.REQUIRED})
CHECKED_RULES = sorted({c.rule_id for c in load_checks()})


LAYER_MEMO: dict = {}


@functools.lru_cache(maxsize=None)
def ci_coverage(rule_id: str) -> C.RuleCoverage:
    """A rule's ci coverage on impl, run once per process for every test that reads it (C.coverage's
    own loop runs in test_the_coverage_command); the layer results are shared by every rule (PATH,
    ROPE, ATTN run the same cases), as in one `dsv4spec coverage` run: the calls are recorded all the same."""
    return C.rule_coverage(rule_id, profile="ci", memo=LAYER_MEMO)


def test_every_checked_rule_of_every_family_lists_its_boundaries():
    assert sorted({r.split(".")[0] for r in CHECKED_RULES} - set(C.REQUIRED + C.OTHER)) == []
    assert [r for r in CHECKED_RULES if not C.boundaries(r)] == []
    for rule_id, listed in C.BOUNDARIES.items():
        names = [b.name for b in listed]
        assert len(names) == len(set(names)), rule_id
        assert {b.level for b in listed} <= set(C.LEVELS), rule_id


@pytest.mark.parametrize("family", C.REQUIRED)     # one family a test: pytest-xdist spreads them
def test_ci_reaches_every_boundary_of_fmt_fp4_fp8_idx_pool(family):
    results = [ci_coverage(r.id) for r in select([family]) if r.id in C.BOUNDARIES]
    assert {rc.rule_id for rc in results} == {r for r in REQUIRED_RULES if r.split(".")[0] == family}
    assert {rc.rule_id: [b.name for b in rc.missed] for rc in results if rc.missed} == {}
    # random draws, not only @example, hit every drawable boundary in ≥ 1/50 of them
    assert _rarely_drawn([rc for rc in results if rc.rule_id.split(".")[0] in RANDOM_REQUIRED]) == {}


def _rarely_drawn(results):
    """{rule: boundaries random draws reach in < 1/50 of one check's drawn examples} (a boundary
    only a fixed, exhaustive sweep reaches, as every layer of every model, has no rate; a layer
    boundary's rate is its strategy's, test_the_layer_strategies_reach_every_layer_boundary)."""
    rare = {rc.rule_id: [b.name for b in rc.reached if rc.reached_by(b) != "sweep" and rc.random_rate(b) < C.RANDOM_REACH
                         and rc.strategy_rate(b) is None]
            for rc in results}
    return {k: v for k, v in rare.items() if v}


# A rule run as a case of its own: ATTN.LAYER's coverage runs its 24 explicit layer cases (25 CPU s)
APART = ("ATTN.LAYER",)


def _rules_of(group: str) -> set:
    """The checked rules of a family, but those APART; or a rule APART alone."""
    if group in APART:
        return {group}
    return {r for r in CHECKED_RULES if r.split(".")[0] == group} - set(APART)


@pytest.mark.parametrize("group", [*C.OTHER, *APART])
def test_random_draws_reach_every_boundary_of_the_other_families(group):
    """HAD, CMP, LAYOUT, BUDGET, LAYER, ROPE, PATH, ATTN at ci: nothing missed, and every boundary
    that is not a sweep's is reached by random draws in ≥ 1/50 of one check's drawn examples."""
    results = [ci_coverage(rule_id) for rule_id in sorted(_rules_of(group))]
    assert {rc.rule_id for rc in results} == _rules_of(group)
    assert {rc.rule_id: [b.name for b in rc.missed] for rc in results if rc.missed} == {}
    assert _rarely_drawn(results) == {}


def test_the_recorder_sees_what_the_checks_pass():
    recorder = C.Recorder(load_target("impl"))
    recorder.e2m1_encode(__import__("torch").tensor([0.75, 1.0]))
    assert [c.op for c in recorder.calls] == ["e2m1_encode"]
    np.testing.assert_array_equal(recorder.calls[0].args[0], np.array([0.75, 1.0], np.float32))


def test_a_boundary_no_input_reaches_is_missed():
    """Inputs exactly on the 0.75 tie reach it, not its neighbours one ulp away."""
    calls = [C.Call("e2m1_encode", (np.array([0.75, -3.5], np.float32),), {})]
    reached = {b.name: b.reached(calls) for b in C.boundaries("FMT.E2M1.RNE")}
    assert reached["|x|/s at the E2M1 tie 0.75: exactly"] and reached["|x|/s at the E2M1 tie 3.5: exactly"]
    assert not reached["|x|/s at the E2M1 tie 0.75: 1 ulp below"]
    assert not reached["|x|/s at the E2M1 tie 0.75: 1 ulp above"]
    assert not any(b.reached([]) for rule in C.BOUNDARIES for b in C.boundaries(rule))


def test_codec_ties_are_seen_after_scaling_and_by_position():
    """A tie reaches the boundary only as x/s: 0.75·2^3 in a block whose amax is 6·2^3, in row 1,
    block 1, at an odd position."""
    x = np.zeros((2, 64), np.float32)
    x[1, 32], x[1, 33] = 48.0, 6.0
    calls = [C.Call("fp4_e8m0_quantize", (x,), {})]
    reached = {b.name for b in C.boundaries("FP4.E2M1.RNE") if b.reached(calls)}
    assert reached == {"indexer: |x|/s at the E2M1 tie 0.75: exactly", "indexer: an E2M1 tie in a row ≥ 1",
                       "indexer: an E2M1 tie at an odd block index of a multi-block row",
                       "indexer: an E2M1 tie at an odd element position"}


def test_the_coverage_command(capsys):
    assert main(["coverage", "--rules", "FMT.E2M1.RNE", "--reached"]) == 0
    out = capsys.readouterr().out
    assert "FMT.E2M1.RNE" in out and "0 missed" in out and "reached [element]" in out


def test_the_recorder_has_a_provider_of_its_own():
    """A check caching results per provider (the layer stages) calls the recorder's operations afresh."""
    target = load_target("impl")
    recorder = C.Recorder(target)
    assert recorder.provider is not target.provider
    assert recorder.provider.rope_rotate is target.provider.rope_rotate
    assert recorder.op("e2m1_encode") is not None


def test_the_coverage_command_lists_the_clauses(capsys):
    assert main(["coverage", "--rules", "ROPE.SLICE", "--clauses"]) == 0
    out = capsys.readouterr().out
    assert "clause «RoPE rotates x[..., −64:] of every head»: fails only_the_last_64_channels_rotate (rotates_first_64)" in out


def test_the_coverage_command_rejects_an_unknown_profile(capsys):
    assert main(["coverage", "--profile", "fast"]) == 2


def test_the_coverage_command_takes_the_seed_of_a_randomized_profile(capsys):
    from dsv4spec.properties.suite import RUN
    try:
        assert main(["coverage", "--profile", "dev", "--seed", "5", "--rules", "FMT.E2M1.ZERO_SIGN"]) == 0
    finally:
        RUN.seed = None
    assert "profile dev, seed 5" in capsys.readouterr().err


def test_ci_is_sized_per_rule():
    """Cheap codec rules run hundreds of examples a check in ci, the costly pool rules fewer."""
    from dsv4spec.properties.suite import profile_for, settings_for
    sizes = {r: settings_for(r, "ci").max_examples
             for r in ("FMT.E2M1.ZERO_SIGN", "FP4.KV.SCALE", "IDX.TOPK.PAD", "POOL.SIZE", "CMP.GATE")}
    assert sizes == {"FMT.E2M1.ZERO_SIGN": 400, "FP4.KV.SCALE": 200, "IDX.TOPK.PAD": 50, "POOL.SIZE": 25,
                     "CMP.GATE": 25}
    assert profile_for("FP4.KV.SCALE", "thorough") == "thorough"
    run = ci_coverage("FMT.E2M1.ZERO_SIGN")
    assert 300 < run.calls <= 400 + 3                   # the generated examples and the explicit ones


def test_random_reach_counts_the_drawn_examples_of_each_check():
    """A boundary's random rate is the largest share of one check's drawn examples that reach it;
    explicit examples and sweeps count for reach, never for the rate."""
    tie = np.array([0.75], np.float32)
    other = np.array([1.0], np.float32)
    calls = [C.Call("e2m1_encode", (tie,), {}, None, "sweep"), C.Call("e2m1_encode", (tie,), {}, 0, "a"),
             *[C.Call("e2m1_encode", (tie if i % 4 == 0 else other,), {}, i, "a") for i in range(1, 41)],
             *[C.Call("e2m1_encode", (other,), {}, i, "b") for i in range(1, 11)]]
    listed = [b for b in C.boundaries("FMT.E2M1.RNE") if b.name.startswith("|x|/s at the E2M1 tie 0.75")]
    rates = C.random_rates(listed, calls)
    assert rates == {"|x|/s at the E2M1 tie 0.75: exactly": 0.25, "|x|/s at the E2M1 tie 0.75: 1 ulp below": 0.0,
                     "|x|/s at the E2M1 tie 0.75: 1 ulp above": 0.0}


def test_the_recorder_tells_drawn_examples_from_explicit_ones_and_sweeps():
    run = ci_coverage("FMT.E2M1.ZERO_SIGN")
    exactly = next(b for b in run.reached if b.name == "x = −0")
    assert run.random_rate(exactly) >= C.RANDOM_REACH and run.reached_by(exactly) == "drawn"
    decode = ci_coverage("FMT.E2M1.VALUES")
    assert [decode.reached_by(b) for b in decode.reached] == ["sweep"]


LAYER_RULES = sorted(C.layer_strategy_rules())


def test_the_layer_strategies_reach_every_layer_boundary():
    """Each layer check's strategy, drawn on its own (400 keys, a fixed seed, no layer run), reaches
    every layer boundary of its rule in ≥ 1/50 of its draws, and every such boundary is measured."""
    assert set(LAYER_RULES) >= {"PATH.LAYER", "PATH.Q.PROJ", "PATH.K.NORM", "ROPE.POSITIONS", "ATTN.LAYER"}
    for rule in LAYER_RULES:
        layer = {b.name for b in C.boundaries(rule) if b.op in C.LAYER_OPS}
        assert layer and set(C.strategy_rates(rule)) == layer, rule
    assert C.rarely_drawn_by_the_strategies() == {}


def _planted(rule, keep):
    """The strategy rates of `rule` if its layer check drew only the keys `keep` lets through."""
    from dsv4spec.properties import path
    kinds = C.layer_strategy_rules()[rule]
    return C.strategy_rates(rule, C.drawn_values(path.layer_keys(kinds).filter(keep), draws=200))


def test_a_strategy_that_never_draws_a_boundary_is_caught():
    """Plants: a layer strategy that never draws V4-Pro, one whose decode never runs while the ring
    fills, and one that never draws beyond V4.1's pool; each is reported on that boundary alone."""
    no_pro = _planted("PATH.Q.PROJ", lambda k: k[0] != "v4-pro")
    filled = _planted("PATH.K.NORM", lambda k: not 0 < k[3] < 128)
    small = _planted("PATH.LAYER", lambda k: k[3] < 16384)
    assert C.rarely_drawn_by_the_strategies({"PATH.Q.PROJ": no_pro, "PATH.K.NORM": filled, "PATH.LAYER": small}) == {
        "PATH.Q.PROJ": {"an index_layer of v4-pro": 0.0}, "PATH.K.NORM": {"decode while the ring fills (start < 128)": 0.0},
        "PATH.LAYER": {"V4.1 entries beyond the pool (16384)": 0.0}}


def test_the_listing_shows_the_checks_draws_and_the_strategys():
    """A layer boundary shows how many of a check's few drawn examples reach it and its strategy's
    share; one its strategy draws rarely is listed as such."""
    fills, pool = (b for b in C.boundaries("PATH.K.NORM") if b.name.startswith(("decode while", "V4.1 entries")))
    rc = C.RuleCoverage("PATH.K.NORM", [fills, pool], [], 9, {fills.name: 0.5}, frozenset({pool.name}),
                        {fills.name: (1, 2), pool.name: (0, 2)}, {fills.name: 0.29, pool.name: 0.01})
    out = C.render([rc])
    assert "1/2 layer boundaries in ≥ 1/50 of the strategy's 400 draws" in out
    assert "rarely drawn  [range] V4.1 entries beyond the pool (16384)  (random draws 0 of 2; the strategy 1.0% of 400 draws)" in out
    assert "reached [range] decode while the ring fills (start < 128)  (random draws 1 of 2; the strategy 29.0% of 400 draws)" in C.render([rc], show_reached=True)
