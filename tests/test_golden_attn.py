"""Goldens of the attention layer: one attention_layer case per layer kind, every stored stage
determined (the generator's claim, checked on the stored inputs), the same bits under one and two
threads, and a mistake planted at a stage of the layer fails the case that stage is in, naming it.
Both reference targets pass them (tests/test_golden.py runs every case)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from dsv4spec.golden import attn_layers, store
from dsv4spec.golden.catalog import cases
from dsv4spec.properties.target import Target
from dsv4spec.spec import attn as SA
from dsv4spec.spec import indexer as SI
from dsv4spec.spec import pool as spec_pool
from dsv4spec.spec.models import profile
from mutants.attn import MUTANTS, STAGE_PLANTS

ATTN = {c.name: c for c in cases() if c.op == "attention_layer"}     # described: no inputs yet


def results(provider, names) -> dict:
    return {n: (s, d) for n, s, d in store.check_target(Target(provider, "t"), names=set(names))}


def test_one_case_per_layer_kind_with_a_prefill_and_a_decode_per_model():
    kinds = {(c.args["model"], spec_pool.layer_role(profile(c.args["model"]), c.args["layer"]).kind)
             for c in ATTN.values()}
    assert kinds == {("v4-flash", "window"), ("v4-flash", "csa"), ("v4-flash", "hca"), ("v4.1-flash", "window"),
                     ("v4.1-flash", "candidate_source"), ("v4.1-flash", "reindex"), ("v4.1-flash", "reuse")}
    steps = {(c.args["model"], c.args["start_pos"] == 0) for c in ATTN.values()}
    assert steps == {(m, prefill) for m in ("v4-flash", "v4.1-flash") for prefill in (True, False)}
    assert sum((store.DATA / f"{name}.safetensors").stat().st_size for name in ATTN) < 2 * 2 ** 20


def test_every_stored_attention_stage_is_determined():
    """On the stored inputs: no stage has an element a conforming target may round otherwise (o's
    admitted interval under spec.attn.bounds, any blocking, is one BF16 value), the star leads by
    the margin, every float input is a BF16 value but the fp32 sink, and the stored stages are spec/'s."""
    for case in ATTN.values():
        inputs, want = store.load_case(case.name)
        stages, loose = attn_layers._layer(inputs, **case.args)
        assert not [k for k, where in loose.items() if where.any()], case.name
        assert store.compare(case, want, stages, against="spec/") is None
        for name, x in inputs.items():
            assert name == "sink" or x.dtype != np.float32 or np.array_equal(SI.round_bf16(x), x), (case.name, name)
        L = np.where(np.arange(attn_layers.HEADS) >= attn_layers.HEADS // 2, 2.0, 1.0)
        T = want["o"].shape[0]
        stars = want["kv"][np.arange(T) + (case.args["start_pos"] % 128 if case.args["start_pos"] else 0)]
        assert np.array_equal(want["o"], stars[:, None, :] / L[None, :, None]), case.name


def test_the_cases_say_how_o_is_determined_and_what_they_leave_to_the_checks():
    for name in ATTN:
        with safe_open(str(store.DATA / f"{name}.safetensors"), "np") as handle:
            notes = json.loads(handle.metadata()["case"])["notes"]
        assert "bounds" in notes["o"] and "q_rescale" in notes["q_attn_rot"], name


def test_the_dot_error_ignores_the_channels_q_does_not_read():
    """A row with an odd fine value where q is 0 leaves the dot exact (error 0); read, it does not."""
    q = np.zeros((1, 1, 8))
    q[..., 0] = 16.0
    kv = np.full((3, 8), 0.5)
    kv[1:, 5] = 1 + 2.0 ** -7 * 3 * 2.0 ** -30
    indices = np.array([[1, 2, -1]])
    rows = SA._gathered(kv, indices)[0]
    assert (SA._dot_error(q, kv, indices, rows) == 0).all()
    q[..., 5] = 2.0 ** 10
    error = SA._dot_error(q, kv, indices, rows)
    assert (error[..., :2] > 0).all() and error[..., 2] == 0   # (the −1 slot reads nothing)


GENERATE = """
import json, sys
from pathlib import Path
from dsv4spec.golden import store
print(json.dumps(store.generate(Path(sys.argv[1]), names=set(sys.argv[2:]))))
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_attention_cases_regenerate_bit_for_bit_under_one_and_two_threads(tmp_path, threads):
    env = {**os.environ, **{k: threads for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    run = subprocess.run([sys.executable, "-c", GENERATE, str(tmp_path), *ATTN], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    stored = json.loads((store.DATA / store.MANIFEST).read_text())["files"]
    got = json.loads(run.stdout.splitlines()[-1])["files"]
    assert got == {f: stored[f] for f in got} and len(got) == len(ATTN)


def test_generating_a_selection_into_the_stored_goldens_is_refused():
    with pytest.raises(ValueError, match="elsewhere only"):
        store.generate(store.DATA, names={"attention_layer_v4_csa"})


@pytest.mark.parametrize("plant, case, stage", [
    ("window_kv_rope_at_twice_the_angle", "attention_layer_v4_window", "kv_rot"),
    ("compressed_kv_rope_at_twice_the_angle", "attention_layer_v41_l20", "cmp_rot"),
    ("new_row_in_the_next_ring_slot", "attention_layer_v41_l24", "kv"),
    ("compressed_rows_before_the_window", "attention_layer_v4_hca", "kv"),
    ("reused_lists_without_offset", "attention_layer_v41_l21", "indices"),
    ("unfilled_ring_slots_as_row_0", "attention_layer_v4_csa", "window_idx"),
    ("layer_q_not_rescaled_on_v4", "attention_layer_v4_window", "q_rescale"),
    ("layer_window_kv_not_quantized", "attention_layer_v41_window", "kv_window"),
    ("layer_compressed_kv_not_quantized", "attention_layer_v41_l20", "cmp"),
    ("layer_attention_without_sink", "attention_layer_v41_l21", "o"),
    ("layer_output_not_derotated", "attention_layer_v4_hca", "o_derot"),
])
def test_a_mistake_planted_at_a_stage_fails_naming_case_and_stage(plant, case, stage):
    provider = STAGE_PLANTS[plant][0] if plant in STAGE_PLANTS else MUTANTS[plant][0]
    status, detail = results(provider, [case])[case]
    rule = ATTN[case].output_rules[stage]
    assert status == "FAIL" and detail.startswith(f"{case}.{stage}: ") and f"(rule {rule})" in detail, detail


def test_the_sign_of_a_zero_is_free_only_where_the_case_says():
    case = ATTN["attention_layer_v4_window"]
    _, want = store.load_case(case.name)
    got = {k: v.copy() for k, v in want.items()}
    got["q_attn_rot"][0, 0, -1] = -got["q_attn_rot"][0, 0, -1]          # a zero of the tail, signed
    assert want["q_attn_rot"][0, 0, -1] == 0 and store.compare(case, got, want) is None
    got["o"][0, 0, 0] = -got["o"][0, 0, 0]
    assert store.compare(case, got, want).startswith(f"{case.name}.o: ")
