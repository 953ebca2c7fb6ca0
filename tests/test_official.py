"""The control target: `official` (the official code's computation, transcribed) passes every rule it
implements, a BF16-only port passes every codec rule, and the torch casts `official` relies on are
proven exact on everything it feeds them.

Other profiles and seeds (not part of `make test`):
    python tests/official_runs.py --profile dev --seeds 20 --rules FMT,FP4,FP8
    python tests/official_runs.py --profile thorough --rules FMT,FP4,FP8
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
import dsv4spec.official as official
from dsv4spec.properties.quant import OPS as QUANT_OPS
from dsv4spec.properties.suite import NOT_IMPLEMENTED, PASS, VARIANT, checks_for, load_checks, run_rule
from dsv4spec.properties.target import Target, load_target
from dsv4spec.spec import RULES
from dsv4spec.spec import formats as F
from dsv4spec.spec.rules import select

load_checks()
CHECKED = sorted(r for r in RULES if checks_for(r))
OFFICIAL = load_target("official")


@pytest.mark.parametrize("rule_id", CHECKED)
def test_official_passes_every_rule_it_implements(rule_id):
    row = run_rule(rule_id, OFFICIAL)
    runnable = any(OFFICIAL.has(*c.ops) for c in checks_for(rule_id))
    expected = (PASS, VARIANT) if runnable else (NOT_IMPLEMENTED,)
    assert row.status in expected, f"{rule_id} on official: {row.status} {row.detail}"


def test_official_quantizers_take_bf16_only():
    assert OFFICIAL.input_dtype("fp4_e8m0_quantize") == "bfloat16"
    assert OFFICIAL.input_dtype("e4m3_encode") == "float32"
    with pytest.raises(TypeError, match="compiled for bfloat16 input, got torch.float32"):
        official.fp4_e4m3_quantize(torch.zeros(2, 16))


def test_official_nonfinite_as_the_kernels_make_it():
    # V4-kernel L22-27, L161-164: the max reduction skips NaN; an Inf makes the E8M0 scale +Inf
    # (fast_log2_ceil(Inf) = 128, byte 0xFF) and saturates the E4M3 scale at 448 (0x7E).
    x = torch.tensor([[1.0] * 15 + [float("nan")] + [float("inf")] + [0.5] * 15], dtype=torch.bfloat16)
    _, idx_scales = official.fp4_e8m0_quantize(x)
    _, kv_scales = official.fp4_e4m3_quantize(x)
    assert idx_scales.tolist() == [[0xFF]]
    assert kv_scales.tolist() == [[F.e4m3_encode(np.float32(1 / 6)).item(), 0x7E]]   # NaN skipped: amax 1


# ---------------------------------------------------------------------------------------------
# torch's float8_e4m3fn cast, proven exact where `official` uses it
# ---------------------------------------------------------------------------------------------

def _same_e4m3(x: np.ndarray):
    """official's cast (official/quant.py _e4m3_satfinite: the clamp to ±448, then torch's cast)."""
    got = torch.from_numpy(x).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.int64)
    want = F.e4m3_encode(x).astype(np.int64)
    nan = (want & 0x7F) == 0x7F
    assert np.array_equal(np.where(nan & ((got & 0x7F) == 0x7F), want, got), want)


def test_torch_e4m3_cast_on_every_bf16_pattern():
    """x / s of a BF16 x by a power of two s is a BF16 pattern unless it lands among the fp32
    subnormals: act_quant's values, and the in-place QDQ."""
    _same_e4m3(F.f32_from_bits(np.arange(1 << 16, dtype=np.int64) << 16))


def test_torch_e4m3_cast_on_every_fp32_subnormal():
    """Every fp32 subnormal (|x| < 2^-126, far below half the smallest E4M3 2^-9) casts to ±0."""
    bits = np.arange(1 << 23, dtype=np.int64)
    x = F.f32_from_bits(np.concatenate([bits, bits | (1 << 31)]))
    got = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(got, np.where(np.signbit(x), 0x80, 0x00).astype(np.uint8))
    _same_e4m3(x[::4097])                                       # and the spec says the same


def test_torch_e4m3_cast_on_every_kv_scale():
    """The V4.1 scale cast sees fl32(amax / 6) for a BF16 amax (every positive pattern, Inf included)."""
    amax = F.f32_from_bits(np.arange(1, 0x7F81, dtype=np.int64) << 16)
    _same_e4m3(amax / np.float32(6))


# ---------------------------------------------------------------------------------------------
# A BF16-only port: impl behind an assertion that every value it receives is BF16
# ---------------------------------------------------------------------------------------------

def _bf16_only(name, fn):
    def run(*args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
                assert a.dtype == torch.bfloat16, f"{name} received {a.dtype}"
        return fn(*args)
    return run


BF16_ONLY = SimpleNamespace(NAME="bf16-only impl", CLAIMS_CONFORMANCE=True, INPUT_DTYPE="bfloat16",
                            **{op: _bf16_only(op, getattr(impl, op)) for op in QUANT_OPS})


@pytest.mark.parametrize("rule_id", [r.id for r in select(["FMT", "FP4", "FP8"]) if checks_for(r.id)])
def test_a_bf16_only_port_passes_every_codec_rule(rule_id):
    row = run_rule(rule_id, Target(BF16_ONLY, "bf16-only"))
    assert row.status in (PASS, VARIANT), f"{rule_id}: {row.status} {row.detail}"
    if row.status == VARIANT:                       # impl rejects NaN/Inf, an allowed choice
        assert row.detail == "detected: nonfinite_input=reject", row.detail


def test_input_dtype_declarations_are_validated():
    with pytest.raises(ValueError, match="INPUT_DTYPE must be one of"):
        Target(SimpleNamespace(INPUT_DTYPE="fp16"), "t")
    with pytest.raises(ValueError, match="INPUT_DTYPES\\['fp8_quantize'\\] must be one of"):
        Target(SimpleNamespace(INPUT_DTYPES={"fp8_quantize": torch.bfloat16}), "t")
    t = Target(SimpleNamespace(INPUT_DTYPE="bfloat16", INPUT_DTYPES={"e4m3_encode": "float32"}), "t")
    assert (t.input_dtype("fp8_quantize"), t.input_dtype("e4m3_encode")) == ("bfloat16", "float32")


E4M3_CAST_RULES = ("FMT.E4M3.RNE", "FMT.E4M3.SATFINITE", "FP4.KV.SATURATE", "FP8.SCALE", "PATH.ORDER", "PATH.QDQ")


@pytest.mark.parametrize("rule_id", E4M3_CAST_RULES)
def test_official_never_asks_torch_to_saturate_e4m3(rule_id, monkeypatch):
    """torch's float8_e4m3fn cast saturates above 448 in some releases (2.13) and gives NaN in others
    (2.11, found on the H200 machine), so official clamps first: the cast only ever sees |x| <= 448
    or NaN, where every release rounds alike.  Here a cast fed anything beyond fails the rule."""
    cast = torch.Tensor.to

    def guarded(self, *args, **kwargs):
        dtype = args[0] if args and isinstance(args[0], torch.dtype) else kwargs.get("dtype")
        if dtype == torch.float8_e4m3fn and self.is_floating_point() and self.dtype != dtype:
            x = self.float()
            assert not bool(((x.abs() > 448) & ~torch.isnan(x)).any()), "float8 cast fed values beyond 448"
        return cast(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", guarded)
    row = run_rule(rule_id, OFFICIAL)
    assert row.status in (PASS, VARIANT), f"{rule_id} on official: {row.status} {row.detail}"


# ---------------------------------------------------------------------------------------------
# Where the control followed the official code less literally (issue 18)
# ---------------------------------------------------------------------------------------------

def test_official_hadamard_is_one_butterfly():
    """official.path rotates with official.indexer's butterfly (fast_hadamard_transform's order:
    the lowest index bit first, times d^-0.5 at the end), not a second emulation."""
    from dsv4spec.official import indexer as oi, path as op
    x = torch.randn(3, 2, 128).to(torch.bfloat16)
    assert torch.equal(op._hadamard(x), oi.rotate_activation(x))


def test_official_yarn_ramp_guard_is_each_models():
    from dsv4spec.official.rope import _ramp_width
    assert _ramp_width(10, 10, "v4-flash") == (10 + 0.001) - 10      # V4: high += 0.001
    assert _ramp_width(10, 10, "v4.1-flash") == 1e-3                # V4.1: max(high − low, 1e-3)
    assert _ramp_width(3, 1, "v4-flash") == -2 and _ramp_width(3, 1, "v4.1-flash") == 1e-3
    assert _ramp_width(3, 9, "v4-flash") == _ramp_width(3, 9, "v4.1-flash") == 6


def test_official_compressor_returns_none_where_the_official_does():
    from dsv4spec.official.compressor import Compressor, compress
    d, dim, ratio = 8, 16, 4
    params = {"wkv": torch.randn(d, dim), "wgate": torch.randn(d, dim), "norm": torch.ones(d),
              "rope_freqs": torch.zeros(0)}
    x = torch.randn(1, 3, dim).to(torch.bfloat16)
    assert Compressor(params, "v4.1-flash", ratio, 1).forward(x, 0) is None          # prefill < ratio
    c = Compressor(params, "v4.1-flash", ratio, 1)
    c.forward(torch.randn(1, 5, dim).to(torch.bfloat16), 0)
    assert c.forward(torch.randn(1, 1, dim).to(torch.bfloat16), 5) is None          # group not complete
    assert compress(x.float(), params, model="v4.1-flash", ratio=ratio).shape == (1, 0, d)


def test_official_index_topk_derives_k_and_holds_the_caller_to_it():
    scores, visible = torch.randn(2, 5), torch.tensor([5, 5])
    assert official.index_topk(scores, visible, 5, "score").shape == (2, 5)
    with pytest.raises(AssertionError, match="min\\(index_topk, end_pos // ratio\\) = 5"):
        official.index_topk(scores, visible, 6, "score")


ZERO_ROWS = [("fp8_quantize", (torch.zeros(0, 64, dtype=torch.bfloat16), 64), [(0, 64), (0, 1)]),
             ("fp8_qdq", (torch.zeros(0, 64, dtype=torch.bfloat16), 64), [(0, 64)]),
             ("fp8_dequantize", (torch.zeros(0, 64, dtype=torch.uint8), torch.zeros(0, 1, dtype=torch.uint8), 64),
              [(0, 64)]),
             ("fp4_e4m3_quantize", (torch.zeros(0, 32, dtype=torch.bfloat16),), [(0, 16), (0, 2)]),
             ("fp4_e8m0_quantize", (torch.zeros(0, 32, dtype=torch.bfloat16),), [(0, 16), (0, 1)]),
             ("fp4_e4m3_dequantize", (torch.zeros(0, 16, dtype=torch.uint8), torch.zeros(0, 2, dtype=torch.uint8)),
              [(0, 32)]),
             ("fp4_e8m0_dequantize", (torch.zeros(0, 16, dtype=torch.uint8), torch.zeros(0, 1, dtype=torch.uint8)),
              [(0, 32)]),
             ("fp8_linear", (torch.zeros(0, 128, dtype=torch.bfloat16), torch.zeros(128, 128, dtype=torch.uint8),
                             torch.full((1, 1), 127, dtype=torch.uint8), 128), [(0, 128)])]


@pytest.mark.parametrize("provider", [impl, official], ids=["impl", "official"])
@pytest.mark.parametrize("op, args, shapes", ZERO_ROWS, ids=[z[0] for z in ZERO_ROWS])
def test_codecs_take_zero_rows(provider, op, args, shapes):
    """No row (a prefill shorter than the ratio has no compressed entry to quantize): empty results
    of the contract's widths, not a reshape of 0 elements with an inferred dimension."""
    got = getattr(provider, op)(*args)
    got = got if isinstance(got, tuple) else (got,)
    assert [tuple(t.shape) for t in got] == shapes
