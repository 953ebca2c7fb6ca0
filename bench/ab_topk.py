"""A/B of the top-k engine's paths in one process, on identical inputs: the shipped engine (the
few-row passes off: eagerly the "fused" path up to 2^24 scores and the "launches" path beyond,
inside a CUDA graph capture the "launches" path),
against the few-row passes (issue 23, TOPK.md item 1: one launch a key digit spread over the row's
chunks, then one emission; "few": four 8-bit digits, five launches; "few-11": digits of 11, 11 and
10 bits, four launches), with torch.topk beside them.  The older variants stay selectable:
"launches" (the filter's four launches and the sync-free radix launch), "fused" (at every size: one
launch where a row is one program's, else two), "fused-2" (the filter's chunks forced: two launches).

Every row: the device API's index_topk (position order) on BF16-valued fp32 scores, each variant
timed eagerly (as a user calls it) and replayed from a CUDA graph (device time), do_bench medians
(warm-up, L2 flushed between repetitions, CUDA events), and the host µs per call over a run of
back-to-back calls (what a launch-bound caller pays).  Every variant's output must equal the first
variant's bit for bit (all: tie-aware validity against torch.topk's score multiset), else its
times are dropped.  Each variant runs twice, interleaved (a, b, a, b): the spread of a variant's
two medians is the noise floor of the comparison.  A variant that fails (a compile error, a fault)
is recorded with its error and the run goes on.

Device command (one H200, ≤ 4 min with its compiles, ≤ 2 of them the A/B's timings; then the GPU-only checks: no host sync, graph
replay, the few-row bits against the engine's on the device):

    export TRITON_INTERPRET=0; python3 -m pip install --no-build-isolation --no-deps -q -e . >/dev/null 2>&1; timeout 240 python bench/ab_topk.py --out $OUT/ab_topk_few.json --rep 30 2>&1 | tee $OUT/ab_topk_few.txt | tail -40; timeout 90 python -m pytest -q -p no:cacheprovider tests/test_kernels_device.py -k "sync or graph" 2>&1 | tee $OUT/pytest_device.txt | tail -3

Predictions (written before the call; docs/records/h200/TOPK.md): graph ≈ 2.5 µs a launch plus the pass's
reads (pass 0 reads the row from HBM, passes 1-3 only the chunks still holding the prefix, the
emission only the chunks holding picks, from L2 while the rows fit it): 1x64K k 2048 ≈ 15-25 µs
(shipped 61, torch ≈ 52), 1x1M k 512 ≈ 15-22 (shipped 33), 1x1M k 2048 ≈ 15-22 (shipped 76),
8x1M k 2048 ≈ 35-70 (32 MB read about twice, 64K positions a program), 64x1M (outside "auto")
≈ 300-380, slower than the shipped 265 (five reads of 256 MB from HBM); few-11 one launch fewer
(≈ 2-3 µs less) if its 2048-bin histograms cost no more.  Eagerly the few-row variants are host
bound (five launches against the fused path's two: ≈ 100-150 µs).

    python bench/ab_topk.py --out ab_topk.json            # GPU: the table and the JSON
    python bench/ab_topk.py --variants launches,fused,fused-2 --shapes 1:65536:2048   # the 12-02 A/B
    python bench/ab_topk.py --host                         # no GPU: host µs of the Python path,
                                                           # launches stubbed, and the launches
                                                           # and torch ops a call makes
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(1, 1 << 20, 512), (1, 1 << 16, 2048), (1, 1 << 20, 2048), (8, 1 << 20, 2048),
          (64, 1 << 20, 2048)]   # (the goals' rows first: a run cut short keeps them)
QUICK = [(1, 1 << 16, 2048), (1, 1 << 20, 512)]
VARIANTS = ("shipped", "few", "few-11", "launches", "fused", "fused-2")
DEFAULT_VARIANTS = "shipped,few,few-11"
FEW_DIGITS = {"few": (8, 8, 8, 8), "few-11": (11, 11, 10)}
ONE_PROGRAM_ROW = 1 << 16   # kernels.topk._ONE_PROGRAM_ROW on a GPU


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON file for the results (written after every row)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms), per measurement")
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK} (a smoke run)")
    ap.add_argument("--shapes", default="", help="R:N:k,R:N:k,... instead of the default rows")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma-separated, of {VARIANTS}; the first is the bits' reference")
    ap.add_argument("--host", action="store_true",
                    help="no GPU: the Python path's host µs with the launches stubbed (interpreter)")
    return ap.parse_args(argv)


def shapes_of(args):
    if args.shapes:
        return [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    return QUICK if args.quick else SHAPES


def variants_of(args):
    names = [v for v in args.variants.split(",") if v]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"ab_topk: unknown variants {sorted(unknown)}; expected some of {VARIANTS}")
    return names


def variant(KT, name, R, N, k):
    """A context in which _topk_engine takes variant name's path."""
    import contextlib
    stack = contextlib.ExitStack()
    if name in FEW_DIGITS:
        stack.enter_context(KT.few_rows("on", FEW_DIGITS[name]))
        return stack
    stack.enter_context(KT.few_rows("off"))
    if name != "shipped":
        stack.enter_context(KT.topk_path("launches" if name == "launches" else "fused"))
    if name == "fused-2":
        stack.enter_context(KT.filter_tuning(ch=KT._filter_config(R, N, k).ch))
    return stack


def measure(torch, fn, rep):
    """(eager µs, graph µs, host µs per call, output) of fn, which must not synchronize."""
    from bench_indexer import bench, capture
    from bench_peers import host_us
    want = fn()
    torch.cuda.synchronize()
    eager = bench(fn, rep) * 1e6
    graph, got = capture(torch, fn)
    graph.replay()
    torch.cuda.synchronize()
    g_us = bench(graph.replay, rep) * 1e6 if torch.equal(got, want) else None
    return eager, g_us, host_us(torch, fn), want


def run_gpu(args) -> int:
    import torch
    if not torch.cuda.is_available():
        print("ab_topk: no CUDA GPU (use --host for the host-side measurement)", file=sys.stderr)
        return 2
    import triton
    from bench_indexer import topk_validity
    from bench_peers import topk_input
    from dsv4spec.kernels import device as D
    from dsv4spec.kernels import topk as KT
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  host=platform.node(), rep_ms=args.rep, rows=[])
    t0 = time.time()
    print(f"{'shape':>18} | {'variant':>8} | {'eager µs':>17} | {'graph µs':>17} | {'host µs':>8} | note", flush=True)
    for R, N, k in shapes_of(args):
        x, nv = topk_input(torch, R, N)
        row = dict(shape=f"{R}x{N}x{k}", R=R, N=N, k=k, variants={})
        names = [v for v in variants_of(args) if v != "fused-2" or N <= ONE_PROGRAM_ROW]
        outs = {}
        for rnd in range(2):
            for name in names:
                cell = row["variants"].setdefault(name, dict(eager_us=[], graph_us=[], host_us=[]))
                try:
                    with variant(KT, name, R, N, k):
                        fn = lambda: D.index_topk(x, nv, k, "position")   # noqa: E731
                        e, g, h, out = measure(torch, fn, args.rep)
                except Exception as err:  # noqa: BLE001 -- recorded, the run goes on
                    torch.cuda.synchronize()
                    cell["error"] = f"{type(err).__name__}: {err}"[:400]
                    print(f"{row['shape']:>18} | {name:>8} | error: {cell['error'][:120]}", flush=True)
                    continue
                cell["eager_us"].append(e)
                cell["graph_us"].append(g)
                cell["host_us"].append(h)
                outs.setdefault(name, out)
        ref = outs.get(names[0])
        for name, out in outs.items():
            cell = row["variants"][name]
            cell["validity"] = topk_validity(torch, x, nv, out, k, "position")
            cell["same_bits_as_ref"] = ref is not None and bool(torch.equal(out, ref))
            if name != names[0] and not cell["same_bits_as_ref"]:
                cell["dropped"] = f"output differs from {names[0]}'s"
        try:
            e, g, h, _ = measure(torch, lambda: torch.topk(x, k, dim=1, sorted=False).indices, args.rep)
            row["torch"] = dict(eager_us=e, graph_us=g, host_us=h)
        except Exception as err:  # noqa: BLE001
            row["torch"] = dict(error=f"{type(err).__name__}: {err}"[:400])
        for name, cell in row["variants"].items():
            if cell["eager_us"]:
                note = cell.get("dropped") or ("" if cell["validity"] == "valid" else cell["validity"])
                print(f"{row['shape']:>18} | {name:>8} | {pair(cell['eager_us']):>17} | "
                      f"{pair(cell['graph_us']):>17} | {min(cell['host_us']):8.1f} | {note}", flush=True)
        tc = row["torch"]
        if "eager_us" in tc:
            print(f"{row['shape']:>18} | {'torch':>8} | {tc['eager_us']:17.1f} | "
                  f"{fmt(tc['graph_us']):>17} | {tc['host_us']:8.1f} |", flush=True)
        result["rows"].append(row)
        result["seconds"] = time.time() - t0
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        del x, nv
        torch.cuda.empty_cache()
    summary(result, variants_of(args))
    return 0


def fmt(v):
    return "–" if v is None else f"{v:.1f}"


def pair(values):
    return " / ".join(fmt(v) for v in values)


def best(cell, column):
    vals = [v for v in cell.get(column, []) if v is not None]
    return min(vals) if vals and "dropped" not in cell else None


def summary(result, names):
    """One line a row and variant: against the first variant and torch, per column."""
    print("\nratios (best of the two medians; > 1: faster)", flush=True)
    ref = names[0]
    print(f"{'shape':>18} | {'variant':>8} | {'vs ' + ref + ' eager':>16} | {'graph':>6} | {'vs torch eager':>14} | "
          f"{'graph':>6}")
    for row in result["rows"]:
        v = row["variants"]
        for name in names:
            new = v.get(name, {})
            cells = []
            for column in ("eager_us", "graph_us"):
                a, b = best(v.get(ref, {}), column), best(new, column)
                cells.append(fmt(a / b) if a and b else "–")
            for column in ("eager_us", "graph_us"):
                t, b = row.get("torch", {}).get(column), best(new, column)
                cells.append(fmt(t / b) if t and b else "–")
            print(f"{row['shape']:>18} | {name:>8} | {cells[0]:>16} | {cells[1]:>6} | {cells[2]:>14} | {cells[3]:>6}")


def run_host(args) -> int:
    """Host µs per call of index_topk's Python path with every launch stubbed (no GPU: CPU tensors,
    never read), the launches and the torch operators one call makes."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from dsv4spec.kernels import device as D
    from dsv4spec.kernels import topk as KT
    launches = collections.Counter()
    kernel_type = type(KT._select_kernel)
    saved = kernel_type.__getitem__

    def stub(self, grid):
        return lambda *a, **kw: launches.update([self.fn.__name__])

    ops = collections.Counter()

    class CountOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    kernel_type.__getitem__ = stub
    try:
        for name in variants_of(args):
            for R, N, k in shapes_of(args):
                x = torch.empty_strided((R, N), (N, 1))
                nv = torch.zeros(R, dtype=torch.int32)
                with variant(KT, name, R, N, k):
                    fn = lambda: D.index_topk(x, nv, k, "position")   # noqa: E731
                    fn()
                    launches.clear()
                    ops.clear()
                    with CountOps():
                        fn()
                    counted = dict(launches), dict(ops)
                    best_us = min(per_call(fn) for _ in range(3))
                print(f"{name:>8} {R}x{N} k={k}: {best_us:6.1f} µs host a call (launches stubbed); "
                      f"launches {counted[0]}; torch ops {counted[1]}", flush=True)
    finally:
        kernel_type.__getitem__ = saved
    return 0


def per_call(fn, calls=2000):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_host(args) if args.host else run_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
