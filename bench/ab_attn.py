"""A/B of the sparse-attention kernel's launch paths on one CUDA GPU, in one process, same inputs.

Device command (≤ 200 s; pass --official DIR to time the official kernel too, not in this budget):

    export TRITON_INTERPRET=0; python -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1; timeout 160 python bench/ab_attn.py --out $OUT --rep 20; timeout 25 python -m pytest -q -p no:cacheprovider tests/test_kernels_attn.py -k compiles 2>&1 | tail -3

At V4.1's shapes (bench_attn.inputs: 64 heads of 512, 128 window entries with −1 while the ring
fills, then 512 compressed; decode T = 1, 32, 128 and prefill T = 1024) it times `old` (the serial
path, main's kernel unchanged: launch(path="serial") with its default blocks) and each variant of
the new paths (kernels/attn.launch keyword arguments, VARIANTS), eager (do_bench median, L2 flushed)
and replayed from a CUDA graph.  Each variant's output, written into a NaN-poisoned tensor, is
judged as bench_attn judges: the first tokens inside spec.attn's interval (the official rounding,
blocks of 64), every token within 2^-8·Σp|v| + one BF16 ulp of an fp32 recomputation; and
compared bit for bit with old's.  One table last: µs, vs copy (gathered KV bytes T·K·D·2 over the
graph time, against the measured copy rate), new/old (graph time; < 1 is faster), validity.
Writes ab_attn.json and ab_attn.md to --out.  Refuses (exit 2) without a GPU.

Predictions (written before the call; old's graph µs from docs/records/h200/2026-12-01-attn.md): T = 1
reads 0.66 MB (0.2 µs at the copy rate): latency-bound, old walks 10 blocks in series (33 µs);
split-K runs one block per program in two launches, so fused c1 ≈ 10-14 µs, the three-launch split
2-3 µs more.  T = 32 (old 44 µs): ≈ 15-20 µs.  T = 128 (old 103 µs): the partials cost
T·H·NC·D·4 bytes twice (c2: 84 MB each way), so only c5 (NC = 2) can win, ≈ 60-70 µs.  The wide
variants hold fewer re-gathers (2× instead of 4×) but spill at sm_90 (cuobjdump: stack 376-824
bytes), so no prediction better than ±30 %; prefill's serial dv256 scores twice: expected slower.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attn import copy_ceiling, inputs, official_kernel, reference_fp32  # noqa: E402
from bench_indexer import bench, bf16_ulp, replay_us  # noqa: E402

from dsv4spec.cmd_bench import cuda_torch  # noqa: E402

OLD = ("old", dict(path="serial"))
DECODE_VARIANTS = (
    ("split c1 dv128", dict(path="split", chunk=1, block_dv=128)),
    ("fused c1 dv128", dict(path="split_fused", chunk=1, block_dv=128)),
    ("fused c1 dv256", dict(path="split_fused", chunk=1, block_dv=256)),
    ("fused c2 dv128", dict(path="split_fused", chunk=2, block_dv=128)),
    ("fused c5 dv256 s64", dict(path="split_fused", chunk=5, block_dv=256, scores_block_h=64)),
    ("fused c1 h64 dv64 s64", dict(path="split_fused", chunk=1, block_h=64, block_dv=64, scores_block_h=64, warps=8)),
    ("fused c5 h32 dv128 s64", dict(path="split_fused", chunk=5, block_h=32, block_dv=128, scores_block_h=64)),
    ("fused c5 h64 dv64 s64", dict(path="split_fused", chunk=5, block_h=64, block_dv=64, scores_block_h=64, warps=8)),
    ("wide h32", dict(path="wide", block_h=32)),
)
PREFILL_VARIANTS = (
    ("serial dv256", dict(path="serial", block_dv=256)),
    ("serial stages3", dict(path="serial", stages=3)),
    ("serial w4", dict(path="serial", warps=4)),
    ("wide h32", dict(path="wide", block_h=32)),
    ("wide h64 dv128", dict(path="wide", block_h=64, block_dv=128)),
    ("fused c5 h64 dv64 s64", dict(path="split_fused", chunk=5, block_h=64, block_dv=64, scores_block_h=64, warps=8)),
    ("fused c10 h64 dv64 s64", dict(path="split_fused", chunk=10, block_h=64, block_dv=64, scores_block_h=64,
                                    warps=8)),
)
SHAPES = (("decode", 1, True), ("decode", 32, True), ("decode", 128, True), ("prefill", 1024, False))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for ab_attn.json and ab_attn.md")
    ap.add_argument("--rep", type=int, default=50, help="do_bench rep (ms)")
    ap.add_argument("--check-tokens", type=int, default=1, help="tokens per shape judged by spec.attn (float64)")
    ap.add_argument("--official", default=None, help="folder with the official kernel.py (needs tilelang)")
    ap.add_argument("--only", default=None, help="comma-separated variant names (old always runs)")
    return ap.parse_args(argv)


class Judge:
    """One shape's references, computed once: spec.attn's interval on the first tokens, the fp32
    recomputation and its bound on every token, and old's output."""

    def __init__(self, torch, q, kv, sink, idx, scale, n):
        from dsv4spec.spec import attn as spec
        self.torch, self.n = torch, min(n, q.shape[0])
        self.ref, magnitude = reference_fp32(torch, q, kv, sink, idx, scale)
        self.bound = 2.0 ** -8 * magnitude + bf16_ulp(torch, self.ref)
        self.lo, self.hi = spec.bounds(q[:self.n].float().cpu().numpy(), kv.float().cpu().numpy(),
                                       sink.cpu().numpy(), idx[:self.n].cpu().numpy(), scale, spec.V41_INIT)
        self.old = None

    def __call__(self, out) -> dict:
        from dsv4spec.spec import attn as spec
        torch = self.torch
        finite = bool(torch.isfinite(out).all())
        ulps = float(((out.float() - self.ref).abs() / self.bound).max())
        admitted = bool(spec.admitted(out[:self.n].float().cpu().numpy(), self.lo, self.hi).all())
        row = dict(valid=finite and admitted and ulps <= 1, finite=finite, spec_interval=admitted,
                   of_fp32_bound=ulps)
        if self.old is not None:
            row["differ_from_old"] = int((out != self.old).sum())
        return row


def time_variant(torch, KA, args, kw, rep, judge):
    q, kv, sink, idx, scale, init = args
    poisoned = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=q.device)
    out = KA.launch(q, kv, sink, idx, scale, init, out=poisoned, **kw)
    torch.cuda.synchronize()
    row = judge(out)
    fn = lambda: KA.launch(q, kv, sink, idx, scale, init, **kw)      # noqa: E731
    again = fn()
    torch.cuda.synchronize()
    row["deterministic"] = bool(torch.equal(again, out))
    row["eager_us"] = bench(fn, rep) * 1e6
    row["graph_us"] = replay_us(torch, fn, rep, want=out)              # None: a replay differed
    return row, out


def run_shape(torch, KA, case, tokens, decode, variants, a, copy, official):
    from dsv4spec.spec import attn as spec
    q, kv, sink, idx, m = inputs(torch, tokens, decode, seed=tokens, v4_order=official is not None)
    scale = spec.softmax_scale(m)
    args = (q, kv, sink, idx, scale, spec.V41_INIT)
    judge = Judge(torch, q, kv, sink, idx, scale, a.check_tokens)
    gathered = idx.numel() * kv.shape[1] * 2
    rows = []
    for name, kw in (OLD,) + variants:
        try:
            row, out = time_variant(torch, KA, args, kw, a.rep, judge)
        except Exception as e:  # noqa: BLE001 -- report and go on with the other variants
            row, out = dict(valid=False, error=f"{type(e).__name__}: {e}"[:300]), None
        if name == "old":
            judge.old = out
        seconds = (row.get("graph_us") or row.get("eager_us") or float("nan")) * 1e-6
        row.update(case=case, tokens=tokens, variant=name, kwargs=kw, gathered_MB=gathered / 1e6,
                   vs_copy=gathered / seconds / 1e12 / copy)
        rows.append(row)
        print(f"{case} {tokens} {name}: graph {row.get('graph_us')} eager {row.get('eager_us')} valid "
              f"{row.get('valid')} {row.get('error', '')}", flush=True)
    old = rows[0]
    for r in rows:
        for key in ("graph_us", "eager_us"):
            if r.get(key) and old.get(key):
                r[f"new_over_old_{key[:-3]}"] = r[key] / old[key]
    if official is not None:
        try:
            run = lambda: official(q[None], kv[None], sink, idx[None], scale)   # noqa: E731
            run()
            rows[0]["official_us"] = bench(run, a.rep) * 1e6
        except Exception as e:  # noqa: BLE001
            rows[0]["official_error"] = f"{type(e).__name__}: {e}"[:200]
    return rows


def markdown(result) -> str:
    lines = [f"# ab_attn — {result['gpu']}", "", f"copy {result['copy_TBps']:.2f} TB/s; torch {result['torch']}, "
             f"triton {result['triton']}; {result['seconds']:.0f} s", "",
             "| case | T | variant | eager µs | graph µs | vs copy | new/old graph | new/old eager | valid | "
             "bits ≠ old | fp32 bound | official µs |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def f(key, fmt="{:.1f}"):
            v = r.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"
        valid = ("valid" if r.get("valid") else "INVALID") + ("" if r.get("deterministic", True) else " nondet") + (
            f" {r['error']}" if "error" in r else "")
        lines.append(f"| {r['case']} | {r['tokens']} | {r['variant']} | {f('eager_us')} | {f('graph_us')} | "
                     f"{f('vs_copy', '{:.0%}')} | {f('new_over_old_graph', '{:.2f}')} | "
                     f"{f('new_over_old_eager', '{:.2f}')} | {valid} | {f('differ_from_old', '{:d}')} | "
                     f"{f('of_fp32_bound', '{:.2f}')} | {f('official_us')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    a = parse_args(argv)
    torch = cuda_torch("ab_attn")
    if torch is None:
        return 2
    from dsv4spec.kernels import attn as KA
    t0 = time.time()
    copy = copy_ceiling(torch, a.rep)
    print(f"copy ceiling: {copy:.2f} TB/s", flush=True)
    official = official_kernel(a.official) if a.official and os.path.isdir(a.official) else None
    only = set(a.only.split(",")) if a.only else None
    rows = []
    for case, tokens, decode in SHAPES:
        variants = tuple(v for v in (DECODE_VARIANTS if decode else PREFILL_VARIANTS) if only is None or v[0] in only)
        rows += run_shape(torch, KA, case, tokens, decode, variants, a, copy, official)
        torch.cuda.empty_cache()
        result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                      triton=__import__("triton").__version__, copy_TBps=copy, rows=rows, seconds=time.time() - t0)
        md = markdown(result)
        if a.out:                          # after every shape: a run cut off still leaves its rows
            os.makedirs(a.out, exist_ok=True)
            for name, text in (("ab_attn.json", json.dumps(result, indent=1, default=str)), ("ab_attn.md", md)):
                with open(os.path.join(a.out, name), "w") as f:
                    f.write(text)
    print(md)
    return 0 if all(r.get("valid") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
