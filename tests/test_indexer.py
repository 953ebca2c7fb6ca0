"""Indexer family: impl passes every HAD/IDX rule; spec definitions hold by independent derivation;
impl agrees with the exact spec; bad input is refused with a message naming what was expected."""
import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
from dsv4spec.properties.indexer import cancellation_case, expected_scores
from dsv4spec.spec import formats
from dsv4spec.spec import indexer as spec
from dsv4spec.spec.models import V4_1_FLASH, V4_FLASH

def test_every_bf16_pattern_rounds_to_itself_and_midpoints_round_to_even():
    """All 65536 BF16 patterns (exhaustive), and the exact midpoints between neighbours."""
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    values = bits.view(np.float32).astype(np.float64)
    finite = np.isfinite(values)
    assert np.array_equal(spec.round_bf16(values[finite]), values[finite])
    positive = np.sort(np.unique(np.abs(values[finite])))
    lo, hi = positive[:-1], positive[1:]
    mid = (lo + hi) / 2                                  # exact in float64
    lo_bits = (lo.astype(np.float32).view(np.uint32) >> 16)
    even = np.where(lo_bits % 2 == 0, lo, hi)
    assert np.array_equal(spec.round_bf16(mid), even)
    assert np.array_equal(spec.round_bf16(-mid), -even)


def test_bf16_quantum_is_the_gap_to_the_next_bf16_magnitude_at_every_pattern():
    """Exhaustive over the non-negative finite BF16 values, zero included (its gap is the smallest
    subnormal 2^-133: a zero score's tolerance is no wider), and the same for their negatives."""
    bits = np.arange(0x7F80, dtype=np.uint32) << 16                     # +0 .. the largest finite
    values = bits.view(np.float32).astype(np.float64)
    gap = np.append(values[1:], 2.0 ** 128) - values
    assert np.array_equal(spec.bf16_quantum(values), gap)
    assert np.array_equal(spec.bf16_quantum(-values), gap)


def test_bf16_quantum_is_frexp_s_binade_at_every_float64_exponent():
    """Read from the exponent field, the quantum is bit for bit the one frexp's binade gives: every one of
    the 2048 exponent fields (subnormals, ±inf and NaN among them), each with its smallest, largest and
    random mantissas, both signs, the zeros."""
    def by_frexp(x):
        a = np.abs(x)
        _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))            # a = m·2^e, 0.5 ≤ m < 1
        binade = np.where(a > 0, e - 1, spec.BF16_MIN_EXP)
        return np.ldexp(1.0, np.maximum(binade, spec.BF16_MIN_EXP) - spec.BF16_MANTISSA_BITS)
    fields = np.arange(2048, dtype=np.uint64) << np.uint64(52)
    mantissas = np.random.default_rng(0).integers(0, 1 << 52, (2048, 16), dtype=np.uint64)
    mantissas[:, 0], mantissas[:, 1] = 0, (1 << 52) - 1
    x = (fields[:, None] | mantissas).ravel().view(np.float64)
    x = np.concatenate([x, -x, [0.0, -0.0]])
    assert np.array_equal(spec.bf16_quantum(x).view(np.uint64), by_frexp(x).view(np.uint64))


def test_round_bf16_agrees_with_the_fp32_rule_and_torch_on_fp32_inputs():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 2.0 ** rng.integers(-140, 128, 20000)).astype(np.float32)
    x = x[np.isfinite(x)]
    ours = spec.round_bf16(x.astype(np.float64))
    assert np.array_equal(ours, formats.bf16_round(x).astype(np.float64))
    assert np.array_equal(ours, torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_round_bf16_rounds_exact_values_once():
    """1 + 2^-8 + 2^-30 rounds up; through fp32 first it would be the tie 1 + 2^-8 and round to 1."""
    x = 1 + 2.0 ** -8 + 2.0 ** -30
    assert spec.round_bf16(x) == 1 + 2.0 ** -7
    assert spec.round_bf16(float(np.float32(1 + 2.0 ** -8))) == 1.0


def test_hadamard_matrix_is_sylvester_and_orthogonal():
    h = spec.sylvester_hadamard()
    assert np.array_equal(h @ h.T, 128 * np.eye(128, dtype=h.dtype))
    h2 = np.array([[1, 1], [1, -1]])
    sylvester = np.array([[1]])
    for _ in range(7):
        sylvester = np.kron(h2, sylvester)
    assert np.array_equal(h, sylvester)
    # column 0 of H·bf16(2^-3.5): 2^-3.5 = 0.08838834764…, in [2^-4, 2^-3) the BF16 step is 2^-11:
    # 0.0883883·2048 = 181.02 → 181·2^-11 = 0.08837890625
    assert spec.hadamard(np.eye(128))[0, 0] == 0.08837890625


def test_weight_factors():
    assert V4_1_FLASH.index_weight_scale == 1 / 64
    assert abs(V4_FLASH.index_weight_scale - 0.011048543456039806) < 1e-18
    raw = np.array([[1.0] * 32])
    assert np.all(spec.index_weights(raw, V4_1_FLASH) == 1 / 64)


def test_cancellation_vector_separates_bf16_steps_from_one_cast():
    """The IDX.SCORE.ROUNDING 'differs' example, derived by hand in its docstring."""
    case = cancellation_case()
    bf16 = spec.index_scores(case.q, case.k, case.w, case.visible, "bf16")
    fp32 = spec.index_scores(case.q, case.k, case.w, case.visible, "fp32")
    assert bf16.tolist() == [[0.125, 0.125]]
    assert fp32.tolist() == [[0.0625, 0.0625]]
    got = impl.index_scores(*case.torch())
    assert got.tolist() == [[0.125, 0.125]]


def test_impl_scores_match_the_exact_definition_at_model_shape():
    """64 queries × 256 keys × 32 heads × 128 dims: within the stated tolerance; count exact matches."""
    rng = np.random.default_rng(1)
    q = spec.round_bf16(rng.standard_normal((64, 32, 128)))
    k = spec.round_bf16(rng.standard_normal((256, 128)))
    w = spec.round_bf16(rng.standard_normal((64, 32)) / 64)
    visible = np.full(64, 256)
    ref = spec.index_scores(q, k, w, visible)
    tol = spec.index_score_tolerance(q, k, w)
    got = impl.index_scores(torch.tensor(q, dtype=torch.float32), torch.tensor(k, dtype=torch.float32),
                            torch.tensor(w, dtype=torch.float32), torch.tensor(visible)).numpy()
    assert np.all(np.abs(got - ref) <= tol)
    assert np.mean(got != ref) < 1e-2          # differences are rare (summation order only)


def test_topk_spec_and_impl_agree_on_lowest_index_ties():
    rng = np.random.default_rng(2)
    scores = rng.integers(-2, 3, (8, 30)) * 0.5
    visible = rng.integers(0, 31, 8)
    scores = np.where(spec.visibility_mask(visible, 30), scores, -np.inf)
    for order in spec.TOPK_ORDERS:
        got = impl.index_topk(torch.tensor(scores, dtype=torch.float32), torch.tensor(visible), 12, order)
        assert np.array_equal(got.numpy(), spec.index_topk(scores, visible, 12, order))


def test_topk_width_and_kv_rows():
    assert spec.topk_width(512, 100, 4) == 25 and spec.topk_width(512, 10 ** 6, 2) == 512
    assert spec.topk_width(512, 1, 2) == 0
    assert spec.kv_rows(np.array([3, 0, -1]), 128).tolist() == [131, 128, -1]


def test_variant_references_differ_where_they_should():
    case = cancellation_case()
    from types import SimpleNamespace
    for variant, value in (("bf16_steps", 0.125), ("fp32", 0.0625), ("fp32_then_bf16", 0.0625)):
        t = SimpleNamespace(variant=lambda knob, v=variant: v)
        ref, _ = expected_scores(t, case)
        assert ref[0, 0] == value


F = torch.float32
BAD = [
    (lambda: impl.index_scores(torch.zeros(2, 4, 16), torch.zeros(5, 8), torch.zeros(2, 4), torch.tensor([1, 1])),
     "k has head dim 8, expected q's 16"),
    (lambda: impl.index_scores(torch.zeros(2, 4, 16), torch.zeros(5, 16), torch.zeros(2, 3), torch.tensor([1, 1])),
     "w has shape (2, 3), expected [T, H] = [2, 4]"),
    (lambda: impl.index_scores(torch.zeros(1, 1, 16), torch.zeros(5, 16), torch.zeros(1, 1), torch.tensor([6])),
     "visible must lie in [0, 5]"),
    (lambda: impl.index_scores(torch.full((1, 1, 16), 1 + 2 ** -10), torch.zeros(5, 16), torch.zeros(1, 1),
                               torch.tensor([1])), "BF16-representable"),
    (lambda: impl.index_scores(torch.zeros(1, 1, 16), torch.zeros(5, 16), torch.zeros(1, 1), torch.tensor([1]), "fp16"),
     "score_dtype must be one of"),
    (lambda: impl.index_topk(torch.tensor([[float("nan"), 1.0]]), torch.tensor([2]), 1, "score"), "contains NaN"),
    (lambda: impl.index_topk(torch.zeros(1, 4), torch.tensor([2]), -1, "score"), "k must be an int in [0, 4]"),
    (lambda: impl.index_topk(torch.zeros(1, 4), torch.tensor([2]), 1, "random"), "order must be one of"),
    (lambda: impl.index_visible(torch.tensor([3]), 0), "ratio must be a positive int"),
    (lambda: impl.hadamard(torch.zeros(3, 100)), "last dimension must be 128"),
    (lambda: impl.index_weights(torch.zeros(2, 64), "v4.1-flash"), "expected v4.1-flash's index_n_heads = 32"),
    (lambda: impl.index_weights(torch.zeros(2, 64), "v3.2"), "expected a V4 or V4.1 model"),
    (lambda: impl.index_rotate(torch.zeros(2, 128), "v5"), "unknown model"),
]


@pytest.mark.parametrize("call, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert message in str(e.value)


# ------------------------------------------------------------------------------------------------
# No false alarms (issue 7): the official transcription passes; the boundaries that made it fail
# ------------------------------------------------------------------------------------------------
from dsv4spec import official  # noqa: E402
from dsv4spec.properties.indexer import (ROW_KINDS, make_rows, make_score_case, score_rows,  # noqa: E402
                                         tp_cancellation_case)
from dsv4spec.properties.suite import PASS, SKIP, run_rule  # noqa: E402
from dsv4spec.properties.target import Target, load_target  # noqa: E402
from hypothesis import given, settings  # noqa: E402


def test_tp_partials_that_cancel_are_admitted_and_the_old_bound_was_too_tight():
    """The issue's case: BF16 shard partials cancel to 0.0 while the full score is not 0."""
    case = tp_cancellation_case()
    full = official.index_scores(*case.torch()).numpy()[0, 0]
    halves = [official.index_scores(torch.tensor(case.q[:, h]), torch.tensor(case.k), torch.tensor(case.w[:, h]),
                                    torch.tensor(case.visible)).numpy()[0, 0] for h in (slice(0, 16), slice(16, 32))]
    assert halves == [8.0, -8.0]                          # 8 + 7·2^-8 rounds to 8 (ulp 2^-4)
    total = float(spec.round_bf16(halves[0] + halves[1]))
    assert total == 0.0 and full == 7 * 2.0 ** -8 == spec.index_scores(case.q, case.k, case.w, case.visible)[0, 0]
    tol = spec.index_score_tolerance(case.q, case.k, case.w)[0, 0]
    old_bound = (2 + 2) * spec.bf16_quantum(max(abs(full), tol)) + tol   # (n + 2) ulps of M, M a head term
    assert old_bound < abs(total - full)
    parts = np.array_split(np.arange(32), 2)
    new_bound = spec.index_score_allreduce_tolerance(case.q, case.k, case.w, parts)[0, 0] + sum(
        spec.index_score_tolerance(case.q[:, h], case.k, case.w[:, h])[0, 0] for h in parts)
    # no head may flip (every dot is exact): 3·Σ ulp(M_i) + n·ulp(Σ|p_h|), plus the fp32 head sums
    assert new_bound == pytest.approx(3 * (2.0 ** -4 + 2.0 ** -4) + 2 * 2.0 ** -3, abs=1e-4)
    assert abs(total - full) <= new_bound
    assert run_rule("IDX.SCORE.TP", load_target("official")).status == PASS


def test_official_scores_stay_within_one_ulp_of_the_definition():
    """The measurement quoted in IDX.SCORE.ROUNDING's tolerance: the official BF16 einsum expression
    stays within 1 ulp of M on every score kind, and within the tolerance."""
    from dsv4spec.properties.indexer import SCORE_KINDS
    worst = 0.0
    for kind in SCORE_KINDS:
        for seed in range(30):
            rng = np.random.default_rng(seed)
            case = make_score_case(kind, seed, int(rng.integers(1, 6)), int(rng.choice([1, 2, 4, 8, 32, 64])),
                                   int(rng.choice([16, 128])), int(rng.integers(1, 60)))
            got = official.index_scores(*case.torch()).numpy().astype(np.float64)
            ref = spec.index_scores(case.q, case.k, case.w, case.visible)
            ulp = spec.bf16_quantum(spec.index_score_magnitude(case.q, case.k, case.w))
            finite = np.isfinite(ref)
            assert np.array_equal(np.isfinite(got), finite)
            err = np.abs(got[finite] - ref[finite])
            assert (err <= spec.index_score_tolerance(case.q, case.k, case.w)[finite]).all()
            worst = max(worst, float((err / ulp[finite]).max(initial=0.0)))
    assert worst <= 1.0


def test_a_head_whose_fp32_dot_crosses_a_midpoint_may_flip():
    """The thorough run's case: head 25's exact dot lies 2·10^8 below a BF16 midpoint, within the fp32
    accumulation bound, and the official einsum rounds it up: 3 ulps of M off, admitted."""
    case = make_score_case("wide_exponents", 35, 5, 32, 16, 35)
    got = official.index_scores(*case.torch()).numpy().astype(np.float64)[0, 8]
    ref = spec.index_scores(case.q, case.k, case.w, case.visible)[0, 8]
    ulp = spec.bf16_quantum(spec.index_score_magnitude(case.q, case.k, case.w))[0, 8]
    assert abs(got - ref) == 3 * ulp
    assert abs(got - ref) <= spec.index_score_tolerance(case.q, case.k, case.w)[0, 8]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=score_rows())
def test_topk_rows_drawn_have_finite_visible_scores(case):
    """A visible entry scoring −inf is outside the official domain (torch.topk may take an invisible
    −inf in its place, which the official code turns into −1): the top-k checks never draw one."""
    assert "minus_inf" not in ROW_KINDS
    assert np.isfinite(case.scores[spec.visibility_mask(case.visible, case.scores.shape[1])]).all()


def test_official_topk_is_int32_with_any_ties():
    rows = make_rows("equal", 2, 3, 33, 8)
    for order in ("score", "position"):
        got = official.index_topk(torch.tensor(rows.scores, dtype=torch.float32), torch.tensor(rows.visible), 8, order)
        assert got.dtype == torch.int32
    for rule_id in ("IDX.TOPK.COUNT", "IDX.TOPK.PAD", "IDX.TOPK.SELECTION", "IDX.TOPK.TIES", "IDX.TOPK.ORDER"):
        assert run_rule(rule_id, load_target("official")).status == PASS, rule_id


def test_chunked_prefill_is_an_extension_declared_by_impl_and_not_by_official():
    off, imp = load_target("official"), load_target("impl")
    for rule_id in ("IDX.CHUNK", "IDX.VISIBLE"):
        row = run_rule(rule_id, off)
        assert row.status == PASS and "extension chunked_prefill not declared" in row.detail
        assert set(run_rule(rule_id, imp).checks.values()) == {PASS}
    from types import SimpleNamespace
    chunk_only = SimpleNamespace(index_visible=official.index_visible)
    row = run_rule("IDX.VISIBLE", Target(chunk_only, "no-extensions"))
    assert row.checks["visible_count_of_a_chunk_from_any_start"] == SKIP


def test_a_declared_fp32_score_reaches_the_head_weights():
    """Issue 40: score_rounding=fp32 declared, the weight is kept in fp32 (raw · c, never rounded to
    BF16): IDX.WEIGHT.SCALE accepts it (it accepted BF16 weights only) and IDX.SCORE.ROUNDING reads
    VARIANT; the factor of a shard's heads, not the global count, still fails."""
    from dsv4spec.properties.suite import run_rule
    from dsv4spec.properties.target import Target
    from mutants import indexer as mutants
    port = Target(mutants.fp32_score_port(), "fp32")
    assert run_rule("IDX.WEIGHT.SCALE", port).status == "PASS"
    assert run_rule("IDX.SCORE.ROUNDING", port).status == "VARIANT"
    provider, rule_id = mutants.MUTANTS["fp32_weights_of_a_shards_heads"]
    assert run_rule(rule_id, Target(provider, "shard")).status == "FAIL"


def test_an_fp32_weight_is_admitted_within_eight_fp32_roundings_and_a_bf16_factor_is_not():
    """The fp32 admitted set (score_rounding=fp32): fl32(raw · fl32(c)) and the refactored
    fl32(fl32(raw · fl32(n^-0.5)) · fl32(128^-0.5)) inside it, raw times the BF16-rounded factor outside."""
    raw = spec.round_bf16(np.random.default_rng(3).standard_normal(4096) * 4)
    for m in (V4_FLASH, V4_1_FLASH):
        f32 = np.float32
        official = (raw.astype(f32) * f32(m.index_weight_scale)).astype(np.float64)
        refactored = ((raw.astype(f32) * f32(m.index_n_heads ** -0.5)) * f32(m.index_head_dim ** -0.5)).astype(np.float64)
        assert spec.index_weights_accepted(official, raw, m, "fp32").all()
        assert spec.index_weights_accepted(refactored, raw, m, "fp32").all()
        if m is V4_FLASH:             # V4.1's factor 1/64 is a power of two: every evaluation is exact there
            assert not spec.index_weights_accepted(official, raw, m, "bf16_steps").all()
            bf16_factor = raw * spec.round_bf16(np.float64(m.index_weight_scale))
            assert not spec.index_weights_accepted(bf16_factor, raw, m, "fp32").all()


def _fp32_in_order(q, k, w, relu_after_weight=False):
    """The score evaluated in fp32 one operation at a time (numpy keeps subnormals): each head's
    dot accumulated over d, ReLU, times its weight, the heads summed."""
    f32 = np.float32
    q, k, w = q.astype(f32), k.astype(f32), w.astype(f32)
    dots = np.zeros((q.shape[0], q.shape[1], k.shape[0]), f32)
    for d in range(q.shape[-1]):
        dots = dots + q[:, :, None, d] * k[None, None, :, d]
    terms = w[:, :, None] * (dots if relu_after_weight else np.maximum(dots, f32(0)))
    terms = np.maximum(terms, f32(0)) if relu_after_weight else terms
    total = np.zeros((q.shape[0], k.shape[0]), f32)
    for h in range(q.shape[1]):
        total = total + terms[:, h]
    return total.astype(np.float64)


def test_the_fp32_score_bound_weights_the_dots_underflow_by_the_head_weight():
    """Issue 40: dots of products near 2^-145 (4 significant bits left in fp32) and |w_h| = 2^20: a
    faithful fp32 evaluation lay 76-2301 times beyond the unweighted (D + H)·2^-149 and is inside
    Σ_h |w_h|·min(D·2^-150, l1_h) + H·2^-149; the ReLU applied after the weight still fails."""
    rng = np.random.default_rng(0)
    T, H, D, S = 2, 4, 128, 3
    q = spec.round_bf16(rng.uniform(1, 2, (T, H, D)) * 2.0 ** -73)
    k = spec.round_bf16(rng.uniform(1, 2, (S, D)) * 2.0 ** -73)
    w = 2.0 ** 20 * np.array([[1.0, -1.0, 1.0, -1.0]] * T)
    exact, tol = spec.index_scores(q, k, w, np.full(T, S), "fp32"), spec.index_score_tolerance(q, k, w, "fp32")
    faithful = _fp32_in_order(q, k, w)
    unweighted = (H + D) * 2.0 ** -24 * spec.weighted_l1(q, k, w) + (H + D) * 2.0 ** -149   # the old bound
    assert (np.abs(faithful - exact) > 50 * unweighted).any()
    assert (np.abs(faithful - exact) <= tol).all()
    assert (np.abs(_fp32_in_order(q, k, w, relu_after_weight=True) - exact) > tol).all()
