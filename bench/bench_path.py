"""Benchmark of the fused RoPE-then-quantize kernel (kernels/path.py) on one CUDA GPU.

In one run: the device-to-device copy bandwidth (the ceiling), the fused kernel's effective
bandwidth (bf16 entries and the fp32 (cos, sin) table read, payload and scales written, over the
do_bench median) for the index K (FP4 E8M0/32, [tokens, 128]), the V4.1 main KV (FP4 E4M3/16,
[tokens, 512]) and the V4.1 window (FP8 E8M0/32, [tokens, 512]); the unfused baseline (impl's
torch rotation, then the quant family's kernel); the ratios fused/copy and fused/unfused; and a
bit-exactness check of the fused bytes against impl on a slice.  Writes bench_path.json and
bench_path.md to --out.  Refuses (exit 2) when no GPU is present.

    python bench/bench_path.py --out out/
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from dsv4spec.cmd_bench import cuda_torch

CASES = {"fp4_e8m0": (128, "index K"), "fp4_e4m3": (512, "V4.1 main KV"), "fp8_e8m0_32": (512, "V4.1 window")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for bench_path.json and bench_path.md")
    ap.add_argument("--elements", type=int, default=1 << 27, help="elements per input (default 128M bf16)")
    ap.add_argument("--copy-gib", type=float, default=2.0, help="buffer size of the copy ceiling")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--check-tokens", type=int, default=4096, help="leading tokens checked against impl")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch = cuda_torch("bench_path")
    if torch is None:
        return 2
    import triton
    from triton.testing import do_bench

    from dsv4spec import impl
    from dsv4spec.impl.rope import rope_table
    from dsv4spec.kernels import path as K
    from dsv4spec.kernels import quant as KQ

    def bench(fn):
        return do_bench(fn, warmup=25, rep=args.rep, return_mode="median") * 1e-3

    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    nbytes = int(args.copy_gib * (1 << 30))
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    copy_bw = 2 * nbytes / bench(lambda: dst.copy_(src))
    result["copy_GBps"] = copy_bw / 1e9
    del src, dst
    print(f"copy: {copy_bw / 1e9:.0f} GB/s")

    g = torch.Generator(device="cuda").manual_seed(0)
    freqs = impl.rope_freqs("v4.1-flash", 20)
    for fmt, (dim, what) in CASES.items():
        tokens = args.elements // dim
        x = (torch.randn(tokens, dim, device="cuda", generator=g) *
             torch.exp2(torch.randint(-8, 8, (tokens, dim // 16), device="cuda", generator=g).float())
             .repeat_interleave(16, 1)).to(torch.bfloat16)
        positions = torch.randint(0, 1 << 20, (tokens,), device="cuda", generator=g)
        cos, sin = rope_table(positions.cpu(), freqs)
        cos, sin = cos.cuda(), sin.cuda()
        fused = lambda: K.rope_quantize_device(x, cos, sin, fmt)          # noqa: E731
        quantize = {"fp4_e8m0": lambda y: KQ.fp4_quantize_device(y, False),
                    "fp4_e4m3": lambda y: KQ.fp4_quantize_device(y, True),
                    "fp8_e8m0_32": lambda y: KQ.fp8_quantize_device(y, 32)}[fmt]
        unfused = lambda: quantize(impl.rope_rotate(x.float(), positions, freqs.cuda()))   # noqa: E731
        payload, scales = fused()
        moved = x.numel() * 2 + cos.numel() * 8 + payload.numel() + scales.numel()
        t_fused, t_unfused = bench(fused), bench(unfused)
        n = min(args.check_tokens, tokens)
        want = impl.rope_quantize(x[:n].float().cpu(), positions[:n].cpu(), freqs, fmt)
        mismatches = sum(int((a[:n].cpu() != b).sum()) for a, b in zip((payload, scales), want))
        row = {"fmt": fmt, "what": what, "shape": [tokens, dim], "bytes": moved, "fused_us": t_fused * 1e6,
               "fused_over_copy": moved / t_fused / copy_bw, "unfused_us": t_unfused * 1e6,
               "fused_over_unfused": t_unfused / t_fused, "checked_tokens": n, "mismatches": mismatches}
        result["rows"].append(row)
        print(f"{fmt:12s} {what:13s} {t_fused * 1e6:9.1f} us {row['fused_over_copy']:6.1%} of copy "
              f"{row['fused_over_unfused']:6.1f}x unfused  mismatches {mismatches}")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_path.json"), "w") as f:
            json.dump(result, f, indent=2)
        lines = [f"# bench_path on {result['device']} ({result['date']}), copy {result['copy_GBps']:.0f} GB/s", "",
                 "| fmt | entry | fused / copy | fused / unfused | mismatches |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['fmt']} | {r['what']} {r['shape'][0]}×{r['shape'][1]} | {r['fused_over_copy']:.1%} | "
                  f"{r['fused_over_unfused']:.1f}× | {r['mismatches']} |" for r in result["rows"]]
        with open(os.path.join(args.out, "bench_path.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if any(r["mismatches"] for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
