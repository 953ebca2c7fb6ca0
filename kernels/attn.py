"""Triton kernel for the attn family: sparse attention over index lists (prefill and decode).

One program owns one token, BLOCK_H = 16 heads (fewer are padded with zero q, as V4's launcher
does) and a slice of BLOCK_DV output channels.  It walks the token's list in blocks of 64 entries
in list order, as the official kernel: gathers the 64 KV rows (−1 read as 0), scores them on the
tensor cores (BF16 operands, fp32 accumulation) times the fp32 scale (−inf at −1), updates the
running max (−inf for V4, −1e30 for V4.1), adds the fp32 probabilities to the sum and their BF16
roundings times the rows' output slice to the fp32 accumulator, both rescaled by exp(old − new).
Then the sink in the denominator, the division and the BF16 output.

Splitting the output channels over programs (BLOCK_DV < D, chosen when tokens × head groups are
too few to fill the GPU, i.e. at decode) repeats the scores in every slice program; they are the
same computation on the same data, so the running maxima, and hence the probabilities' roundings,
are those of the unsplit kernel (only the second product's tile shape changes).  The list is never split (that would round against other maxima: the
attn_order=split variant).

Exactness: BF16 roundings by the quant kernels' integer arithmetic (`_bf16_round`, identical on
the GPU and in the interpreter); the fp32 dots, exp and division are within ATTN's tolerance.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..impl.attn import check_attention_inputs
from ..spec import attn as spec
from .quant import INTERPRETED, _bf16_round, _device

__all__ = ["sparse_attention"]

BLOCK_H = 16
SM_TARGET = 128            # programs below which the output channels are split (decode)
STAGES = 2                 # software pipelining of the list's blocks on the GPU


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a·b with fp32 accumulation: BF16 tensor-core operands, or (IEEE: the interpreter, whose BF16
    dot multiplies raw bits) the same BF16 values as fp32 operands."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D: tl.constexpr,
           BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, IEEE: tl.constexpr):
    """One block of 64 list entries: gather, score, running max, both sums rescaled."""
    entry = start + tl.arange(0, BLOCK_K)
    idx = tl.load(idx_ptr + t * K + entry, mask=entry < K, other=-1)
    valid = idx != -1
    row = tl.where(valid, idx, 0).to(tl.int64)
    keys = tl.load(kv_ptr + row[:, None] * D + dims[None, :], mask=valid[:, None], other=0.0)
    s = _dot(q, tl.trans(keys), IEEE) * scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    rescale = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    total = total * rescale + tl.sum(p, 1)
    if BLOCK_DV == D:
        values = keys                                 # K = V: the same rows
    else:
        values = tl.load(kv_ptr + row[:, None] * D + dv[None, :], mask=valid[:, None], other=0.0)
    acc = acc * rescale[:, None] + _dot(_bf16_round(p).to(tl.bfloat16), values, IEEE)
    return acc, total, m_new


@triton.jit
def _sparse_attention_kernel(q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr, H, K, scale, init,
                             D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                             BLOCK_DV: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    dims = tl.arange(0, D)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + (t * H + heads)[:, None] * D + dims[None, :], mask=head_ok[:, None], other=0.0)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    m = tl.full((BLOCK_H,), 0.0, tl.float32) + init
    if STAGES > 0:
        for start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc, total, m = _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D, BLOCK_K,
                                   BLOCK_DV, IEEE)
    else:                                  # the interpreter cannot range over run-time scalars
        start = 0
        while start < K:
            acc, total, m = _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D, BLOCK_K,
                                   BLOCK_DV, IEEE)
            start += BLOCK_K
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
    total = total + tl.exp(sink - m)
    o = _bf16_round(acc / total[:, None])
    tl.store(out_ptr + (t * H + heads)[:, None] * D + dv[None, :], o, mask=head_ok[:, None])


def _slice(T: int, groups: int, D: int) -> int:
    """Output channels per program: all of them unless too few programs would run (decode)."""
    dv = D
    while T * groups * (D // dv) < SM_TARGET and dv > 64 and not INTERPRETED:
        dv //= 2
    return dv


def sparse_attention(q, kv, sink, indices, scale, *, model: str) -> torch.Tensor:
    """The launcher: CPU tensors in and out (the kernel on CUDA, or in the interpreter)."""
    op = "sparse_attention"
    try:
        init = spec.running_max_init(spec.model_of(model))
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None
    q, kv, sink, indices, scale = check_attention_inputs(op, q, kv, sink, indices, scale)
    out = launch(*(x.to(_device()) for x in (q.bfloat16(), kv.bfloat16(), sink, indices.to(torch.int32))),
                 float(scale), init)
    return out.float().cpu()


def config(D: int, dv: int) -> dict:
    """The compile-time arguments of one launch (the sm_90 compile test builds these)."""
    return dict(D=D, BLOCK_H=BLOCK_H, BLOCK_K=spec.BLOCK, BLOCK_DV=dv, IEEE=INTERPRETED,
                STAGES=0 if INTERPRETED else STAGES, num_warps=4 if D <= 128 else 8)


def launch(q, kv, sink, indices, scale: float, init: float, block_dv: int | None = None) -> torch.Tensor:
    """Device tensors in (q [T, H, D] BF16, kv [N, D] BF16, sink [H] fp32, indices [T, K] int32),
    the BF16 output [T, H, D] out; D a power of two ≥ 16."""
    T, H, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"sparse_attention (kernels): head dim must be a power of two ≥ 16, got {D}")
    K = indices.shape[1]
    out = torch.empty(T, H, D, dtype=torch.bfloat16, device=q.device)
    groups = triton.cdiv(H, BLOCK_H)
    dv = block_dv or _slice(T, groups, D)
    if T == 0:
        return out
    _sparse_attention_kernel[(T, groups, D // dv)](
        q.contiguous(), kv.contiguous(), sink.float().contiguous(), indices.contiguous(), out, H, K, scale, init,
        **config(D, dv))
    return out
