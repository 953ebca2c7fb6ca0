"""official.quant: the FP4 / FP8 codecs and their element casts as the official kernels compute them.

A transcription, in torch, of the TileLang quantizers (V4-kernel L22-27, L77-96, L161-177;
`act_quant_kernel` and `fp4_quant_kernel`, V4.1 `fp4_act_quant(..., scale_dtype=float8_e4m3fn)`),
in their order of operations:

    amax = reduce_absmax(x) in fp32              a max reduction: NaN is skipped (CUDA fmax)
    amax = max(amax, floor)                      6·2^-126 (E8M0), 6·2^-9 (E4M3), 1e-4 (FP8)
    s    = fast_pow2(fast_log2_ceil(amax · fl32(1/max)))   or   s = E4M3(amax / 6)
    q    = cast(clamp(x / s, −max, max))         E2M1 or E4M3, round to nearest even, satfinite

The quantizers take BF16 only, as the kernels (compiled with in_dtype = BF16) do, and reject
nothing: a NaN or Inf goes wherever these operations send it, inside its own block (§11.1).
Outputs are the byte views of the kernels' float4_e2m1fn_x2 / float8 tensors.

torch's float8_e4m3fn cast after a clamp to ±448 stands in for the kernels' satfinite E4M3
conversion (the cast alone saturates in some torch releases, not in others): it is proven to agree
with FMT.E4M3.RNE / SATFINITE on everything the quantizers feed it (every BF16 pattern, every fp32
subnormal, every fl32(b / 6) of a BF16 b) by tests/test_official.py.  torch has no element
FP4 cast, so E2M1 is rounded below with exact torch operations.  This module is not impl/: it does
what the official code does, where impl states the rule.
"""
from __future__ import annotations

import math

import torch

__all__ = [
    "e2m1_encode", "e2m1_decode", "e4m3_encode", "e4m3_decode", "e8m0_decode", "bf16_round",
    "fp4_pack", "fp4_unpack",
    "fp4_e4m3_quantize", "fp4_e4m3_dequantize",
    "fp4_e8m0_quantize", "fp4_e8m0_dequantize",
    "fp8_quantize", "fp8_dequantize", "fp8_qdq", "fp8_linear",
]

# The quantizers' input dtype (properties/target.py); the element casts take fp32, as the CUDA
# conversions do.
INPUT_DTYPES = {op: "bfloat16" for op in ("fp4_e4m3_quantize", "fp4_e8m0_quantize", "fp8_quantize",
                                          "fp8_qdq", "fp8_linear")}

FP4_MAX, FP8_MAX = 6.0, 448.0
FP4_MAX_INV = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)     # fl32(1/6), the kernel's constant
FP8_MAX_INV = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)     # fl32(1/448)
FP4_E8M0_FLOOR = 6 * 2.0 ** -126        # V4-kernel fp4_quant_kernel
FP4_E4M3_FLOOR = 6 * 2.0 ** -9          # V4.1: "keep even an all-zero group's scale nonzero"
FP8_FLOOR = torch.tensor(1e-4, dtype=torch.float32)
FP4_TABLE = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,                # convert.py
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


# ---------------------------------------------------------------------------------------------
# The kernels' helpers
# ---------------------------------------------------------------------------------------------

def fast_log2_ceil(x: torch.Tensor) -> torch.Tensor:
    """The exponent field − 127, plus 1 if any mantissa bit is set (V4-kernel L22-27)."""
    bits = x.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return exponent - 127 + ((bits & ((1 << 23) - 1)) != 0).to(torch.int32)


def fast_pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e rebuilt from the bits (V4-kernel L30-33)."""
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def _bf16_input(op: str, x: torch.Tensor, block: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{op}: the official kernel is compiled for bfloat16 input, got {got}")
    if x.shape[-1] % block:
        raise ValueError(f"{op}: last dimension {x.shape[-1]} is not a multiple of the block ({block})")
    return x.contiguous().view(-1, x.shape[-1] // block, block).float()


def _reduce_absmax(xb: torch.Tensor) -> torch.Tensor:
    """T.reduce_absmax in fp32: a max reduction that skips NaN, as CUDA's fmax does."""
    magnitude = xb.abs()
    return torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude).amax(-1)


def _e8m0_byte(s: torch.Tensor) -> torch.Tensor:
    """T.Cast(FE8M0, s) of a power of two: its exponent field (Inf gives 0xFF, the E8M0 NaN)."""
    return ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def _e2m1_cast(r: torch.Tensor) -> torch.Tensor:
    """The E2M1 conversion of a clamped |r| ≤ 6: round to nearest even on the E2M1 grid.

    The grid spacing is 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]; scaling by that spacing is exact,
    and torch.round rounds half to even, so each tie lands on the even code.  A NaN (only a NaN input
    makes one) encodes as 0 with its sign: the rule leaves that block unspecified.
    """
    magnitude = torch.nan_to_num(r.abs(), nan=0.0)
    spacing = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    value = torch.round(magnitude / spacing) * spacing
    code = torch.searchsorted(FP4_TABLE[:8], value.contiguous()).to(torch.uint8)
    return code | (torch.signbit(r).to(torch.uint8) << 3)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2: element 2i in the low nibble (V4-kernel L193, convert.py)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unblock(t: torch.Tensor, lead) -> torch.Tensor:
    """[rows, blocks(, block)] back to [*lead, width]; the width is explicit, so zero rows reshape too."""
    return t.reshape(*lead, math.prod(t.shape[1:]))


# ---------------------------------------------------------------------------------------------
# Element casts
# ---------------------------------------------------------------------------------------------

def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 codes: clamp to ±6 (the kernels clamp before every FP4 cast), then round."""
    return _e2m1_cast(x.float().clamp(-FP4_MAX, FP4_MAX))


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    return FP4_TABLE[codes.long()]


def _e4m3_satfinite(x: torch.Tensor) -> torch.Tensor:
    """The kernels' satfinite E4M3 conversion.  The clamp is written out: torch's cast saturates in
    some releases (2.13) and gives NaN above 448 in others (2.11, seen on the H200 machine)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    return _e4m3_satfinite(x).view(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).float()


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e8m0fnu).float()


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.bfloat16).float()


def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    return _pack(codes)


def fp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


# ---------------------------------------------------------------------------------------------
# FP4: indexer Q/K (E8M0 per 32, V4 and V4.1) and V4.1 main KV (E4M3 per 16)
# ---------------------------------------------------------------------------------------------

def fp4_e8m0_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4_act_quant(x, 32): (float4_e2m1fn_x2 bytes [..., n/2], float8_e8m0fnu bytes [..., n/32])."""
    xb = _bf16_input("fp4_e8m0_quantize", x, 32)
    amax = torch.clamp(_reduce_absmax(xb), min=FP4_E8M0_FLOOR)
    s = fast_pow2(fast_log2_ceil(amax * FP4_MAX_INV))
    codes = _e2m1_cast(torch.clamp(xb / s.unsqueeze(-1), -FP4_MAX, FP4_MAX))
    return _pack(_unblock(codes, x.shape[:-1])), _unblock(_e8m0_byte(s), x.shape[:-1])


def fp4_e4m3_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V4.1 fp4_act_quant(x, 16, scale_dtype=float8_e4m3fn): (FP4 bytes, E4M3 scale bytes)."""
    xb = _bf16_input("fp4_e4m3_quantize", x, 16)
    amax = torch.clamp(_reduce_absmax(xb), min=FP4_E4M3_FLOOR)
    s = _e4m3_satfinite(amax / torch.full_like(amax, FP4_MAX))   # nearest E4M3
    ratio = xb / s.float().unsqueeze(-1)                  # divided by the ROUNDED scale
    codes = _e2m1_cast(torch.clamp(ratio, -FP4_MAX, FP4_MAX))
    return _pack(_unblock(codes, x.shape[:-1])), _unblock(s.view(torch.uint8), x.shape[:-1])


def _fp4_dequantize(packed, scales, block, decode_scale):
    values = e2m1_decode(fp4_unpack(packed))
    values = values.reshape(*values.shape[:-1], values.shape[-1] // block, block) * decode_scale(scales).unsqueeze(-1)
    return values.flatten(-2)


def fp4_e8m0_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _fp4_dequantize(packed, scales, 32, e8m0_decode)


def fp4_e4m3_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _fp4_dequantize(packed, scales, 16, e4m3_decode)


# ---------------------------------------------------------------------------------------------
# FP8 act_quant (scale_fmt = "ue8m0")
# ---------------------------------------------------------------------------------------------

def _act_quant_ratio(op: str, x: torch.Tensor, block: int):
    """clamp(x / s, ±448) and s, per block (V4-kernel L77-83)."""
    xb = _bf16_input(op, x, block)
    amax = torch.maximum(_reduce_absmax(xb), FP8_FLOOR)
    s = fast_pow2(fast_log2_ceil(amax * FP8_MAX_INV))
    return torch.clamp(xb / s.unsqueeze(-1), -FP8_MAX, FP8_MAX), s


def fp8_quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(x, block, "ue8m0", float8_e8m0fnu): (E4M3 bytes [..., n], E8M0 bytes [..., n/b])."""
    ratio, s = _act_quant_ratio("fp8_quantize", x, block)
    q = ratio.to(torch.float8_e4m3fn).view(torch.uint8)
    return _unblock(q, x.shape[:-1]), _unblock(_e8m0_byte(s), x.shape[:-1])


def fp8_dequantize(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    values = e4m3_decode(q)
    values = values.reshape(*values.shape[:-1], values.shape[-1] // block, block) * e8m0_decode(scales).unsqueeze(-1)
    return values.flatten(-2)


def fp8_qdq(x: torch.Tensor, block: int) -> torch.Tensor:
    """act_quant(..., inplace=True) as V4.1 and the later V4 kernels write it back: BF16 of
    fp32(E4M3(clamp(x / s))) · s (the initial V4 kernel casts through BF16 instead: FP8.V4_INPLACE)."""
    ratio, s = _act_quant_ratio("fp8_qdq", x, block)
    rounded = ratio.to(torch.float8_e4m3fn).float() * s.unsqueeze(-1)
    return _unblock(rounded.to(torch.bfloat16), x.shape[:-1]).float()


# ---------------------------------------------------------------------------------------------
# linear() of a float8_e4m3fn weight: act_quant, then fp8_gemm
# ---------------------------------------------------------------------------------------------

def fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, block: int) -> torch.Tensor:
    """fp8_gemm_kernel (V4-kernel L204-273; V4.1 with block_size 32): per K block the fp32 dot
    of the E4M3 tiles, times s_a · s_b (one fp32 product), added to an fp32 accumulator in K order;
    the accumulator cast to BF16.  The dot of a tile is torch's fp32 matmul here, the tensor core's
    on the GPU: the one freedom FP8.LINEAR's tolerance gives."""
    m, k = a.shape
    n = b.shape[0]
    a_vals, b_vals = e4m3_decode(a), e4m3_decode(b)
    scale_b = e8m0_decode(b_s).repeat_interleave(block, dim=0)[:n]          # one row per output
    scale_a = e8m0_decode(a_s)
    acc = torch.zeros(m, n)
    for kb in range(k // block):
        cols = slice(kb * block, (kb + 1) * block)
        c_local = a_vals[:, cols] @ b_vals[:, cols].T
        acc += c_local * (scale_a[:, kb:kb + 1] * scale_b[:, kb][None, :])
    return acc.to(torch.bfloat16)


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int) -> torch.Tensor:
    """linear(x, weight) of an E4M3 weight (V4-model L116-118, V4.1 L196-205): x, s = act_quant(x, b,
    "ue8m0"); fp8_gemm(x, s, weight, weight.scale).  BF16 values out, as f32."""
    lead, k = x.shape[:-1], x.shape[-1]
    q, s = fp8_quantize(x.reshape(-1, k), block)
    return fp8_gemm(q, s, w.view(torch.uint8), w_scale.view(torch.uint8), block).reshape(*lead, w.shape[0]).float()
