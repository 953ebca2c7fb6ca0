"""RoPE per layer: the exact table against the official fp32 computation, the constants of the
correction range, the rotation's determinism test, and clear errors for bad input."""
import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
from dsv4spec.spec import rope as spec
from dsv4spec.spec.models import profile


def test_correction_range_of_the_released_config():
    # c(32) = 64·ln(65536/(64π))/(2 ln 160000) = 15.45…, c(1) = 24.71… (worked by hand)
    m = profile("v4.1-flash")
    assert spec.correction_range(m, 160000.0) == (15, 25)
    factor = spec.yarn_factor(m, 160000.0)
    assert np.all(factor[:16] == 1.0) and np.all(factor[25:] == 1 / 16)
    assert factor[20] == pytest.approx(0.5 / 16 + 0.5)


@pytest.mark.parametrize("model", ["v4-flash", "v4-pro", "v4.1-flash"])
def test_the_fp32_tables_lie_within_the_stated_tolerance(model):
    m = profile(model)
    for layer in sorted({m.compress_ratios.index(r) for r in set(m.compress_ratios)}):
        exact = spec.frequencies(m, layer)
        for table in (spec.frequencies_fp32(m, layer), impl.rope_freqs(model, layer).numpy()):
            assert np.all(np.abs(table / exact - 1) <= spec.FREQ_RTOL), (model, layer)


def test_window_layers_have_no_yarn_and_base_10000():
    f = spec.frequencies(profile("v4-flash"), 0)
    assert np.allclose(f, 10000.0 ** (-np.arange(32) / 32), rtol=1e-15)


def test_yarn_factors_read_back_from_a_table():
    m = profile("v4-flash")
    theta, factors = spec.yarn_factors_of(spec.frequencies(m, 2))
    assert theta == pytest.approx(160000.0, rel=1e-12)
    assert np.allclose(factors, spec.yarn_factor(m, 160000.0), rtol=1e-12)


def test_determined_elements_round_alike_under_any_fp32_error():
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal((8, 128)) * 64) / 64
    positions = rng.integers(0, 2 ** 20, 8)
    freqs = spec.frequencies_fp32(profile("v4.1-flash"), 20)
    exact, delta = spec.rotate_exact(x, positions, freqs), spec.rotate_error(x, freqs)
    ok = spec.determined(x, positions, freqs)
    assert ok.mean() > 0.99
    for shift in (-1.0, 1.0):
        assert np.array_equal(spec.rotate(x, positions, freqs)[ok],
                              spec.round_bf16(exact + shift * delta)[ok])


def test_rotation_at_position_zero_is_the_identity():
    x = torch.randn(3, 2, 128).bfloat16().float()
    assert torch.equal(impl.rope_rotate(x, torch.zeros(3, dtype=torch.int64), impl.rope_freqs("v4-flash", 2)), x)


@pytest.mark.parametrize("call, message", [
    (lambda: impl.rope_freqs("v4-flash", 44), "has layers 0..43"),
    (lambda: impl.rope_freqs("v3.2", 0), "expected a V4 or V4.1 model"),
    (lambda: impl.rope_freqs("v4-flash", 2, "main"), "use must be one of"),
    (lambda: impl.rope_rotate(torch.zeros(2, 128), torch.zeros(3, dtype=torch.int64), torch.zeros(32)),
     "one position per token"),
    (lambda: impl.rope_rotate(torch.zeros(2, 32), torch.zeros(2, dtype=torch.int64), torch.zeros(32)),
     "x has only 32"),
    (lambda: impl.rope_rotate(torch.zeros(2, 128), torch.tensor([0, -1]), torch.zeros(32)), "positions must be ≥ 0"),
])
def test_bad_input_names_what_was_expected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("pair", [0, 7, 15, 20, 25, 31])
@pytest.mark.parametrize("position", [1, 5000, 2 ** 20])
def test_the_table_probe_finds_rows_where_a_bf16_table_and_the_fp32_one_part(pair, position):
    """ROPE.PAIRS' probe rows (issue 40): at the position found, a BF16 table's rotation lies outside the
    fp32 table's interval and the fp32 table's exact rotation outside what a BF16 table admits."""
    from dsv4spec.properties.rope import table_rows
    freqs = spec.frequencies_fp32(profile("v4.1-flash"), 20)
    rows, at = table_rows(pair, position, freqs)
    assert len(rows) and at >= position
    x, positions = rows[:, None, :], np.full(len(rows), at)
    shows = spec.bf16_table_shows(x, positions, freqs)
    exact, tol = spec.rotate_exact(x, positions, freqs), spec.rotate_tolerance(x, positions, freqs)
    by_bf16_table = spec.round_bf16(spec.rotate_by_bf16_table(x, positions, freqs))
    assert shows.any() and (np.abs(by_bf16_table - exact) > tol)[shows].all()
    assert not spec.bf16_table_admits(spec.round_bf16(exact), x, positions, freqs)[shows].any()
