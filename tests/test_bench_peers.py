"""bench/bench_peers.py without a GPU: the FlagGems child processes (a stand-in package that
segfaults, raises, hangs, answers wrong or is missing), the ratio to the best peer per column,
the Markdown, the argument checks and the refusal without a GPU.  No timing is judged."""
import json
import subprocess
import sys
import textwrap

import pytest

from dsv4spec import cmd_bench as B

PEERS = B._script("bench_peers")
SHAPES = [(1, 64, 8), (2, 64, 8), (3, 64, 8)]

FAKE = """
import os, signal, time
import torch

def bucket_sort_topk(inputs, starts, ends, topk):
    rows = inputs.shape[0]
    behaviour = {behaviour!r}.get(rows, "ok")
    if behaviour == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if behaviour == "raise":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if behaviour == "hang":
        time.sleep(600)
    if behaviour == "wrong":
        return torch.arange(topk, dtype=torch.int32).repeat(rows, 1)
    return torch.topk(inputs, topk, dim=1).indices.int()
"""


def fake_flaggems(tmp_path, behaviour: dict):
    """A folder holding a stand-in flag_gems package whose bucket_sort_topk does, for a call with
    R rows, behaviour.get(R, 'ok')."""
    site = tmp_path / "fgsite"
    pkg = site / "flag_gems" / "fused" / "DSA"
    pkg.mkdir(parents=True)
    for folder in (site / "flag_gems", site / "flag_gems" / "fused", pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "bin_topk.py").write_text(textwrap.dedent(FAKE.format(behaviour=behaviour)))
    return str(site)


def flaggems(site, budget=120.0):
    return PEERS.run_flaggems(site, SHAPES, rep=1, budget_s=budget, device="cpu")


def test_a_segfault_costs_its_shape_and_a_new_child_runs_the_rest(tmp_path):
    got = flaggems(fake_flaggems(tmp_path, {2: "segv"}))
    assert got["1x64x8"]["validity"] == "valid" and got["3x64x8"]["validity"] == "valid"
    assert got["2x64x8"] == {"error": "the child process died of SIGSEGV"}
    assert got["1x64x8"]["eager_us"] > 0 and got["1x64x8"]["graph_us"] is None


def test_an_error_is_reported_by_the_child_and_the_rest_still_run(tmp_path):
    got = flaggems(fake_flaggems(tmp_path, {1: "raise", 3: "wrong"}))
    assert got["1x64x8"] == {"error": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert got["2x64x8"]["validity"] == "valid"
    assert got["3x64x8"]["validity"].startswith("INVALID")


def test_a_missing_package_skips_every_shape_with_one_reason(tmp_path):
    got = flaggems(str(tmp_path))
    assert {s: v.keys() for s, v in got.items()} == {"1x64x8": {"skipped"}, "2x64x8": {"skipped"}, "3x64x8": {"skipped"}}
    assert "cannot import flag_gems.fused.DSA.bin_topk.bucket_sort_topk" in got["1x64x8"]["skipped"]
    assert PEERS.run_flaggems(None, SHAPES, 1, 10)["1x64x8"]["skipped"].startswith("no --flaggems DIR")


def test_a_hanging_peer_is_stopped_at_the_budget(tmp_path):
    """The first shape hangs: nothing here waits on how fast a child answers (the segfault test keeps the
    rows answered before a failure)."""
    got = flaggems(fake_flaggems(tmp_path, {1: "hang"}), budget=3.0)
    assert got["1x64x8"]["error"].startswith("timed out")
    assert got["2x64x8"] == got["3x64x8"] == {"skipped": "the FlagGems budget (3 s) was spent"}


def row(ours, **peers):
    return dict(case="top-k 1x65536 k=2048 (position), device API", kind="topk", ours=ours, peers=peers,
                validity="valid", vs_copy=0.1, bytes=262144)


def test_the_best_peer_per_column():
    r = row(dict(eager_us=50.0, graph_us=10.0), torch=dict(eager_us=60.0, graph_us=55.0),
            flaggems=dict(eager_us=40.0, graph_us=30.0), official=dict(skipped="absent"))
    assert PEERS.best_peer(r, "eager") == ("flaggems", 40.0, 0.8)
    assert PEERS.best_peer(r, "graph") == ("flaggems", 30.0, 3.0)
    assert PEERS.best_peer(row(dict(eager_us=5.0, graph_us=None), torch=dict(eager_us=6.0, graph_us=None)),
                           "graph") == (None, None, None)
    md = PEERS.markdown(dict(gpu="G", copy_TBps=4.0, torch="t", triton="tr", rows=[r]))
    assert "| 50.0 / 10.0 | – | 40.0 / 30.0 | absent | 60.0 / 55.0 | 0.80× (flaggems) | 3.00× (flaggems) | valid |" in md
    assert "- official: absent" in md


def test_topk_shapes_are_rows_positions_and_k():
    assert PEERS.parse_shapes("1x65536x2048,1x1048576x512") == [(1, 65536, 2048), (1, 1048576, 512)]
    for bad in ("1x64", "1x64x128", "0x64x8", "ax64x8"):
        with pytest.raises(ValueError, match="is not RxNxK"):
            PEERS.parse_shapes(bad)
    assert PEERS.parse_args(["--topk-shapes", "2x64x8"]).topk_shapes == [(2, 64, 8)]
    assert PEERS.parse_args([]).topk_shapes is None


def test_only_takes_known_sections(capsys):
    with pytest.raises(SystemExit):
        PEERS.parse_args(["--only", "codecs,attn"])
    assert "unknown section(s) attn" in capsys.readouterr().err
    assert PEERS.parse_args(["--only", "topk"]).only == "topk"


def test_official_absent_says_why(tmp_path):
    module, why = PEERS.official_module(None)
    assert module is None and "no --official PATH" in why
    module, why = PEERS.official_module(str(tmp_path))            # a folder without kernel.py
    assert module is None and "is not a file" in why


def test_bench_peers_refuses_without_a_gpu():
    done = subprocess.run([sys.executable, "bench/bench_peers.py"], capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "bench_peers: needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_the_child_checks_its_shapes():
    done = subprocess.run([sys.executable, "bench/peer_flaggems.py", "--site", ".", "--shapes", "1x64"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "expected RxNxK" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def interpreter():
    from dsv4spec.kernels import INTERPRET
    if not INTERPRET:
        pytest.skip("the CPU smoke run takes CPU tensors (the interpreter); on a GPU the bench runs itself")


def test_codec_rows_on_the_cpu_with_a_stand_in_kernel_file(interpreter):
    """The codec rows end to end under the interpreter: ours against the stand-in kernel.py (the
    official computation in CPU torch, same signatures) bit for bit, and torch's baseline timed."""
    import torch
    from dsv4spec.kernels import device as D
    official, why = PEERS.official_module("tests/fake_official_kernel")
    assert why is None
    rows = PEERS.run_codecs(torch, D, official, None, 1, 64, 4.0, False, device="cpu")
    got = {r["case"]: r for r in rows}
    assert list(got) == ["fp4_e8m0_quantize /32 bf16 64x128", "fp4_e4m3_quantize /16 bf16 64x128",
                         "fp8_quantize /32 bf16 64x128", "fp8_quantize /64 bf16 64x128", "fp8_quantize /128 bf16 64x128"]
    for r in rows:
        assert set(r["peers"]) == {"torch", "official"} and r["ours"]["eager_us"] > 0
    assert [r["validity"] for r in rows if "e4m3" not in r["case"]] == ["bit-exact against official"] * 4
    class Broken:                  # the stand-in with one scale byte changed: the comparison must see it
        def act_quant(x, block, fmt, dtype):
            q, s = official.act_quant(x, block, fmt, dtype)
            s = s.view(torch.uint8).clone()
            s.view(-1)[5] ^= 1
            return q, s.view(dtype)
        fp4_act_quant = official.fp4_act_quant
    broken = PEERS.run_codecs(torch, D, Broken, None, 1, 64, 4.0, True, device="cpu")
    assert [r["validity"] for r in broken if r["case"].startswith("fp8")] == \
        ["INVALID: 0 payload / 1 scale bytes differ from official"] * 3
    e4m3 = next(r for r in rows if "e4m3" in r["case"])
    assert "no such call" in e4m3["peers"]["official"]["skipped"]
    assert "bits not compared" in e4m3["validity"]


def test_topk_rows_on_the_cpu_with_a_stand_in_flaggems(interpreter, tmp_path):
    import torch
    from dsv4spec.kernels import device as D
    site = fake_flaggems(tmp_path, {2: "segv"})
    rows = PEERS.run_topk(torch, D, site, 1, [(1, 4096, 16), (2, 4096, 16)], 4.0, False, 60.0, device="cpu")
    assert [r["validity"] for r in rows] == ["valid", "valid"]
    assert rows[0]["peers"]["flaggems"]["validity"] == "valid"
    assert rows[1]["peers"]["flaggems"] == {"error": "the child process died of SIGSEGV"}
    assert PEERS.best_peer(rows[0], "eager")[0] in ("torch", "flaggems")


def test_ops_rows_on_the_cpu(interpreter):
    """The torch.library operators against the direct calls: same bits, both timed (device and
    host), the host overhead recorded; the rows join dsv4spec bench's table without a goal."""
    import torch
    from dsv4spec.kernels import device as D
    rows = PEERS.run_ops(torch, D, 1, device="cpu", small=True, calls=1)
    assert [r["validity"] for r in rows] == ["same bits as the direct call"] * 4
    assert all(r["ours"]["host_us"] > 0 and r["peers"]["custom op"]["host_us"] > 0 for r in rows)
    table = B.combine({"peers": dict(gpu="G", torch="t", triton="tr", copy_TBps=4.0, rows=rows)})
    assert {r["meets_goal"] for r in table["rows"]} == {None}
    assert all(r["host_overhead_us"] == pytest.approx(src["host_overhead_us"]) for r, src in zip(table["rows"], rows))
    assert all(cells[9] == "–" for cells in B.table_rows(table))         # no ceiling for these rows


def test_the_whole_run_on_the_cpu_feeds_dsv4spec_bench(interpreter, tmp_path, monkeypatch, capsys):
    """bench_peers.main end to end at toy sizes (the GPU's clock and copy ceiling stood in for):
    every section's rows, bench_peers.json and .md written, and dsv4spec bench's combine and
    publish take the part as it is."""
    import bench_attn              # (bench/ is on sys.path: bench_peers put it there)
    import torch
    monkeypatch.setattr(B, "cuda_torch", lambda script: torch)
    monkeypatch.setattr(bench_attn, "copy_ceiling", lambda torch_, rep: 4.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "CPU stand-in")
    monkeypatch.setattr(PEERS, "DEVICE", "cpu")
    monkeypatch.setattr(PEERS, "CODEC_TOKENS", {True: 32})
    monkeypatch.setattr(PEERS, "TOPK_QUICK", [(1, 4096, 16)])
    monkeypatch.setattr(PEERS, "OPS_SMALL", True)
    monkeypatch.setattr(PEERS, "OPS_CALLS", 1)
    site = fake_flaggems(tmp_path, {})
    out = tmp_path / "parts"
    code = PEERS.main(["--quick", "--rep", "1", "--out", str(out), "--official", "tests/fake_official_kernel",
                       "--flaggems", site, "--flaggems-budget", "60"])
    assert code == 0, capsys.readouterr().out[-3000:]
    part = json.loads((out / "bench_peers.json").read_text())
    assert [r["kind"] for r in part["rows"]] == ["topk"] + ["ops"] * 4 + ["codec"] * 5
    assert part["rows"][0]["peers"]["flaggems"]["validity"] == "valid"
    assert "| top-k 1x4096 k=16 (position), device API |" in (out / "bench_peers.md").read_text()
    result = B.combine({"peers": part})
    assert result["gpu"] == "CPU stand-in" and len(result["rows"]) == 10
    assert B.publish(result, tmp_path / "pub", None) == 0 and (tmp_path / "pub" / "bench.md").exists()
