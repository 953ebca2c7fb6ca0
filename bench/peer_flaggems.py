"""FlagGems' DSA top-k (flag_gems.fused.DSA.bin_topk.bucket_sort_topk) timed in a process of its own.

    python bench/peer_flaggems.py --site DIR --shapes 1x65536x2048,64x1048576x2048 [--rep MS]

bench/bench_peers.py runs this as a child process: FlagGems 5.0.2's bucket_sort_topk has faulted
with an illegal memory access on the H200 (../shared/reference/gpu-peers/README.md), which
poisons the CUDA context of the process that called it.  DIR is the folder FlagGems was
installed into (pip install --target); it goes first on sys.path.

For each shape RxNxK (rows, positions, k) it makes the bench's top-k input (bench_peers.topk_input:
BF16-valued fp32 scores, seeded), calls bucket_sort_topk(scores, starts=0, ends=N, k), judges the
picks (bench_indexer.topk_validity: the chosen score multiset is torch.topk's), times the call
eagerly and replayed from a CUDA graph, and prints one JSON line, flushed:

    {"shape": "1x65536x2048", "eager_us": 225.0, "graph_us": 210.0, "validity": "valid"}

A shape whose call raises prints {"shape": ..., "error": "..."} and the process exits 4 (the
context may be poisoned: the parent starts a new child for the shapes left).  FlagGems missing:
one line on stderr, exit 3.  --device cpu (tests, with a stand-in package) times with a clock and
skips the graph.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ABSENT, FAULTED = 3, 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--site", required=True, help="the folder FlagGems was installed into (pip install --target)")
    p.add_argument("--shapes", required=True, help="comma list of RxNxK (rows x positions x k)")
    p.add_argument("--rep", type=int, default=50, help="do_bench repetition time per timing (ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    return p.parse_args(argv)


def parse_shape(text: str):
    try:
        rows, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r}: expected RxNxK, three positive ints (e.g. 64x1048576x2048)") from None
    if min(rows, n, k) < 1 or k > n:
        raise ValueError(f"shape {text!r}: expected positive R, N, K with K <= N")
    return rows, n, k


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    except ValueError as e:
        print(f"peer_flaggems: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, args.site)
    sys.path.insert(0, HERE)
    if args.device == "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "0")
    import torch
    try:
        from flag_gems.fused.DSA.bin_topk import bucket_sort_topk
    except Exception as e:  # noqa: BLE001 -- whatever the import raises, one line
        print(f"peer_flaggems: cannot import flag_gems.fused.DSA.bin_topk.bucket_sort_topk from {args.site}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return ABSENT
    from bench_indexer import topk_validity
    from bench_peers import eager_and_graph, topk_input
    for rows, n, k in shapes:
        name = f"{rows}x{n}x{k}"
        try:
            x, nv = topk_input(torch, rows, n, args.seed, args.device)
            starts = torch.zeros(rows, dtype=torch.int32, device=args.device)
            ends = nv.clone()
            fn = lambda: bucket_sort_topk(x, starts, ends, k)   # noqa: E731
            picks = fn()
            if args.device == "cuda":
                torch.cuda.synchronize()
            by_position = torch.where(picks >= 0, picks.long(), n + k).sort(1).values
            by_position = torch.where(by_position >= n, -1, by_position)
            validity = topk_validity(torch, x, nv, by_position, k, "position")
            eager, graph, note = eager_and_graph(torch, fn, args.rep, args.device, ours=False)
            line = dict(shape=name, eager_us=eager, graph_us=graph, validity=validity, **({"note": note} if note else {}))
        except Exception as e:  # noqa: BLE001 -- report the shape, then leave: the context may be poisoned
            print(json.dumps(dict(shape=name, error=f"{type(e).__name__}: {e}"[:300])), flush=True)
            return FAULTED
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
