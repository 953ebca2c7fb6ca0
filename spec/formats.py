"""The exact element formats: E2M1, E4M3 (fn, satfinite), E8M0, BF16, and ceil-log2 of an fp32.

Every rounding here is written with integer arithmetic on the fp32 bit pattern, or with exact
comparisons against exactly representable boundaries.  No framework cast defines any of it; the
casts of ml_dtypes and torch are judged against these functions (dsv4spec.properties.casts).

All functions are vectorized: they take numpy arrays (inputs are read as float32 / uint8) and
return arrays of the same shape.  Codes are uint8, values float32.
"""
from __future__ import annotations

import numpy as np

from .rules import V4_ALL, knob, rule

ALL_MODELS = ("v3.2",) + V4_ALL

# --------------------------------------------------------------------------------------------
# fp32 bit fields
# --------------------------------------------------------------------------------------------


def f32_bits(x) -> np.ndarray:
    """The fp32 bit pattern of x as int64 (so that shifts and sums never overflow)."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)


def f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.int64).astype(np.uint32).view(np.float32)


def _fields(x):
    bits = f32_bits(x)
    return bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF


def _bit_length(m) -> np.ndarray:
    """Number of bits of the non-negative integers m (< 2^53): 0 for 0."""
    return np.frexp(np.asarray(m, dtype=np.float64))[1].astype(np.int64)


def floor_log2(x) -> np.ndarray:
    """floor(log2 x) of a positive finite fp32, exactly (fp32 subnormals included)."""
    _, exponent, mantissa = _fields(x)
    return np.where(exponent > 0, exponent - 127, _bit_length(mantissa) - 1 - 149)


def ceil_log2(x) -> np.ndarray:
    """ceil(log2 x) of a positive finite fp32, exactly.

    For a normal number: the exponent field − 127, plus 1 if any mantissa bit is set (this is the
    official `fast_log2_ceil`).  A subnormal m·2^-149 gives −149 + bit_length(m − 1); the official
    bit trick would give −126 there, but the amax floors keep every scale computation normal.
    """
    _, exponent, mantissa = _fields(x)
    normal = exponent - 127 + (mantissa != 0)
    subnormal = _bit_length(np.maximum(mantissa, 1) - 1) - 149
    return np.where(exponent > 0, normal, subnormal)


def pow2(e) -> np.ndarray:
    """2^e as an fp32, exactly, for integer −149 ≤ e ≤ 127."""
    e = np.asarray(e, dtype=np.int64)
    return np.where(e >= -126, f32_from_bits((np.maximum(e, -126) + 127) << 23),
                    f32_from_bits(np.int64(1) << np.clip(e + 149, 0, 22)))


def _shift_right_rne(m, d) -> np.ndarray:
    """round(m / 2^d) to nearest, ties to even, for integers m ≥ 0 and d ≥ 1."""
    m = np.asarray(m, dtype=np.int64)
    d = np.minimum(np.asarray(d, dtype=np.int64), 40)     # m < 2^25, so any d ≥ 26 gives 0
    q = m >> d
    rest = m - (q << d)
    half = np.int64(1) << (d - 1)
    return q + ((rest > half) | ((rest == half) & (q & 1 == 1)))


# --------------------------------------------------------------------------------------------
# E2M1 (FP4): 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no Inf, no NaN
# --------------------------------------------------------------------------------------------

E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # code 0..7; code 8 + i is −magnitude i
# Midpoints between consecutive magnitudes: x on boundary i is a tie between codes i and i+1.
E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = np.array(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=np.float32)

E2M1_TIES = knob("e2m1_ties", "even", {
    "toward_zero": "a tie takes the smaller magnitude (0.75→0.5, 1.75→1.5, 3.5→3): truncating "
                   "encoders and some vendor ports",
    "away_from_zero": "a tie takes the larger magnitude (0.25→0.5, 1.25→1.5, 5→6): "
                      "round-half-up encoders",
}, "How an E2M1 encoder breaks an exact tie between two neighbouring magnitudes.")

E2M1_OVERFLOW = knob("e2m1_overflow", "clamp", {
    "none": "no clamp: the value is rounded on the unbounded E2M1 grid (… 6, 8, 12, 16 …) and its "
            "exponent field overflows into the sign bit (7 → 8 → code 0x0, 12 → 0x1 …)",
}, "What happens to a magnitude above 6 on its way to an E2M1 code.")

E2M1_ZERO_SIGN = knob("e2m1_zero_sign", "keep", {
    "positive": "every zero is +0 (code 0x0): the sign is taken from a sign() that is 0 at 0, or "
                "dropped for a rounded-to-zero value",
}, "Whether a negative value that rounds to zero (and −0 itself) keeps its sign (code 0x8).")

rule("FMT.E2M1.VALUES", "E2M1 code values",
     "Nibble c decodes to FP4_TABLE[c] = [0, .5, 1, 1.5, 2, 3, 4, 6, −0, −.5, −1, −1.5, −2, −3, −4, −6]: "
     "bit 3 is the sign, there is no Inf or NaN, code 8 is −0 (15 distinct values).",
     applies_to=V4_ALL, policy="exact",
     sources=("V41-kernel-port L37-39 (FP4_TABLE, the table of the official checkpoint converter)",
              "V4-kernel L193 (torch.float4_e2m1fn_x2 storage)", "doc-000 Q&A 3 L17"))

rule("FMT.E2M1.RNE", "E2M1 rounds to nearest, ties to the even code",
     "A finite x with |x| ≤ 6 encodes to the nearest E2M1 magnitude with x's sign; an exact tie "
     "goes to the even code: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4 (boundaries "
     "alternate '>' and '≥': >0.25, ≥0.75, >1.25, ≥1.75, >2.5, ≥3.5, >5).",
     applies_to=V4_ALL, policy="bytes", knob="e2m1_ties",
     sources=("V4-kernel L134, L165-177 (T.Cast to float4_e2m1fn: CUDA cvt.rn.satfinite.e2m1x2)",
              "V41-kernel-port L40-43 (round-to-nearest-even boundaries, ties up only to an even code)"))

rule("FMT.E2M1.SATURATE", "E2M1 saturates to ±6",
     "A finite x with |x| > 6 encodes to ±6 (code 0x7 or 0xF).",
     applies_to=V4_ALL, policy="bytes", knob="e2m1_overflow",
     sources=("V4-kernel L170, L176 (explicit clamp to ±6)", "V41-kernel L165-170 (clamp, then the cast)"))

rule("FMT.E2M1.ZERO_SIGN", "E2M1 keeps the sign of zero",
     "−0 and every negative x that rounds to magnitude 0 (x ≥ −0.25) encode to code 0x8 (−0).",
     applies_to=V4_ALL, policy="bytes", knob="e2m1_zero_sign",
     sources=("V4-kernel L165-177 (the CUDA cast keeps the sign)",
              "V41-kernel-port L37-39 (FP4_TABLE: code 8 is −0)"))


def e2m1_decode(codes) -> np.ndarray:
    """E2M1 nibble codes (0..15) to fp32 values."""
    codes = np.asarray(codes, dtype=np.uint8)
    if np.any(codes > 15):
        raise ValueError("e2m1_decode: codes must be nibbles 0..15")
    return E2M1_VALUES[codes]


def _e2m1_unbounded_code(mag) -> np.ndarray:
    """Magnitude bits of the RNE of mag > 6 on the unbounded E2M1 grid, wrapped to 3 bits."""
    e = floor_log2(mag)                                   # mag = 2^e · (1 + f), e ≥ 2
    steps = np.rint(mag.astype(np.float64) / np.ldexp(1.0, e - 1))   # 2 or 3 (4 carries), exact
    e = np.where(steps == 4, e + 1, e)
    mantissa = np.where(steps == 3, 1, 0)
    return (((e + 1) << 1) | mantissa) & 0x7


def e2m1_encode(x, *, ties: str = "even", overflow: str = "clamp", zero_sign: str = "keep") -> np.ndarray:
    """Finite fp32 values to E2M1 codes: nearest magnitude, exact ties broken by `ties`."""
    x = np.asarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("e2m1_encode: E2M1 has no Inf or NaN; the input must be finite")
    mag = np.abs(x)
    below = sum((mag > b).astype(np.int64) for b in E2M1_BOUNDARIES)   # nearest, ties down
    on_tie = np.zeros(x.shape, dtype=bool)
    for i, b in enumerate(E2M1_BOUNDARIES):
        on_tie |= (below == i) & (mag == b)
    up = {"even": below % 2 == 1, "toward_zero": False, "away_from_zero": True}[ties]
    code = np.where(on_tie & up, below + 1, below)
    if overflow == "none":
        code = np.where(mag > E2M1_MAX, _e2m1_unbounded_code(np.maximum(mag, E2M1_MAX)), code)
    elif overflow != "clamp":
        raise ValueError(f"e2m1_encode: unknown overflow {overflow!r}")
    negative = np.signbit(x) & ((code != 0) | (zero_sign == "keep"))
    return (code | (negative << 3)).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# E4M3 (float8_e4m3fn): bias 7, no Inf, NaN = S.1111.111, max 448, min subnormal 2^-9
# --------------------------------------------------------------------------------------------

E4M3_MAX = 448.0
E4M3_MAX_CODE = 0x7E
E4M3_NAN_CODE = 0x7F

E4M3_OVERFLOW = knob("e4m3_overflow", "saturate", {
    "nan": "a value whose rounded magnitude exceeds 448 (|x| > 464) becomes NaN (0x7F/0xFF): "
           "non-saturating framework casts",
}, "What an fp32 → E4M3 conversion does above the largest finite E4M3 value.")

rule("FMT.E4M3.VALUES", "E4M3 code values",
     "Byte b = s·eeee·mmm decodes to (−1)^s · 2^(e−7) · (1 + m/8) for e ≥ 1 and (−1)^s · m · 2^-9 "
     "for e = 0; 0x7F and 0xFF are NaN; there is no Inf (float8_e4m3fn).",
     applies_to=ALL_MODELS, policy="exact",
     sources=("V41-kernel L158-161 (T.Cast(FP8, …) of the V4.1 main KV scale)",
              "V4-kernel L14, L71, L93-96 (the non-in-place act_quant: clamp(x/s) stored in a float8_e4m3 fragment)",
              "V4-kernel L115 (torch.float8_e4m3fn output)", "V32-kernel L75-78"))

rule("FMT.E4M3.RNE", "fp32 → E4M3 rounds to nearest even",
     "A finite fp32 x with |x| ≤ 464 encodes to the nearest E4M3 value (subnormals 2^-9 · m "
     "included), ties to the even mantissa, keeping the sign (−0 → 0x80); written as integer "
     "rounding of the fp32 significand.",
     applies_to=ALL_MODELS, policy="bytes",
     sources=("V41-kernel L158-161 (T.Cast(FP8, amax/fp4_max))",
              "V4-kernel L71, L93-96 (non-in-place act_quant: clamp(x/s) converted to float8_e4m3)",
              "V32-kernel L75-78", "V41-kernel L81-89",
              "V41-kernel-port L13-15, L58-60 (the casts round to nearest even with saturation, as CUDA satfinite)"))

rule("FMT.E4M3.SATFINITE", "fp32 → E4M3 saturates to ±448",
     "A value with |x| > 464 (including ±Inf) encodes to ±448 (0x7E/0xFE); 464 itself is a tie "
     "and rounds to the even 448.  Only a NaN input gives NaN (0x7F, or 0xFF when its sign is set).",
     applies_to=ALL_MODELS, policy="bytes", knob="e4m3_overflow",
     sources=("V41-kernel L158-161", "V41-kernel-port L58-60 (_to_e4m3_satfinite: clamp to ±448, then cast)"))


def _e4m3_value(codes) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign, exponent, mantissa = codes >> 7, (codes >> 3) & 0xF, codes & 0x7
    magnitude = np.where(exponent == 0, np.ldexp(mantissa.astype(np.float64), -9),
                         np.ldexp((8 + mantissa).astype(np.float64), exponent - 10))
    value = np.where(sign == 1, -magnitude, magnitude)
    return np.where(codes & 0x7F == 0x7F, np.nan, value).astype(np.float32)


_E4M3_VALUES = _e4m3_value(np.arange(256))


def e4m3_decode(codes) -> np.ndarray:
    """Each byte's value, as _e4m3_value gives it for the 256 bytes (looked up: the FP8 weights of
    the layer goldens are millions of bytes)."""
    return np.asarray(_E4M3_VALUES[np.asarray(codes, dtype=np.uint8)])


def e4m3_encode(x, *, overflow: str = "saturate") -> np.ndarray:
    """fp32 to E4M3 codes: round to nearest even on the fp32 significand, satfinite."""
    sign, exponent, mantissa = _fields(x)
    significand = np.where(exponent > 0, mantissa | 0x800000, mantissa)   # x = significand · 2^lsb
    lsb = np.where(exponent > 0, exponent - 150, -149)
    e = np.maximum(exponent - 127, -6)          # E4M3 binade; below 2^-6 the spacing stays 2^-9
    quanta = _shift_right_rne(significand, (e - 3) - lsb)   # x in units of the E4M3 spacing 2^(e-3)
    code = ((e + 6) << 3) + quanta      # a carry of quanta to 16 moves into the next binade by itself
    too_big = (code > E4M3_MAX_CODE) | (exponent == 0xFF)
    if overflow == "saturate":
        code = np.where(too_big, E4M3_MAX_CODE, code)
    elif overflow == "nan":
        code = np.where(too_big, E4M3_NAN_CODE, code)
    else:
        raise ValueError(f"e4m3_encode: unknown overflow {overflow!r}")
    code = np.where((exponent == 0xFF) & (mantissa != 0), E4M3_NAN_CODE, code)
    return (code | (sign << 7)).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# E8M0 (float8_e8m0fnu): unsigned power of two, bias 127, 0xFF = NaN
# --------------------------------------------------------------------------------------------

E8M0_NAN_CODE = 0xFF

rule("FMT.E8M0.VALUES", "E8M0 code values",
     "Byte b < 255 decodes to 2^(b − 127) (b = 0 is 2^-127, an fp32 subnormal); b = 255 is NaN.  "
     "V4 and V4.1 store E8M0 bytes; V3.2 keeps its power-of-two scales in an fp32 tensor (never an "
     "E8M0 byte), so the rule does not apply to it.",
     applies_to=V4_ALL, policy="exact",
     sources=("V4-kernel L178-179, L194 (T.Cast(FE8M0, s); torch.float8_e8m0fnu)",
              "V4-kernel L30-33 (fast_pow2: the scale is 2^e exactly)",
              "V32-model L449 (V3.2: k_scale_cache is float32)"))


def e8m0_decode(codes) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    return np.where(codes == E8M0_NAN_CODE, np.float32(np.nan), pow2(np.minimum(codes, 254) - 127))


def e8m0_encode_exponent(e) -> np.ndarray:
    """The E8M0 byte of 2^e, −127 ≤ e ≤ 127."""
    e = np.asarray(e, dtype=np.int64)
    if np.any((e < -127) | (e > 127)):
        raise ValueError("e8m0_encode_exponent: exponent outside [-127, 127]")
    return (e + 127).astype(np.uint8)


E8M0_ROUNDING = knob("e8m0_rounding", "ceil_exact", {
    "ocp_floor": "OCP MX rule: 2^(floor(log2 amax) − emax_elem) with emax_elem 2 (E2M1) or 8 (E4M3); "
                 "the scale can be too small and values clip",
    "float_log2_ceil": "2^ceil(log2f(v)) through a floating log2: wrong just above a power of two "
                       "(amax 96.00000762939453 gives 16 instead of 32); no BF16 amax reaches such a "
                       "v, so only fp32 inputs tell it apart",
    "round_half_up": "a round-half-up cast of v to E8M0: 2^k for v in [2^k, 1.5·2^k), else 2^(k+1)",
}, "How a power-of-two (E8M0) scale is derived from v = fl32(amax · fl32(1/max_elem)).")

rule("FMT.CEIL_LOG2", "ceil(log2) of an fp32, exactly",
     "For a positive normal fp32 v, ceil(log2 v) = (exponent field − 127) + (1 if any mantissa "
     "bit is set else 0): exactly 2^k gives k and 2^k·(1 + 2^-23) gives k + 1.  It is computed "
     "from the bits, never through a floating log2.  Checked through the E8M0 scale bytes of the "
     "codecs, with amax swept over 6·2^k and 448·2^k ± 1 ulp across the whole range.",
     applies_to=ALL_MODELS, policy="bytes", knob="e8m0_rounding",
     sources=("V4-kernel L22-27, L30-33 (fast_log2_ceil, fast_pow2)", "V4-kernel L36-37 (fast_round_scale)"))

# --------------------------------------------------------------------------------------------
# BF16: the upper half of an fp32, round to nearest even
# --------------------------------------------------------------------------------------------

rule("FMT.BF16.RNE", "fp32 → BF16 rounds to nearest even",
     "bf16(x) keeps the upper 16 bits of the fp32 pattern after adding 0x7FFF + (bit 16) (round to "
     "nearest, ties to even; overflow to ±Inf); a NaN stays NaN (quiet); ±0 and the sign are kept.",
     applies_to=ALL_MODELS, policy="bytes",
     sources=("V4-model L420-421 (every indexer score step is a BF16 tensor)",
              "V4-kernel L55, L86-90 (the initial in-place act_quant QDQ casts through BF16)",
              "V41-model L555-557 (the V4.1 score steps are BF16 tensors too)"))


def bf16_bits(x) -> np.ndarray:
    """The 16-bit BF16 pattern nearest to each fp32 value."""
    bits = f32_bits(x)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def bf16_round(x) -> np.ndarray:
    """The fp32 value of the BF16 nearest to x."""
    return f32_from_bits(bf16_bits(x).astype(np.int64) << 16)
