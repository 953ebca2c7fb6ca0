"""The quant-family Triton kernels against the spec and impl, bit for bit (interpreter on CPU,
the real thing on a GPU), plus their input validation and determinism, and a compile of every
kernel for sm_90 (no GPU needed).  No timing here."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import quant as K
from dsv4spec.spec import formats as F
from dsv4spec.spec import quant as S

# values near the top of fp32 overflow harmlessly inside the interpreter's numpy arithmetic
# (and a signalling NaN input makes numpy report an invalid operation)
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

TIES = [6, .75, 1.75, 3.5, .25, 1.25, 2.5, 5, -.75, -1.75, -3.5, -.25, -1.25, -2.5, -5, -0.0]


def edge_input(n_blocks16: int, seed: int) -> np.ndarray:
    """[n_blocks16 * 16] fp32: edge vectors on the codecs' decision boundaries, then mixed magnitudes."""
    rng = np.random.default_rng(seed)
    n = 16 * n_blocks16
    x = (10.0 ** rng.uniform(-6, 3.5, n) * rng.choice([-1, 1], n)).astype(np.float32)
    rows = [
        TIES, [t * 2.0 ** -5 for t in TIES], [t * 2.0 ** 7 for t in TIES],   # ties at scale 2^k
        [0.0] * 16, [-0.0] * 16,                                             # zero blocks, ±0
        [0.17578125, 0.03662109375],                     # division vs reciprocal (block 16)
        [0.08203125, 0.02392577938735485],               # same, subnormal E4M3 scale 7·2^-9
        [0.05, 0.01],                                    # scale 2^-7, 0.01 -> 0.01171875
        [2785, -2785, 2700, 100, 5, 0.01],               # E4M3 scale saturates at 448
        [96.00000762939453, 10],                         # floating-log2 edge (E8M0/32)
        list(rng.standard_normal(16) * 1e-40),           # fp32 subnormals
        [3.0e38, -3.0e38, 1.0, -1e-30],                  # near the top of fp32
        [-1e-7, 1e-7, -0.1, 0.1],                        # negatives rounding to -0
    ]
    for i, row in enumerate(rows):
        x[16 * i:16 * (i + 1)] = 0.0
        x[16 * i:16 * i + len(row)] = row
    # amax at 6·2^k, 6·2^k ± 1 ulp, 7·2^k, 8·2^k − 1 ulp, 448·2^k ± 1 ulp, across the fp32 range
    start = len(rows)
    ks = np.linspace(-125, 120, n_blocks16 // 4).astype(int)
    for j, k in enumerate(ks):
        b = start + 2 * j
        if b + 2 > n_blocks16:
            break
        base = np.float32(6.0 * 2.0 ** k) if j % 5 < 3 else np.float32(448.0 * 2.0 ** min(k, 110))
        v = [base, np.nextafter(base, np.float32(0)), np.nextafter(base, np.float32(np.inf)),
             np.float32(7.0 * 2.0 ** k), np.nextafter(np.float32(8.0 * 2.0 ** k), np.float32(0))][j % 5]
        blk = (v * rng.uniform(-1, 1, 32)).astype(np.float32)
        blk[j % 32] = v
        x[16 * b:16 * b + 32] = blk
    return x


X = edge_input(256, seed=1)                       # 4096 values: 256 blocks of 16, 128 of 32
DTYPES = [torch.float32, torch.bfloat16]


def as_input(dtype, shape=(8, 512)):
    return torch.from_numpy(X.copy()).reshape(shape).to(dtype).contiguous()


def assert_same_bits(got: torch.Tensor, want, what: str):
    got = got.numpy()
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype == np.float32:
        got, want = got.view(np.uint32), want.astype(np.float32).view(np.uint32)
    bad = np.nonzero(got.reshape(-1) != want.reshape(-1))[0]
    assert bad.size == 0, f"{what}: {bad.size} mismatches, first at {bad[0]}: {got.reshape(-1)[bad[0]]:#x} != {want.reshape(-1)[bad[0]]:#x}"


# ------------------------------------------------------------------------------------------------
# Codecs against the spec and impl
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("name", ["fp4_e4m3", "fp4_e8m0"])
def test_fp4_codec_matches_spec_and_impl(name, dtype):
    x = as_input(dtype)
    packed, scales = getattr(K, name + "_quantize")(x)
    want_packed, want_scales = getattr(S, name + "_quantize")(x.float().numpy())
    assert_same_bits(scales, want_scales, f"{name} scales vs spec")
    assert_same_bits(packed, want_packed, f"{name} packed vs spec")
    impl_packed, impl_scales = getattr(impl, name + "_quantize")(x)
    assert torch.equal(packed, impl_packed) and torch.equal(scales, impl_scales)
    y = getattr(K, name + "_dequantize")(packed, scales)
    assert y.dtype == torch.float32
    assert_same_bits(y, getattr(S, name + "_dequantize")(want_packed, want_scales), f"{name} dequantize")


def bf16_neighbours(v: np.ndarray) -> np.ndarray:
    """v (exact BF16 values, > 0) with the BF16 numbers just below and just above each."""
    bits = v.astype(np.float32).view(np.uint32) >> 16
    near = np.stack([bits - 1, bits, bits + 1], -1).reshape(-1).astype(np.uint32) << 16
    return near.view(np.float32)


def boundary_blocks(block: int, e4m3: bool) -> np.ndarray:
    """Blocks whose maximum fixes the scale s (every positive E4M3 scale; E8M0 scales 2^-130 ..
    2^125) and whose other values are the E2M1 decision boundaries t*s and their BF16 neighbours,
    signs alternating: the pair kernel's carry comparisons at every boundary, from both sides."""
    t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    if e4m3:
        scales = F.e4m3_decode(np.arange(1, 0x7F, dtype=np.uint8)).astype(np.float64)
        top = 6.0     # amax = 6s: E4M3_RNE(6s / 6) = s
    else:
        scales = 2.0 ** np.arange(-130, 126)
        top = 5.0     # amax = 5 * 2^e: ceil(log2(5 * 2^e * fl32(1/6))) = e
    rows = []
    for s in scales:
        vals = bf16_neighbours((t * s).astype(np.float32))
        vals = vals[(vals > 0) & (vals <= top * s)]
        for i in range(0, len(vals), block - 1):
            row = np.zeros(block, np.float32)
            chunk = vals[i:i + block - 1]
            row[1:1 + len(chunk)] = chunk * np.where(np.arange(len(chunk)) % 2, -1, 1)
            row[0] = top * s
            rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("name", ["fp4_e4m3", "fp4_e8m0"])
def test_fp4_quantize_bf16_boundaries_and_every_pattern(name):
    block = 16 if name == "fp4_e4m3" else 32
    edges = boundary_blocks(block, name == "fp4_e4m3").reshape(-1)
    finite = np.arange(1 << 16, dtype=np.uint32)
    finite = (finite << 16).view(np.float32)
    finite = finite[np.isfinite(finite)]
    pad = (-len(finite)) % block
    x = np.concatenate([edges, finite, np.zeros(pad, np.float32)]).reshape(-1, block)
    xt = torch.from_numpy(x).to(torch.bfloat16)   # exact: every value is a BF16 number
    assert np.array_equal(xt.float().numpy(), x)
    packed, scales = getattr(K, name + "_quantize")(xt)
    want_packed, want_scales = getattr(S, name + "_quantize")(x)
    assert_same_bits(scales, want_scales, f"{name} scales (bf16 pairs) vs spec")
    assert_same_bits(packed, want_packed, f"{name} packed (bf16 pairs) vs spec")


def e4m3_tie_blocks(block: int, ks) -> np.ndarray:
    """Blocks whose maximum 448·2^k·(1 - 2^-10) fixes the scale 2^k, the others every E4M3 value,
    every midpoint between neighbours and the fp32 numbers beside each midpoint, times 2^k, signs
    alternating: the E4M3 rounding of act_quant at every tie, from both sides (on the GPU, the
    conversion instruction's)."""
    v = F.e4m3_decode(np.arange(0, 0x7F, dtype=np.uint8)).astype(np.float32)
    mid = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    ratios = np.concatenate([v, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))])
    rows = []
    for k in ks:
        vals = (ratios.astype(np.float64) * 2.0 ** k).astype(np.float32)
        for i in range(0, len(vals), block - 1):
            row = np.zeros(block, np.float32)
            chunk = vals[i:i + block - 1]
            row[1:1 + len(chunk)] = chunk * np.where(np.arange(len(chunk)) % 2, -1, 1)
            row[0] = 448.0 * 2.0 ** k * (1 - 2.0 ** -10)
            rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("block", [32, 64, 128])
def test_fp8_quantize_every_e4m3_tie_and_every_bf16_pattern(block):
    ks = (-22, -9, -3, 0, 5, 118)
    ties = e4m3_tie_blocks(block, ks)
    q, scales = K.fp8_quantize(torch.from_numpy(ties), block)
    want_q, want_scales = S.fp8_quantize(ties, block)
    assert set(want_scales.reshape(-1).tolist()) == {127 + k for k in ks}   # the ties sit where designed
    assert_same_bits(scales, want_scales, f"fp8/{block} scales at the E4M3 ties")
    assert_same_bits(q, want_q, f"fp8/{block} codes at the E4M3 ties (fp32 in)")
    finite = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    finite = finite[np.isfinite(finite)]
    x = np.concatenate([finite, np.zeros((-len(finite)) % block, np.float32)]).reshape(-1, block)
    q, scales = K.fp8_quantize(torch.from_numpy(x).to(torch.bfloat16), block)
    want_q, want_scales = S.fp8_quantize(x, block)
    assert_same_bits(scales, want_scales, f"fp8/{block} scales of every BF16 pattern")
    assert_same_bits(q, want_q, f"fp8/{block} codes of every BF16 pattern (bf16 in)")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("block", [32, 64, 128, 48])
def test_fp8_codec_matches_spec_and_impl(block, dtype):
    x = as_input(dtype)[:, : (512 // block) * block].contiguous()
    q, scales = K.fp8_quantize(x, block)
    want_q, want_scales = S.fp8_quantize(x.float().numpy(), block)
    assert_same_bits(scales, want_scales, f"fp8/{block} scales vs spec")
    assert_same_bits(q, want_q, f"fp8/{block} values vs spec")
    impl_q, impl_scales = impl.fp8_quantize(x, block)
    assert torch.equal(q, impl_q) and torch.equal(scales, impl_scales)
    assert_same_bits(K.fp8_dequantize(q, scales, block), S.fp8_dequantize(want_q, want_scales, block),
                     f"fp8/{block} dequantize")


def test_hand_derived_vectors():
    # [0.17578125, 0.03662109375, 0...] block 16: amax/6 = 0.029296875 = 1.875·2^-6, an E4M3
    # normal (exponent field 1, mantissa 7: byte 0x0F); 0.03662109375 / s = 1.25 exactly, a tie
    # that goes to the even code 2 (1.0).  A reciprocal multiply lands above 1.25 and gives 1.5.
    x = torch.zeros(16)
    x[0], x[1] = 0.17578125, 0.03662109375
    packed, scales = K.fp4_e4m3_quantize(x)
    assert scales.tolist() == [0x0F]
    assert packed[0].item() == 0x27          # element 0: 6.0 (code 7), element 1: 1.0 (code 2)
    # [96.00000762939453, 10, 0...] block 32: v = fl32(96.0000076·fl32(1/6)) > 16, so the scale is
    # 2^5 = 32 (byte 132); 10/32 = 0.3125 > 0.25 rounds to 0.5 (code 1), 96.0000076/32 = 3.0 (code 5)
    x = torch.zeros(32)
    x[0], x[1] = 96.00000762939453, 10.0
    packed, scales = K.fp4_e8m0_quantize(x)
    assert scales.tolist() == [132]
    assert packed[0].item() == 0x15
    assert K.fp4_e8m0_dequantize(packed, scales)[1].item() == 16.0
    # amax 2785: 2785/6 = 464.17 > 464 saturates to 448 (byte 0x7E); 2785/448 = 6.2 clips to 6
    x = torch.zeros(16)
    x[0], x[1] = 2785.0, -2785.0
    packed, scales = K.fp4_e4m3_quantize(x)
    assert scales.tolist() == [0x7E] and packed[0].item() == 0xF7
    # all-zero blocks: E4M3 scale 2^-9 (byte 0x01), E8M0 2^-126 (byte 1), FP8 2^-22 (byte 105)
    assert K.fp4_e4m3_quantize(torch.zeros(16))[1].tolist() == [1]
    assert K.fp4_e8m0_quantize(torch.zeros(32))[1].tolist() == [1]
    assert K.fp8_quantize(torch.zeros(64), 64)[1].tolist() == [105]


@pytest.mark.parametrize("name,block", [("fp4_e4m3", 16), ("fp4_e8m0", 32)])
def test_fp4_dequantize_every_scale_and_code(name, block):
    # every scale byte (NaN 0x7F/0xFF E4M3, 0xFF E8M0, 2^-127 E8M0 included) with every packed byte
    packed = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(-1, block // 2)
    scales = (np.arange(packed.shape[0]) // (256 // (block // 2)) % 256).astype(np.uint8)[:, None]
    packed = np.ascontiguousarray(packed.reshape(-1, block // 2))
    got = getattr(K, name + "_dequantize")(torch.from_numpy(packed), torch.from_numpy(scales))
    want = getattr(S, name + "_dequantize")(packed, scales).astype(np.float32)
    g, w = got.numpy(), want
    same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
    assert same.all(), f"{name}: {(~same).sum()} mismatches"


def test_fp8_dequantize_every_scale_and_code():
    q = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
    scales = np.arange(256, dtype=np.uint8).repeat(4).reshape(256, 4)
    got = K.fp8_dequantize(torch.from_numpy(q), torch.from_numpy(scales), 64).numpy()
    want = S.fp8_dequantize(q, scales, 64).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} mismatches"


def test_pack_unpack_every_byte():
    every = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    codes = K.fp4_unpack(every)
    assert torch.equal(codes, torch.from_numpy(S.fp4_unpack(every.numpy())))
    assert torch.equal(K.fp4_pack(codes), every)
    assert torch.equal(K.fp4_pack(codes), impl.fp4_pack(codes))


def test_leading_shapes_and_views():
    x = as_input(torch.float32, (2, 4, 512))
    packed, scales = K.fp4_e4m3_quantize(x)
    assert packed.shape == (2, 4, 256) and scales.shape == (2, 4, 32)
    flat_packed, flat_scales = K.fp4_e4m3_quantize(x.reshape(-1))
    assert torch.equal(packed.reshape(-1), flat_packed) and torch.equal(scales.reshape(-1), flat_scales)
    # torch's FP8 storage dtypes are accepted as views of the bytes
    q, s = K.fp8_quantize(x, 64)
    y = K.fp8_dequantize(q.view(torch.float8_e4m3fn), s.view(torch.float8_e8m0fnu), 64)
    assert torch.equal(y, K.fp8_dequantize(q, s, 64))
    empty = torch.empty(0, 32)
    assert K.fp4_e8m0_quantize(empty)[0].shape == (0, 16)


def test_repeated_calls_are_bitwise_identical():
    x = as_input(torch.bfloat16)
    first = K.fp4_e4m3_quantize(x) + K.fp4_e8m0_quantize(x) + K.fp8_quantize(x, 64)
    for _ in range(3):
        again = K.fp4_e4m3_quantize(x) + K.fp4_e8m0_quantize(x) + K.fp8_quantize(x, 64)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# ------------------------------------------------------------------------------------------------
# Element formats: every code, every BF16 pattern, dense sweeps around every decision boundary
# ------------------------------------------------------------------------------------------------

def f32_patterns(lows=(0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)) -> np.ndarray:
    """Every BF16 pattern as the upper half of an fp32, with each low half: every binade, both
    signs, ±0, fp32 subnormals, ±Inf, NaNs (quiet and signalling), and the BF16 ties (0x8000)."""
    high = np.arange(1 << 16, dtype=np.int64) << 16
    return F.f32_from_bits(np.concatenate([high + low for low in lows]))


def sweep(points, ulps: int) -> np.ndarray:
    """Every fp32 within `ulps` of each point (points >= 0), both signs."""
    bits = F.f32_bits(np.asarray(points, dtype=np.float32))
    around = (bits[:, None] + np.arange(-ulps, ulps + 1)[None, :]).reshape(-1)
    x = F.f32_from_bits(np.unique(np.clip(around, 0, 0x7F800000)))
    return np.concatenate([x, -x])


E4M3_GRID = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8)))      # 0 .. 448
E4M3_MIDPOINTS = (E4M3_GRID[1:] + E4M3_GRID[:-1]) / 2                   # exact: one more bit
E4M3_SWEEP = sweep(np.concatenate([E4M3_GRID, E4M3_MIDPOINTS, [464.0, 480.0, 2.0 ** -10]]), 256)
E2M1_SWEEP = sweep(F.E2M1_BOUNDARIES + F.E2M1_MAGNITUDES + (6.5, 7.0, 8.0, 12.0), 2048)


def k_tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("name,codes", [("e2m1_decode", np.arange(16, dtype=np.uint8)),
                                        ("e4m3_decode", np.arange(256, dtype=np.uint8)),
                                        ("e8m0_decode", np.arange(256, dtype=np.uint8))])
def test_decoders_every_code(name, codes):
    # 2-D, so the leading shape goes through too
    codes = np.ascontiguousarray(codes.reshape(-1, 8))
    got = getattr(K, name)(k_tensor(codes))
    assert got.dtype == torch.float32 and got.shape == codes.shape
    assert_same_bits(got, getattr(F, name)(codes), f"{name} vs spec")      # NaN is 0x7FC00000 in both
    assert_same_bits(got, getattr(impl, name)(k_tensor(codes)).numpy(), f"{name} vs impl")
    # torch's FP8 storage dtypes are views of the same bytes
    if name != "e2m1_decode":
        view = torch.float8_e4m3fn if name == "e4m3_decode" else torch.float8_e8m0fnu
        assert torch.equal(getattr(K, name)(k_tensor(codes).view(view)).view(torch.int32),
                           got.view(torch.int32))


def test_bf16_round_every_pattern():
    x = f32_patterns()
    got = K.bf16_round(k_tensor(x))
    assert_same_bits(got, F.bf16_round(x), "bf16_round vs spec")
    assert_same_bits(got, impl.bf16_round(k_tensor(x)).numpy(), "bf16_round vs impl")


def test_bf16_input_is_widened_exactly():
    # every BF16 value is its own nearest BF16, and encodes like its fp32 widening
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    wide = (x.view(torch.int16).to(torch.int32) << 16).view(torch.float32).numpy()
    assert_same_bits(K.bf16_round(x), F.bf16_round(wide), "bf16_round(bf16) vs spec")
    assert_same_bits(K.e4m3_encode(x), F.e4m3_encode(wide), "e4m3_encode(bf16) vs spec")
    finite = torch.isfinite(x)
    assert_same_bits(K.e2m1_encode(x[finite].contiguous()), F.e2m1_encode(wide[finite.numpy()]),
                     "e2m1_encode(bf16) vs spec")


@pytest.mark.parametrize("what", ["patterns", "sweep"])
def test_e4m3_encode(what):
    x = f32_patterns() if what == "patterns" else E4M3_SWEEP
    got = K.e4m3_encode(k_tensor(x))
    assert got.dtype == torch.uint8
    # NaN -> 0x7F with the NaN's sign bit, exactly as the spec (and impl) define it
    assert_same_bits(got, F.e4m3_encode(x), f"e4m3_encode vs spec ({what})")
    assert_same_bits(got, impl.e4m3_encode(k_tensor(x)).numpy(), f"e4m3_encode vs impl ({what})")


@pytest.mark.parametrize("what", ["patterns", "sweep"])
def test_e2m1_encode(what):
    x = f32_patterns() if what == "patterns" else E2M1_SWEEP
    x = np.ascontiguousarray(x[np.isfinite(x)])
    got = K.e2m1_encode(k_tensor(x))
    assert got.dtype == torch.uint8
    assert_same_bits(got, F.e2m1_encode(x), f"e2m1_encode vs spec ({what})")
    assert_same_bits(got, impl.e2m1_encode(k_tensor(x)).numpy(), f"e2m1_encode vs impl ({what})")


def test_element_formats_hand_derived():
    def e4m3(*v):
        return K.e4m3_encode(torch.tensor(v, dtype=torch.float32)).tolist()
    # 464 is the midpoint of 448 (mantissa 110, even) and 480 (would be 0x7F = NaN): -> 448 = 0x7E;
    # 2^-10 ties 0 and 2^-9 -> 0; 3·2^-10 ties codes 1 and 2 -> 2; -0 keeps its sign; ±Inf saturate
    assert e4m3(464.0, -464.0, 2.0 ** -10, 3 * 2.0 ** -10, -0.0, float("inf"), float("-inf")) == \
        [0x7E, 0xFE, 0x00, 0x02, 0x80, 0x7E, 0xFE]
    nan_bits = torch.tensor([0x7FC00000, -0x00400000], dtype=torch.int32)   # +NaN, -NaN (0xFFC00000)
    assert K.e4m3_encode(nan_bits.view(torch.float32)).tolist() == [0x7F, 0xFF]
    # E2M1: 5 ties 4 (code 6, even) and 6 (code 7) -> 6; 0.75 ties .5 and 1 -> code 2; −0.1 -> −0
    x = torch.tensor([5.0, 0.75, -0.1, 7.0, -1e30, -0.0])
    assert K.e2m1_encode(x).tolist() == [6, 2, 8, 7, 15, 8]
    # BF16 spacing at 1 is 2^-7: 1 + 2^-8 ties 1 (even) -> 1; 1 + 3·2^-8 ties mantissas 1 and 2 ->
    # 1 + 2^-6; the largest fp32 rounds up into the exponent: +Inf
    x = torch.tensor([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 3.4028234663852886e38, -0.0])
    y = K.bf16_round(x)
    assert y.tolist()[:3] == [1.0, 1 + 2.0 ** -6, float("inf")] and torch.signbit(y[3])
    # E8M0: byte 0 is 2^-127 (fp32 subnormal 0x00400000), 254 is 2^127, 255 NaN
    y = K.e8m0_decode(torch.tensor([0, 127, 254, 255], dtype=torch.uint8))
    assert y.view(torch.int32).tolist() == [0x00400000, 0x3F800000, 0x7F000000, 0x7FC00000]


def test_element_formats_empty_and_odd_shapes():
    for op, dtype in [("e2m1_encode", torch.float32), ("e4m3_encode", torch.float32),
                      ("bf16_round", torch.float32), ("e2m1_decode", torch.uint8),
                      ("e4m3_decode", torch.uint8), ("e8m0_decode", torch.uint8)]:
        for shape in [(0,), (3, 0), (3, 5, 7)]:
            out = getattr(K, op)(torch.ones(shape, dtype=dtype))
            assert out.shape == shape and out.dtype == K.FORMAT_OUTPUTS[op], (op, shape)


# ------------------------------------------------------------------------------------------------
# fp8_qdq: the in-place act_quant result
# ------------------------------------------------------------------------------------------------

def qdq_tie_blocks(block: int) -> np.ndarray:
    """Blocks whose amax is 448·2^k (so s = 2^k exactly) holding E4M3 midpoints·2^k, both signs,
    and their fp32 neighbours: every value is a tie or one ulp off one."""
    rows = []
    for k in range(-20, 21, 5):
        ratio = np.resize(sweep(E4M3_MIDPOINTS, 1), block - 1)
        rows.append(np.concatenate([[448.0], ratio]) * 2.0 ** k)
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("block", [32, 64, 128, 48])
def test_fp8_qdq_matches_spec_and_impl(block, dtype):
    x = as_input(dtype)[:, : (512 // block) * block].contiguous()
    got = K.fp8_qdq(x, block)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert_same_bits(got, S.fp8_qdq(x.float().numpy(), block), f"fp8_qdq/{block} vs spec")
    assert_same_bits(got, impl.fp8_qdq(x, block).numpy(), f"fp8_qdq/{block} vs impl")
    # it is the dequantized fp8_quantize, bit for bit
    q, scales = K.fp8_quantize(x, block)
    assert torch.equal(got.view(torch.int32), K.fp8_dequantize(q, scales, block).view(torch.int32))
    ties = qdq_tie_blocks(block)
    assert_same_bits(K.fp8_qdq(k_tensor(ties), block), S.fp8_qdq(ties, block),
                     f"fp8_qdq/{block} on E4M3 ties")


def test_fp8_qdq_hand_derived():
    # amax 448: fl32(448·fl32(1/448)) = 1.0 (the constant is 2.9e-8 relatively high, under half an
    # ulp), so s = 1; 100 ties 96 (mantissa 100, even) and 104 in the spacing-8 binade -> 96
    x = torch.zeros(32)
    x[0], x[1], x[2] = 448.0, 100.0, -0.0
    y = K.fp8_qdq(x, 32)
    assert y[:2].tolist() == [448.0, 96.0] and torch.signbit(y[2])
    # amax 1: s = 2^ceil(log2(0.00223)) = 2^-8; 0.3·256 = 76.8 -> 80 (spacing 8) -> 80/256 = 0.3125
    x = torch.zeros(32)
    x[0], x[1] = 1.0, 0.3
    assert K.fp8_qdq(x, 32)[:2].tolist() == [1.0, 0.3125]


def test_element_formats_and_qdq_are_deterministic():
    x = k_tensor(E4M3_SWEEP[:8192])
    first = [K.e4m3_encode(x), K.bf16_round(x), K.fp8_qdq(x.reshape(-1, 64), 64)]
    again = [K.e4m3_encode(x), K.bf16_round(x), K.fp8_qdq(x.reshape(-1, 64), 64)]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(first, again))


# ------------------------------------------------------------------------------------------------
# Input validation
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,match", [
    (lambda: K.fp4_e4m3_quantize(torch.zeros(20)), ValueError, r"last dimension 20 .* block \(16\)"),
    (lambda: K.fp4_e8m0_quantize(torch.zeros(48)), ValueError, r"last dimension 48 .* block \(32\)"),
    (lambda: K.fp8_quantize(torch.zeros(96), 64), ValueError, r"last dimension 96 .* block \(64\)"),
    (lambda: K.fp8_quantize(torch.zeros(64), 0), ValueError, "block must be a positive int"),
    (lambda: K.fp4_e4m3_quantize(torch.zeros(16, dtype=torch.float16)), TypeError, "float32 or bfloat16"),
    (lambda: K.fp4_e4m3_quantize(np.zeros(16, np.float32)), TypeError, "torch.Tensor"),
    (lambda: K.fp4_e4m3_quantize(torch.zeros(32, 16).t()), ValueError, "contiguous"),
    (lambda: K.fp4_e4m3_quantize(torch.tensor([1.0] * 15 + [float("nan")])), ValueError, "non-finite"),
    (lambda: K.fp8_quantize(torch.tensor([float("inf")] + [0.0] * 31), 32), ValueError, "non-finite"),
    (lambda: K.fp4_pack(torch.full((4,), 16, dtype=torch.uint8)), ValueError, "0..15"),
    (lambda: K.fp4_pack(torch.zeros(3, dtype=torch.uint8)), ValueError, "not even"),
    (lambda: K.fp4_unpack(torch.zeros(4, dtype=torch.int32)), TypeError, "uint8"),
    (lambda: K.fp4_e4m3_dequantize(torch.zeros(8, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8)),
     ValueError, "expected 1 scales"),
    (lambda: K.fp8_dequantize(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.uint8), 64),
     ValueError, "leading shape"),
])
def test_bad_input_is_rejected_with_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


BAD_ELEMENT_INPUT = [
    ("e2m1_encode", lambda: (np.zeros(4, np.float32),)),
    ("e2m1_encode", lambda: (torch.zeros(4, dtype=torch.float16),)),
    ("e2m1_encode", lambda: (torch.zeros(4, 4).t(),)),
    ("e2m1_encode", lambda: (torch.tensor(1.0),)),
    ("e2m1_encode", lambda: (torch.tensor([0.0, float("nan")]),)),
    ("e2m1_encode", lambda: (torch.tensor([[0.0, 1.0], [float("-inf"), 2.0]]),)),
    ("e4m3_encode", lambda: (torch.zeros(4, dtype=torch.float64),)),
    ("e4m3_encode", lambda: (torch.zeros(4, 4).t(),)),
    ("bf16_round", lambda: (torch.tensor(1.0),)),
    ("bf16_round", lambda: (torch.zeros(4, dtype=torch.int32),)),
    ("e2m1_decode", lambda: (torch.tensor([3, 16], dtype=torch.uint8),)),
    ("e2m1_decode", lambda: (torch.zeros(4, dtype=torch.int32),)),
    ("e4m3_decode", lambda: (torch.zeros(4, 4, dtype=torch.uint8).t(),)),
    ("e4m3_decode", lambda: (torch.tensor(1, dtype=torch.uint8),)),
    ("e8m0_decode", lambda: ([1, 2],)),
    ("e8m0_decode", lambda: (torch.zeros(4, dtype=torch.int8),)),
    ("fp8_qdq", lambda: (torch.zeros(96), 64)),
    ("fp8_qdq", lambda: (torch.zeros(64), 0)),
    ("fp8_qdq", lambda: (torch.zeros(64), True)),
    ("fp8_qdq", lambda: (torch.tensor([1.0] * 31 + [float("inf")]), 32)),
    ("fp8_qdq", lambda: (torch.zeros(64, dtype=torch.float16), 32)),
    ("fp8_qdq", lambda: (torch.zeros(64, 64).t(), 32)),
]


@pytest.mark.parametrize("op,args", BAD_ELEMENT_INPUT,
                         ids=[f"{op}-{i}" for i, (op, _) in enumerate(BAD_ELEMENT_INPUT)])
def test_bad_element_input_is_rejected_exactly_as_impl_does(op, args):
    with pytest.raises((TypeError, ValueError)) as from_impl:
        getattr(impl, op)(*args())
    with pytest.raises(from_impl.type) as from_kernel:
        getattr(K, op)(*args())
    assert str(from_kernel.value) == str(from_impl.value)
    assert str(from_kernel.value).startswith(op + ":")


def test_e4m3_encode_and_bf16_round_accept_non_finite():
    x = torch.tensor([float("nan"), float("inf"), float("-inf")])
    assert K.e4m3_encode(x).tolist() == [0x7F, 0x7E, 0xFE]
    assert K.bf16_round(x)[1:].tolist() == [float("inf"), float("-inf")] and K.bf16_round(x)[0].isnan()


def test_all_names_exported():
    assert sorted(K.__all__) == sorted(["e2m1_encode", "e2m1_decode", "e4m3_encode", "e4m3_decode",
                                        "e8m0_decode", "bf16_round",
                                        "fp4_pack", "fp4_unpack", "fp4_e4m3_quantize",
                                        "fp4_e4m3_dequantize", "fp4_e8m0_quantize",
                                        "fp4_e8m0_dequantize", "fp8_quantize", "fp8_dequantize",
                                        "fp8_qdq"])
    from dsv4spec.properties.quant import OPS
    assert not set(K.__all__) & set(K.NOT_PROVIDED)
    assert set(K.__all__) | set(K.NOT_PROVIDED) == set(OPS), \
        "kernels/quant provides exactly the quant operations it does not list in NOT_PROVIDED"


# ------------------------------------------------------------------------------------------------
# Every kernel compiles for sm_90 (Hopper) without a GPU: Triton's own CUDA toolchain (ptxas ships
# with the wheel), in a fresh process where the kernels are real @triton.jit functions
# ------------------------------------------------------------------------------------------------

COMPILE_SM90 = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from dsv4spec.kernels import quant as K
    assert not K.INTERPRETED
    E = K.GPU_CONFIG["elements_per_program"]
    def build(kernel, signature, op=None, **constexprs):   # op: the launch configuration's
        signature = dict(signature, **{name: "constexpr" for name in constexprs})
        src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": K._num_warps(op)})
        assert len(compiled.asm["cubin"]) > 0
        print("compiled", kernel.fn.__name__, constexprs)
    for op, out in K.FORMAT_OUTPUTS.items():
        src = "*fp32" if op in ("e2m1_encode", "e4m3_encode", "bf16_round") else "*u8"
        build(K._format_kernel, {"in_ptr": src, "out_ptr": "*u8" if out.itemsize == 1 else "*fp32",
                                 "n": "i32"}, OP=op, N=E)
    for block in (64, 48):
        p2 = triton.next_power_of_2(block)
        rows = dict(BLOCK=block, BLOCK_P2=p2, ROWS=E // p2, CLEAN_NAN=False)
        build(K._fp8_qdq_kernel, {"x_ptr": "*bf16", "y_ptr": "*fp32", "nblocks": "i32"}, **rows)
        build(K._fp8_quantize_kernel, {"x_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8",
                                       "nblocks": "i32"}, **rows)
        rows.pop("CLEAN_NAN")
        build(K._fp8_dequantize_kernel, {"q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*fp32",
                                         "nblocks": "i32"}, **rows)
    for e4m3, block in ((True, 16), (False, 32)):
        q_rows, dq_rows = K._rows_per_program(block, "fp4_quantize_bf16"), K._rows_per_program(block, "fp4_dequantize")
        build(K._fp4_quantize_kernel, {"x_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8",
                                       "nblocks": "i32"},
              E4M3_SCALE=e4m3, BLOCK=block, ROWS=E // block, CLEAN_NAN=False)
        build(K._fp4_quantize_bf16_kernel, {"w_ptr": "*i32", "q_ptr": "*u8", "s_ptr": "*u8",
                                            "nblocks": "i32"}, "fp4_quantize_bf16", E4M3_SCALE=e4m3, BLOCK=block,
              ROWS=q_rows)
        build(K._fp4_dequantize_kernel, {"q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*fp32",
                                         "nblocks": "i32"}, "fp4_dequantize", E4M3_SCALE=e4m3, BLOCK=block,
              ROWS=dq_rows)
    build(K._pack_kernel, {"c_ptr": "*u8", "p_ptr": "*u8", "npairs": "i32"}, N=4096)
    build(K._unpack_kernel, {"p_ptr": "*u8", "c_ptr": "*u8", "nbytes": "i32"}, N=4096)
""")


def test_every_kernel_compiles_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("compiled") == 6 + 3 * 2 + 3 * 2 + 2
