"""The radix engine of the top-k (see the package's docstring): the histogram, boundary, compact and
final passes over several programs a row (_topk_radix), the one-program-a-row form the filter's
flagged rows take on the device (_topk_radix_rows), and the key helpers every engine shares."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..mode import INTERPRET


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
