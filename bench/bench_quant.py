"""Benchmark of the quant-family Triton kernels on one CUDA GPU.

In one run: the device-to-device copy bandwidth (y.copy_(x), the ceiling), each kernel's effective
bandwidth (bytes read + bytes written, scales included, over the do_bench median), a plain-torch
baseline of the same operation, the ratios kernel/copy and kernel/torch, and a bit-exactness check
of the kernels against the numpy spec on the benchmark inputs.  Writes bench_quant.json and
bench_quant.md to --out.  Refuses (exit 2) when no GPU is present.

    python bench/bench_quant.py --out out/
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from dsv4spec.cmd_bench import cuda_torch

GOALS = {"quantize": 0.80, "dequantize": 0.85}   # performance.md §0 targets (fraction of copy)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for bench_quant.json and bench_quant.md")
    ap.add_argument("--tokens", type=int, default=1 << 20,
                    help="rows of the [tokens, 128] shape (default 1M, an indexer K cache)")
    ap.add_argument("--mb", type=int, default=64, help="size in MB of the second (bf16) input")
    ap.add_argument("--copy-gib", type=float, default=2.0, help="buffer size of the copy ceiling")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--check-elements", type=int, default=1 << 23,
                    help="elements of each input checked against the spec (0: all)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time a few (elements per program, warps) configurations")
    ap.add_argument("--skip-torch", action="store_true", help="skip the torch baselines")
    return ap.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Inputs: mixed magnitudes 1e-6..3000 with random signs, zero blocks, tie blocks, and the edge
# vectors on the codecs' decision boundaries at the start.
# ----------------------------------------------------------------------------------------------

EDGE_BLOCKS_16 = [
    [6, .75, 1.75, 3.5, .25, 1.25, 2.5, 5, -.75, -1.75, -3.5, -.25, -1.25, -2.5, -5, -0.0],
    [0.17578125, 0.03662109375],
    [0.08203125, 0.02392577938735485],
    [0.05, 0.01],
    [2785, -2785, 2700, 100, 5, 0.01],
    [96.00000762939453, 10],
]


def make_input(torch, shape, dtype, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    exponent = torch.rand(n, device=device, generator=g) * 9.48 - 6.0      # 1e-6 .. 3000
    sign = torch.where(torch.rand(n, device=device, generator=g) < 0.5, -1.0, 1.0)
    x = sign * torch.pow(10.0, exponent)
    blocks = x.view(-1, 16)
    zero_rows = torch.rand(blocks.shape[0], device=device, generator=g) < 0.01
    blocks[zero_rows] = 0.0
    tie_rows = torch.rand(blocks.shape[0], device=device, generator=g) < 0.01
    ties = torch.tensor(EDGE_BLOCKS_16[0], device=device)
    scale = torch.pow(2.0, torch.randint(-8, 8, (int(tie_rows.sum()), 1), device=device,
                                         generator=g).float())
    blocks[tie_rows] = ties * scale
    for i, vec in enumerate(EDGE_BLOCKS_16):
        blocks[i] = 0.0
        blocks[i, :len(vec)] = torch.tensor(vec, device=device)
    return x.view(shape).to(dtype)


# ----------------------------------------------------------------------------------------------
# Plain-torch baselines (the straightforward expression of each rule; timing reference only)
# ----------------------------------------------------------------------------------------------

def torch_baselines(torch, device="cuda"):
    bounds = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    inclusive = (False, True, False, True, False, True, False)

    def e2m1(y):
        mag = y.abs()
        code = torch.zeros_like(mag, dtype=torch.uint8)
        for b, inc in zip(bounds, inclusive):
            code += (mag >= b if inc else mag > b).to(torch.uint8)
        return code | (torch.signbit(y).to(torch.uint8) << 3)

    def pack(codes):
        return codes[..., 0::2] | (codes[..., 1::2] << 4)

    def pow2_ceil(p):
        bits = p.view(torch.int32)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        return e

    def e4m3(x):
        xb = x.view(-1, 16).float()
        amax = xb.abs().amax(1).clamp_min(6 * 2.0 ** -9)
        s8 = (amax / 6).clamp_max(448).to(torch.float8_e4m3fn)
        y = (xb / s8.float()[:, None]).clamp(-6, 6)
        return pack(e2m1(y)), s8.view(torch.uint8)

    def e8m0(x):
        xb = x.view(-1, 32).float()
        e = pow2_ceil(xb.abs().amax(1).clamp_min(6 * 2.0 ** -126) * (1 / 6))
        y = (xb * torch.pow(2.0, -e.float())[:, None]).clamp(-6, 6)
        return pack(e2m1(y)), (e + 127).to(torch.uint8)

    def fp8(x, block):
        xb = x.view(-1, block).float()
        e = pow2_ceil(xb.abs().amax(1).clamp_min(1e-4) * (1 / 448))
        y = (xb * torch.pow(2.0, -e.float())[:, None]).clamp(-448, 448)
        return y.to(torch.float8_e4m3fn).view(torch.uint8), (e + 127).to(torch.uint8)

    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6],
                         device=device)

    def fp4_deq(packed, scale_values, block):
        p = packed.view(-1, block // 2).long()
        codes = torch.stack((p & 15, p >> 4), -1).view(-1, block)
        return table[codes] * scale_values[:, None]

    def e4m3_deq(packed, scales):
        return fp4_deq(packed, scales.view(torch.float8_e4m3fn).view(-1).float(), 16)

    def e8m0_deq(packed, scales):
        return fp4_deq(packed, torch.pow(2.0, scales.view(-1).float() - 127), 32)

    def fp8_deq(q, scales, block):
        v = q.view(torch.float8_e4m3fn).view(-1, block).float()
        return v * torch.pow(2.0, scales.view(-1).float() - 127)[:, None]

    return {"fp4_e4m3_quantize": e4m3, "fp4_e8m0_quantize": e8m0, "fp8_quantize": fp8,
            "fp4_e4m3_dequantize": e4m3_deq, "fp4_e8m0_dequantize": e8m0_deq,
            "fp8_dequantize": fp8_deq}


# ----------------------------------------------------------------------------------------------
# Exactness against the spec (numpy), on a slice of whole blocks of each input
# ----------------------------------------------------------------------------------------------

QUANT_OPS = ("fp4_e4m3_quantize", "fp4_e8m0_quantize", "fp8_quantize", "fp4_e4m3_dequantize",
             "fp4_e8m0_dequantize", "fp8_dequantize")


def spec_reference():
    """(name, ops): spec/quant.py's operations when it provides them all, else the contract's
    rules composed from the exact element formats of spec/formats.py."""
    try:
        from dsv4spec.spec import quant as spec_quant
        if all(callable(getattr(spec_quant, n, None)) for n in QUANT_OPS):
            return "spec.quant", {n: getattr(spec_quant, n) for n in QUANT_OPS}
    except ImportError:
        pass
    import numpy as np
    from dsv4spec.spec import formats as F

    def amax_of(xb, floor):
        a = np.abs(xb)
        return np.maximum(np.where(np.isnan(a), 0, a).max(1), np.float32(floor)).astype(np.float32)

    def pow2_scale(xb, floor, inv_max):
        e = F.ceil_log2((amax_of(xb, floor) * np.float32(inv_max)).astype(np.float32))
        return F.pow2(e), (e + 127).astype(np.uint8)

    def pack(codes):
        c = codes.reshape(-1, 2)
        return (c[:, 0] | (c[:, 1] << 4)).astype(np.uint8)

    def unpack(p):
        return np.stack((p & 15, p >> 4), -1).reshape(-1)

    def e4m3_q(x):
        xb = np.asarray(x, np.float32).reshape(-1, 16)
        sc = F.e4m3_encode((amax_of(xb, 6 * 2.0 ** -9) / np.float32(6)).astype(np.float32))
        y = np.clip((xb / F.e4m3_decode(sc)[:, None]).astype(np.float32), -6, 6)
        return pack(F.e2m1_encode(y)), sc

    def e8m0_q(x):
        xb = np.asarray(x, np.float32).reshape(-1, 32)
        s, sc = pow2_scale(xb, 6 * 2.0 ** -126, 1 / 6)
        y = np.clip((xb / s[:, None]).astype(np.float32), -6, 6)
        return pack(F.e2m1_encode(y)), sc

    def fp8_q(x, block):
        xb = np.asarray(x, np.float32).reshape(-1, block)
        s, sc = pow2_scale(xb, 1e-4, 1 / 448)
        y = np.clip((xb / s[:, None]).astype(np.float32), -448, 448)
        return F.e4m3_encode(y), sc

    def fp4_deq(packed, scales, block, decode):
        v = F.e2m1_decode(unpack(packed)).reshape(-1, block) * decode(scales).reshape(-1)[:, None]
        return v.astype(np.float32)

    return "spec.formats (composed)", {
        "fp4_e4m3_quantize": e4m3_q, "fp4_e8m0_quantize": e8m0_q, "fp8_quantize": fp8_q,
        "fp4_e4m3_dequantize": lambda p, s: fp4_deq(p, s, 16, F.e4m3_decode),
        "fp4_e8m0_dequantize": lambda p, s: fp4_deq(p, s, 32, F.e8m0_decode),
        "fp8_dequantize": lambda q, s, b: (F.e4m3_decode(q).reshape(-1, b) *
                                           F.e8m0_decode(s).reshape(-1)[:, None]).astype(np.float32),
    }


def check_exact(reference, op, args_gpu, outs_gpu, check_elements):
    """Kernel outputs against the reference on a leading fraction of every tensor (whole blocks:
    payload and scales are row-major, so the same fraction keeps them aligned)."""
    import numpy as np
    first = args_gpu[0]
    frac = 1.0 if not check_elements else min(1.0, check_elements / first.numel())

    def head(t):
        flat = t.reshape(-1)
        k = flat.numel() if frac >= 1 else max(1, int(flat.numel() * frac))
        flat = flat[:k]
        return (flat.float() if flat.dtype.is_floating_point else flat).cpu().numpy()

    np_args = [head(a) if hasattr(a, "reshape") else a for a in args_gpu]
    ref = reference[op](*np_args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    mismatches = 0
    for r, o in zip(ref, outs_gpu):
        got, r = head(o), np.asarray(r).reshape(-1)
        if got.dtype == np.float32:
            got, r = got.view(np.uint32), r.astype(np.float32).view(np.uint32)
        mismatches += int((got != r).sum())
    return {"checked_values": int(outs_gpu[0].numel() * frac) * (2 if "fp4" in op and "de" not in op else 1),
            "mismatches": mismatches}


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    torch = cuda_torch("bench_quant")
    if torch is None:
        return 2
    import triton
    from triton.testing import do_bench

    from dsv4spec.kernels import quant as K

    def bench(fn):
        return do_bench(fn, warmup=25, rep=args.rep, return_mode="median") * 1e-3   # seconds

    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "sms": props.multi_processor_count,
              "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "config": dict(K.GPU_CONFIG, **{op: dict(c) for op, c in K.GPU_OP_CONFIG.items()}),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}

    # the ceiling: device-to-device copy
    nbytes = int(args.copy_gib * (1 << 30))
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src))
    copy_bw = 2 * nbytes / t
    result["copy_GBps"] = copy_bw / 1e9
    del src, dst
    print(f"copy: {copy_bw / 1e9:.0f} GB/s ({args.copy_gib} GiB buffer)")

    baselines = {} if args.skip_torch else torch_baselines(torch)
    ref_name, reference = spec_reference()
    result["reference"] = ref_name
    print(f"exactness reference: {ref_name}")

    shapes = [(f"{args.tokens >> 20}Mx128" if args.tokens >= 1 << 20 else f"{args.tokens}x128",
               (args.tokens, 128)),
              (f"{args.mb}MB", (args.mb * (1 << 20) // 2 // 128, 128))]
    rows = result["rows"]

    def record(op, shape_name, dtype, moved, t_kernel, t_torch, exact, kind):
        bw = moved / t_kernel
        row = {"op": op, "shape": shape_name, "dtype": dtype, "bytes": moved,
               "kernel_us": t_kernel * 1e6, "kernel_GBps": bw / 1e9,
               "kernel_over_copy": bw / copy_bw, "goal": GOALS[kind],
               "meets_goal": bw / copy_bw >= GOALS[kind]}
        if t_torch is not None:
            row.update(torch_us=t_torch * 1e6, kernel_over_torch=t_torch / t_kernel)
        if exact is not None:
            row.update(exact)
        rows.append(row)
        print(f"{op:22s} {shape_name:9s} {dtype:9s} {t_kernel * 1e6:9.1f} us {bw / 1e9:7.0f} GB/s "
              f"{bw / copy_bw:6.1%} of copy" +
              (f"  {t_torch / t_kernel:6.1f}x torch" if t_torch else "") +
              (f"  mismatches {exact['mismatches']}" if exact else ""))

    for shape_name, shape in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            if dtype == torch.float32 and shape_name != shapes[1][0]:
                continue
            x = make_input(torch, shape, dtype, seed=len(rows))
            n = x.numel()
            dname = str(dtype).replace("torch.", "")
            quantizers = [("fp4_e4m3_quantize", lambda x=x: K.fp4_quantize_device(x, True), 16,
                           n // 2, lambda: baselines["fp4_e4m3_quantize"](x)),
                          ("fp4_e8m0_quantize", lambda x=x: K.fp4_quantize_device(x, False), 32,
                           n // 2, lambda: baselines["fp4_e8m0_quantize"](x))]
            for block in (32, 64, 128):
                quantizers.append((f"fp8_quantize", lambda x=x, b=block: K.fp8_quantize_device(x, b),
                                   block, n, lambda b=block: baselines["fp8_quantize"](x, b)))
            for op, fn, block, payload, base in quantizers:
                label = op if op != "fp8_quantize" else f"fp8_quantize/{block}"
                outs = fn()
                moved = n * x.element_size() + payload + n // block
                t_k = bench(fn)
                t_t = bench(base) if baselines else None
                extra = (block,) if op == "fp8_quantize" else ()
                exact = check_exact(reference, op, (x,) + extra, outs, args.check_elements)
                record(label, shape_name, dname, moved, t_k, t_t, exact, "quantize")
                if dtype != torch.bfloat16:
                    continue
                # the matching dequantize, to float32 (the contract) and bfloat16
                dop = op.replace("quantize", "dequantize")
                if op == "fp8_quantize":
                    dfn = {d: (lambda q=outs[0], s=outs[1], b=block, d=d:
                               K.fp8_dequantize_device(q, s, b, d))
                           for d in (torch.float32, torch.bfloat16)}
                    dbase = lambda q=outs[0], s=outs[1], b=block: baselines[dop](q, s, b)
                    dargs = (outs[0], outs[1], block)
                else:
                    e4 = op == "fp4_e4m3_quantize"
                    dfn = {d: (lambda q=outs[0], s=outs[1], e4=e4, d=d:
                               K.fp4_dequantize_device(q, s, e4, d))
                           for d in (torch.float32, torch.bfloat16)}
                    dbase = lambda q=outs[0], s=outs[1]: baselines[dop](q, s)
                    dargs = (outs[0], outs[1])
                for odt, f in dfn.items():
                    moved = payload + n // block + n * (4 if odt == torch.float32 else 2)
                    y = f()
                    t_k = bench(f)
                    t_t = bench(dbase) if baselines and odt == torch.float32 else None
                    exact = None
                    if odt == torch.float32:
                        exact = check_exact(reference, dop, dargs, (y,), args.check_elements)
                    label = dop if dop != "fp8_dequantize" else f"fp8_dequantize/{block}"
                    record(label, shape_name, "->" + str(odt).replace("torch.", ""), moved,
                           t_k, t_t, exact, "dequantize")
                    del y
            del x
            torch.cuda.empty_cache()

    if args.sweep:
        result["sweep"] = sweep(torch, K, bench, copy_bw, shapes[0][1])

    # determinism on the GPU: repeated calls bitwise identical
    x = make_input(torch, (1 << 16, 128), torch.bfloat16, seed=99)
    first = K.fp4_quantize_device(x, True)
    result["deterministic"] = all(
        all(torch.equal(a, b) for a, b in zip(first, K.fp4_quantize_device(x, True)))
        for _ in range(20))

    total_mismatch = sum(r.get("mismatches", 0) for r in rows)
    result["exact"] = total_mismatch == 0
    print(f"exact vs spec: {result['exact']}  deterministic: {result['deterministic']}")
    if args.out:
        write(args.out, result)
    return 0 if result["exact"] and result["deterministic"] else 1


def sweep(torch, K, bench, copy_bw, shape):
    """Time the quantizers and dequantizers over a few launch configurations."""
    x = make_input(torch, shape, torch.bfloat16, seed=7)
    n = x.numel()
    saved, saved_ops = dict(K.GPU_CONFIG), dict(K.GPU_OP_CONFIG)
    K.GPU_OP_CONFIG.clear()   # every kernel at the swept configuration
    out = []
    for elements in (2048, 4096, 8192, 16384):
        for warps in (2, 4, 8):
            K.GPU_CONFIG.update(elements_per_program=elements, num_warps=warps)
            entry = {"elements_per_program": elements, "num_warps": warps}
            for e4 in (True, False):
                block = 16 if e4 else 32
                q, s = K.fp4_quantize_device(x, e4)
                tq = bench(lambda: K.fp4_quantize_device(x, e4))
                td = bench(lambda: K.fp4_dequantize_device(q, s, e4, torch.bfloat16))
                moved = n * 2 + n // 2 + n // block
                name = "e4m3" if e4 else "e8m0"
                entry[f"{name}_quantize_over_copy"] = moved / tq / copy_bw
                entry[f"{name}_dequantize_bf16_over_copy"] = moved / td / copy_bw
            out.append(entry)
            print("sweep", entry)
    K.GPU_CONFIG.clear()
    K.GPU_CONFIG.update(saved)
    K.GPU_OP_CONFIG.update(saved_ops)
    return out


def write(folder, result):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "bench_quant.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# quant kernels on {result['device']} (torch {result['torch']}, triton "
             f"{result['triton']}), {result['date']}", "",
             f"Copy ceiling: {result['copy_GBps']:.0f} GB/s.  Exact vs spec: {result['exact']}.  "
             f"Deterministic: {result['deterministic']}.  Config: {result['config']}.", "",
             "| op | shape | dtype | kernel µs | GB/s | kernel/copy | goal | kernel/torch | "
             "checked | mismatches |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['kernel_us']:.1f} | "
                     f"{r['kernel_GBps']:.0f} | {r['kernel_over_copy']:.1%} | {r['goal']:.0%} | "
                     f"{r.get('kernel_over_torch', float('nan')):.1f} | "
                     f"{r.get('checked_values', '-')} | {r.get('mismatches', '-')} |")
    with open(os.path.join(folder, "bench_quant.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
