"""Triton kernels for the quant family: FP4 (E2M1) with E4M3/16 or E8M0/32 scales, FP8 (E4M3) with
E8M0 scales and its in-place QDQ, nibble packing, and the element formats themselves (E2M1, E4M3
and E8M0 codes, BF16 rounding), each an elementwise kernel built from the same device helpers the
codecs use, so that the FMT.* rules check exactly the roundings the codecs run.

Launchers take and return CPU tensors (the target contract).  They run on CUDA when a GPU is
present, otherwise under the Triton interpreter.  The `*_device` functions take and return
tensors on the compute device without copies; the benchmark times those.

Exactness.  The interpreter's float casts differ from the GPU's, so no rounding here is a cast:
  * E4M3 and E8M0 encodings are integer arithmetic on the fp32 bit pattern (the E4M3 subnormal
    range by the fp32 magic-number add, which is IEEE round-to-nearest-even in both modes);
  * nothing divides per element.  With an E8M0 scale, x/s is x times the exact power of two 1/s,
    and its E2M1 code is integer rounding of the fp32 bits (round(2y) below 1 by the magic add).
    With an E4M3 scale, the code of E2M1_RNE(clamp(fl(x/s), -6, 6)) is the number of decision
    boundaries t (0.25 ... 5) that |x| passes, comparing |x| with the products t*s of the
    boundaries and the rounded scale.  Those products are exact fp32 numbers (s has at most 4 significant bits, t at most 3), and comparing |x| with
    them gives exactly the same code as rounding the IEEE quotient first:
      - for a strict boundary t, fl(a/s) > t  <=>  a > t*s.  If a > t*s then a >= t*s + ulp(t*s),
        so a/s - t >= ulp(t*s)/s > t*2^-24 >= ulp(t)/2, and the rounded quotient lies above t.
      - for an inclusive boundary t (0.75, 1.75, 3.5), fl(a/s) >= t  <=>  a >= t*s.  t*s is not a
        power of two, so below it the next float is t*s - ulp(t*s), and a/s <= t - ulp(t*s)/s
        < t - ulp(t)/2: the quotient rounds below t.
    So the E4M3 path is bit-identical to dividing by the rounded scale with IEEE division
    (tl.math.div_rn), without paying for a division per element.  The one division, amax/6, is
    per block and uses tl.math.div_rn.
  * BF16 input to the FP4 quantizers is read as 32-bit words of two elements
    (_fp4_quantize_bf16_kernel): each boundary product t*s is an exact BF16 number, so both
    elements' comparisons are one integer add on the word (_e2m1_pair_bytes), and no float
    operation runs per element.  fp32 input goes through _fp4_quantize_kernel.
  * BF16 rounding adds 0x7FFF + (bit 16) to the fp32 bits of the magnitude and clears the low
    half, the sign goes back in as a bit; a NaN keeps its upper half with the quiet bit set.
  * Block maxima ignore NaN, as the CUDA max reduction of the official kernel does (the launchers
    reject non-finite input anyway: rules FP4.NONFINITE / FP8.NONFINITE).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .mode import INTERPRET
from ..impl.quant import _block_param as _impl_block_param
from ..impl.quant import _bytes as _impl_bytes
from ..impl.quant import _values as _impl_values

__all__ = [
    "e2m1_encode",
    "e2m1_decode",
    "e4m3_encode",
    "e4m3_decode",
    "e8m0_decode",
    "bf16_round",
    "fp4_pack",
    "fp4_unpack",
    "fp4_e4m3_quantize",
    "fp4_e4m3_dequantize",
    "fp4_e8m0_quantize",
    "fp4_e8m0_dequantize",
    "fp8_quantize",
    "fp8_dequantize",
    "fp8_qdq",
]
# Operations of the quant family's contract (properties.quant.OPS) with no kernel here, and why.
NOT_PROVIDED = {"fp8_linear": "the block-scaled FP8 GEMM (the index q projection, FP8.LINEAR) has no Triton kernel: "
                              "kernels/quant.py covers the element formats and the KV cache's codecs"}


INTERPRETED = INTERPRET
E4M3_BLOCK = 16
E8M0_BLOCK = 32

# fp32 bit patterns and constants used inside the kernels (globals there must be constexpr).
_F32_INF_BITS = tl.constexpr(0x7F800000)
_E4M3_MIN_NORMAL_BITS = tl.constexpr(0x3C800000)   # 2^-6
_E4M3_REBIAS = tl.constexpr((127 - 7) << 3)        # fp32 exponent + 3 mantissa bits -> E4M3 code
_E4M3_MAX_CODE = tl.constexpr(0x7E)                # 448
_MAGIC_RNE = tl.constexpr(12582912.0)              # 1.5 * 2^23: x + M - M rounds x to an integer
_MAGIC_RNE_BITS = tl.constexpr(0x4B400000)         # (ties to even) and bits(x + M) - bits(M) is it
# On the GPU act_quant's E4M3 rounding is the conversion instruction (sm_89+: cvt.rn.satfinite.e4m3x2.f32,
# two elements per instruction): RNE and saturating, the spec's rounding for every value it gets
# there (the clamp before it has no NaN on the GPU, whose min/max drop NaN).  The interpreter's fp8
# cast is not trusted with a normative rounding: it runs the integer encode.  The GPU run of
# tests/test_kernels_quant.py checks the instruction bit for bit against impl.
_HW_E4M3 = tl.constexpr(not INTERPRET)


# ----------------------------------------------------------------------------------------------
# Device helpers (each identical under the interpreter and on the GPU)
# ----------------------------------------------------------------------------------------------

@triton.jit
def _abs_max_rows(x, CLEAN_NAN: tl.constexpr):
    """max |x| along the last axis, skipping NaN (the GPU's max reduction skips NaN; numpy's
    does not)."""
    a = tl.abs(x)
    if CLEAN_NAN:
        a = tl.where(a == a, a, 0.0)
    return tl.max(a, axis=len(x.shape) - 1)


@triton.jit
def _pow2_ceil_exponent(p):
    """ceil(log2 p) for positive normal fp32 p (and 128 for +Inf), read from the bits:
    the unbiased exponent, plus one if any mantissa bit is set."""
    bits = p.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    return e + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def _pow2(e):
    """2^e as fp32 for integer e in [-127, 128]: normal by the exponent bits, 2^-127 subnormal,
    2^128 = +Inf."""
    bits = tl.where(e == -127, 0x00400000, (e + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_decode(byte):
    """E8M0 byte -> 2^(byte-127); 0xFF is NaN."""
    b = byte.to(tl.int32)
    bits = tl.where(b == 0, 0x00400000, b << 23)            # 2^-127 is an fp32 subnormal
    return tl.where(b == 255, 0x7FC00000, bits).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_encode_magnitude(a):
    """E4M3 code (0..0x7E) of fp32 a >= 0, round to nearest even, saturating at 448 (NaN -> 0x7F)."""
    u = a.to(tl.int32, bitcast=True)
    # normal range: round the 23-bit mantissa to 3 bits at bit 20, ties to even
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - _E4M3_REBIAS
    normal = tl.minimum(normal, _E4M3_MAX_CODE)
    # subnormal range (a < 2^-6): the code is round(a * 2^9) in 0..8 (8 is 2^-6, the first normal)
    sub = (a * 512.0 + _MAGIC_RNE).to(tl.int32, bitcast=True) - _MAGIC_RNE_BITS
    code = tl.where(u < _E4M3_MIN_NORMAL_BITS, sub, normal)
    return tl.where(u > _F32_INF_BITS, 0x7F, code)


@triton.jit
def _e4m3_decode(code):
    """E4M3 code (0..255) -> fp32 value (0x7F and 0xFF are NaN)."""
    c = code.to(tl.int32)
    mag = c & 0x7F
    normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    sub = mag.to(tl.float32) * 0.001953125  # m * 2^-9
    bits = tl.where(mag >= 8, normal, sub).to(tl.int32, bitcast=True)
    # the sign goes in as a bit: Triton's unary minus is 0 - v, which loses the sign of zero.
    # Both NaN bytes give the one quiet NaN 0x7FC00000, as spec.formats.e4m3_decode does.
    bits = bits | ((c & 0x80) << 24)
    return tl.where(mag == 0x7F, 0x7FC00000, bits).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_encode(x):
    """E4M3 byte of fp32 x: RNE, saturating at ±448, NaN -> 0x7F/0xFF; the sign is x's sign bit."""
    return _e4m3_encode_magnitude(tl.abs(x)) | ((x.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def _passes(u, t, INCLUSIVE: tl.constexpr):
    """1 where |x| > t (|x| >= t if INCLUSIVE), from u = bits(|x|) and t > 0: non-negative floats
    order as their bits, so it is the sign bit of bits(t) - u (of bits(t) - 1 - u), one subtraction
    and one shift-and-add per element (a compare and a select would be three)."""
    v = t.to(tl.int32, bitcast=True) - INCLUSIVE
    return ((v - u).to(tl.uint32, bitcast=True) >> 31).to(tl.int32)


@triton.jit
def _e2m1_code_from_scaled_thresholds(x, s2):
    """E2M1 code (sign in bit 3) of clamp(x / s, -6, 6), rounded to nearest with ties to the even
    code, for s > 0 with at most 4 significant bits, broadcast as s2 (module docstring: why no
    division)."""
    bits = x.to(tl.int32, bitcast=True)
    u = bits & 0x7FFFFFFF
    mag = (_passes(u, 0.25 * s2, 0) + _passes(u, 0.75 * s2, 1) + _passes(u, 1.25 * s2, 0)
           + _passes(u, 1.75 * s2, 1) + _passes(u, 2.5 * s2, 0) + _passes(u, 3.5 * s2, 1)
           + _passes(u, 5.0 * s2, 0))
    return mag | ((bits >> 28) & 8)


@triton.jit
def _e2m1_code_of_exact(x, inv_s):
    """E2M1 code (sign in bit 3) of clamp(x * inv_s, -6, 6) where x * inv_s is exact (inv_s a power
    of two): round to nearest, ties to the even code, by integer arithmetic on the fp32 bits."""
    y = tl.minimum(tl.abs(x) * inv_s, 6.0)
    u = y.to(tl.int32, bitcast=True)
    # y >= 1: round the mantissa to 1 bit (bit 22), ties to even; fp32 bits of 1.0 >> 22 = 254 -> 2
    normal = ((u + 0x1FFFFF + ((u >> 22) & 1)) >> 22) - 252
    # y < 1: the code is round(2y) in 0..2 (the E2M1 subnormal spacing is 0.5)
    sub = (y * 2.0 + _MAGIC_RNE).to(tl.int32, bitcast=True) - _MAGIC_RNE_BITS
    mag = tl.where(y < 1.0, sub, normal)
    return mag | ((x.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _e2m1_decode(code):
    """E2M1 code (0..15) -> fp32: 0, .5, 1, 1.5, 2, 3, 4, 6 with the sign in bit 3."""
    m = code & 7
    # m >= 2: exponent (m >> 1) - 1, mantissa bit m & 1, i.e. fp32 bits (m + 252) << 22
    normal = ((m + 252) << 22).to(tl.float32, bitcast=True)
    v = tl.where(m >= 2, normal, m.to(tl.float32) * 0.5)
    return (v.to(tl.int32, bitcast=True) | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_round(x):
    """fp32 value of the BF16 nearest to x (RNE, overflow to ±Inf; a NaN keeps its upper half,
    made quiet).  Rounds the magnitude's bits, so the integer add never overflows."""
    bits = x.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    nan = mag > _F32_INF_BITS
    finite_mag = tl.where(nan, 0, mag)
    rounded = ((finite_mag + 0x7FFF + ((finite_mag >> 16) & 1)) >> 16) << 16
    out = tl.where(nan, ((bits >> 16) << 16) | 0x00400000, rounded | (bits ^ mag))   # bits ^ mag: sign
    return out.to(tl.float32, bitcast=True)


@triton.jit
def _unpack_pairs(packed, ROWS: tl.constexpr, HALF: tl.constexpr):
    """[ROWS, HALF] bytes -> [ROWS, 2*HALF] codes (int32)."""
    p = packed.to(tl.int32)
    return tl.reshape(tl.join(p & 15, p >> 4), (ROWS, 2 * HALF))


# ----------------------------------------------------------------------------------------------
# Kernels.  Each program owns ROWS whole scale blocks (rows of a [nblocks, BLOCK] view).
# ----------------------------------------------------------------------------------------------

@triton.jit
def _fp4_quantize_kernel(x_ptr, q_ptr, s_ptr, nblocks,
                         E4M3_SCALE: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                         CLEAN_NAN: tl.constexpr):
    HALF: tl.constexpr = BLOCK // 2
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rows = row0 + tl.arange(0, ROWS)
    row_ok = rows < nblocks
    # whole rows (16-byte loads), then viewed as [rows, pairs, 2]: the two nibbles of one byte sit
    # in one thread, so the packing below is register-local
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + rows[:, None] * BLOCK + cols[None, :], mask=row_ok[:, None], other=0.0)
    x = tl.reshape(x.to(tl.float32), (ROWS, HALF, 2))
    amax = tl.max(_abs_max_rows(x, CLEAN_NAN), axis=1)
    if E4M3_SCALE:
        s_code = _fp4_e4m3_scale_code(amax)
        codes = _e2m1_code_from_scaled_thresholds(x, _e4m3_decode(s_code)[:, None, None])
    else:
        e = _fp4_e8m0_scale_exponent(amax)
        s_code = e + 127
        inv_s = tl.where(e >= 128, 0.0, _pow2(-tl.minimum(e, 127)))   # 1/Inf = 0
        codes = _e2m1_code_of_exact(x, inv_s[:, None, None])
    lo, hi = tl.split(codes)
    packed = (lo | (hi << 4)).to(tl.uint8)
    half = tl.arange(0, HALF)
    tl.store(q_ptr + rows[:, None] * HALF + half[None, :], packed, mask=row_ok[:, None])
    tl.store(s_ptr + rows, s_code.to(tl.uint8), mask=row_ok)


@triton.jit
def _fp4_e4m3_scale_code(amax):
    """s = E4M3_RNE(max(amax, 6*2^-9) / 6), saturating at 448: its E4M3 code."""
    return _e4m3_encode_magnitude(tl.math.div_rn(tl.maximum(amax, 0.01171875), 6.0))


@triton.jit
def _fp4_e8m0_scale_exponent(amax):
    """e of s = 2^e = 2^ceil(log2(max(amax, 6*2^-126) * fl32(1/6))); the byte is e + 127."""
    return _pow2_ceil_exponent(tl.maximum(amax, 7.052316384526264e-38) * 0.1666666716337204)


@triton.jit
def _pair_bias(t, INCLUSIVE: tl.constexpr):
    """Per 16-bit lane: 0x7FFF - B (0x8000 - B if INCLUSIVE) for B the BF16 bits of t > 0, an
    exact BF16 number held in fp32 (its low half is zero)."""
    b = t.to(tl.uint32, bitcast=True) >> 16
    return (0x7FFF + INCLUSIVE - b) * 0x10001


@triton.jit
def _not(x):
    """~x of a uint32 (the interpreter's ~ forms -1, which uint32 cannot hold)."""
    return x ^ 0xFFFFFFFF


@triton.jit
def _select(mask, x, y):
    """x where mask has a 1 bit, y elsewhere."""
    return (x & mask) | (y & (mask ^ 0xFFFFFFFF))


@triton.jit
def _e2m1_pair_bytes(w, a, s):
    """Packed E2M1 byte of the two BF16 values in each 32-bit word w (element 2i in the low half,
    as in memory), a = w & 0x7FFF7FFF their magnitudes, for scale s > 0 broadcast per row.

    The code's magnitude is the number of boundaries t*s that |x| passes (module docstring), and
    every product t*s of the boundaries (<= 3 significant bits) and s (E4M3: <= 4; E8M0: a power
    of two) is an exact BF16 number B (or +Inf, passed by nothing).  Non-negative BF16 numbers
    order as their 15-bit patterns, so in each 16-bit lane a + (0x7FFF - B) carries into the lane's
    top bit exactly when |x| > B (a + 0x8000 - B when |x| >= B), and never into the next lane.  The
    seven flags are a thermometer code (the boundaries increase), read into binary by bitwise
    logic on the whole word: both elements at once, no float operation."""
    f1 = a + _pair_bias(0.25 * s, 0)
    f2 = a + _pair_bias(0.75 * s, 1)
    f3 = a + _pair_bias(1.25 * s, 0)
    f4 = a + _pair_bias(1.75 * s, 1)
    f5 = a + _pair_bias(2.5 * s, 0)
    f6 = a + _pair_bias(3.5 * s, 1)
    f7 = a + _pair_bias(5.0 * s, 0)
    b1 = f6 | (f2 & _not(f4))
    b0 = f7 | (f5 & _not(f6)) | (f3 & _not(f4)) | (f1 & _not(f2))
    # sign, b2 = f4, b1, b0 into bits 15..12 of each lane (bit selects), then one nibble a lane
    m = _select(0x80008000, w, f4 >> 1)
    m = _select(0xC000C000, m, b1 >> 2)
    m = _select(0xE000E000, m, b0 >> 3) & 0xF000F000
    return (m >> 12) | (m >> 24)


@triton.jit
def _fp4_quantize_bf16_kernel(w_ptr, q_ptr, s_ptr, nblocks, E4M3_SCALE: tl.constexpr,
                              BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """_fp4_quantize_kernel for BF16 input read as 32-bit words of two elements: integer
    arithmetic on the words throughout (the block maximum too), one byte out per word."""
    WORDS: tl.constexpr = BLOCK // 2
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < nblocks
    offs = rows[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
    w = tl.load(w_ptr + offs, mask=row_ok[:, None], other=0).to(tl.uint32, bitcast=True)
    a = w & 0x7FFF7FFF
    amax = (tl.maximum(tl.max(a & 0xFFFF, axis=1), tl.max(a >> 16, axis=1)) << 16)
    amax = amax.to(tl.float32, bitcast=True)
    if E4M3_SCALE:
        s_code = _fp4_e4m3_scale_code(amax)
        s = _e4m3_decode(s_code)
    else:
        e = _fp4_e8m0_scale_exponent(amax)
        s_code = e + 127
        s = _pow2(e)
    tl.store(q_ptr + offs, _e2m1_pair_bytes(w, a, s[:, None]).to(tl.uint8), mask=row_ok[:, None])
    tl.store(s_ptr + rows, s_code.to(tl.uint8), mask=row_ok)


@triton.jit
def _fp4_dequantize_kernel(q_ptr, s_ptr, y_ptr, nblocks,
                           E4M3_SCALE: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rows = row0 + tl.arange(0, ROWS)
    row_ok = rows < nblocks
    half = tl.arange(0, BLOCK // 2)
    packed = tl.load(q_ptr + rows[:, None] * (BLOCK // 2) + half[None, :], mask=row_ok[:, None],
                     other=0)
    s_byte = tl.load(s_ptr + rows, mask=row_ok, other=0)
    if E4M3_SCALE:
        s = _e4m3_decode(s_byte)
    else:
        s = _e8m0_decode(s_byte)
    codes = _unpack_pairs(packed, ROWS, BLOCK // 2)
    y = _e2m1_decode(codes) * s[:, None]
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + rows[:, None] * BLOCK + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _block_tile(nblocks, BLOCK: tl.constexpr, BLOCK_P2: tl.constexpr, ROWS: tl.constexpr):
    """This program's ROWS blocks of BLOCK elements (padded to BLOCK_P2 columns): the block
    indices, the element offsets [ROWS, BLOCK_P2] and their mask."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_P2)
    mask = (rows < nblocks)[:, None] & (cols < BLOCK)[None, :]
    return rows, rows[:, None] * BLOCK + cols[None, :], mask


@triton.jit
def _fp8_block_codes(x, CLEAN_NAN: tl.constexpr):
    """act_quant of the rows of x (one block each): the E4M3 codes of clamp(x/s, ±448) and the
    exponents e of the scales s = 2^e."""
    amax = _abs_max_rows(x, CLEAN_NAN)
    # s = 2^ceil(log2(max(amax, fl32(1e-4)) * fl32(1/448))); x/s = x * 2^-e exactly
    p = tl.maximum(amax, 9.999999747378752e-05) * 0.002232142863795161
    e = _pow2_ceil_exponent(p)
    y = x * _pow2(-e)[:, None]
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if _HW_E4M3:
        code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        code = _e4m3_encode(y).to(tl.uint8)
    return code, e


@triton.jit
def _fp8_quantize_kernel(x_ptr, q_ptr, s_ptr, nblocks, BLOCK: tl.constexpr,
                         BLOCK_P2: tl.constexpr, ROWS: tl.constexpr, CLEAN_NAN: tl.constexpr):
    rows, offs, mask = _block_tile(nblocks, BLOCK, BLOCK_P2, ROWS)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    code, e = _fp8_block_codes(x, CLEAN_NAN)
    tl.store(q_ptr + offs, code.to(tl.uint8), mask=mask)
    tl.store(s_ptr + rows, (e + 127).to(tl.uint8), mask=rows < nblocks)


@triton.jit
def _fp8_dequantize_kernel(q_ptr, s_ptr, y_ptr, nblocks, BLOCK: tl.constexpr,
                           BLOCK_P2: tl.constexpr, ROWS: tl.constexpr):
    rows, offs, mask = _block_tile(nblocks, BLOCK, BLOCK_P2, ROWS)
    q = tl.load(q_ptr + offs, mask=mask, other=0)
    s = _e8m0_decode(tl.load(s_ptr + rows, mask=rows < nblocks, other=0))
    y = _e4m3_decode(q) * s[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_qdq_kernel(x_ptr, y_ptr, nblocks, BLOCK: tl.constexpr, BLOCK_P2: tl.constexpr,
                    ROWS: tl.constexpr, CLEAN_NAN: tl.constexpr):
    rows, offs, mask = _block_tile(nblocks, BLOCK, BLOCK_P2, ROWS)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    code, e = _fp8_block_codes(x, CLEAN_NAN)
    # E4M3 value times 2^e: one IEEE multiplication, exact unless it overflows (as in the spec)
    tl.store(y_ptr + offs, _e4m3_decode(code) * _pow2(e)[:, None], mask=mask)


@triton.jit
def _format_kernel(in_ptr, out_ptr, n, OP: tl.constexpr, N: tl.constexpr):
    """out[i] = OP(in[i]) for one element-format operation (fp32 or uint8 in, uint8 or fp32 out)."""
    i = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)
    ok = i < n
    v = tl.load(in_ptr + i, mask=ok, other=0)
    if OP == "e2m1_encode":
        out = _e2m1_code_of_exact(v, 1.0)            # clamp to ±6 and RNE by the bits
    elif OP == "e2m1_decode":
        out = _e2m1_decode(v.to(tl.int32))
    elif OP == "e4m3_encode":
        out = _e4m3_encode(v)
    elif OP == "e4m3_decode":
        out = _e4m3_decode(v)
    elif OP == "e8m0_decode":
        out = _e8m0_decode(v)
    else:
        tl.static_assert(OP == "bf16_round", "unknown element-format operation")
        out = _bf16_round(v)
    tl.store(out_ptr + i, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _pack_kernel(c_ptr, p_ptr, npairs, N: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)
    ok = i < npairs
    lo = tl.load(c_ptr + 2 * i, mask=ok, other=0).to(tl.int32)
    hi = tl.load(c_ptr + 2 * i + 1, mask=ok, other=0).to(tl.int32)
    tl.store(p_ptr + i, (lo | (hi << 4)).to(tl.uint8), mask=ok)


@triton.jit
def _unpack_kernel(p_ptr, c_ptr, nbytes, N: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)
    ok = i < nbytes
    p = tl.load(p_ptr + i, mask=ok, other=0).to(tl.int32)
    tl.store(c_ptr + 2 * i, (p & 15).to(tl.uint8), mask=ok)
    tl.store(c_ptr + 2 * i + 1, (p >> 4).to(tl.uint8), mask=ok)


# ----------------------------------------------------------------------------------------------
# Launch configuration: fixed (no autotune: the interpreter cannot run it).  On the GPU a program
# owns 2048-4096 elements; in the interpreter fewer, larger programs are faster.
# ----------------------------------------------------------------------------------------------

# Elements per program and warps on the GPU, and the FP4 kernels' own (bench/bench_quant.py
# --sweep on the H200, 12-01, 1M x 128 BF16: FP4 dequantize -> BF16 82 / 85 % of copy at 4096 and
# 4 warps, 87 / 89 % at 8192 and 2; FP4 quantize of BF16 71 / 76 % -> 74 / 79 % at 8192 and 4.
# The fp32-input FP4 quantize keeps the default: 8192 made it slower, 54 -> 66 us at 64 MB).
GPU_CONFIG = {"elements_per_program": 4096, "num_warps": 4}
GPU_OP_CONFIG = {"fp4_quantize_bf16": {"elements_per_program": 8192},
                 "fp4_dequantize": {"elements_per_program": 8192, "num_warps": 2}}


def _config(op: str | None) -> dict:
    return {**GPU_CONFIG, **GPU_OP_CONFIG.get(op, {})}


def _rows_per_program(block: int, op: str | None = None) -> int:
    elements = 8192 if INTERPRETED else _config(op)["elements_per_program"]
    return max(1, elements // block)


def _num_warps(op: str | None = None) -> int:
    return _config(op)["num_warps"]


def _device() -> torch.device:
    return torch.device("cpu" if INTERPRETED else "cuda")


def _grid(nblocks: int, rows: int):
    return (triton.cdiv(nblocks, rows),)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

def _need_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _need_float_input(op: str, x, block: int) -> None:
    _need_tensor(op, "x", x)
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{op}: x must be float32 or bfloat16, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension")
    if x.shape[-1] % block != 0:
        raise ValueError(f"{op}: last dimension {x.shape[-1]} is not a multiple of the block ({block})")
    if not x.is_contiguous():
        raise ValueError(f"{op}: x must be contiguous (call .contiguous())")
    bad = (~torch.isfinite(x)).nonzero()
    if len(bad):
        where = tuple(bad[0].tolist())
        raise ValueError(f"{op}: non-finite input {x[where].item()} at index {where}; NaN and "
                         f"±Inf are rejected (rules FP4.NONFINITE / FP8.NONFINITE)")


_BYTE_VIEWS = (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)


def _need_uint8(op: str, name: str, t) -> torch.Tensor:
    """t as uint8 (the torch FP8/FP4 storage dtypes are accepted as views of their bytes)."""
    _need_tensor(op, name, t)
    if t.dtype in _BYTE_VIEWS:
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise TypeError(f"{op}: {name} must be uint8, got {t.dtype}")
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least one dimension")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (call .contiguous())")
    return t


def _need_block(op: str, block) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{op}: block must be a positive int, got {block!r}")
    return block


def _need_matching_scales(op: str, values_per_row: int, scales, block: int, lead, what: str):
    if tuple(scales.shape[:-1]) != tuple(lead):
        raise ValueError(f"{op}: scales leading shape {tuple(scales.shape[:-1])} does not match "
                         f"{what} leading shape {tuple(lead)}")
    if values_per_row % block != 0 or scales.shape[-1] != values_per_row // block:
        raise ValueError(f"{op}: expected {values_per_row // block} scales per row (one per {block} "
                         f"values of {values_per_row}), got {scales.shape[-1]}")


# ----------------------------------------------------------------------------------------------
# Device-level entry points (tensors already on the compute device; no copies)
# ----------------------------------------------------------------------------------------------

def fp4_quantize_device(x: torch.Tensor, e4m3_scale: bool):
    block = E4M3_BLOCK if e4m3_scale else E8M0_BLOCK
    n = x.numel()
    nblocks = n // block
    q = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=torch.uint8, device=x.device)
    s = torch.empty(x.shape[:-1] + (x.shape[-1] // block,), dtype=torch.uint8, device=x.device)
    if nblocks and x.dtype == torch.bfloat16:  # two elements a 32-bit word
        rows = _rows_per_program(block, "fp4_quantize_bf16")
        _fp4_quantize_bf16_kernel[_grid(nblocks, rows)](
            x.view(torch.int32), q, s, nblocks, E4M3_SCALE=e4m3_scale, BLOCK=block, ROWS=rows,
            num_warps=_num_warps("fp4_quantize_bf16"))
    elif nblocks:
        rows = _rows_per_program(block)
        _fp4_quantize_kernel[_grid(nblocks, rows)](
            x, q, s, nblocks, E4M3_SCALE=e4m3_scale, BLOCK=block, ROWS=rows,
            CLEAN_NAN=INTERPRETED, num_warps=_num_warps())
    return q, s


def fp4_dequantize_device(packed: torch.Tensor, scales: torch.Tensor, e4m3_scale: bool,
                          out_dtype: torch.dtype = torch.float32):
    block = E4M3_BLOCK if e4m3_scale else E8M0_BLOCK
    nblocks = scales.numel()
    y = torch.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=out_dtype,
                    device=packed.device)
    if nblocks:
        rows = _rows_per_program(block, "fp4_dequantize")
        _fp4_dequantize_kernel[_grid(nblocks, rows)](
            packed, scales, y, nblocks, E4M3_SCALE=e4m3_scale, BLOCK=block, ROWS=rows,
            num_warps=_num_warps("fp4_dequantize"))
    return y


def fp8_quantize_device(x: torch.Tensor, block: int):
    nblocks = x.numel() // block
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    s = torch.empty(x.shape[:-1] + (x.shape[-1] // block,), dtype=torch.uint8, device=x.device)
    if nblocks:
        p2 = triton.next_power_of_2(block)
        rows = _rows_per_program(p2)
        _fp8_quantize_kernel[_grid(nblocks, rows)](
            x, q, s, nblocks, BLOCK=block, BLOCK_P2=p2, ROWS=rows, CLEAN_NAN=INTERPRETED,
            num_warps=_num_warps())
    return q, s


def fp8_dequantize_device(q: torch.Tensor, scales: torch.Tensor, block: int,
                          out_dtype: torch.dtype = torch.float32):
    nblocks = scales.numel()
    y = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    if nblocks:
        p2 = triton.next_power_of_2(block)
        rows = _rows_per_program(p2)
        _fp8_dequantize_kernel[_grid(nblocks, rows)](
            q, scales, y, nblocks, BLOCK=block, BLOCK_P2=p2, ROWS=rows, num_warps=_num_warps())
    return y


def fp8_qdq_device(x: torch.Tensor, block: int):
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    nblocks = x.numel() // block
    if nblocks:
        p2 = triton.next_power_of_2(block)
        rows = _rows_per_program(p2)
        _fp8_qdq_kernel[_grid(nblocks, rows)](
            x, y, nblocks, BLOCK=block, BLOCK_P2=p2, ROWS=rows, CLEAN_NAN=INTERPRETED,
            num_warps=_num_warps())
    return y


FORMAT_OUTPUTS = {"e2m1_encode": torch.uint8, "e2m1_decode": torch.float32,
                  "e4m3_encode": torch.uint8, "e4m3_decode": torch.float32,
                  "e8m0_decode": torch.float32, "bf16_round": torch.float32}


def format_device(op: str, t: torch.Tensor) -> torch.Tensor:
    """Elementwise element-format operation `op` on float32 values or uint8 codes on the device."""
    out = torch.empty(t.shape, dtype=FORMAT_OUTPUTS[op], device=t.device)
    n = t.numel()
    if n:
        per_program = 16384 if INTERPRETED else GPU_CONFIG["elements_per_program"]
        _format_kernel[(triton.cdiv(n, per_program),)](t, out, n, OP=op, N=per_program,
                                                       num_warps=_num_warps())
    return out


def fp4_pack_device(codes: torch.Tensor):
    packed = torch.empty(codes.shape[:-1] + (codes.shape[-1] // 2,), dtype=torch.uint8,
                         device=codes.device)
    npairs = packed.numel()
    if npairs:
        _pack_kernel[(triton.cdiv(npairs, 4096),)](codes, packed, npairs, N=4096)
    return packed


def fp4_unpack_device(packed: torch.Tensor):
    codes = torch.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=torch.uint8,
                        device=packed.device)
    nbytes = packed.numel()
    if nbytes:
        _unpack_kernel[(triton.cdiv(nbytes, 4096),)](packed, codes, nbytes, N=4096)
    return codes


# ----------------------------------------------------------------------------------------------
# The operations (CPU tensors in, CPU tensors out)
# ----------------------------------------------------------------------------------------------

def _to_device(t: torch.Tensor) -> torch.Tensor:
    return t.to(_device()).contiguous()


def _to_cpu(*ts):
    out = tuple(t.cpu() for t in ts)
    return out[0] if len(out) == 1 else out


# The element formats and fp8_qdq check their input exactly as impl does (its helpers, so that
# both targets reject the same input with the same words); float input is widened to fp32 on the
# host (exact), so each kernel sees fp32 values or uint8 codes only.

def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """finite float32/bfloat16 -> E2M1 codes (uint8 0..15): nearest, ties to the even code,
    saturating at ±6, the sign of zero kept."""
    x = _impl_values("e2m1_encode", x, finite=True)
    return _to_cpu(format_device("e2m1_encode", _to_device(x)))


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> float32: FP4_TABLE[code]."""
    codes = _impl_bytes("e2m1_decode", codes)
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"e2m1_decode: codes are nibbles 0..15, got {int(codes.max())}")
    return _to_cpu(format_device("e2m1_decode", _to_device(codes)))


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """float32/bfloat16 -> float8_e4m3fn bytes: RNE, saturating at ±448 (±Inf too), NaN -> 0x7F
    with the sign bit of the NaN (0xFF for a negative NaN)."""
    x = _impl_values("e4m3_encode", x)
    return _to_cpu(format_device("e4m3_encode", _to_device(x)))


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bytes -> float32 (0x7F and 0xFF -> NaN)."""
    codes = _impl_bytes("e4m3_decode", codes)
    return _to_cpu(format_device("e4m3_decode", _to_device(codes)))


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2^(b − 127) (b = 0: the subnormal 2^-127; 0xFF -> NaN)."""
    codes = _impl_bytes("e8m0_decode", codes)
    return _to_cpu(format_device("e8m0_decode", _to_device(codes)))


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """float32/bfloat16 -> float32 value of the nearest bfloat16 (RNE; NaN stays NaN)."""
    x = _impl_values("bf16_round", x)
    return _to_cpu(format_device("bf16_round", _to_device(x)))


def fp8_qdq(x: torch.Tensor, block: int) -> torch.Tensor:
    """The in-place act_quant result (rule FP8.V4_INPLACE, canonical v4_fp8_inplace=fp8):
    x [..., b·k] -> float32 E4M3_RNE(clamp(x/s, ±448)) · s with s the E8M0 scale of each block."""
    op = "fp8_qdq"
    block = _impl_block_param(op, block)
    x = _impl_values(op, x, block, finite=True)
    return _to_cpu(fp8_qdq_device(_to_device(x), block))


def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., n] (each 0..15, n even) -> uint8 [..., n/2]; element 2i in the low nibble."""
    op = "fp4_pack"
    codes = _need_uint8(op, "codes", codes)
    if codes.shape[-1] % 2 != 0:
        raise ValueError(f"{op}: last dimension {codes.shape[-1]} is not even")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"{op}: codes must be 4-bit (0..15), got a value {int(codes.max())}")
    return _to_cpu(fp4_pack_device(_to_device(codes)))


def fp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., m] -> uint8 codes [..., 2m]; the low nibble is element 2i."""
    packed = _need_uint8("fp4_unpack", "packed", packed)
    return _to_cpu(fp4_unpack_device(_to_device(packed)))


def fp4_e4m3_quantize(x: torch.Tensor):
    """x [..., 16k] float32/bfloat16 -> (packed E2M1 uint8 [..., 8k], E4M3 scale bytes [..., k])."""
    _need_float_input("fp4_e4m3_quantize", x, E4M3_BLOCK)
    return _to_cpu(*fp4_quantize_device(_to_device(x), e4m3_scale=True))


def fp4_e8m0_quantize(x: torch.Tensor):
    """x [..., 32k] float32/bfloat16 -> (packed E2M1 uint8 [..., 16k], E8M0 scale bytes [..., k])."""
    _need_float_input("fp4_e8m0_quantize", x, E8M0_BLOCK)
    return _to_cpu(*fp4_quantize_device(_to_device(x), e4m3_scale=False))


def _fp4_dequantize(op: str, packed, scales, block: int, e4m3_scale: bool) -> torch.Tensor:
    packed = _need_uint8(op, "packed", packed)
    scales = _need_uint8(op, "scales", scales)
    _need_matching_scales(op, 2 * packed.shape[-1], scales, block, packed.shape[:-1], "packed")
    return _to_cpu(fp4_dequantize_device(_to_device(packed), _to_device(scales), e4m3_scale))


def fp4_e4m3_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed [..., 8k], E4M3 scale bytes [..., k]) -> float32 [..., 16k]: e2m1 value * scale."""
    return _fp4_dequantize("fp4_e4m3_dequantize", packed, scales, E4M3_BLOCK, True)


def fp4_e8m0_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed [..., 16k], E8M0 scale bytes [..., k]) -> float32 [..., 32k]: e2m1 value * scale."""
    return _fp4_dequantize("fp4_e8m0_dequantize", packed, scales, E8M0_BLOCK, False)


def fp8_quantize(x: torch.Tensor, block: int):
    """x [..., b*k] float32/bfloat16 -> (E4M3 bytes [..., b*k], E8M0 scale bytes [..., k])."""
    op = "fp8_quantize"
    block = _need_block(op, block)
    _need_float_input(op, x, block)
    return _to_cpu(*fp8_quantize_device(_to_device(x), block))


def fp8_dequantize(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """(E4M3 bytes [..., b*k], E8M0 scale bytes [..., k]) -> float32 [..., b*k]."""
    op = "fp8_dequantize"
    block = _need_block(op, block)
    q = _need_uint8(op, "q", q)
    scales = _need_uint8(op, "scales", scales)
    _need_matching_scales(op, q.shape[-1], scales, block, q.shape[:-1], "q")
    return _to_cpu(fp8_dequantize_device(_to_device(q), _to_device(scales), block))
