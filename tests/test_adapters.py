"""dsv4spec.adapters converts the common encodings exactly and refuses what it cannot; results the
suite receives are checked strictly, with a message naming what was expected."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import dsv4spec.adapters as A
from dsv4spec.impl import quant as impl
from dsv4spec.properties.suite import ERROR, PASS, run_rule
from dsv4spec.properties.target import ContractError, Target, check_result
from dsv4spec.spec import formats as F
from mutants import mutant


def test_e8m0_from_pow2_reads_the_exponent_of_every_power_of_two():
    k = np.arange(-127, 128)
    got = A.e8m0_from_pow2(torch.tensor(np.ldexp(1.0, k), dtype=torch.float32))
    assert got.dtype == torch.uint8 and got.tolist() == list(range(0, 255))
    assert (F.e8m0_decode(got.numpy()) == np.ldexp(1.0, k)).all()       # the spec's decoding agrees


@pytest.mark.parametrize("bad", [3.0, 0.0, -2.0, float("inf"), 2.0 ** -128])
def test_e8m0_from_pow2_refuses_what_is_not_a_power_of_two(bad):
    with pytest.raises(ValueError, match="not a power of two"):
        A.e8m0_from_pow2(torch.tensor([1.0, bad]))


def test_as_bytes_reinterprets_float8_float4_and_int8():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    for dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2, torch.int8):
        assert torch.equal(A.as_bytes(codes.view(dtype)), codes)
    with pytest.raises(ValueError, match="not a one-byte encoding"):
        A.as_bytes(torch.ones(3))


def test_e4m3_from_values_is_the_byte_of_every_finite_e4m3_value():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    values = torch.tensor(F.e4m3_decode(codes), dtype=torch.float32)
    got = A.e4m3_from_values(values).numpy()
    assert (F.e4m3_decode(got) == F.e4m3_decode(codes)).all() and (np.signbit(F.e4m3_decode(got)) == np.signbit(values.numpy())).all()
    with pytest.raises(ValueError, match="not an E4M3 value"):
        A.e4m3_from_values(torch.tensor([1.1]))


def test_shapes_and_indices():
    assert A.reshape_like(torch.zeros(6, 1), (2, 3)).shape == (2, 3)
    with pytest.raises(ValueError, match="expected shape"):
        A.reshape_like(torch.zeros(5, 1), (2, 3))
    assert A.as_column(torch.arange(4)).shape == (4, 1) and A.as_flat(torch.zeros(4, 1)).shape == (4,)
    assert A.as_index(torch.tensor([-1, 3], dtype=torch.int32)).dtype == torch.int64
    with pytest.raises(ValueError, match="integer tensor"):
        A.as_index(torch.ones(2))


def test_an_adapter_in_a_few_lines_passes():
    """A library returning [rows, n] inputs only, float8_e8m0fnu scales [rows·k, 1] and
    float4_e2m1fn_x2 payloads conforms once adapted with rows, as_bytes and reshape_like."""
    def library_quantize(x2d):                                   # what "the library" returns
        packed, scales = impl.fp4_e8m0_quantize(x2d)
        return packed.view(torch.float4_e2m1fn_x2), scales.reshape(-1, 1).view(torch.float8_e8m0fnu)

    @A.rows
    def fp4_e8m0_quantize(x):
        packed, scales = library_quantize(x)
        return A.as_bytes(packed), A.reshape_like(A.as_bytes(scales), (x.shape[0], x.shape[1] // 32))

    assert run_rule("FP4.IDX.SCALE", Target(mutant("adapted", fp4_e8m0_quantize=fp4_e8m0_quantize), "a")).status == PASS


@pytest.mark.parametrize("returns, message", [
    (lambda x: impl.fp4_e8m0_quantize(x)[0].to(torch.int32), "dtype int32; expected uint8"),
    (lambda x: impl.fp4_e8m0_quantize(x)[0].numpy(), "expected a torch tensor of uint8"),
    (lambda x: impl.fp4_e8m0_quantize(x), "expected a torch tensor"),
])
def test_results_outside_the_contract_are_errors_naming_what_was_expected(returns, message):
    row = run_rule("FP4.E2M1.RNE", Target(mutant("strict", e2m1_encode=None, fp4_e4m3_quantize=None,
                                                 fp4_e8m0_quantize=lambda x: (returns(x), impl.fp4_e8m0_quantize(x)[1])),
                                          "m"))
    assert row.status == ERROR and message in row.detail, row.detail


def test_fp32_scale_bytes_and_column_scales_are_refused():
    x = torch.zeros(2, 64)
    packed, scales = impl.fp4_e8m0_quantize(x)
    with pytest.raises(ContractError, match="output 1 has dtype float32; expected uint8.*e8m0_from_pow2"):
        check_result("fp4_e8m0_quantize", (packed, scales.float()), (x,), {})
    with pytest.raises(ContractError, match=r"shape \(4, 1\); expected \(2, 2\)"):
        check_result("fp4_e8m0_quantize", (packed, scales.reshape(4, 1)), (x,), {})
    check_result("fp4_e8m0_quantize", (packed, scales), (x,), {})


def test_every_operation_has_a_result_contract():
    from dsv4spec.properties.target import NO_TENSOR_RESULT, RESULTS, known_ops
    assert known_ops() == set(RESULTS) | NO_TENSOR_RESULT


def test_e2m1_codes_of_every_value_keep_the_sign_of_zero():
    codes = np.arange(16, dtype=np.uint8)
    values = torch.tensor(F.e2m1_decode(codes), dtype=torch.float32)
    assert A.e2m1_codes(values).tolist() == list(range(16))
    assert A.e2m1_codes(torch.tensor([-0.0, 0.0], dtype=torch.bfloat16)).tolist() == [8, 0]
    with pytest.raises(ValueError, match="0.75 is not an E2M1 value"):
        A.e2m1_codes(torch.tensor([1.0, 0.75]))


def test_e8m0_from_words_unpacks_four_scales_lowest_byte_first():
    words = torch.tensor([[0x7F7E7D7C, -1]], dtype=torch.int32)            # -1: four 0xFF bytes
    assert A.e8m0_from_words(words).tolist() == [[0x7C, 0x7D, 0x7E, 0x7F, 255, 255, 255, 255]]
    with pytest.raises(ValueError, match="expected an int32 tensor"):
        A.e8m0_from_words(torch.zeros(2, dtype=torch.int64))


def test_a_payload_scales_row_splits_and_joins_back():
    row = torch.arange(2 * 10, dtype=torch.int64).to(torch.uint8).reshape(2, 10)
    payload, scales = A.split_row(row, 8)
    assert payload.shape == (2, 8) and scales.shape == (2, 2) and torch.equal(A.join_row(payload, scales), row)
    with pytest.raises(ValueError, match="inside a row of 10 bytes"):
        A.split_row(row, 10)


def test_rows_of_128_become_blocks_and_back():
    x = torch.arange(256 * 3, dtype=torch.float32).reshape(256, 3)
    blocks = A.as_blocks(x)
    assert blocks.shape == (2, 128, 3) and torch.equal(blocks[1, 0], x[128]) and torch.equal(A.from_blocks(blocks), x)
    with pytest.raises(ValueError, match="multiple of 128"):
        A.as_blocks(x[:100])


def test_block_ids_become_the_pool_mask():
    mask = A.pool_mask(torch.tensor([[0, 2, -1], [-1, -1, -1]], dtype=torch.int32), width=20, block_size=8)
    assert mask.dtype == torch.bool and mask.shape == (2, 20)
    assert mask[0].nonzero().flatten().tolist() == list(range(8)) + list(range(16, 20)) and not mask[1].any()
    with pytest.raises(ValueError, match=r"in \[-1, 3\)"):
        A.pool_mask(torch.tensor([[3]]), width=20)


def test_kv_qdq_is_offered_per_format_and_the_bundled_name_still_works():
    from dsv4spec.impl import path as impl_path
    one = Target(SimpleNamespace(NAME="fp8 only", kv_qdq_fp8_e8m0_32=lambda x: impl_path.kv_qdq(x, "fp8_e8m0_32")), "fp8")
    row = run_rule("PATH.QDQ", one)
    assert row.status == PASS and "1 of 2 checks ran" in row.detail, row
    both = Target(SimpleNamespace(NAME="bundled", kv_qdq=impl_path.kv_qdq), "bundled")
    assert run_rule("PATH.QDQ", both).status == PASS and both.has("kv_qdq_fp4_e4m3", "kv_qdq_fp8_e8m0_32")


def test_freqs_cis_is_the_official_table_at_the_positions():
    """precompute_freqs_cis (V4-model L226-228) indexed at the positions, bit for bit."""
    from dsv4spec.official.rope import rope_freqs
    freqs = rope_freqs("v4.1-flash", 20)
    positions = torch.tensor([0, 1, 2, 4095, 65535, 65536, 70001, 2 ** 17 - 1])
    whole = torch.arange(2 ** 17)
    angle = torch.outer(whole, freqs)
    official = torch.polar(torch.ones_like(angle), angle)[positions]
    table = A.freqs_cis(positions, freqs)
    assert table.dtype == torch.complex64 and torch.equal(table, official)
    cos, sin = A.cos_sin(positions, freqs)
    assert torch.equal(cos, official.real) and torch.equal(sin, official.imag)
    cos2, sin2 = A.cos_sin(positions, freqs, repeat=True)
    assert cos2.shape == (8, 64) and torch.equal(cos2[:, 1::2], cos) and torch.equal(sin2[:, ::2], sin)


def _library_rope_by_table(x, table):
    """A library's rotation: x [T, H, D] BF16, the last 2·table.shape[-1] channels by table [T, d/2]."""
    rd = 2 * table.shape[-1]
    y = x.to(torch.bfloat16)
    z = torch.view_as_complex(y[..., -rd:].float().unflatten(-1, (-1, 2)))
    y[..., -rd:] = torch.view_as_real(z * table[:, None, :]).flatten(-2).to(torch.bfloat16)
    return y.float()


def _library_rope_by_cos_sin(x, cos, sin):
    """A library's rotate-every-two rotation by cos and sin [T, d], each value twice."""
    rd = cos.shape[-1]
    y = x.to(torch.bfloat16).float()
    tail = y[..., -rd:]
    every_two = torch.stack([-tail[..., 1::2], tail[..., ::2]], dim=-1).flatten(-2)
    y[..., -rd:] = tail * cos[:, None, :] + every_two * sin[:, None, :]
    return y.to(torch.bfloat16).float()


@pytest.mark.parametrize("rope_rotate, attention_output", [
    (A.with_freqs_cis(_library_rope_by_table), A.with_freqs_cis(_library_rope_by_table, inverse=True)),
    (A.with_cos_sin(_library_rope_by_cos_sin, repeat=True),
     A.with_cos_sin(_library_rope_by_cos_sin, repeat=True, inverse=True)),
], ids=["complex table", "cos/sin"])
def test_a_library_taking_a_rope_table_passes_through_the_wrappers(rope_rotate, attention_output, monkeypatch):
    from dsv4spec.properties.suite import RUN
    monkeypatch.setattr(RUN, "max_examples", 5)
    target = Target(mutant("rope by table", rope_rotate=rope_rotate, attention_output=attention_output), "t")
    for rule_id in ("ROPE.PAIRS", "ROPE.ROUNDING", "ATTN.DEROTATE"):
        row = run_rule(rule_id, target)
        assert row.status == PASS, (rule_id, row.detail)


def test_the_de_rotation_needs_the_inverse_table(monkeypatch):
    from dsv4spec.properties.suite import FAIL, RUN
    monkeypatch.setattr(RUN, "max_examples", 5)
    forward = Target(mutant("forward", attention_output=A.with_cos_sin(_library_rope_by_cos_sin, repeat=True)), "f")
    assert run_rule("ATTN.DEROTATE", forward).status == FAIL
