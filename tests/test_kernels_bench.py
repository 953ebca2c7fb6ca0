"""`dsv4spec bench` without a GPU: the clear refusal, and the parts that need no GPU (merging the two
benchmarks' results, goals, Markdown, README's generated table).  No timing."""
import json
import os
import subprocess
import sys

import pytest

from dsv4spec import cmd_bench as B

QUANT = {"device": "GPU X", "torch": "t", "triton": "tr", "copy_GBps": 4000.0, "rows": [
    {"op": "fp4_e4m3_quantize", "shape": "1Mx128", "dtype": "bfloat16", "kernel_us": 100.0,
     "kernel_GBps": 3400.0, "kernel_over_copy": 0.85, "torch_us": 4000.0, "kernel_over_torch": 40.0,
     "mismatches": 0},
    {"op": "fp4_e4m3_dequantize", "shape": "1Mx128", "dtype": "->float32", "kernel_us": 90.0,
     "kernel_GBps": 3000.0, "kernel_over_copy": 0.75, "mismatches": 0}]}
INDEXER = {"gpu": "GPU X", "ceilings": {"copy_TBps": 4.1, "bf16_gemm_TFLOPs": 700.0}, "rows": [
    {"case": "top-k 64x1048576 k=2048 (position)", "kernel_us": 100.0, "graph_us": 90.0,
     "torch_us": 900.0, "TBps": 2.6, "vs_torch": 9.0, "vs_ceiling": 0.6, "validity": "valid"},
    {"case": "top-k 1x1048576 k=512 (position)", "kernel_us": 30.0, "torch_us": 120.0, "TBps": 0.1,
     "vs_torch": 4.0, "vs_ceiling": 0.03, "validity": "valid"},
    {"case": "top-k 1x65536 k=2048 (context 65536)", "context": 65536, "kernel_us": 20.0,
     "torch_us": 60.0, "TBps": 0.01, "vs_torch": 3.0, "vs_ceiling": 0.01, "validity": "valid"},
    {"case": "logits bf16 T=4096 S=65536 H=64 D=128 (prefill, causal)", "kernel_us": 9000.0,
     "torch_us": 80000.0, "TFLOPs": 300.0, "vs_torch": 8.9, "vs_ceiling": 0.43, "validity": "valid"}]}


def test_bench_refuses_without_a_gpu():
    done = subprocess.run([sys.executable, "-m", "dsv4spec", "bench"], capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_benchmark_scripts_share_one_gpu_check(monkeypatch, capsys):
    """Every bench script asks cmd_bench.cuda_torch: the interpreter selected, or no CUDA GPU, is a
    one-line refusal naming the script; on a GPU it pins TRITON_INTERPRET to 0 for the kernels."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert B.cuda_torch("bench_x") is None and "bench_x: needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.delenv("TRITON_INTERPRET")
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert B.cuda_torch("bench_x") is None and "(none present)" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert B.cuda_torch("bench_x") is torch and os.environ["TRITON_INTERPRET"] == "0"
    for script in ("bench_quant", "bench_path", "bench_indexer", "sweep_topk", "probe_select", "probe_ncu"):
        assert f'cuda_torch("{script}")' in open(f"bench/{script}.py").read(), script
    for script in ("ab_decode", "ab_logits"):   # through bench/ab_common.py's start
        assert f'start("{script}", ' in open(f"bench/{script}.py").read(), script


def test_a_record_holds_complete_runs_only():
    done = subprocess.run([sys.executable, "-m", "dsv4spec", "bench", "--record", "--only", "topk"],
                          capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "complete runs only" in done.stderr


def test_render_combines_the_parts_of_runs_and_records_only_every_part(tmp_path):
    """A run cut short on a device's limit, finished with --only: its parts/*.json combine into one
    table, each row as its own run measured it; a record of the combination needs every part."""
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "bench_quant.json").write_text(json.dumps(QUANT))
    (parts / "bench_indexer.json").write_text(json.dumps(INDEXER))
    result = B.rendered(parts, record=None)
    assert result["rows"] == B.combine({"quant": QUANT, "indexer": INDEXER})["rows"]
    with pytest.raises(ValueError, match="missing bench_path.json, bench_attn.json, bench_peers.json"):
        B.rendered(parts, record=str(tmp_path / "record"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="none of bench_quant.json"):
        B.rendered(empty, record=None)


def test_render_judges_a_run_again_by_todays_goals(tmp_path):
    """--render of a bench.json keeps its measurements and judges them by the goals as they stand;
    the custom-op overhead rows carry none (they compare a call path, not a rate)."""
    op_row = {"case": "torch.library op vs direct call: fp8_quantize /128 bf16 16x128", "kernel_us": 4.0,
              "vs_ceiling": 0.01, "TBps": 0.1, "validity": "valid"}
    result = B.combine({"indexer": dict(INDEXER, rows=INDEXER["rows"] + [op_row])})
    assert result["rows"][-1]["goals"] == {"eager": ["–", None], "graph": ["–", None]}
    stale = json.loads(json.dumps(result))
    for row in stale["rows"]:
        row["goals"], row["goal"], row["meets_goal"] = {"eager": ["≥ 80 % of copy", False]}, "old", False
    (tmp_path / "bench.json").write_text(json.dumps(stale))
    assert B.rendered(tmp_path / "bench.json", record=None) == result


def test_rows_carry_their_goal_and_verdict_per_column():
    """Each row is judged on its eager column and its graph column (issue 23's goals where it sets
    them); a column that was not measured has no verdict, and the row's overall verdict is that
    every judged column met its goal."""
    result = B.combine({"quant": QUANT, "indexer": INDEXER})
    got = {r["case"]: {c: tuple(v) for c, v in r["goals"].items()} for r in result["rows"]}
    assert got["fp4_e4m3_quantize 1Mx128 bfloat16"] == {"eager": ("≥ 85 % of copy", True), "graph": ("–", None)}
    assert got["fp4_e4m3_dequantize 1Mx128 ->float32"]["eager"] == ("≥ 85 % of copy", False)
    assert got["top-k 64x1048576 k=2048 (position)"] == {"eager": ("≥ 1× torch eager", True),
                                                          "graph": ("≥ 6× torch graph", None)}
    assert got["top-k 1x1048576 k=512 (position)"] == {"eager": ("≥ 1× torch eager", True),
                                                        "graph": ("≤ 15 µs", None)}
    assert got["top-k 1x65536 k=2048 (context 65536)"]["eager"] == ("≥ 1× torch eager", True)
    assert got["logits bf16 T=4096 S=65536 H=64 D=128 (prefill, causal)"]["eager"] == ("≥ 45 % of bf16 GEMM", False)
    rows = {r["case"]: r for r in result["rows"]}
    assert rows["top-k 64x1048576 k=2048 (position)"]["meets_goal"] is True
    assert rows["fp4_e4m3_dequantize 1Mx128 ->float32"]["meets_goal"] is False
    assert result["ceilings"] == {"copy_TBps": 4.0, "bf16_gemm_TFLOPs": 700.0}
    md = B.markdown(result)
    assert md.count("\n| ") == 1 + len(result["rows"]) and "| 90.0 |" in md


def test_the_graph_column_is_judged_against_torchs_graph():
    """A top-k row with torch replayed from a CUDA graph too: the graph goal reads graph against
    graph; a result that is not valid meets no goal, whatever its speed."""
    row = dict(INDEXER["rows"][0], torch_graph_us=540.0)          # ours 90 µs in the graph: 6×
    result = B.combine({"indexer": dict(INDEXER, rows=[row, dict(row, graph_us=100.0),
                                                       dict(row, validity="INVALID: selection")])})
    verdicts = [(r["goals"]["eager"][1], r["goals"]["graph"][1]) for r in result["rows"]]
    assert verdicts == [(True, True), (True, False), (False, False)]
    cells = list(B.table_rows(result))[0]
    assert cells[3:7] == ["torch 900.0", "9.00×", "torch 540.0", "6.00×"]


def reindex_row(S, **extra):
    return dict({"case": f"re-index top-512 in a pool of 2048 blocks of 8 (T=64, S={S}, H=32)", "context": S,
                 "kernel_us": 200.0, "graph_us": 150.0, "torch_us": 900.0, "TBps": 0.7, "vs_torch": 4.5,
                 "vs_ceiling": 0.17, "validity": "valid"}, **extra)


@pytest.mark.parametrize("flatness, flat", [(1.1, True), (1.3, False)])
def test_reindex_rows_judge_speed_flatness_and_the_full_row(flatness, flat):
    """The re-index rows of the context sweep are judged against torch's gather-then-score, the
    1M row on its graph time over the 64K row's (issue 11: flat, <= 1.2x), and the 1M kernel
    against torch scoring the full row and masking it (>= 30x)."""
    full = dict(reindex_row(1 << 20), case="re-index at 1M vs scoring the full row and masking it (T=64, H=32)",
                torch_us=5000.0, vs_torch=25.0)
    rows = [reindex_row(1 << 16), reindex_row(1 << 20, flatness=flatness), full]
    got = [[tuple(v) for v in r["goals"].values()] for r in B.combine({"indexer": dict(INDEXER, rows=rows)})["rows"]]
    assert got == [[("faster than torch", True), ("–", None)],
                   [("faster than torch", True), ("≤ 1.2× the 64K row (flat)", flat)],
                   [("≥ 30× torch", False), ("–", None)]]


def test_replay_time_only_for_a_replay_that_gives_the_eager_bits(monkeypatch):
    """bench_indexer.replay_us times a CUDA graph's replays only when the replayed output equals
    the eager one (a graph that computes something else has no time), and times it in µs."""
    import torch
    bench = B._script("bench_indexer")
    replays = []

    class Graph:
        def replay(self):
            replays.append(1)

    monkeypatch.setattr(bench, "capture", lambda torch_, fn: (Graph(), fn()))
    monkeypatch.setattr(bench, "bench", lambda fn, rep: (fn(), 2e-6)[1])
    want = torch.arange(4)
    assert bench.replay_us(torch, lambda: torch.arange(4), 10, want) == pytest.approx(2.0)
    assert bench.replay_us(torch, lambda: torch.arange(4) + 1, 10, want) is None
    assert bench.replay_us(torch, lambda: torch.arange(4) + 1, 10) == pytest.approx(2.0)
    assert len(replays) == 5          # one replay before each check, one per timing


def test_decode_step_torch_replayed_from_a_graph_is_a_graph_peer():
    """A row whose torch baseline was replayed from a CUDA graph (torch_graph) has torch in its graph
    column, and its eager time where the bench printed it; the decode step is judged on both columns."""
    step = dict(reindex_row(1 << 20), case="decode step V4.1 at 1M tokens (262144 compressed): scores",
                torch_us=600.0, vs_torch=2.9, torch_graph=True, torch_eager_us=1500.0)
    result = B.combine({"indexer": dict(INDEXER, rows=[step, reindex_row(1 << 16)])})
    cells = [row[3:7] for row in B.table_rows(result)]
    assert cells == [["torch 1500.0", "7.50×", "torch 600.0", "4.00×"], ["torch 900.0", "4.50×", "–", "–"]]
    assert result["rows"][0]["goals"] == {"eager": ["≤ 150 µs", False], "graph": ["≤ 60 µs", False]}
    assert "judge each column" in B.readme_table(result, "x.json")


PATH = {"device": "GPU X", "copy_GBps": 4000.0, "rows": [
    {"fmt": "fp4_e8m0", "what": "index K", "shape": [1 << 20, 128], "bytes": 2e8, "fused_us": 80.0,
     "fused_over_copy": 0.62, "unfused_us": 400.0, "fused_over_unfused": 5.0, "mismatches": 0},
    {"fmt": "fp4_e4m3", "what": "V4.1 main KV", "shape": [1 << 18, 512], "bytes": 2e8, "fused_us": 90.0,
     "fused_over_copy": 0.55, "unfused_us": 450.0, "fused_over_unfused": 5.0, "mismatches": 3}]}


def test_rope_then_quantize_rows_join_the_table():
    rows = {r["case"]: r for r in B.combine({"path": PATH})["rows"]}
    fp4 = rows["RoPE then fp4_e8m0 quantize, index K 1Mx128 bfloat16"]
    assert (fp4["vs_ceiling"], fp4["vs_torch"], fp4["validity"], fp4["goal"]) == (0.62, 5.0, "bit-exact", "–")
    assert rows["RoPE then fp4_e4m3 quantize, V4.1 main KV 256Kx512 bfloat16"]["validity"] == "INVALID: 3 mismatches"


def test_readme_table_is_replaced_between_the_markers(tmp_path):
    records = tmp_path / "h200"
    records.mkdir()
    for date, speed in (("2026-11-29", 2.0), ("2026-11-30", 9.0)):
        result = B.combine({"indexer": {**INDEXER, "rows": [dict(INDEXER["rows"][0], vs_torch=speed)]}})
        result["date"] = date
        (records / f"{date}.json").write_text(json.dumps(result))
    (records / "notes.json").write_text("{}")              # not a dated run: ignored
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{B.README_BEGIN}\nold table\n{B.README_END}\n\nafter\n")
    B.write_readme(readme, B.latest_record(records))
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith(f"{B.README_END}\n\nafter\n")
    assert "old table" not in text and "2026-11-30" in text and "9.00×" in text and "2.00×" not in text
    B.write_readme(readme, B.latest_record(records))    # idempotent
    assert readme.read_text() == text


def test_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no table here\n")
    records = tmp_path / "h200"
    records.mkdir()
    (records / "2026-11-30.json").write_text(json.dumps(B.combine({"indexer": INDEXER})))
    try:
        B.write_readme(readme, B.latest_record(records))
    except ValueError as e:
        assert "markers" in str(e)
    else:
        raise AssertionError("expected a ValueError")


def test_plots_of_ratios_and_context_sweeps(tmp_path):
    """Two sweep series with the same context lengths (1 and 64 rows), as a real run has."""
    rows = [dict(INDEXER["rows"][2], case=f"top-k {r}x{n} k=2048 (context {n})", context=n)
            for r in (1, 64) for n in (65536, 262144)]
    result = B.combine({"quant": QUANT, "indexer": {**INDEXER, "rows": INDEXER["rows"] + rows}})
    B.plots(result, tmp_path)
    assert {p.name for p in tmp_path.glob("*.png")} == {"bench_ratios.png", "bench_context.png"}
    assert {B._series(r) for r in rows} == {"top-k 1xN k=2048", "top-k 64xN k=2048"}


def test_topk_sweep_refuses_without_a_gpu():
    done = subprocess.run([sys.executable, "bench/sweep_topk.py", "--out", "/nonexistent"],
                          capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_select_probe_refuses_without_a_gpu_and_counts_the_histogram_without_one():
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "bench/probe_select.py"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    pytest.importorskip("triton.backends.nvidia")
    done = subprocess.run([sys.executable, "bench/probe_select.py", "--ptx"], capture_output=True, text=True,
                          env=dict(env, TRITON_INTERPRET="0"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "a key;" in done.stdout and "vote.sync.ballot" in done.stdout   # the ballot histogram


def test_topk_sweep_grid_and_table():
    """Every grid point resolves to tunables that tile (or is dropped), and the table reports the
    speed-up over the default configuration of the same case."""
    import torch
    sys.path.insert(0, "bench")
    try:
        import sweep_topk as SW
    finally:
        sys.path.remove("bench")
    from dsv4spec.kernels import indexer as KI
    from dsv4spec.kernels import topk as KT
    for change in SW.GRID:
        tune = SW.resolve(KT, 64, 1 << 20, 2048, change)
        assert tune is None or (tune["ch"] % tune["block"] == 0 and tune["block"] % tune["run"] == 0)
    small = []   # the sweep's per-configuration logic on two small cases, on this device
    SW.DEVICE = str(KI._device())
    SW.graph_us = lambda torch, fn, rep: 1.0
    for case in (("row", 2, 4096, 16, 0), ("blocks", 2, 16384, 16, 8)):
        c = SW.case_setup(torch, KT, case)
        c["ref"] = c["fresh"]()
        KT._topk_filter(c["x"], c["nv"], c["k"], c["ref"], **c["filt"])
        c.update(torch_us=2.0, seen=set())
        small += [SW.run_config(torch, KT, c, change, 1) for change in ({}, {"run": 32}, {"sub": 64}, {})]
    assert [r and r["status"] for r in small] == ["ok", "ok", "ok", None] * 2, small
    rows = [dict(case="c", change={}, us=100.0, torch_us=300.0, status="ok"),
            dict(case="c", change={"run": 32}, us=50.0, torch_us=300.0, status="ok"),
            dict(case="c", change={"warps": 4}, status="skipped (budget)")]
    text = SW.table(rows)
    assert "| c | run=32 | 50.0 | 2.00× | 6.00× | ok |" in text
    assert "| c | warps=4 | – | – | – | skipped (budget) |" in text


def test_decode_step_sync_free_gives_the_read_back_bits():
    """bench_indexer's V4.1 decode step (scores, candidate block list, one gather, four re-index top-k)
    at a small size under the interpreter: the sync-free step that the bench replays from a CUDA
    graph gives the read-back step's bits, every pick inside the pool."""
    import torch
    from dsv4spec.kernels import INTERPRET, indexer as KI, pool as KP
    if not INTERPRET:
        pytest.skip("on a GPU the bench checks this itself (and test_kernels_pool's CUDA-graph test)")
    bench = B._script("bench_indexer")
    S = 16384 + 64                       # 2056 blocks of 8: the top-k engine picks 2048 of them
    d = bench.decode_inputs(torch, S, torch.Generator().manual_seed(0), H=4, D=32, device="cpu")
    tops, blocks = bench.decode_step_fn(torch, KI, KP, S, None, d, sync=True)()
    assert bench.same_step(bench.decode_step_fn(torch, KI, KP, S, None, d)(), (tops, blocks))
    assert blocks.shape == (1, 2048) and bool((blocks >= 0).all()) and bool((blocks.diff() > 0).all())
    assert all(bench.in_blocks(torch, t, blocks) for t in tops)
    assert not bench.in_blocks(torch, tops[0] + 8 * S, blocks)      # the check itself can fail
    assert [tuple(t.shape) for t in tops] == [(1, 512)] * 4


PEERS_PART = {"gpu": "GPU X", "torch": "t", "triton": "tr", "copy_TBps": 4.0, "rows": [
    {"case": "fp4_e8m0_quantize /32 bf16 1Mx128", "kind": "codec", "bytes": 4e8, "vs_copy": 0.8,
     "ours": {"eager_us": 100.0, "graph_us": 95.0},
     "peers": {"torch": {"eager_us": 7000.0, "graph_us": 6000.0},
               "official": {"eager_us": 468.0, "graph_us": 400.0, "differing": [0, 0]}},
     "validity": "bit-exact against official"},
    {"case": "fp8_quantize /128 bf16 1Mx128", "kind": "codec", "bytes": 4e8, "vs_copy": 0.9,
     "ours": {"eager_us": 100.0, "graph_us": 99.0},
     "peers": {"official": {"eager_us": 110.0, "graph_us": 100.0, "differing": [0, 3]}},
     "validity": "INVALID: 0 payload / 3 scale bytes differ from official"},
    {"case": "top-k 1x1048576 k=512 (position), device API", "kind": "topk", "bytes": 4194304, "vs_copy": 0.1,
     "ours": {"eager_us": 60.0, "graph_us": 14.0},
     "peers": {"torch": {"eager_us": 127.0, "graph_us": 116.0},
               "flaggems": {"error": "the child process died of SIGSEGV"}}, "validity": "valid"},
    {"case": "top-k 1x65536 k=2048 (position), device API", "kind": "topk", "bytes": 262144, "vs_copy": 0.1,
     "ours": {"eager_us": 70.0, "graph_us": 30.0},
     "peers": {"torch": {"eager_us": 63.0, "graph_us": 54.0},
               "flaggems": {"skipped": "no --flaggems DIR (or $DSV4SPEC_FLAGGEMS)"}}, "validity": "valid"}]}
ATTN_PART = {"gpu": "GPU X", "copy_TBps": 4.0, "rows": [
    {"case": "decode", "tokens": 1, "heads": 64, "head_dim": 512, "entries": 640, "kernel_us": 20.0,
     "graph_us": 8.0, "TBps": 2.5, "vs_copy": 0.62, "torch_us": 200.0, "torch_graph_us": 80.0,
     "official_us": 40.0, "official_graph_us": 16.0, "official_same_bits": False, "official_differing": 12,
     "official_max_ulps": 1.0, "validity": "valid (spec interval on 1 tokens: True)"}]}


def test_peer_rows_are_judged_on_both_columns_against_the_best_peer():
    """bench_peers' rows (the device API against torch, the official kernels, FlagGems) and
    bench_attn's join the table: each column's best peer and ratio, the codec goal (≥ 1.2× official
    with equal bits) per column, a failed or absent peer costing only its own cells."""
    result = B.combine({"peers": PEERS_PART, "attn": ATTN_PART})
    rows = {r["case"]: r for r in result["rows"]}
    fp4 = rows["fp4_e8m0_quantize /32 bf16 1Mx128"]
    assert fp4["goals"] == {"eager": ["≥ 1.2× official, bits equal", True], "graph": ["≥ 1.2× official, bits equal", True]}
    fp8 = rows["fp8_quantize /128 bf16 1Mx128"]
    assert fp8["goals"]["eager"] == ["≥ 1.2× official, bits equal", False]        # bits differ (and 1.1×)
    one = rows["top-k 1x1048576 k=512 (position), device API"]
    assert one["goals"] == {"eager": ["≥ 1× torch eager", True], "graph": ["≤ 15 µs", True]}
    short = rows["top-k 1x65536 k=2048 (position), device API"]
    assert short["goals"] == {"eager": ["≥ 1× torch eager", False], "graph": ["≥ 3× torch graph", False]}
    cells = {c[0]: c for c in B.table_rows(result)}
    assert cells["fp4_e8m0_quantize /32 bf16 1Mx128"][3:7] == ["official 468.0", "4.68×", "official 400.0", "4.21×"]
    assert cells["top-k 1x1048576 k=512 (position), device API"][-1] == \
        "flaggems FAILED: the child process died of SIGSEGV; torch 127.0 / 116.0"
    assert cells["top-k 1x65536 k=2048 (position), device API"][-1] == "flaggems absent; torch 63.0 / 54.0"
    attn = rows["sparse attention decode T=1, 64 heads of 512, 640 entries"]
    assert attn["goals"]["graph"] == ["≥ 60 % of copy", True]
    assert cells[attn["case"]][3:7] == ["official 40.0", "2.00×", "official 16.0", "2.00×"]
    assert "official: 12 elements differ" in attn["validity"]
    md = B.markdown(result)
    assert md.count("\n| ") == 1 + len(result["rows"])
    table = B.readme_table(result, "x.json")
    assert "| fp4_e8m0_quantize /32 bf16 1Mx128 | 100.0 | 95.0 | official 468.0 | 4.68× |" in table


def test_the_graph_backed_call_has_its_own_column_and_no_goal():
    """A graph-backed eager time (the device API's top-k, the decode step) shows beside the plain eager
    one with torch's eager time over it; the eager goal still judges the plain call."""
    peers = json.loads(json.dumps(PEERS_PART))
    peers["rows"][3]["ours"]["graph_backed_us"] = 31.5          # top-k 1x65536: plain 70 µs, torch 63
    step = {"case": "decode step V4.1 at 1M tokens (262144 compressed): scores, 2048 blocks, 4 re-index",
            "kernel_us": 499.0, "graph_us": 205.0, "graph_backed_us": 212.0, "torch_us": 1475.5, "torch_graph": True,
            "torch_eager_us": 2490.2, "vs_torch": 7.2, "TBps": 0.03, "vs_ceiling": 0.01, "validity": "valid"}
    indexer = dict(INDEXER, rows=[step])
    result = B.combine({"peers": peers, "indexer": indexer})
    rows = {r["case"]: r for r in result["rows"]}
    short = rows["top-k 1x65536 k=2048 (position), device API"]
    assert short["goals"]["eager"] == ["≥ 1× torch eager", False]          # 63 / 70: the plain call's verdict
    assert rows[step["case"]]["goals"]["eager"] == ["≤ 150 µs", False]
    cells = {c[0]: c for c in B.table_rows(result)}
    assert B.HEADER[7] == "graph-backed eager µs"
    assert cells[short["case"]][7] == "31.5 (2.00× torch eager)"
    assert cells[step["case"]][7] == "212.0 (11.75× torch eager)"
    assert cells["fp4_e8m0_quantize /32 bf16 1Mx128"][7] == "–"
    assert "| 31.5 (2.00× torch eager) |" in B.readme_table(result, "x.json")
    assert "graph-backed eager µs" in B.terminal_table(result).splitlines()[0]


def test_bench_names_its_parts_and_the_peers_it_lacks(capsys):
    """--only takes the parts (attn and peers among them); the peers' scripts get --official and
    --flaggems; without them one line says which peer is skipped and why."""
    import argparse
    from pathlib import Path
    with pytest.raises(ValueError, match="unknown part"):
        B.parse_only("peers,bogus")
    args = argparse.Namespace(rep=50, quick=True, official="tests/fake_official_kernel", flaggems="/site",
                              topk_shapes=None)
    runs = {part: argv for part, _, argv in B.scripts(args, {"peers", "attn"}, Path("o"))}
    assert set(runs) == {"peers", "attn"}
    assert runs["peers"][-4:] == ["--official", "tests/fake_official_kernel/kernel.py", "--flaggems", "/site"]
    assert "--quick" in runs["attn"] and runs["attn"][-2:] == ["--official", "tests/fake_official_kernel/kernel.py"]
    assert {p for p, _, _ in B.scripts(args, set(), Path("o"))} == {"quant", "path", "indexer", "attn", "peers"}
    assert B.absent_peers(args, {"peers"}) == []
    one_section = B.scripts(argparse.Namespace(**{**vars(args), "topk_shapes": "1x65536x2048"}),
                            B.parse_only("decode,peers.topk"), Path("o"))
    assert [(part, argv[-4:]) for part, _, argv in one_section][1:] == \
        [("peers", ["--only", "topk", "--topk-shapes", "1x65536x2048"])]
    assert one_section[0][2][-2:] == ["--only", "decode"]
    with pytest.raises(ValueError, match="unknown part"):
        B.parse_only("peers.bogus")
    lines = B.absent_peers(argparse.Namespace(official=None, flaggems=None), {"peers"})
    assert [line.split(":")[0] for line in lines] == ["official TileLang kernels skipped", "FlagGems' top-k skipped"]
    assert B.absent_peers(argparse.Namespace(official=None, flaggems=None), {"quant"}) == []


def test_ab_decode_plans_give_the_read_back_bits(capsys):
    """bench/ab_decode.py --cpu-smoke: every launch plan of the decode step (fused block maxima,
    one-program re-index top-k, the chunked block row) gives the read-back old step's picks."""
    from dsv4spec.kernels import INTERPRET, pool as KP
    if not INTERPRET:
        pytest.skip("on a GPU ab_decode compares the plans' bits itself")
    shipped = KP._ROW_TOPK_MAX
    assert B._script("ab_decode").main(["--cpu-smoke"]) == 0, capsys.readouterr().out
    assert KP._ROW_TOPK_MAX == shipped
    assert capsys.readouterr().out.count("same picks as the read-back old step: True") == 5


def test_ab_logits_variants_give_the_shipped_bits(capsys):
    """bench/ab_logits.py --cpu-smoke: every switch setting of the score kernel (kernels.indexer.SCORE_AB)
    at 1-3 programs a row gives the shipped path's bits, scores and block maxima; the switches are
    restored after each."""
    from dsv4spec.kernels import INTERPRET, indexer as KI
    if not INTERPRET:
        pytest.skip("on a GPU ab_logits compares the variants' bits itself")
    shipped = {switch: getattr(KI, switch) for setting in KI.SCORE_AB.values() for switch in setting}
    config = KI._score_config
    assert B._script("ab_logits").main(["--cpu-smoke"]) == 0, capsys.readouterr().out
    assert {switch: getattr(KI, switch) for switch in shipped} == shipped and KI._score_config is config
    assert capsys.readouterr().out.count("bits equal") == 3


def test_ab_logits_sweep_rows_and_record(monkeypatch, tmp_path):
    """bench/ab_logits.py's GPU sweep run in the interpreter with the timing and the graph faked: a
    row for every variant, then the configurations under shipped and the fastest same-bits variant;
    a row that cannot launch is recorded as an error; rows past the budget are listed as skipped;
    the record's JSON and Markdown are written."""
    from dsv4spec.kernels import INTERPRET, indexer as KI
    if not INTERPRET:
        pytest.skip("the GPU runs the sweep itself")
    import torch
    ab = B._script("ab_logits")
    common = B._script("ab_common")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    times = iter(range(10, 1000))

    def bench(fn, rep):
        fn()
        return next(times) * 1e-6

    def capture(torch_, fn):
        return type("Graph", (), {"replay": staticmethod(fn)})(), None
    configs = (None, (64, 3, 2, 4), (96, 3, 2, 4))   # 96 keys a block cannot launch (not a power of two)
    rows, skipped = ab.sweep(torch, KI, 1, 4.0, bench, capture, torch.Generator().manual_seed(1), 1e9,
                             variants=("shipped", "int_fp32"), configs=configs, cases=((256, 16, 0),),
                             device="cpu")
    assert [(r["variant"], r["config"]) for r in rows] == [
        ("shipped", "shipped"), ("int_fp32", "shipped"), ("shipped", dict(block_s=64, stages=3, programs=2, warps=4)),
        ("shipped", (96, 3, 2, 4))]
    assert all(r["same_as_shipped"] for r in rows[:3]) and "error" in rows[3]
    assert rows[0]["validity_of_shipped"].startswith("valid")
    rows2, skipped = ab.sweep(torch, KI, 1, 4.0, bench, capture, torch.Generator().manual_seed(1), -1.0,
                              variants=("shipped",), configs=configs[:1], cases=((256, 16, 8),), device="cpu")
    assert rows2 == [] and len(skipped) == 1
    res = dict(device="cpu", torch="t", triton="t", ceilings={"copy_TBps": 4.0}, seconds=1.0, rows=rows,
               skipped=skipped)
    common.record(str(tmp_path), "ab_logits", res, ab.markdown(res))
    md = (tmp_path / "ab_logits.md").read_text()
    assert md.count("| logits fp4 T=1 S=256 H=16 |") == len(rows) and "Skipped (out of --budget): 1 rows." in md


def test_bench_defaults_to_the_records_folder_and_the_kernels_page(tmp_path):
    """`dsv4spec bench --record` writes under docs/records/h200/, where the dated runs are, and
    `--readme` regenerates docs/KERNELS.md's table, which is fresh for the latest of them."""
    import shutil
    from pathlib import Path
    from dsv4spec.cli import build_parser
    record = build_parser().parse_args(["bench", "--record"]).record
    page = build_parser().parse_args(["bench", "--readme"]).readme
    assert Path(record) == B.REPO / "docs" / "records" / "h200" and Path(page) == B.REPO / "docs" / "KERNELS.md"
    latest = B.latest_record(Path(record))
    assert latest.name >= "2026-12-03.json"
    copy = Path(shutil.copy(page, tmp_path / "KERNELS.md"))
    B.write_readme(copy, latest)
    assert copy.read_text() == Path(page).read_text(), "docs/KERNELS.md's table is stale: dsv4spec bench --readme"
