"""The few-row passes of the top-k: for 1 to a few long rows, the select spread over each row's
chunks, a launch a key digit, then the emission."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

from ..mode import INTERPRET
from .filter import _row_keys, _write_sorted
from .fused import _last_to_arrive, _workspace
from .radix import _boundary_bin, _pow2


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
