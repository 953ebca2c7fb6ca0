"""Sweep of the top-k threshold filter's tunables (kernels/indexer.py FilterTune) on one CUDA GPU.

For each case (rows 1x1M k 512 and k 2048, 64x1M k 2048, 1024x64K k 2048, all in V4.1 position
order; block selection [1024, 262144] -> 2048 blocks of 8, i.e. the engine on [1024, 32768] block
scores) and each configuration of a small grid (one tunable changed at a time from the default,
plus a few pairs), it replays the filter's launches from a CUDA graph (device time, no host
overhead; triton.testing.do_bench median) and checks the result equal, bit for bit, to the
default configuration's (and every row served by the filter).  Prints a table (µs, and the
speed-up over the default) and writes sweep_topk.json to --out.  The grid's kernels are first
compiled in --jobs parallel processes (into Triton's cache); no new configuration starts once
--budget seconds have passed (compiles included).  Refuses (exit 2) without a GPU.

    python bench/sweep_topk.py --out out/
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from dsv4spec.cmd_bench import cuda_torch

DEVICE = "cuda"   # (tests run the sweep's logic on the CPU interpreter)

CASES = (  # name, rows, row length, k, block (0: a row top-k; 8: block selection of 8-blocks)
    ("1x1M k512", 1, 1 << 20, 512, 0),
    ("1x1M k2048", 1, 1 << 20, 2048, 0),
    ("64x1M k2048", 64, 1 << 20, 2048, 0),
    ("1024x64K k2048", 1024, 1 << 16, 2048, 0),
    ("blocks 1024x262144 -> 2048", 1024, 1 << 18, 2048, 8),
)

# FilterTune fields changed from each case's default (one at a time, plus a few pairs; "ch*"
# multiplies the default chunk).  Grid points equal to the default are measured once.
GRID = (
    {},
    {"run": 32},
    {"prefetch": False},
    {"run": 32, "prefetch": False},
    {"block": 1024},
    {"block": 4096},
    {"block": 1024, "warps": 4},
    {"warps": 4},
    {"ch*": 0.5},
    {"ch*": 2},
    {"block": 4096, "run": 4096, "prefetch": False},   # one reservation per tile (barriers)
    {"sub": 512},
    {"sub": 2048},
    {"sub": 4096},
    {"threshold_warps": 4},
    {"threshold_warps": 16},
    {"select_warps": 4},
    {"select_warps": 8},
    {"select_warps": 16},
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder (or .json path) for sweep_topk.json")
    ap.add_argument("--rep", type=int, default=20, help="do_bench rep (ms) per measurement")
    ap.add_argument("--budget", type=float, default=85.0, help="seconds after which no new "
                    "configuration starts")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling the grid's kernels in parallel first (1: none)")
    return ap.parse_args(argv)


def graph_us(torch, fn, rep):
    """Median µs of CUDA-graph replays of fn (fn must not synchronize)."""
    from triton.testing import do_bench
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=5, rep=rep, return_mode="median") * 1e3


def case_inputs(torch, R, N, block):
    """(engine input [R, n], n_valid, mask width or 0): BF16-valued random scores; for block
    selection the 8-block maxima of a [R, N] row with the newest block pinned to +inf (what
    kernels.pool's block-max kernel gives for compress_lens = N)."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(R, N, device=DEVICE, generator=g).bfloat16().float()
    if block:
        x = x.view(R, N // block, block).amax(-1).contiguous()
        x[:, -1] = float("inf")
    nv = torch.full((R,), x.shape[1], dtype=torch.int32, device=DEVICE)
    return x, nv, (N if block else 0)


def resolve(KT, R, n, k, change):
    """The FilterTune fields of one grid point for this case (None: not applicable)."""
    base = KT._filter_config(R, n, k)
    fields = {f: v for f, v in change.items() if f != "ch*"}
    if "ch*" in change:
        fields["ch"] = int(base.ch * change["ch*"])
    tune = dataclasses.replace(base, **fields)
    tune = dataclasses.replace(tune, ch=max(tune.ch, tune.block), run=min(tune.run, tune.block))
    if tune.ch % tune.block or tune.block % tune.run or tune.block > n:
        return None
    return dataclasses.asdict(tune)


def case_setup(torch, KT, case):
    """A case's inputs, the filter's arguments and a maker of output buffers."""
    name, R, N, k, block = case
    x, nv, width = case_inputs(torch, R, N, block)
    filt = dict(by_score=False, drop_neg_inf=width > 0, remap=None, mask=width > 0,
                mask_block=block, group=None, cap=None, blocks=None)

    def fresh():
        return (torch.zeros((R, width), dtype=torch.int8, device=DEVICE) if width
                else torch.empty((R, k), dtype=torch.int64, device=DEVICE))

    return dict(name=name, R=R, n=x.shape[1], k=k, x=x, nv=nv, filt=filt, fresh=fresh)


def run_config(torch, KT, c, change, rep):
    """One grid point on one case: None when it does not apply or repeats a measured one."""
    tune = resolve(KT, c["R"], c["n"], c["k"], change)
    key = None if tune is None else tuple(sorted(tune.items()))
    if key is None or key in c["seen"]:
        return None
    c["seen"].add(key)
    x, nv, k, filt = c["x"], c["nv"], c["k"], c["filt"]
    with KT.filter_tuning(**tune):
        out = c["fresh"]()
        flag = KT._topk_filter(x, nv, k, out, **filt)
        ok = flag is not None and not bool(flag.any()) and torch.equal(out, c["ref"])
        buf = c["fresh"]()
        us = graph_us(torch, lambda: KT._topk_filter(x, nv, k, buf, **filt), rep) if ok else None
    return dict(case=c["name"], change=change, tune=tune, us=us, torch_us=c["torch_us"],
                status="ok" if ok else "MISMATCH against the default (or rows flagged)")


def _compile_worker(task):
    """(In a fresh process) run one grid point on one case once: its kernels land in Triton's
    on-disk cache, so the timing process does not compile them."""
    change, case = task
    import torch
    from dsv4spec.kernels import topk as KT
    c = case_setup(torch, KT, case)
    tune = resolve(KT, c["R"], c["n"], c["k"], change)
    if tune is not None:
        with KT.filter_tuning(**tune):
            KT._topk_filter(c["x"], c["nv"], c["k"], c["fresh"](), **c["filt"])
        torch.cuda.synchronize()
    return True


def precompile(jobs):
    """Compile every grid point's kernels in parallel processes (best effort: what fails here is
    compiled, or reported, by the timing process)."""
    import concurrent.futures
    import multiprocessing
    tasks = [(change, case) for change in GRID for case in CASES]
    try:
        with concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(_compile_worker, tasks))
    except Exception as e:  # noqa: BLE001
        print(f"precompile: {type(e).__name__}: {e}", file=sys.stderr)


def table(rows):
    lines = ["| case | change from default | µs (graph) | vs default | vs torch.topk | status |",
             "|---|---|---:|---:|---:|---|"]
    default = {r["case"]: r["us"] for r in rows if r.get("change") == {} and r.get("us")}
    for r in rows:
        us = r.get("us")
        d = default.get(r["case"])
        change = ", ".join(f"{k}={v}" for k, v in r["change"].items()) or "(default)"
        lines.append(f"| {r['case']} | {change} | {us:.1f} |" if us else f"| {r['case']} | {change} | – |")
        lines[-1] += (f" {d / us:.2f}× | {r['torch_us'] / us:.2f}× |" if us and d else " – | – |")
        lines[-1] += f" {r['status']} |"
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    torch = cuda_torch("sweep_topk")
    if torch is None:
        return 2
    from dsv4spec.kernels import topk as KT
    t0 = time.time()
    if args.jobs > 1:
        precompile(args.jobs)
        print(f"precompiled in {time.time() - t0:.1f} s", flush=True)
    cases = []
    for case in CASES:
        c = case_setup(torch, KT, case)
        c["ref"] = c["fresh"]()
        KT._topk_filter(c["x"], c["nv"], c["k"], c["ref"], **c["filt"])
        c["torch_us"] = graph_us(torch, lambda: torch.topk(c["x"], c["k"], dim=1, sorted=False), args.rep)
        c["seen"] = set()
        cases.append(c)
    rows = []
    for change in GRID:   # grid-major: a budget cut drops the last grid points, not a case
        for c in cases:
            if time.time() > t0 + args.budget:
                rows.append(dict(case=c["name"], change=change, status="skipped (budget)"))
                continue
            try:
                row = run_config(torch, KT, c, change, args.rep)
            except Exception as e:  # noqa: BLE001 -- report it and go on with the grid
                row = dict(case=c["name"], change=change, status=f"ERROR {type(e).__name__}: {e}"[:200])
            if row:
                rows.append(row)
                print(json.dumps(row), flush=True)
    text = table(rows)
    print(text)
    print(f"total {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}")
    if args.out:
        path = args.out if args.out.endswith(".json") else os.path.join(args.out, "sweep_topk.json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           seconds=time.time() - t0, rows=rows, table=text), f, indent=1)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
