"""Goldens of the indexer path: the index lists, what attention reads and one index_layer case per
layer kind.  Both reference targets reproduce them (tests/test_golden.py); a legitimate
difference (another fp32 RoPE table within ROPE.THETA's tolerance, a single rounding of the head
weights) does not change a bit; a mistake planted in a middle stage fails on that case and names
that stage."""
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

import dsv4spec
import dsv4spec.impl as impl
from dsv4spec.golden import layers, store
from dsv4spec.golden.catalog import cases
from dsv4spec.impl import path as impl_path
from dsv4spec.properties.target import Target
from dsv4spec.spec import indexer as SI
from mutants import mutant
from mutants.path import MUTANTS

PATH_CASES = [c.name for c in cases() if c.rule.startswith("PATH.")]
LAYERS = {c.name: c for c in cases() if c.op == "index_layer"}     # described: no inputs yet


def results(provider, names=PATH_CASES) -> dict:
    return {name: (status, detail) for name, status, detail in store.check_target(Target(provider, "t"), names=set(names))}


def test_one_layer_case_per_kind_at_the_real_widths():
    kinds = {(c.args["model"], layers.spec_pool.layer_role(layers.profile(c.args["model"]), c.args["layer"]).kind)
             for c in LAYERS.values()}
    assert kinds == {("v4-flash", "csa"), ("v4-flash", "hca"), ("v4-flash", "window"), ("v4.1-flash", "index_source"),
                     ("v4.1-flash", "candidate_source"), ("v4.1-flash", "reindex")}
    csa, _ = store.load_case("index_layer_v4_csa")
    assert csa["wq_b"].shape == (64 * 128, 1024) and csa["weights_proj"].shape == (64, 4096)
    assert store.load_case("index_layer_v41_l20")[0]["wk"].shape == (128, 512)


def test_every_stage_of_every_stored_layer_case_is_determined():
    """The generator's claim, checked on the stored inputs: no stage has an element that a
    conforming target may round otherwise, every input is a BF16 value, and the stored stages are
    spec/'s."""
    for case in LAYERS.values():
        inputs, want = store.load_case(case.name)
        stages, loose = layers._layer(inputs, **case.args)
        assert not any(where.any() for where in loose.values()), case.name
        assert store.compare(case, want, stages, against="spec/") is None
        for name, x in inputs.items():
            assert x.dtype != np.float32 or np.array_equal(SI.round_bf16(x), x), (case.name, name)


def _table_off_by(factor):
    rope_freqs = impl_path.rope_freqs

    def freqs(model, layer, use="q"):
        return (rope_freqs(model, layer, use).double() * factor).float()
    return freqs


def _weights_rounded_once(raw, model):
    scale = (128 * layers.profile(model).index_n_heads) ** -0.5
    return (raw.double() * scale).to(torch.bfloat16).float()


@pytest.mark.parametrize("change", ["table_up", "table_down", "weights_rounded_once"])
def test_a_conforming_difference_keeps_every_bit(change):
    """Another fp32 table within 2^-20 of the exact one, or the head weights rounded once: the
    stored stages were chosen so that neither can move a bit."""
    patch = {"table_up": ("rope_freqs", _table_off_by(1 + 2.0 ** -20)),
             "table_down": ("rope_freqs", _table_off_by(1 - 2.0 ** -20)),
             "weights_rounded_once": ("index_weights", _weights_rounded_once)}[change]
    with mock.patch.object(impl_path, *patch):
        got = results(impl, LAYERS)
    assert {s for s, _ in got.values()} == {"PASS"}, got


@pytest.mark.parametrize("mistake, case, stage, rule", [
    ("k_before_its_norm", "index_layer_v41_l20", "k_normed", "PATH.K.NORM"),
    ("k_before_its_norm", "index_layer_v41_l2", "k_normed", "PATH.K.NORM"),
    ("k_rope_at_j", "index_layer_v4_csa", "k_rot", "ROPE.POSITIONS"),
    ("k_rope_at_j", "index_layer_v41_l2", "k_rot", "ROPE.POSITIONS"),
    ("hadamard_skipped_in_v4", "index_layer_v4_csa", "q_had", "PATH.HADAMARD"),
])
def test_a_mistake_in_a_middle_stage_fails_naming_case_and_stage(mistake, case, stage, rule):
    status, detail = results(MUTANTS[mistake][0], [case])[case]
    assert status == "FAIL" and detail.startswith(f"{case}.{stage}: ") and f"(rule {rule})" in detail, detail


def test_ratio_one_hides_rope_at_j_and_the_window_cases_see_no_indexer():
    """k_rope_at_j is the same mistake at ratio 1 (j·1 = j): layer 20 passes; so do the layers
    without an indexer."""
    got = results(MUTANTS["k_rope_at_j"][0], LAYERS)
    assert {n for n, (s, _) in got.items() if s == "PASS"} == {"index_layer_v41_l20", "index_layer_v41_l24",
                                                               "index_layer_v4_hca", "index_layer_v4_window"}


@pytest.mark.parametrize("mistake, case", [("window_127", "window_index_prefill"),
                                           ("ring_unfilled_zero", "window_index_decode_unfilled"),
                                           ("hca_without_offset", "compressed_index_prefill"),
                                           ("concat_without_offset", "attention_index_decode"),
                                           ("nvfp4_second_scale", "kv_qdq_fp4_e4m3"),
                                           ("qdq_skipped", "kv_qdq_fp8_e8m0_32")])
def test_each_list_and_qdq_mistake_fails_its_case(mistake, case):
    assert results(MUTANTS[mistake][0], [case])[case][0] == "FAIL"


def test_the_window_order_is_free_but_its_entries_are_not():
    """A decode ring listed oldest first (as V4.1 lists it) passes; one slot changed fails."""
    def oldest_first(seqlen, start_pos):
        rows = impl.window_index(seqlen, start_pos)
        return torch.roll(rows, 7, dims=-1)

    names = ["window_index_decode_wrapped", "window_index_decode_unfilled"]
    assert {s for s, _ in results(mutant("rolled", window_index=oldest_first), names).values()} == {"PASS"}

    def one_slot_off(seqlen, start_pos):
        rows = impl.window_index(seqlen, start_pos).clone()
        rows[0, 3] += 1
        return rows
    got = results(mutant("off", window_index=one_slot_off), names)
    assert all(s == "FAIL" and "rows sorted where their order is free" in d for s, d in got.values()), got


def test_large_weights_are_stored_as_recipes_and_rebuilt_checked():
    path = str(store.DATA / "index_layer_v4_csa.safetensors")
    with safe_open(path, "np") as handle:
        recipes = json.loads(handle.metadata()["case"])["generated"]
    assert set(recipes) == {"wq_b", "weights_proj"} and recipes["wq_b"]["redraw"]
    assert not {"in.wq_b", "in.weights_proj"} & set(load_file(path)) and "in.x" in load_file(path)
    about = recipes["wq_b"]
    weight = layers.Weight(about["seed"], tuple(about["shape"]), about["e_lo"], about["e_hi"], about["bits"],
                           about["positive"], tuple(map(tuple, about["redraw"])), about["e4m3_block"])
    assert weight.about() == about and np.array_equal(layers.rebuild(about), weight.stored())
    assert layers.rebuild(about).dtype == np.uint8      # wq_b as the checkpoint has it: E4M3 bytes
    with pytest.raises(ValueError, match="no longer gives the values"):
        layers.rebuild({**about, "redraw": about["redraw"][1:]})


PORT_WITH_K_BEFORE_ITS_NORM = '''
from unittest import mock
from dsv4spec.impl import path

def index_layer(inputs, *, model, layer, start_pos=0):
    with mock.patch.object(path, "_rms_norm", lambda x, w, eps: x.clone()):
        return path.index_layer(inputs, model=model, layer=layer, start_pos=start_pos)
'''


def test_golden_check_prints_the_case_and_the_first_broken_stage(tmp_path):
    """`dsv4spec golden check --target` on a port whose index K skips k_norm: exit 1, and the V4.1
    layer cases that compute K fail on k_normed, the stage the mistake is in."""
    (tmp_path / "k_before_norm.py").write_text(PORT_WITH_K_BEFORE_ITS_NORM)
    home = str(Path(dsv4spec.__file__).resolve().parent.parent)
    run = subprocess.run([sys.executable, "-m", "dsv4spec", "golden", "check", "--target", "k_before_norm"],
                         cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": home})
    assert run.returncode == 1, run.stdout + run.stderr
    failing = sorted(line.split()[1] for line in run.stdout.splitlines() if line.startswith("FAIL"))
    assert failing == ["index_layer_v41_l2", "index_layer_v41_l20"], run.stdout
    assert "index_layer_v41_l20.k_normed: " in run.stdout and "(rule PATH.K.NORM)" in run.stdout
