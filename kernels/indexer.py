"""Triton kernels of the indexer family (V4-model L380-432, V41-model L488-610).

Operations (CPU tensors in and out; CUDA when present, the Triton interpreter otherwise):

    index_scores(q [T,H,D], k [S,D], w [T,H], visible [T], score_dtype="bf16") -> f32 [T,S]
    index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible)          -> f32 [T,S]
    index_topk(scores [T,S], visible [T], k, order)                                 -> i64 [T,k]
    hadamard(x [..., 128])                                                          -> f32 [..., 128]
    index_rotate(x [..., 128], model)                                               -> f32
    index_weights(raw_w [T,H], model)                                               -> f32 [T,H]
    index_weights_v32(raw_w [T,64], q_scale [T,64])                                 -> f32 [T,64]
    index_visible(positions int [...], ratio)                                       -> i64 [...]

(kernels.pool builds candidate_blocks and reindex_topk on the score kernel here and on the top-k
engine of kernels.topk, which index_topk runs too.)

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

import numpy as np
import torch
import triton
import triton.language as tl

from ..impl.indexer import _bf16_values as _impl_bf16_values
from ..impl.indexer import _tensor as _impl_tensor
from .mode import INTERPRET
from .topk import _pow2, _topk_engine
from ..spec import indexer as spec
from ..spec.models import profile

__all__ = ["hadamard", "index_rotate", "index_weights", "index_weights_v32", "index_scores", "index_scores_fp4",
           "index_visible", "index_topk"]
# Operations of the indexer family's contract (properties.indexer.OPS) with no kernel here, and why.
NOT_PROVIDED = {"index_scores_raw": "an alternative entry point for a target whose score kernel takes the raw head "
                                    "weights (the official factorisation); kernels, like impl, provides index_weights "
                                    "and index_scores, which the same rules judge",
                "index_scores_fp8": "V3.2's logits from E4M3 q and k (DeepGEMM's fp8_mqa_logits form); the kernels "
                                    "serve V4's FP4 indexer",
                "index_scores_fp8_cache": "the same over a LAYOUT.V32.INDEX_K cache (fp8_paged_mqa_logits); V3.2 only"}

SCORE_DTYPES = ("bf16", "fp32")
ORDERS = ("score", "position")


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() and not INTERPRET else torch.device("cpu")


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


def _fp4_pair_ptx(byte: int, out: str, f1: str, f2: str) -> str:
    """PTX of _fp4_pair_bits of byte `byte` of register $in, then its two BF16 multiplies into out."""
    return f"""
        prmt.b32 x, $in, 0, {0x4440 + byte:#x};
        mul.lo.u32 m, x, 0x40040;
        mul.lo.u32 s, x, 0x1001000;
        and.b32 m, m, 0x01C001C0;
        and.b32 s, s, 0x80008000;
        or.b32 m, m, s;
        mul.rn.bf16x2 m, m, {f1};
        mul.rn.bf16x2 {out}, m, {f2};"""


# four bytes of one register ($4) -> $0..$3; factors $5..$8 and $9..$12 (pack 4)
_FP4_BYTES_PTX = tl.constexpr("{ .reg .b32 x, m, s;" + "".join(
    _fp4_pair_ptx(i, f"${i}", f"${5 + i}", f"${9 + i}") for i in range(4)).replace("$in", "$4") + "\n}")


@triton.jit
def _fp4_bf16x2(b, f1, f2):
    """Byte b (two E2M1 codes, element 2i low) -> the uint32 of the BF16 pair (code 2i in the low
    half) of their values times f1 * f2 (f1, f2: BF16 powers of two, each as a uint32 with the
    value in both halves), four bytes an asm block: _fp4_pair_bits (the value times 2^-126
    exactly, a subnormal for the exponent-0 codes), then two mul.rn.bf16x2, exact (two
    significant bits) or the IEEE overflow, as _fp4_rows's fp32 path."""
    return tl.inline_asm_elementwise(_FP4_BYTES_PTX, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [b, f1, f2],
                                     dtype=tl.uint32, is_pure=True, pack=4)


@triton.jit
def _bf16_pair(f):
    """fp32 f, exact in BF16 -> uint32 with BF16(f) in both halves."""
    return (f.to(tl.uint32, bitcast=True) >> 16) * 0x10001


@triton.jit
def _fp4_pair_bits(x):
    """Byte x (uint32) -> uint32 whose halves are BF16 patterns of its two codes' values times
    2^-126 (the low nibble's in the low half): the sign to bit 15 and the three magnitude bits to
    6-8 of each half, each multiply placing both nibbles (the asm blocks' arithmetic)."""
    return ((x * 0x40040) & 0x01C001C0) | ((x * 0x1001000) & 0x80008000)


@triton.jit
def _fp4_pair_scaled(x, f1, f2):
    """_fp4_bf16x2 of byte x (uint32) in fp32 arithmetic for the interpreter: each half widened
    exactly, times f1 and f2 (fp32), exact (or the IEEE overflow), narrowed to its top 16 bits."""
    t = _fp4_pair_bits(x)
    lo = ((t << 16).to(tl.float32, bitcast=True) * f1 * f2).to(tl.uint32, bitcast=True) >> 16
    hi = ((t & 0xFFFF0000).to(tl.float32, bitcast=True) * f1 * f2).to(tl.uint32, bitcast=True)
    return lo | (hi & 0xFFFF0000)


@triton.jit
def _pair_halves(x, AS_FP32: tl.constexpr):
    """uint32 of a BF16 pair -> (low, high): fp32 (exact widening) or the uint16 patterns."""
    if AS_FP32:
        return (x << 16).to(tl.float32, bitcast=True), (x & 0xFFFF0000).to(tl.float32, bitcast=True)
    return (x & 0xFFFF).to(tl.uint16), (x >> 16).to(tl.uint16)


@triton.jit
def _fp4_rows(b_ptr, s_ptr, rows, row_ok, R: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
              AS_FP32: tl.constexpr, DECODE_X2: tl.constexpr):
    """[R, D_PAD] E2M1 x E8M0/32 values of `rows` (packed two codes a byte, element 2i low), exact
    in BF16: ((code * 2^-126) * f1) * f2 is the exact product (or its IEEE overflow).  The bytes
    are read 16 to a scale group and each group's scale is decoded once; bf16 (fp32 for the
    interpreter, whose bf16 -> fp32 conversion mishandles subnormals).  DECODE_X2: the same
    values with a byte's two codes in one register (_fp4_pair_bits; BF16 multiplies by inline
    PTX on the GPU, _fp4_pair_scaled in the interpreter)."""
    G_PAD: tl.constexpr = D_PAD // 32
    g = tl.arange(0, G_PAD)
    gm = row_ok[:, None] & (g < D // 32)[None, :]
    f1, f2 = _fp4_group_factors(tl.load(s_ptr + rows[:, None] * (D // 32) + g[None, :], mask=gm,
                                        other=127))
    c = tl.arange(0, 16)
    b = tl.load(b_ptr + rows[:, None, None] * (D // 2) + g[None, :, None] * 16 + c[None, None, :],
                mask=gm[:, :, None], other=0)
    if DECODE_X2:
        if AS_FP32:
            pairs = _fp4_pair_scaled(b.to(tl.uint32), f1[:, :, None], f2[:, :, None])
        else:
            pairs = _fp4_bf16x2(b, _bf16_pair(f1)[:, :, None], _bf16_pair(f2)[:, :, None])
        lo, hi = _pair_halves(pairs, AS_FP32)
        v = tl.reshape(tl.join(lo, hi), (R, D_PAD))
        return v if AS_FP32 else v.to(tl.bfloat16, bitcast=True)
    b = b.to(tl.uint32)
    f1 = f1[:, :, None]
    f2 = f2[:, :, None]
    v = tl.reshape(tl.join(_e2m1_bias1(b & 15) * f1 * f2, _e2m1_bias1(b >> 4) * f1 * f2),
                   (R, D_PAD))
    if AS_FP32:
        return v
    # exact in BF16 (<= 2 significant bits): its top 16 bits, no conversion instruction (slow on Hopper)
    return (v.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


# BF16 roundings of the score epilogue on the GPU (ROUND_* constexprs; the interpreter takes ROUND_INT)
ROUND_INT = tl.constexpr(0)  # integer arithmetic on the fp32 bits (_bf16_rne_no_nan)
ROUND_CVT = tl.constexpr(1)  # Triton's fp32 -> bf16 conversion (RNE: cvt.rn.bf16x2.f32 on sm_90)
ROUND_X2 = tl.constexpr(2)   # pairs by inline PTX: cvt.rn.bf16x2.f32 (and mul.rn.bf16x2 for p_h)
ROUNDINGS = {"int": 0, "cvt": 1, "x2": 2}


@triton.jit
def _bf16x2_weighted(relu, w):
    """bf16(bf16(relu) * w) as fp32, two elements an instruction: cvt.rn.bf16x2.f32 packs the pair
    (its first source in the high half), mul.rn.bf16x2 rounds each exact product once, and the
    halves widen exactly (a shift, a mask).  w must hold BF16 values."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 t;
        cvt.rn.bf16x2.f32 t, $3, $2;
        mul.rn.bf16x2 t, t, $4;
        shl.b32 $0, t, 16;
        and.b32 $1, t, 0xFFFF0000;
        }""",
        "=r,=r,r,r,r", [relu, w.to(tl.bfloat16)], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _bf16x2_round(x):
    """bf16(x) (RNE) as fp32, two elements a cvt.rn.bf16x2.f32."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 t;
        cvt.rn.bf16x2.f32 t, $3, $2;
        shl.b32 $0, t, 16;
        and.b32 $1, t, 0xFFFF0000;
        }""",
        "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _score_epilogue(acc, w, BLOCK_S: tl.constexpr, TQ: tl.constexpr, H_PAD: tl.constexpr,
                    BF16_SCORE: tl.constexpr, GPU_OPS: tl.constexpr, HEAD_ROUND: tl.constexpr,
                    FINAL_ROUND: tl.constexpr):
    """[BLOCK_S, TQ*H_PAD] head dots -> [BLOCK_S, TQ] scores: s_h = bf16(acc), p_h = bf16(ReLU(s_h)
    w_h), I = bf16(sum_h p_h) (fp32 accumulation); or all in fp32.  ReLU(bf16(a)) = bf16(ReLU(a)):
    the rounding is monotone and keeps 0.  GPU_OPS: max.f32 (a NaN gives 0, as the where does) and
    the BF16 multiply (mul.rn.bf16: one RNE of the exact product), which take the integer
    rounding of p_h off Hopper's integer pipe, the epilogue's bottleneck.  HEAD_ROUND (s_h, with
    GPU_OPS) and FINAL_ROUND (I) say how the BF16 roundings are computed (ROUND_*): every way is
    RNE with subnormals kept, so the bits are the same whichever is taken; the fp32 head sum is
    the same reduction of the same values in every variant (elementwise ops keep the layout)."""
    if GPU_OPS:
        relu = tl.maximum(acc, 0.0)
    else:
        relu = tl.where(acc > 0.0, acc, 0.0)
    if BF16_SCORE and GPU_OPS and HEAD_ROUND == ROUND_X2:
        p = _bf16x2_weighted(relu, w[None, :])
    elif BF16_SCORE and GPU_OPS:
        if HEAD_ROUND == ROUND_CVT:
            s_h = relu.to(tl.bfloat16, fp_downcast_rounding="rtne")
        else:
            s_h = (_bf16_rne_no_nan(relu).to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16,
                                                                                            bitcast=True)
        p = (s_h * w.to(tl.bfloat16)[None, :]).to(tl.float32)
    elif BF16_SCORE:
        p = _bf16_rne_no_nan(_bf16_rne_no_nan(relu) * w[None, :])
    else:
        p = relu * w[None, :]
    score = tl.sum(tl.reshape(p, (BLOCK_S, TQ, H_PAD)), axis=2)
    if BF16_SCORE and FINAL_ROUND == ROUND_X2:
        score = _bf16x2_round(score)
    elif BF16_SCORE and FINAL_ROUND == ROUND_CVT:
        score = score.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    elif BF16_SCORE:
        score = _bf16_rne_no_nan(score)
    return score


@triton.jit
def _scores_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, vis_ptr, idx_ptr, out_ptr,
                   T, S, H, out_stride, idx_stride, n_s_progs,
                   D: tl.constexpr, D_PAD: tl.constexpr, H_PAD: tl.constexpr, TQ: tl.constexpr,
                   BLOCK_S: tl.constexpr, FP4: tl.constexpr, BF16_SCORE: tl.constexpr,
                   GATHER: tl.constexpr, IEEE: tl.constexpr, GPU_OPS: tl.constexpr,
                   STAGES: tl.constexpr, BLOCK_MAX: tl.constexpr, HEAD_ROUND: tl.constexpr,
                   FINAL_ROUND: tl.constexpr, FP4_X2: tl.constexpr):
    """Program (t, s) holds TQ queries x H_PAD heads of q (the MMA's N side) and takes key blocks
    s, s + n_s_progs, ... below the tile's largest visible count (a pipelined loop of STAGES on
    the GPU), then writes -inf into its key blocks past that count.  BLOCK_MAX > 0: out holds
    each query's maxima over blocks of BLOCK_MAX positions instead of the scores (_score_block).
    HEAD_ROUND, FINAL_ROUND: _score_epilogue;
    FP4_X2: the key blocks' FP4 decode (_fp4_rows's DECODE_X2)."""
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
        q = _fp4_rows(q_ptr, qs_ptr, q_row, row_ok, NQ, D, D_PAD, IEEE, False)
    else:
        q = tl.load(q_ptr + q_row[:, None] * D + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
    w = tl.load(w_ptr + q_row, mask=row_ok, other=0.0).to(tl.float32)
    tq = tl.arange(0, TQ)
    t_q = pid_t * TQ + tq
    vis = tl.load(vis_ptr + t_q, mask=t_q < T, other=0)
    vmax = tl.max(vis, axis=0)
    n_vis = tl.cdiv(vmax, BLOCK_S)  # key blocks some query of the tile sees
    first, step, last = pid_s, n_s_progs, tl.cdiv(S, BLOCK_S)
    end = tl.minimum(n_vis, last)  # this program's blocks below it are scored, the rest are -inf
    if STAGES > 0:
        for sb in tl.range(first, end, step, num_stages=STAGES):
            _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                         idx_stride, pid_t, vmax, D, D_PAD, H_PAD, TQ, BLOCK_S, FP4, BF16_SCORE,
                         GATHER, IEEE, GPU_OPS, BLOCK_MAX, HEAD_ROUND, FINAL_ROUND, FP4_X2)
    else:  # the interpreter (3.6) cannot range over run-time scalars
        sb = first
        while sb < end:
            _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                         idx_stride, pid_t, vmax, D, D_PAD, H_PAD, TQ, BLOCK_S, FP4, BF16_SCORE,
                         GATHER, IEEE, GPU_OPS, BLOCK_MAX, HEAD_ROUND, FINAL_ROUND, FP4_X2)
            sb += step
    # the causal tail: this program's blocks from n_vis on are -inf without a multiply
    sb = first + tl.cdiv(tl.maximum(end - first, 0), step) * step
    while sb < last:
        if BLOCK_MAX > 0:  # (the newest block lies below n_vis: nothing to pin here)
            NBB: tl.constexpr = BLOCK_S // BLOCK_MAX
            b = sb * NBB + tl.arange(0, NBB)
            tl.store(out_ptr + t_q[None, :] * out_stride + b[:, None],
                     tl.full((NBB, TQ), float("-inf"), tl.float32),
                     mask=(b[:, None] < tl.cdiv(S, BLOCK_MAX)) & (t_q[None, :] < T))
        else:
            j = sb * BLOCK_S + tl.arange(0, BLOCK_S)
            tl.store(out_ptr + t_q[None, :] * out_stride + j[:, None],
                     tl.full((BLOCK_S, TQ), float("-inf"), tl.float32),
                     mask=(j[:, None] < S) & (t_q[None, :] < T))
        sb += step


@triton.jit
def _score_block(q, w, vis, t_q, sb, k_ptr, ks_ptr, idx_ptr, out_ptr, T, S, out_stride,
                 idx_stride, pid_t, vmax, D: tl.constexpr, D_PAD: tl.constexpr,
                 H_PAD: tl.constexpr, TQ: tl.constexpr, BLOCK_S: tl.constexpr, FP4: tl.constexpr,
                 BF16_SCORE: tl.constexpr, GATHER: tl.constexpr, IEEE: tl.constexpr,
                 GPU_OPS: tl.constexpr, BLOCK_MAX: tl.constexpr, HEAD_ROUND: tl.constexpr,
                 FINAL_ROUND: tl.constexpr, FP4_X2: tl.constexpr):
    """Scores of key block sb for the tile's queries: acc = k_blk @ q^T, epilogue, -inf where
    the query does not see the key.  BLOCK_MAX > 0 (a power of two dividing BLOCK_S): instead of
    the scores, their maxima over blocks of BLOCK_MAX positions, the query's newest block
    ((visible - 1) // BLOCK_MAX, when visible > 0) pinned to +inf: kernels.pool._block_scores of
    the scores, without writing or reading them."""
    j = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    k_ok = j < vmax
    if GATHER:  # TQ == 1: key rows come from this query's gathered position list
        pos = tl.load(idx_ptr + pid_t * idx_stride + j, mask=k_ok, other=0)
    else:
        pos = j
    if FP4:
        kt = _fp4_rows(k_ptr, ks_ptr, pos, k_ok, BLOCK_S, D, D_PAD, IEEE, FP4_X2)
    else:
        d = tl.arange(0, D_PAD)
        kt = tl.load(k_ptr + pos[:, None] * D + d[None, :], mask=k_ok[:, None] & (d < D)[None, :],
                     other=0.0)
    if IEEE:  # fp32 operands; also the interpreter, whose bf16 dot multiplies raw bits
        acc = tl.dot(kt.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")
    else:
        acc = tl.dot(kt, tl.trans(q))  # [BLOCK_S, TQ*H_PAD], fp32 accumulation
    score = _score_epilogue(acc, w, BLOCK_S, TQ, H_PAD, BF16_SCORE, GPU_OPS, HEAD_ROUND, FINAL_ROUND)
    score = tl.where(j[:, None] < vis[None, :], score, float("-inf"))
    if BLOCK_MAX > 0:
        NBB: tl.constexpr = BLOCK_S // BLOCK_MAX
        best = tl.max(tl.reshape(score, (NBB, BLOCK_MAX, TQ)), axis=1)
        b = sb * NBB + tl.arange(0, NBB)
        newest = tl.where(vis > 0, (vis - 1) // BLOCK_MAX, -1)
        best = tl.where(b[:, None] == newest[None, :], float("inf"), best)
        tl.store(out_ptr + t_q[None, :] * out_stride + b[:, None], best,
                 mask=(b[:, None] < tl.cdiv(S, BLOCK_MAX)) & (t_q[None, :] < T))
    else:
        tl.store(out_ptr + t_q[None, :] * out_stride + j[:, None], score,
                 mask=(j[:, None] < S) & (t_q[None, :] < T))


_SCORE_N = 128  # GPU: MMA columns (queries x padded heads) per program
_SCORE_M = 64  # GPU: keys per block (the MMA's M side)
_SCORE_WARPS = 4
# The score epilogue's max.f32 and BF16 multiply on the GPU (_score_epilogue); False falls back to
# the interpreter's integer rounding, for a GPU whose BF16 multiply would not be IEEE (subnormals:
# test_bf16_scores_match_impl[wide_exponents] run on the GPU is the check).
_SCORE_GPU_OPS = True
# A/B switches of the score kernel, read at each launch (bench/ab_logits.py; every value gives the
# same bits, tests/test_kernels_indexer.py checks each on the GPU).  The BF16 roundings of the
# epilogue (ROUNDINGS; the interpreter always takes "int"): s_h and p_h, and the per-key score I.
# Shipped: packed pairs ("x2") and the FP4 keys decoded a byte at a time in BF16 pairs ("bytes"):
# on the H200 (12-02, docs/records/h200/2026-12-02-ab-logits.md) T = 1 S = 1M H = 64 took 80 µs against
# 100 with the integer rounding and fp32 decode (still "int_fp32"), the same bits.
_SCORE_HEAD_ROUND = "x2"
_SCORE_FINAL_ROUND = "x2"
# The FP4 keys' decode (_fp4_rows): "fp32" one code a register, or "bytes" a byte's two codes a
# register in BF16 pairs.  (Measured and dropped, 12-02: the bytes loaded as 32-bit words, 83 µs against
# 80; each program's key blocks as one contiguous run instead of a stride, 103 against 100.)
_SCORE_FP4_DECODE = "bytes"
FP4_DECODES = {"fp32": 0, "bytes": 1}
# Named settings of the switches above (the A/B's variants and the tests' parameters); "shipped" first.
SCORE_AB = {
    "shipped": {},
    "int_fp32": dict(_SCORE_HEAD_ROUND="int", _SCORE_FINAL_ROUND="int", _SCORE_FP4_DECODE="fp32"),
    "round_int": dict(_SCORE_HEAD_ROUND="int", _SCORE_FINAL_ROUND="int"),
    "round_cvt": dict(_SCORE_HEAD_ROUND="cvt", _SCORE_FINAL_ROUND="cvt"),
    "fp4_fp32": dict(_SCORE_FP4_DECODE="fp32"),
}


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


def _launch_scores(q, qs, k, ks, w, vis32, idx, T, S, H, D, out, fp4: bool, bf16: bool, block_max: int = 0):
    """The score kernel on [T, S] (out f32 [T, S]); block_max > 0 (a power of two): out f32
    [T, cdiv(S, block_max)] gets the block maxima instead, the newest block +inf (_score_block)."""
    H_PAD = _pow2(H, 16)
    D_PAD = _pow2(D, 32)
    gather = idx is not None
    tq, block_s, n_s, warps, stages = _score_config(T, S, H_PAD, D_PAD, gather)
    if block_max and (block_max & (block_max - 1) or block_s % block_max):
        raise ValueError(f"_launch_scores: block_max {block_max} must be a power of two dividing the key "
                         f"block ({block_s})")
    ieee = INTERPRET or ((not fp4) and q.dtype == torch.float32)
    if INTERPRET and not fp4:  # exact widening on the host: the interpreter's bf16 -> fp32
        q, k, w = q.float(), k.float(), w.float()  # conversion mishandles subnormals
    gpu = not INTERPRET
    rounds = tuple(ROUNDINGS[r] if gpu else 0 for r in (_SCORE_HEAD_ROUND, _SCORE_FINAL_ROUND))
    decode = FP4_DECODES[_SCORE_FP4_DECODE] if fp4 else 0
    grid = (triton.cdiv(T, tq), n_s)
    _scores_kernel[grid](q, qs if fp4 else q, k, ks if fp4 else k, w, vis32,
                         idx if gather else vis32, out, T, S, H, out.stride(0),
                         idx.stride(0) if gather else 0, n_s,
                         D=D, D_PAD=D_PAD, H_PAD=H_PAD, TQ=tq, BLOCK_S=block_s, FP4=fp4,
                         BF16_SCORE=bf16, GATHER=gather, IEEE=ieee, GPU_OPS=_SCORE_GPU_OPS and gpu,
                         STAGES=stages, BLOCK_MAX=block_max, HEAD_ROUND=rounds[0], FINAL_ROUND=rounds[1],
                         FP4_X2=decode, num_warps=warps)


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

    score_dtype "bf16" rounds as the V4/V4.1 reference does (V4-model L420-421, V41-model L555-557): each head's
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

    Packed bytes hold element 2i in the low nibble; scale byte b is 2^(b-127) (V4-kernel
    L161-164, L193; spec/formats.py).  Each E2M1 x E8M0 product is exact in BF16, so the in-register dequantization and
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
    """bf16(H x / sqrt(128)) over the last dimension: Sylvester H, no signs (V4-model L247-251).

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
