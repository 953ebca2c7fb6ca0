"""Probe: what one program of the top-k engine's per-row kernels costs, part by part (CUDA GPU).

The threshold and select kernels run one program a row; the profile of a call gives their total,
not where it goes.  Each probe here is one part alone, in a kernel of its own, timed at 1 row (the
latency one program takes) and at 1024 rows (what the rows cost together on the GPU):

  load+store  K values read and written back (the floor of the emit)
  sort        the same with tl.sort between (the emit's ordering of the chosen positions)
  digit pass  one 8-bit radix pass over n keys (kernels.indexer._digit_pass): the threshold kernel
              runs 2 over the group maxima, the select kernel 2 to 8 over the candidates

    python bench/probe_select.py            (prints one line per probe)
    python bench/probe_select.py --ptx      (no GPU: the sm_90 instructions of one histogram)

--ptx compiles one tl.histogram of SUB keys into 256 bins for sm_90 (as the digit passes use it)
and counts its PTX instructions per thread: why one program's digit pass is instruction-bound.
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "0")


import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dsv4spec.cmd_bench import cuda_torch  # noqa: E402
from dsv4spec.kernels.topk import _digit_pass  # noqa: E402


@triton.jit
def move(x_ptr, out_ptr, K: tl.constexpr, SORT: tl.constexpr):
    row = tl.program_id(0)
    v = tl.load(x_ptr + row * K + tl.arange(0, K))
    if SORT:
        v = tl.sort(v)
    tl.store(out_ptr + row * K + tl.arange(0, K), v)


@triton.jit
def digit(key_ptr, out_ptr, n, SUB: tl.constexpr):
    row = tl.program_id(0)
    kp = key_ptr + row * n
    zero = tl.zeros((), tl.uint32)
    need = tl.zeros((), tl.int64) + 2048
    t, need, h, _, _ = _digit_pass(kp, kp, n, zero, need, zero, 24, False, SUB, 256)
    tl.store(out_ptr + row, t.to(tl.int32) + need.to(tl.int32) + h.to(tl.int32))


@triton.jit
def histogram(x_ptr, out_ptr, SUB: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, SUB))
    tl.store(out_ptr + tl.arange(0, 256), tl.histogram(v & 255, 256, mask=v > 0))


def histogram_ptx(sub=4096, warps=16):
    """Counts of the PTX instructions of histogram() for sm_90: {opcode: count} (per thread)."""
    import collections
    import re
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(fn=histogram, signature={"x_ptr": "*i32", "out_ptr": "*i32",
                                                              "SUB": "constexpr"}, constexprs={"SUB": sub})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    return collections.Counter(re.findall(r"^\s+([a-z][\w.]*)", ptx, re.M))


def main():
    if "--ptx" in sys.argv:
        sub, warps = 4096, 16
        ops = histogram_ptx(sub, warps)
        keys = sub // (32 * warps)
        print(f"tl.histogram of {sub} keys into 256 bins, {warps} warps ({keys} keys a thread), sm_90 PTX:")
        print(f"  {sum(ops.values())} instructions a thread, {sum(ops.values()) / keys:.0f} a key; "
              + ", ".join(f"{op} {n}" for op, n in ops.most_common(8)))
        return 0
    if cuda_torch("probe_select") is None:
        return 2
    from triton.testing import do_bench

    def us(fn):
        return do_bench(fn, warmup=25, rep=50, return_mode="median") * 1e3

    for R in (1, 1024):
        for K in (512, 2048, 4096):
            x = torch.randint(0, 1 << 30, (R, K), dtype=torch.int32, device="cuda")
            out = torch.empty_like(x)
            for warps in (4, 8, 16):
                base = us(lambda: move[(R,)](x, out, K, False, num_warps=warps))
                srt = us(lambda: move[(R,)](x, out, K, True, num_warps=warps))
                assert torch.equal(out, x.sort(1).values)
                print(f"rows {R:5d}  K {K:5d}  warps {warps:2d}   load+store {base:7.1f} µs   "
                      f"sort {srt:7.1f} µs", flush=True)
        for n in (2048, 4096, 8192, 32768):
            keys = torch.randint(1, 1 << 31, (R, n), dtype=torch.int32, device="cuda")
            res = torch.empty((R,), dtype=torch.int32, device="cuda")
            for sub in (1024, 4096):
                for warps in (4, 8, 16):
                    t = us(lambda: digit[(R,)](keys, res, n, min(sub, n), num_warps=warps))
                    print(f"rows {R:5d}  n {n:6d}  SUB {min(sub, n):5d}  warps {warps:2d}   "
                          f"digit pass {t:7.1f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
