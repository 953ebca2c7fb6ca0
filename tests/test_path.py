"""The indexer path: the layer check names the first broken stage of a mutant planted in a middle
stage, the index lists against hand-written rows, the official target on every new rule, and clear
errors for bad input."""
import pytest
import torch

import dsv4spec.impl as impl
from dsv4spec.properties import path as checks
from dsv4spec.properties.suite import FAIL, NOT_IMPLEMENTED, PASS, VARIANT, checks_for, load_checks, run_check, run_rule
from dsv4spec.properties.target import Target, load_target
from dsv4spec.spec import RULES
from dsv4spec.spec import path as spec
from mutants import mutant
from mutants.path import MUTANTS, _nvfp4_qdq

load_checks()
NEW_RULES = sorted(r for r in RULES if r.split(".")[0] in ("ROPE", "PATH") and checks_for(r))


def test_window_rows_by_hand():
    assert spec.window_index(3, 0).tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    row = spec.window_index(200, 0)[199]
    assert row.tolist() == list(range(72, 200))
    assert spec.window_index(1, 2)[0, :4].tolist() == [0, 1, 2, -1] and (spec.window_index(1, 2) == -1).sum() == 125
    assert sorted(spec.window_index(1, 130)[0].tolist()) == list(range(128))


def test_hca_rows_by_hand():
    # prefill of 260 tokens at ratio 128: entry 0 visible from token 127, entry 1 from 255; offset 260
    rows = spec.compressed_index(260, 0, 128)
    assert rows[126].tolist() == [-1, -1] and rows[127].tolist() == [260, -1] and rows[255].tolist() == [260, 261]
    assert spec.compressed_index(1, 383, 128).tolist() == [[128, 129, 130]]


def test_layer_check_names_the_first_broken_stage_of_a_middle_stage_mutant():
    target = Target(MUTANTS["k_before_its_norm"][0], "k_before_its_norm")
    case = checks.layer_cases()[3]                        # V4.1 layer 20, prefill
    stage, rule_id, _ = checks.first_broken_stage(target, case)
    assert (stage, rule_id) == ("k_normed", "PATH.K.NORM")
    assert checks.first_broken_stage(load_target("impl"), case) is None


def test_layer_check_blames_the_rotation_not_the_quantizer_for_rope_at_j():
    target = Target(MUTANTS["k_rope_at_j"][0], "k_rope_at_j")
    stage, rule_id, _ = checks.first_broken_stage(target, checks.layer_cases()[0])   # V4 CSA, ratio 4
    assert (stage, rule_id) == ("k_rot", "ROPE.POSITIONS")


@pytest.mark.parametrize("rule_id", NEW_RULES)
def test_official_passes_the_new_rules(rule_id):
    official = load_target("official")
    if not official.has("fp4_e8m0_quantize"):
        pytest.skip("official.quant (the official codecs) is not in this checkout yet")
    row = run_rule(rule_id, official)
    assert row.status in (PASS, NOT_IMPLEMENTED), f"{rule_id} on official: {row.status} {row.detail}"
    assert row.status == PASS or rule_id == "PATH.POOL_SCAN"


def test_an_nvfp4_second_scale_is_a_named_variant():
    declared = mutant("nvfp4", variants={"kv_second_scale": "per_tensor"}, kv_qdq=_nvfp4_qdq)
    assert run_rule("PATH.QDQ", Target(declared, "nvfp4")).status == VARIANT
    row = run_rule("PATH.QDQ", Target(MUTANTS["nvfp4_second_scale"][0], "nvfp4"))
    assert row.status == FAIL and "matches kv_second_scale=per_tensor" in row.detail, row.detail


def _layer_inputs(model="v4.1-flash", layer=20):
    return checks.make_layer_case(model, layer, 4).torch_inputs()


@pytest.mark.parametrize("call, message", [
    (lambda: impl.window_index(0, 0), "seqlen must be an int ≥ 1"),
    (lambda: impl.window_index(2, 5), "one token at a time"),
    (lambda: impl.compressed_index(4, 0, model="v4-flash", layer=2), "expected a layer without an indexer"),
    (lambda: impl.compressed_index(4, 0, model="v4-flash", layer=99), "has layers 0..43"),
    (lambda: impl.compressed_index(4, 0, model="v4.1-flash", layer=2), r"ratio 2\); expected a layer without an indexer \(V4 HCA, ratio 128\)"),
    (lambda: impl.compressed_index(4, 0, model="v4-flash", layer=0), r"'window' layer \(ratio 0\)"),
    (lambda: impl.rope_quantize(torch.zeros(1, 128), torch.zeros(1, dtype=torch.int64), torch.zeros(32), "fp4"),
     "fmt must be one of"),
    (lambda: impl.index_layer({**_layer_inputs(), "wq_b": torch.zeros(64 * 128, 1280)}, model="v4.1-flash", layer=20),
     r"wq_b has shape \(8192, 1280\), expected \[4096, 1280\]"),
    (lambda: impl.index_layer({**_layer_inputs(), "latent": torch.zeros(3, 512)}, model="v4.1-flash", layer=20),
     r"latent has shape \(3, 512\), expected \[4, 512\]"),
    (lambda: impl.index_layer(_layer_inputs(), model="v4.1-flash", layer=20, start_pos=10),
     "one token at a time"),
    (lambda: impl.index_layer({"x": torch.zeros(1, 5120)}, model="v4.1-flash", layer=21),
     "reuses layer 20's top-k"),
])
def test_bad_input_names_what_was_expected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_positions_beyond_the_cache_are_rejected():
    inputs = _layer_inputs()
    inputs["x"], inputs["qr"] = inputs["x"][:1], inputs["qr"][:1]
    with pytest.raises(ValueError, match=r"latent has shape \(4, 512\), expected \[9, 512\]"):
        impl.index_layer(inputs, model="v4.1-flash", layer=20, start_pos=8)


def _drawn_keys(seed, kinds=checks.ALL_KINDS, n=12, profile="dev"):
    """The layer keys a layer check of `kinds` draws under `profile` with the run's seed `seed`
    (None: ci's derandomized draws), through forall as the checks draw them, no layer run."""
    from hypothesis import settings
    from dsv4spec.properties.suite import RUN, forall, settings_for
    seen = []
    record = forall(key=checks.layer_keys(kinds))(lambda target, key: seen.append(key))
    saved = RUN.seed, RUN.settings
    RUN.seed, RUN.settings = seed, settings(settings_for("PATH.LAYER", profile), max_examples=n)
    try:
        record(None)
    finally:
        RUN.seed, RUN.settings = saved
    return seen


def test_layer_checks_draw_their_cases_from_the_seed():
    """`verify --rules PATH.LAYER --profile dev --seed 1` and `--seed 2` run other layer cases; a
    seed reproduces its own; ci draws the same two every run."""
    one, two = _drawn_keys(1), _drawn_keys(2)
    assert len(one) == len(two) == 12
    assert one == _drawn_keys(1)
    assert set(one) - set(checks.FIXED_LAYERS) != set(two) - set(checks.FIXED_LAYERS), (one, two)
    assert _drawn_keys(None, n=2, profile="ci") == _drawn_keys(None, n=2, profile="ci")
    kinds = {checks.key_kind(k) for s in range(1, 6) for k in _drawn_keys(s)}
    assert kinds == set(checks.ALL_KINDS)
    assert {k[0] for s in range(1, 6) for k in _drawn_keys(s)} == set(checks.LAYER_MODELS)


def _pro_beyond_flash_topk(key) -> bool:
    """A V4-Pro indexer layer holding more compressed entries than V4-Flash's top-k (512)."""
    from dsv4spec.spec.models import profile
    model, layer, seqlen, start_pos, _ = key
    return (model == "v4-pro" and checks.key_kind(key) in checks.INDEXER
            and (start_pos + seqlen) // profile(model).ratio(layer) > profile("v4-flash").index_topk)


def test_a_mistake_only_drawn_layer_cases_reach_is_caught_by_a_dev_seed():
    """V4-Pro's indexer with V4-Flash's top-k (512) passes PATH.LAYER on the fixed cases (their
    V4-Pro layer has 7 entries) and fails it under dev with a seed whose draws reach a V4-Pro layer
    of more than 512 entries."""
    from hypothesis import Phase, settings
    from dsv4spec.properties.suite import RUN, settings_for
    from mutants.path import SEED_ONLY
    provider, rule_id = SEED_ONLY["v4_flash_topk_on_v4_pro"]
    target = Target(provider, "v4_flash_topk_on_v4_pro")
    chk, = checks_for(rule_id)
    saved = RUN.seed, RUN.settings, RUN.max_examples
    try:
        RUN.settings = settings(settings_for(rule_id, "dev"), phases=(Phase.explicit,))
        chk.fn(target)                                          # every fixed case passes
        seed = next(s for s in range(1, 200) if any(map(_pro_beyond_flash_topk, _drawn_keys(s, n=3))))
        RUN.seed, RUN.max_examples = seed, 3
        row = run_check(chk, target, "dev", shrink=False)
    finally:
        RUN.seed, RUN.settings, RUN.max_examples = saved
    assert row.status == FAIL and "'topk' (IDX.TOPK.SELECTION)" in row.detail and "v4-pro" in row.detail, row.detail


def test_layer_results_are_kept_per_provider_object_and_never_lent_to_another():
    """cached_run: a second Target over the same provider reads the kept outputs; another provider
    (a mutant, as `dsv4spec mutate` makes one from copied modules, or one wrapping impl) runs its own."""
    calls = []

    def counting(inputs, **kwargs):
        calls.append(kwargs["layer"])
        return impl.index_layer(inputs, **kwargs)
    case = checks.layer_case(checks.FIXED_LAYERS[2])            # window only: cheap
    first = checks.run_layer(Target(mutant("counting", index_layer=counting), "a"), case)
    assert calls == [0]
    again = mutant("counting", index_layer=counting)
    assert checks.run_layer(Target(again, "b"), case) is not first and calls == [0, 0]
    provider = mutant("kept", index_layer=counting)
    out = checks.run_layer(Target(provider, "c"), case)
    assert checks.run_layer(Target(provider, "d"), case) is out and calls == [0, 0, 0]


def test_a_ratio2_source_at_an_even_decode_position_scores_the_published_cache():
    """PATH.K.PUBLISHED: layer 2 decoding position 40 (no group completes) scores rows 0..19 of
    the published cache, not its own entries; at 41 (entry 20 completes) its own."""
    from dsv4spec.spec.models import profile
    m = profile("v4.1-flash")
    assert [spec.reads_published_k(m, layer, 1, p) for layer, p in ((2, 40), (2, 41), (20, 40), (24, 40), (2, 0))] \
        == [True, False, False, False, False]
    case = checks.layer_case(checks.PUBLISHED_EXAMPLES[0])
    out = checks.run_layer(load_target("impl"), case)
    published = checks.scored_keys(case, out, "published")
    assert published.shape == (20, 128) and case.arrays()["published_k_packed"].shape == (40, 64)
    assert checks.score_mismatch(case, out, published) is None
    assert checks.score_mismatch(case, out, checks.scored_keys(case, out, "own")) is not None


def test_the_published_cache_changes_the_selection_past_512_entries():
    """The fixed case of 513 entries: the top-512 of the published keys' scores is not that of
    the own keys' (below 513 entries both take every entry)."""
    import numpy as np
    from dsv4spec.spec import indexer as spec_indexer
    from dsv4spec.spec import quant as spec_quant
    case = checks.layer_case(checks.PUBLISHED_EXAMPLES[1])
    out = checks.run_layer(load_target("impl"), case)
    q = spec_quant.fp4_e8m0_dequantize(out["q_packed"], out["q_scales"]).astype(np.float64)
    visible = checks._visible(case)
    chosen = [set(spec_indexer.index_topk(spec_indexer.index_scores(q, checks.scored_keys(case, out, reading),
                                                                    out["weights"], visible), visible, 512, "position")[0])
              for reading in ("published", "own")]
    assert visible.tolist() == [513] and chosen[0] != chosen[1]


def test_a_port_scoring_its_own_index_k_fails_undeclared_and_is_a_variant_declared():
    own, rule_id = MUTANTS["sources_score_their_own_index_k"]
    row = run_rule(rule_id, Target(own, "own"))
    assert row.status == FAIL and "matches index_k_read=own" in row.detail, row.detail
    assert "PATH.K.PUBLISHED (index_k_read=published)" in row.detail, row.detail
    declared = mutant("own_declared", variants={"index_k_read": "own"}, index_layer=own.index_layer)
    row = run_rule(rule_id, Target(declared, "own_declared"))
    assert row.status == VARIANT and "index_k_read=own" in row.detail, row.detail


def test_the_layer_check_blames_the_published_cache_for_a_port_scoring_its_own():
    target = Target(MUTANTS["sources_score_their_own_index_k"][0], "own")
    case = checks.layer_case(checks.PUBLISHED_EXAMPLES[0])
    stage, rule_id, message = checks.first_broken_stage(target, case)
    assert (stage, rule_id) == ("scored_k", "PATH.K.PUBLISHED") and "layer's own index-K cache" in message
    assert checks.first_broken_stage(load_target("impl"), case) is None


OWN_CACHE_PORT = """from unittest import mock
from dsv4spec.impl import path as reference
NAME = {name!r}
VARIANTS = {variants!r}


def index_layer(inputs, **kwargs):          # one index-K cache per layer, always its own
    with mock.patch.object(reference, "_scored_keys", lambda *args: args[-1]):
        return reference.index_layer(inputs, **kwargs)
"""


@pytest.mark.thorough
def test_the_installed_command_fails_an_own_cache_port_and_names_it_variant_when_declared(tmp_path):
    import json
    import os
    import subprocess
    from test_contract_versions import dsv4spec_command
    for name, variants in (("undeclared", {}), ("declared", {"index_k_read": "own"})):
        (tmp_path / f"{name}.py").write_text(OWN_CACHE_PORT.format(name=name, variants=variants))
    result = subprocess.run([*dsv4spec_command(), "verify", "--target", "undeclared", "--target", "declared",
                             "--rules", "PATH.K.PUBLISHED", "--quiet", "--json", "r.json"], cwd=tmp_path,
                            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {r["target"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert rows["undeclared"]["status"] == "FAIL" and "matches index_k_read=own" in rows["undeclared"]["detail"]
    assert rows["declared"]["status"] == "VARIANT", rows["declared"]


FP32_LAYER_KEYS = (("v4-flash", 2, 20, 0, 1), ("v4.1-flash", 2, 10, 0, 6))


@pytest.mark.parametrize("key", FP32_LAYER_KEYS, ids=lambda key: f"{key[0]}-{key[1]}")
def test_a_declared_fp32_score_reaches_the_layers_weights_and_scores(key):
    """Issue 40: score_rounding=fp32 declared, a layer keeping its weights and scores in fp32 passes,
    and so does one applying 128^-0.5 to the summed scores instead of the weights (the same product);
    a wrong factor fails at the weights, the refactoring without the scores' factor at the scores."""
    from mutants.path import FP32_SCORE_LAYER_MISTAKES, FP32_SCORE_LAYERS
    case = checks.layer_case(key)
    for name, provider in FP32_SCORE_LAYERS.items():
        assert checks.first_broken_stage(Target(provider, name), case) is None, name
    for name, (provider, stage) in FP32_SCORE_LAYER_MISTAKES.items():
        assert checks.first_broken_stage(Target(provider, name), case)[0] == stage, name
