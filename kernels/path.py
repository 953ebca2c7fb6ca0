"""Triton kernel for the path family: RoPE then quantize, fused (what engines run when they write a
cache entry): rope_quantize for the index K (FP4, E8M0/32), the V4.1 main KV (FP4, E4M3/16) and the
V4.1 window (FP8, E8M0/32).

One program owns ROWS scale blocks.  A block lies inside one token's row; its elements are loaded
as pairs (2i, 2i+1), the pairs inside the rotated slice turn by the token's (cos, sin) and are
rounded to BF16, and the block is quantized by the quant family's device helpers.

Exactness: cos and sin come from the launcher (torch.polar of fl32(p·f) on the CPU, impl's table);
a·cos − b·sin and a·sin + b·cos are two fp32 products and one sum each, never fused on the GPU
(enable_fp_fusion=False), as impl computes them; BF16 rounding and the codecs are the quant
kernels' integer arithmetic.  So the bytes equal impl's bit for bit in both modes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..impl import path as _impl_path
from ..impl.indexer import _bf16_values, _tensor
from ..impl.rope import rope_table
from .quant import (INTERPRETED, _abs_max_rows, _bf16_round, _device, _e2m1_code_from_scaled_thresholds,
                    _e2m1_code_of_exact, _e4m3_decode, _e4m3_encode_magnitude, _fp8_block_codes, _num_warps,
                    _pow2, _pow2_ceil_exponent)

__all__ = ["rope_quantize"]

FP4_E8M0, FP4_E4M3, FP8_E8M0 = 0, 1, 2
_FORMATS = {"fp4_e8m0": (FP4_E8M0, 32), "fp4_e4m3": (FP4_E4M3, 16), "fp8_e8m0_32": (FP8_E8M0, 32)}


@triton.jit
def _rotated_pairs(x_ptr, cos_ptr, sin_ptr, rows, row_ok, D: tl.constexpr, RD: tl.constexpr,
                   BLOCK: tl.constexpr):
    """The blocks `rows` as [ROWS, BLOCK/2] even and odd lanes, rotated where inside the last RD."""
    HALF: tl.constexpr = BLOCK // 2
    per_token: tl.constexpr = D // BLOCK
    token = rows // per_token
    col0 = (rows % per_token) * BLOCK
    pair = tl.arange(0, HALF)[None, :]
    offs = (token * D + col0)[:, None] + 2 * pair
    a = tl.load(x_ptr + offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(x_ptr + offs + 1, mask=row_ok[:, None], other=0.0).to(tl.float32)
    i = (col0[:, None] + 2 * pair - (D - RD)) // 2          # pair index inside the rotated slice
    inside = (i >= 0) & row_ok[:, None]
    table = token[:, None] * (RD // 2) + tl.where(inside, i, 0)
    c = tl.load(cos_ptr + table, mask=inside, other=1.0)
    s = tl.load(sin_ptr + table, mask=inside, other=0.0)
    ra = _bf16_round(a * c - b * s)
    rb = _bf16_round(a * s + b * c)
    return tl.where(inside, ra, a), tl.where(inside, rb, b)


@triton.jit
def _rope_quantize_kernel(x_ptr, cos_ptr, sin_ptr, q_ptr, s_ptr, nblocks, D: tl.constexpr, RD: tl.constexpr,
                          FMT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    HALF: tl.constexpr = BLOCK // 2
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < nblocks
    ra, rb = _rotated_pairs(x_ptr, cos_ptr, sin_ptr, rows, row_ok, D, RD, BLOCK)
    x = tl.join(ra, rb)                                       # [ROWS, HALF, 2]: element 2i, 2i+1
    if FMT == 2:
        code, e = _fp8_block_codes(tl.reshape(x, (ROWS, BLOCK)), False)
        cols = tl.arange(0, BLOCK)
        tl.store(q_ptr + rows[:, None] * BLOCK + cols[None, :], code.to(tl.uint8), mask=row_ok[:, None])
        tl.store(s_ptr + rows, (e + 127).to(tl.uint8), mask=row_ok)
    else:
        amax = tl.max(_abs_max_rows(x, False), axis=1)
        if FMT == 1:
            t = tl.math.div_rn(tl.maximum(amax, 0.01171875), 6.0)
            s_code = _e4m3_encode_magnitude(t)
            codes = _e2m1_code_from_scaled_thresholds(x, _e4m3_decode(s_code)[:, None, None])
        else:
            e = _pow2_ceil_exponent(tl.maximum(amax, 7.052316384526264e-38) * 0.1666666716337204)
            s_code = e + 127
            codes = _e2m1_code_of_exact(x, tl.where(e >= 128, 0.0, _pow2(-tl.minimum(e, 127)))[:, None, None])
        lo, hi = tl.split(codes)
        half = tl.arange(0, HALF)
        tl.store(q_ptr + rows[:, None] * HALF + half[None, :], (lo | (hi << 4)).to(tl.uint8), mask=row_ok[:, None])
        tl.store(s_ptr + rows, s_code.to(tl.uint8), mask=row_ok)


def rope_quantize_device(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fmt: str):
    """x [T, D] and the (cos, sin) table [T, rd/2] on the compute device -> (payload, scales)."""
    code, block = _FORMATS[fmt]
    T, D = x.shape
    nblocks = T * D // block
    payload = torch.empty((T, D if code == FP8_E8M0 else D // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((T, D // block), dtype=torch.uint8, device=x.device)
    if nblocks:
        rows = max(1, (8192 if INTERPRETED else 4096) // block)
        options = {} if INTERPRETED else {"enable_fp_fusion": False}
        _rope_quantize_kernel[(triton.cdiv(nblocks, rows),)](
            x, cos, sin, payload, scales, nblocks, D=D, RD=2 * cos.shape[1], FMT=code, BLOCK=block, ROWS=rows,
            num_warps=_num_warps(), **options)
    return payload, scales


def rope_quantize(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, fmt: str):
    op = "rope_quantize"
    _impl_path._format(op, fmt)
    x = _bf16_values(op, "x", _tensor(op, "x", x, 2, floating=True))
    positions = _tensor(op, "positions", positions, 1, integer=True)
    freqs = _tensor(op, "freqs", freqs, 1, floating=True).float()
    block = _FORMATS[fmt][1]
    if x.shape[0] != positions.shape[0] or 2 * freqs.shape[0] > x.shape[1] or x.shape[1] % block \
            or (x.shape[1] - 2 * freqs.shape[0]) % block:
        raise ValueError(f"{op}: x must be [T, D] with one position per token, D a multiple of {block} holding "
                         f"the {2 * freqs.shape[0]} rotated channels on a block boundary; got x {tuple(x.shape)}, "
                         f"{positions.shape[0]} positions")
    if (positions < 0).any():
        raise ValueError(f"{op}: positions must be ≥ 0")
    cos, sin = rope_table(positions, freqs)
    device = _device()
    payload, scales = rope_quantize_device(x.contiguous().to(device), cos.to(device), sin.to(device), fmt)
    return payload.cpu(), scales.cpu()
