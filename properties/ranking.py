"""Tie-aware validity of top-k results and candidate pools.

Index lists are never compared.  A top-k row is valid when its entries are eligible positions
(visible, and inside the pool where there is one), −1 appears only as trailing padding, the
count is min(k, |eligible|), nothing repeats, the order is the one asked for, and the multiset of
reference scores at the chosen positions equals the reference top-k multiset — allowing, where
the target computed the scores itself, any position within the score tolerance of the k-th score.

A pool is valid when it is a union of whole blocks, holds the newest block, nothing unreachable
outside it, at most topk_blocks blocks, and its block-score multiset equals the reference one.

Each function raises AssertionError naming the clause that failed and the first offending rows;
recall and tie counts are reported as diagnostics only.
"""
from __future__ import annotations

import numpy as np

from ..spec import pool as spec_pool
from .compare import as_numpy

TOPK_CLAUSES = ("shape", "range", "padding", "count", "unique", "order", "selection", "lowest_index")
POOL_CLAUSES = ("shape", "whole_blocks", "size", "newest", "empty", "reachable", "selection", "lowest_index")


def _fail(what: str, clause: str, bad: list[str], limit: int = 3):
    if bad:
        raise AssertionError(f"{what}: {clause} violated in {len(bad)} row(s)\n  " + "\n  ".join(bad[:limit]))


def _show(values: np.ndarray, limit: int = 12) -> str:
    values = np.asarray(values)
    text = np.array2string(values[:limit], separator=", ", max_line_width=200)
    return text[:-1] + ", …]" if values.size > limit else text


def assert_topk(chosen, ref_scores, eligible, k: int, order: str, *, clauses=TOPK_CLAUSES,
                tol=None, what: str = "top-k", context=None):
    """Check the named clauses of a top-k result [T, k] against reference scores [T, S].

    eligible [T, S]: the positions a valid entry may take.  tol: per-score tolerance [T, S] or
    None (exact).  order: 'score' (non-increasing reference scores) or 'position' (ascending).
    context(t) -> str describes row t's input."""
    got = as_numpy(chosen)
    ref = np.asarray(ref_scores, dtype=np.float64)
    eligible = np.asarray(eligible, dtype=bool)
    T, S = ref.shape
    ctx = context or (lambda t: "")
    if "shape" in clauses:
        if got.shape != (T, k) or got.dtype.kind not in "iu":
            raise AssertionError(f"{what}: shape/dtype clause: got {got.shape} {got.dtype}, "
                                 f"expected integer indices [T, k] = [{T}, {k}]")
    got = got.astype(np.int64)
    bad = {c: [] for c in TOPK_CLAUSES}
    for t in range(T):
        row, elig = got[t], eligible[t]
        n_want = min(k, int(elig.sum()))
        pad = row == -1
        valid = row[~pad]
        head = f"row {t}: got {_show(row)} (eligible {int(elig.sum())}, k {k}){ctx(t)}"
        if pad.any() and not pad[int(np.argmax(pad)):].all():
            bad["padding"].append(head + " — −1 before a valid index")
        elif not pad[n_want:].all():
            bad["padding"].append(head + f" — the slots after the {n_want} valid entries must hold −1")
        inside = (valid >= 0) & (valid < S)
        ok = valid[inside]
        ok = ok[elig[ok]]
        if ok.size != valid.size:
            bad["range"].append(head + f" — not eligible (out of range, not visible or outside the pool): "
                                f"{_show(np.setdiff1d(valid, ok))}")
        if valid.size != n_want:
            bad["count"].append(head + f" — {valid.size} valid entries, expected min(k, eligible) = {n_want}")
        if np.unique(valid).size != valid.size:
            bad["unique"].append(head + " — repeated index")
        tol_row = _row_tol(tol, t, elig)
        if order == "position" and np.any(np.diff(valid) <= 0):
            bad["order"].append(head + " — positions not strictly ascending")
        with np.errstate(invalid="ignore"):
            rising = np.diff(ref[t, ok]) > tol_row        # −inf − (−inf) is NaN: not rising
        if order == "score" and ok.size == valid.size and np.any(rising):
            bad["order"].append(head + f" — scores not descending: {_show(ref[t, ok])}")
        if n_want:
            _selection(ref[t], elig, ok, n_want, tol_row, head, bad)
            lowest = np.sort(np.lexsort((np.arange(S), -np.where(elig, ref[t], -np.inf)))[:n_want])
            if not np.array_equal(np.sort(ok), lowest):
                bad["lowest_index"].append(head + f" — lowest-index top-k is {_show(lowest)}")
    for c in clauses:
        if c != "shape":
            _fail(what, c, bad[c])


def _row_tol(tol, t: int, elig: np.ndarray) -> float:
    if tol is None:
        return 0.0
    row = np.asarray(tol, dtype=np.float64)[t]
    row = row[elig & np.isfinite(row)]
    return float(row.max()) if row.size else 0.0


def _selection(ref_row, elig, chosen, n_want, tol_row, head, bad):
    scores = np.where(elig, ref_row, -np.inf)
    kth = np.sort(scores[elig])[::-1][n_want - 1]
    must = np.flatnonzero(elig & (scores > kth + tol_row))
    missing = np.setdiff1d(must, chosen)
    too_low = chosen[scores[chosen] < kth - tol_row]
    if missing.size or too_low.size:
        ties = int(np.sum(scores[elig] == kth))
        recall = np.intersect1d(chosen, np.flatnonzero(scores >= kth)).size / n_want
        bad["selection"].append(
            head + f" — k-th reference score {kth!r} (tolerance {tol_row:g}, {ties} tied, recall "
            f"{recall:.3f}); missing better entries {_show(missing)}, chosen below the k-th {_show(too_low)} "
            f"with scores {_show(scores[too_low])}")


def assert_pool(pool, scores, compress_lens, topk_blocks: int, block_size: int, *, clauses=POOL_CLAUSES,
                pin_empty: str = "none", what: str = "candidate pool"):
    """Check the named clauses of a candidate mask [T, W] for block scores from `scores` [T, W]."""
    got = as_numpy(pool)
    scores = np.asarray(scores, dtype=np.float64)
    lens = np.asarray(compress_lens, dtype=np.int64)
    T, W = scores.shape
    if got.shape != (T, W) or got.dtype != np.bool_:
        raise AssertionError(f"{what}: shape clause: got {got.shape} {got.dtype}, expected bool [{T}, {W}]")
    n_blocks = -(-W // block_size)
    bad = {c: [] for c in POOL_CLAUSES}
    for t in range(T):
        row, n = got[t], int(lens[t])
        padded = np.zeros(n_blocks * block_size, dtype=bool)
        padded[:W] = row
        per_block = padded.reshape(n_blocks, block_size)
        full = per_block.copy()
        full.reshape(-1)[W:] = True                     # padding counts as in-block for the whole-block test
        partial = per_block.any(axis=1) & ~full.all(axis=1)
        kept = np.flatnonzero(per_block.any(axis=1))
        head = f"row {t} (width {W}, compress_lens {n}): {kept.size} blocks, {int(row.sum())} positions"
        if partial.any():
            bad["whole_blocks"].append(head + f" — blocks only partly in the pool: {_show(np.flatnonzero(partial))}")
        if kept.size > topk_blocks or row.sum() > topk_blocks * block_size:
            bad["size"].append(head + f" — more than {topk_blocks} blocks / {topk_blocks * block_size} positions")
        newest = spec_pool.newest_block(n, block_size)
        if n > 0 and not row[newest * block_size: min(W, (newest + 1) * block_size)].any():
            bad["newest"].append(head + f" — newest block {newest} (position {n - 1}) missing")
        if n == 0:
            expected = [] if pin_empty == "none" or W == 0 else [0]
            if list(kept) != expected:
                bad["empty"].append(head + f" — nothing is reachable; expected blocks {expected}, got {_show(kept)}")
        block_max = spec_pool.block_scores(scores[t], n, block_size)
        if n == 0 and pin_empty == "block0" and n_blocks:
            block_max[0] = np.inf
        unreachable = kept[block_max[kept] == -np.inf]
        late = np.flatnonzero(row[n:]) + n
        stray = late[(late // block_size) != newest] if n > 0 else np.zeros(0, dtype=np.int64)
        if unreachable.size or stray.size:
            bad["reachable"].append(head + f" — blocks without a reachable score {_show(unreachable)}, "
                                    f"positions past compress_lens outside the newest block {_show(stray)}")
        n_sel = min(topk_blocks, n_blocks)
        if n_sel:
            kth = np.sort(block_max)[::-1][n_sel - 1]
            want = int(np.sum(np.sort(block_max)[::-1][:n_sel] > -np.inf))
            must = np.flatnonzero(block_max > kth)
            missing = np.setdiff1d(must, kept)
            low = kept[block_max[kept] < kth]
            if kept.size != want or missing.size or low.size:
                bad["selection"].append(head + f" — expected {want} blocks; k-th block score {kth!r} "
                                        f"({int(np.sum(block_max == kth))} tied); missing {_show(missing)}, "
                                        f"below the k-th {_show(low)}")
            lowest = np.flatnonzero(spec_pool.selected_blocks(block_max, topk_blocks))
            if not np.array_equal(kept, lowest):
                bad["lowest_index"].append(head + f" — lowest-index selection is {_show(lowest)}, got {_show(kept)}")
    for c in clauses:
        if c != "shape":
            _fail(what, c, bad[c])
