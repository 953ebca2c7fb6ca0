"""Triton kernels of the indexer family (official-rules.md §4, §5.1).

Operations (CPU tensors in and out; CUDA when present, the Triton interpreter otherwise):

    index_scores(q [T,H,D], k [S,D], w [T,H], visible [T], score_dtype="bf16") -> f32 [T,S]
    index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible)          -> f32 [T,S]
    index_topk(scores [T,S], visible [T], k, order)                                 -> i64 [T,k]
    reindex_topk(q, k, w, visible, pool [T,S], k)                                   -> i64 [T,k]

Scores.  One program holds TQ queries x H heads of q (TQ*H columns of the MMA, heads on the N
side so the head sum is an in-register reduction) and streams key blocks: acc = k_blk @ q_tile^T
in fp32, then s_h = bf16(acc), p_h = bf16(ReLU(s_h) * w_h), I = bf16(sum_h p_h).  Every BF16
rounding is written with integer arithmetic on the fp32 bit pattern (round to nearest even), so
the interpreter (whose fp32->bf16 cast truncates) and the GPU agree bit for bit.  Key blocks that
no query of the tile can see are not multiplied; they are written -inf directly.

Top-k.  A row is an unordered multiset of fp32 scores mapped to order-preserving uint32 keys
(-0 folded onto +0).  Radix select on the top 12 key bits (per-chunk histograms plus a row
histogram), refined on 12 and then 8 more bits only while the boundary bin is too full; then one
ordered compaction writes, in position order, every key above the boundary and the boundary-bin
keys (at most CAP per row); a last per-row program finds the exact k-th key among those
candidates, breaks ties toward the lowest position, and emits positions (V4.1 order) or sorts
the <= CAP candidates by (score desc, position asc) (V4 order).  Deterministic: every count is an
integer and every placement comes from prefix sums, never from atomics' arrival order.

Re-index.  The pool's positions (those also visible) are gathered per row in position order;
only they are scored (the same score kernel reading K rows through the gathered index list),
and the top-k runs on that compact row; slot indices map back to positions, which stay
ascending.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["index_scores", "index_scores_fp4", "index_topk", "reindex_topk"]

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
SCORE_DTYPES = ("bf16", "fp32")
ORDERS = ("score", "position")


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() and not INTERPRET else torch.device("cpu")


def _pow2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


# --------------------------------------------------------------------------------------------
# shared device helpers


@triton.jit
def _bf16_rne(x):
    """fp32 -> the nearest-even BF16 value, as fp32, by integer arithmetic on the bit pattern."""
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _order_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0 and +0 map to one key)."""
    b = x.to(tl.uint32, bitcast=True)
    b = tl.where(x == 0.0, 0, b)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _fp4_e8m0_to_bf16(byte, nibble_shift, sbyte):
    """One E2M1 nibble of `byte` times its E8M0 scale 2^(sbyte-127), as an exact BF16 tensor."""
    nib = (byte.to(tl.uint32) >> nibble_shift.to(tl.uint32)) & 0xF
    e = (nib >> 1) & 3
    m = nib & 1
    # magnitude bits in fp32: e = 0 -> m * 0.5; e > 0 -> (1 + m/2) * 2^(e-1)
    mag = tl.where(e == 0, m * (126 << 23), ((e + 126) << 23) | (m << 22))
    val = (mag | ((nib >> 3) << 31)).to(tl.float32, bitcast=True)
    s = sbyte.to(tl.uint32)
    sbits = tl.where(s == 0, 0x00400000, s << 23)  # byte 0 is 2^-127, an fp32 subnormal
    scale = tl.where(s == 255, float("nan"), sbits.to(tl.float32, bitcast=True))
    # E2M1 x E8M0 has <= 2 significant bits: exact in fp32 and in BF16 (top 16 bits)
    prod = (val * scale).to(tl.uint32, bitcast=True)
    return (prod >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


# --------------------------------------------------------------------------------------------
# scores


@triton.jit
def _scores_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, vis_ptr, idx_ptr, out_ptr,
                   T, S, H, out_stride, idx_stride, n_s_progs,
                   D: tl.constexpr, D_PAD: tl.constexpr, H_PAD: tl.constexpr, TQ: tl.constexpr,
                   BLOCK_S: tl.constexpr, FP4: tl.constexpr, BF16_SCORE: tl.constexpr,
                   GATHER: tl.constexpr, IEEE: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    NQ: tl.constexpr = TQ * H_PAD
    r = tl.arange(0, NQ)
    t_r = pid_t * TQ + r // H_PAD
    h_r = r % H_PAD
    row_ok = (t_r < T) & (h_r < H)
    q_row = t_r * H + h_r
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    qmask = row_ok[:, None] & d_ok[None, :]
    if FP4:
        qb = tl.load(q_ptr + q_row[:, None] * (D // 2) + d[None, :] // 2, mask=qmask, other=0)
        qsb = tl.load(qs_ptr + q_row[:, None] * (D // 32) + d[None, :] // 32, mask=qmask, other=127)
        q = _fp4_e8m0_to_bf16(qb, (d[None, :] & 1) * 4, qsb)
    else:
        q = tl.load(q_ptr + q_row[:, None] * D + d[None, :], mask=qmask, other=0.0)
    w = tl.load(w_ptr + q_row, mask=row_ok, other=0.0).to(tl.float32)

    tq = tl.arange(0, TQ)
    t_q = pid_t * TQ + tq
    vis = tl.load(vis_ptr + t_q, mask=t_q < T, other=0)
    vmax = tl.max(vis, axis=0)
    n_blk = tl.cdiv(S, BLOCK_S)
    sb = pid_s
    while sb < n_blk:  # (while, not range: the 3.6 interpreter cannot range over runtime scalars)
        j = sb * BLOCK_S + tl.arange(0, BLOCK_S)
        omask = (j[:, None] < S) & (t_q[None, :] < T)
        optr = out_ptr + t_q[None, :] * out_stride + j[:, None]
        if sb * BLOCK_S < vmax:
            if GATHER:  # TQ == 1: key rows come from this query's gathered position list
                pos = tl.load(idx_ptr + pid_t * idx_stride + j, mask=j < vmax, other=0)
            else:
                pos = j
            kmask = (j < vmax)[:, None] & d_ok[None, :]
            if FP4:
                kb = tl.load(k_ptr + pos[:, None] * (D // 2) + d[None, :] // 2, mask=kmask, other=0)
                ksb = tl.load(ks_ptr + pos[:, None] * (D // 32) + d[None, :] // 32, mask=kmask,
                              other=127)
                kt = _fp4_e8m0_to_bf16(kb, (d[None, :] & 1) * 4, ksb)
            else:
                kt = tl.load(k_ptr + pos[:, None] * D + d[None, :], mask=kmask, other=0.0)
            if IEEE:  # fp32 operands; also the interpreter, whose bf16 dot multiplies raw bits
                acc = tl.dot(kt.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")
            else:
                acc = tl.dot(kt, tl.trans(q))  # [BLOCK_S, TQ*H_PAD], fp32 accumulation
            if BF16_SCORE:
                s_h = _bf16_rne(acc)
                p_h = _bf16_rne(tl.where(s_h > 0.0, s_h, 0.0) * w[None, :])
            else:
                p_h = tl.where(acc > 0.0, acc, 0.0) * w[None, :]
            score = tl.sum(tl.reshape(p_h, (BLOCK_S, TQ, H_PAD)), axis=2)
            if BF16_SCORE:
                score = _bf16_rne(score)
            score = tl.where(j[:, None] < vis[None, :], score, float("-inf"))
            tl.store(optr, score, mask=omask)
        else:
            tl.store(optr, tl.full((BLOCK_S, TQ), float("-inf"), tl.float32), mask=omask)
        sb += n_s_progs


def _score_config(T: int, S: int, H_PAD: int, D_PAD: int, gather: bool):
    """(TQ, BLOCK_S, n_s_progs, num_warps): fixed configs, small ones in the interpreter."""
    if INTERPRET:
        tq = 1 if gather else max(1, 16 // H_PAD)
        return tq, 16, 1, 4
    tq = 1 if gather else max(1, 128 // H_PAD)
    block_s = 128 if D_PAD <= 128 else 64
    n_t = triton.cdiv(T, tq)
    n_s = max(1, min(triton.cdiv(S, block_s), triton.cdiv(4 * 132, n_t)))
    return tq, block_s, n_s, 8


def _launch_scores(q, qs, k, ks, w, vis32, idx, T, S, H, D, out, fp4: bool, bf16: bool):
    H_PAD = _pow2(H, 16)
    D_PAD = _pow2(D, 16)
    gather = idx is not None
    tq, block_s, n_s, warps = _score_config(T, S, H_PAD, D_PAD, gather)
    ieee = INTERPRET or ((not fp4) and q.dtype == torch.float32)
    grid = (triton.cdiv(T, tq), n_s)
    _scores_kernel[grid](q, qs if fp4 else q, k, ks if fp4 else k, w, vis32,
                         idx if gather else vis32, out, T, S, H, out.stride(0),
                         idx.stride(0) if gather else 0, n_s,
                         D=D, D_PAD=D_PAD, H_PAD=H_PAD, TQ=tq, BLOCK_S=block_s, FP4=fp4,
                         BF16_SCORE=bf16, GATHER=gather, IEEE=ieee, num_warps=warps)


# --------------------------------------------------------------------------------------------
# top-k engine (shared with kernels.pool)

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
def _hist_kernel(x_ptr, len_ptr, state_ptr, hist_row_ptr, hist_chunk_ptr, R, N, x_stride, NC, CH,
                 PASS: tl.constexpr, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
                 BINS: tl.constexpr, BLOCK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_valid = tl.minimum(tl.load(len_ptr + row), N)
    if PASS == 0:
        active = 1
        prefix = 0
    else:
        prev = state_ptr + ((PASS - 1) * R + row) * 8
        active = tl.load(prev + 3)
        prefix = tl.load(prev + 2)
    start = c * CH
    stop = tl.minimum(start + CH, n_valid)
    n_it = tl.where(active != 0, tl.cdiv(tl.maximum(stop - start, 0), BLOCK), 0)
    h = tl.zeros((BINS,), tl.int32)
    i = 0
    while i < n_it:
        pos = start + i * BLOCK + tl.arange(0, BLOCK)
        key, ok = _valid_keys(x_ptr + row * x_stride, pos, stop, DROP_NEG_INF)
        if PASS > 0:
            ok = ok & ((key >> (SHIFT + WIDTH)).to(tl.int64) == prefix)
        field = ((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32)
        h += tl.histogram(field, BINS, mask=ok)
        i += 1
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
                for f in range(8):
                    tl.store(me + f, tl.load(prev + f))
    if active != 0:
        ge = tl.cumsum(hist, axis=0, reverse=True)  # ge[b] = number of keys in bins >= b
        bnd = tl.max(tl.where(ge.to(tl.int64) >= need_rem, b, -1), axis=0)
        h_b = tl.sum(tl.where(b == bnd, hist, 0), axis=0).to(tl.int64)
        gt_total = gt_prev + tl.sum(tl.where(b > bnd, hist, 0), axis=0).to(tl.int64)
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
                    R, N, x_stride, NC, CH, CAP, FINAL: tl.constexpr, NC_PAD: tl.constexpr,
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
    stop = tl.minimum(start + CH, n_valid)
    n_it = tl.cdiv(tl.maximum(stop - start, 0), BLOCK)
    written = my_off
    eq_seen = my_eq_before
    i = 0
    while i < n_it:
        pos = start + i * BLOCK + tl.arange(0, BLOCK)
        key, ok = _valid_keys(x_ptr + row * x_stride, pos, stop, DROP_NEG_INF)
        f = key.to(tl.int64) >> shift
        gt = ok & (f > bound)
        eq = ok & (f == bound)
        eq_i = eq.to(tl.int64)
        sel = gt | (eq & ((eq_seen + tl.cumsum(eq_i, axis=0) - 1) < eq_take))
        sel_i = sel.to(tl.int64)
        slot = written + tl.cumsum(sel_i, axis=0) - 1
        sel = sel & (slot < CAP)
        tl.store(cand_key_ptr + row * CAP + slot, key.to(tl.int32, bitcast=True), mask=sel)
        tl.store(cand_pos_ptr + row * CAP + slot, pos, mask=sel)
        written += tl.sum(sel_i, axis=0)
        eq_seen += tl.sum(eq_i, axis=0)
        i += 1


@triton.jit
def _final_kernel(cand_key_ptr, cand_pos_ptr, state_ptr, remap_ptr, scratch_ptr, out_ptr, R,
                  out_stride, remap_stride, W, block, FINAL: tl.constexpr, CAP: tl.constexpr,
                  K_PAD: tl.constexpr,
                  BY_SCORE: tl.constexpr, REMAP: tl.constexpr, MASK_BLOCK: tl.constexpr):
    """Exact k-th key among the candidates, ties to the lowest position, then the output."""
    row = tl.program_id(0)
    st = state_ptr + (FINAL * R + row) * 8
    need = tl.load(st + 0)
    n_cand = tl.load(st + 6) + tl.load(st + 7)
    i = tl.arange(0, CAP)
    ok = i < n_cand
    key = tl.load(cand_key_ptr + row * CAP + i, mask=ok, other=0).to(tl.uint32, bitcast=True)
    key = key.to(tl.int64)
    pos = tl.load(cand_pos_ptr + row * CAP + i, mask=ok, other=0).to(tl.int64)
    # largest thr with #(key >= thr) >= need (bisection on the 32-bit key)
    lo = tl.zeros((), tl.int64)
    hi = tl.full((), 0xFFFFFFFF, tl.int64)
    for _ in range(32):
        mid = (lo + hi + 1) // 2
        cnt = tl.sum((ok & (key >= mid)).to(tl.int64), axis=0)
        lo = tl.where(cnt >= need, mid, lo)
        hi = tl.where(cnt >= need, hi, mid - 1)
    gt = ok & (key > lo)
    eq = ok & (key == lo)
    n_gt = tl.sum(gt.to(tl.int64), axis=0)
    sel = gt | (eq & ((tl.cumsum(eq.to(tl.int64), axis=0) - 1) < need - n_gt))
    sel = sel & (need > 0)
    if MASK_BLOCK > 0:  # candidate_blocks: selected block p marks positions [p*B, p*B+B) of W
        jj = tl.arange(0, MASK_BLOCK)
        p = pos[:, None] * block + jj[None, :]
        tl.store(out_ptr + row * out_stride + p, tl.full((CAP, MASK_BLOCK), 1, tl.int8),
                 mask=sel[:, None] & (jj[None, :] < block) & (p < W))
    else:
        slot = tl.cumsum(sel.to(tl.int64), axis=0) - 1
        if BY_SCORE:  # sort the <= K_PAD chosen (score desc, position asc) via a scratch row
            n_sel = tl.sum(sel.to(tl.int64), axis=0)
            comp = ((key - 0x80000000) << 32) | (0xFFFFFFFF - pos)
            tl.store(scratch_ptr + row * K_PAD + slot, comp, mask=sel)
            tl.debug_barrier()
            kk = tl.arange(0, K_PAD)
            comp = tl.load(scratch_ptr + row * K_PAD + kk, mask=kk < n_sel,
                           other=-0x7FFFFFFFFFFFFFFF - 1)
            comp = tl.sort(comp, descending=True)
            slot = kk.to(tl.int64)
            pos = 0xFFFFFFFF - (comp & 0xFFFFFFFF)
            sel = slot < n_sel
        if REMAP:
            pos = tl.load(remap_ptr + row * remap_stride + pos, mask=sel, other=0).to(tl.int64)
        tl.store(out_ptr + row * out_stride + slot, pos, mask=sel)


def _topk_config(R: int, N: int):
    """(BLOCK, CH): streaming block and rows' chunk length (a multiple of BLOCK)."""
    if INTERPRET:
        return 256, 512
    block = 4096
    ch = max(block, min(65536, triton.next_power_of_2(max(1, R * N // 1024))))
    return block, ch


def _topk_engine(x: torch.Tensor, n_valid: torch.Tensor, k: int, *, by_score: bool = False,
                 drop_neg_inf: bool = False, remap: torch.Tensor | None = None,
                 mask_out: torch.Tensor | None = None, mask_block: int = 0,
                 cap: int | None = None) -> torch.Tensor | None:
    """Top-k of each row of x [R,N] (fp32, on the device) among positions < n_valid[r].

    Returns int64 [R,k] (position order, or score order with ties by position; -1 tail), or,
    with mask_out ([R,W] int8, zeroed), marks the selected positions' blocks of mask_block.
    """
    R, N = x.shape
    dev = x.device
    k_pad = _pow2(k)
    if cap is None:
        cap = min(16384, max(2048, 4 * k_pad))
    cap = max(cap, k_pad)
    block, ch = _topk_config(R, N)
    nc = max(1, triton.cdiv(N, ch))
    nc_pad = _pow2(nc)
    hist_row = torch.zeros((len(_PASSES), R, _BINS), dtype=torch.int32, device=dev)
    hist_chunk = torch.empty((R, nc, _BINS), dtype=torch.int32, device=dev)
    state = torch.zeros((len(_PASSES), R, 8), dtype=torch.int64, device=dev)
    gt = torch.zeros((R, nc), dtype=torch.int32, device=dev)
    eq = torch.zeros((R, nc), dtype=torch.int32, device=dev)
    warps = 4 if INTERPRET else 8
    for p, (shift, width) in enumerate(_PASSES):
        _hist_kernel[(R, nc)](x, n_valid, state, hist_row[p], hist_chunk, R, N, x.stride(0), nc, ch,
                              PASS=p, SHIFT=shift, WIDTH=width, BINS=_BINS, BLOCK=block,
                              DROP_NEG_INF=drop_neg_inf, num_warps=warps)
        _boundary_kernel[(R, nc)](hist_row[p], hist_chunk, state, gt, eq, R, N, nc, k, cap,
                                  PASS=p, SHIFT=shift, WIDTH=width, LAST=p == len(_PASSES) - 1,
                                  BINS=_BINS, num_warps=warps)
    final = len(_PASSES) - 1
    cand_key = torch.empty((R, cap), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((R, cap), dtype=torch.int32, device=dev)
    _compact_kernel[(R, nc)](x, n_valid, state, gt, eq, cand_key, cand_pos, R, N, x.stride(0), nc,
                             ch, cap, FINAL=final, NC_PAD=nc_pad, BLOCK=block,
                             DROP_NEG_INF=drop_neg_inf, num_warps=warps)
    if mask_out is not None:
        _final_kernel[(R,)](cand_key, cand_pos, state, cand_pos, cand_key, mask_out, R, mask_out.stride(0), 0,
                            mask_out.shape[1], mask_block, FINAL=final, CAP=cap, K_PAD=k_pad, BY_SCORE=False,
                            REMAP=False, MASK_BLOCK=_pow2(mask_block), num_warps=warps)
        return None
    out = torch.full((R, k), -1, dtype=torch.int64, device=dev)
    scratch = torch.empty((R, k_pad) if by_score else (1,), dtype=torch.int64, device=dev)
    _final_kernel[(R,)](cand_key, cand_pos, state, remap if remap is not None else cand_pos,
                        scratch, out, R,
                        out.stride(0), remap.stride(0) if remap is not None else 0, 0, 0,
                        FINAL=final, CAP=cap, K_PAD=k_pad, BY_SCORE=by_score, REMAP=remap is not None,
                        MASK_BLOCK=0, num_warps=warps)
    return out


# --------------------------------------------------------------------------------------------
# validation and launchers


def _need_tensor(name: str, op: str, x, ndim: int, dtypes=None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: {name} must be {names}, got {str(x.dtype).replace('torch.', '')}")
    return x


def _check_visible(op: str, visible, T: int, S: int) -> torch.Tensor:
    visible = _need_tensor("visible", op, visible, 1, (torch.int64, torch.int32))
    if visible.shape[0] != T:
        raise ValueError(f"{op}: visible has {visible.shape[0]} entries, expected {T} (one per query)")
    if T and (int(visible.min()) < 0 or int(visible.max()) > S):
        raise ValueError(f"{op}: visible lengths must lie in [0, {S}], got "
                         f"[{int(visible.min())}, {int(visible.max())}]")
    return visible.to(torch.int32)


def _check_k(op: str, k) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{op}: k must be an int, got {type(k).__name__}")
    if k < 0:
        raise ValueError(f"{op}: k must be >= 0, got {k}")
    return k


def _float_input(op: str, name: str, x: torch.Tensor, bf16: bool) -> torch.Tensor:
    """bf16 passes through; fp32 is accepted when (bf16 mode) its values are BF16 numbers."""
    if x.dtype == torch.bfloat16:
        return x.contiguous()
    if x.dtype != torch.float32:
        raise TypeError(f"{op}: {name} must be bfloat16 or float32, got {str(x.dtype).replace('torch.', '')}")
    if bf16:
        xb = x.to(torch.bfloat16)
        if not torch.equal(xb.float(), x) and not bool(torch.isnan(x).any()):
            raise ValueError(f"{op}: {name} is float32 with values that are not BF16 numbers; "
                             f"the BF16 score takes BF16 inputs")
        return xb.contiguous()
    return x.contiguous()


def _check_score_shapes(op: str, T: int, H: int, S: int, D: int, w: torch.Tensor, D_k: int):
    if D_k != D:
        raise ValueError(f"{op}: q has head dim {D} but k has {D_k}")
    if tuple(w.shape) != (T, H):
        raise ValueError(f"{op}: w must have shape [T, H] = [{T}, {H}], got {tuple(w.shape)}")


def index_scores(q, k, w, visible, score_dtype: str = "bf16") -> torch.Tensor:
    """I[t,s] = sum_h w[t,h] * ReLU(q[t,h] . k[s]) for s < visible[t], -inf elsewhere (f32 [T,S]).

    score_dtype "bf16" rounds as the V4/V4.1 reference does (official-rules.md §4.1): each head's
    dot to BF16, the weighted ReLU to BF16, the head sum (fp32 accumulation) to BF16.  "fp32"
    keeps every step in fp32.
    """
    op = "index_scores"
    if score_dtype not in SCORE_DTYPES:
        raise ValueError(f"{op}: score_dtype must be one of {SCORE_DTYPES}, got {score_dtype!r}")
    _need_tensor("q", op, q, 3)
    _need_tensor("k", op, k, 2)
    _need_tensor("w", op, w, 2)
    T, H, D = q.shape
    S = k.shape[0]
    _check_score_shapes(op, T, H, S, D, w, k.shape[1])
    vis = _check_visible(op, visible, T, S)
    bf16 = score_dtype == "bf16"
    q, k, w = (_float_input(op, n, x, bf16) for n, x in (("q", q), ("k", k), ("w", w)))
    if not bf16:  # one dtype for both MMA operands
        q, k, w = q.float(), k.float(), w.float()
    if T == 0 or S == 0:
        return torch.full((T, S), float("-inf"), dtype=torch.float32)
    dev = _device()
    out = torch.empty((T, S), dtype=torch.float32, device=dev)
    _launch_scores(q.to(dev), None, k.to(dev), None, w.to(dev), vis.to(dev), None, T, S, H, D,
                   out, fp4=False, bf16=bf16)
    return out.cpu()


def index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible) -> torch.Tensor:
    """index_scores(dequant(q), dequant(k), w, visible, "bf16") read from FP4 E2M1 + E8M0/32.

    Packed bytes hold element 2i in the low nibble; scale byte b is 2^(b-127) (official-rules.md
    §1, §2.3).  Each E2M1 x E8M0 product is exact in BF16, so the in-register dequantization and
    BF16 MMA compute exactly the dequantized operands' products.
    """
    op = "index_scores_fp4"
    for name, x, nd in (("q_packed", q_packed, 3), ("q_scales", q_scales, 3),
                        ("k_packed", k_packed, 2), ("k_scales", k_scales, 2)):
        _need_tensor(name, op, x, nd, (torch.uint8,))
    _need_tensor("w", op, w, 2)
    T, H, half = q_packed.shape
    D = 2 * half
    S = k_packed.shape[0]
    if D % 32:
        raise ValueError(f"{op}: head dim {D} (q_packed last dim {half} x 2) is not a multiple of "
                         f"the scale block (32)")
    if tuple(q_scales.shape) != (T, H, D // 32):
        raise ValueError(f"{op}: q_scales must have shape {(T, H, D // 32)}, got {tuple(q_scales.shape)}")
    if tuple(k_scales.shape) != (S, D // 32):
        raise ValueError(f"{op}: k_scales must have shape {(S, D // 32)}, got {tuple(k_scales.shape)}")
    _check_score_shapes(op, T, H, S, D, w, 2 * k_packed.shape[1])
    vis = _check_visible(op, visible, T, S)
    w = _float_input(op, "w", w, True)
    if T == 0 or S == 0:
        return torch.full((T, S), float("-inf"), dtype=torch.float32)
    dev = _device()
    out = torch.empty((T, S), dtype=torch.float32, device=dev)
    _launch_scores(*(x.contiguous().to(dev) for x in (q_packed, q_scales, k_packed, k_scales, w)),
                   vis.to(dev), None, T, S, H, D, out, fp4=True, bf16=True)
    return out.cpu()


def _check_scores_row(op: str, scores) -> torch.Tensor:
    scores = _need_tensor("scores", op, scores, 2, (torch.float32, torch.bfloat16))
    if bool(torch.isnan(scores).any()):
        raise ValueError(f"{op}: scores contain NaN; top-k is defined on non-NaN scores")
    return scores.float().contiguous()


def index_topk(scores, visible, k: int, order: str) -> torch.Tensor:
    """Top-k positions of each row among s < visible[t] (int64 [T,k], -1 as trailing padding).

    order "score" (V4): descending score.  order "position" (V4.1): ascending position.  Exactly
    min(k, visible[t]) entries are valid.  Ties: the lowest positions win (implementation-defined).
    """
    op = "index_topk"
    scores = _check_scores_row(op, scores)
    T, S = scores.shape
    vis = _check_visible(op, visible, T, S)
    k = _check_k(op, k)
    if order not in ORDERS:
        raise ValueError(f"{op}: order must be one of {ORDERS}, got {order!r}")
    if T == 0 or k == 0 or S == 0:
        return torch.full((T, k), -1, dtype=torch.int64)
    dev = _device()
    return _topk_engine(scores.to(dev), vis.to(dev), k, by_score=order == "score").cpu()


def _gather_pool(pool_u8: torch.Tensor, vis32: torch.Tensor, width: int) -> tuple:
    """Per row, the positions s < visible[t] with pool[t,s], in ascending order, -1 padded."""
    T, S = pool_u8.shape
    idx = torch.full((T, width), -1, dtype=torch.int32, device=pool_u8.device)
    count = torch.zeros((T,), dtype=torch.int32, device=pool_u8.device)
    _gather_kernel[(T,)](pool_u8, vis32, idx, count, S, width, BLOCK=256 if INTERPRET else 4096,
                         num_warps=4 if INTERPRET else 8)
    return idx, count


@triton.jit
def _gather_kernel(pool_ptr, vis_ptr, idx_ptr, count_ptr, S, width, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    n = tl.minimum(tl.load(vis_ptr + row), S)
    written = tl.zeros((), tl.int32)
    start = 0
    while start < n:
        s = start + tl.arange(0, BLOCK)
        m = tl.load(pool_ptr + row * S + s, mask=s < n, other=0) != 0
        mi = m.to(tl.int32)
        slot = written + tl.cumsum(mi, axis=0) - 1
        tl.store(idx_ptr + row * width + slot, s, mask=m & (slot < width))
        written += tl.sum(mi, axis=0)
        start += BLOCK
    tl.store(count_ptr + row, written)


def reindex_topk(q, k, w, visible, pool, k_top: int) -> torch.Tensor:
    """V4.1 re-index: BF16 scores masked to the pool, top-k in position order (int64 [T,k]).

    Only the pool's visible positions are scored: they are gathered per row (ascending) and the
    score kernel reads K through that list; the row top-k then runs on <= |pool| columns.
    """
    op = "reindex_topk"
    k_top = _check_k(op, k_top)
    _need_tensor("q", op, q, 3)
    _need_tensor("k", op, k, 2)
    _need_tensor("w", op, w, 2)
    T, H, D = q.shape
    S = k.shape[0]
    _check_score_shapes(op, T, H, S, D, w, k.shape[1])
    vis = _check_visible(op, visible, T, S)
    pool = _need_tensor("pool", op, pool, 2, (torch.bool,))
    if tuple(pool.shape) != (T, S):
        raise ValueError(f"{op}: pool must have shape [T, S] = [{T}, {S}], got {tuple(pool.shape)}")
    q, k, w = (_float_input(op, n, x, True) for n, x in (("q", q), ("k", k), ("w", w)))
    if T == 0 or k_top == 0 or S == 0:
        return torch.full((T, k_top), -1, dtype=torch.int64)
    reach = pool & (torch.arange(S)[None, :] < visible[:, None])
    width = _pow2(int(reach.sum(1).max()), 16)
    dev = _device()
    vis_d = vis.to(dev)
    idx, count = _gather_pool(pool.contiguous().view(torch.uint8).to(dev), vis_d, width)
    pscores = torch.empty((T, width), dtype=torch.float32, device=dev)
    _launch_scores(q.to(dev), None, k.to(dev), None, w.to(dev), count, idx, T, width, H, D,
                   pscores, fp4=False, bf16=True)
    return _topk_engine(pscores, count, k_top, by_score=False, remap=idx).cpu()
