"""spec/formats.py against independent derivations, exhaustively where the format is small, and the
framework casts (ml_dtypes, torch) judged against it: their exact disagreements are findings.

Independent derivations used here: exact rationals (fractions.Fraction) from the format
definitions, and a float64 nearest-neighbour search over the sorted value grid with exact midpoint
comparisons (float64 holds every fp32 and every midpoint exactly).
"""
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from dsv4spec.properties.casts import MLDTYPES, TORCH
from dsv4spec.properties.quant import e4m3_codes
from dsv4spec.properties.suite import FAIL, NOT_IMPLEMENTED, PASS, run_rule
from dsv4spec.properties.target import Target
from dsv4spec.spec import formats as F

F32 = np.float32

# Findings about framework casts (observed with torch 2.13 and ml_dtypes 0.6; asserted below).
FINDINGS = [
    "ml_dtypes float8_e4m3fn: every finite |x| > 464 and ±Inf casts to NaN (0x7F/0xFF) instead of "
    "saturating to ±448 (0x7E/0xFE); it matches e4m3_overflow=nan, not the official satfinite cast. "
    "Agrees with the spec on every other fp32 tried.",
    "torch float8_e4m3fn: agrees with the spec on every fp32 tried (saturates, ±Inf -> ±448, NaN -> NaN).",
    "ml_dtypes float4_e2m1fn: agrees on every finite fp32 tried (ties to even, saturation, −0); "
    "casts NaN to code 0x8 (−0) and ±Inf to ±6, where the spec rejects non-finite input.",
    "ml_dtypes and torch bfloat16: agree on every non-NaN fp32 tried; NaN payloads differ "
    "(ml_dtypes 0x7FC0, torch 0x7FFF/0xFFFF), which no rule constrains.",
    "ml_dtypes and torch float8_e8m0fnu decode: agree on all 256 bytes.",
    "E8M0 *encoding* casts (not a suite operation, so recorded here): both ml_dtypes and torch round a "
    "positive v half up in the linear domain (2^k for v in [2^k, 1.5·2^k), 2^(k+1) from 1.5·2^k), not "
    "the ceil of the official scale rule (e8m0_rounding=round_half_up); ml_dtypes casts 0 to NaN "
    "(0xFF) and torch to 0x00; torch casts −1.0 to byte 127 (its magnitude), ml_dtypes to NaN.",
]


# ---------------------------------------------------------------------------------------------
# Independent definitions
# ---------------------------------------------------------------------------------------------

def frac(x) -> Fraction:
    return Fraction(float(x))


def e2m1_value(code: int) -> Fraction:
    sign = -1 if code & 8 else 1
    e, m = (code >> 1) & 3, code & 1
    magnitude = Fraction(m, 2) if e == 0 else Fraction(2) ** (e - 1) * (1 + Fraction(m, 2))
    return sign * magnitude


def e4m3_value(byte: int):
    if byte & 0x7F == 0x7F:
        return None
    sign = -1 if byte & 0x80 else 1
    e, m = (byte >> 3) & 0xF, byte & 7
    magnitude = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else Fraction(2) ** (e - 7) * (1 + Fraction(m, 8))
    return sign * magnitude


def nearest_even(x: Fraction, grid: list[tuple[Fraction, int]]) -> int:
    """The code of the grid value nearest to x; on a tie, the one with the even code."""
    best = min(abs(x - v) for v, _ in grid)
    candidates = [c for v, c in grid if abs(x - v) == best]
    return candidates[0] if len(candidates) == 1 else [c for c in candidates if c % 2 == 0][0]


E2M1_GRID = [(e2m1_value(c), c) for c in range(8)]
E4M3_GRID = [(e4m3_value(b), b) for b in range(0x7F)]


def around(values, ulps):
    bits = F.f32_bits(np.abs(np.asarray(values, dtype=F32)))
    out = F.f32_from_bits(np.clip(np.concatenate([bits + d for d in range(-ulps, ulps + 1)]), 0, 0x7F7FFFFF))
    return np.unique(np.concatenate([out, -out]))


def dense_sweep(lows=(0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000)):
    """Every fp32 pattern whose top 16 bits are any of the 65536, with a few low halves each."""
    high = np.arange(1 << 16, dtype=np.int64) << 16
    return F.f32_from_bits(np.concatenate([high + low for low in lows]))


# ---------------------------------------------------------------------------------------------
# E2M1
# ---------------------------------------------------------------------------------------------

def test_e2m1_all_16_codes():
    for code in range(16):
        assert frac(F.e2m1_decode(np.array([code]))[0]) == e2m1_value(code)
    assert np.signbit(F.e2m1_decode(np.array([8]))[0]) and len(set(F.E2M1_VALUES.tolist())) == 15


def test_e2m1_encode_near_every_boundary_against_exact_rationals():
    x = around(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES + (6.5, 7.0, 100.0), 8)
    got = F.e2m1_encode(x)
    for xi, code in zip(x, got):
        want = nearest_even(min(abs(frac(xi)), Fraction(6)), E2M1_GRID) | (8 if np.signbit(xi) else 0)
        assert code == want, (xi, code, want)


def test_e2m1_encode_dense_sweep_against_grid_search():
    x = dense_sweep()
    x = x[np.isfinite(x)]
    magnitude = np.minimum(np.abs(x).astype(np.float64), 6.0)
    grid = np.array([float(v) for v, _ in E2M1_GRID])
    i = np.clip(np.searchsorted(grid, magnitude), 1, 7)            # grid[i-1] < m <= grid[i]
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (hi - magnitude < magnitude - lo) | ((hi - magnitude == magnitude - lo) & (i % 2 == 0))
    want = np.where(pick_hi, i, i - 1) | (np.signbit(x) << 3)
    assert np.array_equal(F.e2m1_encode(x), want.astype(np.uint8))


def test_e2m1_ties_listed_in_the_official_rules():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
    assert F.E2M1_VALUES[F.e2m1_encode(ties)].tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert F.E2M1_VALUES[F.e2m1_encode(ties, ties="toward_zero")].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4]
    assert F.E2M1_VALUES[F.e2m1_encode(ties, ties="away_from_zero")].tolist() == [0.5, 1, 1.5, 2, 3, 4, 6]


def test_e2m1_unclamped_variant_wraps():
    # 7 rounds (tie, even) to 8 = exponent field 4: bits 100.0 -> 3 magnitude bits 000; 12 -> 100.1 -> 001
    x = np.array([6.5, 7.0, 12.0, -16.0], F32)
    assert F.e2m1_encode(x, overflow="none").tolist() == [7, 0, 1, 8 | 2]


def test_e2m1_rejects_nonfinite():
    with pytest.raises(ValueError, match="finite"):
        F.e2m1_encode(np.array([np.nan], F32))


# ---------------------------------------------------------------------------------------------
# E4M3
# ---------------------------------------------------------------------------------------------

def test_e4m3_all_256_bytes():
    values = F.e4m3_decode(np.arange(256, dtype=np.uint8))
    for byte in range(256):
        want = e4m3_value(byte)
        assert np.isnan(values[byte]) if want is None else frac(values[byte]) == want, byte
    assert values[0x7E] == 448 and values[0x01] == 2.0 ** -9 and np.signbit(values[0x80])


def test_e4m3_roundtrip_of_every_finite_byte():
    codes = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
    assert np.array_equal(F.e4m3_encode(F.e4m3_decode(codes)), codes)


def test_e4m3_encode_near_every_boundary_against_exact_rationals():
    grid = np.array([float(v) for v, _ in E4M3_GRID])
    x = around(np.concatenate([grid, (grid[1:] + grid[:-1]) / 2, [464.0, 480.0]]), 3)
    got = F.e4m3_encode(x)
    for xi, code in zip(x, got):
        m = abs(frac(xi))
        want = 0x7E if m > 464 else nearest_even(m, E4M3_GRID)
        assert code == want | (0x80 if np.signbit(xi) else 0), (xi, hex(code), hex(want))


def test_e4m3_encode_dense_sweep_against_grid_search():
    x = dense_sweep()
    finite = x[np.isfinite(x)]
    magnitude = np.abs(finite).astype(np.float64)
    grid = np.array([float(v) for v, _ in E4M3_GRID])
    i = np.clip(np.searchsorted(grid, magnitude), 1, 126)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (hi - magnitude < magnitude - lo) | ((hi - magnitude == magnitude - lo) & (i % 2 == 0))
    want = np.where(magnitude > 464, 0x7E, np.where(pick_hi, i, i - 1)) | (np.signbit(finite) << 7)
    assert np.array_equal(F.e4m3_encode(finite), want.astype(np.uint8))
    special = np.array([np.inf, -np.inf, np.nan], F32)
    assert F.e4m3_encode(special).tolist() == [0x7E, 0xFE, 0x7F]
    assert F.e4m3_encode(special, overflow="nan").tolist() == [0x7F, 0xFF, 0x7F]


def test_the_drawn_weights_e4m3_lookup_is_the_spec_on_every_16_bit_prefix():
    """properties.quant.e4m3_codes (the FP8 weights' encoder) is F.e4m3_encode: every fp32 pattern's
    top 16 bits (both signs, zeros, fp32 subnormals, every E4M3 binade and midpoint, the saturation,
    ±Inf, NaNs) under low halves 0, 1, the half and its neighbours, all ones and random ones."""
    low = np.array([0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], np.uint32)
    low = np.concatenate([low, np.random.default_rng(0).integers(2, 0xFFFE, 8).astype(np.uint32)])
    x = ((np.arange(2 ** 16, dtype=np.uint32) << np.uint32(16))[:, None] | low).ravel().view(F32)
    assert np.array_equal(e4m3_codes(x), F.e4m3_encode(x))
    z = np.clip(np.random.default_rng(1).standard_normal((256, 512)) * 128, -448, 448).astype(F32)
    assert np.array_equal(e4m3_codes(z), F.e4m3_encode(z)) and e4m3_codes(z).shape == z.shape


# ---------------------------------------------------------------------------------------------
# E8M0, BF16, log2
# ---------------------------------------------------------------------------------------------

def test_e8m0_all_256_bytes():
    values = F.e8m0_decode(np.arange(256, dtype=np.uint8))
    assert np.isnan(values[255])
    for byte in range(255):
        assert frac(values[byte]) == Fraction(2) ** (byte - 127), byte


def bf16_by_rationals(x) -> Fraction:
    """Nearest of the two bf16 neighbours of a finite fp32 (ties to the even 16-bit pattern)."""
    bits = int(F.f32_bits(np.array([x], F32))[0])
    down, up = bits & ~0xFFFF, (bits & ~0xFFFF) + 0x10000
    v = frac(x)
    vd = frac(F.f32_from_bits(np.array([down]))[0])
    vu = frac(F.f32_from_bits(np.array([up]))[0]) if (up >> 23) & 0xFF != 0xFF else \
        (vd + Fraction(2) ** (((bits >> 23) & 0xFF) - 127 - 7) * (-1 if bits >> 31 else 1))
    if abs(v - vd) < abs(v - vu) or (abs(v - vd) == abs(v - vu) and not (down >> 16) & 1):
        return vd
    return vu


def test_bf16_every_pattern_is_fixed_and_midpoints_round_to_even():
    high = np.arange(1 << 16, dtype=np.int64) << 16
    x = F.f32_from_bits(high)
    same = F.bf16_round(x)
    assert np.array_equal(F.f32_bits(same)[~np.isnan(x)], F.f32_bits(x)[~np.isnan(x)])
    assert np.isnan(same[np.isnan(x)]).all()
    rng = np.random.default_rng(0)
    for low in (0x7FFF, 0x8000, 0x8001, 0xFFFF):
        sample = F.f32_from_bits(rng.choice(high, 400) + low)
        sample = sample[np.isfinite(sample) & (np.abs(sample) < 3.3e38)]
        for xi, got in zip(sample, F.bf16_round(sample)):
            assert frac(got) == bf16_by_rationals(xi), (xi, got)


def test_ceil_and_floor_log2_every_exponent_against_integers():
    exponent = np.arange(0, 255, dtype=np.int64)
    for mantissa in (0, 1, 0x400000, 0x7FFFFF, 0x123456):
        bits = (exponent << 23) | mantissa
        x = F.f32_from_bits(bits)
        keep = x > 0
        for xi, c, f in zip(x[keep], F.ceil_log2(x[keep]).tolist(), F.floor_log2(x[keep]).tolist()):
            v = frac(xi)
            assert Fraction(2) ** (c - 1) < v <= Fraction(2) ** c, (xi, c)
            assert Fraction(2) ** f <= v < Fraction(2) ** (f + 1), (xi, f)


def test_pow2_every_exponent():
    for e in range(-149, 128):
        assert frac(F.pow2(np.array([e]))[0]) == Fraction(2) ** e


# ---------------------------------------------------------------------------------------------
# Framework casts: exact disagreements (FINDINGS)
# ---------------------------------------------------------------------------------------------

def _disagreements(provider, op, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = getattr(provider, op)(torch.from_numpy(x.copy())).numpy()
    return got


def test_ml_dtypes_e4m3_disagrees_exactly_above_464():
    x = dense_sweep()
    got = _disagreements(MLDTYPES, "e4m3_encode", x).astype(np.int64)
    want = F.e4m3_encode(x).astype(np.int64)
    both_nan = (got & 0x7F == 0x7F) & (want & 0x7F == 0x7F)
    differs = (got != want) & ~both_nan
    assert np.array_equal(differs, ~np.isnan(x) & (np.abs(x) > 464))
    assert np.all(got[differs] & 0x7F == 0x7F)                     # NaN where the spec saturates
    assert np.array_equal(got[differs], F.e4m3_encode(x[differs], overflow="nan"))


# torch's float8_e4m3fn cast saturates in some releases (2.13) and gives NaN beyond 448's rounding range
# in others (2.11): FMT.E4M3.SATFINITE judges the installed one
TORCH_SATURATES = int(torch.tensor([1e4]).to(torch.float8_e4m3fn).view(torch.uint8)) == 0x7E


def test_torch_e4m3_agrees_everywhere():
    x = dense_sweep()
    got = _disagreements(TORCH, "e4m3_encode", x).astype(np.int64)
    want = F.e4m3_encode(x).astype(np.int64)
    nan_got, nan_want = got & 0x7F == 0x7F, want & 0x7F == 0x7F
    same = (got == want) | (nan_got & nan_want)
    if not TORCH_SATURATES:
        same |= nan_got & ~(np.abs(x) <= 464)            # above 464, halfway from 448 to 480 (ties go to 448)
    assert np.all(same)


def test_ml_dtypes_e2m1_agrees_on_finite_and_maps_nonfinite():
    x = dense_sweep()
    finite = x[np.isfinite(x)]
    assert np.array_equal(_disagreements(MLDTYPES, "e2m1_encode", finite), F.e2m1_encode(finite))
    special = np.array([np.nan, np.inf, -np.inf], F32)
    assert _disagreements(MLDTYPES, "e2m1_encode", special).tolist() == [0x8, 0x7, 0xF]


@pytest.mark.parametrize("provider", [MLDTYPES, TORCH], ids=["ml_dtypes", "torch"])
def test_bf16_casts_agree_except_nan_payloads(provider):
    x = dense_sweep()
    got = _disagreements(provider, "bf16_round", x)
    want = F.bf16_round(x)
    nan = np.isnan(want)
    assert np.array_equal(F.f32_bits(got[~nan]), F.f32_bits(want[~nan]))
    assert np.isnan(got[nan]).all()


@pytest.mark.parametrize("provider", [MLDTYPES, TORCH], ids=["ml_dtypes", "torch"])
def test_e8m0_decode_casts_agree(provider):
    codes = np.arange(256, dtype=np.uint8)
    got = provider.e8m0_decode(torch.from_numpy(codes)).numpy()
    assert np.array_equal(got, F.e8m0_decode(codes), equal_nan=True)


def test_e8m0_encoding_casts_round_half_up_not_ceil():
    from dsv4spec.spec.quant import pow2_scale_exponent
    v = np.unique(np.abs(around(2.0 ** np.arange(-120, 120, 7) * np.array([[1.0], [1.25], [1.5], [1.75]]), 1)))
    v = v[v > 0]
    half_up = pow2_scale_exponent(v, 1.0, 0, e8m0_rounding="round_half_up") + 127
    ceil = pow2_scale_exponent(v, 1.0, 0) + 127
    ml = v.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    th = torch.from_numpy(v).to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    assert np.array_equal(ml, half_up) and np.array_equal(th, half_up)
    assert np.any(ml != ceil)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zero_neg = np.array([0.0, -1.0], F32)
        assert zero_neg.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).tolist() == [0xFF, 0xFF]
        assert torch.from_numpy(zero_neg).to(torch.float8_e8m0fnu).view(torch.uint8).tolist() == [0x00, 127]


# The rows `dsv4spec verify --target ml_dtypes/torch --rules FMT` report.
CAST_ROWS = {
    "ml_dtypes": {"FMT.E2M1.VALUES": PASS, "FMT.E2M1.RNE": PASS, "FMT.E2M1.SATURATE": PASS,
                  "FMT.E2M1.ZERO_SIGN": PASS, "FMT.E4M3.VALUES": PASS, "FMT.E4M3.RNE": PASS,
                  "FMT.E4M3.SATFINITE": FAIL, "FMT.E8M0.VALUES": PASS, "FMT.BF16.RNE": PASS,
                  "FMT.CEIL_LOG2": NOT_IMPLEMENTED},
    "torch": {"FMT.E2M1.VALUES": NOT_IMPLEMENTED, "FMT.E2M1.RNE": NOT_IMPLEMENTED,
              "FMT.E2M1.SATURATE": NOT_IMPLEMENTED, "FMT.E2M1.ZERO_SIGN": NOT_IMPLEMENTED,
              "FMT.E4M3.VALUES": PASS, "FMT.E4M3.RNE": PASS, "FMT.E4M3.SATFINITE": PASS if TORCH_SATURATES else FAIL,
              "FMT.E8M0.VALUES": PASS, "FMT.BF16.RNE": PASS, "FMT.CEIL_LOG2": NOT_IMPLEMENTED},
}


CASTS = {"ml_dtypes": MLDTYPES, "torch": TORCH}


@pytest.mark.parametrize("name, rule_id", [(n, r) for n in CAST_ROWS for r in CAST_ROWS[n]])
def test_cast_target_rows(name, rule_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = run_rule(rule_id, Target(CASTS[name], name))
    assert row.status == CAST_ROWS[name][rule_id], row.detail
    if rule_id == "FMT.E4M3.SATFINITE" and row.status == FAIL:
        assert "matches e4m3_overflow=nan (undeclared)" in row.detail
