"""The KV-cache and indexer quantization codecs, exactly, with their variant knobs.

Three codecs, each per block of the last dimension (V4-kernel L40-200, V41-kernel-port L87-139):

    V4.1 main KV   FP4 E2M1 payload, one E4M3 scale per 16    fp4_e4m3_quantize
    indexer Q/K    FP4 E2M1 payload, one E8M0 scale per 32    fp4_e8m0_quantize   (V4 and V4.1)
    act_quant      FP8 E4M3 payload, one E8M0 scale per b     fp8_quantize        (b = 64, 32, 128)

Every function takes numpy arrays (inputs read as float32) and the variant knobs as keyword
arguments defaulting to the canonical (official) values, so an oracle can compute the expected
bytes of any declared variant.  Every fp32 operation below is one IEEE fp32 operation with
round-to-nearest-even (numpy float32 arithmetic), written in the order the official kernels do it.
"""
from __future__ import annotations

import numpy as np

from .formats import (E2M1_MAX, E4M3_MAX, e2m1_decode, e2m1_encode, e4m3_decode,
                      e4m3_encode, e8m0_decode, e8m0_encode_exponent, bf16_round, ceil_log2,
                      floor_log2, f32_bits)
from .rules import IMPLEMENTATION_DEFINED, V4, V41, V4_ALL, knob, rule

F32 = np.float32
FP4_KV_BLOCK = 16           # V4.1 main KV: one E4M3 scale per 16 values
FP4_IDX_BLOCK = 32          # indexer Q/K (V4, V4.1): one E8M0 scale per 32 values
FP8_BLOCKS = {"v4 main/window KV (448 NoPE dims)": 64, "v4.1 SWA KV (512 dims)": 32,
              "v3.2 indexer Q/K (128 dims)": 128}
FP4_MAX_INV = F32(1) / F32(E2M1_MAX)      # fl32(1/6) = 0x3E2AAAAB, slightly above 1/6
FP8_MAX_INV = F32(1) / F32(E4M3_MAX)      # fl32(1/448)

# --------------------------------------------------------------------------------------------
# Knobs of the codecs (the element-cast knobs e2m1_*, e4m3_overflow, e8m0_rounding are in formats)
# --------------------------------------------------------------------------------------------

knob("nibble_order", "low_first", {
    "high_first": "element 2i in the high nibble (swapped)",
}, "Which nibble of a packed FP4 byte holds the even-index element.")

knob("fp4_idx_amax_floor", "6x2^-126", {
    "1e-4": "amax clamped to 1e-4 (borrowed from act_quant): an all-zero block gets scale 2^-15",
    "none": "no clamp: an all-zero block gets scale 2^-127 (byte 0x00)",
}, "The lower clamp of amax on the indexer FP4 (E8M0/32) path.")

knob("fp4_kv_scale_floor", "6x2^-9", {
    "6x2^-6": "amax clamped to 6·2^-6, so the scale is never below 2^-6 (the smallest normal E4M3)",
}, "The lower clamp of amax on the V4.1 main KV FP4 (E4M3/16) path.")

knob("scale_apply", "divide", {
    "reciprocal": "x · fl32(1/s) instead of x / s: differs near ties, e.g. block "
                  "[0.17578125, 0.03662109375, 0, …] gives code 1.0 by division, 1.5 by reciprocal; "
                  "with BF16 input only there: s = 15·2^k and x/s exactly 1.25, 2.5 or 5",
}, "How the rounded E4M3 scale is applied to the values before the E2M1 cast.")

knob("fp8_amax_floor", "1e-4", {
    "1e-8": "amax clamped to 1e-8: an all-zero block gets scale 2^-35",
}, "The lower clamp of amax in act_quant.")

knob("v4_fp8_inplace", "fp8", {
    "bf16": "the initial V4-Flash kernel: the in-place QDQ casts clamp(x/s) to BF16, not FP8 "
            "(V4-kernel L55, L86-90): for BF16 input and a power-of-two scale, exactly the identity",
}, "What the in-place act_quant QDQ rounds x/s to (V4 main/window KV).")

knob("fp8_linears", "fp8", {
    "bf16": "a port without FP8 GEMMs: the E4M3 weight dequantized (each value times its block's E8M0 "
            "scale, exact in BF16) and multiplied by x in BF16, bf16(ŵ · x) with fp32 sums and no act_quant "
            "of x, where the official code runs act_quant and fp8_gemm for such a weight (V4-model L116-118)",
}, """Whether the linears whose weights the official code holds in float8_e4m3fn (the indexer's wq_b, the
attention's wq_a, wq_b, wkv and wo_b) run as FP8 GEMMs (act_quant, then the block-scaled E4M3 GEMM) or,
declared, as BF16 linears of the dequantized weight.  Declared, the layer stages of those linears are
judged as BF16 matmuls (matmul_tolerance) and every other stage on the target's own values.""", declared_only=True)

knob("nonfinite_input", "block_local", {
    "reject": "the quantizer raises ValueError on NaN or ±Inf input (impl and kernels do)",
}, "What a quantizer does with NaN or ±Inf in its input: the official code rejects nothing, and what "
   "they become stays inside their own block.")

# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------

_V41_KV_QUANT = "V41-model L758-760 (fp4_act_quant(latent, 16, True, scale_dtype=float8_e4m3fn))"
_V41_KV_KERNEL = "V41-kernel L158-161"

rule("FP4.PACK.NIBBLE", "FP4 packing: even element in the low nibble",
     "Codes c[..., n] pack into bytes p[..., n/2] with p[i] = c[2i] | c[2i+1] << 4 (the layout of "
     "torch.float4_e2m1fn_x2 and of the official checkpoint converter); unpacking is the inverse.",
     applies_to=V4_ALL, policy="bytes", knob="nibble_order",
     sources=("V4-kernel L193 (torch.float4_e2m1fn_x2 output)", "V41-kernel-port L82-84 (pack_fp4)",
              "V41-kernel-port L75-79 (unpack_fp4: the low nibble holds the even element)"))

rule("FP4.E2M1.RNE", "FP4 codecs round x/s to E2M1 with ties to even",
     "Both FP4 codecs encode the scaled value r = clamp(x/s, −6, 6) with FMT.E2M1.RNE: nearest "
     "magnitude, exact ties to the even code.  With amax = 6 both scales are exactly 1, so the "
     "values 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 are ties of the codec itself.",
     applies_to=V4_ALL, policy="bytes", knob="e2m1_ties",
     sources=("V4-kernel L165-177", "V41-kernel L165-170", "V41-kernel-port L63-67 (_e2m1_codes: ties up only to an even code)"))

rule("FP4.E2M1.ZERO_SIGN", "FP4 codecs keep the sign of zero",
     "A negative value (or −0) whose scaled value rounds to zero is stored as code 0x8 (−0).",
     applies_to=V4_ALL, policy="bytes", knob="e2m1_zero_sign",
     sources=("V4-kernel L165-177", "V41-kernel-port L63-67 (the sign bit is set from signbit(x), zero included)"))

rule("FP4.KV.SCALE", "V4.1 main KV scale: E4M3 nearest to amax/6, per 16",
     "Per block of 16: amax = max|x| in fp32; s = E4M3_RNE(fl32(amax / 6)) (the correctly rounded "
     "fp32 quotient, then FMT.E4M3.RNE); the stored scale byte is the E4M3 code of s.  s is rounded "
     "to nearest, not up, and is not a power of two.  Fast-math caveat: the official TileLang kernel "
     "is compiled without disabling fast math, so on a GPU its amax/6 may be an approximate division; "
     "the rule fixes the IEEE quotient (what the bit-exact ports compute), and a quotient one fp32 ulp "
     "off can change the scale: BF16 amax values land exactly on E4M3 midpoints (6.375 / 6 = 1.0625, "
     "halfway between 1 and 1.125), where the tie goes to the even code only if the quotient is exact.",
     applies_to=V41, policy="bytes",
     sources=(_V41_KV_KERNEL, _V41_KV_QUANT, "V41-kernel-port L127-130 (amax / FP4_MAX, then the E4M3 cast)",
              "V4-kernel L9-12 (pass_configs: fast math not disabled)", "doc-000 FP4 storage L8",
              "doc-000 Q&A 3 L17"),
     differs="Document 000 (Q&A 3) says the E4M3 scale comes 'almost exactly' to max|x|/6.  It is the "
             "E4M3 value NEAREST to amax/6, so the ratio amax/s is not 6: with a normal E4M3 scale "
             "it lies in about [5.65, 6.375] (4 significant bits), and above 6 the largest element "
             "clips to ±6; with a subnormal scale (amax < 6·2^-6 = 0.09375) it can reach nearly 9; "
             "once the scale saturates at 448 it is unbounded.")

rule("FP4.KV.FLOOR", "V4.1 main KV scale floor: amax ≥ 6·2^-9",
     "amax is clamped below at 6·2^-9 before the division, so s ≥ 2^-9 (the smallest E4M3 "
     "subnormal) and an all-zero block stores scale byte 0x01 with all codes 0.",
     applies_to=V41, policy="bytes", knob="fp4_kv_scale_floor",
     sources=(_V41_KV_KERNEL + " ('keep even an all-zero group's scale nonzero')",
              "V41-kernel-port L128-129 (amax.clamp_min(6 * 2**-9))"))

rule("FP4.KV.SATURATE", "V4.1 main KV scale saturates at 448",
     "When amax/6 > 464 the scale saturates to 448 (byte 0x7E), never NaN; amax 2785 gives "
     "s = 448 and its top values clip to ±6.",
     applies_to=V41, policy="bytes", knob="e4m3_overflow",
     sources=(_V41_KV_KERNEL + " (satfinite cast)", "V41-kernel-port L58-60, L130 (the scale cast clamps to ±448)"))

rule("FP4.KV.DIVIDE", "V4.1 main KV values are divided by the rounded scale",
     "The E2M1 input is fl32(x / s) with s the ROUNDED E4M3 scale and the correctly rounded IEEE "
     "fp32 division (not x · fl32(1/s), not x / (amax/6)).  What conforms: a target whose every "
     "E2M1 code, for every block, equals the code of that IEEE quotient; the check compares bytes, "
     "so a target whose division is approximate (as the official TileLang kernel's may be on a GPU: "
     "it is compiled without disabling fast math, unlike V3.2's) conforms exactly on the inputs where its quotient "
     "gives the same code, and fails on any block where it does not.  Multiplying by the reciprocal "
     "is the declared deviation scale_apply=reciprocal.  The IEEE division is what the bit-exact "
     "CPU port computes.",
     applies_to=V41, policy="bytes", knob="scale_apply",
     sources=("V41-kernel-port L134 (xg / s)", _V41_KV_KERNEL,
              "V4-kernel L9-12 (pass_configs: fast math not disabled)",
              "V32-kernel L9-13 (V3.2's pass_configs set TL_DISABLE_FAST_MATH)"))

rule("FP4.KV.CLAMP", "V4.1 main KV values are clamped to ±6 before the E2M1 cast",
     "r = clamp(x/s, −6, 6) then E2M1: an element whose ratio |x|/s exceeds 6 is stored as ±6.  "
     "The ratio reaches up to 6.375 with a normal E4M3 scale that rounded down, nearly 9 with a "
     "subnormal scale (amax < 6·2^-6 = 0.09375), and is unbounded once the scale saturates at 448.",
     applies_to=V41, policy="bytes", knob="e2m1_overflow",
     sources=("V41-kernel L165-170", "V41-kernel-port L134 (clamp(-FP4_MAX, FP4_MAX))",
              "V4-kernel L170, L176 (the same clamp in V4's FP4 kernel)"))

rule("FP4.IDX.SCALE", "Indexer FP4 scale: 2^ceil(log2(amax · fl32(1/6))), E8M0, per 32",
     "Per block of 32: v = fl32(amax · fl32(1/6)) (a multiplication by the fp32 reciprocal, not a "
     "division); s = 2^FMT.CEIL_LOG2(v), stored as the E8M0 byte 127 + ceil_log2(v).  Because s is "
     "rounded up, |x|/s ≤ 6 and nothing clips.",
     applies_to=V4_ALL, policy="bytes", knob="e8m0_rounding",
     sources=("V4-kernel L135, L161-164", "V41-kernel L163-164", "V41-model L546, L552",
              "V4-kernel L36-37 (fast_round_scale)", "doc-003 §5.2 L183", "doc-003 §10.2 L306"),
     differs="Document 003 (§5.2, §10.2) says the indexer's dequantization factor kv_scale is stored "
             "as one FP32 (4 B per token), V3.2's format; V4 and V4.1 store one E8M0 byte per 32 "
             "values (4.25 bits per element).")

rule("FP4.IDX.FLOOR", "Indexer FP4 amax floor: 6·2^-126",
     "amax is clamped below at 6·2^-126, so the smallest scale is 2^-126 (byte 0x01) and an "
     "all-zero block stores byte 0x01 with all codes 0.",
     applies_to=V4_ALL, policy="bytes", knob="fp4_idx_amax_floor",
     sources=("V4-kernel L161-164", "V41-kernel L163-164", "V41-kernel-port L132 (amax.clamp_min(6 * 2**-126))"))

rule("FP4.DEQUANT", "FP4 dequantization is E2M1 value × scale, exactly",
     "x̂ = FP4_TABLE[code] · s in fp32 (exact: at most 6 significant bits), with s the decoded "
     "E4M3 or E8M0 scale of the element's block; −0 stays −0.",
     applies_to=V4_ALL, policy="exact",
     sources=("V4-kernel L165-177", "V41-kernel-port L135-137 (e2m1 value × s)",
              "V4-model L370, L416 (in place: the quantize-dequantized values are what the index path uses)"))

rule("FP8.SCALE", "act_quant scale: 2^ceil(log2(amax · fl32(1/448))), E8M0",
     "Per block of b: v = fl32(amax · fl32(1/448)); s = 2^FMT.CEIL_LOG2(v) (scale_fmt = 'ue8m0'), "
     "reported as its E8M0 byte 127 + ceil_log2(v).  V4 and V4.1 store that byte "
     "(float8_e8m0fnu); V3.2 stores the same power of two as an fp32 (LAYOUT.V32.INDEX_K).  "
     "Because s is rounded up nothing clips.",
     applies_to=("v3.2",) + V4_ALL, policy="bytes", knob="e8m0_rounding",
     sources=("V4-kernel L77-83", "V32-kernel L68-74", "V41-kernel L76-80",
              "V32-model L448-449 (k_scale_cache fp32)", "V32-config (scale_fmt: ue8m0)",
              "V4-model L40, L42 (ModelArgs: scale_fmt 'ue8m0', scale_dtype 'fp8')"))

rule("FP8.FLOOR", "act_quant amax floor: 1e-4",
     "amax is clamped below at fl32(1e-4), so the smallest scale is 2^ceil(log2(fl32(1e-4)·"
     "fl32(1/448))) = 2^-22 (byte 105), the scale of an all-zero block.",
     applies_to=("v3.2",) + V4_ALL, policy="bytes", knob="fp8_amax_floor",
     sources=("V4-kernel L77-83", "V41-kernel L76-77", "V41-kernel-port L100 (clamp_min(1e-4))"))

rule("FP8.E4M3", "act_quant values: E4M3_RNE(clamp(x/s, ±448)), satfinite",
     "q = FMT.E4M3.RNE(clamp(fl32(x / s), −448, 448)); with a power-of-two s the division is exact "
     "unless the quotient is an fp32 subnormal.",
     applies_to=("v3.2",) + V4_ALL, policy="bytes",
     sources=("V4-kernel L71, L93-96 (non-in-place branch: clamp(x/s) converted to the float8_e4m3 y_local)",
              "V32-kernel L75-78", "V41-kernel L81-89", "V41-kernel-port L105 (clamp to ±448, cast to e4m3)"))

rule("FP8.DEQUANT", "act_quant dequantization is E4M3 value × scale, exactly",
     "x̂ = E4M3 value · 2^(byte − 127) in fp32 (exact in the ranges the floor allows).",
     applies_to=("v3.2",) + V4_ALL, policy="exact",
     sources=("V4-kernel L93-96 (the E4M3 values)", "V4-kernel L242-249 (fp8_gemm: each K block's product × the scales)",
              "V32-kernel L75-78", "V41-kernel L81-89", "V41-kernel-port L106-107 (in place: E4M3 value × s)"))

rule("FP8.BLOCKS", "act_quant block sizes",
     "One scale per block of the last dimension: V4 main/window KV quantizes the 448 NoPE dims in "
     "blocks of 64 (7 scales, RoPE dims stay BF16); V4.1 SWA KV the whole 512-dim vector in blocks "
     "of 32 (16 scales); V3.2 indexer Q/K 128 dims in one block of 128.",
     applies_to=("v3.2",) + V4_ALL, policy="bytes",
     sources=("V4-model L372, L505-506", "V41-model L706-707 (Attention._window_kv)", "V32-model L467-468",
              "V41-model L27 (fp8_block_size = 32)"))

rule("FP8.V4_INPLACE", "V4 in-place act_quant QDQ rounds through FP8",
     "Two revisions of the V4-Flash kernel differ here.  The initial release (V4-kernel) sets "
     "out_dtype = in_dtype for the in-place call, so its QDQ casts clamp(x/s, ±448) to BF16, not "
     "FP8: for BF16 input and a power-of-two scale that is exactly the identity on the value, so "
     "its FP8 simulation of the V4 main and window KV does nothing.  The later revision "
     "(DeepSeek-V4-Flash@60d8d707, V4-kernel-60d8) casts through FP8, as V4.1 does: the in-place QDQ "
     "writes back E4M3_RNE(clamp(x/s, ±448)) · s.  The rule follows the later revision (canonical "
     "v4_fp8_inplace=fp8); the initial release is the declared value bf16.",
     applies_to=V4, policy="exact", status=IMPLEMENTATION_DEFINED, knob="v4_fp8_inplace",
     sources=("V4-kernel L55, L84-91 (initial release: the in-place branch casts to out_dtype, BF16)",
              "V4-kernel-60d8 act_quant_kernel (in-place branch: T.Cast(FP8, clamp(x/s)))",
              "V41-kernel L81-89", "V4-model L372, L506 (the in-place calls on the V4 KV)"))

rule("FP4.NONFINITE", "FP4 codecs: NaN and ±Inf stay inside their block",
     "A NaN or ±Inf in a quantizer's input changes nothing outside its own block: every other block "
     "of the row gets exactly the codes and scale it gets without them.  What the block holding one "
     "becomes is unspecified (officially: the max reduction skips NaN; an Inf makes the E8M0 scale "
     "+Inf, byte 0xFF, and saturates the E4M3 scale at 448).  Raising ValueError on such input "
     "instead is an allowed choice (nonfinite_input=reject), detected and reported.",
     applies_to=V4_ALL, policy="bytes", status=IMPLEMENTATION_DEFINED, knob="nonfinite_input",
     sources=("V4-kernel L22-27, L161-164 (reduce_absmax; fast_log2_ceil of Inf is 128)", _V41_KV_KERNEL,
              "V4-kernel L186-200 (fp4_act_quant checks nothing of its input)"))

rule("FP8.NONFINITE", "act_quant: NaN and ±Inf stay inside their block",
     "As FP4.NONFINITE for act_quant: every block without NaN or ±Inf is quantized exactly as without "
     "them; the block holding one is unspecified; raising ValueError instead is allowed "
     "(nonfinite_input=reject).",
     applies_to=("v3.2",) + V4_ALL, policy="bytes", status=IMPLEMENTATION_DEFINED,
     knob="nonfinite_input", sources=("V4-kernel L77-91 (act_quant: reduce_absmax, no check)",
                                      "V4-kernel L105-125 (act_quant checks only the shape)"))


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def blocks(x, block: int) -> np.ndarray:
    """x[..., n] as float32 [..., n/block, block]."""
    x = np.asarray(x, dtype=F32)
    if x.shape[-1] % block:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of the block ({block})")
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def unblock(x) -> np.ndarray:
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def block_amax(xb) -> np.ndarray:
    return np.abs(xb).max(axis=-1)


def fp4_pack(codes, *, nibble_order: str = "low_first") -> np.ndarray:
    codes = np.asarray(codes, dtype=np.uint8)
    even, odd = codes[..., 0::2], codes[..., 1::2]
    low, high = (even, odd) if nibble_order == "low_first" else (odd, even)
    return (low | (high << 4)).astype(np.uint8)


def fp4_unpack(packed, *, nibble_order: str = "low_first") -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    low, high = packed & 0xF, packed >> 4
    even, odd = (low, high) if nibble_order == "low_first" else (high, low)
    return np.stack([even, odd], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def e2m1_codes(xb, s, *, scale_apply="divide", e2m1_overflow="clamp", e2m1_ties="even",
               e2m1_zero_sign="keep") -> np.ndarray:
    """E2M1 codes of blocks xb [..., nb, block] with scales s [..., nb]: E2M1_RNE(clamp(x/s, ±6)).

    With a NaN scale (only e4m3_overflow=nan makes one) the codes of that block are unspecified;
    they are returned as 0 here.
    """
    xb, s = np.asarray(xb, dtype=F32), np.asarray(s, dtype=F32)[..., None]
    if scale_apply == "divide":
        ratio = xb / s
    elif scale_apply == "reciprocal":
        ratio = xb * (F32(1) / s)
    else:
        raise ValueError(f"unknown scale_apply {scale_apply!r}")
    if e2m1_overflow == "clamp":
        ratio = np.clip(ratio, F32(-E2M1_MAX), F32(E2M1_MAX))
    ratio = np.where(np.isnan(ratio), F32(0), ratio)
    return e2m1_encode(ratio, ties=e2m1_ties, overflow=e2m1_overflow, zero_sign=e2m1_zero_sign)


def pow2_scale_exponent(amax, max_inv, elem_emax: int, *, e8m0_rounding: str = "ceil_exact"):
    """The exponent e of the power-of-two scale 2^e of blocks with (floored) amax.

    v = fl32(amax · max_inv); canonical e = ceil_log2(v).  elem_emax is the exponent of the
    element format's largest value (2 for E2M1's 6 = 1.5·2^2, 8 for E4M3's 448 = 1.75·2^8).
    A zero v (only reachable without an amax floor) gets e = −127, the E8M0 byte 0x00.
    """
    amax = np.asarray(amax, dtype=F32)
    v = amax * F32(max_inv)
    positive = np.where(v > 0, v, F32(1))
    if e8m0_rounding == "ceil_exact":
        e = ceil_log2(positive)
    elif e8m0_rounding == "ocp_floor":
        e = floor_log2(np.where(amax > 0, amax, F32(1))) - elem_emax
    elif e8m0_rounding == "float_log2_ceil":
        e = np.ceil(np.log2(positive.astype(np.float64)).astype(F32)).astype(np.int64)
    elif e8m0_rounding == "round_half_up":
        half_or_more = (f32_bits(positive) >> 22) & 1    # leading fraction bit of a normal v
        e = floor_log2(positive) + half_or_more
    else:
        raise ValueError(f"unknown e8m0_rounding {e8m0_rounding!r}")
    return np.clip(np.where(v > 0, e, -127), -127, 127)


# --------------------------------------------------------------------------------------------
# The codecs
# --------------------------------------------------------------------------------------------

_KV_FLOORS = {"6x2^-9": F32(6 * 2.0 ** -9), "6x2^-6": F32(6 * 2.0 ** -6)}
_IDX_FLOORS = {"6x2^-126": F32(6 * 2.0 ** -126), "1e-4": F32(1e-4), "none": F32(0)}
_FP8_FLOORS = {"1e-4": F32(1e-4), "1e-8": F32(1e-8)}


def fp4_e4m3_scale(amax, *, fp4_kv_scale_floor="6x2^-9", e4m3_overflow="saturate") -> np.ndarray:
    """The E4M3 scale byte of blocks with the given amax (V4.1 main KV)."""
    amax = np.maximum(np.asarray(amax, dtype=F32), _KV_FLOORS[fp4_kv_scale_floor])
    return e4m3_encode(amax / F32(E2M1_MAX), overflow=e4m3_overflow)


def fp4_e4m3_quantize(x, *, fp4_kv_scale_floor="6x2^-9", e4m3_overflow="saturate",
                      scale_apply="divide", e2m1_overflow="clamp", e2m1_ties="even",
                      e2m1_zero_sign="keep", nibble_order="low_first"):
    """V4.1 main KV: x[..., 16k] -> (packed uint8 [..., 8k], E4M3 scale bytes [..., k])."""
    xb = blocks(x, FP4_KV_BLOCK)
    scales = fp4_e4m3_scale(block_amax(xb), fp4_kv_scale_floor=fp4_kv_scale_floor,
                            e4m3_overflow=e4m3_overflow)
    codes = e2m1_codes(xb, e4m3_decode(scales), scale_apply=scale_apply, e2m1_overflow=e2m1_overflow,
                       e2m1_ties=e2m1_ties, e2m1_zero_sign=e2m1_zero_sign)
    return fp4_pack(unblock(codes), nibble_order=nibble_order), scales


def fp4_e4m3_dequantize(packed, scales, *, nibble_order="low_first") -> np.ndarray:
    values = blocks(e2m1_decode(fp4_unpack(packed, nibble_order=nibble_order)), FP4_KV_BLOCK)
    return unblock(values * e4m3_decode(scales)[..., None])


def fp4_e8m0_scale(amax, *, fp4_idx_amax_floor="6x2^-126", e8m0_rounding="ceil_exact") -> np.ndarray:
    """The E8M0 scale byte of blocks with the given amax (indexer Q/K)."""
    amax = np.maximum(np.asarray(amax, dtype=F32), _IDX_FLOORS[fp4_idx_amax_floor])
    return e8m0_encode_exponent(pow2_scale_exponent(amax, FP4_MAX_INV, 2, e8m0_rounding=e8m0_rounding))


def fp4_e8m0_quantize(x, *, fp4_idx_amax_floor="6x2^-126", e8m0_rounding="ceil_exact",
                      e2m1_overflow="clamp", e2m1_ties="even", e2m1_zero_sign="keep",
                      nibble_order="low_first"):
    """Indexer Q/K: x[..., 32k] -> (packed uint8 [..., 16k], E8M0 scale bytes [..., k])."""
    xb = blocks(x, FP4_IDX_BLOCK)
    scales = fp4_e8m0_scale(block_amax(xb), fp4_idx_amax_floor=fp4_idx_amax_floor,
                            e8m0_rounding=e8m0_rounding)
    codes = e2m1_codes(xb, e8m0_decode(scales), e2m1_overflow=e2m1_overflow, e2m1_ties=e2m1_ties,
                       e2m1_zero_sign=e2m1_zero_sign)
    return fp4_pack(unblock(codes), nibble_order=nibble_order), scales


def fp4_e8m0_dequantize(packed, scales, *, nibble_order="low_first") -> np.ndarray:
    values = blocks(e2m1_decode(fp4_unpack(packed, nibble_order=nibble_order)), FP4_IDX_BLOCK)
    with np.errstate(over="ignore"):            # 6 · 2^127 is +Inf in fp32, as on any device
        return unblock(values * e8m0_decode(scales)[..., None])


def fp8_scale(amax, *, fp8_amax_floor="1e-4", e8m0_rounding="ceil_exact") -> np.ndarray:
    """The E8M0 scale byte of act_quant blocks with the given amax."""
    amax = np.maximum(np.asarray(amax, dtype=F32), _FP8_FLOORS[fp8_amax_floor])
    return e8m0_encode_exponent(pow2_scale_exponent(amax, FP8_MAX_INV, 8, e8m0_rounding=e8m0_rounding))


def fp8_ratio(xb, s) -> np.ndarray:
    """clamp(fl32(x / s), ±448) for blocks xb [..., nb, b] and scales s [..., nb]."""
    s = np.asarray(s, dtype=F32)[..., None]
    return np.clip(np.asarray(xb, dtype=F32) / s, F32(-E4M3_MAX), F32(E4M3_MAX))


def _fp8_ratio(x, block, fp8_amax_floor, e8m0_rounding):
    xb = blocks(x, block)
    scales = fp8_scale(block_amax(xb), fp8_amax_floor=fp8_amax_floor, e8m0_rounding=e8m0_rounding)
    s = e8m0_decode(scales)
    return fp8_ratio(xb, s), s[..., None], scales


def fp8_quantize(x, block: int, *, fp8_amax_floor="1e-4", e8m0_rounding="ceil_exact",
                 e4m3_overflow="saturate"):
    """act_quant: x[..., b·k] -> (E4M3 bytes [..., b·k], E8M0 scale bytes [..., k])."""
    ratio, _, scales = _fp8_ratio(x, block, fp8_amax_floor, e8m0_rounding)
    return unblock(e4m3_encode(ratio, overflow=e4m3_overflow)), scales


def fp8_dequantize(q, scales, block: int) -> np.ndarray:
    with np.errstate(over="ignore"):            # 448 · 2^127 is +Inf in fp32, as on any device
        return unblock(blocks(e4m3_decode(q), block) * e8m0_decode(scales)[..., None])


def fp8_qdq(x, block: int, *, v4_fp8_inplace="fp8", fp8_amax_floor="1e-4",
            e8m0_rounding="ceil_exact", e4m3_overflow="saturate") -> np.ndarray:
    """The in-place act_quant result written back by the reference: round(clamp(x/s)) · s."""
    ratio, s, _ = _fp8_ratio(x, block, fp8_amax_floor, e8m0_rounding)
    if v4_fp8_inplace == "fp8":
        rounded = e4m3_decode(e4m3_encode(ratio, overflow=e4m3_overflow))
    elif v4_fp8_inplace == "bf16":
        rounded = bf16_round(ratio)
    else:
        raise ValueError(f"unknown v4_fp8_inplace {v4_fp8_inplace!r}")
    return unblock(rounded * s)




# --------------------------------------------------------------------------------------------
# The FP8 linear (V4/V4.1 `linear()` of an float8_e4m3fn weight): act_quant, then fp8_gemm
# --------------------------------------------------------------------------------------------

FP8_LINEAR_BLOCK = {"v4-flash": 128, "v4-pro": 128, "v4.1-flash": 32}
MMA_STEP = 32               # products one FP8 tensor-core instruction sums (Hopper wgmma, k = 32)
MMA_LOSS = 2.0 ** -12       # what one instruction step may lose, relative to Σ|a·b| (e8m13 accumulator)
_E4M3_QUANTUM = 2 ** 9      # every E4M3 value is an integer times 2^-9


_E4M3_INTEGERS = e4m3_decode(np.arange(256, dtype=np.uint8)).astype(np.float64) * _E4M3_QUANTUM


def _e4m3_integers(codes) -> np.ndarray:
    """E4M3 values × 2^9, as integer-valued float64 (|value| ≤ 448·2^9 < 2^18)."""
    return _E4M3_INTEGERS[np.asarray(codes, np.uint8)]


def _weight_scales(w_scales, n: int, block: int) -> np.ndarray:
    """The weight's E8M0 bytes [ceil(N/b), K/b] as one power of two per output row [N, K/b]."""
    return np.repeat(e8m0_decode(np.asarray(w_scales, np.uint8)).astype(np.float64), block, axis=0)[:n]


def fp8_weight_dequantize(w_codes, w_scales, block: int) -> np.ndarray:
    """ŵ [N, K]: each E4M3 value times its b×b block's E8M0 scale (exact; the weight a BF16 port multiplies)."""
    w_codes = np.asarray(w_codes, np.uint8)
    n, k = w_codes.shape
    scales = np.repeat(_weight_scales(w_scales, n, block), block, axis=1)[:, :k]
    return e4m3_decode(w_codes).astype(np.float64) * scales


def fp8_linear_blocks(x, w_codes, w_scales, block: int):
    """Per K block k: the exact block sum S_k = Σ a_i·w_i of E4M3 values, its Σ|a_i·w_i|, and the
    scale product s_x·s_w; arrays [..., N, K/b].  The sums are exact: integer-valued float64 below
    2^53 (each product < 2^36, b ≤ 2^17 of them), summed in any order."""
    w_codes = np.asarray(w_codes, np.uint8)
    n, k = w_codes.shape
    xq, xs = fp8_quantize(x, block)
    lead = xq.shape[:-1]
    a = np.moveaxis(_e4m3_integers(xq).reshape(-1, k // block, block), 1, 0)            # [nb, M, b]
    sums, mags = _block_dots(a, w_codes, block)                                         # [M, N, nb]
    unit = 2.0 ** -18
    sums *= unit
    mags *= unit
    scale = e8m0_decode(xs).astype(np.float64).reshape(-1, 1, k // block) * _weight_scales(w_scales, n, block)[None]
    return tuple(t.reshape(*lead, n, k // block) for t in (sums, mags, scale))


_DOT_CHUNK = 2 ** 15     # weight values a slice of _block_dots holds


def _block_dots(a, w_codes, block: int):
    """Per K block, Σ a·w and Σ|a|·|w| [M, N, nb] of the activation's E4M3 integers a [nb, M, b] and
    the weight's; a slice of weight rows at a time (the same exact sums, in cache)."""
    n, k = w_codes.shape
    sums, mags = (np.empty((a.shape[1], n, k // block)) for _ in range(2))
    rows = max(1, _DOT_CHUNK // k)
    for r in range(0, n, rows):
        w = np.transpose(_e4m3_integers(w_codes[r:r + rows]).reshape(-1, k // block, block), (1, 2, 0))  # [nb, b, rows]
        sums[:, r:r + rows] = np.moveaxis(a @ w, 0, -1)
        mags[:, r:r + rows] = np.moveaxis(np.abs(a) @ np.abs(w), 0, -1)
    return sums, mags


def fp8_linear(x, w_codes, w_scales, block: int) -> np.ndarray:
    """The canonical FP8 linear of BF16 x [..., K] and an E4M3 weight [N, K] with E8M0 block scales
    [ceil(N/b), K/b]: act_quant(x, b) (FP8.SCALE, FP8.E4M3); per K block the exact block sum
    rounded once to fp32, times fl32(s_x·s_w); those terms added in fp32 in K order from 0; BF16."""
    sums, _, scale = fp8_linear_blocks(x, w_codes, w_scales, block)
    terms = sums.astype(F32) * scale.astype(F32)
    acc = np.zeros(terms.shape[:-1], F32)
    for kb in range(terms.shape[-1]):
        acc = acc + terms[..., kb]
    return bf16_round(acc).astype(np.float64)


def fp8_linear_exact(x, w_codes, w_scales, block: int, blocks=None) -> np.ndarray:
    """Σ_k s_k·S_k: the value the FP8 linear approximates, after its act_quant (blocks:
    fp8_linear_blocks of the same arguments, when computed before)."""
    sums, _, scale = blocks if blocks is not None else fp8_linear_blocks(x, w_codes, w_scales, block)
    return (sums * scale).sum(axis=-1)


def fp8_linear_error(x, w_codes, w_scales, block: int, blocks=None) -> np.ndarray:
    """Σ_k s_k·A_k·(ceil(b/32)·2^-12 + nb·2^-24): the MMA's loss inside each block (FP8.LINEAR) and the
    fp32 adds across the nb blocks, with A_k = Σ|a_i·w_i| of block k (blocks: as fp8_linear_exact's)."""
    _, mags, scale = blocks if blocks is not None else fp8_linear_blocks(x, w_codes, w_scales, block)
    per_block = -(-block // MMA_STEP) * MMA_LOSS + mags.shape[-1] * 2.0 ** -24
    return (mags * scale).sum(axis=-1) * per_block


rule("FP8.LINEAR", "FP8 linear: act_quant, then per K block the E4M3 dot times both scales, fp32, BF16",
     "A Linear whose weight is float8_e4m3fn (the default dtype: the indexer's wq_b, and the attention's "
     "wq_a, wq_b, wkv and wo_b, ATTN.LAYER's q_latent, q_attn, kv_proj and out) computes "
     "y = bf16(Σ_k fl32(S_k)·s_x,k·s_w,k): x is first act_quant-ed per block of b along K with a "
     "power-of-two scale (FP8.SCALE, FP8.E4M3, scale_fmt 'ue8m0'); the weight is E4M3 [N, K] with one "
     "E8M0 scale per b×b block [ceil(N/b), K/b]; S_k is the dot of the E4M3 values of K block k (the "
     "products are exact); each block's sum is multiplied by the product of its two scales, the "
     "terms are accumulated in fp32 in K order, and the sum is rounded once to BF16.  b = 128 in V4 "
     "(block_size), 32 in V4.1 (fp8_block_size, act_quant and weight alike).  A port running these "
     "linears in BF16 declares fp8_linears=bf16 (departing from V4-model L116-118): its result is then "
     "judged as bf16(ŵ · x) of the dequantized weight, fp32 sums in any order (matmul_tolerance).",
     applies_to=V4_ALL, policy="tolerance", knob="fp8_linears",
     sources=("V4-model L17, L108-118 (linear: act_quant(x, block_size, scale_fmt), then fp8_gemm)",
              "V4-model L138-142 (E4M3 weight, scale [ceil(N/128), ceil(K/128)] float8_e8m0fnu)",
              "V4-model L393 (Indexer.wq_b: a ColumnParallelLinear of the default dtype)",
              "V4-model L457-463 (Attention's wq_a, wq_b, wkv and wo_b of the default dtype; wo_a BF16)",
              "V4-model L777-779 (default_dtype float8_e4m3fn, scale_fmt ue8m0)",
              "V4-kernel L41-102 (act_quant_kernel)", "V4-kernel L204-273 (fp8_gemm: T.gemm per K block of 128, then += C_local · s_a·s_b in fp32, BF16 out)",
              "V41-model L26-30, L181-207 (fp8_block_size 32; linear)", "V41-model L225-233 (Linear, 32×32 scales)",
              "V41-model L514 (Indexer.wq_b)", "V41-model L640-650 (Attention's wq_a, wq_b, wkv, wo_b; wo_a BF16)",
              "V41-kernel L41-113 (act_quant, as the port cites it)", "V41-kernel L202-293 (fp8_gemm, as the port cites it)"),
     tolerance="The order of the products inside one K block is the tensor core's: an FP8 MMA "
               "instruction sums 32 products into an accumulator that keeps about 13 fraction bits "
               "(Hopper's e8m13: why fp8_gemm adds each block's sum into a separate fp32 accumulator), "
               "so each of "
               "the ceil(b/32) instruction steps of a block may lose up to 2^-12 of the block's "
               "Σ|a·w|, a model of the hardware, not a worst case for adversarial inputs.  With the "
               "nb fp32 adds across blocks: E = Σ_k s_k·A_k·(ceil(b/32)·2^-12 + nb·2^-24), A_k = "
               "Σ|a_i·w_i| of block k; a result conforms when |y − Σ_k s_k·S_k| ≤ E plus one BF16 ulp "
               "of |Σ_k s_k·S_k| + E (fp8_linear_error).  E is 2^-10 (V4) and 2^-12 (V4.1) of Σ|x̂·ŵ| "
               "while skipping the act_quant (E4M3 rounding errors of about 2^-5.5 rms) moves y by "
               "about 2^-10 of Σ|x̂·ŵ| at K = 1024-1536, so it exceeds E in about half of the elements "
               "in V4 and most of them in V4.1; applying the scales after the whole sum fails by far more wherever the block "
               "scales differ.  act_quant over a wrong span (one scale per row or per tensor, blocks of 128 "
               "where they are 32 or of 32 where they are 128) moves nothing on rows of like "
               "magnitudes: a power-of-two scale moves no E4M3 rounding except where values fall to "
               "E4M3 subnormals.  Where one run of 32 activations is 2^16 or more above the rest of "
               "its row and the weights over it are small, a scale shared with that run sends the "
               "other values to subnormals or 0 while E is set by the rest of the row: the result "
               "moves by about 150 E (the median of the largest element over 60 such cases; "
               "the check draws them).  The weight's "
               "block is fixed by the shape of its scale tensor; a scale that is not a power of two "
               "(scale_fmt None) moves every value and fails like a skipped act_quant.")
