"""dsv4spec.adapters converts the common encodings exactly and refuses what it cannot; results the
suite receives are checked strictly, with a message naming what was expected."""
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
