"""The trace route (docs/TRACE.md): the control model's traces pass check-trace; planted deviations FAIL
on their rule at the stage, layer and step planted and nowhere earlier; broken traces exit 3 in one line."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil

import numpy as np
import pytest
import torch

import trace_control as control
from dsv4spec.cli import main
from dsv4spec.official import attn as official_attn
from dsv4spec.official import compressor as official_compressor
from dsv4spec.official import path as official_path
from dsv4spec.official import rope as official_rope
from dsv4spec.properties.path import make_layer_case
from dsv4spec.trace import Recorder, Step, Trace, TraceError, record_official
from dsv4spec.trace.format import WEIGHTS, canonical
from dsv4spec.trace.check import judge_trace, open_trace

V41_LAYERS = (0, 2, 20, 21, 24)     # window, ratio-2 index source, candidate source, reuse, re-index
V4_LAYERS = (0, 2, 3)               # window, CSA, HCA


def judged(path, rules=None, **kw):
    wanted = (lambda r: True) if rules is None else (lambda r: any(r.startswith(p) for p in rules))
    return judge_trace(open_trace(str(path)), wanted, **kw).verdicts


def departing(verdicts):
    return [v for v in verdicts if v.status != "PASS"]


@pytest.fixture(scope="module")
def v41_trace(tmp_path_factory):
    """A V4.1 prefill of 8 tokens, then decode 8…11: ratio-2 entries complete at 9 and 11, layer 2
    scores layer 20's published index K at 8 and 10, layer 24 re-indexes in layer 20's pool."""
    path = tmp_path_factory.mktemp("v41")
    control.record_control(path, "v4.1-flash", V41_LAYERS, prefill=8, decode=4)
    return path


def test_the_control_trace_passes_every_recorded_stage(v41_trace, capsys):
    status = main(["check-trace", str(v41_trace), "--quiet", "--json", str(v41_trace / "r.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    results = {r["rule"]: r["status"] for r in json.loads((v41_trace / "r.json").read_text())["results"]}
    for rule in ("PATH.Q.PROJ", "PATH.K.NORM", "PATH.K.PUBLISHED", "IDX.SCORE.FP4", "IDX.TOPK.SELECTION",
                 "POOL.TOPK_BLOCKS", "POOL.REINDEX", "LAYER.V41", "FP8.LINEAR", "ATTN.LAYER", "ATTN.PROB.ORDER",
                 "ATTN.DEROTATE", "PATH.WINDOW.RING", "PATH.QDQ", "PATH.CONCAT", "ROPE.POSITIONS", "CMP.GATE",
                 "CMP.RATIO1", "CMP.NORM", "CMP.STATE"):
        assert results[rule] == "PASS", (rule, out)
    assert results["CMP.OVERLAP"] == "n/i" and results["ATTN.TP.REDUCE"] == "n/i"
    verdicts = json.loads((v41_trace / "r.json").read_text())["header"]["trace"]["verdicts"]
    stages = {(v["stage"], v["rule"]) for v in verdicts}
    assert {("window_cache", "PATH.WINDOW.RING"), ("published_k_packed", "PATH.K.PUBLISHED"),
            ("candidates", "POOL.REINDEX"), ("kv_cache", "PATH.QDQ")} <= stages      # judged across steps
    assert "stages (departing first" in out


def test_the_report_validates_and_shards_merge(v41_trace, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(open(os.path.join(os.path.dirname(control.__file__), "..", "runner",
                                          "report.schema.json")).read())
    jsonschema.validate(json.loads((v41_trace / "r.json").read_text()), schema)
    args = ["check-trace", str(v41_trace), "--quiet", "--rules", "PATH.WINDOW,IDX.WEIGHT", "--layers", "20"]
    for k in (1, 2):
        assert main([*args, "--shard", f"{k}/2", "--json", str(v41_trace / f"s{k}.json")]) == 0
    assert main(["report", "merge", str(v41_trace / "s1.json"), str(v41_trace / "s2.json")]) == 0
    merged = capsys.readouterr().out
    assert "PATH.WINDOW.RING" in merged and "IDX.WEIGHT.SCALE" in merged


def test_layers_and_steps_select_what_is_judged(v41_trace):
    verdicts = judged(v41_trace, layers={2}, steps=lambda s: s.start_pos == 10)
    assert verdicts and {(v.layer, v.step.start_pos) for v in verdicts} == {(2, 10)}


def test_record_official_hooks_record_the_module_outputs(tmp_path):
    model = control.ControlModel("v4.1-flash", (0, 20))
    with record_official(model, tmp_path, model_name="v4.1-flash", steps=[0, 9], config={"n_heads": 16}):
        for start_pos, T in ((0, 8), (8, 1), (9, 1)):
            model(start_pos, T)
    trace = Trace(str(tmp_path))
    assert [(layer, s.start_pos) for layer, s in trace.layer_steps()] == [(0, 0), (20, 0), (0, 9), (20, 9)]
    assert {"x", "q_latent", "q_norm", "q_attn", "kv_proj", "kv_normed", "out", "q", "w_raw", "k", "k_normed",
            "attn_wq_a", "rope_freqs", "sink", "cmp_pooled", "cmp_normed", "cmp_wkv", "cmp_norm"} <= \
        set(trace.stages(20, trace.layer_steps()[1][1]))
    verdicts = judged(tmp_path)
    assert {v.rule for v in verdicts if v.status == "PASS"} >= {"FP8.LINEAR", "ATTN.LAYER", "PATH.Q.PROJ",
                                                               "PATH.K.PROJ", "PATH.W.PROJ", "CMP.RATIO1", "CMP.NORM"}
    # wo_a is an einsum, not a call (V4-model L537-541): o_lora is wo_b's input, but o_derot no hook sees
    assert {(v.status, v.stage, "record 'o_derot'" in v.detail) for v in departing(verdicts)} == \
        {("ERROR", "o_lora", True)}


def test_record_official_hooks_record_the_v4_csa_indexer_s_own_compressor(tmp_path):
    """layers.2.attn.indexer.compressor (V4-model L398): its weights, pooled and normed entries recorded
    by the hooks, judged by the compressor's rules as the KV compressor's, prefill and decode (15: the
    entry completing the group 12…15)."""
    model = control.ControlModel("v4-flash", (2,))
    with record_official(model, tmp_path, model_name="v4-flash", config={"n_heads": 16}):
        for start_pos, T in ((0, 8), *((p, 1) for p in range(8, 16))):
            model(start_pos, T)
    assert {"idx_cmp_wkv", "idx_cmp_wgate", "idx_cmp_ape", "idx_cmp_norm"} <= set(Trace(str(tmp_path)).stages(2, Step(0, 8)))
    verdicts = judged(tmp_path, rules=["CMP"])
    assert not departing(verdicts), departing(verdicts)[0].detail
    judged_here = {(v.stage, v.rule, v.step.start_pos) for v in verdicts}
    assert {("idx_cmp_pooled", "CMP.OVERLAP", 0), ("idx_cmp_normed", "CMP.NORM", 0), ("idx_cmp_pooled", "CMP.STATE", 11),
            ("idx_cmp_pooled", "CMP.STATE", 15), ("cmp_pooled", "CMP.STATE", 15)} <= judged_here


def test_a_stage_without_its_input_is_an_error_naming_the_tensor(tmp_path):
    with Recorder(tmp_path, model="v4.1-flash") as rec:
        rec.record("x", torch.zeros(2, 5120), layer=2, step=(0, 2))
        rec.record("q_latent", torch.zeros(2, 1280), layer=2, step=(0, 2))
    (v,) = judged(tmp_path)
    assert (v.status, v.stage, v.rule) == ("ERROR", "q_latent", "FP8.LINEAR") and "record 'attn_wq_a'" in v.detail


@pytest.fixture(scope="module")
def attention_step():
    """A V4.1 window layer's attention from given q_attn and kv_normed (an engine whose projections are
    fused), its stages as official.attn computes them."""
    from dsv4spec.cmd_bench import _script
    given = _script("bench_trace").inputs("v4.1-flash", 0, 6)
    return given, official_attn.attention_layer(dict(given), model="v4.1-flash", layer=0, start_pos=0)


def test_a_trace_starting_at_q_attn_reads_n_i_before_it_and_judges_after_it(tmp_path, attention_step):
    given, stages = attention_step
    with Recorder(tmp_path, model="v4.1-flash", config={"n_heads": 16}) as rec:
        rec.record("attn.sink", given["sink"], layer=0)            # family-prefixed names read as the bare ones
        for name, value in {**given, **stages}.items():
            rec.record("idx.window_idx" if name == "window_idx" else name, value, layer=0, step=(0, 6))
    verdicts = judged(tmp_path)
    assert not departing(verdicts), departing(verdicts)[0].detail
    stages_judged = {v.stage for v in verdicts}
    assert {"q_rescale", "q_attn_rot", "kv_rot", "o", "window_idx"} <= stages_judged
    assert not {"q_attn", "kv_normed"} & stages_judged


def test_a_stage_recorded_after_a_gap_is_an_error_naming_the_gap(tmp_path, attention_step):
    """q_latent recorded, then q_attn without q_norm between them: q_attn's input is missing."""
    given, stages = attention_step
    with Recorder(tmp_path, model="v4.1-flash", config={"n_heads": 16}) as rec:
        rec.record("q_latent", torch.zeros(6, 1280), layer=0, step=(0, 6))
        rec.record("q_attn", given["q_attn"], layer=0, step=(0, 6))
    (v,) = [v for v in judged(tmp_path) if v.stage == "q_attn"]
    assert v.status == "ERROR" and "record 'q_norm'" in v.detail


# ------------------------------------------------------------------------------------------------
# traces that cannot be judged: one line, exit 3
# ------------------------------------------------------------------------------------------------
def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _rewrite(path, edit):
    m = _manifest(path)
    edit(m)
    (path / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("small")
    with Recorder(path, model="v4.1-flash") as rec:
        rec.record("x", torch.zeros(3, 5120, dtype=torch.bfloat16), layer=0, step=(0, 3))
        rec.record("window_idx", torch.tensor([[0, -1, -1], [0, 1, -1], [0, 1, 2]]), layer=0, step=(0, 3))
    return path


def _truncate(p):
    f = p / _manifest(p)["files"][0]
    f.write_bytes(f.read_bytes()[:40])


BROKEN = {
    "no manifest": lambda p: (p / "manifest.json").unlink(),
    "manifest not JSON": lambda p: (p / "manifest.json").write_text('{"format": "dsv4spec-trace", "vers'),
    "another format version": lambda p: _rewrite(p, lambda m: m.update(version=99)),
    "truncated tensor file": _truncate,
    "missing tensor file": lambda p: (p / _manifest(p)["files"][0]).unlink(),
    "a key the file lacks": lambda p: _rewrite(p, lambda m: m["records"][0].update(key="nope")),
    "mislabelled model": lambda p: _rewrite(p, lambda m: m.update(model="v4-flash")),
    "unknown stage": lambda p: _rewrite(p, lambda m: m["records"][0].update(stage="q_magic")),
    "decode labelled prefill": lambda p: _rewrite(p, lambda m: m["records"][0]["step"].update(start_pos=4)),
    "a layer the model lacks": lambda p: _rewrite(p, lambda m: [r.update(layer=77) for r in m["records"]]),
    "a v3.2 trace (no stage judges)": lambda p: _rewrite(p, lambda m: m.update(model="v3.2", config={})),
    "unknown variant": lambda p: _rewrite(p, lambda m: m.update(variants={"attn_order": "sideways"})),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_a_broken_trace_exits_3_in_one_line(small_trace, tmp_path, capsys, fault):
    path = _copy(small_trace, tmp_path / "t")
    BROKEN[fault](path)
    assert main(["check-trace", str(path), "--quiet"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("dsv4spec check-trace: error:") and "Traceback" not in err, err


def test_a_shape_or_dtype_the_config_rules_out_exits_3(tmp_path, capsys):
    for name, tensor in (("x", torch.zeros(3, 4096)), ("window_idx", torch.zeros(3, 3))):
        path = tmp_path / name
        with Recorder(path, model="v4.1-flash") as rec:
            rec.record(name, tensor, layer=0, step=(0, 3))
        assert main(["check-trace", str(path), "--quiet"]) == 3
        err = capsys.readouterr().err
        assert ("shape" if name == "x" else "dtype") in err and err.count("\n") == 1, err


def test_ranks_that_are_not_one_run_exit_3(tmp_path, capsys):
    for r in (0, 2):
        with Recorder(tmp_path / f"rank{r}", model="v4.1-flash", world_size=3, rank=r) as rec:
            rec.record("x", torch.zeros(1, 5120), layer=0, step=(0, 1))
    assert main(["check-trace", str(tmp_path), "--quiet"]) == 3
    assert "ranks [0, 2]" in capsys.readouterr().err


def test_a_usage_error_exits_2(small_trace, capsys):
    assert main(["check-trace", str(small_trace), "--layers", "two"]) == 2
    assert main(["check-trace", str(small_trace), "--layers", "5"]) == 2


# ------------------------------------------------------------------------------------------------
# tensor parallelism: ranks simulated on the CPU
# ------------------------------------------------------------------------------------------------
def test_tp2_control_traces_pass_and_a_rank_skipping_the_all_reduce_fails(tmp_path):
    """V4.1 and V4 (its o_lora_rank one FP8 block of 128, a rank's wo_b columns whole blocks): each rank's
    index heads judged as its own, the scores as the all-reduce of every rank's (IDX.SCORE.TP)."""
    control.record_control(tmp_path / "ok", "v4.1-flash", (0, 20), prefill=6, decode=1, world_size=2)
    control.record_control(tmp_path / "v4", "v4-flash", (2,), prefill=8, decode=1, world_size=2)
    for name in ("ok", "v4"):
        verdicts = judged(tmp_path / name)
        assert not departing(verdicts), (name, departing(verdicts)[0].detail[:400])
        assert {v.rank for v in verdicts if v.rule == "ATTN.TP.REDUCE"} == {0, 1}
        assert {v.rank for v in verdicts if v.rule == "IDX.SCORE.TP"} == {0, 1}
        assert {v.rank for v in verdicts if v.rule == "IDX.TOPK.TP"} == {1}       # rank 1's against rank 0's
        assert {v.rank for v in verdicts if v.stage in ("q", "w_raw", "weights")} == {0, 1}
        assert any(v.stage == "out_partial" and v.rule == "FP8.LINEAR" for v in verdicts)
    control.record_control(tmp_path / "bad", "v4.1-flash", (0,), prefill=6, decode=1, world_size=2,
                           reduce=lambda partials: partials[0])
    first = departing(judged(tmp_path / "bad"))[0]
    assert (first.rule, first.stage, first.layer, first.step.start_pos, first.status) == \
        ("ATTN.TP.REDUCE", "out", 0, 0, "FAIL")


def _point_at(path, layer: int, start_pos: int, stage: str, other: str):
    """Rewrite a trace so that `stage` of a layer-step reads the tensor its `other` record holds."""
    def edit(m):
        at = {r["stage"]: r for r in m["records"] if r["layer"] == layer and (r["step"] or {}).get("start_pos") == start_pos}
        at[stage].update(file=at[other]["file"], key=at[other]["key"], rows=at[other].get("rows"))
    _rewrite(path, edit)


def test_tp2_path_k_published_is_judged_on_every_rank(tmp_path):
    """W = 2: the index K is not sharded (V41-model L518-519, a Linear and an RMSNorm; the compressor's
    L446-448), so every rank scores its own copy of layer 20's publication with its own heads.  Layer 2
    scoring its own cache at 10 fails on every rank's all-reduced scores; rank 1 alone reading another
    cache than layer 20's of the step before fails on rank 1, at that step."""
    layers, prefill, decode, plant = (*PLANTED["stale_index_k_read"][1:4], PLANTED["stale_index_k_read"][4])
    control.record_control(tmp_path / "ok", "v4.1-flash", layers, prefill, decode, world_size=2)
    verdicts = judged(tmp_path / "ok")
    assert not departing(verdicts), departing(verdicts)[0].detail[:400]
    assert {(v.stage, v.rank) for v in verdicts if v.rule == "PATH.K.PUBLISHED" and v.step.start_pos == 10} == \
        {(stage, rank) for stage in ("published_k_packed", "scored_k") for rank in (0, 1)}
    control.record_control(tmp_path / "stale", "v4.1-flash", layers, prefill, decode, world_size=2, plant=plant)
    first = departing(judged(tmp_path / "stale"))
    assert {(v.rule, v.stage, v.layer, v.step.start_pos, v.rank, v.status) for v in first[:2]} == \
        {("PATH.K.PUBLISHED", "scored_k", 2, 10, rank, "FAIL") for rank in (0, 1)}, first[0].detail[:400]
    rank1 = _copy(tmp_path / "ok", tmp_path / "rank1") / "rank1"
    for name in ("packed", "scales"):
        _point_at(rank1, 2, 10, f"published_k_{name}", f"k_{name}")
    first = departing(judged(tmp_path / "rank1"))[0]
    assert (first.rule, first.stage, first.layer, first.step.start_pos, first.rank, first.status) == \
        ("PATH.K.PUBLISHED", "published_k_packed", 2, 10, 1, "FAIL"), first.detail[:400]


def test_tp2_ranks_choosing_other_top_k_fail_idx_topk_tp_at_the_token(tmp_path):
    """IDX.TOPK.TP: rank 1's lists are rank 0's as sets (its order its own); a token whose set differs
    FAILs at that rank, step and position."""
    lists = {0: [[0, 1, 2, 3], [0, 1, 2, 4]], 1: [[3, 2, 1, 0], [0, 1, 2, 5]]}
    for rank, topk in lists.items():
        with Recorder(tmp_path / f"rank{rank}", model="v4.1-flash", world_size=2, rank=rank) as rec:
            rec.record("topk", torch.tensor(topk), layer=2, step=(0, 2))
    (v,) = [v for v in judged(tmp_path) if v.rule == "IDX.TOPK.TP"]
    assert (v.status, v.stage, v.layer, v.rank) == ("FAIL", "topk", 2, 1) and v.detail.startswith("position 1"), v.detail
    assert main(["check-trace", str(tmp_path), "--quiet", "--rules", "IDX.TOPK", "--json", str(tmp_path / "r.json")]) == 1
    (row,) = [r for r in json.loads((tmp_path / "r.json").read_text())["results"] if r["rule"] == "IDX.TOPK.TP"]
    assert row["status"] == "FAIL" and "rank 1" in row["detail"], row


# ------------------------------------------------------------------------------------------------
# planted deviations: each FAILs on its rule at the stage, layer and step planted, nowhere earlier
# ------------------------------------------------------------------------------------------------
BF16 = torch.bfloat16
_rms_norm, _index_layer = official_path._rms_norm, official_attn.index_layer
_freqs_cis, _fp8_qdq = official_attn.freqs_cis, official_attn.fp8_qdq


def _bf16_linear(x, w, scale, block):
    """A BF16 projection where the code has an FP8 linear: the weight dequantized, no act_quant."""
    from dsv4spec.official.quant import e4m3_decode, e8m0_decode
    s = e8m0_decode(scale).repeat_interleave(block, 0)[:w.shape[0]].repeat_interleave(block, 1)[:, :w.shape[1]]
    return torch.nn.functional.linear(x.to(BF16), (e4m3_decode(w) * s).to(BF16)).float()


def _eps(eps):
    return lambda x, weight, _: _rms_norm(x, weight, eps)


def _after_index_layer(edit):
    def index_layer(inputs, **kw):
        out = _index_layer(inputs, **kw)
        edit(out, kw.get("start_pos", 0), inputs["x"].shape[0])
        if "topk" in out:
            out["indices"] = official_path.attention_index(out["window_idx"], out["topk"].long(), inputs["x"].shape[0],
                                                           kw.get("start_pos", 0))
        return out
    return index_layer


def _topk_by_score(out, start_pos, T):
    topk = out["topk"].long()
    s = torch.where(topk >= 0, out["scores"].gather(-1, topk.clamp_min(0)), -torch.inf)
    out["topk"] = topk.gather(-1, s.argsort(dim=-1, descending=True, stable=True)).int()


def _weights_doubled(out, start_pos, T):
    out["weights"] = out["weights"] * 2


def _scores_off(out, start_pos, T):
    out["scores"] = out["scores"] * (1 + 2 ** -5)


def _concat_off_by_one(inputs, **kw):
    out = _index_layer(inputs, **kw)
    W = out["window_idx"].shape[-1]
    idx = out["indices"].clone()
    idx[:, W:] = torch.where(idx[:, W:] > 0, idx[:, W:] - 1, idx[:, W:])
    out["indices"] = idx
    return out


def _fp32_probabilities(q, kv, attn_sink, topk_idxs, softmax_scale, init):
    """sparse_attn with the probabilities left fp32 for the second product (no BF16 cast)."""
    with control.patched(torch.Tensor, "to", lambda self, *a, **k: self if a[:1] == (BF16,) and self.dim() == 4
                         else _TO(self, *a, **k)):
        o = _SPARSE(q, kv, attn_sink, topk_idxs, softmax_scale, init)
    return o.to(BF16)                  # the output's own rounding, as the official kernel's


_TO, _SPARSE = torch.Tensor.to, official_attn._sparse_attn


class _FP32Linear:
    """torch.nn.functional with linear left in fp32 (the index K projection not rounded to BF16)."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def linear(a, b):
        return torch.nn.functional.linear(a.float(), b.float())


def _o_lora_fp32(o, inputs, model):
    wo_a = inputs["attn_wo_a"].float()
    groups = o[0].numel() // wo_a.shape[1]
    o = o.to(BF16).float().view(1, o.shape[0], groups, -1)
    return {"o_lora": torch.einsum("bsgd,grd->bsgr", o, wo_a.view(groups, -1, wo_a.shape[1]))[0]}


def _stale_pool(owner, source):
    pool = owner.shared[source, "candidates"]
    return torch.nn.functional.pad(pool[:, :-1], (0, 1), value=False)


_overlap_transform, _cmp_rms_norm = official_compressor.overlap_transform, official_compressor.rms_norm
_cmp_forward = official_compressor.Compressor.forward


KV_HEAD_DIM, INDEX_HEAD_DIM = 512, 128         # the KV compressor's entries, the V4 CSA indexer's own


def _overlap_halves_swapped(t, value, head_dim=KV_HEAD_DIM):
    """Overlapping windows taking group j−1's second half and group j's first (the halves swapped), in
    the compressor of entries of head_dim (the other left official)."""
    d = t.shape[-1] // 2
    if d != head_dim:
        return _overlap_transform(t, value)
    return _overlap_transform(torch.cat([t[..., d:], t[..., :d]], -1), value)


def _state_not_shifted(compressor, x, start_pos, head_dim=KV_HEAD_DIM):
    """A decode step that completes a group without moving its half to the next window's first slots,
    in the (overlapping) compressor of entries of head_dim (the other left official)."""
    if compressor.kv_state.shape[-1] != 2 * head_dim:
        return _cmp_forward(compressor, x, start_pos)
    kept = compressor.kv_state[:, :compressor.ratio].clone(), compressor.score_state[:, :compressor.ratio].clone()
    out = _cmp_forward(compressor, x, start_pos)
    compressor.kv_state[:, :compressor.ratio], compressor.score_state[:, :compressor.ratio] = kept
    return out


# id: (model, layers, prefill, decode, (layer, start_pos, module, attribute, replacement), expected
# (rule, stage, layer, start_pos)[, record_control's options]), one per stage family
PLANTED = {
    "bf16_projection": ("v4.1-flash", (0,), 8, 0, (0, 0, control, "fp8_linear", _bf16_linear),
                        ("FP8.LINEAR", "q_latent", 0, 0)),
    "rms_norm_eps": ("v4.1-flash", (0,), 8, 2, (0, 9, official_path, "_rms_norm", _eps(1e-2)),
                     ("ATTN.LAYER", "q_norm", 0, 9)),
    "k_norm_eps": ("v4.1-flash", (20,), 8, 0, (20, 0, official_path, "_rms_norm", _eps(1e-2)),
                   ("PATH.K.NORM", "k_normed", 20, 0)),
    "stale_index_k_read": ("v4.1-flash", (2, 20), 8, 3, (2, 10, official_path, "reads_published_k", lambda *a: False),
                           ("PATH.K.PUBLISHED", "scored_k", 2, 10)),
    "stale_pool": ("v4.1-flash", (20, 24), 8, 2, (24, 9, control, "pool_of", _stale_pool),
                   ("POOL.REINDEX", "topk", 24, 9)),         # its top-k takes the entry the stale pool lacks
    "topk_ordered_by_score": ("v4.1-flash", (2,), 8, 0,
                              (2, 0, official_attn, "index_layer", _after_index_layer(_topk_by_score)),
                              ("IDX.TOPK.SELECTION", "topk", 2, 0)),
    "fp32_probabilities": ("v4.1-flash", (0,), 8, 0, (0, 0, official_attn, "_sparse_attn", _fp32_probabilities),
                           ("ATTN.PROB.ORDER", "o", 0, 0)),
    "window_entry_scale": ("v4.1-flash", (0,), 8, 2, (0, 9, official_attn, "fp8_qdq", lambda x, b: _fp8_qdq(x * 1.5, b) / 1.5),
                           ("PATH.QDQ", "kv_window", 0, 9)),
    "rope_position_plus_one": ("v4.1-flash", (20,), 8, 2,
                               (20, 9, official_attn, "freqs_cis", lambda p, f: _freqs_cis(p + 1, f)),
                               ("ROPE.POSITIONS", "q_attn_rot", 20, 9)),
    "no_hadamard": ("v4-flash", (2,), 8, 0, (2, 0, official_path, "_hadamard", lambda x: x.to(BF16)),
                    ("PATH.HADAMARD", "q_had", 2, 0)),
    "weights_without_head_factor": ("v4.1-flash", (20,), 8, 0,
                                    (20, 0, official_attn, "index_layer", _after_index_layer(_weights_doubled)),
                                    ("IDX.WEIGHT.SCALE", "weights", 20, 0)),
    "concat_offset_off_by_one": ("v4.1-flash", (20,), 8, 2, (20, 9, official_attn, "index_layer", _concat_off_by_one),
                                 ("PATH.CONCAT", "indices", 20, 9)),
    "derotation_by_plus_p": ("v4.1-flash", (0,), 8, 0,
                             (0, 0, official_attn, "attention_output", official_rope.rope_rotate),
                             ("ATTN.DEROTATE", "o_derot", 0, 0)),
    "ring_written_one_slot_on": ("v4.1-flash", (0,), 8, 3, (0, 9, control, "ring_slot", lambda p, w: (p + 1) % w),
                                 ("PATH.WINDOW.RING", "window_cache", 0, 10)),
    "index_k_projection_fp32": ("v4.1-flash", (20,), 8, 0, (20, 0, official_path, "F", _FP32Linear()),
                                ("PATH.K.PROJ", "k", 20, 0)),
    "scores_off": ("v4.1-flash", (20,), 8, 2, (20, 9, official_attn, "index_layer", _after_index_layer(_scores_off)),
                   ("IDX.SCORE.FP4", "scores", 20, 9)),
    "compressor_overlap_halves_swapped": ("v4-flash", (2,), 8, 0,
                                          (2, 0, official_compressor, "overlap_transform", _overlap_halves_swapped),
                                          ("CMP.OVERLAP", "cmp_pooled", 2, 0)),
    "compressor_norm_eps": ("v4.1-flash", (2,), 8, 0,          # 0.1 where the profile has 1e-20
                            (2, 0, official_compressor, "rms_norm", lambda x, w, eps: _cmp_rms_norm(x, w, 0.1)),
                            ("CMP.NORM", "cmp_normed", 2, 0)),
    "compressor_state_not_shifted": ("v4-flash", (2,), 8, 8,    # planted at 11: shows when group 3 completes
                                     (2, 11, official_compressor.Compressor, "forward", _state_not_shifted),
                                     ("CMP.STATE", "cmp_pooled", 2, 15)),
    "index_compressor_overlap_halves_swapped": ("v4-flash", (2,), 8, 0,        # the V4 CSA indexer's own compressor
                                                (2, 0, official_compressor, "overlap_transform",
                                                 functools.partial(_overlap_halves_swapped, head_dim=INDEX_HEAD_DIM)),
                                                ("CMP.OVERLAP", "idx_cmp_pooled", 2, 0)),
    "index_compressor_state_not_shifted": ("v4-flash", (2,), 8, 8,      # the V4 CSA indexer's own compressor
                                           (2, 11, official_compressor.Compressor, "forward",
                                            functools.partial(_state_not_shifted, head_dim=INDEX_HEAD_DIM)),
                                           ("CMP.STATE", "idx_cmp_pooled", 2, 15)),
    "index_scores_not_all_reduced": ("v4-flash", (2,), 8, 0,           # a rank's top-k of its own heads' scores
                                     (2, 0, control, "sum_partials", lambda partials, rank: partials[rank]),
                                     ("IDX.SCORE.TP", "scores", 2, 0), {"world_size": 2}),
    "o_lora_left_fp32": ("v4.1-flash", (0,), 8, 0, (0, 0, official_attn, "_output_projections", _o_lora_fp32),
                         ("ATTN.LAYER", "o_lora", 0, 0)),
}
FAST = ("bf16_projection", "topk_ordered_by_score", "window_entry_scale", "no_hadamard", "ring_written_one_slot_on",
        "compressor_overlap_halves_swapped")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.thorough) for n in PLANTED])
def test_a_planted_deviation_fails_where_planted_and_nowhere_earlier(tmp_path, name):
    model, layers, prefill, decode, plant, (rule, stage, layer, start_pos), *options = PLANTED[name]
    control.record_control(tmp_path, model, layers, prefill, decode, plant=plant, max_pos=64, **(options or [{}])[0])
    assert_first_departure(judged(tmp_path), (rule, stage, layer, start_pos), name)


def assert_first_departure(verdicts, expected, name: str):
    """The first departing verdict, in the order the forward computed them, FAILs on the expected rule
    at the expected stage, layer and step: the plant departs there and nowhere earlier."""
    first = departing(verdicts)
    assert first, f"{name}: no stage departs"
    got = (first[0].rule, first[0].stage, first[0].layer, first[0].step.start_pos, first[0].status)
    assert got == (*expected, "FAIL"), f"{name}: {first[0].place()}: {first[0].detail[:400]}"


# the issue's named deviations (issue 41, "Done when"), each with the rule that states it
ISSUE_PLANTS = {"bf16_projection": "FP8.LINEAR", "rms_norm_eps": "ATTN.LAYER", "stale_index_k_read": "PATH.K.PUBLISHED",
                "pool_newest_block_not_pinned": "POOL.PIN_NEWEST", "topk_ordered_by_score": "IDX.TOPK.SELECTION",
                "fp32_probabilities": "ATTN.PROB.ORDER", "compressor_overlap_halves_swapped": "CMP.OVERLAP",
                "window_entry_scale": "PATH.QDQ"}


def test_the_plants_are_at_least_twelve_one_per_stage_family():
    """Every plant is enumerated by a test asserting its first departure (PLANTED: the parametrized test
    above; ONE_STEP_PLANTS: the pool's); at least twelve, no two at the same (rule, stage), the issue's
    named ones among them on their rules."""
    expected = {name: plant[5] for name, plant in PLANTED.items()}
    expected |= {name: plant[2] for name, plant in ONE_STEP_PLANTS.items()}
    families = {(rule, stage) for rule, stage, *_ in expected.values()}
    assert len(expected) >= 12 and len(families) == len(expected), sorted(expected.values())
    assert {name: expected[name][0] for name in ISSUE_PLANTS} == ISSUE_PLANTS


# ------------------------------------------------------------------------------------------------
# the pool past 2048 blocks: one decode step of the candidate source (no prefill of 16K tokens)
# ------------------------------------------------------------------------------------------------
_select_blocks = official_path._select_candidate_blocks


def _pool_not_pinned(logits, compress_lens, topk_blocks, block_size):
    """select_candidate_blocks without the pin of the newest reachable block (V41-model L604-607)."""
    return _select_blocks(logits, torch.zeros_like(compress_lens), topk_blocks, block_size)


def record_candidate_source_step(path, position: int, plant=None):
    """Layer 20's index stages at one decode step (official index_layer on a drawn case of the
    profile's widths), the newest block's latent rows zero: its score 0, among the lowest, is kept
    by the pin alone."""
    case = make_layer_case("v4.1-flash", 20, 1, start_pos=position)
    latent = case.arrays()["latent"].copy()
    latent[position // 8 * 8:] = 0
    inputs = {**case.torch_inputs(), "latent": torch.from_numpy(latent)}
    with control.patched(official_path, "_select_candidate_blocks", plant) if plant else contextlib.nullcontext():
        out = official_attn.index_layer(inputs, model="v4.1-flash", layer=20, start_pos=position)
    with Recorder(path, model="v4.1-flash") as rec:
        for name, value in {**inputs, **out}.items():
            rec.record(name, value, layer=20, step=None if name in WEIGHTS else (position, 1))


# planted at one layer-step of its own: id -> (position, plant, expected (rule, stage, layer, start_pos))
ONE_STEP_PLANTS = {"pool_newest_block_not_pinned": (16400, _pool_not_pinned, ("POOL.PIN_NEWEST", "candidates", 20, 16400))}


def test_the_pool_not_pinning_its_newest_block_fails_only_past_2048_blocks(tmp_path):
    """At decode 16400 (16401 entries, 2051 blocks) the unpinned pool drops the newest block; at 16376
    (2048 blocks, all kept) the same deviation cannot show."""
    position, plant, expected = ONE_STEP_PLANTS["pool_newest_block_not_pinned"]
    record_candidate_source_step(tmp_path / "ok", position)
    assert not departing(judged(tmp_path / "ok"))
    record_candidate_source_step(tmp_path / "small", 16376, plant=plant)
    assert not departing(judged(tmp_path / "small"))
    record_candidate_source_step(tmp_path / "bad", position, plant=plant)
    assert_first_departure(judged(tmp_path / "bad"), expected, "pool_newest_block_not_pinned")
    assert "newest block 2050" in departing(judged(tmp_path / "bad"))[0].detail


@pytest.mark.thorough
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_control_trace_passes_at_other_seeds(tmp_path, seed):
    control.record_control(tmp_path / "v41", "v4.1-flash", V41_LAYERS, prefill=12, decode=6, seed=seed)
    control.record_control(tmp_path / "v4", "v4-flash", V4_LAYERS, prefill=12, decode=4, seed=seed)
    control.record_control(tmp_path / "tp", "v4.1-flash", (0, 20), prefill=6, decode=2, seed=seed, world_size=2)
    for name in ("v41", "v4", "tp"):
        assert not departing(judged(tmp_path / name)), name


def test_the_v4_control_trace_passes(tmp_path):
    """V4-Flash: window, CSA (its own index entries, the Hadamard, ratio 4: an entry completes at 11)
    and HCA layers, prefill and decode."""
    control.record_control(tmp_path, "v4-flash", V4_LAYERS, prefill=8, decode=4, seed=5)
    verdicts = judged(tmp_path)
    assert not departing(verdicts), departing(verdicts)[0].detail[:500]
    assert {"PATH.HADAMARD", "ATTN.Q_NORM", "PATH.WINDOW.RING", "PATH.QDQ"} <= {v.rule for v in verdicts}
    assert {("idx_cmp_pooled", "CMP.OVERLAP"), ("idx_cmp_normed", "CMP.NORM"), ("idx_cmp_pooled", "CMP.STATE")} <= \
        {(v.stage, v.rule) for v in verdicts}            # the CSA indexer's own compressor


def test_a_family_prefixed_name_reads_as_its_stage():
    assert [canonical(name, weight) for name, weight in (("idx.scores", False), ("attn.q_norm", False),
                                                         ("attn.q_norm", True), ("idx.cmp_pooled", False),
                                                         ("cmp.pooled", False), ("idx.cmp_wkv", True))] == \
        ["scores", "q_norm", "attn_q_norm", "idx_cmp_pooled", "cmp_pooled", "idx_cmp_wkv"]


# ------------------------------------------------------------------------------------------------
# the C writer (examples/trace_writer) writes the same format, judged the same
# ------------------------------------------------------------------------------------------------
C_DTYPES = {"float32": "F32", "uint8": "U8", "int32": "I32", "int64": "I64", "bool": "BOOL"}


def _plan(trace: Trace, raw) -> str:
    """The C writer's plan for every tensor of `trace`, each dumped to a raw file."""
    lines, seen = [f"model {trace.model} {trace.world_size} {trace.rank}"], set()
    os.makedirs(raw, exist_ok=True)
    for layer, step in trace.layer_steps():
        tensors = trace.load(layer, step)
        weights = set(trace.stages(layer, step)) - set(trace._records[layer, step])
        for name, a in tensors.items():
            weight = name in weights
            if weight and (layer, name) in seen:
                continue
            seen.add((layer, name))
            a = np.ascontiguousarray(a)
            file = os.path.join(raw, f"{len(lines)}.bin")
            a.tofile(file)
            where = "-1 0 0" if weight else f"{step.start_pos} {step.seqlen} {step.row}"
            lines.append(f"{name} {layer} {where} {C_DTYPES[a.dtype.name]} {a.ndim} {' '.join(map(str, a.shape))} {file}")
    return "\n".join(lines) + "\n"


def test_the_c_writer_s_trace_is_judged_as_the_python_one(tmp_path):
    import subprocess
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None or shutil.which("make") is None:
        pytest.skip(f"no C compiler ({compiler}) or no make: the C writer cannot be built")
    home = os.path.join(os.path.dirname(control.__file__), "..", "examples", "trace_writer")
    work = tmp_path / "writer"
    shutil.copytree(home, work, ignore=shutil.ignore_patterns("trace_writer"))
    make = subprocess.run(["make", "-C", str(work)], capture_output=True, text=True)
    assert make.returncode == 0 and "warning" not in make.stderr, make.stdout + make.stderr
    control.record_control(tmp_path / "py", "v4.1-flash", (0,), prefill=8, decode=2, max_pos=64)
    (tmp_path / "plan.txt").write_text(_plan(Trace(str(tmp_path / "py")), tmp_path / "raw"))
    (tmp_path / "c").mkdir()
    run = subprocess.run([str(work / "trace_writer"), str(tmp_path / "plan.txt"), str(tmp_path / "c")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr

    def verdicts(path):
        return [(v.layer, v.step, v.stage, v.rule, v.status) for v in judged(path)]
    python = verdicts(tmp_path / "py")
    assert python and verdicts(tmp_path / "c") == python and all(v[-1] == "PASS" for v in python)


def test_a_long_prefill_s_attention_is_judged_by_token_chunks_at_its_positions(tmp_path, monkeypatch):
    """ATTN.PROB.ORDER's bounds hold a float64 copy of every listed row per token: judged CHUNK tokens
    at a time, the verdict and the position it names are those of the whole."""
    from dsv4spec.trace import judge as trace_judge
    model, layers, prefill, decode, plant, _ = PLANTED["fp32_probabilities"]
    control.record_control(tmp_path, model, layers, prefill, decode, plant=plant, max_pos=64)
    whole = departing(judged(tmp_path, rules=["ATTN.PROB"]))[0]
    monkeypatch.setattr(trace_judge, "CHUNK", 3)
    chunked = departing(judged(tmp_path, rules=["ATTN.PROB"]))[0]
    assert whole.detail.split(":")[0] == chunked.detail.split(":")[0] and "position" in whole.detail
    assert "the step's later tokens were not judged]" in chunked.detail and "chunk" not in whole.detail


@pytest.mark.parametrize("rule, stage, places, named", [
    ("ROPE.POSITIONS", "q_attn_rot", [(280, 3, 500)], "position 280, head 3, channel 500"),
    ("ROPE.POSITIONS", "kv_rot", [(300, 450)], "position 300, channel 450"),
    ("ATTN.DEROTATE", "o_derot", [(257, 15, 511)], "position 257, head 15, channel 511"),
    ("PATH.QDQ", "kv_window", [(270, 7), (301, 8)], "position 270, channel 7"),       # its judge lists each place
    ("ATTN.PROB.ORDER", "o", [(300, 2, 100)], "position 300, head 2, channel 100")])
def test_a_deviation_in_a_late_token_chunk_is_located_at_its_absolute_position(tmp_path, monkeypatch, rule, stage,
                                                                               places, named):
    """A prefill of 320 tokens judged CHUNK = 256 tokens at a time, each chunk a case from its own first
    position: a stage off at values of the second chunk FAILs there, at the places (in the judge's own
    words too) the whole step's judge names."""
    from dsv4spec.cmd_bench import _script
    from dsv4spec.trace import judge as trace_judge
    given = _script("bench_trace").inputs("v4.1-flash", 0, 320)
    stages = official_attn.attention_layer(dict(given), model="v4.1-flash", layer=0, start_pos=0)
    for place in places:
        stages[stage][place] += 8
    with Recorder(tmp_path, model="v4.1-flash", config={"n_heads": 16}) as rec:
        rec.record("sink", given.pop("sink"), layer=0)
        for name, value in {**given, **stages}.items():
            rec.record(name, value.to(torch.bfloat16) if value.is_floating_point() else value, layer=0, step=(0, 320))
    chunked = departing(judged(tmp_path, rules=[rule]))
    monkeypatch.setattr(trace_judge, "CHUNK", 10 ** 6)
    whole = departing(judged(tmp_path, rules=[rule]))
    assert [(v.stage, v.status) for v in chunked] == [(v.stage, v.status) for v in whole] == [(stage, "FAIL")]
    for v in chunked + whole:
        assert v.detail.startswith(named + ": ") and all(f"at {p}" in v.detail for p in places), v.detail[:400]
    assert "the counts are of positions 256-319, the first chunk that departs]" in chunked[0].detail   # the last
    assert "chunk" not in whole[0].detail, whole[0].detail[-300:]


def test_a_chunk_s_attention_reads_only_the_kv_rows_its_lists_name():
    """reads_only: the rows the lists name, in order, the lists renumbered into them (the same rows
    gathered); lists naming a row the KV lacks, or none, are left as they are."""
    from dsv4spec.trace.judge import reads_only
    kv = np.arange(40.0).reshape(10, 4)
    indices = np.array([[7, 3, -1], [3, 9, 7]], dtype=np.int32)
    rows = reads_only({"kv": kv, "indices": indices, "o": 0})
    assert rows["indices"].dtype == np.int32 and rows["indices"].tolist() == [[1, 0, -1], [0, 2, 1]]
    named = indices != -1
    assert (rows["kv"][rows["indices"][named]] == kv[indices[named]]).all() and len(rows["kv"]) == 3
    for wrong in ([[10, 3, -1]], [[-2, 3, 1]], [[-1, -1, -1]]):
        kept = reads_only({"kv": kv, "indices": np.array(wrong)})
        assert kept["kv"] is kv and kept["indices"].tolist() == wrong


@pytest.mark.thorough
def test_decode_across_the_ring_wrap_and_a_completed_hca_entry(tmp_path):
    """V4-Flash window and HCA layers: a prefill of 126, then decode 126…130: HCA entry 0 completes at
    127, the ring wraps at 128 (its slots judged against the steps that wrote them)."""
    control.record_control(tmp_path, "v4-flash", (0, 3), prefill=126, decode=5, max_pos=256)
    verdicts = judged(tmp_path)
    assert not departing(verdicts), departing(verdicts)[0].detail[:500]
    ring = [v for v in verdicts if v.rule == "PATH.WINDOW.RING"]
    assert {v.step.start_pos for v in ring} == {126, 127, 128, 129, 130}


@pytest.mark.thorough
def test_decode_past_the_top_k_at_position_1026(tmp_path):
    """V4.1 window, ratio-2 source and layer 20: a prefill of 1024, decode 1024…1027 (513 entries of
    ratio 2 at 1026: one more than the top-k; layer 2 reads layer 20's published index K at even steps)."""
    control.record_control(tmp_path, "v4.1-flash", (0, 2, 20), prefill=1024, decode=4, max_pos=1100)
    verdicts = judged(tmp_path)
    assert not departing(verdicts), departing(verdicts)[0].detail[:500]
    assert any(v.rule == "PATH.K.PUBLISHED" and v.step.start_pos == 1026 for v in verdicts)


def test_progress_goes_to_standard_error_and_a_judged_small_trace_passes(small_trace, capsys):
    assert main(["check-trace", str(small_trace)]) == 0
    captured = capsys.readouterr()
    assert "[1/1 layer-steps] 1 stages judged, 0 departing" in captured.err
    assert "PATH.WINDOW" in captured.out and "PASS" in captured.out


def test_the_benchmark_refuses_a_prefill_the_memory_cannot_hold_in_one_line(monkeypatch, capsys):
    from dsv4spec.cmd_bench import _script
    bench = _script("bench_trace")
    monkeypatch.setattr(bench, "available_gb", lambda: 16.0)
    monkeypatch.setattr("sys.argv", ["bench_trace.py", "--tokens", "65536"])
    assert bench.main() == bench.SHORT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tokens 65536 needs about 41 GB" in err and "16.0 GB is available" in err


def test_the_benchmark_reads_the_judge_s_own_peak_not_the_memory_it_was_forked_from(small_trace):
    """A child's ru_maxrss counts the resident memory of the process it was forked from (the reference's):
    the judge reports its own."""
    from dsv4spec.cmd_bench import _script
    held = np.ones(2 ** 27)         # 1 GiB resident here
    verdicts, status, peak_mb = _script("bench_trace").judge(str(small_trace), 1)
    assert status == 0 and peak_mb is not None and peak_mb < held.nbytes / 2 ** 20, (peak_mb, verdicts)
