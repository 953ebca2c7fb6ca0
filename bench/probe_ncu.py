"""Probe: the hardware counters of the kernels whose goals are not met (CUDA GPU, under Nsight Compute).

Each case calls one device-API operation at the shape of its bench row, WARMUP times and then once
more inside the NVTX range "probe"; Nsight Compute profiles only the kernels of that range
(bench/probe_ncu.sh gives it --nvtx-include probe/), so the Triton compile and the warm-up are
outside the report:

  fp4-e4m3     fp4_e4m3_quantize of 1M×128 bf16 (the row "fp4_e4m3_quantize 1Mx128 bfloat16")
  fp4-e8m0     fp4_e8m0_quantize of 1M×128 bf16 (the row "fp4_e8m0_quantize 1Mx128 bfloat16")
  logits-t1    index_scores_fp4 of one query, 64 heads, over 1M FP4 keys ("logits decode fp4 T=1 S=1048576")
  topk-1m-512  the top-k engine's five launches on one row of 1M, k 512 (what a CUDA graph replays)
  attn-decode-t1, attn-decode-t128
               kernels/attn.launch on bench_attn's decode inputs, T = 1 and 128 tokens, 64 heads of 512,
               640 entries ("sparse attention decode": the rows FlashMLA's decode is timed beside)

The readings of 12-03 are in docs/records/h200/README.md ("Issue 23's goals at head").

    python bench/probe_ncu.py CASE            (runs the case)
    python bench/probe_ncu.py --cases         (prints the cases' names)
    bash bench/probe_ncu.sh OUTDIR            (every case under ncu --set full; one report a case)
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "0")

from dsv4spec.cmd_bench import cuda_torch  # noqa: E402

WARMUP = 3


def case_fn(torch, name):
    """The call of one case, its inputs made once (seeded, on the GPU)."""
    from dsv4spec.kernels import device as D
    g = torch.Generator(device="cuda").manual_seed(7)
    if name in ("fp4-e4m3", "fp4-e8m0"):
        x = torch.randn(1 << 20, 128, device="cuda", generator=g).bfloat16()
        quantize = D.fp4_e4m3_quantize if name == "fp4-e4m3" else D.fp4_e8m0_quantize
        return lambda: quantize(x)
    if name == "logits-t1":
        from bench_indexer import fp4_decode_inputs     # (bench/ is this script's folder)
        qp, qs, kp, ks, w, vis = fp4_decode_inputs(torch, 1, 1 << 20, g)
        return lambda: D.index_scores_fp4(qp, qs, kp, ks, w, vis)
    if name == "topk-1m-512":
        from dsv4spec.kernels import topk as KT
        x = torch.randn(1, 1 << 20, device="cuda", generator=g).bfloat16().float()
        n = torch.full((1,), 1 << 20, dtype=torch.int32, device="cuda")
        def launches():     # the five launches a CUDA graph replays
            with KT.topk_path("launches"):
                return KT._topk_engine(x, n, 512, sync=False)
        return launches
    if name.startswith("attn-decode-t"):
        from bench_attn import inputs
        from dsv4spec.kernels import attn as KA
        from dsv4spec.spec import attn as spec
        q, kv, sink, idx, m = inputs(torch, int(name.rsplit("t", 1)[1]), decode=True)
        scale = spec.softmax_scale(m)
        return lambda: KA.launch(q, kv, sink, idx, scale, spec.V41_INIT)
    raise ValueError(f"probe_ncu: unknown case {name!r}")


CASES = ("fp4-e4m3", "fp4-e8m0", "logits-t1", "topk-1m-512", "attn-decode-t1", "attn-decode-t128")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv == ["--cases"]:
        print(*CASES)
        return 0
    if len(argv) != 1 or argv[0] not in CASES:
        print(f"usage: python bench/probe_ncu.py CASE, CASE one of {', '.join(CASES)} (--help says more)",
              file=sys.stderr)
        return 2
    torch = cuda_torch("probe_ncu")
    if torch is None:
        return 2
    fn = case_fn(torch, argv[0])
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"probe_ncu {argv[0]}: {WARMUP} warm-up calls, then one in the NVTX range 'probe'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
