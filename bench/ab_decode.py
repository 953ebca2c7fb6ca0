"""A/B of the V4.1 decode step's launch plans on one CUDA GPU, in one process, same inputs.

Device command (about 3-5 minutes, most of it Triton compiling on a cold cache; --no-sweep saves
about half):

    export TRITON_INTERPRET=0; python -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1; timeout 360 python bench/ab_decode.py --out $OUT --rep 30 2>&1 | tee $OUT/ab_decode.log | tail -40; timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kernels_pool.py -k "row_topk or block_max or cuda_graph" 2>&1 | tail -3

The step (bench_indexer.decode_inputs: index heads 32, D 128, 1M tokens = 262144 compressed FP4
index K entries, four re-index layers): layer 20's FP4 scores, 2048 candidate blocks of 8 (the
newest forced in), their positions gathered once (<= 16384), then each re-index layer's BF16
scores over the pool and its top-512 in position order.  The layers run one after another, as a
model runs them (each re-index layer's q depends on the layer before it); nothing is batched
across layers.  Plans (PLANS):

    old       scores [1, S] -> block-max kernel -> top-k engine (5 launches) -> gather ->
              4 x (pool scores -> top-k engine, 5 launches): 32 launches
    fused_bm  the score kernel writes the 32768 block maxima itself (no [1, S] scores): 31
    row_topk  each re-index top-k in one program (kernels.pool._row_topk): 16
    new       both: 15 launches
    new_blocks new, and the block row's top-k by the chunked one-program kernel
              (DSV4SPEC_ROW_TOPK=2): 11 launches

Each plan is called eagerly (do_bench median, L2 flushed) and replayed from a CUDA graph, and its
picks (the blocks and the four layers' top-512) are compared bit for bit with old's and with the
read-back (sync=True) old step.  Beside them: torch's step (dequantize, einsum, topk; eager and
graph), the FP4 decode logits at T = 1 (S = 262144 H = 32, the step's; S = 1M H = 64, the issue's
row) with the score kernel's configurations swept (programs a row, keys a block, pipeline depth;
block maxima out or scores out), and the one-row top-k alone (engine against _row_topk).  Rates:
the FP4 K bytes over the time, against the copy rate measured in the same run.  Writes
ab_decode.json and ab_decode.md to --out; refuses (exit 2) without a GPU.  --cpu-smoke runs the
plans' bit comparisons at a small size in the Triton interpreter (no timing): the script's own
check before a device call.

Predictions (written before the call; the record: 206 µs graph / 1464 µs eager,
docs/records/h200/2026-12-01-profile-reindex-before.txt; per-kernel device µs there): old ≈ 200 / 1350
(two launches fewer than the record's code: the gather's zeroed count and the all-blocks fill).
fused_bm: −3 to −5 µs graph (the block-max launch, 1.7 µs, its gap, and 1 MB written and read
back), −40 µs eager.  row_topk: a re-index top-k engine call is ≈ 28 µs of device time at one row
(group max 1.5, threshold 7, filter 3.7, select 15, fallback 0.9) plus four launch gaps; one
program holding the 16384 scores in registers (128 a thread at 16 warps, ptxas: 16 bytes of
spill) runs four histograms and one prefix sum, ≈ 6-10 µs: −70 ± 15 µs graph, −16 launches
eager (≈ −600 µs).  new ≈ 120-130 µs graph, 600-750 µs eager: the goals (≤ 60 / ≤ 150) not met;
what remains is the candidate layer's block top-k engine (≈ 28 µs), its scores (≈ 20 µs), the
four pool scores (≈ 4 × 4 µs) and the host's launches (DECODE-STEP.md).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PLANS = ("old", "fused_bm", "row_topk", "new", "new_blocks")
LAUNCHES = {"old": 32, "fused_bm": 31, "row_topk": 16, "new": 15, "new_blocks": 11}
ROW_TOPK_MODE = {"old": "0", "fused_bm": "0", "row_topk": "1", "new": "1", "new_blocks": "2"}

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for ab_decode.json and ab_decode.md")
    ap.add_argument("--rep", type=int, default=30, help="do_bench rep (ms)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the score-kernel configuration sweep")
    ap.add_argument("--skip-torch", action="store_true", help="skip torch's step")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the plans' bit comparisons at S = 4096 in the Triton interpreter, no timing")
    return ap.parse_args(argv)


@contextlib.contextmanager
def row_topk(mode: str):
    """kernels.pool's switch: 0 the top-k engine everywhere, 1 the re-index rows in one program,
    2 the block row too (the chunked kernel)."""
    saved = os.environ.get("DSV4SPEC_ROW_TOPK")
    os.environ["DSV4SPEC_ROW_TOPK"] = mode
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DSV4SPEC_ROW_TOPK")
        else:
            os.environ["DSV4SPEC_ROW_TOPK"] = saved


def step_fn(torch, KI, KP, d, plan: str, sync: bool = False):
    """One decode step of plan on inputs d (bench_indexer.decode_inputs) -> closure -> (tops, blocks).
    The switch is read when the closure runs (so at capture for a graph)."""
    fused = plan in ("fused_bm", "new", "new_blocks")
    S, H, D = d["S"], d["H"], d["D"]
    nb = d.get("topk_blocks", 2048)
    scores = None if fused else torch.empty(1, S, device=d["vis"].device)

    def step():
        with row_topk(ROW_TOPK_MODE[plan]):
            if fused:
                blocks = KP._candidate_list_of_keys(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["vis"], nb, 8,
                                                    sync=sync)
            else:
                KI._launch_scores(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["vis"], None, 1, S, H, D, scores,
                                  fp4=True, bf16=True)
                blocks = KP._candidate_list(scores, d["vis"], nb, 8, sync=sync)
            gathered = KP._gather_blocks(blocks, d["vis"], 8)
            return [KP._reindex_topk(q, k, d["w"], gathered, 512, sync=sync) for q, k in d["layers"]], blocks
    return step


def same_step(a, b) -> bool:
    return a[1].equal(b[1]) and len(a[0]) == len(b[0]) and all(x.equal(y) for x, y in zip(a[0], b[0]))


def cpu_smoke() -> int:
    """The plans at S = 4096 (512 blocks, 128 of them taken: a pool of 1024) in the interpreter,
    one-program rows up to 256 (so the chunked kernel runs in new_blocks): every plan's picks
    equal the read-back old step's."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from bench_indexer import decode_inputs
    from dsv4spec.kernels import indexer as KI
    from dsv4spec.kernels import pool as KP
    g = torch.Generator().manual_seed(6)
    d = decode_inputs(torch, 4096, g, H=8, D=64, device="cpu")
    d["layers"], d["topk_blocks"] = d["layers"][:2], 128
    want = step_fn(torch, KI, KP, d, "old", sync=True)()
    ok = True
    shipped, KP._ROW_TOPK_MAX = KP._ROW_TOPK_MAX, 256   # new_blocks: the chunked kernel on 512 blocks
    try:
        for plan in PLANS:
            got = step_fn(torch, KI, KP, d, plan)()
            same = same_step(got, want)
            ok &= same
            print(f"{plan:9s} same picks as the read-back old step: {same}", flush=True)
    finally:
        KP._ROW_TOPK_MAX = shipped
    print(f"blocks taken {int((want[1] >= 0).sum())}, picks a layer {[int((t >= 0).sum()) for t in want[0]]}")
    return 0 if ok else 1


def time_plans(torch, KI, KP, d, rep, bench, capture):
    from bench_indexer import in_blocks
    want = step_fn(torch, KI, KP, d, "old", sync=True)()
    valid = all(in_blocks(torch, t, want[1]) for t in want[0]) and int((want[1] >= 0).sum()) == 2048 \
        and all(bool((t >= 0).all()) for t in want[0])
    rows = []
    for plan in PLANS:
        fn = step_fn(torch, KI, KP, d, plan)
        try:
            eager = fn()
            graph, replayed = capture(torch, fn)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as e:   # a plan that does not compile or launch: say so, go on
            torch.cuda.synchronize()
            print(f"{plan}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            rows.append(dict(case="decode step V4.1 at 1M", plan=plan, error=str(e)[:200], eager_us=float("nan")))
            continue
        row = dict(case="decode step V4.1 at 1M", plan=plan, launches=LAUNCHES[plan],
                   same_as_read_back_old=same_step(eager, want) and same_step(replayed, want), valid=valid,
                   eager_us=bench(fn, rep) * 1e6, graph_us=bench(graph.replay, rep) * 1e6)
        rows.append(row)
        print(f"{plan:9s} eager {row['eager_us']:8.1f} us  graph {row['graph_us']:7.1f} us  "
              f"same {row['same_as_read_back_old']}", flush=True)
        del graph
    return rows


def torch_step(torch, d, rep, bench, capture):
    from bench_indexer import FP4_LUT, torch_fp4_scores
    lut = torch.tensor(FP4_LUT, device="cuda")
    qp, qs, kp, ks, w = (d[n] for n in ("qp", "qs", "kp", "ks", "w"))

    def naive():
        sc = torch_fp4_scores(torch, qp, qs, kp, ks, w, lut)
        blocks = torch.topk(sc.view(1, -1, 8).amax(-1), 2048, dim=1).indices
        pos = (blocks[:, :, None] * 8 + torch.arange(8, device="cuda")).flatten(1).sort(1).values
        picks = []
        for q, k in d["layers"]:
            s2 = (torch.relu(torch.einsum("thd,tpd->thp", q, k[pos])) * w[:, :, None]).sum(1)
            picks.append(pos.gather(1, torch.topk(s2, 512, dim=1).indices).sort(1).values)
        return picks
    row = dict(case="decode step V4.1 at 1M", plan="torch", eager_us=bench(naive, rep) * 1e6, graph_us=None)
    try:
        graph, _ = capture(torch, naive)
        row["graph_us"] = bench(graph.replay, rep) * 1e6
    except RuntimeError as e:
        row["graph_error"] = str(e)[:200]
        torch.cuda.synchronize()
    print(f"torch     eager {row['eager_us']:8.1f} us  graph {row['graph_us'] or float('nan'):7.1f} us", flush=True)
    return row


def logits_sweep(torch, KI, rep, copy, bench, capture, g, sweep):
    """T = 1 FP4 logits, scores out and block maxima out, at the shipped and (sweep) the other
    configurations of bench/ab_logits.py, the shipped variant only (ab_logits sweeps the rest);
    each row's output compared bit for bit with the shipped configuration's."""
    from ab_logits import CASES, CONFIGS, sweep as logits_rows
    rows, _ = logits_rows(torch, KI, rep, copy, bench, capture, g, budget=150, variants=("shipped",),
                          configs=CONFIGS if sweep else CONFIGS[:1], cases=CASES[:3])
    return [r for r in rows if "error" not in r]


def time_one(torch, case, name, fn, want, rep, bench, capture, warps=None):
    """One top-k call eager and from a graph (kernels.pool._ROW_TOPK_WARPS = warps meanwhile), its
    bits against want; None (after saying why) when it does not compile or launch."""
    from dsv4spec.kernels import pool as KP
    KP._ROW_TOPK_WARPS = warps
    try:
        got = fn()
        graph, _ = capture(torch, fn)
        row = dict(case=case, plan=name, same_as_engine=bool(torch.equal(got, want)),
                   eager_us=bench(fn, rep) * 1e6, graph_us=bench(graph.replay, rep) * 1e6)
    except Exception as e:
        torch.cuda.synchronize()
        print(f"{case}, {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return None
    finally:
        KP._ROW_TOPK_WARPS = None
    print(f"{case}, {name:18s} eager {row['eager_us']:7.1f} graph {row['graph_us']:6.1f} us "
          f"same {row['same_as_engine']}", flush=True)
    return row


def topk_alone(torch, KT, KP, rep, bench, capture, g):
    """One row: top-512 of a 16384-entry pool (remapped), and top-2048 of 32768 block maxima, by the
    engine (sync-free) and by _row_topk (at 8, 16 and 32 warps for the pool; chunked for the blocks)."""
    x = torch.randn(1, 16384, device="cuda", generator=g).bfloat16().float()
    count = torch.full((1,), 16384, dtype=torch.int32, device="cuda")
    idx = torch.arange(16384, device="cuda", dtype=torch.int32)[None] * 16
    pool = "top-512 of a 16384 pool, 1 row"
    want = KT._topk_engine(x, count, 512, remap=idx)
    rows = [time_one(torch, pool, "engine", lambda: KT._topk_engine(x, count, 512, remap=idx, sync=False), want,
                     rep, bench, capture)]
    for warps in (None, 8, 32):
        rows.append(time_one(torch, pool, f"row_topk {warps or 16} warps",
                             lambda: KP._row_topk(x, count, 512, remap=idx), want, rep, bench, capture, warps))
    bs = torch.randn(1, 32768, device="cuda", generator=g)
    nb = torch.full((1,), 32768, dtype=torch.int32, device="cuda")
    blocks = "top-2048 of 32768 block maxima, 1 row"
    want = KT._topk_engine(bs, nb, 2048, drop_neg_inf=True)
    rows.append(time_one(torch, blocks, "engine",
                         lambda: KT._topk_engine(bs, nb, 2048, drop_neg_inf=True, sync=False), want, rep, bench, capture))
    rows.append(time_one(torch, blocks, "row_topk chunked", lambda: KP._row_topk(bs, None, 2048, drop_neg_inf=True),
                         want, rep, bench, capture))
    return [r for r in rows if r is not None]


def markdown(result) -> str:
    lines = [f"# ab_decode on {result['device']}", "",
             f"copy {result['ceilings']['copy_TBps']:.2f} TB/s; torch {result['torch']}, Triton {result['triton']}.", "",
             "| case | plan / config | launches | eager µs | graph µs | bits |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        plan = r.get("plan") or f"{r.get('out')} {r.get('config')}"
        bits = r.get("same_as_read_back_old", r.get("same_as_shipped", r.get("same_as_engine", "")))
        g = r.get("graph_us")
        lines.append(f"| {r['case']} | {plan} | {r.get('launches', '')} | {r['eager_us']:.1f} | "
                     f"{'–' if g is None else f'{g:.1f}'} | {bits} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cpu_smoke:
        return cpu_smoke()
    from ab_common import record, result, start
    session = start("ab_decode", a.rep)
    if session is None:
        return 2
    torch, ceil, t0 = session
    from bench_indexer import bench, capture, decode_inputs
    from dsv4spec.kernels import indexer as KI
    from dsv4spec.kernels import pool as KP
    from dsv4spec.kernels import topk as KT
    g = torch.Generator(device="cuda").manual_seed(6)
    d = decode_inputs(torch, 1 << 18, g)
    rows = time_plans(torch, KI, KP, d, a.rep, bench, capture)
    if not a.skip_torch:
        rows.append(torch_step(torch, d, a.rep, bench, capture))
    del d
    torch.cuda.empty_cache()
    rows += topk_alone(torch, KT, KP, a.rep, bench, capture, g)
    rows += logits_sweep(torch, KI, a.rep, ceil["copy_TBps"], bench, capture, g, not a.no_sweep)
    res = result(torch, ceil, t0, rows=rows)
    record(a.out, "ab_decode", res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
