"""The quantization codecs and element formats in readable torch (the reference implementation).

Written independently of spec/ (which is numpy): the same rules, derived another way, so that each
checks the other.  Every rounding is exact: integer arithmetic on fp32 bit patterns, exact frexp,
and single IEEE fp32 operations.  No framework cast is used to round anything.

Inputs are CPU tensors: values float32 or bfloat16, codes and bytes uint8, all contiguous.
"""
from __future__ import annotations

import torch

__all__ = [
    "e2m1_encode", "e2m1_decode", "e4m3_encode", "e4m3_decode", "e8m0_decode", "bf16_round",
    "fp4_pack", "fp4_unpack",
    "fp4_e4m3_quantize", "fp4_e4m3_dequantize",
    "fp4_e8m0_quantize", "fp4_e8m0_dequantize",
    "fp8_quantize", "fp8_dequantize", "fp8_qdq", "fp8_linear",
]

FP4_MAX, FP8_MAX = 6.0, 448.0
FP4_KV_BLOCK, FP4_IDX_BLOCK = 16, 32
FP4_KV_AMAX_FLOOR = 6 * 2.0 ** -9       # so the E4M3 scale is at least 2^-9
FP4_IDX_AMAX_FLOOR = 6 * 2.0 ** -126    # so the E8M0 scale is at least 2^-126
FP8_AMAX_FLOOR = 1e-4                   # read as fp32, like the kernel's constant

# E2M1 magnitudes and the decision boundary above each; True where an exact tie rounds up (to the
# even code): 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
E2M1_TABLE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
              (5.0, False))


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------

def _values(op: str, x, block: int = 1, finite: bool = False) -> torch.Tensor:
    """x as float32, after checking type, dtype, layout, shape and (optionally) finiteness."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{op}: expected float32 or bfloat16 values, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{op}: the input must be contiguous (call .contiguous())")
    if x.dim() == 0:
        raise ValueError(f"{op}: expected at least one dimension, got a scalar")
    if x.shape[-1] % block:
        raise ValueError(f"{op}: last dimension {x.shape[-1]} is not a multiple of the block ({block})")
    x = x.float()
    if finite:
        bad = (~torch.isfinite(x)).nonzero()
        if len(bad):
            where = tuple(bad[0].tolist())
            raise ValueError(f"{op}: non-finite input {x[where].item()} at index {where}; NaN and "
                             f"±Inf are rejected (E2M1 has neither; rules FP4.NONFINITE, FP8.NONFINITE)")
    return x


def _bytes(op: str, t, what: str = "codes") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor of {what}, got {type(t).__name__}")
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise TypeError(f"{op}: expected uint8 {what}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: the {what} must be contiguous (call .contiguous())")
    if t.dim() == 0:
        raise ValueError(f"{op}: expected at least one dimension, got a scalar")
    return t


def _block_param(op: str, block) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{op}: block must be a positive int, got {block!r}")
    return block


def _scale_shape(op: str, payload: torch.Tensor, scales: torch.Tensor, n: int, block: int):
    want = (*payload.shape[:-1], n // block)
    if n % block or tuple(scales.shape) != want:
        raise ValueError(f"{op}: {n} values need scales of shape {want} (one per {block}), "
                         f"got {tuple(scales.shape)}")


# ---------------------------------------------------------------------------------------------
# fp32 bit helpers
# ---------------------------------------------------------------------------------------------

def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns as non-negative int64."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int64).to(torch.int32).view(torch.float32)   # wraps 2^31.. to negative int32


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in fp32, built from its bits (exact for −149 ≤ e ≤ 127)."""
    e = e.to(torch.int64)
    normal = (e.clamp(min=-126) + 127) << 23
    subnormal = torch.ones_like(e) << (e + 149).clamp(0, 22)
    return _from_bits(torch.where(e >= -126, normal, subnormal))


def _ceil_log2(v: torch.Tensor) -> torch.Tensor:
    """ceil(log2 v) of positive fp32 v, exactly: v = m·2^k with m in [0.5, 1) gives k − (m == 0.5)."""
    m, k = torch.frexp(v)
    return k.to(torch.int64) - (m == 0.5).to(torch.int64)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 a / b, elementwise (b broadcast as a tensor, never folded into a reciprocal)."""
    return torch.div(a, b.expand_as(a).contiguous())


# ---------------------------------------------------------------------------------------------
# Element formats
# ---------------------------------------------------------------------------------------------

def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> E2M1 codes (uint8 0..15): nearest magnitude, ties to even, saturating at ±6."""
    x = _values("e2m1_encode", x, finite=True)
    magnitude = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8)
    for boundary, tie_rounds_up in E2M1_STEPS:
        code += (magnitude >= boundary) if tie_rounds_up else (magnitude > boundary)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    codes = _bytes("e2m1_decode", codes)
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"e2m1_decode: codes are nibbles 0..15, got {int(codes.max())}")
    return torch.tensor(E2M1_TABLE, dtype=torch.float32)[codes.long()]


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn bytes: round to nearest even, saturating at ±448, NaN -> 0x7F|sign."""
    x = _values("e4m3_encode", x)
    magnitude = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))   # non-finite: below
    _, exponent = torch.frexp(magnitude)
    binade = (exponent.to(torch.int64) - 1).clamp(min=-6)     # below 2^-6 the spacing stays 2^-9
    binade = torch.where(magnitude == 0, -6, binade)           # frexp(0) has exponent 0
    # magnitude / spacing, with spacing = 2^(binade - 3): an exact power-of-two scaling, then RNE.
    quanta = torch.round(magnitude * _pow2(3 - binade)).to(torch.int64)
    code = (((binade + 6) << 3) + quanta).clamp(max=0x7E)     # quanta 16 carries into the next binade
    code = torch.where(torch.isinf(x), 0x7E, code)
    code = torch.where(torch.isnan(x), 0x7F, code)
    return (code | (torch.signbit(x).to(torch.int64) << 7)).to(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    wanted = _bytes("e4m3_decode", codes).to(torch.int64)
    codes = torch.arange(256)   # the formula on each of the 256 codes, then looked up (weights are millions)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 0x7
    magnitude = torch.where(exponent == 0, mantissa * _pow2(torch.full_like(codes, -9)),
                            (8 + mantissa) * _pow2(exponent - 10))
    value = torch.where(codes >= 0x80, -magnitude, magnitude)
    return torch.where((codes & 0x7F) == 0x7F, float("nan"), value)[wanted]


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> 2^(b − 127) in fp32 (b = 0 is the subnormal 2^-127); 0xFF -> NaN."""
    codes = _bytes("e8m0_decode", codes).to(torch.int64)
    return torch.where(codes == 0xFF, float("nan"), _pow2(codes - 127))


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """The fp32 value of the bfloat16 nearest to x (ties to even; NaN stays NaN)."""
    bits = _bits(_values("bf16_round", x))
    kept, dropped = bits & ~0xFFFF, bits & 0xFFFF
    lsb = (bits >> 16) & 1
    up = (dropped > 0x8000) | ((dropped == 0x8000) & (lsb == 1))
    rounded = kept + (up.to(torch.int64) << 16)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return _from_bits(torch.where(is_nan, kept | 0x00400000, rounded))


# ---------------------------------------------------------------------------------------------
# FP4 packing
# ---------------------------------------------------------------------------------------------

def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., n] (nibbles) -> bytes [..., n/2]: element 2i low nibble, 2i+1 high nibble."""
    codes = _bytes("fp4_pack", codes)
    if codes.shape[-1] % 2:
        raise ValueError(f"fp4_pack: last dimension {codes.shape[-1]} is not even")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"fp4_pack: codes are nibbles 0..15, got {int(codes.max())}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def fp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    packed = _bytes("fp4_unpack", packed, "packed bytes")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _e2m1_of_ratio(ratio: torch.Tensor) -> torch.Tensor:
    """clamp(r, −6, 6) then E2M1, flattened back to the element axis."""
    codes = e2m1_encode(ratio.clamp(-FP4_MAX, FP4_MAX).contiguous())
    return codes.reshape(*codes.shape[:-2], codes.shape[-2] * codes.shape[-1])


# ---------------------------------------------------------------------------------------------
# V4.1 main KV: FP4 with one E4M3 scale per 16
# ---------------------------------------------------------------------------------------------

def fp4_e4m3_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., 16k] -> (packed FP4 [..., 8k] uint8, E4M3 scale bytes [..., k] uint8)."""
    x = _values("fp4_e4m3_quantize", x, FP4_KV_BLOCK, finite=True)
    xb = _blocks(x, FP4_KV_BLOCK)
    amax = xb.abs().amax(dim=-1).clamp(min=FP4_KV_AMAX_FLOOR)
    scale_bytes = e4m3_encode(_div(amax, torch.tensor(FP4_MAX)))    # nearest E4M3 to amax/6
    scale = e4m3_decode(scale_bytes).unsqueeze(-1)
    codes = _e2m1_of_ratio(_div(xb, scale))                         # divide by the ROUNDED scale
    return fp4_pack(codes), scale_bytes


def _fp4_dequantize(op: str, packed, scales, block: int, decode_scale) -> torch.Tensor:
    """E2M1 value × decoded scale of its block, in fp32 (exact)."""
    packed = _bytes(op, packed, "packed bytes")
    scales = _bytes(op, scales, "scale bytes")
    _scale_shape(op, packed, scales, 2 * packed.shape[-1], block)
    values = _blocks(e2m1_decode(fp4_unpack(packed)), block)
    return (values * decode_scale(scales).unsqueeze(-1)).flatten(-2)


def fp4_e4m3_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed [..., n/2], E4M3 scales [..., n/16]) -> f32 [..., n] = E2M1 value × scale."""
    return _fp4_dequantize("fp4_e4m3_dequantize", packed, scales, FP4_KV_BLOCK, e4m3_decode)


# ---------------------------------------------------------------------------------------------
# Power-of-two (E8M0) scales: indexer FP4 per 32 and act_quant FP8 per block
# ---------------------------------------------------------------------------------------------

def _pow2_scale(amax: torch.Tensor, floor: float, elem_max: float) -> torch.Tensor:
    """The exponent of 2^ceil(log2(fl32(max(amax, floor) · fl32(1/elem_max))))."""
    reciprocal = torch.tensor(1.0) / torch.tensor(elem_max)          # the fp32 constant 1/max
    return _ceil_log2(amax.clamp(min=floor) * reciprocal)


def fp4_e8m0_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., 32k] -> (packed FP4 [..., 16k] uint8, E8M0 scale bytes [..., k] uint8)."""
    x = _values("fp4_e8m0_quantize", x, FP4_IDX_BLOCK, finite=True)
    xb = _blocks(x, FP4_IDX_BLOCK)
    exponent = _pow2_scale(xb.abs().amax(dim=-1), FP4_IDX_AMAX_FLOOR, FP4_MAX)
    codes = _e2m1_of_ratio(_div(xb, _pow2(exponent).unsqueeze(-1)))
    return fp4_pack(codes), (exponent + 127).to(torch.uint8)


def fp4_e8m0_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed [..., n/2], E8M0 scales [..., n/32]) -> f32 [..., n] = E2M1 value × 2^(b−127)."""
    return _fp4_dequantize("fp4_e8m0_dequantize", packed, scales, FP4_IDX_BLOCK, e8m0_decode)


def _fp8_ratio(op: str, x: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
    """clamp(x / s, ±448) per block, and the exponents of s."""
    block = _block_param(op, block)
    xb = _blocks(_values(op, x, block, finite=True), block)
    exponent = _pow2_scale(xb.abs().amax(dim=-1), FP8_AMAX_FLOOR, FP8_MAX)
    ratio = _div(xb, _pow2(exponent).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    return ratio, exponent


def fp8_quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant: x [..., b·k] -> (E4M3 bytes [..., b·k] uint8, E8M0 scale bytes [..., k] uint8)."""
    ratio, exponent = _fp8_ratio("fp8_quantize", x, block)
    return e4m3_encode(ratio.contiguous()).flatten(-2), (exponent + 127).to(torch.uint8)


def fp8_dequantize(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """(E4M3 bytes [..., n], E8M0 scales [..., n/b]) -> f32 [..., n] = value × 2^(b−127)."""
    block = _block_param("fp8_dequantize", block)
    q = _bytes("fp8_dequantize", q, "E4M3 bytes")
    scales = _bytes("fp8_dequantize", scales, "scale bytes")
    _scale_shape("fp8_dequantize", q, scales, q.shape[-1], block)
    return (_blocks(e4m3_decode(q), block) * e8m0_decode(scales).unsqueeze(-1)).flatten(-2)


def fp8_qdq(x: torch.Tensor, block: int) -> torch.Tensor:
    """The in-place act_quant result the reference writes back: E4M3(clamp(x/s)) · s, f32."""
    ratio, exponent = _fp8_ratio("fp8_qdq", x, block)
    rounded = e4m3_decode(e4m3_encode(ratio.contiguous()))
    return (rounded * _pow2(exponent).unsqueeze(-1)).flatten(-2)


def _e4m3_doubles(codes: torch.Tensor) -> torch.Tensor:
    """e4m3_decode(codes).double(), each byte looked up in the 256 values (the weights are millions)."""
    table = e4m3_decode(torch.arange(256, dtype=torch.uint8)).double()
    return table.index_select(0, codes.flatten().int()).view(codes.shape)


def _block_sums(a: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """Each K block's dot [..., N, nb] of the E4M3 values a [..., nb, b] and wb [N, nb, b], exact."""
    return torch.einsum("...kb,nkb->...nk", a, wb)


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int) -> torch.Tensor:
    """The Linear of an E4M3 weight (FP8.LINEAR): x [..., K] BF16 values, w [N, K] E4M3 bytes,
    w_scale [ceil(N/b), K/b] E8M0 bytes -> f32 [..., N] holding BF16 values.

    act_quant(x, b); per K block the dot of the E4M3 values, exact (float64 of integers times
    2^-18), rounded once to fp32 and multiplied by both power-of-two scales; the block terms added
    in fp32 in K order; one BF16 rounding."""
    op = "fp8_linear"
    block = _block_param(op, block)
    w, w_scale = _bytes(op, w, "weight E4M3 bytes"), _bytes(op, w_scale, "weight scale bytes")
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"{op}: w must be [N, K] with K = x.shape[-1] = {x.shape[-1]}, got {tuple(w.shape)}")
    n, k = w.shape
    want = (-(-n // block), k // block)
    if tuple(w_scale.shape) != want:
        raise ValueError(f"{op}: w_scale has shape {tuple(w_scale.shape)}, expected [ceil(N/b), K/b] = {list(want)}")
    xq, xs = fp8_quantize(x, block)
    a = _blocks(_e4m3_doubles(xq), block)                                     # [..., nb, b]
    wb = _blocks(_e4m3_doubles(w), block)                                     # [N, nb, b]
    sums = _block_sums(a, wb).float()                                         # exact, then one fp32 rounding
    s_w = e8m0_decode(w_scale).repeat_interleave(block, dim=0)[:n]            # [N, nb]
    terms = sums * (e8m0_decode(xs).unsqueeze(-2) * s_w)
    acc = torch.zeros(terms.shape[:-1])
    for kb in range(terms.shape[-1]):
        acc = acc + terms[..., kb]
    return bf16_round(acc)
