"""Checks of the lightning indexer rules (HAD.*, IDX.*).

Operation contract (torch CPU tensors in and out; a target provides any subset):

    hadamard(x [..., 128] f32|bf16) -> f32 [..., 128]
        bf16(H·x/√128), Sylvester H, no signs; x BF16-representable.
    index_rotate(x [..., 128], model: str) -> f32
        the model's rotation of indexer q/k: hadamard for v3.2/v4-*, identity for v4.1-flash.
    index_weights(raw_w [T, H] f32, model: str) -> f32 [T, H]
        bf16(raw_w · fl32(index_head_dim^-0.5 · index_n_heads^-0.5)); H must be the model's
        global index_n_heads.  index_scores takes weights already scaled by this op.
    index_weights_v32(raw_w [T, 64] f32, q_scale [T, 64] f32) -> f32 [T, 64]
        V3.2: fl32(fl32(bf16(raw_w · 2^-3) · q_scale) · fl32(128^-0.5)); q_scale the powers of two of
        act_quant(q, 128), one per token and head.
    index_scores(q [T,H,D], k [S,D], w [T,H], visible int64 [T], score_dtype="bf16") -> f32 [T,S]
        Σ_h w·ReLU(q·k); 'bf16' rounds every step (V4/V4.1; q, k, w BF16-representable),
        'fp32' none (V3.2); −inf exactly where s ≥ visible[t].
    index_scores_raw(q [T,H,D], k [S,D], raw_w [T,H], visible [T], model: str) -> f32 [T,S]
        the official factorisation in one call: index_scores(q, k, index_weights(raw_w, model),
        visible) with the model's score dtype, raw_w of any head count (a shard's: the factor is the
        model's global one), for code that scales the raw weights itself; a
        target offering it instead of the two is checked by the same rules (IDX.WEIGHT.SCALE
        through one-hot q and k, the IDX.SCORE rules through V4.1's exact factor 2^-6).
    index_scores_fp4(q_packed u8 [T,H,D/2], q_scales u8 [T,H,D/32], k_packed u8 [S,D/2],
                     k_scales u8 [S,D/32], w [T,H], visible [T]) -> f32 [T,S]
        index_scores of the dequantized E2M1 × E8M0 values (element 2i in the low nibble), 'bf16'.
    index_visible(positions int64 [T], ratio: int) -> int64 [T]     (p + 1) // ratio
    index_topk(scores f32 [T,S], visible int64 [T], k: int, order: str) -> int64 [T,k]
        the k best entries among s < visible[t]; order 'score' (V4, descending) or 'position'
        (V4.1, ascending); min(k, visible[t]) valid entries then −1.

Bad input (mismatched shapes, NaN, unknown model/order/dtype, k outside [0, S]) raises
ValueError/TypeError naming what was expected.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import assume, strategies as st

from ..spec import indexer as spec
from ..spec.models import PROFILES, profile
from ..spec.formats import e4m3_decode
from ..spec.quant import fp4_e8m0_dequantize
from ..spec.rules import V4_ALL
from .compare import as_numpy, assert_close, assert_equal, difference_kind  # noqa: F401
from .ranking import assert_topk
from .checking import check, forall

__all__ = ["OPS", "ScoreCase", "score_cases", "expected_scores", "RowsCase", "score_rows"]

OPS = {
    "hadamard": "hadamard(x [..., 128]) -> f32: bf16(H·x/√128), Sylvester H, no random signs",
    "index_rotate": "index_rotate(x [..., 128], model) -> f32: Hadamard for v3.2/v4, identity for v4.1",
    "index_weights": "index_weights(raw_w [T, H], model) -> f32 [T, H]: bf16(raw · fl32(128^-0.5·H^-0.5))",
    "index_weights_v32": "index_weights_v32(raw_w [T, 64], q_scale [T, 64]) -> f32 [T, 64]: V3.2, "
                         "fl32(bf16(raw · 2^-3) · q_scale · fl32(128^-0.5))",
    "index_scores": "index_scores(q [T,H,D], k [S,D], w [T,H], visible [T], score_dtype='bf16') -> f32 [T,S]",
    "index_scores_fp4": "index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible) -> f32 [T,S]",
    "index_scores_fp8": "index_scores_fp8(q_codes u8 [T,H,D], k_codes u8 [S,D], k_scale f32 [S], w f32 [T,H], visible) "
                        "-> f32 [T,S]: V3.2's logits from E4M3 q and k, Σ_h w·ReLU(q·k)·k_scale in fp32 (w carries q's scale)",
    "index_scores_fp8_cache": "index_scores_fp8_cache(q_codes u8 [T,H,D], cache u8, form, w f32 [T,H], visible) -> f32 "
                              "[T,S]: index_scores_fp8 over a V3.2 indexer K cache (form: v32_index_k entries [S,132], "
                              "or v32_index_k/deepgemm_paged pages of 64, S their entries)",
    "index_scores_raw": "index_scores_raw(q [T,H,D], k [S,D], raw_w [T,H], visible [T], model) -> f32 [T,S]: "
                        "the official factorisation, raw weights in (instead of index_weights + index_scores)",
    "index_visible": "index_visible(positions int64 [T], ratio) -> int64 [T]: (p + 1) // ratio",
    "index_topk": "index_topk(scores [T,S], visible [T], k, order) -> int64 [T,k]: −1 at the tail",
}


def _t(x, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=dtype)


def _bf16(rng, shape, scale=1.0) -> np.ndarray:
    return spec.round_bf16(rng.standard_normal(shape) * scale)


# ------------------------------------------------------------------------------------------------
# score cases
# ------------------------------------------------------------------------------------------------
@dataclass
class ScoreCase:
    """Indexer inputs: BF16-valued q [T,H,D], k [S,D], w [T,H] and visible counts [T]."""
    label: str
    q: np.ndarray
    k: np.ndarray
    w: np.ndarray
    visible: np.ndarray

    def __repr__(self):
        T, H, D = self.q.shape
        return f"ScoreCase({self.label!r}, T={T} H={H} D={D} S={self.k.shape[0]}, visible={self.visible.tolist()})"

    def torch(self, dtype=torch.float32):
        return _t(self.q), _t(self.k), _t(self.w), _t(self.visible, torch.int64)


SCORE_KINDS = ("normal", "relu_zero", "ties", "cancel", "wide_exponents")


def make_score_case(kind: str, seed: int, T: int, H: int, D: int, S: int, fp32: bool = False) -> ScoreCase:
    rng = np.random.default_rng(seed)
    rnd = spec.round_fp32 if fp32 else spec.round_bf16
    q, k = rng.standard_normal((T, H, D)), rng.standard_normal((S, D))
    w = rng.standard_normal((T, H)) * 0.05
    if kind == "relu_zero":                  # most heads' dots negative: many exact zeros in the score
        q, k = -np.abs(q), np.abs(k)
        q[:, : max(1, H // 4)] *= -1
        q[0] = -np.abs(q[0])                 # a row whose every score is 0
    elif kind == "ties":                     # small integers: colliding dots and scores
        q, k = rng.integers(-1, 2, (T, H, D)).astype(float), rng.integers(-1, 2, (S, D)).astype(float)
        w = rng.integers(-2, 3, (T, H)) / 8.0
    elif kind == "cancel":                   # signed weights of equal size, dots near BF16 midpoints
        w = np.where(np.arange(H) % 2 == 0, 1.0, -1.0)[None, :] * np.ones((T, 1))
        k = np.zeros((S, D))
        k[:, 0], k[:, 1] = 1.0, rng.integers(1, 4, S) * 2.0 ** -5
        q = np.zeros((T, H, D))
        q[:, :, 0], q[:, :, 1] = 1.0, 2.0 ** -4
    elif kind == "wide_exponents":
        q = q * 2.0 ** rng.integers(-30, 30, (T, H, D))
        k = k * 2.0 ** rng.integers(-30, 30, (S, D))
    elif kind == "absorb":                   # positive dots, head 0's 2^9 times the others' (w = 1): a
        q, k, w = np.abs(q), np.abs(k), np.ones((T, H))     # BF16 running sum would absorb the small heads
        q[:, 0] *= 2.0 ** 9
    visible = rng.integers(0, S + 1, T)
    visible[rng.integers(0, T)] = S
    return ScoreCase(f"{kind}/seed={seed}", rnd(q), rnd(k), rnd(w), visible.astype(np.int64))


@st.composite
def score_cases(draw, kinds=SCORE_KINDS, fp32: bool = False, max_t: int = 5):
    return make_score_case(draw(st.sampled_from(kinds)), draw(st.integers(0, 2 ** 32 - 1)),
                           draw(st.integers(1, max_t)), draw(st.sampled_from((1, 2, 4, 8, 32))),
                           draw(st.sampled_from((16, 128))), draw(st.integers(1, 40)), fp32)


def cancellation_case() -> ScoreCase:
    """32 heads, w = ±1 alternating, dots 1+3·2^-9 (even heads) and 1+2^-9 (odd heads).

    BF16 steps: 16·(1+2^-7) − 16·1 = 0.125;  fp32 then one cast: 16·2·2^-9 = 0.0625."""
    q = np.zeros((1, 32, 128))
    q[0, :, 0] = 1.0
    q[0, ::2, 1] = 3 * 2.0 ** -9
    q[0, 1::2, 1] = 2.0 ** -9
    k = np.zeros((2, 128))
    k[:, 0], k[:, 1] = 1.0, 1.0
    w = np.where(np.arange(32) % 2 == 0, 1.0, -1.0)[None, :]
    return ScoreCase("cancellation (IDX.SCORE.ROUNDING differs)", q, k, w, np.array([2]))


def tp_cancellation_case() -> ScoreCase:
    """32 heads in 2 shards of 16; p_h = 0.5 or 0.50390625 (7 of them) in shard 0, −0.5 in shard 1.

    Shard 0 sums to 8 + 7·2^-8, which BF16 rounds to 8 (ulp 2^-4); shard 1 to −8: the all-reduce
    gives 0.0 where the full score is 7·2^-8 — far more than 2 ulps of any head term."""
    q = np.zeros((1, 32, 16))
    q[0, :, 0] = 0.5
    q[0, :7, 0] = 0.50390625
    k = np.zeros((1, 16))
    k[0, 0] = 1.0
    w = np.where(np.arange(32) < 16, 1.0, -1.0)[None, :]
    return ScoreCase("BF16 shard partials that cancel", q, k, w, np.array([1]))


def absorption_case() -> ScoreCase:
    """32 heads, w = 1: one head's dot 256 (in row 1: 2^-4·256), 31 heads' dots 1 (2^-4).

    The head sum is accumulated in fp32 then rounded once: 256 + 31 = 287 → 288.  A BF16
    accumulator absorbs every 1 (256 + 1 is a tie, back to 256): 256, 8 BF16 ulps away."""
    q = np.zeros((2, 32, 128))
    q[:, 0, 0], q[:, 1:, 0] = 256.0, 1.0
    q[1] *= 2.0 ** -4
    k = np.zeros((3, 128))
    k[:, 0] = (1.0, 0.5, -1.0)
    return ScoreCase("one large head absorbs 31 small ones in a BF16 accumulator", q, k, np.ones((2, 32)),
                     np.array([3, 2]))


def all_negative_case() -> ScoreCase:
    """Every visible score negative: a masked 0 would outrank them all."""
    q = np.ones((2, 1, 16))
    k = np.ones((5, 16))
    return ScoreCase("all visible scores −16 (w = −1)", q, k, -np.ones((2, 1)), np.array([1, 3]))


def expected_scores(target, case: ScoreCase, score_dtype: str = "bf16"):
    """(reference scores, tolerance) for this target's declared score_rounding."""
    return scores_under(target.variant("score_rounding"), case, score_dtype)


def scores_under(variant: str, case: ScoreCase, score_dtype: str = "bf16"):
    """(reference scores, tolerance) under score_rounding = `variant`."""
    if score_dtype == "fp32":
        return (spec.index_scores(case.q, case.k, case.w, case.visible, "fp32"),
                spec.index_score_tolerance(case.q, case.k, case.w, "fp32"))
    if variant == "bf16_steps":
        return (spec.index_scores(case.q, case.k, case.w, case.visible, "bf16"),
                spec.index_score_tolerance(case.q, case.k, case.w, "bf16"))
    exact = spec.index_scores(case.q, case.k, case.w, case.visible, "fp32")
    tol = spec.index_score_tolerance(case.q, case.k, case.w, "fp32")
    if variant == "fp32":
        return exact, tol
    return spec.round_bf16(exact), tol + spec.bf16_quantum(exact)


SCORE_DTYPE_MODELS = {"bf16": V4_ALL, "fp32": spec.V32}   # the models whose indexer asks for each score dtype


def _scores(target, case: ScoreCase, score_dtype: str = "bf16") -> np.ndarray:
    target.asked_for(*SCORE_DTYPE_MODELS[score_dtype])
    return as_numpy(target.index_scores(*case.torch(), score_dtype)).astype(np.float64)


def _assert_bf16_scores(target, got, what: str, case):
    """The finite scores are BF16 values (I = bf16(Σ_h p_h)) unless the target declares fp32 scores:
    the tolerance alone would admit the unrounded head sum."""
    if target.variant("score_rounding") == "fp32":
        return
    finite = got[np.isfinite(got)]
    off = finite[~spec.is_bf16(finite)]
    assert off.size == 0, f"{what}: {off.size} scores not BF16-representable, e.g. {off[0]!r} [{case!r}]"


def _assert_scores(got, ref, tol, what: str, case):
    """Finite references within tol; ±inf exactly where the reference has them."""
    g, r = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        raise AssertionError(f"{what}: shape {g.shape}, expected {r.shape} [{case!r}]")
    with np.errstate(invalid="ignore"):
        err = np.abs(g - r)
    bad = np.argwhere(np.where(np.isfinite(r), ~(err <= tol), g != r))
    if bad.size:
        lines = [f"{what}: {len(bad)} of {r.size} scores off [{case!r}]"]
        for t, s in bad[:4]:
            lines.append(f"  at (t={t}, s={s}): got {g[t, s]!r}, expected {r[t, s]!r} ± {tol[t, s]:.3g}")
        raise AssertionError("\n".join(lines))


# ------------------------------------------------------------------------------------------------
# HAD
# ------------------------------------------------------------------------------------------------
HADAMARD_MODELS = tuple(m for m in PROFILES.values() if m.hadamard)


@check("HAD.MATRIX", ops=("hadamard",))
@forall(dict(exponent=0, sign=1.0), exponent=st.integers(-40, 40), sign=st.sampled_from((1.0, -1.0)))
def hadamard_maps_basis_vectors_to_scaled_columns(target, exponent, sign):
    x = np.eye(spec.HADAMARD_DIM) * sign * 2.0 ** exponent
    assert_equal(target.hadamard(_t(x)), spec.hadamard(x).astype(np.float32),
                 what=f"HAD.MATRIX: hadamard(±2^{exponent}·e_j) must be column j of H·bf16(2^{exponent}/√128)",
                 context=lambda i: f"input e_{i[0]}, H[{i[1]}, {i[0]}] = {spec.sylvester_hadamard()[i[1], i[0]]}")


@check("HAD.MATRIX", ops=("index_rotate",))
@forall(model=st.sampled_from([m.name for m in HADAMARD_MODELS]), exponent=st.integers(-8, 8))
def index_rotate_is_the_hadamard_in_v32_and_v4(target, model, exponent):
    x = np.eye(spec.HADAMARD_DIM) * 2.0 ** exponent
    assert_equal(target.index_rotate(_t(x), model), spec.hadamard(x).astype(np.float32),
                 what=f"HAD.MATRIX: index_rotate(2^{exponent}·e_j, {model!r}) must be the Sylvester Hadamard")


@check("HAD.ROUNDING", ops=("hadamard",))
@forall(dict(seed=0, rows=1, spread=30), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 8), spread=st.sampled_from((0, 4, 30)))
def hadamard_output_is_bf16_within_one_ulp(target, seed, rows, spread):
    rng = np.random.default_rng(seed)
    x = spec.round_bf16(rng.standard_normal((rows, 128)) * 2.0 ** rng.integers(-spread, spread + 1, (rows, 128)))
    got = as_numpy(target.hadamard(_t(x))).astype(np.float64)
    if not spec.is_bf16(got).all():
        raise AssertionError(f"HAD.ROUNDING: output not BF16-representable, e.g. {got[~spec.is_bf16(got)][:3]}")
    exact = (x @ spec.sylvester_hadamard().T) * spec.HADAMARD_SCALE
    _within(got, exact, spec.hadamard_tolerance(x), "HAD.ROUNDING: hadamard(x) vs H·x/√128 (1 BF16 ulp + fp32 order)")


def _within(got, ref, tol, what):
    err = np.abs(got - ref)
    off = ~(err <= tol)
    bad = np.argwhere(off)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} elements off; at {i}: got {got[i]!r}, exact {ref[i]!r} "
                             f"± {tol[i]:.3g}; {difference_kind(got, ref, off)}")


@check("HAD.ABSENT_V41", ops=("index_rotate",))
@forall(dict(seed=0, rows=1), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 4))
def v41_indexer_is_not_rotated(target, seed, rows):
    x = _bf16(np.random.default_rng(seed), (rows, 128))
    assert_equal(target.index_rotate(_t(x), "v4.1-flash"), x.astype(np.float32),
                 what="HAD.ABSENT_V41: index_rotate(x, 'v4.1-flash') must return x (no Hadamard in V4.1)")


# ------------------------------------------------------------------------------------------------
# IDX.WEIGHT / IDX.SCORE
# ------------------------------------------------------------------------------------------------
@check("IDX.WEIGHT.SCALE", ops=("index_weights",))
@forall(dict(model="v4.1-flash", seed=0, rows=1), dict(model="v4-flash", seed=0, rows=1), model=st.sampled_from(V4_ALL), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 4))
def head_weights_carry_the_global_factor(target, model, seed, rows):
    m = profile(model)
    rng = np.random.default_rng(seed)
    # half the heads 2^-122 smaller: their weights are BF16 subnormals, often ties (BF16 holds these)
    raw = spec.round_bf16(_bf16(rng, (rows, m.index_n_heads), 4.0)
                          * np.where(rng.random((rows, m.index_n_heads)) < 0.5, 2.0 ** -122, 1.0))
    got = as_numpy(target.index_weights(_t(raw), model)).astype(np.float64)
    assert_weights(got, raw, m, f"IDX.WEIGHT.SCALE: {model} weights must be raw · "
                                f"{m.index_weight_scale:.9g} rounded to BF16", target.variant("score_rounding"))


@check("IDX.WEIGHT.SCALE", ops=("index_scores_raw",))
@forall(dict(model="v4-flash", seed=0, rows=1), dict(model="v4.1-flash", seed=0, rows=1),
        model=st.sampled_from(V4_ALL), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 3))
def raw_weights_carry_the_global_factor_into_the_scores(target, model, seed, rows):
    """Through the official factorisation: with q[t, h] and k[s] one-hot (q·k = [h = s]), score[t, s]
    is the scaled weight of head s alone."""
    m = profile(model)
    heads, dim = m.index_n_heads, m.index_head_dim
    raw = _bf16(np.random.default_rng(seed), (rows, heads), 4.0)
    q = np.broadcast_to(np.eye(heads, dim, dtype=np.float32), (rows, heads, dim)).copy()
    k = np.eye(heads, dim, dtype=np.float32)
    visible = np.full(rows, heads, dtype=np.int64)
    got = as_numpy(target.index_scores_raw(_t(q), _t(k), _t(raw), _t(visible, torch.int64), model))
    assert_weights(got.astype(np.float64), raw, m, f"IDX.WEIGHT.SCALE (index_scores_raw): {model} weights must "
                   f"be raw · {m.index_weight_scale:.9g} rounded to BF16, and no other factor",
                   target.variant("score_rounding"))


def assert_weights(got, raw, model, what, rounding: str = "bf16_steps"):
    """got holds, element by element, an accepted weight raw · c under score_rounding = `rounding`."""
    if got.shape != raw.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {raw.shape}")
    off = ~spec.index_weights_accepted(got, raw, model, rounding)
    bad = np.argwhere(off)
    if bad.size:
        i = tuple(bad[0])
        fp32 = "" if rounding == "bf16_steps" else (f" or, score_rounding={rounding}, "
                                                    f"{raw[i] * model.index_weight_scale!r} within "
                                                    f"{spec.WEIGHT_FP32_ROUNDINGS} fp32 roundings")
        raise AssertionError(f"{what}: {len(bad)} elements off; at {i}: raw {raw[i]!r} gave {got[i]!r}, "
                             f"accepted {spec.index_weights(raw, model)[i]!r} (official) or "
                             f"{spec.index_weights_once(raw, model)[i]!r} (one rounding){fp32}; "
                             f"{difference_kind(got, spec.index_weights(raw, model), off)}")


@check("IDX.WEIGHT.V32", ops=("index_weights_v32",))
@forall(dict(seed=0, rows=1, spread=0), seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 4),
        spread=st.integers(0, 30))
def v32_weights_are_fp32_and_carry_the_q_scale(target, seed, rows, spread):
    rng = np.random.default_rng(seed)
    # half the heads 2^-125 smaller: bf16(raw·2^-3) is then a BF16 subnormal, often a tie (BF16 holds these)
    raw = spec.round_bf16(_bf16(rng, (rows, 64), 4.0) * np.where(rng.random((rows, 64)) < 0.5, 2.0 ** -125, 1.0))
    q_scale = np.ldexp(1.0, rng.integers(-spread - 8, spread // 3 + 1, (rows, 64)))    # act_quant's powers of two
    got = as_numpy(target.index_weights_v32(_t(raw), _t(q_scale))).astype(np.float64)
    want = spec.index_weights_v32(raw, q_scale, profile("v3.2"))
    assert_equal(got, want, what="IDX.WEIGHT.V32: w = fl32(fl32(bf16(raw·2^-3)·q_scale)·fl32(128^-0.5))",
                 context=lambda i: f"raw {raw[i]!r}, q_scale {q_scale[i]!r}")


@check("IDX.SCORE.FORMULA", ops=("index_scores",))
@forall(dict(case=all_negative_case(), score_dtype="bf16"), case=score_cases(kinds=("normal", "relu_zero", "ties")), score_dtype=st.sampled_from(spec.SCORE_DTYPES))
def score_is_weighted_sum_of_relu_dots(target, case, score_dtype):
    """Loose tolerance (2^-5 of Σ_h |w_h·s_h|): the formula, whatever the rounding scheme."""
    got = _scores(target, case, score_dtype)
    ref = spec.index_scores(case.q, case.k, case.w, case.visible, "fp32")
    dots = np.einsum("thd,sd->ths", case.q, case.k)
    scale = (np.abs(dots) * np.abs(case.w)[:, :, None]).sum(axis=1)
    _assert_scores(got, ref, 2.0 ** -5 * scale + 1e-30, f"IDX.SCORE.FORMULA ({score_dtype})", case)


@check("IDX.SCORE.ROUNDING", ops=("index_scores",))
# a head's fp32 dot on the other side of a BF16 midpoint (found by a thorough run of the official code)
@forall(dict(case=cancellation_case()), dict(case=make_score_case("wide_exponents", 35, 5, 32, 16, 35)),
        dict(case=absorption_case()), case=score_cases(kinds=("absorb",) + SCORE_KINDS))
def bf16_score_rounds_every_step(target, case):
    ref, tol = expected_scores(target, case)
    got = _scores(target, case)
    _assert_bf16_scores(target, got, "IDX.SCORE.ROUNDING", case)
    _assert_scores(got, ref, tol, "IDX.SCORE.ROUNDING (index_score_tolerance)", case)


@check("IDX.SCORE.V32_FP32", ops=("index_scores",))
@forall(dict(case=cancellation_case()), case=score_cases(kinds=("normal", "cancel", "wide_exponents"), fp32=True))
def v32_score_is_fp32(target, case):
    ref, tol = expected_scores(target, case, "fp32")
    _assert_scores(_scores(target, case, "fp32"), ref, tol, "IDX.SCORE.V32_FP32 ((D+H)·2^-24 bound)", case)


@check("IDX.SCORE.FP4", ops=("index_scores_fp4",))
@forall(dict(seed=0, T=2, H=32, S=16, D=128, disjoint=False), dict(seed=0, T=1, H=4, S=3, D=32, disjoint=True),
        seed=st.integers(0, 2 ** 32 - 1), T=st.integers(1, 4), H=st.sampled_from((1, 4, 32)), S=st.integers(1, 24),
        D=st.sampled_from((32, 128)), disjoint=st.booleans())
def fp4_scores_are_scores_of_dequantized_values(target, seed, T, H, S, D, disjoint):
    """disjoint: q's nonzero codes only where k's are ±0 and the reverse, every dot exactly 0, with k
    scales 2^73 .. 2^121: a zero code dequantized to anything but ±0 (±2^-149 × 2^73 ≥ 2^-76, a
    BF16 normal) shows; the scales' product stays finite (≤ 2^124) for a kernel that multiplies them first."""
    rng = np.random.default_rng(seed)
    q_codes = rng.integers(0, 16, (T, H, D), dtype=np.uint8)
    k_codes = rng.integers(0, 16, (S, D), dtype=np.uint8)
    k_scale_range = (118, 131)
    if disjoint:
        k_side = rng.random(D) < 0.5
        q_codes = np.where(k_side, q_codes & 8, q_codes)        # ±0 where k may be nonzero
        k_codes = np.where(k_side, k_codes, k_codes & 8)        # ±0 where q may be nonzero
        k_scale_range = (200, 249)                               # 2^73 .. 2^121
    q_packed = q_codes[..., 0::2] | (q_codes[..., 1::2] << 4)
    k_packed = k_codes[..., 0::2] | (k_codes[..., 1::2] << 4)
    q_scales = rng.integers(118, 131, (T, H, D // 32), dtype=np.uint8)
    k_scales = rng.integers(*k_scale_range, (S, D // 32), dtype=np.uint8)
    case = ScoreCase(f"fp4/seed={seed}" + ("/disjoint" * disjoint), fp4_e8m0_dequantize(q_packed, q_scales).astype(np.float64),
                     fp4_e8m0_dequantize(k_packed, k_scales).astype(np.float64),
                     _bf16(rng, (T, H), 0.05), rng.integers(0, S + 1, T).astype(np.int64))
    got = target.index_scores_fp4(*(torch.from_numpy(a) for a in (q_packed, q_scales, k_packed, k_scales)),
                                  _t(case.w), _t(case.visible, torch.int64))
    ref, tol = expected_scores(target, case)
    got = as_numpy(got).astype(np.float64)
    _assert_bf16_scores(target, got, "IDX.SCORE.FP4", case)
    _assert_scores(got, ref, tol, "IDX.SCORE.FP4 (vs dequantized E2M1·2^(e−127))", case)


def _signed(rng, codes, same_sign: bool) -> np.ndarray:
    """codes with a random sign bit (none where same_sign) and about one in eight set to +0."""
    signs = 0 if same_sign else rng.integers(0, 2, codes.shape, dtype=np.uint8) << 7
    return np.where(rng.random(codes.shape) < 0.125, 0, codes | signs).astype(np.uint8)


def _mma_exact_codes(rng, T, H, S, same_sign: bool) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 q [T,H,128] and k [S,128] codes whose every head dot an FP8 tensor core computes exactly.

    V3.2's fp8_index multiplies the FP8 tiles with T.gemm (V32-kernel L231-238): on Hopper an FP8 MMA whose
    accumulator keeps about 13 fraction bits (FP8.LINEAR's model; DeepSeek-V3 §3.3.2, "around 14 bits"),
    so on arbitrary codes its dots are not fp32's.  Here each q row is ±2^a or ±2^(a+1) (one a a row) and
    each k row one binade, (1 + m/8)·2^b with any m: every product is a multiple of g = 2^(a+b−3) of at most
    30g, so every partial sum of the 128 is a multiple of g below 3840g < 2^12·g, exact in any accumulator
    of 11 or more fraction bits, in any order.  What remains is fp32's: the scale, ReLU, weights and head sum."""
    a = rng.integers(1, 15, (T, H, 1))                          # exponent fields 1..14 (2^-6 .. 2^7)
    q = ((a + rng.integers(0, 2, (T, H, 128))) << 3).astype(np.uint8)
    b = rng.integers(1, 16, (S, 1))                             # fields 1..15, mantissa 7 left out at 15 (NaN)
    k = ((b << 3) | rng.integers(0, np.where(b == 15, 7, 8), (S, 128))).astype(np.uint8)
    return _signed(rng, q, same_sign), _signed(rng, k, same_sign)


def _fp8_weights(rng, T, H, same_sign: bool) -> np.ndarray:
    w = rng.standard_normal((T, H)) * 2.0 ** -12
    return (np.abs(w) if same_sign else w).astype(np.float32)


def _assert_fp8_scores(got, case, what: str):
    """The fp32 score of the dequantized values, within the fp32 bound (the dots are exact)."""
    ref = spec.index_scores(case.q, case.k, case.w, case.visible, "fp32")
    _assert_scores(as_numpy(got), ref, spec.index_score_tolerance(case.q, case.k, case.w, "fp32"),
                   f"IDX.SCORE.V32_FP32 ({what}: fp32 bound, dots exact in an FP8 MMA)", case)


@check("IDX.SCORE.V32_FP32", ops=("index_scores_fp8",))
@forall(seed=st.integers(0, 2 ** 32 - 1), T=st.integers(1, 4), H=st.sampled_from((1, 4, 64)), S=st.integers(1, 24),
        same_sign=st.booleans())
def fp8_scores_are_fp32_scores_of_dequantized_values(target, seed, T, H, S, same_sign):
    """V3.2's indexer in FP8 (V32-model fp8_index: E4M3 q and k of 128 dims, k's fp32 power-of-two scale
    per entry, the weights carrying q's scale): the fp32 score of the dequantized q and k, k's scale
    2^-10 .. 2^10 (every product exact in fp32), on codes whose dots an FP8 MMA keeps exact
    (_mma_exact_codes); same_sign draws positive codes and weights, where a BF16 rounding of the score
    departs most."""
    rng = np.random.default_rng(seed)
    H = target.fit_size("index_scores_fp8", "H", H)
    q_codes, k_codes = _mma_exact_codes(rng, T, H, S, same_sign)
    k_scale = (2.0 ** rng.integers(-10, 11, S)).astype(np.float32)
    w = _fp8_weights(rng, T, H, same_sign)
    q, k = e4m3_decode(q_codes).astype(np.float64), e4m3_decode(k_codes) * k_scale[:, None].astype(np.float64)
    case = ScoreCase(f"fp8/seed={seed}", q, k, w.astype(np.float64), rng.integers(0, S + 1, T).astype(np.int64))
    got = target.index_scores_fp8(torch.from_numpy(q_codes), torch.from_numpy(k_codes), torch.from_numpy(k_scale),
                                  torch.from_numpy(w), _t(case.visible, torch.int64))
    _assert_fp8_scores(got, case, "FP8 q and k")


@check("IDX.SCORE.V32_FP32", ops=("index_scores_fp8_cache",))
@forall(seed=st.integers(0, 2 ** 32 - 1), T=st.integers(1, 4), H=st.sampled_from((1, 4, 64)), pages=st.integers(1, 2),
        same_sign=st.booleans())
def fp8_cache_scores_are_fp32_scores_of_the_unpacked_keys(target, seed, T, H, pages, same_sign):
    """The same over V3.2's indexer K cache (LAYOUT.V32.INDEX_K entries, in the form the target takes):
    entries written from the codes and an fp32 scale per entry of 2^-10 .. 2^10 with any fraction (the
    scales act_quant's amax/448 gives), read back by the target."""
    from ..spec import layout as spec_layout
    rng = np.random.default_rng(seed)
    H, S = target.fit_size("index_scores_fp8_cache", "H", H), pages * spec_layout.PAGE
    form = next((f for f in target.cache_forms_of("v32_index_k")), "v32_index_k")
    q_codes, k_codes = _mma_exact_codes(rng, T, H, S, same_sign)
    k_scale = (rng.uniform(1, 2, (S, 1)) * 2.0 ** rng.integers(-10, 10, (S, 1))).astype(np.float32)
    fields = spec_layout.encode_fields("v32_index_k", np.zeros((S, 128), np.float32))
    entries = spec_layout.join("v32_index_k", {**fields, "payload": k_codes, "scales": spec_layout.le_bytes(k_scale)})
    w = _fp8_weights(rng, T, H, same_sign)
    case = ScoreCase(f"fp8 cache/seed={seed}", e4m3_decode(q_codes).astype(np.float64),
                     spec_layout.unpack("v32_index_k", entries).astype(np.float64), w.astype(np.float64),
                     rng.integers(0, S + 1, T).astype(np.int64))
    got = target.index_scores_fp8_cache(torch.from_numpy(q_codes), torch.from_numpy(spec_layout.as_cache(form, entries)),
                                        form, torch.from_numpy(w), _t(case.visible, torch.int64))
    _assert_fp8_scores(got, case, f"FP8 q, a {form} K cache")


@check("IDX.SCORE.TP", ops=("index_scores",))
@forall(dict(case=tp_cancellation_case(), shards=2), case=score_cases(kinds=("normal", "relu_zero")),
        shards=st.sampled_from((2, 4)))
def head_shards_sum_to_the_full_score(target, case, shards):
    H = case.q.shape[1]
    if H % shards:
        shards = H if H > 1 else 1
    parts = np.array_split(np.arange(H), shards)
    total = None
    for heads in parts:
        partial = _scores(target, _shard(case, heads))
        total = partial if total is None else spec.round_bf16(total + partial)   # BF16 all-reduce
    assert_sharded_scores(target, total, case, parts, f"IDX.SCORE.TP ({len(parts)} head shards, BF16 all-reduce)")


def _shard(case: ScoreCase, heads) -> ScoreCase:
    return ScoreCase(case.label, case.q[:, heads], case.k, case.w[:, heads], case.visible)


def assert_sharded_scores(target, got, case: ScoreCase, parts, what: str):
    """got: the BF16 all-reduce of the partial scores of the head shards `parts`, within the bound
    of the all-reduce and of each shard's own scores of the full score (IDX.SCORE.TP)."""
    tol = spec.index_score_allreduce_tolerance(case.q, case.k, case.w, parts)
    for heads in parts:
        tol = tol + expected_scores(target, _shard(case, heads))[1]           # each shard's own bound
    _assert_scores(got, expected_scores(target, case)[0], tol, what, case)


# ------------------------------------------------------------------------------------------------
# IDX: visibility, mask, chunks
# ------------------------------------------------------------------------------------------------
# decode positions 2 before to 1 after a multiple of 128 (so of every ratio): p + 1 on a multiple of
# the ratio, one position before and one after, drawn often
NEAR_MULTIPLES_OF_128 = st.builds(lambda m, d: max(0, 128 * m + d), st.integers(0, 8000), st.sampled_from((-2, -1, 0, 1)))


def _visible_rows(target, positions, ratio, what):
    target.asked_for(*(m for m in PROFILES if ratio in PROFILES[m].compress_ratios))
    got = target.index_visible(_t(positions, torch.int64), ratio)
    assert_equal(got, spec.index_visible(positions, ratio),
                 what=f"IDX.VISIBLE: visible(p) = (p + 1) // {ratio} ({what})", context=lambda i: f"p = {positions[i[0]]}")


@check("IDX.VISIBLE", ops=("index_visible",))
@forall(dict(ratio=4, T=9, decode=0), dict(ratio=128, T=3, decode=126), ratio=st.sampled_from((1, 2, 4, 128)),
        T=st.integers(1, 16), decode=st.one_of(st.integers(0, 10 ** 6), NEAR_MULTIPLES_OF_128))
def visible_count_in_prefill_and_decode(target, ratio, T, decode):
    _visible_rows(target, np.arange(T), ratio, "one prefill chunk from position 0")
    for p in (decode, decode + 1, decode + ratio - 1):        # decode: one token, end_pos = p + 1
        _visible_rows(target, np.array([p]), ratio, f"decode of position {p}: end_pos // ratio entries")


@check("IDX.VISIBLE", ops=("index_visible",), extension="chunked_prefill")
@forall(dict(ratio=128, T=3, start=126), ratio=st.sampled_from((1, 2, 4, 128)), T=st.integers(1, 16),
        start=st.integers(1, 10 ** 6))
def visible_count_of_a_chunk_from_any_start(target, ratio, T, start):
    _visible_rows(target, start + np.arange(T), ratio, f"a prefill chunk starting at position {start}")


@check("IDX.MASK", ops=("index_scores",))
@forall(dict(case=all_negative_case(), score_dtype="bf16"), case=score_cases(), score_dtype=st.sampled_from(spec.SCORE_DTYPES))
def invisible_entries_score_minus_inf(target, case, score_dtype):
    got = _scores(target, case, score_dtype)
    invisible = ~spec.visibility_mask(case.visible, case.k.shape[0])
    expected = np.where(invisible, -np.inf, 0.0)
    shown = np.where(invisible | ~np.isfinite(got), got, 0.0)
    assert_equal(shown, expected, what=f"IDX.MASK: −inf exactly at s ≥ visible[t] ({score_dtype}) [{case!r}]",
                 context=lambda i: f"visible[{i[0]}] = {case.visible[i[0]]}")


@check("IDX.CHUNK", ops=("index_scores",), extension="chunked_prefill")
@forall(dict(case=make_score_case("normal", 5, 4, 4, 16, 12), cut=1, length=2),
        case=score_cases(max_t=6), cut=st.integers(0, 5), length=st.integers(1, 6))
def chunk_rows_equal_prefill_rows(target, case, cut, length):
    T = case.q.shape[0]
    full = _scores(target, case)
    _, tol = expected_scores(target, case)
    a = min(cut, T - 1)
    b = min(a + length, T)
    chunk = ScoreCase(case.label, case.q[a:b], case.k, case.w[a:b], case.visible[a:b])
    _assert_scores(_scores(target, chunk), full[a:b], 2 * tol[a:b], f"IDX.CHUNK: rows [{a}, {b}) alone", case)


@check("IDX.CHUNK", ops=("index_scores",))
@forall(dict(case=make_score_case("normal", 5, 4, 4, 16, 12), row=1), case=score_cases(max_t=6), row=st.integers(0, 5))
def decode_row_equals_prefill_row(target, case, row):
    T = case.q.shape[0]
    full = _scores(target, case)
    _, tol = expected_scores(target, case)
    t = min(row, T - 1)
    n = int(case.visible[t])
    decode = ScoreCase(case.label, case.q[t:t + 1], case.k[:n], case.w[t:t + 1], np.array([n]))
    _assert_scores(_scores(target, decode), full[t:t + 1, :n], 2 * tol[t:t + 1, :n],
                   f"IDX.CHUNK: decode of row {t} (end_pos//ratio = {n} entries, unmasked)", case)


# ------------------------------------------------------------------------------------------------
# IDX: top-k
# ------------------------------------------------------------------------------------------------
@dataclass
class RowsCase:
    """A top-k input: scores [T, S] (BF16 values, −inf past visible unless 'unmasked'), visible, k."""
    label: str
    scores: np.ndarray
    visible: np.ndarray
    k: int

    def __repr__(self):
        return (f"RowsCase({self.label!r}, T={self.scores.shape[0]} S={self.scores.shape[1]}, "
                f"visible={self.visible.tolist()}, k={self.k})")


# 'minus_inf' (a visible entry scoring −inf) is outside the official domain (SPEC.md, The official domain):
# kept for the kernel tests, never drawn by a check.
ROW_KINDS = ("normal", "relu_zero", "equal", "few_values", "unmasked", "wide_range")


def make_rows(kind: str, seed: int, T: int, S: int, k: int) -> RowsCase:
    rng = np.random.default_rng(seed)
    scores = _bf16(rng, (T, S))
    if kind == "relu_zero":                  # fewer positive scores than k: the rest exactly 0
        scores = np.where(rng.random((T, S)) < 0.8, 0.0, np.abs(scores))
    elif kind == "equal":                    # rows full of one BF16 value
        scores = np.full((T, S), spec.round_bf16(rng.standard_normal()))
    elif kind == "few_values":
        scores = rng.integers(-2, 3, (T, S)) * 0.25
    elif kind == "wide_range":               # BF16 exponents 2^±40: beyond fp16's range and below its subnormals
        scores = spec.round_bf16(scores * 2.0 ** rng.integers(-40, 41, (T, S)))
    elif kind == "minus_inf":                # −inf inside the visible range (all −inf in row 0)
        scores = np.where(rng.random((T, S)) < 0.5, -np.inf, scores)
        scores[0] = -np.inf
    visible = rng.integers(0, S + 1, T)
    visible[rng.integers(0, T)] = S
    if rng.random() < 0.3:
        visible[rng.integers(0, T)] = 0
    if kind != "unmasked":                   # 'unmasked' leaves finite garbage past visible
        scores = np.where(spec.visibility_mask(visible, S), scores, -np.inf)
    return RowsCase(f"{kind}/seed={seed}", scores, visible.astype(np.int64), min(k, S))


@st.composite
def score_rows(draw, kinds=ROW_KINDS):
    S = draw(st.integers(1, 48))
    return make_rows(draw(st.sampled_from(kinds)), draw(st.integers(0, 2 ** 32 - 1)),
                     draw(st.integers(1, 6)), S, draw(st.integers(0, S)))


def wide_range_rows() -> RowsCase:
    """BF16 scores beyond fp16's range (|s| > 65504) and below half its smallest subnormal (2^-25):
    distinct in BF16, but ±inf or 0 once cast to fp16, where the lowest indices would win the ties."""
    scores = spec.round_bf16(np.array([[7e4, 1e5, 2e5, 1.0, -3e5, -np.inf],
                                       [2.0 ** -30, 0.0, 2.0 ** -27, 2.0 ** -26, -2.0 ** -27, 2.0 ** -25]]))
    return RowsCase("scores beyond fp16's range", scores, np.array([5, 6]), 2)


EDGE_ROWS = (
    make_rows("normal", 4, 3, 20, 6),
    make_rows("relu_zero", 1, 3, 40, 16),
    make_rows("equal", 2, 3, 33, 8),
    make_rows("equal", 3, 3, 24, 24),
    RowsCase("k = 0 (nothing compressed yet)", np.full((2, 1), -np.inf), np.array([0, 0]), 0),
    wide_range_rows(),
)


def _expected_order(target, order: str) -> str:
    declared = target.variant("topk_order")
    return order if declared == "official" else declared


# The models whose caller asks for each order (knob topk_order: V4 'score', V4.1 'position').
ORDER_MODELS = {"score": ("v4-flash", "v4-pro"), "position": ("v4.1-flash",)}


def _topk(target, case: RowsCase, order: str):
    assume(target.serves(*ORDER_MODELS[order]))      # a V4.1-only target is not asked for V4's order
    return target.index_topk(_t(case.scores), _t(case.visible, torch.int64), case.k, order)


def fitted_rows(target, case: RowsCase) -> RowsCase:
    """The case at the k that index_topk of `target` takes (its SHAPES, e.g. sgl-kernel's k = 2048 only):
    redrawn with the same kind and seed at that k over k + 64·S entries, so that visible falls both below
    k (every visible entry chosen) and above it; a case the target cannot be asked (k = 0 for a k it
    does not list) is left out."""
    k = target.fit_size("index_topk", "k", case.k)
    if k == case.k:
        return case
    assume(case.k > 0)
    kind = case.label.split("/")[0] if case.label.split("/")[0] in ROW_KINDS else "wide_range" \
        if "fp16" in case.label else "normal"
    seed = int(case.label.split("seed=")[1]) if "seed=" in case.label else case.scores.shape[1]
    return make_rows(kind, seed, case.scores.shape[0], k + 64 * case.scores.shape[1], k)


def _rows_check(target, case, order, clauses, what):
    case = fitted_rows(target, case)
    got = _topk(target, case, order)
    assert_topk(got, case.scores, spec.visibility_mask(case.visible, case.scores.shape[1]), case.k,
                _expected_order(target, order), clauses=clauses, what=f"{what} [{case!r}]")


EDGE_EXAMPLES = tuple(dict(case=c, order="position") for c in EDGE_ROWS) + (dict(case=EDGE_ROWS[0], order="score"),)


@check("IDX.TOPK.COUNT", ops=("index_topk",))
@forall(*EDGE_EXAMPLES, case=score_rows(), order=st.sampled_from(spec.TOPK_ORDERS))
def topk_holds_min_k_visible_distinct_visible_entries(target, case, order):
    _rows_check(target, case, order, ("shape", "range", "count", "unique"), f"IDX.TOPK.COUNT ({order})")


@check("IDX.TOPK.PAD", ops=("index_topk",))
@forall(*EDGE_EXAMPLES, case=score_rows(), order=st.sampled_from(spec.TOPK_ORDERS))
def minus_one_only_as_trailing_padding(target, case, order):
    _rows_check(target, case, order, ("shape", "padding"), f"IDX.TOPK.PAD ({order})")


@check("IDX.TOPK.ORDER", ops=("index_topk",))
@forall(*EDGE_EXAMPLES, case=score_rows(kinds=("normal", "few_values", "unmasked")), order=st.sampled_from(spec.TOPK_ORDERS))
def topk_order_is_score_for_v4_and_position_for_v41(target, case, order):
    _rows_check(target, case, order, ("shape", "order"), f"IDX.TOPK.ORDER (asked {order!r})")


@check("IDX.TOPK.SELECTION", ops=("index_topk",))
@forall(*EDGE_EXAMPLES, case=score_rows(), order=st.sampled_from(spec.TOPK_ORDERS))
def chosen_scores_are_a_top_k(target, case, order):
    _rows_check(target, case, order, ("shape", "range", "selection"), f"IDX.TOPK.SELECTION ({order})")


@check("IDX.TOPK.TIES", ops=("index_topk",))
@forall(*EDGE_EXAMPLES, case=score_rows(kinds=("equal", "few_values", "relu_zero")), order=st.sampled_from(spec.TOPK_ORDERS))
def tied_entries_follow_the_declared_rule(target, case, order):
    clauses = ("shape", "selection") + (("lowest_index",) if target.variant("topk_ties") == "lowest_index" else ())
    _rows_check(target, case, order, clauses, f"IDX.TOPK.TIES (topk_ties={target.variant('topk_ties')})")
