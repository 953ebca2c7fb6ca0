"""Benchmark of the attn-family Triton kernel (sparse attention) on one CUDA GPU.

In one run: the device-to-device copy ceiling, then at V4.1's shapes (64 heads of 512, lists of
128 window + 512 compressed entries, −1 while the window ring fills, the sink) for decode batches
of 1, 32 and 128 tokens and prefill chunks of 1024 and 4096 tokens:

- our kernel (kernels/attn.launch), eager and replayed from a CUDA graph;
- torch "gather + softmax": kv[idx] gathered, BF16 matmuls, the sink as an extra logit, softmax;
- where `--official DIR` holds the official inference/kernel.py and tilelang imports, the official
  sparse_attn on the same inputs (time and bit comparison).

The peers are timed eagerly and, where they can be captured, replayed from a CUDA graph too.

Ratios: torch / kernel (speed-up), official / kernel, and the kernel's rate of gathered KV bytes
(T·K·D·2 per call) against the copy ceiling (goal at decode: ≥ 60 %).  Validity: the first tokens
of each row against spec.attn's interval (the float64 definition and its tolerance), every token
within 2^-8·Σ p·|v| plus one BF16 ulp of torch's fp32
recomputation (the BF16 probabilities' bound).  Writes bench_attn.json and bench_attn.md to
--out.  Refuses (exit 2) without a GPU.

    python bench/bench_attn.py --out out/
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_indexer import bench, bf16_ulp, replay_us  # noqa: E402

from dsv4spec.cmd_bench import cuda_torch  # noqa: E402

DECODE = (1, 32, 128)
PREFILL = (1024, 4096)
POOL = 128 + 65536            # window ring + compressed entries of a 256K-token context at ratio 4


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for bench_attn.json and bench_attn.md")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--quick", action="store_true", help="decode 1 and 32, prefill 1024 only")
    ap.add_argument("--official", default=None,
                    help="the official inference/kernel.py, or its folder (needs tilelang), to time its sparse_attn")
    ap.add_argument("--skip-torch", action="store_true", help="skip the torch baseline")
    ap.add_argument("--check-tokens", type=int, default=2, help="tokens per row judged by spec.attn (float64)")
    return ap.parse_args(argv)


def copy_ceiling(torch, rep):
    x = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x), rep)
    return 2 * x.numel() / t / 1e12


def inputs(torch, tokens: int, decode: bool, seed: int = 0, v4_order: bool = False):
    """q [T, 64, 512], kv [POOL, 512] BF16, sink [64], indices [T, 640] int32: window entries
    (decode: the ring listed oldest first with 100 slots still empty, i.e. −1, as V4.1 lists it; with
    v4_order the −1 last, as V4 lists it, so that V4's official kernel, whose running max starts at
    −inf, sees a valid first block) then 512 compressed."""
    from dsv4spec.spec.models import profile
    m = profile("v4.1-flash")
    g = torch.Generator(device="cuda").manual_seed(seed)
    H, D, W, k = m.n_heads, m.head_dim, m.window, m.index_topk
    q = torch.randn(tokens, H, D, device="cuda", generator=g).bfloat16()
    kv = torch.randn(POOL, D, device="cuda", generator=g).bfloat16()
    sink = torch.randn(H, device="cuda", generator=g)
    ring = torch.arange(W, device="cuda").repeat(tokens, 1)
    if decode:
        empty = torch.arange(W, device="cuda") >= W - 100 if v4_order else torch.arange(W, device="cuda") < 100
        ring = torch.where(empty, -1, ring)
    compressed = W + torch.rand(tokens, POOL - W, device="cuda", generator=g).argsort(-1)[:, :k].sort(-1).values
    return q, kv, sink, torch.cat([ring, compressed], -1).int(), m


def torch_attention(torch, q, kv, sink, idx, scale):
    """Gather + softmax in torch: BF16 matmuls, the sink as a logit whose value row is 0."""
    valid = idx >= 0
    rows = kv[idx.clamp_min(0).long()]                                      # [T, K, D]
    s = torch.matmul(q, rows.transpose(1, 2)).float() * scale               # [T, H, K]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    s = torch.cat([s, sink[None, :, None].expand(s.shape[0], -1, 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    return torch.matmul(p.bfloat16(), rows)


def reference_fp32(torch, q, kv, sink, idx, scale):
    """The output in fp32 (unrounded probabilities) and its magnitude Σ_k p_k·|v_k|."""
    valid = idx >= 0
    rows = kv[idx.clamp_min(0).long()].float()
    s = torch.einsum("thd,tkd->thk", q.float(), rows) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    M = s.amax(-1, keepdim=True)
    e = torch.exp(s - M)
    denom = e.sum(-1, keepdim=True) + torch.exp(sink[None, :, None] - M)
    return torch.einsum("thk,tkd->thd", e, rows) / denom, torch.einsum("thk,tkd->thd", e, rows.abs()) / denom


def validity(torch, out, q, kv, sink, idx, scale, check_tokens):
    """Every token: |out − ref| within 2^-8·Σ p·|v| (BF16 probabilities are off by at most 2^-9 of
    each p, doubled for the exponentials) plus one BF16 ulp of ref (the output's rounding); the first
    tokens also inside spec.attn's interval."""
    from dsv4spec.spec import attn as spec
    ref, magnitude = reference_fp32(torch, q, kv, sink, idx, scale)
    ulps = float(((out.float() - ref).abs() / (2.0 ** -8 * magnitude + bf16_ulp(torch, ref))).max())
    n = min(check_tokens, q.shape[0])
    lo, hi = spec.bounds(q[:n].float().cpu().numpy(), kv.float().cpu().numpy(), sink.cpu().numpy(),
                         idx[:n].cpu().numpy(), scale, spec.V41_INIT)
    admitted = bool(spec.admitted(out[:n].float().cpu().numpy(), lo, hi).all())
    ok = admitted and ulps <= 1 and bool(torch.isfinite(out).all())
    return ("valid" if ok else "INVALID") + (f" (spec interval on {n} tokens: {admitted}; every token at "
                                             f"{ulps:.2f} of its bound against fp32)")


def official_kernel(path):
    """The official sparse_attn from PATH (kernel.py, or a folder holding it), or None when it or
    tilelang cannot be imported."""
    if not path:
        return None
    try:
        file = path if os.path.isfile(path) else os.path.join(path, "kernel.py")
        spec_ = importlib.util.spec_from_file_location("official_kernel", file)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        return module.sparse_attn
    except Exception as e:  # noqa: BLE001 -- optional: report and go on
        print(f"official kernel not available: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def graph_or_none(torch, fn, rep, want=None):
    """µs of fn replayed from a CUDA graph; None (after a line saying why) when it cannot be captured."""
    try:
        return replay_us(torch, fn, rep, want)
    except Exception as e:  # noqa: BLE001 -- a peer that cannot be captured has no graph time
        torch.cuda.synchronize()
        print(f"bench_attn: not captured in a CUDA graph: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def run_row(torch, KA, case, tokens, decode, rep, copy, skip_torch, official, check_tokens):
    from dsv4spec.spec import attn as spec
    q, kv, sink, idx, m = inputs(torch, tokens, decode, v4_order=official is not None)
    scale = spec.softmax_scale(m)
    fn = lambda: KA.launch(q, kv, sink, idx, scale, spec.V41_INIT)      # noqa: E731
    out = fn()
    torch.cuda.synchronize()
    t = bench(fn, rep)
    graph = replay_us(torch, fn, rep, want=out)
    seconds = (graph * 1e-6) if graph else t
    gathered = idx.numel() * kv.shape[1] * 2
    row = dict(case=case, tokens=tokens, heads=q.shape[1], head_dim=q.shape[2], entries=idx.shape[1],
               kernel_us=t * 1e6, graph_us=graph, gathered_MB=gathered / 1e6,
               TBps=gathered / seconds / 1e12, vs_copy=gathered / seconds / 1e12 / copy,
               validity=validity(torch, out, q, kv, sink, idx, scale, check_tokens))
    if not skip_torch:
        gather = lambda: torch_attention(torch, q, kv, sink, idx, scale)   # noqa: E731
        tt = bench(gather, rep)
        row.update(torch_us=tt * 1e6, speedup_vs_torch=tt / t, torch_graph_us=graph_or_none(torch, gather, rep))
    if official is not None:
        run = lambda: official(q[None], kv[None], sink, idx[None], scale)   # noqa: E731
        theirs = run()
        to = bench(run, rep)
        row.update(official_us=to * 1e6, speedup_vs_official=to / t,
                   official_graph_us=graph_or_none(torch, run, rep, theirs),
                   official_same_bits=bool(torch.equal(theirs[0], out)),
                   official_differing=int((theirs[0] != out).sum()),
                   official_max_ulps=float(((theirs[0].float() - out.float()).abs()
                                            / bf16_ulp(torch, out.float())).max()))
    return row


def markdown(result) -> str:
    lines = [f"# bench_attn — {result['gpu']}", "",
             f"copy ceiling {result['copy_TBps']:.2f} TB/s; torch {result['torch']}, triton {result['triton']}", "",
             "| case | T | kernel µs | graph µs | gathered MB | TB/s | vs copy | torch µs | × torch | "
             "official µs | × official | validity |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def f(key, fmt="{:.1f}"):
            v = r.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) else "—"
        lines.append(f"| {r['case']} | {r['tokens']} | {f('kernel_us')} | {f('graph_us')} | {f('gathered_MB', '{:.2f}')} "
                     f"| {f('TBps', '{:.2f}')} | {f('vs_copy', '{:.0%}')} | {f('torch_us')} | "
                     f"{f('speedup_vs_torch', '{:.2f}')} | {f('official_us')} | {f('speedup_vs_official', '{:.2f}')} "
                     f"| {r['validity']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    torch = cuda_torch("bench_attn")
    if torch is None:
        return 2
    from dsv4spec.kernels import attn as KA
    t0 = time.time()
    copy = copy_ceiling(torch, args.rep)
    print(f"copy ceiling: {copy:.2f} TB/s", flush=True)
    official = official_kernel(args.official)
    shapes = [("decode", T, True) for T in (DECODE[:2] if args.quick else DECODE)]
    shapes += [("prefill", T, False) for T in (PREFILL[:1] if args.quick else PREFILL)]
    rows = []
    for case, tokens, decode in shapes:
        try:
            row = run_row(torch, KA, case, tokens, decode, args.rep, copy, args.skip_torch, official,
                          args.check_tokens)
        except Exception as e:  # noqa: BLE001 -- report and go on with the other rows
            row = dict(case=case, tokens=tokens, kernel_us=float("nan"), validity=f"ERROR {type(e).__name__}: {e}"[:300])
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=__import__("triton").__version__,
                  host=platform.node(), quick=args.quick, copy_TBps=copy, rows=rows, seconds=time.time() - t0)
    md = markdown(result)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for name, text in (("bench_attn.json", json.dumps(result, indent=1)), ("bench_attn.md", md)):
            with open(os.path.join(args.out, name), "w") as f:
                f.write(text)
    return 0 if all(r["validity"].startswith("valid") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
