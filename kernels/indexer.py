"""Triton kernels of the indexer family (official-rules.md §4, §5.1).

Operations (CPU tensors in and out; CUDA when present, the Triton interpreter otherwise):

    index_scores(q [T,H,D], k [S,D], w [T,H], visible [T], score_dtype="bf16") -> f32 [T,S]
    index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible)          -> f32 [T,S]
    index_topk(scores [T,S], visible [T], k, order)                                 -> i64 [T,k]
    hadamard(x [..., 128])                                                          -> f32 [..., 128]
    index_rotate(x [..., 128], model)                                               -> f32
    index_weights(raw_w [T,H], model)                                               -> f32 [T,H]
    index_weights_v32(raw_w [T,64], q_scale [T,64])                                 -> f32 [T,64]
    index_visible(positions int [...], ratio)                                       -> i64 [...]

(kernels.pool builds candidate_blocks and reindex_topk on the score kernel and top-k engine here.)

Scores.  One program holds TQ queries x H heads of q (TQ*H columns of the MMA, heads on the N
side so the head sum is an in-register reduction) and streams key blocks: acc = k_blk @ q_tile^T
in fp32, then s_h = bf16(acc), p_h = bf16(ReLU(s_h) * w_h), I = bf16(sum_h p_h).  BF16 roundings
are integer arithmetic on the fp32 bit pattern (round to nearest even; the interpreter's fp32->bf16
cast truncates and Hopper's conversion instructions are slow); on the GPU p_h is the BF16 multiply
(one RNE of the exact product).  Key blocks that no query of the tile can see are not multiplied;
they are written -inf directly.  On the GPU the key loop is software-pipelined (the next key block
loads while this one multiplies), and 4 warps per program with 64 keys a block let 3 programs
share an SM, so one's epilogue (the integer pipe) overlaps another's MMA.  FP4 operands are
decoded once per block in registers: 16 bytes per 32-element scale group, the scale decoded once
per group, each code by three integer operations and two exact fp32 multiplies (_fp4_rows).

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
give the same bits.

Hadamard.  Each program holds ROWS rows of 128 in registers and runs the Sylvester butterfly
(x[i], x[i+h]) -> (x[i] + x[i+h], x[i] - x[i+h]) for h = 1, 2, ..., 64 in fp32, each stage a
reshape that puts the two partners on a last axis of 2, a split and a join; then one fp32
multiply by fl32(128^-0.5) and the BF16 rounding on the bits.  Same pairs, same order and IEEE
fp32 additions as impl's butterfly, so the result is impl's bit for bit: checked under the
interpreter; on the GPU nothing can contract into an FMA (adds, then one multiply) and add.f32
keeps subnormals, so the same holds there (tests/test_kernels_indexer.py checks it wherever it
runs).  No dot product: its summation order differs, and in the interpreter so does bf16.
V4.1 does not rotate: index_rotate copies.  The head weights are one fp32 multiply by the
model's fl32 factor and the BF16 rounding; the visible counts are integer arithmetic.

The score kernel can also read K through a per-query list of positions (GATHER), which is how
kernels.pool's re-index scores only the pool.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
import triton
import triton.language as tl

from ..impl.indexer import _bf16_values as _impl_bf16_values
from . import INTERPRET
from ..impl.indexer import _tensor as _impl_tensor
from ..spec import indexer as spec
from ..spec.models import profile

__all__ = ["hadamard", "index_rotate", "index_weights", "index_weights_v32", "index_scores", "index_scores_fp4",
           "index_visible", "index_topk"]

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
    """fp32 -> the nearest-even BF16 value, as fp32, by integer arithmetic on the bit pattern.
    A NaN stays NaN: the GPU's NaN is 0x7FFFFFFF (PTX's canonical NaN, e.g. of inf - inf), whose
    rounding carry would run into the sign bit and give -0 (the CPU's 0xFFC00000 does not carry)."""
    return tl.where(x == x, _bf16_rne_no_nan(x), x)


@triton.jit
def _bf16_rne_no_nan(x):
    """_bf16_rne for the score epilogue, two instructions shorter: a NaN there (only from ±inf
    inputs) is already outside agreement with the reference, whose ReLU keeps it where the kernel's
    maps it to 0."""
    b = x.to(tl.uint32, bitcast=True)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _order_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0 and +0 map to one key)."""
    b = x.to(tl.uint32, bitcast=True)
    b = tl.where(x == 0.0, 0, b)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


# --------------------------------------------------------------------------------------------
# Hadamard rotation, head weights, visible counts

_HADAMARD_ROWS = 32 if INTERPRET else 16      # rows of 128 per program
_ELEMENTWISE_BLOCK = 4096


@triton.jit
def _butterfly_stage(x, ROWS: tl.constexpr, D: tl.constexpr, H: tl.constexpr):
    """(x[i], x[i+H]) -> (x[i] + x[i+H], x[i] - x[i+H]) along the rows of x [ROWS, D], for every
    i with bit H clear: the partners are put on a last axis of 2, split, combined and joined."""
    pairs = tl.permute(tl.reshape(x, (ROWS, D // (2 * H), 2, H)), (0, 1, 3, 2))
    a, b = tl.split(pairs)
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (ROWS, D))


@triton.jit
def _hadamard_kernel(x_ptr, out_ptr, n_rows, scale_bits, ROWS: tl.constexpr, D: tl.constexpr):
    """out = bf16(fl32(H x) * fl32(1/sqrt(D))) per row, H x by the fp32 butterfly (D = 128)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = r.to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :]
    m = (r < n_rows)[:, None]
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    x = _butterfly_stage(x, ROWS, D, 1)   # H_2h = [[H_h, H_h], [H_h, -H_h]], h = 1 ... 64
    x = _butterfly_stage(x, ROWS, D, 2)
    x = _butterfly_stage(x, ROWS, D, 4)
    x = _butterfly_stage(x, ROWS, D, 8)
    x = _butterfly_stage(x, ROWS, D, 16)
    x = _butterfly_stage(x, ROWS, D, 32)
    x = _butterfly_stage(x, ROWS, D, 64)
    tl.store(out_ptr + offs, _bf16_rne(x * scale_bits.to(tl.float32, bitcast=True)), mask=m)


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


@triton.jit
def _weights_kernel(x_ptr, out_ptr, n, factor_bits, BLOCK: tl.constexpr):
    """out = bf16(fl32(x * c)), c the fp32 factor whose bits are factor_bits."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, _bf16_rne(x * factor_bits.to(tl.float32, bitcast=True)), mask=i < n)


@triton.jit
def _weights_v32_kernel(x_ptr, s_ptr, out_ptr, n, head_bits, c_bits, BLOCK: tl.constexpr):
    """out = fl32(fl32(bf16(fl32(x * h)) * s) * c): V3.2's BF16 head factor, then fp32 q scale and c."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    s = tl.load(s_ptr + i, mask=i < n, other=0.0)
    w = _bf16_rne(x * head_bits.to(tl.float32, bitcast=True)) * s
    tl.store(out_ptr + i, w * c_bits.to(tl.float32, bitcast=True), mask=i < n)


@triton.jit
def _visible_kernel(p_ptr, out_ptr, n, ratio, BLOCK: tl.constexpr):
    """out = (p + 1) // ratio for p >= 0, as p // ratio plus one where p is the last position of
    its group (p + 1 itself is never formed: no wrap at the int64 maximum)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(p_ptr + i, mask=i < n, other=0)
    q = p // ratio
    tl.store(out_ptr + i, q + (p - q * ratio == ratio - 1).to(tl.int64), mask=i < n)


# --------------------------------------------------------------------------------------------
# scores


@triton.jit
def _fp4_group_factors(sbyte):
    """E8M0 byte b -> (f1, f2), normal fp32 powers of two with f1 * f2 = 2^(b-127) for b < 255:
    f1 = 2^(min(b,128) - 1), f2 = 2^(max(b,128) - 128); byte 255 (NaN) gives f2 = NaN."""
    s = sbyte.to(tl.int32)
    f1 = ((tl.minimum(s, 128) + 126) << 23).to(tl.float32, bitcast=True)
    f2 = ((tl.maximum(s, 128) - 1) << 23).to(tl.float32, bitcast=True)
    return f1, tl.where(s == 255, float("nan"), f2)


@triton.jit
def _e2m1_bias1(n):
    """E2M1 code n (uint32, 0..15) as the fp32 with the code's sign, exponent and mantissa bits in
    fp32's places: its value times 2^-126, exactly (exponent 0, m * 2^-1, lands in fp32's
    subnormals, m * 2^-127).  The sign bit moves from bit 25 to bit 31: + (n & 8)(2^28 - 2^22)."""
    return ((n << 22) + (n & 8) * ((1 << 28) - (1 << 22))).to(tl.float32, bitcast=True)


@triton.jit
def _fp4_rows(b_ptr, s_ptr, rows, row_ok, R: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
              AS_FP32: tl.constexpr):
    """[R, D_PAD] E2M1 x E8M0/32 values of `rows` (packed two codes a byte, element 2i low), exact
    in BF16: ((code * 2^-126) * f1) * f2 is the exact product (or its IEEE overflow).  The bytes
    are read 16 to a scale group and each group's scale is decoded once; bf16 (fp32 for the
    interpreter, whose bf16 -> fp32 conversion mishandles subnormals)."""
    G_PAD: tl.constexpr = D_PAD // 32
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, 16)
    gm = row_ok[:, None] & (g < D // 32)[None, :]
    b = tl.load(b_ptr + rows[:, None, None] * (D // 2) + g[None, :, None] * 16 + c[None, None, :],
                mask=gm[:, :, None], other=0).to(tl.uint32)
    f1, f2 = _fp4_group_factors(tl.load(s_ptr + rows[:, None] * (D // 32) + g[None, :], mask=gm,
                                        other=127))
    f1 = f1[:, :, None]
    f2 = f2[:, :, None]
    v = tl.reshape(tl.join(_e2m1_bias1(b & 15) * f1 * f2, _e2m1_bias1(b >> 4) * f1 * f2),
                   (R, D_PAD))
    if AS_FP32:
        return v
    # exact in BF16 (<= 2 significant bits): its top 16 bits, no conversion instruction (slow on Hopper)
    return (v.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _score_epilogue(acc, w, BLOCK_S: tl.constexpr, TQ: tl.constexpr, H_PAD: tl.constexpr,
                    BF16_SCORE: tl.constexpr, GPU_OPS: tl.constexpr):
    """[BLOCK_S, TQ*H_PAD] head dots -> [BLOCK_S, TQ] scores: s_h = bf16(acc), p_h = bf16(ReLU(s_h)
    w_h), I = bf16(sum_h p_h) (fp32 accumulation); or all in fp32.  ReLU(bf16(a)) = bf16(ReLU(a)):
    the rounding is monotone and keeps 0.  GPU_OPS: max.f32 (a NaN gives 0, as the where does) and
    the BF16 multiply (mul.rn.bf16: one RNE of the exact product), which take the integer
    rounding of p_h off Hopper's integer pipe, the epilogue's bottleneck."""
    if GPU_OPS:
        relu = tl.maximum(acc, 0.0)
    else:
        relu = tl.where(acc > 0.0, acc, 0.0)
    if BF16_SCORE and GPU_OPS:
        s_h = (_bf16_rne_no_nan(relu).to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
        p = (s_h.to(tl.bfloat16, bitcast=True) * w.to(tl.bfloat16)[None, :]).to(tl.float32)
    elif BF16_SCORE:
        p = _bf16_rne_no_nan(_bf16_rne_no_nan(relu) * w[None, :])
    else:
        p = relu * w[None, :]
    score = tl.sum(tl.reshape(p, (BLOCK_S, TQ, H_PAD)), axis=2)
    if BF16_SCORE:
        score = _bf16_rne_no_nan(score)
    return score


@triton.jit
def _scores_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, vis_ptr, idx_ptr, out_ptr,
                   T, S, H, out_stride, idx_stride, n_s_progs,
                   D: tl.constexpr, D_PAD: tl.constexpr, H_PAD: tl.constexpr, TQ: tl.constexpr,
                   BLOCK_S: tl.constexpr, FP4: tl.constexpr, BF16_SCORE: tl.constexpr,
                   GATHER: tl.constexpr, IEEE: tl.constexpr, GPU_OPS: tl.constexpr,
                   STAGES: tl.constexpr):
    """Program (t, s) holds TQ queries x H_PAD heads of q (the MMA's N side) and takes key blocks
    s, s + n_s_progs, ... below the tile's largest visible count (a pipelined loop of STAGES on
    the GPU), then writes -inf into its key blocks past that count."""
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
    if FP4:
        q = _fp4_rows(q_ptr, qs_ptr, q_row, row_ok, NQ, D, D_PAD, IEEE)
    else:
        q = tl.load(q_ptr + q_row[:, None] * D + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
    w = tl.load(w_ptr + q_row, mask=row_ok, other=0.0).to(tl.float32)
    tq = tl.arange(0, TQ)
    t_q = pid_t * TQ + tq
    vis = tl.load(vis_ptr + t_q, mask=t_q < T, other=0)
    vmax = tl.max(vis, axis=0)
    n_vis = tl.cdiv(vmax, BLOCK_S)  # key blocks some query of the tile sees
    if STAGES > 0:
        for sb in tl.range(pid_s, n_vis, n_s_progs, num_stages=STAGES):
            _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                         idx_stride, pid_t, vmax, D, D_PAD, H_PAD, TQ, BLOCK_S, FP4, BF16_SCORE,
                         GATHER, IEEE, GPU_OPS)
    else:  # the interpreter (3.6) cannot range over run-time scalars
        sb = pid_s
        while sb < n_vis:
            _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                         idx_stride, pid_t, vmax, D, D_PAD, H_PAD, TQ, BLOCK_S, FP4, BF16_SCORE,
                         GATHER, IEEE, GPU_OPS)
            sb += n_s_progs
    # the causal tail: this program's blocks from n_vis on are -inf without a multiply
    sb = pid_s + tl.cdiv(tl.maximum(n_vis - pid_s, 0), n_s_progs) * n_s_progs
    while sb < tl.cdiv(S, BLOCK_S):
        j = sb * BLOCK_S + tl.arange(0, BLOCK_S)
        tl.store(out_ptr + t_q[None, :] * out_stride + j[:, None],
                 tl.full((BLOCK_S, TQ), float("-inf"), tl.float32),
                 mask=(j[:, None] < S) & (t_q[None, :] < T))
        sb += n_s_progs


@triton.jit
def _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                 idx_stride, pid_t, vmax, D: tl.constexpr, D_PAD: tl.constexpr,
                 H_PAD: tl.constexpr, TQ: tl.constexpr, BLOCK_S: tl.constexpr, FP4: tl.constexpr,
                 BF16_SCORE: tl.constexpr, GATHER: tl.constexpr, IEEE: tl.constexpr,
                 GPU_OPS: tl.constexpr):
    """Scores of key block sb for the tile's queries: acc = k_blk @ q^T, epilogue, -inf where
    the query does not see the key."""
    j = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    k_ok = j < vmax
    if GATHER:  # TQ == 1: key rows come from this query's gathered position list
        pos = tl.load(idx_ptr + pid_t * idx_stride + j, mask=k_ok, other=0)
    else:
        pos = j
    if FP4:
        kt = _fp4_rows(k_ptr, ks_ptr, pos, k_ok, BLOCK_S, D, D_PAD, IEEE)
    else:
        d = tl.arange(0, D_PAD)
        kt = tl.load(k_ptr + pos[:, None] * D + d[None, :], mask=k_ok[:, None] & (d < D)[None, :],
                     other=0.0)
    if IEEE:  # fp32 operands; also the interpreter, whose bf16 dot multiplies raw bits
        acc = tl.dot(kt.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")
    else:
        acc = tl.dot(kt, tl.trans(q))  # [BLOCK_S, TQ*H_PAD], fp32 accumulation
    score = _score_epilogue(acc, w, BLOCK_S, TQ, H_PAD, BF16_SCORE, GPU_OPS)
    score = tl.where(j[:, None] < vis[None, :], score, float("-inf"))
    tl.store(out_ptr + t_q[None, :] * out_stride + j[:, None], score,
             mask=(j[:, None] < S) & (t_q[None, :] < T))


_SCORE_N = 128  # GPU: MMA columns (queries x padded heads) per program
_SCORE_M = 64  # GPU: keys per block (the MMA's M side)
_SCORE_WARPS = 4
# The score epilogue's max.f32 and BF16 multiply on the GPU (_score_epilogue); False falls back to
# the interpreter's integer rounding, for a GPU whose BF16 multiply would not be IEEE (subnormals:
# test_bf16_scores_match_impl[wide_exponents] run on the GPU is the check).
_SCORE_GPU_OPS = True


def _score_config(T: int, S: int, H_PAD: int, D_PAD: int, gather: bool):
    """(TQ, BLOCK_S, n_s_progs, num_warps, stages): fixed configs, small ones in the interpreter.
    GPU: TQ queries x H_PAD heads are the MMA's N side (_SCORE_N columns, fewer for fewer
    queries), BLOCK_S keys its M side, so each of 8 warps holds BLOCK_S * N / 256 <= 64 fp32
    accumulators; the key blocks are split over enough programs for 4 per SM (132 SMs); STAGES
    key blocks in flight (the software pipeline of the key loop): 3 for gathered rows, whose key
    load waits on their index load (2 -> 3: 78 -> 68 µs for 64 x 16384 rows of a 1M-row K on the
    H200, bench/probe_reindex.py)."""
    if INTERPRET:  # the interpreter pays per operation, not per element: few, wide blocks
        tq = 1 if gather else max(1, 16 // H_PAD)
        return tq, 512 if gather else 64, 1, 4, 0
    tq = 1 if gather else max(1, min(_pow2(T), _SCORE_N // H_PAD))
    block_s = _SCORE_M if D_PAD <= 128 else _SCORE_M // 2
    n_t = triton.cdiv(T, tq)
    n_s = max(1, min(triton.cdiv(S, block_s), triton.cdiv(4 * 132, n_t)))
    return tq, block_s, n_s, _SCORE_WARPS, 3 if gather else 2


def _launch_scores(q, qs, k, ks, w, vis32, idx, T, S, H, D, out, fp4: bool, bf16: bool):
    H_PAD = _pow2(H, 16)
    D_PAD = _pow2(D, 32)
    gather = idx is not None
    tq, block_s, n_s, warps, stages = _score_config(T, S, H_PAD, D_PAD, gather)
    ieee = INTERPRET or ((not fp4) and q.dtype == torch.float32)
    if INTERPRET and not fp4:  # exact widening on the host: the interpreter's bf16 -> fp32
        q, k, w = q.float(), k.float(), w.float()  # conversion mishandles subnormals
    grid = (triton.cdiv(T, tq), n_s)
    _scores_kernel[grid](q, qs if fp4 else q, k, ks if fp4 else k, w, vis32,
                         idx if gather else vis32, out, T, S, H, out.stride(0),
                         idx.stride(0) if gather else 0, n_s,
                         D=D, D_PAD=D_PAD, H_PAD=H_PAD, TQ=tq, BLOCK_S=block_s, FP4=fp4,
                         BF16_SCORE=bf16, GATHER=gather, IEEE=ieee, GPU_OPS=_SCORE_GPU_OPS and not INTERPRET,
                         STAGES=stages, num_warps=warps)


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
    """The radix engine in one program per row, for the rows whose flag is set (the others return
    at once and write nothing): the passes of _PASSES (key bits 20-31, 8-19, 0-7) over the whole
    row while the boundary bin overflows CAP, the ordered compaction, then _final_select.  One
    launch: the sync-free fallback."""
    row = tl.program_id(0)
    if tl.load(flag_ptr + row * flag_stride) != 0:
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
    row = tl.program_id(0)
    c = tl.program_id(1)
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
    row = tl.program_id(0)
    c = tl.program_id(1)
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
    row = tl.program_id(0)
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
    kk = tl.arange(0, K_PAD)
    chosen = kk < written
    if BY_SCORE:
        comp = tl.load(scratch_ptr + row * K_PAD + kk, mask=chosen, other=-0x7FFFFFFFFFFFFFFF - 1)
        if K_PAD <= 256:  # rank by counting
            slot = tl.sum((comp[None, :] > comp[:, None]).to(tl.int32), axis=1)
        else:
            comp = tl.sort(comp, descending=True)
            slot = kk
        pos = (0xFFFFFFFF - (comp & 0xFFFFFFFF)).to(tl.int32)
    else:
        pos = tl.load(scratch_ptr + row * K_PAD + kk, mask=chosen, other=0x7FFFFFFF)
        if K_PAD <= 256:
            slot = tl.sum((pos[None, :] < pos[:, None]).to(tl.int32), axis=1)
        else:
            pos = tl.sort(pos)
            slot = kk
    if REMAP:
        pos = tl.load(remap_ptr + row * remap_stride + pos, mask=chosen, other=0)
    tl.store(out_ptr + row * out_stride + slot, pos.to(tl.int64), mask=chosen)
    tl.store(out_ptr + row * out_stride + kk, tl.full((K_PAD,), -1, tl.int64),
             mask=(kk >= written) & (kk < k))


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
    """
    R, N = x.shape
    mask = mask_out is not None
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


def _topk_filter(x, n_valid, k: int, out, *, by_score: bool, drop_neg_inf: bool, remap, mask: bool,
                 mask_block: int, group, cap, blocks) -> torch.Tensor | None:
    """The threshold filter's launches, writing the rows it serves into out; returns int32 [R]
    flags of the rows it could not serve (None: it serves none of this shape)."""
    R, N = x.shape
    dev = x.device
    tune = _filter_config(R, N, k, blocks)
    plan = _filter_plan(N, k, tune.block, group, cap)
    if plan is None:
        return None
    G, cap = plan
    k_pad = _pow2(k)
    M = triton.cdiv(N, G)
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


def _check_lengths(op: str, lens, T: int, width: int, name: str = "visible") -> torch.Tensor:
    """Per-row counts of reachable positions, each in [0, width]; int32 for the kernels."""
    lens = _need_tensor(name, op, lens, 1)
    if lens.is_floating_point() or lens.dtype == torch.bool or lens.is_complex():
        raise TypeError(f"{op}: {name} must be an integer tensor, got {str(lens.dtype).replace('torch.', '')}")
    if lens.shape[0] != T:
        raise ValueError(f"{op}: {name} has {lens.shape[0]} entries, expected one per query ({T})")
    if T and (int(lens.min()) < 0 or int(lens.max()) > width):
        raise ValueError(f"{op}: {name} must lie in [0, {width}] (the row width), got "
                         f"[{int(lens.min())}, {int(lens.max())}]")
    return lens.to(torch.int32)


def _check_k(op: str, k, width: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(k).__name__}")
    if k < 0 or k > width:
        raise ValueError(f"{op}: {name} must be an int in [0, {width}] (the row width), got {k}")
    return k


def _float_input(op: str, name: str, x, ndim: int, bf16: bool) -> torch.Tensor:
    """A floating tensor without NaN; in bf16 mode its finite values must be BF16 numbers."""
    x = _need_tensor(name, op, x, ndim)
    if not x.is_floating_point():
        raise TypeError(f"{op}: {name} must be float32 or bfloat16, got {str(x.dtype).replace('torch.', '')}")
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{op}: {name} contains NaN")
    if x.dtype == torch.bfloat16:
        return x.contiguous() if bf16 else x.float().contiguous()
    x = x.float()
    if not bf16:
        return x.contiguous()
    xb = x.to(torch.bfloat16)
    if not torch.equal(xb.float(), x):
        raise ValueError(f"{op}: {name} must hold BF16-representable values (the BF16 score takes "
                         f"BF16 inputs; round them first)")
    return xb.contiguous()


def _check_score_shapes(op: str, T: int, H: int, S: int, D: int, w: torch.Tensor, D_k: int):
    if D_k != D:
        raise ValueError(f"{op}: q has head dim {D} but k has {D_k}")
    if tuple(w.shape) != (T, H):
        raise ValueError(f"{op}: w must have shape [T, H] = [{T}, {H}], got {tuple(w.shape)}")


def _score_inputs(op: str, q, k, w, visible, bf16: bool):
    """Validated (q, k, w, visible int32) of a score op."""
    q = _float_input(op, "q", q, 3, bf16)
    k = _float_input(op, "k", k, 2, bf16)
    w = _float_input(op, "w", w, 2, bf16)
    T, H, D = q.shape
    _check_score_shapes(op, T, H, k.shape[0], D, w, k.shape[1])
    return q, k, w, _check_lengths(op, visible, T, k.shape[0])


def index_scores(q, k, w, visible, score_dtype: str = "bf16") -> torch.Tensor:
    """I[t,s] = sum_h w[t,h] * ReLU(q[t,h] . k[s]) for s < visible[t], -inf elsewhere (f32 [T,S]).

    score_dtype "bf16" rounds as the V4/V4.1 reference does (official-rules.md §4.1): each head's
    dot to BF16, the weighted ReLU to BF16, the head sum (fp32 accumulation) to BF16.  "fp32"
    keeps every step in fp32.
    """
    op = "index_scores"
    if score_dtype not in SCORE_DTYPES:
        raise ValueError(f"{op}: score_dtype must be one of {SCORE_DTYPES}, got {score_dtype!r}")
    bf16 = score_dtype == "bf16"
    q, k, w, vis = _score_inputs(op, q, k, w, visible, bf16)
    (T, H, D), S = q.shape, k.shape[0]
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
    w = _float_input(op, "w", w, 2, True)
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
    vis = _check_lengths(op, visible, T, S)
    if T == 0 or S == 0:
        return torch.full((T, S), float("-inf"), dtype=torch.float32)
    dev = _device()
    out = torch.empty((T, S), dtype=torch.float32, device=dev)
    _launch_scores(*(x.contiguous().to(dev) for x in (q_packed, q_scales, k_packed, k_scales, w)),
                   vis.to(dev), None, T, S, H, D, out, fp4=True, bf16=True)
    return out.cpu()


def _check_scores_row(op: str, scores) -> torch.Tensor:
    return _float_input(op, "scores", scores, 2, False)


def index_topk(scores, visible, k: int, order: str) -> torch.Tensor:
    """Top-k positions of each row among s < visible[t] (int64 [T,k], -1 as trailing padding).

    order "score" (V4): descending score.  order "position" (V4.1): ascending position.  Exactly
    min(k, visible[t]) entries are valid.  Ties: the lowest positions win (implementation-defined).
    """
    op = "index_topk"
    scores = _check_scores_row(op, scores)
    T, S = scores.shape
    vis = _check_lengths(op, visible, T, S)
    k = _check_k(op, k, S)
    if order not in ORDERS:
        raise ValueError(f"{op}: order must be one of {ORDERS}, got {order!r}")
    if T == 0 or k == 0 or S == 0:
        return torch.full((T, k), -1, dtype=torch.int64)
    dev = _device()
    return _topk_engine(scores.to(dev), vis.to(dev), k, by_score=order == "score").cpu()


# --------------------------------------------------------------------------------------------
# Hadamard rotation, head weights, visible counts: launchers (input checks are impl's helpers)


def _fl32_bits(value: float) -> int:
    """The IEEE binary32 bit pattern of value rounded to nearest even (numpy's conversion)."""
    return int(np.float32(value).view(np.int32))


def _elementwise(kernel, x: torch.Tensor, out_dtype: torch.dtype, *args) -> torch.Tensor:
    """kernel over the flat elements of x, on the compute device; a CPU tensor of x's shape."""
    dev = _device()
    out = torch.empty(x.shape, dtype=out_dtype, device=dev)
    n = x.numel()
    if n:
        kernel[(triton.cdiv(n, _ELEMENTWISE_BLOCK),)](x.contiguous().to(dev), out, n, *args,
                                                      BLOCK=_ELEMENTWISE_BLOCK)
    return out.cpu()


def hadamard(x) -> torch.Tensor:
    """bf16(H x / sqrt(128)) over the last dimension: Sylvester H, no signs (official-rules.md §3).

    x holds BF16 values (float32 or bfloat16); the result is float32 holding BF16 values, equal
    bit for bit to impl's fp32 butterfly."""
    op = "hadamard"
    x = _impl_bf16_values(op, "x", _impl_tensor(op, "x", x, floating=True))
    D = spec.HADAMARD_DIM
    if x.dim() == 0 or x.shape[-1] != D:
        raise ValueError(f"{op}: last dimension must be {D}, got shape {tuple(x.shape)}")
    dev = _device()
    out = torch.empty(x.shape, dtype=torch.float32, device=dev)
    n_rows = x.numel() // D
    if n_rows:
        _hadamard_kernel[(triton.cdiv(n_rows, _HADAMARD_ROWS),)](
            x.contiguous().to(dev), out, n_rows, _fl32_bits(spec.HADAMARD_SCALE),
            ROWS=_HADAMARD_ROWS, D=D, num_warps=4)
    return out.cpu()


def index_rotate(x, model: str) -> torch.Tensor:
    """The model's rotation of indexer q and k: hadamard in V3.2 and V4, a copy in V4.1."""
    if spec.rotates_index_qk(profile(model)):
        return hadamard(x)
    op = "index_rotate"
    return _elementwise(_copy_kernel, _impl_bf16_values(op, "x", _impl_tensor(op, "x", x, floating=True)),
                        torch.float32)


def index_weights(raw_w, model: str) -> torch.Tensor:
    """bf16(raw_w * fl32(index_head_dim^-0.5 * index_n_heads^-0.5)), the V4/V4.1 head weights."""
    op = "index_weights"
    m = profile(model)
    if m.score_dtype != "bf16":
        raise ValueError(f"{op}: {model} folds the per-token q scale into the weights; "
                         f"expected a V4 or V4.1 model")
    raw_w = _impl_bf16_values(op, "raw_w", _impl_tensor(op, "raw_w", raw_w, 2, floating=True))
    if raw_w.shape[1] != m.index_n_heads:
        raise ValueError(f"{op}: raw_w has {raw_w.shape[1]} heads, expected {model}'s "
                         f"index_n_heads = {m.index_n_heads} (the factor uses the global head count)")
    return _elementwise(_weights_kernel, raw_w, torch.float32, _fl32_bits(m.index_weight_scale))


def index_weights_v32(raw_w, q_scale) -> torch.Tensor:
    """V3.2: bf16(raw_w · 64^-0.5), then · q_scale · fl32(128^-0.5) in fp32 (IDX.WEIGHT.V32)."""
    op = "index_weights_v32"
    m = profile("v3.2")
    raw_w = _impl_bf16_values(op, "raw_w", _impl_tensor(op, "raw_w", raw_w, 2, floating=True))
    q_scale = _impl_tensor(op, "q_scale", q_scale, 2, floating=True).float()
    if raw_w.shape != q_scale.shape or raw_w.shape[1] != m.index_n_heads:
        raise ValueError(f"{op}: raw_w {tuple(raw_w.shape)} and q_scale {tuple(q_scale.shape)} must both be "
                         f"[T, {m.index_n_heads}] (one FP8 scale per token and head)")
    dev = _device()
    out = torch.empty(raw_w.shape, dtype=torch.float32, device=dev)
    n = raw_w.numel()
    if n:
        _weights_v32_kernel[(triton.cdiv(n, _ELEMENTWISE_BLOCK),)](
            raw_w.contiguous().to(dev), q_scale.contiguous().to(dev), out, n, _fl32_bits(m.index_n_heads ** -0.5),
            _fl32_bits(m.index_head_dim ** -0.5), BLOCK=_ELEMENTWISE_BLOCK)
    return out.cpu()


def index_visible(positions, ratio: int) -> torch.Tensor:
    """(p + 1) // ratio compressed entries are visible to the query at absolute position p."""
    op = "index_visible"
    positions = _impl_tensor(op, "positions", positions, integer=True).to(torch.int64)
    if not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"{op}: ratio must be a positive int, got {ratio!r}")
    if ratio > torch.iinfo(torch.int64).max:
        raise ValueError(f"{op}: ratio must fit in int64, got {ratio}")
    if (positions < 0).any():
        raise ValueError(f"{op}: positions must be ≥ 0")
    return _elementwise(_visible_kernel, positions, torch.int64, int(ratio))
