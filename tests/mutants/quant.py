"""Mutants of the element formats and the FP4/FP8 codecs: one realistic mistake each.

Each is impl with one step of the pipeline swapped.  The codecs are rebuilt below from impl's own
element operations, with every step a keyword argument, so a mutant names exactly one mistake.
"""
import torch

import dsv4spec.impl.quant as impl

from . import mutant

F32_RECIPROCAL_6 = torch.tensor(1.0) / torch.tensor(6.0)
F32_RECIPROCAL_448 = torch.tensor(1.0) / torch.tensor(448.0)


# ---------------------------------------------------------------------------------------------
# Element steps, right and wrong
# ---------------------------------------------------------------------------------------------

def _e2m1_by_strict_boundaries(x, tie_up: bool):
    """E2M1 with every tie broken the same way (toward zero: '>', away from zero: '≥')."""
    magnitude = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8)
    for boundary in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (magnitude >= boundary) if tie_up else (magnitude > boundary)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_ties_toward_zero(x):
    return _e2m1_by_strict_boundaries(x.float(), tie_up=False)


def e2m1_ties_away_from_zero(x):
    return _e2m1_by_strict_boundaries(x.float(), tie_up=True)


def e2m1_positive_zero(x):
    """Sign taken from torch.sign(), which is 0 at ±0: a value rounding to zero loses its sign."""
    code = impl.e2m1_encode(x)
    return torch.where((code & 0x7) == 0, torch.zeros_like(code), code)


def e2m1_ties_toward_zero_positive_zero(x):
    """Two mistakes in one encoder: ties toward zero, and every zero written +0."""
    code = e2m1_ties_toward_zero(x)
    return torch.where((code & 0x7) == 0, torch.zeros_like(code), code)


def e2m1_wrapping(x):
    """An unclamped bit-building encoder: magnitudes ≥ 7 carry out of the 3 magnitude bits."""
    x = x.float()
    magnitude = x.abs()
    big = magnitude > 6
    mantissa, exponent = torch.frexp(torch.where(big, magnitude, torch.ones_like(x)))
    steps = torch.round(mantissa * 4)                # 2, 3 or 4 quanta of 2^(exponent − 2)
    exponent = exponent + (steps == 4).to(exponent.dtype)
    wrapped = ((exponent.to(torch.int64) << 1) | (steps == 3).to(torch.int64)) & 0x7
    small = impl.e2m1_encode(torch.where(big, torch.zeros_like(x), x)).to(torch.int64) & 0x7
    code = torch.where(big, wrapped, small)
    return (code | (torch.signbit(x).to(torch.int64) << 3)).to(torch.uint8)


def e2m1_decode_positive_zero(codes):
    return impl.e2m1_decode(codes) + 0.0            # −0 + 0 = +0: code 8 decodes to +0


def e4m3_encode_nan_overflow(x):
    x = x.float()
    code = impl.e4m3_encode(x)
    return torch.where(x.abs() > 464, code | 0x7F, code)


def e4m3_encode_truncating(x):
    """E4M3 by truncation (round toward zero) instead of round to nearest even."""
    x = x.float()
    code = impl.e4m3_encode(x)
    value = impl.e4m3_decode(code)
    too_big = (value.abs() > x.abs()) & torch.isfinite(x) & (code & 0x7F != 0)
    return torch.where(too_big, code - 1, code)


def e4m3_encode_ties_up(x):
    """E4M3 rounding a tie up (half away from zero for positives) instead of to the even mantissa."""
    code = impl.e4m3_encode(x)
    low, high = impl.e4m3_decode(code), impl.e4m3_decode((code + 1).clamp(max=0x7E))
    return torch.where((x.float() - low) * 2 == high - low, code + 1, code)


def e4m3_decode_no_subnormals(codes):
    """Exponent field 0 read with an implicit leading 1, as if it were normal."""
    value = impl.e4m3_decode(codes)
    c = codes.to(torch.int64)
    sub = ((c >> 3) & 0xF) == 0
    fixed = (1 + (c & 7) / 8.0) * 2.0 ** -7 * torch.where(c >= 0x80, -1.0, 1.0)
    return torch.where(sub, fixed.float(), value)


def e8m0_decode_zero_is_zero(codes):
    return torch.where(codes == 0, torch.zeros(codes.shape), impl.e8m0_decode(codes))


def bf16_truncating(x):
    bits = x.float().contiguous().view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32)


def pack_high_first(codes):
    return impl.fp4_pack(torch.stack([codes[..., 1::2], codes[..., 0::2]], -1).flatten(-2))


def unpack_high_first(packed):
    codes = impl.fp4_unpack(packed)
    return torch.stack([codes[..., 1::2], codes[..., 0::2]], -1).flatten(-2)


def exponent_ceil(amax, reciprocal, emax):
    return impl._ceil_log2(amax * reciprocal)


def exponent_ocp_floor(amax, reciprocal, emax):
    _, k = torch.frexp(amax)
    return k.to(torch.int64) - 1 - emax


def exponent_float_log2(amax, reciprocal, emax):
    return torch.ceil(torch.log2(amax * reciprocal)).to(torch.int64)


def exponent_one_too_low(amax, reciprocal, emax):
    """An off-by-one bias: every E8M0 scale (and the division by it) one power of two too small."""
    return exponent_ceil(amax, reciprocal, emax) - 1


# ---------------------------------------------------------------------------------------------
# The codecs with swappable steps
# ---------------------------------------------------------------------------------------------

def _checked(op, x, block):
    getattr(impl, op)(x, block) if op.startswith("fp8") else getattr(impl, op)(x)   # impl's errors
    return x.float()


def fp4_kv(x, *, floor=6 * 2.0 ** -9, encode_scale=impl.e4m3_encode, reciprocal=False, clamp=True,
           round_up_scale=False, bf16_quotient=False, encode=impl.e2m1_encode, pack=impl.fp4_pack):
    xb = _checked("fp4_e4m3_quantize", x, 16).reshape(*x.shape[:-1], -1, 16)
    amax = xb.abs().amax(-1).clamp(min=floor)
    ideal = amax / torch.full_like(amax, 6.0)
    scale_bytes = encode_scale(ideal)
    if round_up_scale:            # the next E4M3 value up, saturating at 448 like the cast
        up = (impl.e4m3_decode(scale_bytes) < ideal) & (scale_bytes < 0x7E)
        scale_bytes = torch.where(up, scale_bytes + 1, scale_bytes)
    s = impl.e4m3_decode(scale_bytes).unsqueeze(-1)
    ratio = xb * (1.0 / s) if reciprocal else xb / s.expand_as(xb).contiguous()
    if bf16_quotient:             # the division done in BF16 tensors: the quotient rounded to BF16
        ratio = (xb.bfloat16() / s.expand_as(xb).bfloat16()).float()
    if clamp:
        ratio = ratio.clamp(-6.0, 6.0)
    ratio = torch.nan_to_num(ratio, nan=0.0)
    return pack(encode(ratio.contiguous()).flatten(-2)), scale_bytes


def fp4_idx(x, *, floor=6 * 2.0 ** -126, exponent=exponent_ceil, encode=impl.e2m1_encode,
            pack=impl.fp4_pack):
    xb = _checked("fp4_e8m0_quantize", x, 32).reshape(*x.shape[:-1], -1, 32)
    e = exponent(xb.abs().amax(-1).clamp(min=floor), F32_RECIPROCAL_6, 2).clamp(-127, 127)
    ratio = (xb / impl._pow2(e).unsqueeze(-1)).clamp(-6.0, 6.0)
    return pack(encode(ratio.contiguous()).flatten(-2)), (e + 127).to(torch.uint8)


def fp8(x, block, *, floor=1e-4, exponent=exponent_ceil, encode=impl.e4m3_encode, block_override=None):
    x = _checked("fp8_quantize", x, block)
    block = block_override or block
    xb = x.reshape(*x.shape[:-1], -1, block)
    e = exponent(xb.abs().amax(-1).clamp(min=floor), F32_RECIPROCAL_448, 8).clamp(-127, 127)
    ratio = (xb / impl._pow2(e).unsqueeze(-1)).clamp(-448.0, 448.0)
    return encode(ratio.contiguous()).flatten(-2), (e + 127).to(torch.uint8)


def _poisoning_rows(op):
    """NaN/Inf accepted, but a row holding one is zeroed whole (a per-token guard): blocks without
    any non-finite value change."""
    def run(x, *block):
        x = x.float()
        return op(torch.where(torch.isfinite(x).all(-1, keepdim=True), x, torch.zeros_like(x)), *block)
    return run


def fp8_qdq_through_bf16(x, block):
    """The initial V4-Flash kernel: clamp(x/s) is cast to BF16, not FP8, before × s (an allowed
    choice: a mistake only against a declaration of v4_fp8_inplace=fp8)."""
    q, scales = impl.fp8_quantize(x, block)
    s = impl.e8m0_decode(scales).unsqueeze(-1)
    xb = x.float().reshape(*x.shape[:-1], -1, block)
    return (impl.bf16_round((xb / s).clamp(-448, 448).contiguous()) * s).flatten(-2)


def fp8_qdq_through_e5m2(x, block):
    """The in-place QDQ rounded through the other FP8 format (E5M2), as neither kernel revision does."""
    q, scales = impl.fp8_quantize(x, block)
    s = impl.e8m0_decode(scales).unsqueeze(-1)
    ratio = (x.float().reshape(*x.shape[:-1], -1, block) / s).clamp(-448, 448)
    return (ratio.to(torch.float8_e5m2).float() * s).flatten(-2)


def _dequant_bias_off_by_one(op):
    def run(payload, scales, *block):
        return op(payload, scales, *block) * 0.5
    return run


# ---------------------------------------------------------------------------------------------
# The catalogue: mutant name -> provider
# ---------------------------------------------------------------------------------------------

def _both_fp4(encode=impl.e2m1_encode, pack=impl.fp4_pack):
    return dict(fp4_e4m3_quantize=lambda x: fp4_kv(x, encode=encode, pack=pack),
                fp4_e8m0_quantize=lambda x: fp4_idx(x, encode=encode, pack=pack))


MUTANTS = {
    "e2m1_ties_toward_zero": mutant("e2m1_ties_toward_zero", e2m1_encode=e2m1_ties_toward_zero,
                                    **_both_fp4(encode=e2m1_ties_toward_zero)),
    "e2m1_ties_away_from_zero": mutant("e2m1_ties_away_from_zero", e2m1_encode=e2m1_ties_away_from_zero,
                                       **_both_fp4(encode=e2m1_ties_away_from_zero)),
    "e2m1_zero_sign_lost": mutant("e2m1_zero_sign_lost", e2m1_encode=e2m1_positive_zero,
                                  **_both_fp4(encode=e2m1_positive_zero)),
    "e2m1_no_clamp": mutant("e2m1_no_clamp", e2m1_encode=e2m1_wrapping,
                            fp4_e4m3_quantize=lambda x: fp4_kv(x, clamp=False, encode=e2m1_wrapping)),
    "e2m1_decode_positive_zero": mutant("e2m1_decode_positive_zero", e2m1_decode=e2m1_decode_positive_zero),
    "swapped_nibbles": mutant("swapped_nibbles", fp4_pack=pack_high_first, fp4_unpack=unpack_high_first,
                              **_both_fp4(pack=pack_high_first)),
    "e4m3_nan_on_overflow": mutant("e4m3_nan_on_overflow", e4m3_encode=e4m3_encode_nan_overflow,
                                   fp4_e4m3_quantize=lambda x: fp4_kv(x, encode_scale=e4m3_encode_nan_overflow)),
    "e4m3_truncating": mutant("e4m3_truncating", e4m3_encode=e4m3_encode_truncating,
                              fp8_quantize=lambda x, b: fp8(x, b, encode=e4m3_encode_truncating)),
    "e4m3_decode_no_subnormals": mutant("e4m3_decode_no_subnormals", e4m3_decode=e4m3_decode_no_subnormals),
    "e8m0_decode_zero_is_zero": mutant("e8m0_decode_zero_is_zero", e8m0_decode=e8m0_decode_zero_is_zero),
    "bf16_truncating": mutant("bf16_truncating", bf16_round=bf16_truncating),
    "kv_scale_rounded_up": mutant("kv_scale_rounded_up", fp4_e4m3_quantize=lambda x: fp4_kv(x, round_up_scale=True)),
    "kv_scale_ties_up": mutant("kv_scale_ties_up",
                               fp4_e4m3_quantize=lambda x: fp4_kv(x, encode_scale=e4m3_encode_ties_up)),
    "kv_scale_floor_2^-6": mutant("kv_scale_floor_2^-6", fp4_e4m3_quantize=lambda x: fp4_kv(x, floor=6 * 2.0 ** -6)),
    "kv_reciprocal": mutant("kv_reciprocal", fp4_e4m3_quantize=lambda x: fp4_kv(x, reciprocal=True)),
    "e8m0_ocp_floor": mutant("e8m0_ocp_floor",
                             fp4_e8m0_quantize=lambda x: fp4_idx(x, exponent=exponent_ocp_floor),
                             fp8_quantize=lambda x, b: fp8(x, b, exponent=exponent_ocp_floor)),
    "e8m0_float_log2_ceil": mutant("e8m0_float_log2_ceil",
                                   fp4_e8m0_quantize=lambda x: fp4_idx(x, exponent=exponent_float_log2),
                                   fp8_quantize=lambda x, b: fp8(x, b, exponent=exponent_float_log2)),
    "idx_amax_floor_1e-4": mutant("idx_amax_floor_1e-4", fp4_e8m0_quantize=lambda x: fp4_idx(x, floor=1e-4)),
    "fp8_amax_floor_1e-8": mutant("fp8_amax_floor_1e-8", fp8_quantize=lambda x, b: fp8(x, b, floor=1e-8)),
    "fp8_block_ignored": mutant("fp8_block_ignored", fp8_quantize=lambda x, b: fp8(x, b, block_override=32)),
    "fp8_qdq_through_e5m2": mutant("fp8_qdq_through_e5m2", fp8_qdq=fp8_qdq_through_e5m2),
    "fp8_qdq_bf16_against_declaration": mutant("fp8_qdq_bf16_against_declaration", fp8_qdq=fp8_qdq_through_bf16,
                                               variants={"v4_fp8_inplace": "fp8"}),
    "fp4_dequant_scale_halved": mutant("fp4_dequant_scale_halved",
                                       fp4_e8m0_dequantize=_dequant_bias_off_by_one(impl.fp4_e8m0_dequantize),
                                       fp4_e4m3_dequantize=_dequant_bias_off_by_one(impl.fp4_e4m3_dequantize)),
    "fp8_dequant_scale_halved": mutant("fp8_dequant_scale_halved",
                                       fp8_dequantize=_dequant_bias_off_by_one(impl.fp8_dequantize)),
    "fp4_nonfinite_poisons_row": mutant("fp4_nonfinite_poisons_row",
                                        fp4_e4m3_quantize=_poisoning_rows(impl.fp4_e4m3_quantize),
                                        fp4_e8m0_quantize=_poisoning_rows(impl.fp4_e8m0_quantize)),
    "fp8_nonfinite_poisons_row": mutant("fp8_nonfinite_poisons_row", fp8_quantize=_poisoning_rows(impl.fp8_quantize)),
    "nonfinite_rejected_against_declaration": mutant("nonfinite_rejected_against_declaration",
                                                     variants={"nonfinite_input": "block_local"}),
    "e8m0_scale_one_too_low": mutant("e8m0_scale_one_too_low",
                                     fp4_e8m0_quantize=lambda x: fp4_idx(x, exponent=exponent_one_too_low)),
    "kv_bf16_quotient": mutant("kv_bf16_quotient", fp4_e4m3_quantize=lambda x: fp4_kv(x, bf16_quotient=True)),
    "fp8_ocp_mx_port": mutant("fp8_ocp_mx_port",     # the OCP MX scale rule, with a tiny amax floor
                              fp8_quantize=lambda x, b: fp8(x, b, floor=1e-8, exponent=exponent_ocp_floor)),
    "e2m1_ties_toward_zero_and_positive_zero": mutant(
        "e2m1_ties_toward_zero_and_positive_zero", e2m1_encode=e2m1_ties_toward_zero_positive_zero,
        **_both_fp4(encode=e2m1_ties_toward_zero_positive_zero)),
}

# (name, rule it must fail): several mutants break two rules, one per layer of the format.
CAUGHT = [
    ("e2m1_ties_toward_zero", "FMT.E2M1.RNE"),
    ("e2m1_ties_toward_zero", "FP4.E2M1.RNE"),
    ("e2m1_ties_away_from_zero", "FMT.E2M1.RNE"),
    ("e2m1_ties_away_from_zero", "FP4.E2M1.RNE"),
    ("e2m1_zero_sign_lost", "FMT.E2M1.ZERO_SIGN"),
    ("e2m1_zero_sign_lost", "FP4.E2M1.ZERO_SIGN"),
    ("e2m1_no_clamp", "FMT.E2M1.SATURATE"),
    ("e2m1_no_clamp", "FP4.KV.CLAMP"),
    ("e2m1_decode_positive_zero", "FMT.E2M1.VALUES"),
    ("swapped_nibbles", "FP4.PACK.NIBBLE"),
    ("e4m3_nan_on_overflow", "FMT.E4M3.SATFINITE"),
    ("e4m3_nan_on_overflow", "FP4.KV.SATURATE"),
    ("e4m3_truncating", "FMT.E4M3.RNE"),
    ("e4m3_truncating", "FP8.E4M3"),
    ("e4m3_decode_no_subnormals", "FMT.E4M3.VALUES"),
    ("e8m0_decode_zero_is_zero", "FMT.E8M0.VALUES"),
    ("bf16_truncating", "FMT.BF16.RNE"),
    ("kv_scale_rounded_up", "FP4.KV.SCALE"),
    ("kv_scale_ties_up", "FP4.KV.SCALE"),
    ("kv_scale_floor_2^-6", "FP4.KV.FLOOR"),
    ("kv_reciprocal", "FP4.KV.DIVIDE"),
    ("e8m0_ocp_floor", "FP4.IDX.SCALE"),
    ("e8m0_ocp_floor", "FP8.SCALE"),
    ("e8m0_ocp_floor", "FMT.CEIL_LOG2"),
    ("e8m0_float_log2_ceil", "FP4.IDX.SCALE"),
    ("e8m0_float_log2_ceil", "FMT.CEIL_LOG2"),
    ("idx_amax_floor_1e-4", "FP4.IDX.FLOOR"),
    ("fp8_amax_floor_1e-8", "FP8.FLOOR"),
    ("fp8_block_ignored", "FP8.BLOCKS"),
    ("fp8_qdq_through_e5m2", "FP8.V4_INPLACE"),
    ("fp8_qdq_bf16_against_declaration", "FP8.V4_INPLACE"),
    ("fp4_dequant_scale_halved", "FP4.DEQUANT"),
    ("fp8_dequant_scale_halved", "FP8.DEQUANT"),
    ("fp4_nonfinite_poisons_row", "FP4.NONFINITE"),
    ("fp8_nonfinite_poisons_row", "FP8.NONFINITE"),
    ("nonfinite_rejected_against_declaration", "FP4.NONFINITE"),
    ("nonfinite_rejected_against_declaration", "FP8.NONFINITE"),
    ("e8m0_scale_one_too_low", "FP4.IDX.SCALE"),
    ("e8m0_scale_one_too_low", "FP4.IDX.FLOOR"),
    ("kv_bf16_quotient", "FP4.KV.DIVIDE"),
    ("fp8_ocp_mx_port", "FP8.FLOOR"),
    ("fp8_ocp_mx_port", "FP8.SCALE"),
    ("e2m1_ties_toward_zero_and_positive_zero", "FP4.E2M1.RNE"),
    ("e2m1_ties_toward_zero_and_positive_zero", "FP4.E2M1.ZERO_SIGN"),
]


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, rule_id, MUTANTS[name]) for name, rule_id in CAUGHT]


# ---------------------------------------------------------------------------------------------
# Boundary mutants (issue 8): mistakes that show only exactly on a decision boundary or one ulp
# beside it.  tests/mutants/BOUNDARIES.md tables them with what the suite caught before.
# ---------------------------------------------------------------------------------------------

def _e4m3_ties_away(v, below=float("inf")):
    """E4M3 of v ≥ 0 with exact ties (where v < below) going to the larger value, not the even one."""
    code = impl.e4m3_encode(v)
    up = impl.e4m3_decode((code.to(torch.int64) + 1).clamp(max=0x7E).to(torch.uint8))
    tie = (impl.e4m3_decode(code) + up) / 2 == v          # RNE took the lower, even, code
    return torch.where(tie & (v < below) & (code < 0x7E), code + 1, code)


def _kv_scaled(scale_bytes_of):
    """V4.1 main KV with the scale bytes computed from the floored amax by `scale_bytes_of`."""
    def run(x):
        xb = _checked("fp4_e4m3_quantize", x, 16).reshape(*x.shape[:-1], -1, 16)
        amax = xb.abs().amax(-1).clamp(min=6 * 2.0 ** -9)
        scale_bytes = scale_bytes_of(amax)
        s = impl.e4m3_decode(scale_bytes).unsqueeze(-1)
        codes = impl.e2m1_encode((xb / s.expand_as(xb).contiguous()).clamp(-6.0, 6.0).contiguous())
        return impl.fp4_pack(codes.flatten(-2)), scale_bytes
    return run


def e4m3_464_tie_to_nan(x):
    """The saturation tie at |x| = 464 (between 448 and the NaN code) rounded away from zero."""
    x = x.float()
    code = impl.e4m3_encode(x)
    return torch.where(x.abs() == 464, code | 0x7F, code)


def _through_bf16(encode):
    return lambda r: encode(r.to(torch.bfloat16).float())


def fp8_qdq_ratio_through_bf16(x, block):
    q, scales = fp8(x, block, encode=_through_bf16(impl.e4m3_encode))
    return impl.fp8_dequantize(q, scales, block)


def _pow2_by_bits(op, block):
    """Dequantization building 2^(b − 127) from the bits b << 23: byte 0 gives +0, not 2^-127."""
    def run(payload, scales, *args):
        out = op(payload, scales, *args)
        zero = (scales == 0).repeat_interleave(block, -1)
        return torch.where(zero, torch.zeros_like(out), out)
    return run


def exponent_of_bf16_amax(amax, reciprocal, emax):
    """The scale taken from a BF16 max reduction: amax rounded to BF16 first."""
    return exponent_ceil(impl.bf16_round(amax.contiguous()), reciprocal, emax)


MUTANTS.update({
    "kv_scale_reciprocal_6": mutant("kv_scale_reciprocal_6", fp4_e4m3_quantize=_kv_scaled(
        lambda amax: impl.e4m3_encode(amax * F32_RECIPROCAL_6))),
    "kv_scale_ties_away": mutant("kv_scale_ties_away", fp4_e4m3_quantize=_kv_scaled(
        lambda amax: _e4m3_ties_away(amax / torch.full_like(amax, 6.0)))),
    "kv_subnormal_scale_ties_away": mutant("kv_subnormal_scale_ties_away", fp4_e4m3_quantize=_kv_scaled(
        lambda amax: _e4m3_ties_away(amax / torch.full_like(amax, 6.0), below=2.0 ** -6))),
    "e4m3_464_tie_to_nan": mutant("e4m3_464_tie_to_nan", e4m3_encode=e4m3_464_tie_to_nan),
    "fp4_ratio_through_bf16": mutant("fp4_ratio_through_bf16", **_both_fp4(encode=_through_bf16(impl.e2m1_encode))),
    "fp8_ratio_through_bf16": mutant("fp8_ratio_through_bf16",
                                     fp8_quantize=lambda x, b: fp8(x, b, encode=_through_bf16(impl.e4m3_encode))),
    "fp8_qdq_ratio_through_bf16": mutant("fp8_qdq_ratio_through_bf16", fp8_qdq=fp8_qdq_ratio_through_bf16),
    "fp4_dequant_pow2_by_bits": mutant("fp4_dequant_pow2_by_bits",
                                       fp4_e8m0_dequantize=_pow2_by_bits(impl.fp4_e8m0_dequantize, 32)),
    "fp8_dequant_pow2_by_bits": mutant("fp8_dequant_pow2_by_bits", fp8_dequantize=lambda q, s, b: _pow2_by_bits(
        impl.fp8_dequantize, b)(q, s, b)),
    "idx_amax_in_bf16": mutant("idx_amax_in_bf16", fp4_e8m0_quantize=lambda x: fp4_idx(x, exponent=exponent_of_bf16_amax)),
    "fp8_amax_in_bf16": mutant("fp8_amax_in_bf16", fp8_quantize=lambda x, b: fp8(x, b, exponent=exponent_of_bf16_amax)),
    "idx_floor_min_normal": mutant("idx_floor_min_normal", fp4_e8m0_quantize=lambda x: fp4_idx(x, floor=2.0 ** -126)),
})

CAUGHT += [
    ("kv_scale_reciprocal_6", "FP4.KV.SCALE"),
    ("kv_scale_ties_away", "FP4.KV.SCALE"),
    ("kv_subnormal_scale_ties_away", "FP4.KV.SCALE"),
    ("e4m3_464_tie_to_nan", "FMT.E4M3.SATFINITE"),
    ("fp4_ratio_through_bf16", "FP4.E2M1.RNE"),
    ("fp8_ratio_through_bf16", "FP8.E4M3"),
    ("fp8_qdq_ratio_through_bf16", "FP8.V4_INPLACE"),
    ("fp4_dequant_pow2_by_bits", "FP4.DEQUANT"),
    ("fp8_dequant_pow2_by_bits", "FP8.DEQUANT"),
    ("idx_amax_in_bf16", "FP4.IDX.SCALE"),
    ("fp8_amax_in_bf16", "FP8.SCALE"),
    ("idx_floor_min_normal", "FP4.IDX.FLOOR"),
]


def _flush_subnormal_e4m3(encode):
    """An E4M3 cast with flush-to-zero: results below 2^-6 (the subnormals) become ±0."""
    def run(x):
        code = encode(x)
        subnormal = (code & 0x78) == 0
        return torch.where(subnormal, code & 0x80, code)
    return run


def bf16_ties_away(x):
    """BF16 by adding half an ulp and truncating: ties go away from zero, not to even."""
    bits = x.float().contiguous().view(torch.int32)
    finite = torch.isfinite(x.float())
    rounded = ((bits + 0x8000) & ~0xFFFF).view(torch.float32)
    return torch.where(finite, rounded, impl.bf16_round(x))


def _kv_divide_in_bf16(x):
    """V4.1 main KV with x/s computed in BF16 (the activation dtype) before the E2M1 cast."""
    return fp4_kv(x, encode=lambda r: impl.e2m1_encode(r.to(torch.bfloat16).float()))


def _nan_poisons_the_row(op):
    """A quantizer that guards NaN per row, not per block: a row holding a NaN is quantized as zeros,
    so its other blocks change (the official effect stays inside the NaN's own block)."""
    def run(x, *block):
        x = x.float()
        return op(torch.where(torch.isnan(x).any(-1, keepdim=True), torch.zeros_like(x), x), *block)
    return run


MUTANTS.update({
    "e4m3_flushes_subnormals": mutant("e4m3_flushes_subnormals", e4m3_encode=_flush_subnormal_e4m3(impl.e4m3_encode)),
    "fp8_flushes_subnormals": mutant("fp8_flushes_subnormals", fp8_quantize=lambda x, b: fp8(
        x, b, encode=_flush_subnormal_e4m3(impl.e4m3_encode))),
    "bf16_ties_away": mutant("bf16_ties_away", bf16_round=bf16_ties_away),
    "kv_divide_in_bf16": mutant("kv_divide_in_bf16", fp4_e4m3_quantize=_kv_divide_in_bf16),
    "fp4_nan_poisons_row": mutant("fp4_nan_poisons_row", fp4_e4m3_quantize=_nan_poisons_the_row(impl.fp4_e4m3_quantize),
                                  fp4_e8m0_quantize=_nan_poisons_the_row(impl.fp4_e8m0_quantize)),
})

CAUGHT += [
    ("e4m3_flushes_subnormals", "FMT.E4M3.RNE"),
    ("fp8_flushes_subnormals", "FP8.E4M3"),
    ("bf16_ties_away", "FMT.BF16.RNE"),
    ("kv_divide_in_bf16", "FP4.KV.DIVIDE"),
    ("fp4_nan_poisons_row", "FP4.NONFINITE"),
]


def e2m1_sign_from_less_than_zero(x):
    """The sign bit taken from x < 0 (not the sign bit): −0 encodes as +0."""
    x = x.float()
    return (impl.e2m1_encode(x) & 0x7) | ((x < 0).to(torch.uint8) << 3)


def fp8_one_scale_per_row(x, block):
    """act_quant with one scale for the whole row (per-token), every block stored with it."""
    n = x.shape[-1]
    q, scales = fp8(x, n)
    return q, scales.repeat_interleave(n // block, -1)


MUTANTS.update({
    "e2m1_sign_from_less_than_zero": mutant("e2m1_sign_from_less_than_zero", e2m1_encode=e2m1_sign_from_less_than_zero),
    "fp8_one_scale_per_row": mutant("fp8_one_scale_per_row", fp8_quantize=fp8_one_scale_per_row),
})

CAUGHT += [
    ("e2m1_sign_from_less_than_zero", "FMT.E2M1.ZERO_SIGN"),
    ("fp8_one_scale_per_row", "FP8.BLOCKS"),
]


# ---------------------------------------------------------------------------------------------
# The FP8 linear (FP8.LINEAR; the index q projection uses these too, tests/mutants/path.py)
# ---------------------------------------------------------------------------------------------

def _weight_values(w, w_scale, block):
    n = w.shape[0]
    s = impl.e8m0_decode(w_scale).repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)
    return impl.e4m3_decode(w) * s


def fp8_linear_without_act_quant(x, w, w_scale, block):
    """The BF16 projection: the dequantized weight times x itself in fp32, one BF16 rounding."""
    return impl.bf16_round(x.float() @ _weight_values(w, w_scale, block).T)


def fp8_linear_scales_after_the_sum(x, w, w_scale, block):
    """The E4M3 dot over the whole K first, then one scale product (of the first K block)."""
    q, s = impl.fp8_quantize(x, block)
    raw = impl.e4m3_decode(q).double() @ impl.e4m3_decode(w).double().T
    s_w = impl.e8m0_decode(w_scale).repeat_interleave(block, 0)[:w.shape[0], 0]
    return impl.bf16_round((raw * impl.e8m0_decode(s)[..., :1] * s_w).float())


def fp8_linear_scale_not_pow2(x, w, w_scale, block):
    """act_quant without scale_fmt="ue8m0" (V4 model.py's module default, None): s = fl32(amax/448),
    not a power of two, so x/s lands on another E4M3 grid."""
    xb = x.float().reshape(*x.shape[:-1], -1, block)
    s = xb.abs().amax(-1, keepdim=True).clamp(min=1e-4) * F32_RECIPROCAL_448
    x_hat = (impl.e4m3_decode(impl.e4m3_encode((xb / s).clamp(-448, 448).contiguous())) * s).flatten(-2)
    return impl.bf16_round(x_hat @ _weight_values(w, w_scale, block).T)


MUTANTS.update({
    "fp8_linear_without_act_quant": mutant("fp8_linear_without_act_quant", fp8_linear=fp8_linear_without_act_quant),
    "fp8_linear_scales_after_the_sum": mutant("fp8_linear_scales_after_the_sum",
                                              fp8_linear=fp8_linear_scales_after_the_sum),
    "fp8_linear_scale_not_pow2": mutant("fp8_linear_scale_not_pow2", fp8_linear=fp8_linear_scale_not_pow2),
})

CAUGHT += [
    ("fp8_linear_without_act_quant", "FP8.LINEAR"),
    ("fp8_linear_scales_after_the_sum", "FP8.LINEAR"),
    ("fp8_linear_scale_not_pow2", "FP8.LINEAR"),
]


# ---------------------------------------------------------------------------------------------
# The range class (issue 22): BF16 inputs reach fp32's whole exponent range, and the official GPU
# kernel keeps subnormal elements, floor blocks and saturated scales.  Each mutant below keeps
# every scale byte right and gets only the payload of such blocks wrong.
# ---------------------------------------------------------------------------------------------

def _flush_subnormal_inputs(x):
    """Inputs below 2^-126 flushed to a zero of their sign (GPU fast-math's denormals-are-zero)."""
    x = x.float()
    return torch.where(x.abs() < 2.0 ** -126, x * 0.0, x)


def idx_floor_block_against_unfloored_scale(x):
    """Indexer FP4 whose floor clamps the stored exponent byte, not amax: the byte of a floor block
    is 2^-126, its codes divided by the unclamped 2^ceil(log2(amax·fl32(1/6))) (a subnormal)."""
    packed, scales = impl.fp4_e8m0_quantize(x)
    xb = x.float().reshape(*x.shape[:-1], -1, 32)
    amax = xb.abs().amax(-1)
    e = torch.where(amax > 0, impl._ceil_log2(torch.where(amax > 0, amax * F32_RECIPROCAL_6, 1.0)), 0)
    e = torch.where(e < -126, e.clamp(min=-149), torch.full_like(e, 0))
    ratio = (xb / impl._pow2(e).unsqueeze(-1)).clamp(-6.0, 6.0)
    codes = impl.fp4_pack(impl.e2m1_encode(ratio.contiguous()).flatten(-2))
    floor_block = (e < 0).repeat_interleave(16, -1)
    return torch.where(floor_block, codes, packed), scales


def kv_saturated_block_against_464(x):
    """V4.1 main KV with satfinite emulated by clamping amax/6 at 464 in fp32 (the largest value the
    cast rounds to 448), and that clamped value, not the cast's 448, dividing the saturated blocks:
    the bytes stay 0x7E and whatever clips stays ±6; the elements in between round 3.5% low."""
    packed, scales = impl.fp4_e4m3_quantize(x)
    xb = x.float().reshape(*x.shape[:-1], -1, 16)
    ratio = (xb / 464.0).clamp(-6.0, 6.0)
    codes = impl.fp4_pack(impl.e2m1_encode(ratio.contiguous()).flatten(-2))
    saturated = (scales == 0x7E).unsqueeze(-1).expand(*scales.shape, 8).reshape(packed.shape)
    return torch.where(saturated, codes, packed), scales


MUTANTS.update({
    "fp4_flushes_subnormal_inputs": mutant(
        "fp4_flushes_subnormal_inputs",
        fp4_e4m3_quantize=lambda x: impl.fp4_e4m3_quantize(_flush_subnormal_inputs(impl._values(
            "fp4_e4m3_quantize", x, 16, finite=True))),
        fp4_e8m0_quantize=lambda x: impl.fp4_e8m0_quantize(_flush_subnormal_inputs(impl._values(
            "fp4_e8m0_quantize", x, 32, finite=True)))),
    "idx_floor_block_against_unfloored_scale": mutant(
        "idx_floor_block_against_unfloored_scale", fp4_e8m0_quantize=idx_floor_block_against_unfloored_scale),
    "kv_saturated_block_against_464": mutant(
        "kv_saturated_block_against_464", fp4_e4m3_quantize=kv_saturated_block_against_464),
})

def fp8_floor_block_against_unfloored_scale(x, block):
    """act_quant whose floor clamps the stored exponent byte, not amax: a floor block (amax below
    fl32(1e-4)) keeps the right byte, its codes divided by 2^ceil(log2(amax·fl32(1/448)))."""
    q, scales = impl.fp8_quantize(x, block)
    xb = x.float().reshape(*x.shape[:-1], -1, block)
    amax = xb.abs().amax(-1)
    floor_block = (amax > 0) & (amax < impl.FP8_AMAX_FLOOR)
    e = impl._ceil_log2(torch.where(floor_block, amax, 1.0) * (torch.tensor(1.0) / torch.tensor(448.0)))
    codes = impl.e4m3_encode((xb / impl._pow2(e).unsqueeze(-1)).clamp(-448.0, 448.0).contiguous()).flatten(-2)
    return torch.where(floor_block.repeat_interleave(block, -1), codes, q), scales


MUTANTS["fp8_floor_block_against_unfloored_scale"] = mutant(
    "fp8_floor_block_against_unfloored_scale", fp8_quantize=fp8_floor_block_against_unfloored_scale)

CAUGHT += [
    ("fp8_floor_block_against_unfloored_scale", "FP8.E4M3"),
    ("fp4_flushes_subnormal_inputs", "FP4.E2M1.RNE"),
    ("idx_floor_block_against_unfloored_scale", "FP4.E2M1.RNE"),
    ("kv_saturated_block_against_464", "FP4.E2M1.RNE"),
    ("kv_saturated_block_against_464", "FP4.KV.DIVIDE"),
]


# ---------------------------------------------------------------------------------------------
# Every clause reachable (issue 22): one mutant per statement clause that no mutant above changes
# alone (properties/clauses.py lists each beside its clause).
# ---------------------------------------------------------------------------------------------

def _signed(magnitude, codes):
    return torch.where(codes.to(torch.int64) & 0x8 != 0, -magnitude, magnitude)


def e2m1_decode_no_subnormals(codes):
    """Exponent field 0 read as normal: codes 0 and 1 decode to 0.5 and 0.75, not 0 and 0.5."""
    c = codes.to(torch.int64)
    sub = (c & 0x6) == 0
    return torch.where(sub, _signed(0.5 * (1 + (c & 1) / 2.0), c).float(), impl.e2m1_decode(codes))


def e2m1_decode_sign_bit_7(codes):
    """The sign read from bit 7 of the byte (an FP8 habit): a nibble never has it, negatives decode positive."""
    return impl.e2m1_decode(codes & 0x7)


def e2m1_decode_ieee_specials(codes):
    """Exponent field 3 read as IEEE specials: m = 0 (±4) as ±Inf, m = 1 (±6) as NaN."""
    c = codes.to(torch.int64)
    top = (c & 0x6) == 0x6
    special = torch.where((c & 1) == 1, torch.tensor(float("nan")), _signed(torch.tensor(float("inf")), c))
    return torch.where(top, special.float(), impl.e2m1_decode(codes))


def _e2m1_with_steps(x, steps):
    x = x.float()
    magnitude = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8)
    for boundary, tie_up in steps:
        code += (magnitude >= boundary) if tie_up else (magnitude > boundary)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_tie_at_5_up(x):
    """A threshold table with one comparison flipped: ≥ 5 where the table has > 5 (5 encodes to 6)."""
    return _e2m1_with_steps(x, [(b, up or b == 5.0) for b, up in impl.E2M1_STEPS])


def e2m1_truncating(x):
    """E2M1 by truncation toward zero: the largest magnitude not above |x|."""
    return _e2m1_with_steps(x, [(m, True) for m in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)])


def e2m1_sign_dropped(x):
    """The magnitude encoded, the sign never set."""
    return impl.e2m1_encode(x) & 0x7


def e2m1_saturates_unsigned(x):
    """|x| > 6 written as code 0x7 whatever the sign."""
    x = x.float()
    return torch.where(x.abs() > 6, torch.full_like(impl.e2m1_encode(x), 0x7), impl.e2m1_encode(x))


def e2m1_negative_quarter_positive_zero(x):
    """−0.25 (the tie to zero) written +0: the sign is kept only for x > −0.25."""
    x = x.float()
    code = impl.e2m1_encode(x)
    return torch.where(x == -0.25, torch.zeros_like(code), code)


def e4m3_decode_bias_8(codes):
    """Exponent bias 8 (float8_e4m3fnuz's) for every byte: each value half the right one."""
    return impl.e4m3_decode(codes) * 0.5


def e4m3_decode_no_nan(codes):
    """0x7F and 0xFF decoded as ±480 (the grid continued), not NaN."""
    c = codes.to(torch.int64)
    return torch.where((c & 0x7F) == 0x7F, torch.where(c >= 0x80, -480.0, 480.0), impl.e4m3_decode(codes))


def e4m3_decode_ieee_specials(codes):
    """Exponent field 15 read as IEEE specials (float8_e4m3 without 'fn'): m = 0 Inf, else NaN."""
    c = codes.to(torch.int64)
    top = ((c >> 3) & 0xF) == 0xF
    special = torch.where((c & 7) == 0, torch.where(c >= 0x80, -float("inf"), float("inf")), float("nan"))
    return torch.where(top, special.float(), impl.e4m3_decode(codes))


def e4m3_negative_zero_unsigned(x):
    """A value that rounds to ±0 written 0x00: −0 loses its sign."""
    code = impl.e4m3_encode(x)
    return torch.where(code == 0x80, torch.zeros_like(code), code)


def e4m3_inf_to_nan(x):
    """Finite values saturate, ±Inf becomes NaN (a clamp applied only to finite values)."""
    code = impl.e4m3_encode(x)
    return torch.where(torch.isinf(x.float()), code | 0x7F, code)


def e4m3_nan_to_zero(x):
    """NaN written as 0 (nan_to_num before the cast)."""
    return impl.e4m3_encode(torch.nan_to_num(x.float(), nan=0.0))


def e4m3_nan_sign_dropped(x):
    """Every NaN written as the canonical 0x7F, its sign dropped."""
    code = impl.e4m3_encode(x)
    return torch.where(torch.isnan(x.float()), torch.full_like(code, 0x7F), code)


def e8m0_decode_bias_128(codes):
    """2^(b − 128): every scale one power of two low."""
    return impl.e8m0_decode(codes) * 0.5


def e8m0_decode_255_inf(codes):
    """Byte 255 decoded as 2^128 = +Inf (the formula continued), not NaN."""
    return torch.where(codes == 0xFF, torch.tensor(float("inf")), impl.e8m0_decode(codes))


def exponent_floor_plus_one(amax, reciprocal, emax):
    """ceil(log2 v) as floor(log2 v) + 1: right off the powers of two, one too high on them."""
    _, k = torch.frexp(amax * reciprocal)
    return k.to(torch.int64)


def bf16_saturating(x):
    """Overflow clamped to ±BF16 max instead of rounding to ±Inf."""
    r = impl.bf16_round(x)
    big = torch.isinf(r) & torch.isfinite(x.float())
    return torch.where(big, torch.copysign(torch.tensor(3.3895313892515355e38), x.float()), r)


def bf16_nan_to_inf(x):
    """The add-and-truncate trick without a NaN guard: a NaN whose payload sits in the low half carries into Inf."""
    bits = impl._bits(x.float().contiguous())
    return impl._from_bits((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000)


def bf16_negative_zero_lost(x):
    return impl.bf16_round(x) + 0.0                 # −0 + 0 = +0


def _kv_zero_block_scale_0(x):
    """V4.1 main KV that writes scale byte 0 (scale 0) for an all-zero block, a division-by-zero guard."""
    packed, scales = impl.fp4_e4m3_quantize(x)
    zero = impl._values("fp4_e4m3_quantize", x, 16, finite=True).reshape(*x.shape[:-1], -1, 16).abs().amax(-1) == 0
    return packed, torch.where(zero, torch.zeros_like(scales), scales)


def _kv_scale_pow2(x):
    """V4.1 main KV with the indexer's habit: the scale 2^ceil(log2(amax/6)), stored as its E4M3 byte."""
    def bytes_of(amax):
        return impl.e4m3_encode(impl._pow2(impl._ceil_log2(amax / torch.full_like(amax, 6.0)).clamp(-9, 8)))
    return _kv_scaled(bytes_of)(x)


def _kv_scale_per_32(x):
    """One E4M3 scale per 32 (the indexer's block): each pair of blocks of 16 shares the amax of both
    (a last unpaired block keeps its own)."""
    xb = _checked("fp4_e4m3_quantize", x, 16).reshape(*x.shape[:-1], -1, 16)
    amax = xb.abs().amax(-1)
    n = amax.shape[-1] - amax.shape[-1] % 2
    paired = amax[..., :n].reshape(*amax.shape[:-1], -1, 2).amax(-1).repeat_interleave(2, -1)
    amax = torch.cat([paired, amax[..., n:]], -1).clamp(min=6 * 2.0 ** -9)
    scale_bytes = impl.e4m3_encode(amax / torch.full_like(amax, 6.0))
    s = impl.e4m3_decode(scale_bytes).unsqueeze(-1)
    codes = impl.e2m1_encode((xb / s.expand_as(xb).contiguous()).clamp(-6.0, 6.0).contiguous())
    return impl.fp4_pack(codes.flatten(-2)), scale_bytes


def _kv_divide_by_unrounded_scale(x):
    """x / fl32(amax/6): the payload divided by the ideal scale, not the rounded E4M3 one."""
    packed, scales = impl.fp4_e4m3_quantize(x)
    xb = impl._values("fp4_e4m3_quantize", x, 16, finite=True).reshape(*x.shape[:-1], -1, 16)
    amax = xb.abs().amax(-1, keepdim=True).clamp(min=6 * 2.0 ** -9)
    ratio = (xb / (amax / 6.0).expand_as(xb).contiguous()).clamp(-6.0, 6.0)
    return impl.fp4_pack(impl.e2m1_encode(ratio.contiguous()).flatten(-2)), scales


def _idx_scale_per_16(x):
    """Indexer FP4 with the KV codec's block: one E8M0 scale per 16, the odd one of each pair dropped."""
    xb = _checked("fp4_e8m0_quantize", x, 32).reshape(*x.shape[:-1], -1, 16)
    e = exponent_ceil(xb.abs().amax(-1).clamp(min=6 * 2.0 ** -126), F32_RECIPROCAL_6, 2).clamp(-127, 127)
    ratio = (xb / impl._pow2(e).unsqueeze(-1)).clamp(-6.0, 6.0)
    return impl.fp4_pack(impl.e2m1_encode(ratio.contiguous()).flatten(-2)), (e[..., 0::2] + 127).to(torch.uint8)


def _zero_block_scale_one(op, block):
    """An all-zero block written with scale 1 (byte 127), a division-by-zero guard."""
    def run(x, *args):
        out, scales = op(x, *args)
        b = args[0] if args else block
        zero = impl._values("fp4_e8m0_quantize", x, b, finite=True).reshape(*x.shape[:-1], -1, b).abs().amax(-1) == 0
        return out, torch.where(zero, torch.full_like(scales, 127), scales)
    return run


def _dequant_negative_zero_lost(op, block, decode_scale):
    def run(*args):
        return op(*args) + 0.0                      # −0 + 0 = +0
    return run


def _fp4_dequant_scales_tiled(op, block, decode_scale):
    """Scales spread with repeat (tile) instead of repeat_interleave: element i gets scale i mod n/block."""
    def run(packed, scales):
        values = impl.e2m1_decode(impl.fp4_unpack(packed))
        s = decode_scale(scales).repeat(*([1] * (scales.dim() - 1)), block)
        return values * s
    return run


def _both_dequantizers(wrap):
    return dict(fp4_e4m3_dequantize=wrap(impl.fp4_e4m3_dequantize, 16, impl.e4m3_decode),
                fp4_e8m0_dequantize=wrap(impl.fp4_e8m0_dequantize, 32, impl.e8m0_decode))


# (name, the rules it must fail, the operations it overrides)
CLAUSE_MUTANTS = [
    ("e2m1_decode_no_subnormals", ("FMT.E2M1.VALUES",), dict(e2m1_decode=e2m1_decode_no_subnormals)),
    ("e2m1_decode_sign_bit_7", ("FMT.E2M1.VALUES",), dict(e2m1_decode=e2m1_decode_sign_bit_7)),
    ("e2m1_decode_ieee_specials", ("FMT.E2M1.VALUES",), dict(e2m1_decode=e2m1_decode_ieee_specials)),
    ("e2m1_tie_at_5_up", ("FMT.E2M1.RNE",), dict(e2m1_encode=e2m1_tie_at_5_up)),
    ("e2m1_truncating", ("FMT.E2M1.RNE", "FP4.E2M1.RNE"),
     dict(e2m1_encode=e2m1_truncating, **_both_fp4(encode=e2m1_truncating))),
    ("e2m1_sign_dropped", ("FMT.E2M1.RNE",), dict(e2m1_encode=e2m1_sign_dropped)),
    ("e2m1_saturates_unsigned", ("FMT.E2M1.SATURATE",), dict(e2m1_encode=e2m1_saturates_unsigned)),
    ("e2m1_negative_quarter_positive_zero", ("FMT.E2M1.ZERO_SIGN",),
     dict(e2m1_encode=e2m1_negative_quarter_positive_zero)),
    ("fp4_sign_from_less_than_zero", ("FP4.E2M1.ZERO_SIGN",), _both_fp4(encode=e2m1_sign_from_less_than_zero)),
    ("e4m3_decode_bias_8", ("FMT.E4M3.VALUES",), dict(e4m3_decode=e4m3_decode_bias_8)),
    ("e4m3_decode_no_nan", ("FMT.E4M3.VALUES",), dict(e4m3_decode=e4m3_decode_no_nan)),
    ("e4m3_decode_ieee_specials", ("FMT.E4M3.VALUES",), dict(e4m3_decode=e4m3_decode_ieee_specials)),
    ("e4m3_ties_up", ("FMT.E4M3.RNE",), dict(e4m3_encode=e4m3_encode_ties_up)),
    ("e4m3_negative_zero_unsigned", ("FMT.E4M3.RNE",), dict(e4m3_encode=e4m3_negative_zero_unsigned)),
    ("e4m3_inf_to_nan", ("FMT.E4M3.SATFINITE",), dict(e4m3_encode=e4m3_inf_to_nan)),
    ("e4m3_nan_to_zero", ("FMT.E4M3.SATFINITE",), dict(e4m3_encode=e4m3_nan_to_zero)),
    ("e4m3_nan_sign_dropped", ("FMT.E4M3.SATFINITE",), dict(e4m3_encode=e4m3_nan_sign_dropped)),
    ("e8m0_decode_bias_128", ("FMT.E8M0.VALUES",), dict(e8m0_decode=e8m0_decode_bias_128)),
    ("e8m0_decode_255_inf", ("FMT.E8M0.VALUES",), dict(e8m0_decode=e8m0_decode_255_inf)),
    ("e8m0_floor_plus_one", ("FMT.CEIL_LOG2",),
     dict(fp4_e8m0_quantize=lambda x: fp4_idx(x, exponent=exponent_floor_plus_one),
          fp8_quantize=lambda x, b: fp8(x, b, exponent=exponent_floor_plus_one))),
    ("bf16_saturating", ("FMT.BF16.RNE",), dict(bf16_round=bf16_saturating)),
    ("bf16_nan_to_inf", ("FMT.BF16.RNE",), dict(bf16_round=bf16_nan_to_inf)),
    ("bf16_negative_zero_lost", ("FMT.BF16.RNE",), dict(bf16_round=bf16_negative_zero_lost)),
    ("unpack_swapped_nibbles", ("FP4.PACK.NIBBLE",), dict(fp4_unpack=unpack_high_first)),
    ("kv_scale_pow2", ("FP4.KV.SCALE",), dict(fp4_e4m3_quantize=_kv_scale_pow2)),
    ("kv_scale_per_32", ("FP4.KV.SCALE",), dict(fp4_e4m3_quantize=_kv_scale_per_32)),
    ("kv_zero_block_scale_0", ("FP4.KV.FLOOR",), dict(fp4_e4m3_quantize=_kv_zero_block_scale_0)),
    ("kv_scale_464_tie_to_nan", ("FP4.KV.SATURATE",),
     dict(fp4_e4m3_quantize=lambda x: fp4_kv(x, encode_scale=e4m3_464_tie_to_nan))),
    ("kv_divide_by_unrounded_scale", ("FP4.KV.DIVIDE",), dict(fp4_e4m3_quantize=_kv_divide_by_unrounded_scale)),
    ("idx_scale_per_16", ("FP4.IDX.SCALE",), dict(fp4_e8m0_quantize=_idx_scale_per_16)),
    ("idx_zero_block_scale_one", ("FP4.IDX.FLOOR",),
     dict(fp4_e8m0_quantize=_zero_block_scale_one(impl.fp4_e8m0_quantize, 32))),
    ("fp8_zero_block_scale_one", ("FP8.FLOOR",), dict(fp8_quantize=_zero_block_scale_one(impl.fp8_quantize, None))),
    ("fp4_dequant_negative_zero_lost", ("FP4.DEQUANT",), _both_dequantizers(_dequant_negative_zero_lost)),
    ("fp4_dequant_scales_tiled", ("FP4.DEQUANT",), _both_dequantizers(_fp4_dequant_scales_tiled)),
    ("fp8_qdq_fp8_declared_bf16", ("FP8.V4_INPLACE",), dict(variants={"v4_fp8_inplace": "bf16"})),
]
MUTANTS.update({name: mutant(name, **ops) for name, _, ops in CLAUSE_MUTANTS})
CAUGHT += [(name, rule_id) for name, rules, _ in CLAUSE_MUTANTS for rule_id in rules]


def _fp8_linear(x, w, w_scale, block, *, first_weight_scale_row=False, accumulate_in_bf16=False, output_bf16=True):
    """impl's FP8 linear with one step swappable (the weight scale row, the accumulator, the output rounding)."""
    n = w.shape[0]
    xq, xs = impl.fp8_quantize(x, block)
    a = impl._blocks(impl.e4m3_decode(xq).double(), block)
    wb = impl._blocks(impl.e4m3_decode(w).double(), block)
    sums = torch.einsum("...kb,nkb->...nk", a, wb).float()
    rows = w_scale[:1].expand_as(w_scale) if first_weight_scale_row else w_scale
    s_w = impl.e8m0_decode(rows.contiguous()).repeat_interleave(block, dim=0)[:n]
    terms = sums * (impl.e8m0_decode(xs).unsqueeze(-2) * s_w)
    acc = torch.zeros(terms.shape[:-1])
    for kb in range(terms.shape[-1]):
        acc = acc + terms[..., kb]
        acc = impl.bf16_round(acc) if accumulate_in_bf16 else acc
    return impl.bf16_round(acc) if output_bf16 else acc


MUTANTS.update({
    # the scale of the weight's first row block used for every row block (a [K/b] scale vector)
    "fp8_linear_one_weight_scale_row": mutant("fp8_linear_one_weight_scale_row", fp8_linear=lambda x, w, s, b: _fp8_linear(
        x, w, s, b, first_weight_scale_row=True)),
    "fp8_linear_accumulates_in_bf16": mutant("fp8_linear_accumulates_in_bf16", fp8_linear=lambda x, w, s, b: _fp8_linear(
        x, w, s, b, accumulate_in_bf16=True)),
    "fp8_linear_output_fp32": mutant("fp8_linear_output_fp32", fp8_linear=lambda x, w, s, b: _fp8_linear(
        x, w, s, b, output_bf16=False)),
})

CAUGHT += [
    ("fp8_linear_one_weight_scale_row", "FP8.LINEAR"),
    ("fp8_linear_accumulates_in_bf16", "FP8.LINEAR"),
    ("fp8_linear_output_fp32", "FP8.LINEAR"),
]


def _scale_byte_bias_126(op):
    """The right scale and payload, the E8M0 byte written with bias 126 (126 + ceil_log2(v))."""
    def run(x, *args):
        out, scales = op(x, *args)
        return out, (scales.to(torch.int64) - 1).clamp(min=0).to(torch.uint8)
    return run


MUTANTS.update({
    "idx_scale_byte_bias_126": mutant("idx_scale_byte_bias_126",
                                      fp4_e8m0_quantize=_scale_byte_bias_126(impl.fp4_e8m0_quantize)),
    "fp8_scale_byte_bias_126": mutant("fp8_scale_byte_bias_126", fp8_quantize=_scale_byte_bias_126(impl.fp8_quantize)),
})

CAUGHT += [
    ("idx_scale_byte_bias_126", "FP4.IDX.SCALE"),
    ("fp8_scale_byte_bias_126", "FP8.SCALE"),
]


# ---------------------------------------------------------------------------------------------
# act_quant over the wrong span inside the FP8 linear (issue 35): a power-of-two scale moves no
# E4M3 rounding except where values fall to subnormals, so these show where one activation block
# holds an outlier and the weights over it are small (properties/quant.py draws such cases).
# ---------------------------------------------------------------------------------------------

def _act_values(x: torch.Tensor, span: int) -> torch.Tensor:
    """act_quant of x [..., K] with one scale per `span` values along K (zeros pad the last span),
    dequantized exactly: [..., K] float64."""
    k = x.shape[-1]
    padded = torch.nn.functional.pad(x.float(), (0, -k % span))
    q, s = impl.fp8_quantize(padded, span)
    return impl.fp8_dequantize(q, s, span)[..., :k].double()


def _fp8_linear_of_act_values(xv: torch.Tensor, w, w_scale, block):
    """FP8.LINEAR after act_quant: per K block the exact dot, rounded to fp32, times the weight's
    scale; fp32 adds in K order; BF16."""
    n = w.shape[0]
    sums = torch.einsum("...kb,nkb->...nk", impl._blocks(xv, block), impl._blocks(impl.e4m3_decode(w).double(), block))
    terms = sums.float() * impl.e8m0_decode(w_scale).repeat_interleave(block, dim=0)[:n]
    acc = torch.zeros(terms.shape[:-1])
    for kb in range(terms.shape[-1]):
        acc = acc + terms[..., kb]
    return impl.bf16_round(acc)


def fp8_linear_act_scale_per_row(x, w, w_scale, block):
    """act_quant with one scale per row (its amax over the whole K)."""
    return _fp8_linear_of_act_values(_act_values(x, x.shape[-1]), w, w_scale, block)


def fp8_linear_act_scale_from_global_amax(x, w, w_scale, block):
    """act_quant with one scale for the whole tensor (the amax of every row)."""
    flat = x.reshape(1, -1)
    return _fp8_linear_of_act_values(_act_values(flat, flat.shape[-1]).reshape(x.shape), w, w_scale, block)


def fp8_linear_act_block_of_the_other_model(x, w, w_scale, block):
    """act_quant per 128 in V4.1 (V4's block_size) and per 32 in V4 (V4.1's fp8_block_size); the
    weight's blocks stay right."""
    return _fp8_linear_of_act_values(_act_values(x, 128 if block == 32 else 32), w, w_scale, block)


for _f in (fp8_linear_act_scale_per_row, fp8_linear_act_scale_from_global_amax, fp8_linear_act_block_of_the_other_model):
    MUTANTS[_f.__name__] = mutant(_f.__name__, fp8_linear=_f)
    CAUGHT.append((_f.__name__, "FP8.LINEAR"))
