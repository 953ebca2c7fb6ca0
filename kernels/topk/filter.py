"""The threshold filter of the top-k, the engines' fast path: group maxima, the threshold from them,
the streaming filter of the keys above it, the per-row select and its emission (bitmap, sort or
block mask), its tunables (FilterTune) and its launches (_topk_filter)."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import triton
import triton.language as tl

from ..mode import INTERPRET
from .radix import _boundary_bin, _order_key, _pow2


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
