"""Probe: where the re-index time goes as the context grows (CUDA GPU).

The re-index bench rows (bench_indexer.py --only reindex) time the whole chain at 64K, 256K and
1M positions with the same pool size (2048 random 8-blocks a query, T=64, H=32, D=128).  Here
each part is timed alone from a CUDA graph at each context:

  gather   kernels.pool._gather_pool: count, then write, the pool positions of the [T, S] mask,
           at the shipped (positions a program, warps) and others
  list     kernels.pool._gather_blocks: the same positions from the list of the pool's blocks
  scores   the score kernel reading K through the gathered list, at the shipped launch config
           and at other (programs per query, pipeline stages)
  top-k    the top-k engine on the [T, 16384] pool scores (does not depend on S)

    python bench/probe_reindex.py            (one line per part, context and config)
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "0")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_indexer import pool_mask, reindex_inputs, replay_us  # noqa: E402

from dsv4spec.cmd_bench import cuda_torch  # noqa: E402

WIDTH = 16384
REP = 50   # do_bench ms a case
GATHER_CONFIGS = ((4096, 4), (4096, 8), (4096, 16), (8192, 16), (2048, 8))  # shipped first


def main() -> int:
    torch = cuda_torch("probe_reindex")
    if torch is None:
        return 2
    from dsv4spec.kernels import indexer as KI
    from dsv4spec.kernels import topk as KT
    from dsv4spec.kernels import pool as KP
    shipped = KI._score_config
    for S in (1 << 16, 1 << 18, 1 << 20):
        q, kc, w, vis, blocks = reindex_inputs(torch, S)
        pool = pool_mask(torch, blocks, S)
        T, H, D = q.shape
        idx, count = KP._gather_pool(pool, vis, WIDTH)
        for block, warps in GATHER_CONFIGS:
            KP._GATHER_BLOCK, KP._GATHER_WARPS = block, warps
            try:
                t = replay_us(torch, lambda: KP._gather_pool(pool, vis, WIDTH), REP)
                same = all(torch.equal(a, b) for a, b in zip(KP._gather_pool(pool, vis, WIDTH), (idx, count)))
            finally:
                KP._GATHER_BLOCK, KP._GATHER_WARPS = GATHER_CONFIGS[0]
            print(f"S={S:8d} gather  {t:8.1f} us  block {block:5d} warps {warps:2d}  mask "
                  f"{T * S / t / 1e6:.2f} TB/s{'' if same else '  DIFFERENT POOL'}", flush=True)
        same = all(torch.equal(a, b) for a, b in zip(KP._gather_blocks(blocks, vis, 8), (idx, count)))
        print(f"S={S:8d} list    {replay_us(torch, lambda: KP._gather_blocks(blocks, vis, 8), REP):8.1f} us"
              f"{'' if same else '  DIFFERENT POOL'}", flush=True)
        out = torch.empty((T, WIDTH), dtype=torch.float32, device="cuda")
        ref = None
        for per_query, stages in ((None, None), (18, 2), (36, 2), (9, 3), (18, 3), (36, 4)):
            def config(T_, S_, H_PAD, D_PAD, gather, n=per_query, st=stages):
                tq, block_s, n_s, warps, st0 = shipped(T_, S_, H_PAD, D_PAD, gather)
                return tq, block_s, n or n_s, warps, st or st0
            KI._score_config = config
            try:
                run = lambda: KI._launch_scores(q, None, kc, None, w, count, idx, T, WIDTH, H, D, out,  # noqa: E731
                                                fp4=False, bf16=True)
                t = replay_us(torch, run, REP)
                ref = out.clone() if ref is None else ref
                same = "" if torch.equal(out, ref) else "  DIFFERENT SCORES"
                n_s = config(T, WIDTH, 32, 128, True)[2]
                print(f"S={S:8d} scores  {t:8.1f} us  programs/query {n_s:3d} stages "
                      f"{config(T, WIDTH, 32, 128, True)[4]}  K rows {T * WIDTH * D * 2 / t / 1e6:.2f} TB/s{same}",
                      flush=True)
            finally:
                KI._score_config = shipped
        t = replay_us(torch, lambda: KT._topk_engine(out, count, 512, remap=idx, sync=False), REP)
        print(f"S={S:8d} top-k   {t:8.1f} us", flush=True)
        del q, kc, w, vis, pool, blocks, idx, count, out, ref
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
