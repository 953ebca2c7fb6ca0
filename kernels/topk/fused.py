"""The fused path of the top-k: the threshold filter and its radix fallback in one launch (a row one
program's) or two (rows cut into chunks), with its plans and workspaces cached per shape."""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ..mode import INTERPRET
from .filter import (_BITMAP_WORDS_PER_PICK, _DIGIT, _filter_chunk, _filter_shape, _group_max_chunk, _select_row,
                     _threshold_row)
from .radix import _BINS, _pow2, _radix_row, _topk_config


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
