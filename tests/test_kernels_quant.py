"""The quant-family Triton kernels against the spec and impl, bit for bit (interpreter on CPU,
the real thing on a GPU), plus their input validation and determinism.  No timing here."""
import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import quant as K
from dsv4spec.spec import RULES
from dsv4spec.spec import formats as F
from dsv4spec.spec import quant as S

# values near the top of fp32 overflow harmlessly inside the interpreter's numpy arithmetic
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

TIES = [6, .75, 1.75, 3.5, .25, 1.25, 2.5, 5, -.75, -1.75, -3.5, -.25, -1.25, -2.5, -5, -0.0]


def edge_input(n_blocks16: int, seed: int) -> np.ndarray:
    """[n_blocks16 * 16] fp32: the conventions.md edge vectors, then mixed magnitudes."""
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


def test_all_names_exported():
    assert sorted(K.__all__) == sorted(["fp4_pack", "fp4_unpack", "fp4_e4m3_quantize",
                                        "fp4_e4m3_dequantize", "fp4_e8m0_quantize",
                                        "fp4_e8m0_dequantize", "fp8_quantize", "fp8_dequantize"])


# ------------------------------------------------------------------------------------------------
# The conformance suite on the kernels target
# ------------------------------------------------------------------------------------------------

QUANT_RULES = sorted(r for r in RULES if r.startswith(("FP4.", "FP8.")) or r == "FMT.CEIL_LOG2")
NOT_PROVIDED = {"FP8.V4_INPLACE": "fp8_qdq"}     # operations the kernels target does not implement


@pytest.fixture(scope="module")
def kernels_target():
    try:
        from dsv4spec.properties import quant  # noqa: F401  (registers the FP4/FP8 checks)
    except ImportError as e:
        pytest.skip(f"dsv4spec.properties.quant is missing ({e}); the rule checks cannot run")
    from dsv4spec.properties.target import load_target
    return load_target("kernels")


@pytest.mark.parametrize("rule_id", QUANT_RULES)
def test_conformance_rule_passes(rule_id, kernels_target):
    from dsv4spec.properties.suite import NOT_IMPLEMENTED, PASS, checks_for, run_rule
    if not checks_for(rule_id):
        pytest.skip(f"no check registered for {rule_id} yet")
    row = run_rule(rule_id, kernels_target, "ci")
    expected = NOT_IMPLEMENTED if rule_id in NOT_PROVIDED else PASS
    assert row.status == expected, f"{rule_id}: {row.status} {row.detail}"
