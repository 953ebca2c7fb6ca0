"""The coverage boundaries of POOL: pool rows, block ties, the re-index."""

from __future__ import annotations

import numpy as np

from ...spec import indexer as spec_indexer
from ...spec import pool as spec_pool
from .boundary import Boundary, of


def _pool_rows(calls):
    for c in of(calls, "candidate_blocks"):
        scores, lens = np.asarray(c.args[0], dtype=np.float64), np.asarray(c.args[1])
        topk_blocks = int(c.args[2]) if len(c.args) > 2 else spec_pool.TOPK_BLOCKS
        for t in range(scores.shape[0]):
            yield t, scores[t], int(lens[t]), topk_blocks


def _block_kth_tie(row, n, topk_blocks):
    scores = spec_pool.block_scores(row, n)
    finite = np.sort(scores[np.isfinite(scores)])[::-1]
    m = topk_blocks - (1 if n > 0 else 0)                 # the pinned block takes one place
    return 0 < m < finite.size and finite[m - 1] == finite[m]


def pool_boundaries() -> list[Boundary]:
    cap = spec_pool.POOL_CAPACITY

    def rows(pred):
        return lambda calls: any(pred(t, row, n, kb) for t, row, n, kb in _pool_rows(calls))
    weak = lambda r, n: n > 8 and np.max(r[spec_pool.newest_block(n) * 8:n]) < np.min(  # noqa: E731
        spec_pool.block_scores(r, n)[:spec_pool.newest_block(n)])
    return [Boundary("compress_lens = 0", "range", rows(lambda t, r, n, kb: n == 0)),
            Boundary("compress_lens a multiple of 8", "element", rows(lambda t, r, n, kb: n > 0 and n % 8 == 0)),
            Boundary("compress_lens ≡ 1 (mod 8)", "element", rows(lambda t, r, n, kb: n % 8 == 1)),
            Boundary("compress_lens ≡ 7 (mod 8)", "element", rows(lambda t, r, n, kb: n % 8 == 7)),
            Boundary("a row ≥ 1 with compress_lens not a multiple of 8", "layout", rows(lambda t, r, n, kb: t >= 1 and n % 8)),
            Boundary("compress_lens = W, W not a multiple of 8", "layout", rows(lambda t, r, n, kb: n == r.size and r.size % 8)),
            Boundary(f"{cap - 1} reachable positions", "range", rows(lambda t, r, n, kb: n == cap - 1)),
            Boundary(f"{cap} reachable positions (the capacity, all kept)", "range", rows(lambda t, r, n, kb: n == cap)),
            Boundary(f"{cap + 1} reachable positions (one block pruned)", "range", rows(lambda t, r, n, kb: n == cap + 1)),
            Boundary("more blocks than topk_blocks (small topk_blocks)", "range",
                     rows(lambda t, r, n, kb: kb < spec_pool.TOPK_BLOCKS and -(-n // 8) > kb)),
            Boundary("a tie at the k-th block score", "element", rows(lambda t, r, n, kb: _block_kth_tie(r, n, kb))),
            Boundary("the newest block weaker than every other", "element", rows(lambda t, r, n, kb: weak(r, n))),
            Boundary("a reachable block entirely −inf", "range", rows(
                lambda t, r, n, kb: n > 8 and np.any(np.all(np.isneginf(r[:n - n % 8].reshape(-1, 8)), axis=1))))]


def reindex_boundaries(op: str = "reindex_topk") -> list[Boundary]:
    def rows(pred):
        def reached(calls):
            for c in of(calls, op):
                visible, pool, k = np.asarray(c.args[3]), np.asarray(c.args[4], dtype=bool), int(c.args[5])
                eligible = pool & spec_indexer.visibility_mask(visible, pool.shape[1])
                if any(pred(eligible[t], pool[t], k) for t in range(pool.shape[0])):
                    return True
            return False
        return reached
    return [Boundary("an empty pool row", "range", rows(lambda e, p, k: not p.any())),
            Boundary("a full pool row", "range", rows(lambda e, p, k: p.all())),
            Boundary("fewer eligible positions than topk (padding)", "range", rows(lambda e, p, k: 0 < e.sum() < k)),
            Boundary("more eligible positions than topk", "range", rows(lambda e, p, k: 0 < k < e.sum())),
            Boundary(f"a pool of a pruned row (> {spec_pool.POOL_CAPACITY} positions)", "range",
                     rows(lambda e, p, k: p.size > spec_pool.POOL_CAPACITY and 0 < p.sum() < p.size))]


def pool_rule_boundaries() -> dict[str, list[Boundary]]:
    pool = pool_boundaries()
    return {
        "POOL.BLOCK_SCORE": [b for b in pool if "reachable positions" not in b.name],
        "POOL.PIN_NEWEST": [b for b in pool if "newest" in b.name or "mod 8" in b.name or "multiple" in b.name],
        "POOL.PIN_EMPTY": [b for b in pool if "= 0" in b.name],
        "POOL.PIN_COUNTS": [b for b in pool if "newest" in b.name or "topk_blocks" in b.name],
        "POOL.TOPK_BLOCKS": pool,
        "POOL.DROP_INF": [b for b in pool if "−inf" in b.name or "= 0" in b.name],
        "POOL.MASK": [b for b in pool if b.level == "layout" or "mod 8" in b.name],
        "POOL.SIZE": [b for b in pool if "reachable positions" in b.name or "topk_blocks" in b.name],
        "POOL.ALL_REACHABLE": [b for b in pool if "reachable positions" in b.name],
        "POOL.REINDEX": reindex_boundaries(),
    }
