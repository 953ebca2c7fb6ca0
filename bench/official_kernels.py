"""The official kernels beside the suite's targets, on the same inputs, bit for bit where the rule is exact.

    python bench/official_kernels.py --kernel .official/kernel.py --out OUTDIR [--rows 2048]

Loads your copy of the official V4 kernel.py through the official-kernels target (dsv4spec.official_kernels)
and compares, operation by operation, its results with `official` (the control: the official computation
transcribed in torch, on the CPU), `kernels` (the Triton kernels) and spec/ (the exact definition):

    fp8_quantize  act_quant(x, b, "ue8m0", e8m0) for b = 32, 64, 128: payload and scale bytes
    fp4_e8m0_quantize  fp4_act_quant(x, 32): packed E2M1 and E8M0 bytes (and fp4_e4m3_quantize, per 16
                  with E4M3 scales, when the file is V4.1's)
    fp8_qdq       act_quant(..., inplace=True), block 64 (the V4 main and window KV): which rounding
                  the in-place branch makes (FP8, or BF16 as the initial V4 revision does, L55)
    fp8_linear    fp8_gemm of act_quant(x, 128) with a block-scaled E4M3 weight: the error against the
                  exact product of the dequantized operands, in BF16 ulps; bit for bit against the
                  targets that have the operation
    sparse_attention  sparse_attn against an fp32 emulation, and a row whose first 64 indices are −1

Inputs (BF16, seeded): rows at binades 2^-40 … 2^40, then edge rows (zeros, −0, E2M1 and E4M3 midpoints at
several scales, BF16 subnormals, 3e38).  Writes OUTDIR/compare.json and OUTDIR/compare.md.  Without a CUDA
GPU it says so in one line and exits 0 (--cpu runs it on the CPU, e.g. with a stand-in kernel.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

BLOCKS = (32, 64, 128)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", default=os.environ.get("DSV4SPEC_OFFICIAL_KERNEL", ".official/kernel.py"),
                   help="your copy of the official V4 inference/kernel.py (default: $DSV4SPEC_OFFICIAL_KERNEL "
                        "or .official/kernel.py)")
    p.add_argument("--out", required=True, help="folder for compare.json and compare.md")
    p.add_argument("--rows", type=int, default=2048, help="rows of 512 BF16 values per codec case (default 2048)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="run without a GPU (a stand-in kernel.py; the targets on the CPU)")
    return p.parse_args(argv)


def make_input(torch, rows: int, n: int, seed: int):
    """BF16 [rows + edge rows, n]: random rows, each at its own binade in 2^-40 … 2^40, then edge rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * torch.pow(2.0, torch.randint(-40, 41, (rows, 1), generator=g).float())
    mid_e2m1 = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])          # E2M1 midpoints and the max
    mid_e4m3 = torch.tensor([1.0625, 1.1875, 448.0, 416.0, 432.0, 2.0 ** -9 * 1.5, 2.0 ** -7, 240.0])
    edges = [torch.zeros(n), -torch.zeros(n), torch.full((n,), 2.0 ** -133), torch.full((n,), 3e38)]
    for scale in (1.0, 2.0 ** -20, 2.0 ** 20, 2.0 ** -126, 2.0 ** -130):
        edges.append((mid_e2m1.repeat(n // 8) * scale))
        edges.append((mid_e4m3.repeat(n // 8) * scale))
    return torch.cat([x, torch.stack(edges)]).to(torch.bfloat16)


def mismatches(torch, a, b) -> int:
    """Elements that differ bit for bit (bytes, or float values with NaN equal to NaN)."""
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape:
        return -1
    if a.dtype.is_floating_point:
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        same &= torch.signbit(a) == torch.signbit(b)
        return int((~same).sum())
    return int((a != b).sum())


def codec_rows(torch, np, targets, x, op, block=None):
    """One row per codec case: the mismatches of every target (and spec) against official-kernels."""
    from dsv4spec.spec import quant as S
    args = (x,) if block is None else (x, block)
    reference = targets["official-kernels"].op(op)(*args)
    xs = x.float().numpy()
    spec = {"fp8_quantize": lambda: S.fp8_quantize(xs, block), "fp4_e8m0_quantize": lambda: S.fp4_e8m0_quantize(xs),
            "fp4_e4m3_quantize": lambda: S.fp4_e4m3_quantize(xs)}[op]()
    row = {"op": op, "block": block or {"fp4_e4m3_quantize": 16}.get(op, 32), "elements": x.numel(), "against": {}}
    spec_t = tuple(torch.from_numpy(np.ascontiguousarray(s)) for s in spec)
    row["against"]["spec"] = [mismatches(torch, r, s) for r, s in zip(reference, spec_t)]
    for name, t in targets.items():
        if name != "official-kernels" and t.has(op):
            out = t.op(op)(*args)
            row["against"][name] = [mismatches(torch, r, o) for r, o in zip(reference, out)]
    return row


def qdq_row(torch, np, targets, x, block=64):
    from dsv4spec.spec import quant as S
    ok = targets["official-kernels"].op("fp8_qdq")(x, block).cpu()
    xs = x.float().numpy()
    out = {"op": "fp8_qdq", "block": block, "elements": x.numel(),
           "differs_from_x": mismatches(torch, ok, x.float().cpu()),
           "differs_from_spec_bf16_branch": mismatches(torch, ok, torch.from_numpy(
               S.fp8_qdq(xs, block, v4_fp8_inplace="bf16").astype(np.float32))),
           "differs_from_spec_fp8": mismatches(torch, ok, torch.from_numpy(S.fp8_qdq(xs, block).astype(np.float32)))}
    if targets["official"].has("fp8_qdq"):
        out["differs_from_official"] = mismatches(torch, ok, targets["official"].op("fp8_qdq")(x.cpu(), block))
    finite = torch.isfinite(x.float()).cpu()
    out["branch"] = ("bf16 (identity on BF16 input)" if out["differs_from_spec_bf16_branch"] == 0
                     else "fp8" if out["differs_from_spec_fp8"] == 0 else "neither")
    out["finite_elements"] = int(finite.sum())
    return out


def linear_row(torch, np, targets, seed, tokens=16, k=1024, n=2048):
    """fp8_gemm with 128×128 E8M0 block scales against the exact product of the dequantized operands."""
    from dsv4spec.spec import quant as S
    from dsv4spec.spec.formats import e4m3_decode
    from dsv4spec.spec.indexer import bf16_quantum, round_bf16
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(tokens, k, generator=g)).to(torch.bfloat16)
    w_values = torch.clamp(torch.randn(n, k, generator=g) * 50, -448, 448)
    w = w_values.to(torch.float8_e4m3fn).view(torch.uint8)                                  # a test weight
    w_scale = torch.randint(120, 124, (n // 128, k // 128), generator=g, dtype=torch.uint8)  # E8M0 bytes
    ok = targets["official-kernels"]
    if not ok.has("fp8_linear"):
        return {"op": "fp8_linear", "served": False}
    c = ok.op("fp8_linear")(x, w, w_scale, 128).cpu().double().numpy()
    xq, xsc = S.fp8_quantize(x.float().numpy(), 128)
    xd = S.fp8_dequantize(xq, xsc, 128).astype(np.float64)
    wd = (e4m3_decode(w.numpy()).astype(np.float64)
          * np.repeat(np.repeat(np.ldexp(1.0, w_scale.numpy().astype(np.int64) - 127), 128, 0), 128, 1))
    exact = xd @ wd.T
    # one BF16 rounding of the result plus fp32 accumulation in any order (K·2^-24·Σ|x||w|)
    bound = bf16_quantum(exact) + k * 2.0 ** -24 * (np.abs(xd) @ np.abs(wd).T)
    unquantized = x.double().numpy() @ wd.T
    row = {"op": "fp8_linear", "served": True, "shape": [tokens, k, n],
           "unit": "|c − exact| / (ulp_bf16(exact) + K·2^-24·Σ|x̂||ŵ|), exact = the product of the dequantized operands",
           "max_error_in_units": float((np.abs(c - exact) / bound).max()),
           "share_bit_equal_to_bf16_of_exact": float((c == round_bf16(exact)).mean()),
           "max_error_in_units_vs_bf16_matmul_of_unquantized_x": float((np.abs(c - unquantized) / bound).max()),
           "against": {}}
    for name, t in targets.items():
        if name != "official-kernels" and t.has("fp8_linear"):
            out = t.op("fp8_linear")(x, w, w_scale, 128)
            row["against"][name] = mismatches(torch, torch.from_numpy(c).float(), out.float())
    return row


def attention_row(torch, targets, seed, b=1, s=4, h=64, d=512, rows=4096, k=640):
    ok = targets["official-kernels"]
    if not ok.has("sparse_attention"):
        return {"op": "sparse_attention", "served": False}
    g = torch.Generator().manual_seed(seed + 2)
    q = (torch.randn(b, s, h, d, generator=g) * 0.1).to(torch.bfloat16)
    kv = (torch.randn(b, rows, d, generator=g) * 0.1).to(torch.bfloat16)
    sink = torch.randn(h, generator=g)
    idx = torch.randint(0, rows, (b, s, k), generator=g, dtype=torch.int32)
    idx[..., -100:] = -1
    o = ok.op("sparse_attention")(q, kv, sink, idx, d ** -0.5).cpu()
    rows_kv = kv.float()[0][idx[0].long().clamp(min=0)]                                # [s, k, d]
    scores = torch.einsum("shd,skd->shk", q[0].float(), rows_kv) * d ** -0.5
    scores = scores.masked_fill((idx[0] < 0)[:, None, :], float("-inf"))
    top = torch.maximum(scores.amax(-1, keepdim=True), sink[None, :, None])
    p = torch.exp(scores - top)
    p = p / (p.sum(-1, keepdim=True) + torch.exp(sink[None, :, None] - top))
    emulated = torch.einsum("shk,skd->shd", p, rows_kv)
    first_unfilled = idx.clone()
    first_unfilled[..., :64] = -1                           # a V4.1-ordered decode list before the ring fills
    o2 = ok.op("sparse_attention")(q, kv, sink, first_unfilled, d ** -0.5).cpu()
    return {"op": "sparse_attention", "served": True, "shape": [b, s, h, d, rows, k],
            "max_abs_vs_fp32_emulation": float((o[0] - emulated).abs().max()),
            "max_abs_output": float(emulated.abs().max()),
            "nan_rows_when_the_first_64_indices_are_minus_1": int(torch.isnan(o2).any(-1).sum()),
            "rows": b * s * h}


def markdown(result) -> str:
    lines = [f"# The official kernels against the suite's targets ({result['when']})", "",
             f"kernel.py: {result['kernel']} ({result['kernel_version']}); device {result['device']}; "
             f"torch {result['torch']}; TileLang {result['tilelang']}", "",
             "## Codecs: elements that differ from official-kernels (payload, scales)", "",
             "| op | block | elements | " + " | ".join(result["targets"]) + " |",
             "|---|---|---|" + "---|" * len(result["targets"])]
    for row in result["codecs"]:
        cells = [" / ".join(map(str, row["against"].get(t, ["n/i"]))) for t in result["targets"]]
        lines.append(f"| {row['op']} | {row['block']} | {row['elements']} | " + " | ".join(cells) + " |")
    q = result["qdq"]
    lines += ["", "## The in-place branch (fp8_qdq, block 64: the V4 main and window KV)", "",
              f"Rounding it makes: **{q['branch']}**.  Of {q['elements']} elements, {q['differs_from_x']} differ "
              f"from the input, {q['differs_from_spec_bf16_branch']} from spec's v4_fp8_inplace=bf16, "
              f"{q['differs_from_spec_fp8']} from spec's canonical FP8 rounding"
              + (f", {q['differs_from_official']} from the official control" if "differs_from_official" in q else "")
              + ".  The suite reports this on FP8.V4_INPLACE as VARIANT v4_fp8_inplace=bf16 (an allowed revision: "
              "the canonical value is the FP8 cast of the later V4 copies and V4.1); every other FP8 rule checks "
              "act_quant's non-in-place branch, which casts to E4M3.", ""]
    for row in (result["linear"], result["attention"]):
        lines += [f"## {row['op']}", "", "```", json.dumps(row, indent=1), "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "0")
    import numpy as np
    import torch
    if not args.cpu and not torch.cuda.is_available():
        print("official_kernels.py: needs a CUDA GPU (none present; --cpu runs a stand-in); nothing compared",
              file=sys.stderr)
        return 0
    from dsv4spec.runner.target import load_target
    gpu = "cpu" if args.cpu else "cuda"
    # every target takes and returns CPU tensors (official-kernels and kernels move them to the GPU)
    targets = {name: load_target(spec) for name, spec in
               (("official-kernels", f"official-kernels:{args.kernel}"), ("official", "official"), ("kernels", "kernels"))}
    try:
        import tilelang
        tl_version = tilelang.__version__
    except ImportError:
        tl_version = "absent"
    ok = targets["official-kernels"]
    result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kernel": args.kernel,
              "kernel_version": ok.version, "device": torch.cuda.get_device_name() if gpu == "cuda" else "cpu",
              "torch": torch.__version__, "tilelang": tl_version, "served": sorted(ok.provider.served),
              "targets": ["spec", "official", "kernels"], "codecs": []}
    x = make_input(torch, args.rows, 512, args.seed)
    for block in BLOCKS:
        result["codecs"].append(codec_rows(torch, np, targets, x, "fp8_quantize", block))
    for op in ("fp4_e8m0_quantize", "fp4_e4m3_quantize"):        # the second with V4.1's kernel.py only
        if ok.has(op):
            result["codecs"].append(codec_rows(torch, np, targets, x, op))
    result["qdq"] = qdq_row(torch, np, targets, x)
    result["linear"] = linear_row(torch, np, targets, args.seed)
    result["attention"] = attention_row(torch, targets, args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
