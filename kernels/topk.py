"""The top-k engine of the Triton kernels, shared by kernels.indexer (index_topk) and kernels.pool
(candidate blocks, re-index): the k largest fp32 scores of each row among its first n_valid
positions, in position order (V4.1) or score order with ties by position (V4), or marked as the
blocks of a mask.

Top-k.  A row is an unordered multiset of fp32 scores mapped to order-preserving uint32 keys
(-0 folded onto +0).  The fast path is a threshold filter (group maxima give a threshold that
lets through about 1.1 k keys; one streaming pass appends those keys by atomic slots, the next
tile in flight; a per-row select fixes the k-th key (one histogram relative to the threshold, or
8-bit digit passes) and the last tied position, then puts the k chosen positions into V4.1's
order through a bitmap of the row (short rows) or a sort; see "Threshold filter" below, tunables
in FilterTune); rows it cannot hold go through the
radix engine: radix select on the top 12 key bits (per-chunk histograms plus a row
histogram), refined on 12 and then 8 more bits only while the boundary bin is too full; then one
ordered compaction writes, in position order, every key above the boundary and the boundary-bin
keys (at most CAP per row); a last per-row program finds the exact k-th key among those
candidates, breaks ties toward the lowest position, and emits positions (V4.1 order) or sorts
the <= CAP candidates by (score desc, position asc) (V4 order).  Deterministic: every count is an
integer; the radix engine places by prefix sums, and the filter's atomic slots only decide where a
candidate waits, never whether it is chosen or where it lands in the output.  The rows the filter
flags are served either after a host read-back of the flags (sync=True, the default: the
several-programs-a-row radix engine on those rows only, no launch when none is flagged) or on the
device (sync=False: one launch of one program a row, _radix_rows_kernel, which returns at once for
unflagged rows and runs the whole radix select for flagged ones; nothing waits for the host, so a
CUDA graph can capture the call).  The selection is unique (ties to the lowest position), so both
give the same bits.  Few rows of long rows take neither: the few-row passes at the end of this
module spread the select over each row's chunks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

from .mode import INTERPRET


def _pow2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


@triton.jit
def _order_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0 and +0 map to one key)."""
    b = x.to(tl.uint32, bitcast=True)
    b = tl.where(x == 0.0, 0, b)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


_BINS = 4096
_PASSES = ((20, 12), (8, 12), (0, 8))  # (shift, width) of the key field each radix pass sorts on


@triton.jit
def _valid_keys(x_ptr, pos, n_valid, DROP_NEG_INF: tl.constexpr):
    x = tl.load(x_ptr + pos, mask=pos < n_valid, other=0.0)
    ok = pos < n_valid
    if DROP_NEG_INF:
        ok = ok & (x != float("-inf"))
    return _order_key(x), ok


@triton.jit
def _range_hist(xr, start, stop, prefix, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
                IN_PREFIX: tl.constexpr, BINS: tl.constexpr, BLOCK: tl.constexpr,
                DROP_NEG_INF: tl.constexpr):
    """Histogram of key bits [SHIFT, SHIFT + WIDTH) of the valid keys at positions [start, stop);
    IN_PREFIX: only the keys whose bits above SHIFT + WIDTH equal prefix."""
    h = tl.zeros((BINS,), tl.int32)
    n_it = tl.cdiv(tl.maximum(stop - start, 0), BLOCK)
    i = 0
    while i < n_it:
        pos = start + i * BLOCK + tl.arange(0, BLOCK)
        key, ok = _valid_keys(xr, pos, stop, DROP_NEG_INF)
        if IN_PREFIX:
            ok = ok & ((key >> (SHIFT + WIDTH)).to(tl.int64) == prefix)
        field = ((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32)
        h += tl.histogram(field, BINS, mask=ok)
        i += 1
    return h


@triton.jit
def _boundary_bin(hist, need_rem, BINS: tl.constexpr):
    """The bin holding the need_rem-th largest key of hist, with its count and the count above it."""
    b = tl.arange(0, BINS)
    ge = tl.cumsum(hist, axis=0, reverse=True)  # ge[b] = number of keys in bins >= b
    bnd = tl.max(tl.where(ge.to(tl.int64) >= need_rem, b, -1), axis=0)
    h_b = tl.sum(tl.where(b == bnd, hist, 0), axis=0).to(tl.int64)
    above = tl.sum(tl.where(b > bnd, hist, 0), axis=0).to(tl.int64)
    return bnd, h_b, above


@triton.jit
def _compact_range(xr, start, stop, shift, bound, eq_take, written, eq_seen, key_out, pos_out,
                   CAP, BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """Append, in position order from slot written, the keys of [start, stop) above the boundary
    (their bits from shift up > bound) and the boundary keys while fewer than eq_take are taken
    (eq_seen counted before start)."""
    n_it = tl.cdiv(tl.maximum(stop - start, 0), BLOCK)
    i = 0
    while i < n_it:
        pos = start + i * BLOCK + tl.arange(0, BLOCK)
        key, ok = _valid_keys(xr, pos, stop, DROP_NEG_INF)
        f = key.to(tl.int64) >> shift
        gt = ok & (f > bound)
        eq = ok & (f == bound)
        eq_i = eq.to(tl.int64)
        sel = gt | (eq & ((eq_seen + tl.cumsum(eq_i, axis=0) - 1) < eq_take))
        sel_i = sel.to(tl.int64)
        slot = written + tl.cumsum(sel_i, axis=0) - 1
        sel = sel & (slot < CAP)
        tl.store(key_out + slot, key.to(tl.int32, bitcast=True), mask=sel)
        tl.store(pos_out + slot, pos, mask=sel)
        written += tl.sum(sel_i, axis=0)
        eq_seen += tl.sum(eq_i, axis=0)
        i += 1


@triton.jit
def _hist_kernel(x_ptr, len_ptr, state_ptr, hist_row_ptr, hist_chunk_ptr, R, N, x_stride, NC, CH,
                 PASS: tl.constexpr, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
                 BINS: tl.constexpr, BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    start = c * CH
    stop = tl.minimum(start + CH, tl.minimum(tl.load(len_ptr + row), N))
    active = 1
    prefix = 0
    if PASS > 0:
        prev = state_ptr + ((PASS - 1) * R + row) * 8
        active = tl.load(prev + 3)
        prefix = tl.load(prev + 2)
        stop = tl.where(active != 0, stop, start)  # a resolved row reads nothing
    h = _range_hist(x_ptr + row * x_stride, start, stop, prefix, SHIFT, WIDTH, PASS > 0, BINS, BLOCK,
                    DROP_NEG_INF)
    b = tl.arange(0, BINS)
    if active != 0:
        tl.store(hist_chunk_ptr + (row * NC + c) * BINS + b, h)
        tl.atomic_add(hist_row_ptr + row * BINS + b, h)


@triton.jit
def _boundary_kernel(hist_row_ptr, hist_chunk_ptr, state_ptr, gt_ptr, eq_ptr, R, N, NC, k,
                     CAP, PASS: tl.constexpr, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
                     LAST: tl.constexpr, BINS: tl.constexpr):
    """Find the bin holding the need-th largest key; per chunk, count keys above it and in it."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    me = state_ptr + (PASS * R + row) * 8
    b = tl.arange(0, BINS)
    hist = tl.load(hist_row_ptr + row * BINS + b)
    if PASS == 0:
        active = 1
        need = tl.minimum(tl.sum(hist, axis=0).to(tl.int64), k)
        need_rem = need
        prefix = tl.zeros((), tl.int64)
        gt_prev = tl.zeros((), tl.int64)
    else:
        prev = state_ptr + ((PASS - 1) * R + row) * 8
        active = tl.load(prev + 3)
        need = tl.load(prev + 0)
        need_rem = tl.load(prev + 1)
        prefix = tl.load(prev + 2)
        gt_prev = tl.load(prev + 6)
        if active == 0:
            if c == 0:
                f = tl.arange(0, 8)
                tl.store(me + f, tl.load(prev + f))
    if active != 0:
        bnd, h_b, above = _boundary_bin(hist, need_rem, BINS)
        gt_total = gt_prev + above
        chunk = tl.load(hist_chunk_ptr + (row * NC + c) * BINS + b)
        gt_c = tl.sum(tl.where(b > bnd, chunk, 0), axis=0)
        eq_c = tl.sum(tl.where(b == bnd, chunk, 0), axis=0)
        if PASS == 0:
            tl.store(gt_ptr + row * NC + c, gt_c)
        else:
            tl.store(gt_ptr + row * NC + c, tl.load(gt_ptr + row * NC + c) + gt_c)
        tl.store(eq_ptr + row * NC + c, eq_c)
        if c == 0:
            fits = (gt_total + h_b) <= CAP
            finish = fits | LAST | (need == 0)
            eq_take = tl.where(need == 0, 0, tl.where(fits, h_b, need - gt_total))
            tl.store(me + 0, need)
            tl.store(me + 1, need - gt_total)
            tl.store(me + 2, prefix * (1 << WIDTH) + bnd)
            tl.store(me + 3, tl.where(finish, 0, 1).to(tl.int64))
            tl.store(me + 4, tl.full((), SHIFT, tl.int64))
            tl.store(me + 5, prefix * (1 << WIDTH) + bnd)
            tl.store(me + 6, gt_total)
            tl.store(me + 7, eq_take)


@triton.jit
def _compact_kernel(x_ptr, len_ptr, state_ptr, gt_ptr, eq_ptr, cand_key_ptr, cand_pos_ptr,
                    R, N, x_stride, NC, CH, CAP, FINAL, NC_PAD: tl.constexpr,
                    BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """Write, in position order, every key above the boundary and the boundary keys taken."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    st = state_ptr + (FINAL * R + row) * 8
    shift = tl.load(st + 4)
    bound = tl.load(st + 5)
    eq_take = tl.load(st + 7)
    ci = tl.arange(0, NC_PAD)
    gts = tl.load(gt_ptr + row * NC + ci, mask=ci < NC, other=0).to(tl.int64)
    eqs = tl.load(eq_ptr + row * NC + ci, mask=ci < NC, other=0).to(tl.int64)
    eq_before = tl.cumsum(eqs, axis=0) - eqs
    taken = tl.minimum(tl.maximum(eq_take - eq_before, 0), eqs)
    tot = gts + taken
    off = tl.cumsum(tot, axis=0) - tot
    my_off = tl.sum(tl.where(ci == c, off, 0), axis=0)
    my_eq_before = tl.sum(tl.where(ci == c, eq_before, 0), axis=0)
    n_valid = tl.minimum(tl.load(len_ptr + row), N)
    start = c * CH
    _compact_range(x_ptr + row * x_stride, start, tl.minimum(start + CH, n_valid), shift, bound,
                   eq_take, my_off, my_eq_before, cand_key_ptr + row * CAP, cand_pos_ptr + row * CAP,
                   CAP, BLOCK, DROP_NEG_INF)


@triton.jit
def _refine(key, sel, tied, need_rem, LO: tl.constexpr, WIDTH: tl.constexpr, BINS: tl.constexpr):
    """One radix pass inside the boundary bin: keys whose bits [LO, LO+WIDTH) are above the bin
    of the need_rem-th largest join the selection; the rest of that bin stays tied."""
    field = ((key >> LO) & ((1 << WIDTH) - 1)).to(tl.int32)
    ge = tl.cumsum(tl.histogram(field, BINS, mask=tied), axis=0, reverse=True)
    bnd = tl.max(tl.where(ge.to(tl.int64) >= need_rem, tl.arange(0, BINS), -1), axis=0)
    above = tied & (field > bnd)
    return sel | above, tied & (field == bnd), need_rem - tl.sum(above.to(tl.int64), axis=0)


@triton.jit
def _final_select(row, key_in, pos_in, need, shift, bound, n_cand, remap_ptr, scratch_ptr, out_ptr,
                  k, out_stride, remap_stride, W, block, CAP: tl.constexpr, K_PAD: tl.constexpr,
                  BINS: tl.constexpr, BY_SCORE: tl.constexpr, REMAP: tl.constexpr,
                  MASK_BLOCK: tl.constexpr):
    """Exact k-th key among a row's n_cand candidates (in position order), ties to the lowest
    position, then the output with its -1 tail (or the blocks' mask)."""
    i = tl.arange(0, CAP)
    ok = i < n_cand
    key = tl.load(key_in + i, mask=ok, other=0).to(tl.uint32, bitcast=True)
    key = key.to(tl.int64)
    pos = tl.load(pos_in + i, mask=ok, other=0).to(tl.int64)
    # keys above the boundary bin are in; resolve the bin's low bits (<= 20) by two radix passes
    sel = ok & ((key >> shift) > bound)
    tied = ok & ((key >> shift) == bound)
    need_rem = need - tl.sum(sel.to(tl.int64), axis=0)
    sel, tied, need_rem = _refine(key, sel, tied, need_rem, 8, 12, BINS)
    sel, tied, need_rem = _refine(key, sel, tied, need_rem, 0, 8, BINS)
    sel = sel | (tied & ((tl.cumsum(tied.to(tl.int64), axis=0) - 1) < need_rem))
    sel = sel & (need > 0)
    _emit_selection(sel, key, pos, row, remap_ptr, scratch_ptr, out_ptr, out_stride, remap_stride, W,
                    block, CAP, K_PAD, BY_SCORE, True, REMAP, MASK_BLOCK)
    if MASK_BLOCK == 0:  # the -1 tail after the min(k, #valid) selected
        kk = tl.arange(0, K_PAD)
        tl.store(out_ptr + row * out_stride + kk, tl.full((K_PAD,), -1, tl.int64),
                 mask=(kk >= need) & (kk < k))


@triton.jit
def _final_kernel(cand_key_ptr, cand_pos_ptr, state_ptr, remap_ptr, scratch_ptr, out_ptr, R, k,
                  out_stride, remap_stride, W, block, FINAL, CAP: tl.constexpr,
                  K_PAD: tl.constexpr, BINS: tl.constexpr, BY_SCORE: tl.constexpr,
                  REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """The selection of each row from its candidates and its final radix state."""
    row = tl.program_id(0)
    st = state_ptr + (FINAL * R + row) * 8
    _final_select(row, cand_key_ptr + row * CAP, cand_pos_ptr + row * CAP, tl.load(st + 0),
                  tl.load(st + 4), tl.load(st + 5), tl.load(st + 6) + tl.load(st + 7), remap_ptr,
                  scratch_ptr, out_ptr, k, out_stride, remap_stride, W, block, CAP, K_PAD, BINS,
                  BY_SCORE, REMAP, MASK_BLOCK)


@triton.jit
def _radix_pass(xr, n, need, bound, gt_total, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
                BINS: tl.constexpr, BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """A later pass of _radix_rows_kernel: refine the boundary bin on bits [SHIFT, SHIFT+WIDTH)."""
    h = _range_hist(xr, 0, n, bound, SHIFT, WIDTH, True, BINS, BLOCK, DROP_NEG_INF)
    bnd, h_b, above = _boundary_bin(h, need - gt_total, BINS)
    return tl.full((), SHIFT, tl.int64), bound * (1 << WIDTH) + bnd, gt_total + above, h_b


@triton.jit
def _radix_rows_kernel(x_ptr, len_ptr, flag_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr, scratch_ptr,
                       out_ptr, N, x_stride, k, out_stride, remap_stride, W, block, flag_stride,
                       CAP: tl.constexpr, K_PAD: tl.constexpr, BINS: tl.constexpr,
                       BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr, BY_SCORE: tl.constexpr,
                       REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """_radix_row in one program per row, for the rows whose flag is set (the others return at
    once and write nothing).  One launch: the sync-free fallback."""
    row = tl.program_id(0)
    if tl.load(flag_ptr + row * flag_stride) != 0:
        _radix_row(row, x_ptr, len_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr, scratch_ptr, out_ptr, N,
                   x_stride, k, out_stride, remap_stride, W, block, CAP, K_PAD, BINS, BLOCK,
                   DROP_NEG_INF, BY_SCORE, REMAP, MASK_BLOCK)


@triton.jit
def _radix_row(row, x_ptr, len_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr, scratch_ptr, out_ptr, N,
               x_stride, k, out_stride, remap_stride, W, block, CAP: tl.constexpr,
               K_PAD: tl.constexpr, BINS: tl.constexpr, BLOCK: tl.constexpr,
               DROP_NEG_INF: tl.constexpr, BY_SCORE: tl.constexpr, REMAP: tl.constexpr,
               MASK_BLOCK: tl.constexpr):
    """The radix engine on one row, in the calling program: the passes of _PASSES (key bits
    20-31, 8-19, 0-7) over the whole row while the boundary bin overflows CAP, the ordered
    compaction into the row's CAP candidate slots, then _final_select."""
    xr = x_ptr + row.to(tl.int64) * x_stride
    n = tl.minimum(tl.load(len_ptr + row), N)
    h = _range_hist(xr, 0, n, 0, 20, 12, False, BINS, BLOCK, DROP_NEG_INF)
    need = tl.minimum(tl.sum(h, axis=0).to(tl.int64), k)
    bnd, h_b, gt_total = _boundary_bin(h, need, BINS)
    shift = tl.full((), 20, tl.int64)
    bound = bnd.to(tl.int64)
    if (gt_total + h_b > CAP) & (need > 0):
        shift, bound, gt_total, h_b = _radix_pass(xr, n, need, bound, gt_total, 8, 12, BINS, BLOCK,
                                                  DROP_NEG_INF)
        if gt_total + h_b > CAP:  # the last pass: the bin is one key value
            shift, bound, gt_total, h_b = _radix_pass(xr, n, need, bound, gt_total, 0, 8, BINS,
                                                      BLOCK, DROP_NEG_INF)
    eq_take = tl.where(need == 0, 0, tl.where(gt_total + h_b <= CAP, h_b, need - gt_total))
    key_row = cand_key_ptr + row * CAP
    pos_row = cand_pos_ptr + row * CAP
    _compact_range(xr, 0, n, shift, bound, eq_take, tl.zeros((), tl.int64), tl.zeros((), tl.int64),
                   key_row, pos_row, CAP, BLOCK, DROP_NEG_INF)
    tl.debug_barrier()  # the candidates are read back by other threads of the program
    _final_select(row, key_row, pos_row, need, shift, bound, gt_total + eq_take, remap_ptr,
                  scratch_ptr, out_ptr, k, out_stride, remap_stride, W, block, CAP, K_PAD,
                  BINS, BY_SCORE, REMAP, MASK_BLOCK)


@triton.jit
def _emit_selection(sel, key, pos, row, remap_ptr, scratch_ptr, out_ptr, out_stride, remap_stride, W,
                    block, CAP: tl.constexpr, K_PAD: tl.constexpr, BY_SCORE: tl.constexpr,
                    ORDERED: tl.constexpr, REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """Write the selected candidates (sel over [CAP]; in position order if ORDERED): positions
    ascending, or by (score desc, position asc), optionally remapped; or the blocks' mask."""
    if MASK_BLOCK > 0:  # candidate_blocks: selected block p marks positions [p*B, p*B+B) of W
        jj = tl.arange(0, MASK_BLOCK)
        p = pos[:, None] * block + jj[None, :]
        tl.store(out_ptr + row * out_stride + p, tl.full((CAP, MASK_BLOCK), 1, tl.int8),
                 mask=sel[:, None] & (jj[None, :] < block) & (p < W))
    else:
        slot = tl.cumsum(sel.to(tl.int64), axis=0) - 1
        if BY_SCORE or not ORDERED:  # order the <= K_PAD chosen by (score desc, position asc),
            n_sel = tl.sum(sel.to(tl.int64), axis=0)  # or by position, via a scratch row
            if BY_SCORE:
                comp = ((key - 0x80000000) << 32) | (0xFFFFFFFF - pos)
            else:
                comp = 0xFFFFFFFF - pos
            tl.store(scratch_ptr + row * K_PAD + slot, comp, mask=sel)
            tl.debug_barrier()
            kk = tl.arange(0, K_PAD)
            comp = tl.load(scratch_ptr + row * K_PAD + kk, mask=kk < n_sel,
                           other=-0x7FFFFFFFFFFFFFFF - 1)
            pos = 0xFFFFFFFF - (comp & 0xFFFFFFFF)
            sel = kk < n_sel
            if K_PAD <= 256:  # rank by counting (composite keys are distinct)
                slot = tl.sum((comp[None, :] > comp[:, None]).to(tl.int64), axis=1)
            else:
                comp = tl.sort(comp, descending=True)
                pos = 0xFFFFFFFF - (comp & 0xFFFFFFFF)
                slot = kk.to(tl.int64)
        if REMAP:
            pos = tl.load(remap_ptr + row * remap_stride + pos, mask=sel, other=0).to(tl.int64)
        tl.store(out_ptr + row * out_stride + slot, pos, mask=sel)


def _topk_config(R: int, N: int):
    """(BLOCK, CH): streaming block and rows' chunk length (a multiple of BLOCK)."""
    if INTERPRET:
        return 1024, 2048
    block = 4096
    ch = max(block, min(65536, triton.next_power_of_2(max(1, R * N // 1024))))
    return block, ch


def _radix_cap(k_pad: int, cap: int | None) -> int:
    """Candidates kept per row by the radix engine (a power of two >= k_pad)."""
    return max(_pow2(cap or min(16384, max(2048, 4 * k_pad))), k_pad)


def _topk_radix(x: torch.Tensor, n_valid: torch.Tensor, k: int, *, by_score: bool = False,
                drop_neg_inf: bool = False, remap: torch.Tensor | None = None,
                mask_out: torch.Tensor | None = None, mask_block: int = 0,
                cap: int | None = None, blocks: tuple[int, int] | None = None
                ) -> torch.Tensor | None:
    """Top-k of each row of x [R,N] (fp32, on the device) among positions < n_valid[r], by radix
    select over the whole row (any input; the fallback of _topk_engine), several programs a row.

    Returns int64 [R,k] (position order, or score order with ties by position; -1 tail), or,
    with mask_out ([R,W] int8, zeroed), marks the selected positions' blocks of mask_block.
    cap (candidates kept per row) and blocks ((BLOCK, CH)) override the defaults for tests.
    """
    R, N = x.shape
    dev = x.device
    k_pad = _pow2(k)
    cap = _radix_cap(k_pad, cap)
    block, ch = blocks or _topk_config(R, N)  # (tests pass small blocks to force many chunks)
    nc = max(1, triton.cdiv(N, ch))
    nc_pad = _pow2(nc)
    hist_row = torch.zeros((len(_PASSES), R, _BINS), dtype=torch.int32, device=dev)
    hist_chunk = torch.empty((R, nc, _BINS), dtype=torch.int32, device=dev)
    # written by _boundary_kernel: state for every row at every pass, gt and eq at pass 0 for every
    # chunk (so no memset; the row histograms are summed by atomics from zero)
    state = torch.empty((len(_PASSES), R, 8), dtype=torch.int64, device=dev)
    gt = torch.empty((R, nc), dtype=torch.int32, device=dev)
    eq = torch.empty((R, nc), dtype=torch.int32, device=dev)
    warps = 4 if INTERPRET else 8
    for p, (shift, width) in enumerate(_PASSES):
        _hist_kernel[(R, nc)](x, n_valid, state, hist_row[p], hist_chunk, R, N, x.stride(0), nc, ch,
                              PASS=p, SHIFT=shift, WIDTH=width, BINS=_BINS, BLOCK=block,
                              DROP_NEG_INF=drop_neg_inf, num_warps=warps)
        _boundary_kernel[(R, nc)](hist_row[p], hist_chunk, state, gt, eq, R, N, nc, k, cap,
                                  PASS=p, SHIFT=shift, WIDTH=width, LAST=p == len(_PASSES) - 1,
                                  BINS=_BINS, num_warps=warps)
        final = p
        # The remaining passes are no-ops for rows already resolved; on the CPU (interpreter)
        # reading the flags is free, on a GPU it would cost a synchronization.
        if INTERPRET and not bool(state[p, :, 3].any()):
            break
    cand_key = torch.empty((R, cap), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((R, cap), dtype=torch.int32, device=dev)
    _compact_kernel[(R, nc)](x, n_valid, state, gt, eq, cand_key, cand_pos, R, N, x.stride(0), nc,
                             ch, cap, final, NC_PAD=nc_pad, BLOCK=block, DROP_NEG_INF=drop_neg_inf,
                             num_warps=warps)
    out = mask_out if mask_out is not None else torch.empty((R, k), dtype=torch.int64, device=dev)
    scratch, out_args, consts = _output_args(out, mask_out is not None, mask_block, by_score, remap, k_pad)
    _final_kernel[(R,)](cand_key, cand_pos, state, out_args[0], scratch, out, R, k, *out_args[1:], final,
                        CAP=cap, K_PAD=k_pad, BINS=_BINS, **consts, num_warps=warps)
    return None if mask_out is not None else out


def _output_args(out, mask: bool, mask_block: int, by_score: bool, remap, k_pad: int):
    """What _final_select writes through: (scratch, (remap table, out_stride, remap_stride, W,
    block), constexprs), for out int64 [R,k] or (mask) the int8 block mask."""
    dev = out.device
    if mask:
        return torch.empty((1,), dtype=torch.int64, device=dev), \
            (out, out.stride(0), 0, out.shape[1], mask_block), \
            dict(BY_SCORE=False, REMAP=False, MASK_BLOCK=_pow2(mask_block))
    scratch = torch.empty((out.shape[0], k_pad) if by_score else (1,), dtype=torch.int64, device=dev)
    table = remap if remap is not None else out
    return scratch, (table, out.stride(0), 0 if remap is None else remap.stride(0), 0, 0), \
        dict(BY_SCORE=by_score, REMAP=remap is not None, MASK_BLOCK=0)


def _topk_radix_rows(x: torch.Tensor, n_valid: torch.Tensor, k: int, flag: torch.Tensor,
                     out: torch.Tensor, *, by_score: bool = False, drop_neg_inf: bool = False,
                     remap: torch.Tensor | None = None, mask: bool = False, mask_block: int = 0,
                     cap: int | None = None, block: int | None = None) -> None:
    """The radix engine in one launch of one program per row, serving only the rows whose flag
    (int32 [R], any stride) is nonzero and writing into out (int64 [R,k], or the zeroed int8
    block mask with mask); the other rows' programs return at once and write nothing.  The
    sync-free fallback of _topk_engine: for the common case (no row flagged) it costs one launch."""
    R, N = x.shape
    dev = x.device
    k_pad = _pow2(k)
    cap = _radix_cap(k_pad, cap)
    block = block or _topk_config(R, N)[0]
    cand_key = torch.empty((R, cap), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((R, cap), dtype=torch.int32, device=dev)
    scratch, out_args, consts = _output_args(out, mask, mask_block, by_score, remap, k_pad)
    _radix_rows_kernel[(R,)](x, n_valid, flag, cand_key, cand_pos, out_args[0], scratch, out, N,
                             x.stride(0), k, *out_args[1:], flag.stride(0), CAP=cap, K_PAD=k_pad,
                             BINS=_BINS, BLOCK=block, DROP_NEG_INF=drop_neg_inf, **consts,
                             num_warps=4 if INTERPRET else 8)


# Threshold filter (the fast path of _topk_engine).  Cut each row into groups of G positions and
# take each group's largest key; if k groups have a maximum >= t, at least k keys are >= t.  So a
# radix select on the top 16 bits of the group maxima gives a threshold t (<= the k-th largest key)
# that lets through about 1.1 k keys of random data.  One streaming pass appends the keys >= t to
# the row's candidates (slots reserved per candidate or per run of positions by atomic adds; the
# tile keeps one register layout, so no warp waits for another), and one program per row finds
# the exact k-th key K among them (its top 16 bits by one histogram relative to t's, which the
# candidates' span fits for all but clustered data; 8-bit digits otherwise) and, when keys equal
# to K straddle the k-th place, the last position taken among them by digits of the position.
# The chosen leave in position order through a bitmap of the row, or a sort.  Threshold and
# select read their lists SUB entries a pass (8-bit histograms, a few scalars carried), so a
# program is small and many share an SM when rows are many and short.  The result depends only on the candidate
# set, never on the slot order: deterministic.  Rows whose candidates overflow the cap (heavy
# ties, adversarial order) are redone by _topk_radix.

_MAX_GROUPS = 16384        # group maxima a row may have (more: the radix engine serves it)
_DIGIT = 256               # 8-bit digits
# The position order comes from a bitmap of the row (one program scans its N/32 words) where that
# is at most 4 words a pick, else from tl.sort of the picks.  H200, 12-01: 1x65536 and 1x262144,
# k 2048: 64 / 67 us by bitmap against 73 / 75 by sort; 1x1M k 2048: 76 both; 1x1M k 512 (64
# words a pick): 50 against 29.
_BITMAP_WORDS_PER_PICK = 4


@dataclasses.dataclass(frozen=True)
class FilterTune:
    """The threshold filter's tunables (bench/sweep_topk.py times a grid of them)."""
    block: int           # positions per tile of the two streaming passes
    ch: int              # positions of a row per streaming program (a multiple of block)
    run: int             # positions per slot reservation (at most block, and divides it)
    prefetch: bool       # both streaming passes load tile i+1 before finishing tile i
    warps: int           # warps of the streaming passes
    sub: int             # group maxima / candidates the threshold and select read per step
    threshold_warps: int
    select_warps: int


_FILTER_OVERRIDE: dict = {}   # FilterTune fields set by filter_tuning (the sweep, tests)


@contextlib.contextmanager
def filter_tuning(**fields):
    """Within the block, the threshold filter uses these FilterTune fields instead of the defaults."""
    unknown = set(fields) - {f.name for f in dataclasses.fields(FilterTune)}
    if unknown:
        raise TypeError(f"filter_tuning: unknown fields {sorted(unknown)}")
    saved = dict(_FILTER_OVERRIDE)
    _FILTER_OVERRIDE.update(fields)
    try:
        yield
    finally:
        _FILTER_OVERRIDE.clear()
        _FILTER_OVERRIDE.update(saved)


def _filter_config(R: int, N: int, k: int, blocks=None) -> FilterTune:
    """The default tunables for top-k of R rows of N, then filter_tuning's overrides, then blocks
    ((BLOCK, CH), tests)."""
    if INTERPRET:
        tune = FilterTune(block=1024, ch=2048, run=1, prefetch=True, warps=4, sub=256,
                          threshold_warps=4, select_warps=4)
    else:
        # 48 registers: 5 programs of 8 warps an SM, 2 tiles each in flight; many rows: tiles of
        # 1024 (the 11-30 sweep: 1.10x at 1024x64K, 1.12x at block selection [1024, 262144])
        block = 1024 if R > 132 else 2048
        ch = max(block, min(65536, triton.next_power_of_2(max(1, R * N // 1024))))
        G, cap = _filter_plan(N, k, block, None, None) or (block, 0)
        if R > 132:  # more rows than SMs: small per-row programs, many resident an SM
            tune = FilterTune(block=block, ch=ch, run=1, prefetch=True, warps=8, sub=1024,
                              threshold_warps=8, select_warps=8)   # select: 64 registers
        else:        # one program per row and SM: wide steps
            tune = FilterTune(block=block, ch=ch, run=1, prefetch=True, warps=8, sub=4096,
                              threshold_warps=8 if _pow2(triton.cdiv(N, G)) <= 4096 else 16,
                              select_warps=8 if cap <= 2048 else 16)
    tune = dataclasses.replace(tune, **_FILTER_OVERRIDE)
    if blocks is not None:
        tune = dataclasses.replace(tune, block=blocks[0], ch=blocks[1])
    tune = dataclasses.replace(tune, run=min(tune.run, tune.block))
    if tune.ch % tune.block or tune.block % tune.run:
        raise ValueError(f"filter tunables: ch must be a multiple of block and block of run, got {tune}")
    return tune


@triton.jit
def _row_keys(x_ptr, pos, tile_end, stop, DROP_NEG_INF: tl.constexpr):
    """Order keys of x at pos (a tile ending at tile_end), 0 where pos >= stop (or x = -inf when
    dropped): every valid key is >= 1.  Full tiles load without a mask."""
    if tile_end <= stop:
        x = tl.load(x_ptr + pos)
    else:
        x = tl.load(x_ptr + pos, mask=pos < stop, other=0.0)
    ok = pos < stop
    if DROP_NEG_INF:
        ok = ok & (x != float("-inf"))
    return tl.where(ok, _order_key(x), 0)


@triton.jit
def _group_max_kernel(x_ptr, len_ptr, gmax_ptr, N, x_stride, M, CH, G: tl.constexpr,
                      BLOCK: tl.constexpr, PREFETCH: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """gmax[r, g] = the largest valid key among positions [g*G, g*G + G) (0: none valid; a chunk
    holds whole groups, so masking at the chunk's end is masking at the row's).  (The
    store of the tile's BLOCK/G maxima converts their layout through shared memory, one barrier
    a tile; with PREFETCH the next tile's loads are already in flight across it.)"""
    _group_max_chunk(tl.program_id(0), tl.program_id(1), x_ptr, len_ptr, gmax_ptr, N, x_stride, M,
                     CH, G, BLOCK, PREFETCH, DROP_NEG_INF)


@triton.jit
def _group_max_chunk(row, c, x_ptr, len_ptr, gmax_ptr, N, x_stride, M, CH, G: tl.constexpr,
                     BLOCK: tl.constexpr, PREFETCH: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """_group_max_kernel's work for chunk c of row, in the calling program."""
    stop = tl.minimum(tl.load(len_ptr + row), N)
    start = c * CH
    end = tl.minimum(start + CH, stop)
    xr = x_ptr + row.to(tl.int64) * x_stride
    off = tl.arange(0, BLOCK // G)[:, None] * G + tl.arange(0, G)[None, :]   # [groups, G]
    p = start
    key = _row_keys(xr, p + off, p + BLOCK, end, DROP_NEG_INF)
    while p < end:
        if PREFETCH:
            key_next = _row_keys(xr, p + BLOCK + off, p + 2 * BLOCK, end, DROP_NEG_INF)
        g = p // G + tl.arange(0, BLOCK // G)
        tl.store(gmax_ptr + row * M + g, tl.max(key, axis=1).to(tl.int32, bitcast=True), mask=g < M)
        p += BLOCK
        if PREFETCH:
            key = key_next
        else:
            key = _row_keys(xr, p + off, p + BLOCK, end, DROP_NEG_INF)


@triton.jit
def _filter_kernel(x_ptr, len_ptr, thr_ptr, cand_key_ptr, cand_pos_ptr, count_ptr, N, x_stride, CH,
                   CAP, BLOCK: tl.constexpr, RUN: tl.constexpr, PREFETCH: tl.constexpr,
                   DROP_NEG_INF: tl.constexpr):
    """Every key >= thr of the row into cand[r, :CAP]: each run of RUN positions that holds n of
    them takes slots [b, b + n) by one atomic add of n to count[r] (counted beyond CAP too; RUN =
    1: one add per candidate, which ptxas aggregates per warp: one ATOMG and a shuffle per 32
    positions holding candidates) and places them there in position order.  Slot order depends
    on timing, the set does not: the select kernel only uses the set.

    The tile is [RUN, BLOCK // RUN], a run per column, and its loads are 4-byte (contiguity 1):
    then loads, counts, atomics and stores share one layout, a run of 32 is one warp's column (its
    count and ranks are warp shuffles) and nothing crosses warps.  With 16-byte loads every tile
    paid a layout conversion through shared memory and two barriers (the 178 us of 11-30).
    (Reading only the groups whose maximum reaches thr measured slower: 205 against 178 us.)"""
    _filter_chunk(tl.program_id(0), tl.program_id(1), x_ptr, len_ptr, thr_ptr, cand_key_ptr,
                  cand_pos_ptr, count_ptr, N, x_stride, CH, CAP, BLOCK, RUN, PREFETCH, DROP_NEG_INF)


@triton.jit
def _filter_chunk(row, c, x_ptr, len_ptr, thr_ptr, cand_key_ptr, cand_pos_ptr, count_ptr, N, x_stride,
                  CH, CAP, BLOCK: tl.constexpr, RUN: tl.constexpr, PREFETCH: tl.constexpr,
                  DROP_NEG_INF: tl.constexpr):
    """_filter_kernel's work for chunk c of row, in the calling program."""
    stop = tl.minimum(tl.load(len_ptr + row), N)
    t = tl.load(thr_ptr + row).to(tl.uint32, bitcast=True)
    start = c * CH
    end = tl.minimum(start + CH, stop)
    xr = x_ptr + row.to(tl.int64) * x_stride
    if RUN == 1:
        j = 0
        off = tl.max_contiguous(tl.arange(0, BLOCK), 1)
    else:
        j = tl.arange(0, RUN)[:, None]
        off = tl.max_contiguous(j + tl.arange(0, BLOCK // RUN)[None, :] * RUN, [1, 1])
    counter = count_ptr + 2 * row + off * 0
    dst = row * CAP
    p = start
    key = _row_keys(xr, p + off, p + BLOCK, end, DROP_NEG_INF)
    while p < end:
        if PREFETCH:  # in flight while this tile waits for its slots
            key_next = _row_keys(xr, p + BLOCK + off, p + 2 * BLOCK, end, DROP_NEG_INF)
        sel = key >= t
        if RUN == 1:
            slot = tl.atomic_add(counter, 1, mask=sel, sem="relaxed")
        else:
            s = sel.to(tl.int32)
            n = tl.sum(s, axis=0)[None, :]
            lead = (j == 0) & (n > 0)   # one lane reserves for its run
            base = tl.atomic_add(counter, n, mask=lead, sem="relaxed")
            slot = tl.sum(tl.where(lead, base, 0), axis=0)[None, :] + tl.cumsum(s, axis=0) - 1
        m = sel & (slot < CAP)
        tl.store(cand_key_ptr + dst + slot, key.to(tl.int32, bitcast=True), mask=m)
        tl.store(cand_pos_ptr + dst + slot, p + off, mask=m)
        p += BLOCK
        if PREFETCH:
            key = key_next
        else:
            key = _row_keys(xr, p + off, p + BLOCK, end, DROP_NEG_INF)


@triton.jit
def _list_keys(key_ptr, i, n):
    """Entries i of a list of n keys, as uint32 (0 past its end), and which of them exist."""
    ok = i < n
    return tl.load(key_ptr + i, mask=ok, other=0).to(tl.uint32, bitcast=True), ok


@triton.jit
def _digit_pass(key_ptr, pos_ptr, n, prefix, need, key_eq, LO: tl.constexpr, BY_POS: tl.constexpr,
                SUB: tl.constexpr, BINS: tl.constexpr):
    """One 8-bit radix pass over a list read SUB entries at a time: among the values whose bits
    above LO + 8 equal prefix, find the digit [LO, LO + 8) of the need-th largest.  Values: the
    keys (0, an empty group, excluded), or with BY_POS the reversed positions 0x7FFFFFFF - pos of
    the keys equal to key_eq.  Returns (prefix extended by that digit, need minus the values
    above it, how many values hold it, the largest value & (2^LO - 1) among those matching prefix,
    how many values matched prefix)."""
    h = tl.zeros((BINS,), tl.int32)
    low = tl.zeros((), tl.uint32)
    s = 0
    while s < n:
        i = s + tl.arange(0, SUB)
        key, ok = _list_keys(key_ptr, i, n)
        if BY_POS:
            v = (0x7FFFFFFF - tl.load(pos_ptr + i, mask=ok, other=0)).to(tl.uint32)
            ok = ok & (key == key_eq)
        else:
            v = key
            ok = ok & (key != 0)
        if LO + 8 < 32:
            ok = ok & ((v >> (LO + 8)) == prefix)
        h += tl.histogram(((v >> LO) & (BINS - 1)).to(tl.int32), BINS, mask=ok)
        if LO > 0:
            low = tl.maximum(low, tl.max(tl.where(ok, v & ((1 << LO) - 1), 0), axis=0))
        s += SUB
    bnd, h_b, above = _boundary_bin(h, need, BINS)
    return (prefix.to(tl.uint32) << 8) | bnd.to(tl.uint32), need - above, h_b, low, tl.sum(h, axis=0)


@triton.jit
def _top16_pass(key_ptr, n, base, need, SUB: tl.constexpr, BINS: tl.constexpr):
    """The top 16 bits of the need-th largest of n keys that are all >= base << 16, by one
    histogram of (key >> 16) - base whose last bin takes everything from base + BINS - 1 up.
    Returns (those 16 bits, or -1 when the need-th key falls in the last bin; need minus the keys
    above it; how many keys share its 16 bits; the largest low 16 bits of any key)."""
    h = tl.zeros((BINS,), tl.int32)
    low = tl.zeros((), tl.uint32)
    s = 0
    while s < n:
        key, ok = _list_keys(key_ptr, s + tl.arange(0, SUB), n)
        h += tl.histogram(tl.minimum((key >> 16) - base, BINS - 1).to(tl.int32), BINS, mask=ok)
        low = tl.maximum(low, tl.max(tl.where(ok, key & 0xFFFF, 0), axis=0))
        s += SUB
    bnd, tied, above = _boundary_bin(h, need, BINS)
    top = tl.where(bnd < BINS - 1, base.to(tl.int32) + bnd, -1)
    return top, need - above, tied, low


@triton.jit
def _threshold_kernel(gmax_ptr, len_ptr, thr_ptr, count_ptr, N, M, k, G, SUB: tl.constexpr,
                      BINS: tl.constexpr):
    """thr[r] = the k-th largest group maximum with its low 16 bits cleared (uint32 bits); 1
    (every valid key) when fewer than k groups hold a valid key.  Zeroes the row's candidate
    count and flag."""
    _threshold_row(tl.program_id(0), gmax_ptr, len_ptr, thr_ptr, count_ptr, N, M, k, G, SUB, BINS)


@triton.jit
def _threshold_row(row, gmax_ptr, len_ptr, thr_ptr, count_ptr, N, M, k, G, SUB: tl.constexpr,
                   BINS: tl.constexpr):
    """_threshold_kernel's work for row, in the calling program."""
    tl.store(count_ptr + 2 * row + tl.arange(0, 2), tl.zeros((2,), tl.int32))
    n_groups = tl.cdiv(tl.minimum(tl.load(len_ptr + row), N), G)
    gk = gmax_ptr + row * M
    need = tl.zeros((), tl.int64) + k
    zero = tl.zeros((), tl.uint32)
    t, need, _, _, valid = _digit_pass(gk, gk, n_groups, zero, need, zero, 24, False, SUB, BINS)
    t, need, _, _, _ = _digit_pass(gk, gk, n_groups, t, need, zero, 16, False, SUB, BINS)
    t = t << 16
    tl.store(thr_ptr + row, tl.where((valid >= k) & (t > 0), t, 1).to(tl.int32, bitcast=True))


@triton.jit
def _select_kernel(cand_key_ptr, cand_pos_ptr, count_ptr, thr_ptr, remap_ptr, scratch_ptr, out_ptr,
                   k, out_stride, remap_stride, W, block, NW, CAP: tl.constexpr, K_PAD: tl.constexpr,
                   SUB: tl.constexpr, BINS: tl.constexpr, BY_SCORE: tl.constexpr,
                   REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr, POS_24: tl.constexpr,
                   BITMAP: tl.constexpr):
    """Exact top-k among a row's candidates (in any order, every key >= thr[r]), read SUB at a
    time: the k-th key K by one histogram of its top 16 bits relative to thr's (two 8-bit digits
    where the span is too wide), two more digits when keys have low bits (fp32), and when the
    keys equal to K straddle the k-th place, the last position P taken among them (lowest first)
    by digits of the reversed position; the chosen are key > K, or key = K and position <= P.
    Or flag[r] = 1 when the candidates did not fit (count[r, 1] = 1; then
    nothing is written).  Output: positions ascending, through a bitmap of NW words (BITMAP) or a
    scratch row of the chosen and a sort; (score desc, position asc) through the scratch row and a
    sort; or the chosen blocks' mask."""
    row = tl.program_id(0)
    total = tl.load(count_ptr + 2 * row)
    if total > CAP:
        tl.store(count_ptr + 2 * row + 1, 1)
    else:
        _select_row(row, total, cand_key_ptr, cand_pos_ptr, thr_ptr, remap_ptr, scratch_ptr, out_ptr,
                    k, out_stride, remap_stride, W, block, NW, CAP, K_PAD, SUB, BINS, BY_SCORE, REMAP,
                    MASK_BLOCK, POS_24, BITMAP)


@triton.jit
def _select_row(row, total, cand_key_ptr, cand_pos_ptr, thr_ptr, remap_ptr, scratch_ptr, out_ptr, k,
                out_stride, remap_stride, W, block, NW, CAP: tl.constexpr, K_PAD: tl.constexpr,
                SUB: tl.constexpr, BINS: tl.constexpr, BY_SCORE: tl.constexpr, REMAP: tl.constexpr,
                MASK_BLOCK: tl.constexpr, POS_24: tl.constexpr, BITMAP: tl.constexpr):
    """_select_kernel's work for a row whose total candidates fit CAP, in the calling program."""
    ck = cand_key_ptr + row * CAP
    cp = cand_pos_ptr + row * CAP
    need = tl.minimum(total, k).to(tl.int64)
    base = tl.load(thr_ptr + row).to(tl.uint32, bitcast=True) >> 16
    top, rem, tied, low = _top16_pass(ck, total, base, need, SUB, BINS)
    if top < 0:  # the k-th key lies beyond the histogram's span: two digits from scratch
        kth = tl.zeros((), tl.uint32)
        kth, rem, tied, _, _ = _digit_pass(ck, cp, total, kth, need, kth, 24, False, SUB, BINS)
        kth, rem, tied, low, _ = _digit_pass(ck, cp, total, kth, rem, kth, 16, False, SUB, BINS)
    else:
        kth = top.to(tl.uint32)
    if low != 0:
        kth, rem, tied, _, _ = _digit_pass(ck, cp, total, kth, rem, kth, 8, False, SUB, BINS)
        kth, rem, tied, _, _ = _digit_pass(ck, cp, total, kth, rem, kth, 0, False, SUB, BINS)
    else:  # (BF16 scores end here) every key of the bin has low 16 bits 0
        kth = kth << 16
    last = tl.zeros((), tl.int32) + 0x7FFFFFFF
    if tied > rem:  # ties straddle the k-th key: positions are unique, their digits decide
        if POS_24:  # positions < 2^24: the top digit of 0x7FFFFFFF - pos is 0x7F
            rp = tl.zeros((), tl.uint32) + 0x7F
        else:
            rp = tl.zeros((), tl.uint32)
            rp, rem, _, _, _ = _digit_pass(ck, cp, total, rp, rem, kth, 24, True, SUB, BINS)
        rp, rem, _, _, _ = _digit_pass(ck, cp, total, rp, rem, kth, 16, True, SUB, BINS)
        rp, rem, _, _, _ = _digit_pass(ck, cp, total, rp, rem, kth, 8, True, SUB, BINS)
        rp, rem, _, _, _ = _digit_pass(ck, cp, total, rp, rem, kth, 0, True, SUB, BINS)
        last = 0x7FFFFFFF - rp.to(tl.int32)
    if need == 0:
        kth = tl.zeros((), tl.uint32) + 0xFFFFFFFF
        last = tl.zeros((), tl.int32) - 1
    if MASK_BLOCK > 0:
        _mark_blocks(ck, cp, total, kth, last, row, out_ptr, out_stride, W, block, SUB, MASK_BLOCK)
    elif BITMAP:
        _emit_by_bitmap(ck, cp, total, kth, last, row, scratch_ptr, remap_ptr, out_ptr, k, NW,
                        out_stride, remap_stride, SUB, REMAP)
    else:
        _emit_sorted(ck, cp, total, kth, last, row, scratch_ptr, remap_ptr, out_ptr, k,
                     out_stride, remap_stride, SUB, K_PAD, BY_SCORE, REMAP)


@triton.jit
def _mark_blocks(ck, cp, total, kth, last, row, out_ptr, out_stride, W, block, SUB: tl.constexpr,
                 MASK_BLOCK: tl.constexpr):
    """candidate_blocks: each chosen block p marks positions [p*block, p*block + block) of W."""
    jj = tl.arange(0, MASK_BLOCK)
    s = 0
    while s < total:
        sel, _, pos = _chosen(ck, cp, s + tl.arange(0, SUB), total, kth, last)
        p = pos[:, None] * block + jj[None, :]
        tl.store(out_ptr + row * out_stride + p, tl.full((SUB, MASK_BLOCK), 1, tl.int8),
                 mask=sel[:, None] & (jj[None, :] < block) & (p < W))
        s += SUB


@triton.jit
def _emit_sorted(ck, cp, total, kth, last, row, scratch_ptr, remap_ptr, out_ptr, k, out_stride,
                 remap_stride, SUB: tl.constexpr, K_PAD: tl.constexpr, BY_SCORE: tl.constexpr,
                 REMAP: tl.constexpr):
    """out[row] = the chosen, positions ascending (int32 values) or by (score desc, position asc)
    (int64 composites, distinct), -1 up to k: compacted into the scratch row, then sorted."""
    written = tl.zeros((), tl.int32)
    s = 0
    while s < total:
        sel, key, pos = _chosen(ck, cp, s + tl.arange(0, SUB), total, kth, last)
        slot = written + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        if BY_SCORE:
            val = ((key.to(tl.int64) - 0x80000000) << 32) | (0xFFFFFFFF - pos.to(tl.int64))
        else:
            val = pos
        tl.store(scratch_ptr + row * K_PAD + slot, val, mask=sel)
        written += tl.sum(sel.to(tl.int32), axis=0)
        s += SUB
    tl.debug_barrier()
    _write_sorted(scratch_ptr + row * K_PAD, written, remap_ptr + row * remap_stride, out_ptr + row * out_stride,
                  k, K_PAD, BY_SCORE, REMAP)


@triton.jit
def _write_sorted(scratch_row, written, remap_row, out_row, k, K_PAD: tl.constexpr, BY_SCORE: tl.constexpr,
                  REMAP: tl.constexpr):
    """out_row = the written entries of scratch_row sorted: (score desc, position asc) composites
    (BY_SCORE) or positions ascending, as positions (remapped), -1 up to k."""
    kk = tl.arange(0, K_PAD)
    chosen = kk < written
    if BY_SCORE:
        comp = tl.load(scratch_row + kk, mask=chosen, other=-0x7FFFFFFFFFFFFFFF - 1)
        if K_PAD <= 256:  # rank by counting
            slot = tl.sum((comp[None, :] > comp[:, None]).to(tl.int32), axis=1)
        else:
            comp = tl.sort(comp, descending=True)
            slot = kk
        pos = (0xFFFFFFFF - (comp & 0xFFFFFFFF)).to(tl.int32)
    else:
        pos = tl.load(scratch_row + kk, mask=chosen, other=0x7FFFFFFF)
        if K_PAD <= 256:
            slot = tl.sum((pos[None, :] < pos[:, None]).to(tl.int32), axis=1)
        else:
            pos = tl.sort(pos)
            slot = kk
    if REMAP:
        pos = tl.load(remap_row + pos, mask=chosen, other=0)
    tl.store(out_row + slot, pos.to(tl.int64), mask=chosen)
    tl.store(out_row + kk, tl.full((K_PAD,), -1, tl.int64), mask=(kk >= written) & (kk < k))


@triton.jit
def _popcount(v):
    """Set bits of each uint32 (SWAR: the same integer steps on the GPU and in the interpreter)."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _bit_of(pos):
    """Position pos's bit in its bitmap word (word pos >> 5): 1 << (pos & 31), uint32."""
    return tl.full(pos.shape, 1, tl.uint32) << (pos & 31).to(tl.uint32)


@triton.jit
def _chosen(ck, cp, i, total, kth, last):
    """Which candidates i (< total) the select keeps (key > K, or key = K at position <= P), their
    keys and positions."""
    key, ok = _list_keys(ck, i, total)
    pos = tl.load(cp + i, mask=ok, other=0)
    return ok & ((key > kth) | ((key == kth) & (pos <= last))), key, pos


@triton.jit
def _emit_by_bitmap(ck, cp, total, kth, last, row, scratch_ptr, remap_ptr, out_ptr, k, NW,
                    out_stride, remap_stride, SUB: tl.constexpr, REMAP: tl.constexpr):
    """out[row] = the chosen positions ascending, -1 up to k, without sorting them: each chosen
    position p sets bit p of a bitmap (the scratch row's first NW words), an exclusive scan of the
    words' popcounts (its next NW words) gives the rank of each word's first chosen bit, and p goes
    to that rank plus the chosen bits below it in its word.  (The bitmap is read back from L2,
    .cg: the atomics that set it are performed there.)"""
    bits = scratch_ptr + row.to(tl.int64) * (2 * NW)
    first = bits + NW
    s = 0
    while s < NW:
        i = s + tl.arange(0, SUB)
        tl.store(bits + i, tl.zeros((SUB,), tl.int32), mask=i < NW)
        s += SUB
    tl.debug_barrier()
    s = 0
    while s < total:
        sel, _, pos = _chosen(ck, cp, s + tl.arange(0, SUB), total, kth, last)
        tl.atomic_or(bits + (pos >> 5), _bit_of(pos).to(tl.int32, bitcast=True), mask=sel, sem="relaxed")
        s += SUB
    tl.debug_barrier()
    n_sel = tl.zeros((), tl.int32)
    s = 0
    while s < NW:
        i = s + tl.arange(0, SUB)
        word = tl.load(bits + i, mask=i < NW, other=0, cache_modifier=".cg")
        c = _popcount(word.to(tl.uint32, bitcast=True))
        tl.store(first + i, n_sel + tl.cumsum(c, axis=0) - c, mask=i < NW)
        n_sel += tl.sum(c, axis=0)
        s += SUB
    tl.debug_barrier()
    s = 0
    while s < total:
        sel, _, pos = _chosen(ck, cp, s + tl.arange(0, SUB), total, kth, last)
        word = tl.load(bits + (pos >> 5), mask=sel, other=0, cache_modifier=".cg")
        below = word.to(tl.uint32, bitcast=True) & (_bit_of(pos) - 1)
        rank = tl.load(first + (pos >> 5), mask=sel, other=0, cache_modifier=".cg") + _popcount(below)
        if REMAP:
            pos = tl.load(remap_ptr + row * remap_stride + pos, mask=sel, other=0)
        tl.store(out_ptr + row * out_stride + rank, pos.to(tl.int64), mask=sel)
        s += SUB
    s = n_sel
    while s < k:
        i = s + tl.arange(0, SUB)
        tl.store(out_ptr + row * out_stride + i, tl.full((SUB,), -1, tl.int64), mask=i < k)
        s += SUB


def _filter_plan(N: int, k: int, block: int, group: int | None, cap: int | None):
    """(G, CAP) of the threshold filter, or None where it cannot serve (too many groups)."""
    k_pad = _pow2(k)
    if group is None:  # about 4k groups: the threshold lets through ~1.1 k random keys
        group = 1 << max(0, (N // (4 * k_pad)).bit_length() - 1)
    group = min(_pow2(group), block)
    cap = max(_pow2(cap or 2 * k_pad), k_pad)
    if _pow2(triton.cdiv(N, group)) > _MAX_GROUPS:
        return None
    return group, cap


TOPK_PATHS = ("auto", "fused", "launches")
_TOPK_PATH = [os.environ.get("DSV4SPEC_TOPK_PATH", "auto")]   # the env var: the A/B's other sides
# "auto" takes the fused path eagerly on calls of up to this many scores (R·N).  H200, 12-03
# (docs/records/h200/2026-12-03-ab-topk-mid-rows.txt, -many-rows.txt), eager µs fused / launches: 8×1M
# 134 / 337 and 64×256K 196 / 324 (16M scores: the launches path pays its five launches' host
# time), 512×64K 673 / 263, 1024×32K 585 / 194, 64×1M 469 / 270, 1024×64K 1442 / 476 (32M and
# more: the fused kernels' longer device time is no longer hidden behind the host's).
_FUSED_MAX_SCORES = 1 << 24
if _TOPK_PATH[0] not in TOPK_PATHS:
    raise ValueError(f"DSV4SPEC_TOPK_PATH must be one of {TOPK_PATHS}, got {_TOPK_PATH[0]!r}")


@contextlib.contextmanager
def topk_path(name: str):
    """Within the block, _topk_engine takes path name: "auto" (the default: "fused" eagerly on up
    to _FUSED_MAX_SCORES scores, "launches" on more and inside a CUDA graph capture), "fused"
    (eagerly on every shape) or "launches" (the four launches of the filter, then the radix
    fallback's launch or read-back, as before 12-02)."""
    if name not in TOPK_PATHS:
        raise ValueError(f"topk_path: expected one of {TOPK_PATHS}, got {name!r}")
    saved = _TOPK_PATH[0]
    _TOPK_PATH[0] = name
    try:
        yield
    finally:
        _TOPK_PATH[0] = saved


def _topk_engine(x: torch.Tensor, n_valid: torch.Tensor, k: int, *, by_score: bool = False,
                 drop_neg_inf: bool = False, remap: torch.Tensor | None = None,
                 mask_out: torch.Tensor | None = None, mask_block: int = 0,
                 group: int | None = None, cap: int | None = None,
                 blocks: tuple[int, int] | None = None, sync: bool = True) -> torch.Tensor | None:
    """Top-k of each row of x [R,N] (fp32, on the device) among positions < n_valid[r] (int32).

    Returns int64 [R,k] (position order, or score order with ties by position; -1 tail), or,
    with mask_out ([R,W] int8, zeroed), marks the selected positions' blocks of mask_block.
    The threshold filter serves every row it can; the rows it flags go through a radix engine:
    sync=True reads the flags back to the host and, only when a row is flagged, runs _topk_radix
    (several programs a row) on those rows: no extra launch in the common case, one
    synchronization.  sync=False launches _topk_radix_rows (one program a row), whose programs of
    unflagged rows return at once: one extra launch, no read-back, so the call can be captured in
    a CUDA graph.  Both give the same bits: the selection is unique (ties to the lowest position).
    group (G), cap (candidates per row) and blocks ((BLOCK, CH)) override the filter's defaults
    for tests.

    Few rows of long rows (_few_rows_serve; the switch few_rows, DSV4SPEC_FEW_ROWS) go through
    neither: _topk_few_rows spreads the select over the rows' chunks (a launch a key digit, then
    the emission; nothing read back), the same bits.

    That is the "launches" path.  The "fused" path (topk_path; the default's eager calls of up to
    _FUSED_MAX_SCORES scores) runs the same filter and select, and the radix engine on the rows
    whose candidates overflow, in one launch where a row is one program's and two otherwise, never
    reading back (sync has no effect), with its workspaces cached per shape and its launch
    configuration computed once per shape: the same bits.
    """
    R, N = x.shape
    mask = mask_out is not None
    if _few_rows_serve(x, k):
        out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
        if R:
            _topk_few_rows(x, n_valid, k, out, by_score=by_score, drop_neg_inf=drop_neg_inf, remap=remap,
                           mask=mask, mask_block=mask_block, blocks=blocks)
        return None if mask else out
    if _fused_serves(x):
        override = tuple(sorted(_FILTER_OVERRIDE.items())) if _FILTER_OVERRIDE else ()
        plan = _fused_plan(R, N, k, by_score, drop_neg_inf, remap is not None, mask, mask_block, group,
                           cap, blocks, override)
        if plan is not None:
            out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
            if R:
                _topk_fused(plan, x, n_valid, out, remap, mask)
            return None if mask else out
    out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
    fallback = dict(by_score=by_score, drop_neg_inf=drop_neg_inf, mask_block=mask_block)
    flag = _topk_filter(x, n_valid, k, out, remap=remap, mask=mask, group=group, cap=cap,
                        blocks=blocks, **fallback)
    if flag is None:
        return _topk_radix(x, n_valid, k, remap=remap, mask_out=mask_out, **fallback)
    if not sync:
        _topk_radix_rows(x, n_valid, k, flag, out, remap=remap, mask=mask, **fallback)
    elif bool(flag.any()):   # (the one read back: did the filter leave rows?)
        redo = torch.nonzero(flag).flatten()
        if not mask:
            out[redo] = _topk_radix(x[redo], n_valid[redo], k,
                                    remap=None if remap is None else remap[redo], **fallback)
        else:
            sub = torch.zeros_like(mask_out[redo])
            _topk_radix(x[redo], n_valid[redo], k, mask_out=sub, **fallback)
            mask_out[redo] = sub
    return None if mask else out


def _fused_serves(x: torch.Tensor) -> bool:
    """Whether _topk_engine takes the fused path on x (topk_path's modes).  Measured on the H200
    (docs/records/h200/2026-12-02-ab-topk.json): the fused path costs less host time (eager 103 against
    471 µs at 1×1M k 512) but more device time (graph 49 against 33 µs), so a CUDA-graph capture,
    where host time is paid once, takes the launches path, and so do large eager calls
    (_FUSED_MAX_SCORES).  Same bits."""
    mode = _TOPK_PATH[0]
    if mode == "launches" or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    return mode == "fused" or x.numel() <= _FUSED_MAX_SCORES


def _filter_shape(R: int, N: int, k: int, group, cap, blocks):
    """(tunables, G, CAP, k rounded up to a power of two, group maxima a row) of the filter on R
    rows of N; None where it cannot serve them."""
    tune = _filter_config(R, N, k, blocks)
    plan = _filter_plan(N, k, tune.block, group, cap)
    if plan is None:
        return None
    return (tune, *plan, _pow2(k), triton.cdiv(N, plan[0]))


def _topk_filter(x, n_valid, k: int, out, *, by_score: bool, drop_neg_inf: bool, remap, mask: bool,
                 mask_block: int, group, cap, blocks) -> torch.Tensor | None:
    """The threshold filter's launches, writing the rows it serves into out; returns int32 [R]
    flags of the rows it could not serve (None: it serves none of this shape)."""
    R, N = x.shape
    dev = x.device
    shape = _filter_shape(R, N, k, group, cap, blocks)
    if shape is None:
        return None
    tune, G, cap, k_pad, M = shape
    nc = triton.cdiv(N, tune.ch)
    gmax = torch.empty((R, M), dtype=torch.int32, device=dev)
    _group_max_kernel[(R, nc)](x, n_valid, gmax, N, x.stride(0), M, tune.ch, G=G, BLOCK=tune.block,
                               PREFETCH=tune.prefetch, DROP_NEG_INF=drop_neg_inf,
                               num_warps=tune.warps)
    thr = torch.empty((R,), dtype=torch.int32, device=dev)
    count = torch.empty((R, 2), dtype=torch.int32, device=dev)   # candidates, overflow flag
    _threshold_kernel[(R,)](gmax, n_valid, thr, count, N, M, k, G, SUB=min(tune.sub, _pow2(M)),
                            BINS=_DIGIT, num_warps=tune.threshold_warps)
    cand_key = torch.empty((R, cap), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((R, cap), dtype=torch.int32, device=dev)
    _filter_kernel[(R, nc)](x, n_valid, thr, cand_key, cand_pos, count, N, x.stride(0), tune.ch,
                            cap, BLOCK=tune.block, RUN=tune.run, PREFETCH=tune.prefetch,
                            DROP_NEG_INF=drop_neg_inf, num_warps=tune.warps)
    nw = triton.cdiv(N, 32)   # the position-order bitmap's words: scanned, so only for short rows
    bitmap = not (mask or by_score) and nw <= _BITMAP_WORDS_PER_PICK * k_pad
    scratch = torch.empty((1,) if mask else (R, 2 * nw) if bitmap else (R, k_pad),
                          dtype=torch.int64 if by_score else torch.int32, device=dev)
    _select_kernel[(R,)](cand_key, cand_pos, count, thr, cand_pos if remap is None else remap,
                         scratch, out, k, out.stride(0), 0 if remap is None else remap.stride(0),
                         out.shape[1] if mask else 0, mask_block, nw, CAP=cap, K_PAD=k_pad,
                         SUB=min(tune.sub, cap), BINS=_DIGIT, POS_24=N <= 1 << 24,
                         BY_SCORE=by_score, REMAP=remap is not None,
                         MASK_BLOCK=_pow2(mask_block) if mask else 0, BITMAP=bitmap,
                         num_warps=tune.select_warps)
    return count[:, 1]


# ------------------------------------------------------------------------------------------------
# The fused path (the default's eager path up to _FUSED_MAX_SCORES): the threshold filter and its
# radix fallback in one launch where a row is one program's (chunks of CH >= N), else in two, with the workspaces cached.  Two launches:
# the programs of a row count their arrival on a per-row counter, and the last to arrive (which then
# sees every other program's stores: the count is an acquire-release atomic after a barrier) does
# the row's serial stage: the threshold after the group maxima, the select (or, when the candidates
# overflowed, the radix engine on the whole row) after the filter, and resets the counter for the
# next call.  No program waits for another, so it holds at any grid size and in the interpreter.
# Same candidates, same select: the bits of the launches path below.
# ------------------------------------------------------------------------------------------------
@triton.jit
def _finish_row(row, x_ptr, len_ptr, thr_ptr, count_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr,
                scratch_ptr, out_ptr, N, x_stride, k, out_stride, remap_stride, W, block, NW,
                CAP: tl.constexpr, K_PAD: tl.constexpr, SUB: tl.constexpr, BINS: tl.constexpr,
                RBINS: tl.constexpr, RBLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr,
                BY_SCORE: tl.constexpr, REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr,
                POS_24: tl.constexpr, BITMAP: tl.constexpr):
    """The row's output from its filtered candidates, or (count[r, 1] = 1) from the whole row by
    the radix engine, into the same candidate slots, when they overflowed CAP.  (The count is read
    by an atomic: the filter's atomics are performed in L2.)"""
    total = tl.atomic_add(count_ptr + 2 * row, 0, sem="relaxed")
    if total > CAP:
        tl.store(count_ptr + 2 * row + 1, 1)
        _radix_row(row, x_ptr, len_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr, scratch_ptr, out_ptr, N,
                   x_stride, k, out_stride, remap_stride, W, block, CAP, K_PAD, RBINS, RBLOCK,
                   DROP_NEG_INF, BY_SCORE, REMAP, MASK_BLOCK)
    else:
        _select_row(row, total, cand_key_ptr, cand_pos_ptr, thr_ptr, remap_ptr, scratch_ptr, out_ptr,
                    k, out_stride, remap_stride, W, block, NW, CAP, K_PAD, SUB, BINS, BY_SCORE, REMAP,
                    MASK_BLOCK, POS_24, BITMAP)


@triton.jit
def _row_topk_kernel(x_ptr, len_ptr, gmax_ptr, thr_ptr, count_ptr, cand_key_ptr, cand_pos_ptr,
                     remap_ptr, scratch_ptr, out_ptr, x_stride, out_stride, remap_stride, W, N, M, k,
                     CH, block, NW, G: tl.constexpr, CAP: tl.constexpr, K_PAD: tl.constexpr,
                     BLOCK: tl.constexpr, RUN: tl.constexpr, PREFETCH: tl.constexpr,
                     TSUB: tl.constexpr, SUB: tl.constexpr, BINS: tl.constexpr,
                     RBINS: tl.constexpr, RBLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr,
                     BY_SCORE: tl.constexpr, REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr,
                     POS_24: tl.constexpr, BITMAP: tl.constexpr):
    """The whole engine on one row per program (CH >= N): group maxima, threshold, filter, then
    _finish_row, a barrier between stages (each reads what other threads of the program wrote)."""
    row = tl.program_id(0)
    _group_max_chunk(row, 0, x_ptr, len_ptr, gmax_ptr, N, x_stride, M, CH, G, BLOCK, PREFETCH,
                     DROP_NEG_INF)
    tl.debug_barrier()
    _threshold_row(row, gmax_ptr, len_ptr, thr_ptr, count_ptr, N, M, k, G, TSUB, BINS)
    tl.debug_barrier()
    _filter_chunk(row, 0, x_ptr, len_ptr, thr_ptr, cand_key_ptr, cand_pos_ptr, count_ptr, N, x_stride,
                  CH, CAP, BLOCK, RUN, PREFETCH, DROP_NEG_INF)
    tl.debug_barrier()
    _finish_row(row, x_ptr, len_ptr, thr_ptr, count_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr,
                scratch_ptr, out_ptr, N, x_stride, k, out_stride, remap_stride, W, block, NW, CAP,
                K_PAD, SUB, BINS, RBINS, RBLOCK, DROP_NEG_INF, BY_SCORE, REMAP, MASK_BLOCK, POS_24,
                BITMAP)


@triton.jit
def _last_to_arrive(arrive_ptr, row, NC):
    """Whether this program is the last of the row's NC to get here (after a barrier: every thread's
    stores are ordered before the release)."""
    tl.debug_barrier()
    return tl.atomic_add(arrive_ptr + row, 1, sem="acq_rel") == NC - 1


@triton.jit
def _max_threshold_kernel(x_ptr, len_ptr, gmax_ptr, thr_ptr, count_ptr, arrive_ptr, x_stride, N, M, k,
                          CH, NC, G: tl.constexpr, BLOCK: tl.constexpr, PREFETCH: tl.constexpr,
                          TSUB: tl.constexpr, BINS: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """Launch 1 of 2: chunk c's group maxima; the row's last program takes the threshold."""
    row = tl.program_id(0)
    _group_max_chunk(row, tl.program_id(1), x_ptr, len_ptr, gmax_ptr, N, x_stride, M, CH, G, BLOCK,
                     PREFETCH, DROP_NEG_INF)
    if _last_to_arrive(arrive_ptr, row, NC):
        _threshold_row(row, gmax_ptr, len_ptr, thr_ptr, count_ptr, N, M, k, G, TSUB, BINS)
        tl.atomic_xchg(arrive_ptr + row, 0, sem="relaxed")


@triton.jit
def _filter_finish_kernel(x_ptr, len_ptr, thr_ptr, count_ptr, arrive_ptr, cand_key_ptr, cand_pos_ptr,
                          remap_ptr, scratch_ptr, out_ptr, x_stride, out_stride, remap_stride, W, N,
                          k, CH, NC, block, NW, CAP: tl.constexpr, K_PAD: tl.constexpr,
                          BLOCK: tl.constexpr, RUN: tl.constexpr, PREFETCH: tl.constexpr,
                          SUB: tl.constexpr, BINS: tl.constexpr, RBINS: tl.constexpr,
                          RBLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr, BY_SCORE: tl.constexpr,
                          REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr, POS_24: tl.constexpr,
                          BITMAP: tl.constexpr):
    """Launch 2 of 2: chunk c's candidates; the row's last program runs _finish_row."""
    row = tl.program_id(0)
    _filter_chunk(row, tl.program_id(1), x_ptr, len_ptr, thr_ptr, cand_key_ptr, cand_pos_ptr, count_ptr,
                  N, x_stride, CH, CAP, BLOCK, RUN, PREFETCH, DROP_NEG_INF)
    if _last_to_arrive(arrive_ptr, row, NC):
        _finish_row(row, x_ptr, len_ptr, thr_ptr, count_ptr, cand_key_ptr, cand_pos_ptr, remap_ptr,
                    scratch_ptr, out_ptr, N, x_stride, k, out_stride, remap_stride, W, block, NW, CAP,
                    K_PAD, SUB, BINS, RBINS, RBLOCK, DROP_NEG_INF, BY_SCORE, REMAP, MASK_BLOCK,
                    POS_24, BITMAP)
        tl.atomic_xchg(arrive_ptr + row, 0, sem="relaxed")


@dataclasses.dataclass(frozen=True)
class _FusedPlan:
    """What a fused top-k call of one shape launches, computed once (_fused_plan)."""
    rows: int            # R
    gmax_cols: int       # M
    cap: int
    scratch: tuple       # (columns, dtype) of the select's scratch row
    grid: tuple          # (R,): one launch; (R, programs a row): two
    ints: tuple          # the launches' integer arguments after the strides and W
    max_ints: tuple      # those of _max_threshold_kernel after x_stride
    consts: dict         # the constexprs of _row_topk_kernel / _filter_finish_kernel
    max_consts: dict     # those of _max_threshold_kernel
    warps: tuple         # num_warps of (the one launch or launch 2, launch 1)
    workspaces: dict = dataclasses.field(default_factory=dict, compare=False)  # _workspace's


# Rows up to this length are one program's in the fused path (one launch); longer rows are cut into
# the filter's chunks (two launches).  Under the interpreter, rows the tests and rules draw go both
# ways.  H200, 12-02: at 1×64K k 2048 one program took 117 / 131 µs eager / graph, the two
# launches 85 / 68 (docs/records/h200/2026-12-02-ab-topk.json); rows below 4096 were not measured.
_ONE_PROGRAM_ROW = 1024 if INTERPRET else 4096


@functools.lru_cache(maxsize=512)
def _fused_plan(R: int, N: int, k: int, by_score: bool, drop_neg_inf: bool, remap: bool, mask: bool,
                mask_block: int, group, cap, blocks, override: tuple) -> _FusedPlan | None:
    """The fused launches' configuration for one shape (override: filter_tuning's fields, part of
    the cache key); None where the filter cannot serve the shape."""
    shape = _filter_shape(R, N, k, group, cap, blocks)
    if shape is None:
        return None
    tune, G, cap, k_pad, M = shape
    ch = tune.ch
    if N <= _ONE_PROGRAM_ROW and blocks is None and "ch" not in dict(override):
        ch = triton.cdiv(N, tune.block) * tune.block
    nc = triton.cdiv(N, ch)
    nw = triton.cdiv(N, 32)
    bitmap = not (mask or by_score) and nw <= _BITMAP_WORDS_PER_PICK * k_pad
    scratch = (1 if mask else 2 * nw if bitmap else k_pad, torch.int64 if by_score else torch.int32)
    rblock = blocks[0] if blocks else _topk_config(R, N)[0]
    common = dict(BLOCK=tune.block, PREFETCH=tune.prefetch, BINS=_DIGIT, DROP_NEG_INF=drop_neg_inf)
    consts = dict(common, CAP=cap, K_PAD=k_pad, RUN=tune.run, SUB=min(tune.sub, cap), RBINS=_BINS,
                  RBLOCK=rblock, BY_SCORE=by_score, REMAP=remap, MASK_BLOCK=_pow2(mask_block) if mask else 0,
                  POS_24=N <= 1 << 24, BITMAP=bitmap)
    tsub = min(tune.sub, _pow2(M))
    block = mask_block if mask else 0
    if nc == 1:
        consts.update(G=G, TSUB=tsub)
        grid, ints = (R,), (N, M, k, ch, block, nw)
        warps = (max(tune.warps, tune.threshold_warps, tune.select_warps), 0)
    else:
        grid, ints = (R, nc), (N, k, ch, nc, block, nw)
        warps = (max(tune.warps, tune.select_warps), max(tune.warps, tune.threshold_warps))
    return _FusedPlan(rows=R, gmax_cols=M, cap=cap, scratch=scratch, grid=grid, ints=ints,
                      max_ints=(N, M, k, ch, nc), consts=consts, max_consts=dict(common, G=G, TSUB=tsub),
                      warps=warps)


# Workspaces a CUDA graph captured: kept for the process's life, since a replay writes them even
# after _fused_plan's cache has let their plan go.
_CAPTURED: dict = {}


def _workspace(x: torch.Tensor, plan, make=None):
    """make(x, plan)'s workspace (default: the fused path's gmax, thr, count, cand_key, cand_pos,
    scratch, arrive 1, arrive 2) for plan, made once per device and current stream (calls on one
    stream run in order, so they can share them) and kept with the plan.  The arrival counters
    start at zero and every call leaves them at zero."""
    make = make or _new_workspace
    dev = x.get_device()
    key = (dev, torch._C._cuda_getCurrentRawStream(dev) if dev >= 0 else 0)
    ws = plan.workspaces.get(key)
    if dev >= 0 and torch.cuda.is_current_stream_capturing():
        ws = ws or make(x, plan)
        plan.workspaces[key] = _CAPTURED[tuple(t.data_ptr() for t in ws)] = ws
    if ws is None:
        ws = plan.workspaces[key] = make(x, plan)
    return ws


def _new_workspace(x: torch.Tensor, plan: _FusedPlan):
    r, dev = plan.rows, x.device
    i32 = dict(dtype=torch.int32, device=dev)
    return (torch.empty((r, plan.gmax_cols), **i32), torch.empty((r,), **i32), torch.empty((r, 2), **i32),
            torch.empty((r, plan.cap), **i32), torch.empty((r, plan.cap), **i32),
            torch.empty((r, plan.scratch[0]), dtype=plan.scratch[1], device=dev),
            torch.zeros((r,), **i32), torch.zeros((r,), **i32))


def clear_workspaces():
    """Forget the fused path's plans and the workspaces kept with them (not those a CUDA graph
    captured: they stay while the process lives)."""
    _fused_plan.cache_clear()
    _few_plan.cache_clear()


def _topk_fused(plan: _FusedPlan, x, n_valid, out, remap, mask: bool):
    """The fused path's one or two launches for plan, writing out."""
    gmax, thr, count, cand_key, cand_pos, scratch, arrive1, arrive2 = _workspace(x, plan)
    table, remap_stride = (cand_pos, 0) if remap is None else (remap, remap.stride(0))
    strides = (x.stride(0), out.stride(0), remap_stride, out.shape[1] if mask else 0)
    if len(plan.grid) == 1:
        _row_topk_kernel[plan.grid](x, n_valid, gmax, thr, count, cand_key, cand_pos, table, scratch, out,
                                    *strides, *plan.ints, **plan.consts, num_warps=plan.warps[0])
        return
    _max_threshold_kernel[plan.grid](x, n_valid, gmax, thr, count, arrive1, strides[0], *plan.max_ints,
                                     **plan.max_consts, num_warps=plan.warps[1])
    _filter_finish_kernel[plan.grid](x, n_valid, thr, count, arrive2, cand_key, cand_pos, table, scratch,
                                     out, *strides, *plan.ints, **plan.consts, num_warps=plan.warps[0])


# ------------------------------------------------------------------------------------------------
# Few rows (issue 23; docs/records/h200/TOPK.md, design item 1): at 1 to 64 rows the filter's threshold
# and select are one program a row, a single SM walking >= 2k candidates through serial digit
# passes while the rest of the machine idles.  Here every stage is spread over the row's chunks:
# _few_pass_kernel, once a digit of the key (_FEW_DIGITS, high to low), has each program histogram
# the digit among its chunk's keys that match the row's prefix so far and add that histogram to the
# row's by atomics; the last program of the row to arrive picks the boundary digit (the one holding
# the rem-th largest key), extends the prefix, and updates every chunk's count of keys above the
# prefix (gt) and matching it (eq) from the chunks' stored suffix sums.  A row is done once its
# boundary bin is taken whole or the prefix is the whole key: K, and how many keys equal to K (the
# lowest positions) are taken.  _few_emit_kernel then writes the picks at once: each chunk's first
# slot is a prefix sum of the chunks' counts, and a chunk places its picks in position order
# (V4.1), or into a scratch row the row's last program sorts by (score desc, position asc) (V4),
# or marks their blocks.  len(_FEW_DIGITS) + 1 launches, nothing read back, the workspaces cached
# per shape and stream as the fused path's, the row histograms and arrival counters left at zero
# by every call.  Same keys (_row_keys: ±0 one key, −inf kept or dropped), same unique selection
# (ties to the lowest position): the engine's bits.
# ------------------------------------------------------------------------------------------------
_FEW_DIGITS = [(8, 8, 8, 8)]   # digit widths, high to low (sum 32); the A/B also times (11, 11, 10)
FEW_ROWS_MODES = ("auto", "always", "on", "off")
_FEW_ROWS = [os.environ.get("DSV4SPEC_FEW_ROWS", "auto")]   # "off": the engine as before
if _FEW_ROWS[0] not in FEW_ROWS_MODES:
    raise ValueError(f"DSV4SPEC_FEW_ROWS must be one of {FEW_ROWS_MODES}, got {_FEW_ROWS[0]!r}")
# "auto" serves, inside a CUDA graph capture, what the H200 A/B (docs/records/h200/2026-12-02-ab-topk-few.txt)
# measured faster than the shipped graph path: one row of at least _FEW_ROWS_MIN_N positions with
# k >= _FEW_ROWS_MIN_K (1x64K k 2048: 62 -> 35 us; 1x1M k 2048: 75 -> 56 us).  Slower there:
# 1x1M k 512 (31 -> 51 us: the fused filter leaves few candidates) and 8 or 64 rows (96 -> 274 and
# 265 -> 1952 us at 1M: each pass re-reads the chunks still on the prefix).  Eagerly a call pays its
# five launches on the host (two in the fused path): "always" serves the same shapes eagerly too.
_FEW_ROWS_MAX = 1
_FEW_ROWS_MIN_N = 32768
_FEW_ROWS_MIN_K = 2048
_FEW_PROGRAMS = 512            # programs a call aims at (a chunk each)


@contextlib.contextmanager
def few_rows(mode: str, digits: tuple | None = None):
    """Within the block, _topk_engine's few-row passes serve the shapes of mode: "auto" (the
    default: one long row with k >= 2048 inside a CUDA graph capture, where the A/B measured them
    faster), "always" (those rows eagerly too), "on" (every shape: the tests, the A/B) or "off"
    (none), with
    digits (widths, high to low, summing to 32) in place of _FEW_DIGITS when given."""
    if mode not in FEW_ROWS_MODES:
        raise ValueError(f"few_rows: expected one of {FEW_ROWS_MODES}, got {mode!r}")
    if digits is not None and (sum(digits) != 32 or min(digits) < 1):
        raise ValueError(f"few_rows: digits must be positive widths summing to 32, got {digits}")
    saved = _FEW_ROWS[0], _FEW_DIGITS[0]
    _FEW_ROWS[0], _FEW_DIGITS[0] = mode, tuple(digits or _FEW_DIGITS[0])
    try:
        yield
    finally:
        _FEW_ROWS[0], _FEW_DIGITS[0] = saved


def _few_rows_serve(x: torch.Tensor, k: int) -> bool:
    mode = _FEW_ROWS[0]
    if mode in ("on", "off"):
        return mode == "on"
    R, N = x.shape
    few = R <= _FEW_ROWS_MAX and N >= _FEW_ROWS_MIN_N and k >= _FEW_ROWS_MIN_K
    return few and (mode == "always" or (x.is_cuda and torch.cuda.is_current_stream_capturing()))


@triton.jit
def _few_pass_kernel(x_ptr, len_ptr, zeroed_ptr, ge_ptr, chunk_ptr, state_ptr, N, x_stride, k, CH, NC,
                     PASS: tl.constexpr, SHIFT: tl.constexpr, WIDTH: tl.constexpr, LAST: tl.constexpr,
                     BINS: tl.constexpr, NC_PAD: tl.constexpr, BLOCK: tl.constexpr,
                     DROP_NEG_INF: tl.constexpr):
    """Digit PASS (key bits [SHIFT, SHIFT + WIDTH)) of chunk c of a row: its histogram among the keys
    that match the row's prefix, stored as suffix sums (ge[r, c, b]: keys of the chunk with digit
    >= b) and added to the row's histogram; the row's last program to arrive runs _few_boundary.
    A chunk without a matching key (or a row already done) reads nothing."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    st = state_ptr + row * 8
    zeroed = zeroed_ptr + row * (BINS + 1)   # the row histogram, then the arrival counter
    live = 1
    prefix = tl.zeros((), tl.int64)
    if PASS > 0:
        live = tl.load(st + 3) * tl.load(chunk_ptr + (row * NC + c) * 2 + 1)
        prefix = tl.load(st + 2)
    if live != 0:
        stop = tl.minimum(tl.load(len_ptr + row), N)
        h = _few_chunk_hist(x_ptr + row.to(tl.int64) * x_stride, c * CH, tl.minimum(c * CH + CH, stop), prefix,
                            PASS > 0, SHIFT, WIDTH, BINS, BLOCK, DROP_NEG_INF)
        b = tl.arange(0, BINS)
        tl.store(ge_ptr + (row * NC + c) * BINS + b, tl.cumsum(h, axis=0, reverse=True))
        tl.atomic_add(zeroed + b, h, mask=h != 0, sem="relaxed")
    if _last_to_arrive(zeroed + BINS, 0, NC):
        _few_boundary(row, zeroed, ge_ptr, chunk_ptr, st, NC, k, PASS, SHIFT, WIDTH, LAST, BINS, NC_PAD)
        tl.atomic_xchg(zeroed + BINS, 0, sem="relaxed")


@triton.jit
def _few_chunk_hist(xr, start, stop, prefix, IN_PREFIX: tl.constexpr, SHIFT: tl.constexpr,
                    WIDTH: tl.constexpr, BINS: tl.constexpr, BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """Histogram of key bits [SHIFT, SHIFT + WIDTH) of the valid keys at [start, stop); IN_PREFIX:
    only those whose bits from SHIFT + WIDTH up equal prefix."""
    h = tl.zeros((BINS,), tl.int32)
    p = start
    while p < stop:
        pos = p + tl.arange(0, BLOCK)
        key = _row_keys(xr, pos, p + BLOCK, stop, DROP_NEG_INF)
        ok = key != 0
        if IN_PREFIX:
            ok = ok & ((key >> (SHIFT + WIDTH)).to(tl.int64) == prefix)
        h += tl.histogram(((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32), BINS, mask=ok)
        p += BLOCK
    return h


@triton.jit
def _few_boundary(row, hist_ptr, ge_ptr, chunk_ptr, st, NC, k, PASS: tl.constexpr, SHIFT: tl.constexpr,
                  WIDTH: tl.constexpr, LAST: tl.constexpr, BINS: tl.constexpr, NC_PAD: tl.constexpr):
    """The row's boundary digit from its histogram (which it leaves at zero): the state (need, rem,
    prefix, active, shift) and every chunk's (gt, eq) of the extended prefix.  (Read through L2,
    .cg: the other programs' atomics and stores are performed there.)"""
    b = tl.arange(0, BINS)
    hist = tl.load(hist_ptr + b, cache_modifier=".cg")
    tl.store(hist_ptr + b, tl.zeros((BINS,), tl.int32))
    if PASS == 0:
        need = tl.minimum(tl.sum(hist, axis=0).to(tl.int64), k)
        rem = need
        prefix = tl.zeros((), tl.int64)
        active = 1
    else:
        need = tl.load(st + 0)
        rem = tl.load(st + 1)
        prefix = tl.load(st + 2)
        active = tl.load(st + 3)
    if active != 0:
        bnd, h_b, above = _boundary_bin(hist, rem, BINS)
        rem -= above
        done = LAST | (h_b == rem)   # the last digit, or the boundary bin taken whole (need 0 too)
        ci = tl.arange(0, NC_PAD)
        cell = chunk_ptr + (row * NC + ci) * 2
        live = ci < NC
        gt = tl.zeros((NC_PAD,), tl.int32)
        if PASS > 0:
            gt = tl.load(cell, mask=live, other=0, cache_modifier=".cg")
            live = live & (tl.load(cell + 1, mask=live, other=0, cache_modifier=".cg") != 0)
        ge_row = ge_ptr + (row * NC + ci) * BINS
        ge_at = tl.load(ge_row + bnd, mask=live, other=0, cache_modifier=".cg")
        ge_above = tl.load(ge_row + bnd + 1, mask=live & (bnd + 1 < BINS), other=0, cache_modifier=".cg")
        tl.store(cell, gt + ge_above, mask=ci < NC)
        tl.store(cell + 1, ge_at - ge_above, mask=ci < NC)
        tl.store(st + 0, need)
        tl.store(st + 1, rem)
        tl.store(st + 2, prefix * (1 << WIDTH) + bnd)
        tl.store(st + 3, tl.where(done, 0, 1).to(tl.int64))
        tl.store(st + 4, tl.full((), SHIFT, tl.int64))


@triton.jit
def _few_emit_kernel(x_ptr, len_ptr, zeroed_ptr, chunk_ptr, state_ptr, remap_ptr, scratch_ptr, out_ptr, N,
                     x_stride, k, out_stride, remap_stride, W, block, CH, NC, BINS: tl.constexpr,
                     NC_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr,
                     DROP_NEG_INF: tl.constexpr, BY_SCORE: tl.constexpr, REMAP: tl.constexpr,
                     MASK_BLOCK: tl.constexpr):
    """Chunk c's picks: every key whose bits from shift up exceed the prefix, and the keys equal to
    it while the row's first rem are taken, at slots from the prefix sum of the chunks' counts
    before c: positions ascending into out (-1 after need), or into the scratch row the last
    program sorts (BY_SCORE), or their blocks marked (MASK_BLOCK)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    st = state_ptr + row * 8
    need = tl.load(st + 0)
    rem = tl.load(st + 1)
    prefix = tl.load(st + 2)
    shift = tl.load(st + 4)
    ci = tl.arange(0, NC_PAD)
    gts = tl.load(chunk_ptr + (row * NC + ci) * 2, mask=ci < NC, other=0).to(tl.int64)
    eqs = tl.load(chunk_ptr + (row * NC + ci) * 2 + 1, mask=ci < NC, other=0).to(tl.int64)
    eq_before = tl.cumsum(eqs, axis=0) - eqs
    picks = gts + tl.minimum(tl.maximum(rem - eq_before, 0), eqs)
    mine = ci == c
    if tl.sum(tl.where(mine, picks, 0), axis=0) * need != 0:
        slot0 = tl.sum(tl.where(mine, tl.cumsum(picks, axis=0) - picks, 0), axis=0)
        stop = tl.minimum(tl.load(len_ptr + row), N)
        _few_place(x_ptr + row.to(tl.int64) * x_stride, c * CH, tl.minimum(c * CH + CH, stop), shift, prefix,
                   rem, slot0, tl.sum(tl.where(mine, eq_before, 0), axis=0), row, remap_ptr, scratch_ptr,
                   out_ptr, out_stride, remap_stride, W, block, K_PAD, BLOCK, DROP_NEG_INF, BY_SCORE, REMAP,
                   MASK_BLOCK)
    if BY_SCORE:
        if _last_to_arrive(zeroed_ptr + row * (BINS + 1) + BINS, 0, NC):
            _write_sorted(scratch_ptr + row * K_PAD, need, remap_ptr + row * remap_stride,
                          out_ptr + row * out_stride, k, K_PAD, True, REMAP)
            tl.atomic_xchg(zeroed_ptr + row * (BINS + 1) + BINS, 0, sem="relaxed")
    elif MASK_BLOCK == 0:
        if c == 0:
            s = need
            while s < k:
                i = s + tl.arange(0, SUB)
                tl.store(out_ptr + row * out_stride + i, tl.full((SUB,), -1, tl.int64), mask=i < k)
                s += SUB


@triton.jit
def _few_place(xr, start, stop, shift, prefix, rem, written, eq_seen, row, remap_ptr, scratch_ptr, out_ptr,
               out_stride, remap_stride, W, block, K_PAD: tl.constexpr, BLOCK: tl.constexpr,
               DROP_NEG_INF: tl.constexpr, BY_SCORE: tl.constexpr, REMAP: tl.constexpr,
               MASK_BLOCK: tl.constexpr):
    """_few_emit_kernel's placement of the picks of [start, stop), from slot written (eq_seen keys
    equal to the prefix before start)."""
    p = start
    while p < stop:
        pos = p + tl.arange(0, BLOCK)
        key = _row_keys(xr, pos, p + BLOCK, stop, DROP_NEG_INF)
        f = key.to(tl.int64) >> shift
        eq = (key != 0) & (f == prefix)
        eq_i = eq.to(tl.int64)
        sel = ((key != 0) & (f > prefix)) | (eq & (eq_seen + tl.cumsum(eq_i, axis=0) <= rem))
        sel_i = sel.to(tl.int64)
        slot = written + tl.cumsum(sel_i, axis=0) - 1
        if MASK_BLOCK > 0:
            jj = tl.arange(0, MASK_BLOCK)
            m = pos[:, None] * block + jj[None, :]
            tl.store(out_ptr + row * out_stride + m, tl.full((BLOCK, MASK_BLOCK), 1, tl.int8),
                     mask=sel[:, None] & (jj[None, :] < block) & (m < W))
        elif BY_SCORE:
            comp = ((key.to(tl.int64) - 0x80000000) << 32) | (0xFFFFFFFF - pos.to(tl.int64))
            tl.store(scratch_ptr + row * K_PAD + slot, comp, mask=sel)
        else:
            val = pos.to(tl.int64)
            if REMAP:
                val = tl.load(remap_ptr + row * remap_stride + pos, mask=sel, other=0).to(tl.int64)
            tl.store(out_ptr + row * out_stride + slot, val, mask=sel)
        written += tl.sum(sel_i, axis=0)
        eq_seen += tl.sum(eq_i, axis=0)
        p += BLOCK


@dataclasses.dataclass(frozen=True)
class _FewPlan:
    """What a few-row top-k call of one shape launches, computed once (_few_plan)."""
    rows: int
    chunks: int          # NC: programs a row
    bins: int            # the widest digit's bins
    scratch: int         # int64 columns of the sorting scratch row (1: none)
    passes: tuple        # (PASS, SHIFT, WIDTH, LAST) a launch
    ints: tuple          # (CH, NC)
    consts: dict         # the constexprs both kernels take
    emit_consts: dict    # the emission's own
    warps: int
    workspaces: dict = dataclasses.field(default_factory=dict, compare=False)


def _few_config(R: int, N: int, blocks) -> tuple[int, int]:
    """(BLOCK, CH): a tile, and a chunk (a program) sized for about _FEW_PROGRAMS programs."""
    if blocks is not None:
        return blocks
    if INTERPRET:
        return 1024, 2048
    block = 2048
    return block, max(block, min(1 << 16, _pow2(R * N // _FEW_PROGRAMS)))


@functools.lru_cache(maxsize=512)
def _few_plan(R: int, N: int, k: int, by_score: bool, drop_neg_inf: bool, remap: bool, mask: bool,
              mask_block: int, blocks, digits: tuple) -> _FewPlan:
    block, ch = _few_config(R, N, blocks)
    nc = max(1, triton.cdiv(N, ch))
    bins = 1 << max(digits)
    shifts = [32 - sum(digits[:p + 1]) for p in range(len(digits))]
    passes = tuple((p, shifts[p], w, p == len(digits) - 1) for p, w in enumerate(digits))
    k_pad = _pow2(k)
    return _FewPlan(rows=R, chunks=nc, bins=bins, scratch=k_pad if by_score and not mask else 1, passes=passes,
                    ints=(ch, nc), consts=dict(BINS=bins, NC_PAD=_pow2(nc), BLOCK=block, DROP_NEG_INF=drop_neg_inf),
                    emit_consts=dict(K_PAD=k_pad, SUB=min(1024, k_pad), BY_SCORE=by_score and not mask,
                                     REMAP=remap, MASK_BLOCK=_pow2(mask_block) if mask else 0),
                    warps=4 if INTERPRET else 8)


def _new_few_workspace(x: torch.Tensor, plan: _FewPlan):
    """(row histograms and arrival counters: zeroed, suffix sums, chunk counts, row state, scratch)."""
    r, nc, dev = plan.rows, plan.chunks, x.device
    return (torch.zeros((r, plan.bins + 1), dtype=torch.int32, device=dev),
            torch.empty((r, nc, plan.bins), dtype=torch.int32, device=dev),
            torch.empty((r, nc, 2), dtype=torch.int32, device=dev),
            torch.empty((r, 8), dtype=torch.int64, device=dev),
            torch.empty((r, plan.scratch), dtype=torch.int64, device=dev))


def _topk_few_rows(x, n_valid, k: int, out, *, by_score: bool, drop_neg_inf: bool, remap, mask: bool,
                   mask_block: int, blocks) -> None:
    """The few-row passes on x [R, N], writing out (int64 [R, k], or the zeroed int8 block mask)."""
    R, N = x.shape
    plan = _few_plan(R, N, k, by_score, drop_neg_inf, remap is not None, mask, mask_block, blocks, _FEW_DIGITS[0])
    zeroed, ge, chunk, state, scratch = _workspace(x, plan, _new_few_workspace)
    for p, shift, width, last in plan.passes:
        _few_pass_kernel[(R, plan.chunks)](x, n_valid, zeroed, ge, chunk, state, N, x.stride(0), k, *plan.ints,
                                           PASS=p, SHIFT=shift, WIDTH=width, LAST=last, **plan.consts,
                                           num_warps=plan.warps)
    table, remap_stride = (out, 0) if remap is None else (remap, remap.stride(0))
    _few_emit_kernel[(R, plan.chunks)](x, n_valid, zeroed, chunk, state, table, scratch, out, N, x.stride(0), k,
                                       out.stride(0), remap_stride, out.shape[1] if mask else 0, mask_block,
                                       *plan.ints, **plan.consts, **plan.emit_consts, num_warps=plan.warps)
