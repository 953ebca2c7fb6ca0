"""The kernels against their peers on one CUDA GPU, in one run: every row eager and in a CUDA graph.

Rows (issue 23, ../shared/reference/performance.md §10):

- codecs on BF16 [1M, 128] (--quick: [64K, 128]): dsv4spec.kernels.device's fp4_e8m0_quantize and
  fp8_quantize /32 /64 /128 against the official TileLang fp4_act_quant(x, 32) and
  act_quant(x, b, "ue8m0", float8_e8m0fnu) of your own copy of inference/kernel.py (--official;
  bits compared on every element, payload and scales; fp4_e4m3_quantize against
  fp4_act_quant(x, 16, scale_dtype=float8_e4m3fn) where the file has it, as V4.1's does), and
  against plain torch (bench_quant's baselines, a timing reference);
- row top-k, position order, on BF16-valued fp32 scores: device.index_topk against torch.topk
  (sorted=False) and FlagGems' DSA top-k bucket_sort_topk (--flaggems, the folder it was
  installed into; run in child processes, bench/peer_flaggems.py, since it can fault and poison
  the CUDA context; every pick set judged against torch.topk's score multiset); ours also called
  eagerly through dsv4spec.kernels.graph_backed (the first call captures a CUDA graph, later calls
  replay it and clone its output), checked bit for bit and timed (graph_backed_us);
- ops: the torch.library operators (dsv4spec.kernels.ops) against the direct device calls on small
  inputs, where the dispatcher's host cost shows (device time and host µs per call).

Every call is timed eagerly (as a user calls it: the device API never reads back) and replayed
from a CUDA graph (device time), each with triton.testing.do_bench's median.  A row's ratios: the
best peer's time over ours, per column.  A peer that is absent (no --official, TileLang missing,
no --flaggems) costs its cells, with one line saying why.  Writes bench_peers.json and
bench_peers.md to --out.  Refuses (exit 2) without a GPU.

    python bench/bench_peers.py --out out/ --official .official/kernel.py --flaggems $SITE/fgsite
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

OFFICIAL_ENV = "DSV4SPEC_OFFICIAL_KERNEL"
FLAGGEMS_ENV = "DSV4SPEC_FLAGGEMS"
BUDGET_ENV = "DSV4SPEC_FLAGGEMS_S"
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_flaggems.py")
TOPK_SHAPES = [(1, 1 << 16, 2048), (1, 1 << 20, 512), (1, 1 << 20, 2048), (64, 1 << 18, 2048),
               (64, 1 << 20, 2048), (1024, 1 << 16, 2048), (1024, 1 << 15, 512)]
TOPK_QUICK = [(1, 1 << 16, 2048), (16, 1 << 18, 2048)]
CODECS = [("fp4_e8m0_quantize", 32), ("fp4_e4m3_quantize", 16), ("fp8_quantize", 32), ("fp8_quantize", 64),
          ("fp8_quantize", 128)]
SECTIONS = ("topk", "ops", "codecs")      # in the order they run (TileLang compiles last)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for bench_peers.json and bench_peers.md")
    ap.add_argument("--rep", type=int, default=50, help="do_bench repetition time per timing (ms; default 50)")
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run, not the goals)")
    ap.add_argument("--only", default="", help=f"comma list among {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--official", default=os.environ.get(OFFICIAL_ENV) or None, metavar="PATH",
                    help=f"your copy of the official inference/kernel.py, or its folder (needs TileLang; "
                         f"default ${OFFICIAL_ENV})")
    ap.add_argument("--flaggems", default=os.environ.get(FLAGGEMS_ENV) or None, metavar="DIR",
                    help=f"the folder FlagGems was installed into with pip --target (default ${FLAGGEMS_ENV})")
    ap.add_argument("--flaggems-budget", type=float, default=float(os.environ.get(BUDGET_ENV, 60)), metavar="S",
                    help=f"seconds for all FlagGems child processes together (default ${BUDGET_ENV} or 60)")
    ap.add_argument("--skip-torch", action="store_true", help="skip the torch peer")
    ap.add_argument("--topk-shapes", default=None, metavar="RxNxK,...",
                    help="the top-k rows' shapes (default: " + ",".join(map(shape_name, TOPK_SHAPES)) + ")")
    args = ap.parse_args(argv)
    try:
        args.topk_shapes = args.topk_shapes and parse_shapes(args.topk_shapes)
    except ValueError as e:
        ap.error(f"--topk-shapes: {e}")
    unknown = set(filter(None, args.only.split(","))) - set(SECTIONS)
    if unknown:
        ap.error(f"--only: unknown section(s) {','.join(sorted(unknown))}; expected among {','.join(SECTIONS)}")
    return args


# ----------------------------------------------------------------------------------------------
# timing: eager and replayed from a CUDA graph
# ----------------------------------------------------------------------------------------------
def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def same_outputs(a, b) -> bool:
    """Outputs equal bit for bit (one-byte encodings compared as bytes)."""
    a, b = _flat(a), _flat(b)
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and
                                    bool(_comparable(x).equal(_comparable(y))) for x, y in zip(a, b))


def _comparable(t):
    import torch
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype not in (torch.uint8, torch.int8, torch.bool) else t


def eager_and_graph(torch, fn, rep, device="cuda", ours=True):
    """(eager µs, graph µs or None, why no graph time or None).  Ours must replay the eager bits (else
    no graph time); a peer whose replay differs keeps its time, with a note.  On the CPU (tests): a
    clock, no graph."""
    if device != "cuda":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, None, "no CUDA graph on the CPU"
    from bench_indexer import bench, capture
    want = fn()
    torch.cuda.synchronize()
    eager = bench(fn, rep) * 1e6
    try:
        graph, got = capture(torch, fn)
        graph.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 -- a call that cannot be captured has no graph time
        torch.cuda.synchronize()
        return eager, None, f"not capturable: {type(e).__name__}: {e}"[:200]
    note = None if same_outputs(got, want) else "the graph replay's output differs from the eager call's"
    if note and ours:
        return eager, None, note
    return eager, bench(graph.replay, rep) * 1e6, note


def graph_backed(torch, fn, rep, want, device="cuda"):
    """µs of fn called eagerly through dsv4spec.kernels.graph_backed (bench_indexer.graph_backed_us);
    None on the CPU (no CUDA graph there)."""
    if device != "cuda":
        return None
    from bench_indexer import graph_backed_us
    return graph_backed_us(torch, fn, rep, want)


def timed(torch, fn, rep, device="cuda", ours=False) -> dict:
    eager, graph, note = eager_and_graph(torch, fn, rep, device, ours)
    return dict(eager_us=eager, graph_us=graph, **({"note": note} if note else {}))


# ----------------------------------------------------------------------------------------------
# the official kernel file
# ----------------------------------------------------------------------------------------------
def official_module(path):
    """(the kernel.py module, None) or (None, the one-line reason it is absent)."""
    if not path:
        return None, f"no --official PATH (or ${OFFICIAL_ENV}): your copy of the official inference/kernel.py"
    if os.path.isdir(path):
        path = os.path.join(path, "kernel.py")
    from dsv4spec import official_kernels as OK
    try:
        return OK.load(OK.kernel_file(f"{OK.NAME}:{path}")).kernel, None
    except OK.KernelUnavailable as e:
        return None, str(e)


# ----------------------------------------------------------------------------------------------
# codecs
# ----------------------------------------------------------------------------------------------
def official_codec(torch, module, op, block):
    """A closure calling the official kernel for (op, block), or None where the file has no such call."""
    import inspect
    e8m0 = torch.float8_e8m0fnu
    if op == "fp8_quantize":
        return lambda x: module.act_quant(x, block, "ue8m0", e8m0)
    if op == "fp4_e8m0_quantize":
        return lambda x: module.fp4_act_quant(x, block)
    if "scale_dtype" in inspect.signature(module.fp4_act_quant).parameters:     # V4.1's kernel.py
        return lambda x: module.fp4_act_quant(x, block, scale_dtype=torch.float8_e4m3fn)
    return None


def as_bytes_all(out):
    from dsv4spec.adapters import as_bytes
    return [as_bytes(t) for t in _flat(out)]


def mismatches(torch, ours, theirs) -> list[int]:
    """Differing bytes per output (payload, scales); -1 where the shapes differ."""
    return [int((a != b).sum()) if a.shape == b.shape else -1
            for a, b in zip(as_bytes_all(ours), as_bytes_all(theirs))]


def run_codecs(torch, D, official, why_not, rep, tokens, copy_TBps, skip_torch, device="cuda"):
    from bench_quant import make_input, torch_baselines

    from dsv4spec.cmd_bench import _count
    x = make_input(torch, (tokens, 128), torch.bfloat16, seed=7, device=device)
    baselines = {} if skip_torch else torch_baselines(torch, device)
    rows = []
    for op, block in CODECS:
        ours = (lambda: getattr(D, op)(x)) if op.startswith("fp4") else (lambda: D.fp8_quantize(x, block))
        mine = ours()
        out_bytes = sum(t.numel() for t in as_bytes_all(mine))
        moved = x.numel() * 2 + out_bytes
        row = dict(case=f"{op} /{block} bf16 {_count(tokens)}x128", kind="codec",
                   bytes=moved, ours=timed(torch, ours, rep, device, ours=True), peers={})
        if not skip_torch:
            base = baselines[op]
            row["peers"]["torch"] = timed(torch, (lambda: base(x, block)) if op == "fp8_quantize" else (lambda: base(x)),
                                          rep, device)
        row["vs_copy"] = moved / (row["ours"]["graph_us"] or row["ours"]["eager_us"]) / 1e6 / copy_TBps
        call = official_codec(torch, official, op, block) if official is not None else None
        if call is None:
            reason = why_not or "this kernel.py has no such call (its fp4_act_quant takes no scale_dtype: V4's file)"
            row["peers"]["official"] = dict(skipped=reason)
            row["validity"] = "bits not compared: official absent"
        else:
            differ = mismatches(torch, mine, call(x))
            row["peers"]["official"] = dict(timed(torch, lambda: call(x), rep, device), differing=differ)
            row["validity"] = ("bit-exact against official" if differ == [0, 0] else
                               f"INVALID: {differ[0]} payload / {differ[1]} scale bytes differ from official")
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# top-k
# ----------------------------------------------------------------------------------------------
def topk_input(torch, rows, n, seed=0, device="cuda"):
    """BF16-valued fp32 scores [rows, n] (seeded) and every row fully visible."""
    g = torch.Generator(device=device).manual_seed(seed + rows * 7 + n)
    x = torch.randn(rows, n, device=device, generator=g).bfloat16().float()
    return x, torch.full((rows,), n, dtype=torch.int32, device=device)


def shape_name(shape) -> str:
    return "x".join(map(str, shape))


def parse_shapes(text: str) -> list:
    """'1x65536x2048,1x1048576x512' -> [(1, 65536, 2048), (1, 1048576, 512)] (rows x positions x k)."""
    shapes = []
    for item in filter(None, text.split(",")):
        parts = item.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts) or int(parts[2]) > int(parts[1]):
            raise ValueError(f"{item!r} is not RxNxK (positive rows, positions, k <= positions)")
        shapes.append(tuple(map(int, parts)))
    return shapes


def run_flaggems(site, shapes, rep, budget_s, device="cuda", seed=0, python=sys.executable) -> dict:
    """{RxNxK: the child's line} for every shape: timings and validity, or error / skipped.  One
    child process runs the shapes in turn; when it dies (a fault, a CUDA error that poisons its
    context, a signal) the shape it was on is recorded as such and a new child takes the rest,
    until budget_s seconds are spent."""
    results, pending = {}, [shape_name(s) for s in shapes]
    if not site:
        return {s: dict(skipped=f"no --flaggems DIR (or ${FLAGGEMS_ENV}): the folder FlagGems was installed into")
                for s in pending}
    deadline = time.monotonic() + budget_s
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])))
    while pending:
        left = deadline - time.monotonic()
        if left <= 1:
            results.update({s: dict(skipped=f"the FlagGems budget ({budget_s:.0f} s) was spent") for s in pending})
            break
        argv = [python, CHILD, "--site", site, "--shapes", ",".join(pending), "--rep", str(rep),
                "--seed", str(seed), "--device", device]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=left, env=env)
            out, err, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            out, err, code = _text(e.stdout), _text(e.stderr), None
        for line in out.splitlines():
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict) and got.get("shape") in pending:
                results[got.pop("shape")] = got
        finished = [s for s in pending if s in results]
        pending = [s for s in pending if s not in results]
        if code == 0 or not pending:
            results.update({s: dict(error="the child process ended without a result") for s in pending})
            break
        last = (err.strip().splitlines() or [""])[-1][:300]
        if code == 3:                     # FlagGems absent: no shape can run
            results.update({s: dict(skipped=last) for s in pending})
            break
        if code is None:
            why = f"timed out (budget {budget_s:.0f} s) in the child process"
        elif code < 0:
            why = f"the child process died of {_signal_name(-code)}" + (f": {last}" if last else "")
        elif finished and "error" in results[finished[-1]]:
            continue                     # it reported its error, then left: the others get a new child
        else:
            why = f"the child process exited {code}" + (f": {last}" if last else "")
        results[pending.pop(0)] = dict(error=why)
    return results


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def run_topk(torch, D, flaggems, rep, shapes, copy_TBps, skip_torch, budget_s, device="cuda"):
    from bench_indexer import topk_validity
    rows = []
    for R, N, k in shapes:
        x, nv = topk_input(torch, R, N, device=device)
        ours = lambda: D.index_topk(x, nv, k, "position")   # noqa: E731
        want = ours()
        row = dict(case=f"top-k {R}x{N} k={k} (position), device API", kind="topk", shape=shape_name((R, N, k)),
                   bytes=R * N * 4, validity=topk_validity(torch, x, nv, want, k, "position"),
                   ours=dict(timed(torch, ours, rep, device, ours=True),
                             graph_backed_us=graph_backed(torch, ours, rep, want, device)), peers={})
        if device == "cuda" and row["ours"]["graph_backed_us"] is None:
            row["validity"] = "INVALID graph-backed call (its outputs differ or it did not replay); " + row["validity"]
        if not skip_torch:
            row["peers"]["torch"] = timed(torch, lambda: torch.topk(x, k, dim=1, sorted=False), rep, device)
        row["vs_copy"] = row["bytes"] / (row["ours"]["graph_us"] or row["ours"]["eager_us"]) / 1e6 / copy_TBps
        rows.append(row)
        del x, nv
        if device == "cuda":
            torch.cuda.empty_cache()
    theirs = run_flaggems(flaggems, shapes, rep, budget_s, device)
    for row in rows:
        got = theirs[row["shape"]]
        if got.get("validity", "valid").startswith("valid") or "eager_us" not in got:
            row["peers"]["flaggems"] = got
        else:                             # a wrong answer has no time
            row["peers"]["flaggems"] = dict(error=f"INVALID picks ({got['validity']}); its time is not a peer's")
    return rows


# ----------------------------------------------------------------------------------------------
# the torch.library operators against the direct calls
# ----------------------------------------------------------------------------------------------
def host_us(torch, fn, calls=200, device="cuda") -> float:
    """Host µs per call of fn over `calls` calls in a row (what a launch-bound caller pays)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def ops_calls(torch, D, device="cuda", small=False):
    """(name, direct call, operator call) on small inputs, where the host's cost shows."""
    ops = torch.ops.dsv4spec
    x = torch.randn(16, 128, device=device).bfloat16()
    n = 4096 if small else 1 << 16
    scores, nv = topk_input(torch, 1, n, device=device)
    lens = torch.full((1,), n, dtype=torch.int32, device=device)
    k = 16 if small else 2048
    return [("fp8_quantize /128 bf16 16x128", lambda: D.fp8_quantize(x, 128), lambda: ops.fp8_quantize(x, 128)),
            ("fp4_e8m0_quantize /32 bf16 16x128", lambda: D.fp4_e8m0_quantize(x), lambda: ops.fp4_e8m0_quantize(x)),
            (f"index_topk 1x{n} k={k}", lambda: D.index_topk(scores, nv, k, "position"),
             lambda: ops.index_topk(scores, nv, k, "position")),
            (f"candidate_list [1, {n}]", lambda: D.candidate_list(scores, lens, k, 8),
             lambda: ops.candidate_list(scores, lens, k, 8))]


def run_ops(torch, D, rep, device="cuda", small=False, calls=200):
    """The dispatcher's cost: each operator against its direct call, device time (do_bench, eager
    and graph) and host µs per call."""
    from dsv4spec.kernels import ops as _  # noqa: F401 -- registers torch.ops.dsv4spec
    rows = []
    for name, direct, op in ops_calls(torch, D, device, small):
        same = same_outputs(direct(), op())
        ours = dict(timed(torch, direct, rep, device, ours=True), host_us=host_us(torch, direct, calls, device))
        theirs = dict(timed(torch, op, rep, device), host_us=host_us(torch, op, calls, device))
        rows.append(dict(case=f"torch.library op vs direct call: {name}", kind="ops", ours=ours,
                         peers={"custom op": theirs},
                         host_overhead_us=theirs["host_us"] - ours["host_us"],
                         validity="same bits as the direct call" if same else "INVALID: the operator's bits differ"))
    return rows


# ----------------------------------------------------------------------------------------------
# the ratio to the best peer, per column
# ----------------------------------------------------------------------------------------------
def best_peer(row: dict, column: str):
    """(peer name, its µs, best peer µs / ours µs) in column 'eager' or 'graph'; Nones without one."""
    key = f"{column}_us"
    times = {name: p[key] for name, p in row["peers"].items() if p.get(key)}
    ours = row["ours"].get(key)
    if not times:
        return None, None, None
    name = min(times, key=times.get)
    return name, times[name], (times[name] / ours if ours else None)


def peer_cell(peer: dict) -> str:
    if "skipped" in peer:
        return "absent"
    if "error" in peer:
        return "FAILED"
    return " / ".join("–" if peer.get(k) is None else f"{peer[k]:.1f}" for k in ("eager_us", "graph_us"))


def markdown(result) -> str:
    peers = sorted({name for r in result["rows"] for name in r["peers"]})
    lines = [f"# bench_peers on {result['gpu']}", "",
             f"copy {result['copy_TBps']:.2f} TB/s; torch {result['torch']}, Triton {result['triton']}; "
             "every cell eager / graph µs (do_bench median; graph = replays of a CUDA graph of the same call; "
             "graph-backed call: ours called eagerly through dsv4spec.kernels.graph_backed, a replay and a clone "
             "a call)", "",
             "| case | ours | ours, graph-backed call | " + " | ".join(peers) + " | × best eager | × best graph | checked |",
             "|---|---:|---:|" + "---:|" * len(peers) + "---:|---:|---|"]
    for r in result["rows"]:
        cells = [peer_cell(r["peers"][p]) if p in r["peers"] else "–" for p in peers]
        ratios = []
        for column in ("eager", "graph"):
            name, _, ratio = best_peer(r, column)
            ratios.append("–" if ratio is None else f"{ratio:.2f}× ({name})")
        backed = r["ours"].get("graph_backed_us")
        lines.append(f"| {r['case']} | {peer_cell(r['ours'])} | {'–' if backed is None else f'{backed:.1f}'} | "
                     + " | ".join(cells) + f" | {ratios[0]} | "
                     f"{ratios[1]} | {r['validity']} |")
    notes = sorted({f"{p}: {v.get('skipped') or v.get('error')}" for r in result["rows"]
                    for p, v in r["peers"].items() if "skipped" in v or "error" in v})
    if notes:
        lines += ["", "Peers without a time:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# where and how large main() runs (a test runs it on the CPU, small, by changing these)
DEVICE, CODEC_TOKENS, OPS_SMALL, OPS_CALLS = "cuda", {False: 1 << 20, True: 1 << 16}, False, 200


def run_section(torch, D, section, args, copy):
    if section == "topk":
        if not args.flaggems:
            print(f"bench_peers: FlagGems absent: no --flaggems DIR (or ${FLAGGEMS_ENV})", flush=True)
        shapes = args.topk_shapes or (TOPK_QUICK if args.quick else TOPK_SHAPES)
        return run_topk(torch, D, args.flaggems, args.rep, shapes, copy,
                        args.skip_torch, args.flaggems_budget, DEVICE)
    if section == "ops":
        return run_ops(torch, D, args.rep, DEVICE, OPS_SMALL, OPS_CALLS)
    official, why_not = official_module(args.official)
    if official is None:
        print(f"bench_peers: official kernels absent: {why_not}", flush=True)
    return run_codecs(torch, D, official, why_not, args.rep, CODEC_TOKENS[args.quick], copy, args.skip_torch, DEVICE)


def write(folder, result, md=None):
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "bench_peers.json"), "w") as f:
        f.write(json.dumps(result, indent=1))
    if md is not None:
        with open(os.path.join(folder, "bench_peers.md"), "w") as f:
            f.write(md)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dsv4spec.cmd_bench import cuda_torch
    torch = cuda_torch("bench_peers")
    if torch is None:
        return 2
    from bench_attn import copy_ceiling

    from dsv4spec.kernels import device as D
    only = set(filter(None, args.only.split(","))) or set(SECTIONS)
    t0 = time.time()
    copy = copy_ceiling(torch, args.rep)
    print(f"copy ceiling: {copy:.2f} TB/s", flush=True)
    rows = []
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=__import__("triton").__version__,
                  host=platform.node(), quick=args.quick, copy_TBps=copy, rows=rows)
    for section in SECTIONS:       # each section's rows printed and written as soon as it ends
        if section not in only:
            continue
        try:
            new = run_section(torch, D, section, args, copy)
        except Exception as e:  # noqa: BLE001 -- report and go on with the other section
            new = [dict(case=section, kind=section, ours={}, peers={}, validity=f"ERROR {type(e).__name__}: {e}"[:300])]
        for r in new:
            print(json.dumps(r), flush=True)
        rows += new
        result["seconds"] = time.time() - t0
        write(args.out, result)
    md = markdown(result)
    print(md)
    write(args.out, result, md)
    return 0 if all(r["validity"].startswith(("valid", "bit-exact", "bits not compared", "same bits", "–"))
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
