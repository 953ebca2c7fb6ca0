"""Checks of sparse attention (ATTN.*).

Operation contract (torch CPU tensors; a target provides any subset):

    sparse_attention(q [T, H, D], kv [N, D], sink f32 [H], indices int [T, K], scale: float, *, model: str)
        -> f32 [T, H, D], BF16 values: the kernel `sparse_attn` for one batch; q and kv BF16 values;
        an index is −1 or a row of kv; model picks the running max's start (−inf V4, −1e30 V4.1).
    attention_scale(model: str, layer: int) -> float       the softmax_scale the layer passes
    attention_q(q [T, H, D], *, model: str) -> f32          the main q after wq_b, before RoPE
    attention_output(o [T, H, D], positions int64 [T], freqs f32 [d/2]) -> f32
        the attention output's last 2·len(freqs) channels de-rotated (the conjugate table).

How checks isolate one rule.  Every sparse_attention check compares with spec.attn.bounds, the
official float64 value and its derived tolerance, on inputs built so that only the clause under
test can move the result past it: dot products exact in fp32 (small integers over 8), a "star" row
(kv row 0) whose score is every head's row max, listed first unless the check is about the order,
value channels 1..H that the scores do not read (q is 0 there), set one-sided to the sign of the
difference a mistake would make (`_one_sided`).  ATTN.PROB.ORDER alone holds the official blocks
of 64 (the knob attn_order), ATTN.PROB.BF16 admits any list-order blocking; the other checks admit
any rounding of each probability within one BF16 rounding, place the sink far below the row max
(exp(sink − M) is 0 in fp32; ATTN.SINK places it), and round the output to BF16 before comparing (ATTN.OUTPUT does not), so a
mistake in those clauses is reported on its own rule.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import attn as spec
from ..spec import path as spec_path
from ..spec import pool as spec_pool
from ..spec import quant as spec_quant
from ..spec import rope as spec_rope
from ..spec.indexer import is_bf16, round_bf16
from ..spec.models import PROFILES, profile
from ..spec.rules import V41
from .compare import as_numpy, assert_equal, assert_within, difference_kind
from .path import (STAGES, LayerCase, cached_run, judge_rotation, layer_cases, layer_kind, make_layer_case,
                   normal_bf16)
from .quant import assert_linear, fp8_linear_bounds, fp8_weight
from .stages import Kept, first_broken, judge_every_stage, not_judged, report as report_stages
from .checking import check, declared_choice, forall, skip

OPS = {
    "sparse_attention": "sparse_attention(q [T,H,D], kv [N,D], sink f32 [H], indices int [T,K], scale, *, model) "
                        "-> f32 [T,H,D] BF16 values: online softmax over blocks of 64, sink in the denominator",
    "sparse_attention_cache": "sparse_attention_cache(q [T,H,Dq], cache uint8, form, sink f32 [H], indices int [T,K], "
                              "scale, *, model) -> f32 [T,H,512]: sparse_attention over the entries of a packed "
                              "cache (form: v4_main_kv, v32_mla_kv, either + '/flashmla_paged'), keys all Dq dims, "
                              "values the first 512; judged by LAYOUT.V4.MAIN/V32.MLA and, as sparse_attention, by ATTN",
    "attention_scale": "attention_scale(model, layer) -> float: the softmax_scale passed to the kernel",
    "attention_q": "attention_q(q [T,H,D], *, model) -> f32: V4 rescales each head to unit RMS (BF16 ops); V4.1 q",
    "attention_output": "attention_output(o [T,H,D], positions int64 [T], freqs f32 [d/2]) -> f32: the RoPE "
                        "tail de-rotated by the conjugate table",
}

V4_MODELS = tuple(m for m in PROFILES if m != "v3.2")
STAR_K0 = 32.0                     # the star row's channel 0: its score is every head's max


@dataclass
class Case:
    model: str
    q: np.ndarray
    kv: np.ndarray
    sink: np.ndarray
    indices: np.ndarray
    scale: float
    index_dtype: torch.dtype = torch.int32     # as the official model passes them; int64 too (INDEX_DTYPES)

    @property
    def init(self) -> float:
        return spec.running_max_init(profile(self.model))

    def bounds(self, order: str, **precision):
        return spec.bounds(self.q, self.kv, self.sink, self.indices, self.scale, self.init, order, **precision)

    def describe(self) -> str:
        T, H, D = self.q.shape
        return (f"{self.model}, T={T} H={H} D={D} K={self.indices.shape[1]} N={self.kv.shape[0]}, "
                f"scale={self.scale!r}, {int((self.indices == -1).sum())} entries −1, "
                f"indices {str(self.index_dtype).removeprefix('torch.')}")


def _smallints(rng, shape, top=15):
    return rng.integers(-top, top + 1, shape) / 8.0


def fit_sizes(target, H: int, D: int, K: int) -> tuple[int, int, int]:
    """(H, D, the list's width) as sparse_attention of `target` takes them (its SHAPES): a size it
    lists as is, else the next listed one (the largest, past them all); a multiple it asks for by
    rounding up.  A list of K entries is then widened with −1 (nothing) to the width."""
    if target is None:
        return H, D, K
    return tuple(target.fit_size("sparse_attention", dim, n) for dim, n in (("H", H), ("D", D), ("K", K)))


# The lists' dtype, drawn with the seed: int32 (the official model's topk_idxs) at even seeds, so
# every check's first example, and int64 at odd ones; the contract takes both.
INDEX_DTYPES = (torch.int32, torch.int64)
SCORE_CHANNELS = 64                # q reads at most the first 64 channels: the star stays the max at any D


def make_case(seed: int, model: str, T: int, H: int, D: int, K: int, *, max_at: int = 0, invalid: float = 0.0,
              leading: int = 0, duplicates: int = 0, sink: str = "absent", scale: float | None = None,
              target=None) -> Case:
    """A determined input: small-integer q and kv (exact dots), the star row 0 at list position max_at
    (−1 entries: a fraction `invalid` after it, the first `leading` entries), `duplicates` entries
    repeating an earlier one (the star first), and the sink placed relative to each head's max; at
    the sizes `target` takes (fit_sizes)."""
    H, D, width = fit_sizes(target, H, D, K)
    rng = np.random.default_rng(seed)
    N = max(K + 8, 16)
    q = _smallints(rng, (T, H, D))
    q[..., 0] = rng.integers(24, 65, (T, H)) / 8.0
    q[..., 1:1 + H] = 0.0                                   # value channels: no part in any score
    q[..., SCORE_CHANNELS:] = 0.0
    kv = _smallints(rng, (N, D))
    kv[:, 0] = _smallints(rng, N, 8)
    kv[0, 0] = STAR_K0
    indices = np.stack([rng.permutation(np.arange(1, N))[:K] for _ in range(T)])
    at = min(max_at, K - 1)
    indices[:, at] = 0
    if invalid:
        drop = rng.random((T, K)) < invalid
        drop[:, :at + 1] = False
        indices[drop] = -1
    if leading:
        indices[:, :min(leading, K)] = -1
        if leading < K:
            indices[:, leading] = 0
    if duplicates:
        sources = [at, *rng.integers(0, K, duplicates - 1)]
        targets = rng.permutation([p for p in range(K) if p != at])[:duplicates]
        for src, dst in zip(sources, targets):
            indices[:, dst] = indices[:, src]
    indices = np.pad(indices, ((0, 0), (0, width - K)), constant_values=-1)
    scale = spec.softmax_scale(profile(model)) if scale is None else scale
    case = Case(model, round_bf16(q), round_bf16(kv), np.zeros(H), indices, float(np.float32(scale)),
                INDEX_DTYPES[seed % 2])
    case.sink = _sink(case, sink, rng)
    return case


def _sink(case: Case, kind: str, rng) -> np.ndarray:
    s = spec.scores(case.q, case.kv, case.indices, case.scale)
    M = np.max(np.where(np.isfinite(s), s, -1e30), axis=(0, 2))            # per head, over tokens
    # absent: exp(sink − M) underflows to 0 in fp32 (the checks of other rules); below: far below
    # every score but still a term
    offset = {"near": 0.0, "below": -60.0, "above": 30.0, "far_above": 120.0, "absent": -200.0}[kind]
    jitter = rng.integers(-8, 9, M.shape) / 16.0 if kind == "near" else 0.0
    return np.float32(M + offset + jitter).astype(np.float64)


def _one_sided(case: Case, official, other):
    """Set value channel 1 + h of each listed row to the sign (for token 0, head h) of the
    difference official − other of that row's weight, so that a mistake moves channel 1 + h far."""
    T, H, D = case.q.shape
    diff = np.nan_to_num(np.asarray(official) - np.asarray(other))[0]          # [H, K]
    for h in range(min(H, D - 1)):
        for j, row in enumerate(case.indices[0]):
            if row > 0 and diff[h, j] != 0:
                case.kv[row, 1 + h] = np.sign(diff[h, j])
    return case


def _weights(case: Case, maxima: str):
    """Each listed entry's numerator weight: official (against the running max of its block), at
    the global max, or unrounded."""
    s = spec.scores(case.q, case.kv, case.indices, case.scale)
    m = spec.running_maxima(s, case.init)
    M = m[..., -1:]
    with np.errstate(invalid="ignore", over="ignore"):
        if maxima == "running":
            return spec.probabilities(s, m) * np.exp(m - M)
        if maxima == "global":
            return spec.probabilities(s, M)
        return np.exp(s - M)


def _order(target, clause: str = "other") -> str:
    """The blocking a check admits: ATTN.PROB.ORDER the official one (unless another is declared),
    ATTN.PROB.BF16 any list-order blocking, the other rules any rounding of each probability."""
    value = target.variant("attn_order")
    if value == "split" or clause == "other":
        return "any"
    return "blocks64" if clause == "order" and value == "blocks64" else "list"


def precision(target) -> dict:
    """The precision choices a target declares for sparse attention (attn_scores, attn_probs), as
    spec.bounds takes them: every check of the attention output reads them."""
    return dict(scores=declared_choice(target, "attn_scores"), probs=declared_choice(target, "attn_probs"))


def _t(x, dtype=torch.float32):
    return torch.tensor(np.asarray(x), dtype=dtype)


def run(target, case: Case) -> np.ndarray:
    out = target.sparse_attention(_t(case.q), _t(case.kv), _t(case.sink), _t(case.indices, case.index_dtype),
                                  case.scale, model=case.model)
    return as_numpy(out).astype(np.float64)


def judge(target, case: Case, what: str, order: str | None = None, got=None, rounded: bool = False):
    """got inside the admitted interval; unless `rounded` (ATTN.OUTPUT), after its own BF16 rounding."""
    got = run(target, case) if got is None else got
    got = got if rounded else round_bf16(got)
    T, H, D = case.q.shape
    if got.shape != (T, H, D):
        raise AssertionError(f"{what}: output shape {got.shape}, expected {(T, H, D)}")
    lo, hi = case.bounds(order or _order(target), **precision(target))
    ok = spec.admitted(got, lo, hi)
    bad = np.argwhere(~ok)
    if bad.size:
        t, h, c = (int(i) for i in bad[0])
        o = spec.reference(case.q, case.kv, case.sink, case.indices, case.scale, case.init)
        raise AssertionError(
            f"{what}: {len(bad)} of {ok.size} outputs outside the admitted BF16 interval; at token {t} head {h} "
            f"channel {c}: got {got[t, h, c]!r}, official {round_bf16(o[t, h, c])!r} (exact {o[t, h, c]!r}), "
            f"admitted [{round_bf16(lo[t, h, c])!r}, {round_bf16(hi[t, h, c])!r}]; {difference_kind(got, o, ~ok)}; "
            f"{case.describe()}")
    return got


def judge_case(target, seed: int, model: str, T: int, H: int, D: int, K: int, *, what: str, **options):
    """judge on make_case's input, at the sizes the target takes."""
    return judge(target, make_case(seed, model, T, H, D, K, target=target, **options), what)


shapes = dict(T=st.integers(1, 3), H=st.integers(1, 20), D=st.sampled_from((16, 32, 64)),
              K=st.sampled_from((1, 2, 63, 64, 65, 100, 128, 130, 200)), seed=st.integers(0, 2 ** 32 - 1))
LATE = dict(shapes, model=st.sampled_from(V4_MODELS), max_at=st.sampled_from((64, 100, 128, 199)))
EDGE = [dict(T=1, H=1, D=32, K=1, seed=0), dict(T=2, H=3, D=64, K=130, seed=1),
        dict(T=1, H=20, D=64, K=65, seed=2), dict(T=3, H=16, D=16, K=200, seed=3)]


# ------------------------------------------------------------------------------------------------
# the lists
# ------------------------------------------------------------------------------------------------
@check("ATTN.GATHER", ops=("sparse_attention",))
@forall(*[dict(ex, model="v4.1-flash", invalid=0.3) for ex in EDGE], **shapes,
        model=st.sampled_from(V4_MODELS), invalid=st.sampled_from((0.0, 0.1, 0.5, 0.9)))
def minus_one_entries_contribute_nothing(target, T, H, D, K, seed, model, invalid):
    judge_case(target, seed, model, T, H, D, K, invalid=invalid,
               what="ATTN.GATHER: rows named by the list; −1 adds nothing to the numerator or the denominator")


@check("ATTN.DUPLICATES", ops=("sparse_attention",))
@forall(dict(T=1, H=2, D=32, K=2, seed=0, model="v4-flash", duplicates=1),
        dict(T=2, H=17, D=64, K=130, seed=5, model="v4.1-flash", duplicates=40),
        **shapes, model=st.sampled_from(V4_MODELS), duplicates=st.integers(1, 40))
def an_index_listed_twice_is_attended_twice(target, T, H, D, K, seed, model, duplicates):
    """Under attention_form=dense_mask: declared, not asked; expected of an undeclared target (naming
    the variant, runner/suite.py _matching_variant), its answer must be the mask's, each listed row once."""
    dense = target.variant("attention_form") == "dense_mask"
    if dense and "attention_form" in target.declared:
        skip("attention_form=dense_mask: a mask over the rows cannot express a repeated list entry (judged in the "
             "layer: a_token_in_both_caches_is_attended_twice)")
    case = make_case(seed, model, T, H, D, max(K, 2), duplicates=duplicates, target=target)
    if dense:
        judge(target, each_row_once(case), "ATTN.DUPLICATES: a repeated entry attended once, as a dense mask over the "
              "rows attends it", got=run(target, case))
        return
    judge(target, case, "ATTN.DUPLICATES: every entry counts, repeated rows included (no de-duplication)")


def each_row_once(case: Case) -> Case:
    """The case as a dense mask over the rows attends it: each entry repeating an earlier one −1."""
    indices = case.indices.copy()
    for row in indices:
        repeated = np.ones(row.size, bool)
        repeated[np.unique(row, return_index=True)[1]] = False
        row[repeated] = -1
    return replace(case, indices=indices)


@check("ATTN.INIT", ops=("sparse_attention",))
@forall(dict(T=1, H=3, D=32, K=200, seed=0, model="v4.1-flash", leading=122),
        dict(T=2, H=1, D=16, K=64, seed=1, model="v4.1-flash", leading=64),
        dict(T=1, H=4, D=32, K=130, seed=2, model="v4-flash", leading=0),
        **shapes, model=st.sampled_from(V4_MODELS), leading=st.sampled_from((0, 1, 63, 64, 100, 127, 128)))
def running_max_start(target, T, H, D, K, seed, model, leading):
    """V4.1: a leading stretch of −1 (the filling window ring) leaves no trace; V4 lists start valid."""
    leading = 0 if model not in V41 else leading
    judge_case(target, seed, model, T, H, D, max(K, leading + 1), leading=leading,
               what=f"ATTN.INIT: the running max starts at {'−1e30' if model in V41 else '−inf'}; "
                    f"{leading} leading −1 entries")


@check("ATTN.INIT", ops=("sparse_attention",))
@forall(dict(T=1, H=1, D=16, K=64, seed=0), dict(T=2, H=17, D=64, K=130, seed=1), **shapes)
def v41_row_without_a_valid_entry_is_zero(target, T, H, D, K, seed):
    case = make_case(seed, "v4.1-flash", T, H, D, K, target=target)
    case.indices[0] = -1
    got = run(target, case)
    assert_equal(got[0], np.zeros_like(got[0]),
                 what="ATTN.INIT: V4.1, a row whose entries are all −1 gives 0 (the running max starts at −1e30)")
    judge(target, case, "ATTN.INIT: V4.1, the other rows", got=got)


# ------------------------------------------------------------------------------------------------
# scores and probabilities
# ------------------------------------------------------------------------------------------------
SCALES = (None, 0.125, 0.03125, 0.1, 0.25)         # None: the model's softmax_scale


@check("ATTN.SCORE", ops=("sparse_attention",))
@forall(dict(T=1, H=2, D=64, K=64, seed=0, model="v4-flash", scale=0.125),
        dict(T=2, H=5, D=32, K=130, seed=1, model="v4.1-flash", scale=0.03125),
        **shapes, model=st.sampled_from(V4_MODELS), scale=st.sampled_from(SCALES))
def scores_are_fp32_dots_times_the_scale(target, T, H, D, K, seed, model, scale):
    judge_case(target, seed, model, T, H, D, K, scale=scale,
               what=f"ATTN.SCORE: s = fl32(fl32(q·k)·scale), scale {scale or 'softmax_scale'}, never rounded to BF16")


@check("ATTN.PROB.BF16", ops=("sparse_attention",))
@forall(*[dict(ex, model="v4-flash") for ex in EDGE], **shapes, model=st.sampled_from(V4_MODELS))
def probabilities_rounded_to_bf16_for_the_second_product(target, T, H, D, K, seed, model):
    case = make_case(seed, model, T, H, D, K, target=target)
    _one_sided(case, _weights(case, "running"), _weights(case, "exact"))
    judge(target, case, "ATTN.PROB.BF16: bf16(exp(s − m)) times the KV rows; the fp32 value in the sum only",
          order=_order(target, "bf16"))


@check("ATTN.PROB.ORDER", ops=("sparse_attention",))
@forall(dict(T=1, H=4, D=64, K=128, seed=0, model="v4.1-flash", max_at=64),
        dict(T=1, H=17, D=32, K=200, seed=1, model="v4-flash", max_at=199),
        **LATE)
def probabilities_rounded_against_the_running_max(target, T, H, D, K, seed, model, max_at):
    case = make_case(seed, model, T, H, D, max(K, max_at + 1), max_at=max_at, target=target)
    _one_sided(case, _weights(case, "running"), _weights(case, "global"))
    judge(target, case, f"ATTN.PROB.ORDER: blocks of 64 in list order, the row max at entry {max_at}: "
          "early probabilities rounded against the running max", order=_order(target, "order"))


@check("ATTN.RESCALE", ops=("sparse_attention",))
@forall(dict(T=1, H=2, D=32, K=128, seed=0, model="v4-flash", max_at=64),
        dict(T=2, H=16, D=64, K=200, seed=1, model="v4.1-flash", max_at=150),
        **LATE)
def accumulators_rescaled_when_the_max_grows(target, T, H, D, K, seed, model, max_at):
    judge_case(target, seed, model, T, H, D, max(K, max_at + 1), max_at=max_at,
               what=f"ATTN.RESCALE: the row max at entry {max_at}: both fp32 accumulators times exp(m_old − m_new)")


@check("ATTN.SINK", ops=("sparse_attention",))
@forall(*[dict(ex, model="v4.1-flash", sink=k) for ex, k in zip(EDGE, ("near", "below", "above", "far_above"))],
        **shapes, model=st.sampled_from(V4_MODELS), sink=st.sampled_from(("near", "near", "below", "above", "far_above")))
def sink_in_the_denominator_only(target, T, H, D, K, seed, model, sink):
    judge_case(target, seed, model, T, H, D, K, sink=sink,
               what=f"ATTN.SINK: exp(sink − M) added to the denominator only (sink {sink} the row max)")


@check("ATTN.OUTPUT", ops=("sparse_attention",))
@forall(*[dict(ex, model="v4-flash") for ex in EDGE], **shapes, model=st.sampled_from(V4_MODELS))
def output_divided_and_written_bf16(target, T, H, D, K, seed, model):
    case = make_case(seed, model, T, H, D, K, target=target)
    got = run(target, case)
    if not is_bf16(got).all():
        raise AssertionError("ATTN.OUTPUT: the output must hold BF16 values (acc / sum, rounded once)")
    judge(target, case, "ATTN.OUTPUT: o = bf16(N / L)", got=got, rounded=True)


# ------------------------------------------------------------------------------------------------
# the layer around the kernel
# ------------------------------------------------------------------------------------------------
@check("ATTN.SCALE", ops=("attention_scale",))
@forall(model=st.sampled_from(V4_MODELS))
def softmax_scale_is_head_dim_to_the_minus_half(target, model):
    m = profile(model)
    want = m.head_dim ** -0.5
    for layer in sorted({m.compress_ratios.index(r) for r in set(m.compress_ratios)}):
        got = float(target.attention_scale(model, layer))
        if not abs(got / want - 1) <= 2.0 ** -23:
            raise AssertionError(f"ATTN.SCALE: {model} layer {layer} (ratio {m.ratio(layer)}): softmax_scale "
                                 f"{got!r}, expected head_dim^-0.5 = {want!r} (no YaRN factor)")


@check("ATTN.Q_NORM", ops=("attention_q",))
# seed 2, spread 12: heads at 2^-12 (mean(q²) ≈ 6e-8, below norm_eps = 1e-6, which then sets the rescale)
@forall(dict(model="v4-flash", seed=0, spread=4), dict(model="v4.1-flash", seed=1, spread=4),
        dict(model="v4-flash", seed=2, spread=12),
        model=st.sampled_from(V4_MODELS), seed=st.integers(0, 2 ** 32 - 1), spread=st.integers(0, 6))
def v4_rescales_each_head_of_q(target, model, seed, spread):
    rng = np.random.default_rng(seed)
    q = round_bf16(rng.standard_normal((3, 4, 512)) * 2.0 ** rng.integers(-spread, spread + 1, (3, 4, 1)))
    got = as_numpy(target.attention_q(_t(q), model=model)).astype(np.float64)
    m = profile(model)
    if model in V41:
        assert_equal(got, q, what="ATTN.Q_NORM: V4.1 passes the main q unchanged (no per-head RMS rescale)")
        return
    _assert_bf16_rescale(got)
    _assert_rescaled_heads(got, q, m)


def _assert_rescaled_heads(got, q, m, where: str = "") -> None:
    """Each head is bf16(q·r) for one BF16 factor r in the admitted range (spec.q_rescale_factors)."""
    ok = spec.q_rescale_admitted(got, q, m)[..., 0]
    if not ok.all():
        lo, hi = spec.q_rescale_factors(q, m)
        first = tuple(int(i) for i in np.argwhere(~ok)[0])
        raise AssertionError(f"ATTN.Q_NORM: V4 rescales each head of the main q to unit RMS in BF16 steps: "
                             f"{int((~ok).sum())} of {ok.size} heads are not bf16(q·r) for any BF16 factor r in "
                             f"[{lo[first].item()!r}, {hi[first].item()!r}] (first: head {first}){where}")


def _assert_bf16_rescale(got, where: str = "") -> None:
    """V4's product q · rsqrt(…) is a BF16 tensor op: an unrounded fp32 product is named as such."""
    if not is_bf16(got).all():
        raise AssertionError(f"ATTN.Q_NORM: V4's rescaled q must hold BF16 values (the product rounded to BF16), "
                             f"{int((~is_bf16(got)).sum())} elements do not{where}")


@check("ATTN.DEROTATE", ops=("attention_output",))
@forall(dict(seed=0, layer=2, far=False), dict(seed=1, layer=0, far=True),
        seed=st.integers(0, 2 ** 32 - 1), layer=st.sampled_from((0, 2, 3)), far=st.booleans())
def output_rope_tail_rotated_back(target, seed, layer, far):
    rng = np.random.default_rng(seed)
    o = round_bf16(rng.standard_normal((4, 3, 512)))
    positions = rng.integers(1, 2 ** 20 if far else 4096, 4)
    freqs = spec_rope.frequencies_fp32(profile("v4-flash"), layer)
    got = as_numpy(target.attention_output(_t(o), _t(positions, torch.int64), _t(freqs))).astype(np.float64)
    assert_equal(got[..., :448], o[..., :448], what="ATTN.DEROTATE: channels 0..447 pass unchanged")
    conj = spec.derotation_freqs(freqs)
    ref = spec_rope.rotate_exact(o, positions, conj)
    assert_within(got, ref, spec_rope.rotate_tolerance(o, positions, conj, declared_choice(target, "rope_table")),
                  what="ATTN.DEROTATE: the last 64 channels turn by −p·f (conjugate)")


# ------------------------------------------------------------------------------------------------
# the layer: index_layer's stages, then the attention's
# ------------------------------------------------------------------------------------------------
OPS["attention_layer"] = ("attention_layer(inputs: dict, *, model, layer, start_pos) -> dict: index_layer's stages "
                          "(a V4.1 reuse layer: window_idx, and indices from the input source_topk), "
                          "then (from contract 6, inputs x and the weights attn_wq_a, attn_q_norm, attn_wq_b, attn_wkv, attn_kv_norm) "
                          "q_latent, q_norm, q_attn, kv_proj, kv_normed, then q_rescale, q_attn_rot, kv_rot, kv_window, cmp_rot, cmp, kv, o, o_derot, "
                          "then (from contract 7, inputs attn_wo_a, attn_wo_b) o_lora, out")
LAYER_HEADS = 16


def attention_layer_case(case, seed: int | None = None, projected: bool = False, output: bool = False):
    """A path LayerCase with the attention's inputs added: q_attn [T, 16, 512] (heads of unlike
    RMS), sink [16], kv_normed [T, 512], and window_cache (decode), kv_entries (prefill on a layer
    that writes its compressed KV) or kv_cache; drawn from `seed` (a fixed case: from its layer
    and start position).  `projected`: q_attn and kv_normed replaced by the weights that make them
    from the case's x (projection_weights); `output` (with projected): the output projections'
    weights too (output_weights)."""
    m = profile(case.model)
    rng = np.random.default_rng(1000 + case.layer + case.start_pos if seed is None else (seed, 1))
    T, D, ratio = case.seqlen, m.head_dim, m.ratio(case.layer)
    extra = {"q_attn": normal_bf16(rng, (T, LAYER_HEADS, D)) * np.float32(2.0) ** rng.integers(-3, 4, (1, LAYER_HEADS, 1)),
             "sink": rng.standard_normal(LAYER_HEADS).astype(np.float32),
             "kv_normed": normal_bf16(rng, (T, D))}
    if case.start_pos:
        extra["window_cache"] = normal_bf16(rng, (m.window, D))
    if ratio:
        E = (case.start_pos + T) // ratio
        name = "kv_entries" if case.start_pos == 0 and _compresses_here(m, case.layer) else "kv_cache"
        extra[name] = normal_bf16(rng, (E, D))
    for name in ("kv_normed", "kv_entries"):    # what the window and compressed QDQ read: see _small_groups
        if name in extra:
            extra[name] = _small_groups(rng, extra[name])
    if projected:
        del extra["q_attn"], extra["kv_normed"]
        weights = rng.integers(2 ** 32)
        extra.update(projection_weights(m, np.random.default_rng((weights, 2))))
        if output:
            extra.update(output_weights(m, np.random.default_rng((weights, 3))))
        extra.update(outlier_runs(np.random.default_rng((weights, 4)), case.arrays()["x"], extra, m))
    label = (", from x" + (", wo_a, wo_b" if output else "")) if projected else ", with attention"
    inputs = tuple((name, a) for name, a in case.inputs if name not in extra) + tuple(extra.items())
    return LayerCase(case.label + label, case.model, case.layer, case.start_pos, inputs)


OUTLIER_EXPONENT = 16


def outlier_runs(rng, x, weights: dict, m) -> dict:
    """A run of 32 channels of x (every token) times 2^16 and, with wo_a, a run of 32 rows of wo_a (so
    of o_lora) alike; the E8M0 scale of the K block over each run lowered by 16 + 8 in the weights
    that read it (wq_a, wkv; wo_b), so the rest of the row decides each product (FP8.LINEAR's
    with_block_outlier): act_quant per the model's block keeps the other blocks exact, a block of 128
    where it is 32 puts their values among E4M3 subnormals or 0 (real attention inputs carry such
    outlier channels; on unit-RMS rows the block's span is invisible)."""
    b, e = spec_quant.FP8_LINEAR_BLOCK[m.name], OUTLIER_EXPONENT
    out = {}

    def lowered(name, run):
        scale = weights[f"{name}_scale"].copy()
        scale[:, run * 32 // b] -= np.uint8(e + 8)
        out[f"{name}_scale"] = scale

    run = int(rng.integers(x.shape[-1] // 32))
    out["x"] = x.copy()
    out["x"][:, run * 32:(run + 1) * 32] *= np.float32(2.0 ** e)
    lowered("attn_wq_a", run)
    lowered("attn_wkv", run)
    if "attn_wo_a" in weights:
        run = int(rng.integers(weights["attn_wo_a"].shape[0] // 32))
        out["attn_wo_a"] = weights["attn_wo_a"].copy()
        out["attn_wo_a"][run * 32:(run + 1) * 32] *= np.float32(2.0 ** e)
        lowered("attn_wo_b", run)
    return out


PROJECTED_TOKENS = 32     # cases up to this length start from x; the longer ones (window and entry
                          # boundaries) from the given q_attn and kv_normed: an FP8 projection of 260
                          # tokens at the real widths costs seconds to judge, its numerics no more


def projection_weights(m, rng) -> dict:
    """E4M3 wq_a [q_lora_rank, dim], wq_b [16·512, q_lora_rank], wkv [512, dim] with E8M0 block scales
    (unit-RMS outputs on unit x; the scales of each head of wq_b 2^-3..2^3 apart: heads of unlike
    RMS for V4's rescale), and the RMSNorm weights q_norm and kv_norm (a quarter of kv_norm's
    16-channel groups 2^-16 smaller: _small_groups)."""
    b = spec_quant.FP8_LINEAR_BLOCK[m.name]
    wq_a, wq_a_scale = fp8_weight(rng, m.q_lora_rank, m.dim, b, exponents=(-14, -12))
    wq_b, wq_b_scale = fp8_weight(rng, LAYER_HEADS * m.head_dim, m.q_lora_rank, b, exponents=(-13, -11))
    head_shift = rng.integers(-3, 4, LAYER_HEADS).repeat(m.head_dim // b)
    wq_b_scale = (wq_b_scale.astype(np.int64) + head_shift[:, None]).astype(np.uint8)
    wkv, wkv_scale = fp8_weight(rng, m.head_dim, m.dim, b, exponents=(-14, -12))
    return {"attn_wq_a": wq_a, "attn_wq_a_scale": wq_a_scale, "attn_q_norm": normal_bf16(rng, (m.q_lora_rank,), 0.1, 1.0),
            "attn_wq_b": wq_b, "attn_wq_b_scale": wq_b_scale, "attn_wkv": wkv, "attn_wkv_scale": wkv_scale,
            "attn_kv_norm": _small_groups(rng, normal_bf16(rng, (1, m.head_dim), 0.1, 1.0))[0]}


OUTPUT_RANK = 64          # o_lora_rank of the cases (1024 in the models): wo_b's K is 2·64 = 128


def output_weights(m, rng, rank: int = OUTPUT_RANK) -> dict:
    """BF16 wo_a [g·64, 16·512/g] and E4M3 wo_b [dim, g·64] with its E8M0 block scales, g = the 16 heads
    in the model's groups (o_groups of n_heads: 8 heads a group, g = 2); o_lora and out of about o's RMS.
    `rank`: the o_lora_rank in place of 64."""
    b, groups = spec_quant.FP8_LINEAR_BLOCK[m.name], LAYER_HEADS * m.o_groups // m.n_heads
    width = LAYER_HEADS * m.head_dim // groups
    wo_b, wo_b_scale = fp8_weight(rng, m.dim, groups * rank, b, exponents=(-12, -10))
    return {"attn_wo_a": normal_bf16(rng, (groups * rank, width), width ** -0.5),
            "attn_wo_b": wo_b, "attn_wo_b_scale": wo_b_scale}


def _small_groups(rng, x):
    """A quarter of the 16-channel groups 2^-16 smaller: E4M3 of such a group divided by the scale
    of a block holding a unit group too is subnormal, so a QDQ of another block size (16, 32, 64)
    gives other values; on unit-RMS rows alone every block size gives the same."""
    groups = np.where(rng.random((*x.shape[:-1], x.shape[-1] // 16)) < 0.25, 2.0 ** -16, 1.0)
    return (x * groups.repeat(16, axis=-1)).astype(np.float32)


def _compresses_here(m, layer: int) -> bool:
    return m.ratio(layer) > 0 and (m.name not in V41 or layer in m.kv_source_layers)


def reuse_layer_case(model: str, layer: int, seqlen: int, start_pos: int = 0, seed: int = 0) -> LayerCase:
    """A V4.1 layer that reuses its index source's lists (LAYER.V41): x, and the source's top-k
    source_topk [T, min(index_topk, E)] (distinct visible entries, ascending, −1 at the tail)."""
    m = profile(model)
    role = spec_pool.layer_role(m, layer)
    if role.kind != "reuse":
        raise ValueError(f"reuse_layer_case: layer {layer} of {model} is a {role.kind!r} layer, not a reuse layer")
    rng = np.random.default_rng(seed)
    ratio, positions = m.ratio(layer), spec_path.token_positions(seqlen, start_pos)
    k = min(m.index_topk, (start_pos + seqlen) // ratio)
    topk = np.full((seqlen, k), -1, dtype=np.int64)
    for t, visible in enumerate((positions + 1) // ratio):
        chosen = np.sort(rng.permutation(visible)[:k])
        topk[t, :chosen.size] = chosen
    label = (f"{model} layer {layer} (reuse of layer {role.topk_source}'s lists, ratio {ratio}), seqlen {seqlen}, "
             f"start_pos {start_pos}, seed {seed}")
    return LayerCase(label, model, layer, start_pos,
                     (("x", normal_bf16(rng, (seqlen, m.dim))), ("source_topk", topk)))


# prefills shorter than the ratio (model, layer, seqlen, seed): no compressed entry is complete, the
# official compressor returns None and attention goes on over the window alone (V4-model L360-361, L527)
NO_ENTRY_PREFILLS = (
    ("v4-flash", 3, 1, 22),                 # HCA, one token
    ("v4-flash", 2, 3, 23),                 # CSA: the indexer has no entry to score
    ("v4.1-flash", 2, 1, 24),               # ratio-2 index source, one token
)
# the layer kinds and steps beyond path.layer_cases' (model, layer, seqlen, start_pos, seed)
KIND_CASES = (
    ("v4-flash", 2, 1, 27, 11),             # CSA, decode
    ("v4-flash", 3, 1, 300, 12),            # HCA, decode, ring wrapped
    ("v4-flash", 0, 1, 100, 13),            # window only, decode, ring filling
    ("v4.1-flash", 0, 10, 0, 14),           # window only, prefill
    ("v4.1-flash", 1, 1, 200, 15),          # window only, decode
    ("v4.1-flash", 21, 12, 0, 17),          # reuse of layer 20 (lists and KV), prefill
    ("v4.1-flash", 5, 1, 30, 18),           # reuse of layer 2, decode
    ("v4.1-flash", 25, 1, 40, 19),          # reuse of layer 24's lists and layer 20's KV, decode
    ("v4.1-flash", 20, 258, 0, 21),         # ratio-1 entries at 256, 257: BF16 holds 257 as 256
    *((model, layer, seqlen, 0, seed) for model, layer, seqlen, seed in NO_ENTRY_PREFILLS),
)


def kind_cases() -> list:
    return [(reuse_layer_case if spec_pool.layer_role(profile(model), layer).kind == "reuse" else make_layer_case)(
        model, layer, seqlen, start_pos, seed) for model, layer, seqlen, start_pos, seed in KIND_CASES]


@functools.lru_cache(maxsize=32)
def attention_case(key: tuple, projected: bool = False, output: bool = False):
    """The attention case of a layer key (path.FIXED_LAYERS, KIND_CASES, path.layer_keys): a fixed
    key keeps its inputs of old, a drawn one takes its seed's.  Kept for the 21 fixed keys and a
    run's draws (about 250 MB), so a process's ATTN.LAYER runs (impl, official, each mutant) build
    each case once."""
    from .path import FIXED_LAYERS, layer_case
    model, layer = key[:2]
    base = reuse_layer_case(*key) if spec_pool.layer_role(profile(model), layer).kind == "reuse" else layer_case(key)
    return attention_layer_case(base, None if key in FIXED_LAYERS or key in KIND_CASES else key[-1],
                                projected and key[2] <= PROJECTED_TOKENS, output)


def attention_layer_cases():
    from .path import FIXED_LAYERS
    return [attention_case(key) for key in (*FIXED_LAYERS, *KIND_CASES)]


def run_attention_layer(target, case) -> dict:
    """The target's attention_layer stages for a case (path.cached_run)."""
    return cached_run(target, "attention_layer", case)


def _stage(out, name, case) -> np.ndarray:
    if name not in out:
        raise AssertionError(f"stage {name!r} missing from the layer's outputs [{case!r}]")
    return np.asarray(out[name], dtype=np.float64) if out[name].dtype.kind == "f" else np.asarray(out[name])


def _source(out, name, case) -> np.ndarray:
    """What a stage is computed from: the target's stage `name`, else the case's input of that name."""
    a = case.arrays()
    return a[name].astype(np.float64) if name not in out and name in a else _stage(out, name, case)


def _same(got, want, what, case):
    assert_equal(np.asarray(got, np.float64), np.asarray(want, np.float64), what=f"{what} [{case!r}]")


def _qdq(x, model: str, compressed: bool) -> np.ndarray:
    from ..spec import path as spec_path
    from ..spec import quant as spec_quant
    if model not in V41:
        return np.concatenate([spec_quant.fp8_qdq(x[..., :-64], 64), x[..., -64:]], -1)
    return spec_path.kv_qdq(x) if compressed else spec_quant.fp8_qdq(x, 32)


def _given(out, name, case) -> np.ndarray:
    """A stage the case starts from x computes (then the target's own), or an input it gives."""
    return _stage(out, name, case) if "attn_wq_a" in case.arrays() else case.arrays()[name].astype(np.float64)


_LINEAR_BOUNDS = Kept(64 * 2 ** 20)       # FP8.LINEAR's bounds of a run's 92 stages: about 22 MB


def _linear_bounds(x, w, w_scale, block):
    """fp8_linear_bounds, kept for the inputs of a target's stage (every correct target writes the
    same one: computed once)."""
    return _LINEAR_BOUNDS.get(lambda: fp8_linear_bounds(x, w, w_scale, block), x, w, w_scale, block)


def _projection(name, weight, source):
    """The stage `name` = FP8.LINEAR(source, weight) (source: a stage, or the input x)."""
    def judge(target, case, out):
        a, b = case.arrays(), spec_quant.FP8_LINEAR_BLOCK[case.model]
        x = _source(out, source, case)
        x = x.reshape(x.shape[0], -1)
        got = _stage(out, name, case)
        bf16 = target.variant("fp8_linears") == "bf16"
        return assert_linear(target, got.reshape(got.shape[0], -1), x, a[weight], a[f"{weight}_scale"], b,
                             f"FP8.LINEAR: {name} = {weight}({source}), act_quant per {b}, E4M3 × E4M3 block GEMM "
                             f"[{case!r}]", bounds=None if bf16 else _linear_bounds(x, a[weight], a[f"{weight}_scale"], b))
    return judge


def _rms(name, source, weight):
    def judge(target, case, out):
        x, w, eps = _stage(out, source, case), case.arrays()[weight], profile(case.model).norm_eps
        assert_within(_stage(out, name, case), spec_path.rms_norm(x, w, eps), spec_path.rms_norm_tolerance(x, w, eps),
                      what=f"ATTN.LAYER: {name} = RMSNorm({source}) with the weight {weight}, eps = norm_eps, fp32, "
                           f"written BF16", bf16=True, note=f" [{case!r}]")
    return judge


def _judge_q_rescale(target, case, out):
    q = _given(out, "q_attn", case)
    m = profile(case.model)
    got = _stage(out, "q_rescale", case)
    if case.model in V41:
        return _same(got, q, "ATTN.Q_NORM: V4.1 leaves the main q as wq_b wrote it", case)
    _assert_bf16_rescale(got, f" [{case!r}]")
    _assert_rescaled_heads(got, q, m, f" [{case!r}]")


def _rotation(name, source, use, positions):
    def judge(target, case, out):
        x = _source(out, source, case)
        return judge_rotation(target, case, x, _stage(out, name, case), positions(case), use,
                              f"ROPE.POSITIONS: {name} = RoPE({source}) [{case!r}]")
    return judge


def _judge_qdq(name, source, compressed):
    def judge(target, case, out):
        if declared_choice(target, "kv_qdq") == "none":
            _same(_stage(out, name, case), _stage(out, source, case),
                  f"PATH.QDQ: {name} = {source}, read without the QDQ (kv_qdq=none declared)", case)
            return "kv_qdq=none"
        _same(_stage(out, name, case), _qdq(_stage(out, source, case), case.model, compressed),
              f"PATH.QDQ: {name}, {source} as attention reads it", case)
    return judge


def _window_rows(target, case, out):
    m = profile(case.model)
    new = _stage(out, "kv_window", case)
    if case.start_pos == 0:
        return new
    ring = case.arrays()["window_cache"].astype(np.float64).copy()
    ring[case.start_pos % m.window] = new[0]
    return spec_path.window_rows(ring, case.start_pos, target.variant("window_layout"), m.window)


def _judge_kv(target, case, out):
    rows = [_window_rows(target, case, out)]
    if profile(case.model).ratio(case.layer):
        rows.append(_stage(out, "cmp", case) if "cmp_rot" in out or "kv_entries" in case.arrays()
                    else case.arrays()["kv_cache"].astype(np.float64))
    layout = target.variant("window_layout")
    where = "in ring slot start_pos mod 128" if layout == "ring" else "last, the window rows in position order"
    _same(_stage(out, "kv", case), np.concatenate(rows), f"ATTN.GATHER: the rows attention reads, [window rows | "
          f"compressed rows] (window_layout={layout}; decode: the new row {where})", case)


_ATTENTION_BOUNDS = Kept(256 * 2 ** 20)   # the o stage's (lo, hi) of a run's 27 cases: about 120 MB


def _judge_o(target, case, out, clause: str = "order", what: str = "ATTN.PROB.ORDER: the layer's sparse attention"):
    m = profile(case.model)
    q, kv = _stage(out, "q_attn_rot", case), _stage(out, "kv", case)
    sink, idx = case.arrays()["sink"].astype(np.float64), _stage(out, "indices", case).astype(np.int64)
    chosen = precision(target)
    args = (q, kv, sink, idx, spec.softmax_scale(m), spec.running_max_init(m), _order(target, clause))
    lo, hi = _ATTENTION_BOUNDS.get(lambda: spec.bounds(*args, **chosen), *args, *chosen.items())
    got = _stage(out, "o", case)
    ok = spec.admitted(got, lo, hi)
    if not ok.all():
        first = tuple(int(i) for i in np.argwhere(~ok)[0])
        raise AssertionError(f"{what}, {int((~ok).sum())} of {ok.size} outputs outside the admitted interval, the first "
                             f"at {first}; {difference_kind(got, (lo + hi) / 2, ~ok)} [{case!r}]")
    knobs = {"scores": spec.ATTN_SCORES, "probs": spec.ATTN_PROBS}
    return ", ".join(f"{knobs[k].name}={v}" for k, v in chosen.items() if v != knobs[k].canonical) or None


def _judge_o_derot(target, case, out):
    """The conjugate rotation at p is the rotation at −p (fl32(−p)·f = −fl32(p·f) exactly): judged as
    index_layer's rotations are, on the target's own table."""
    return judge_rotation(target, case, _stage(out, "o", case), _stage(out, "o_derot", case), -case.positions, "q",
                           f"ATTN.DEROTATE: o_derot, the last 64 channels of o turned by −p·f [{case!r}]")


def _judge_o_lora(target, case, out):
    o, wo_a = _stage(out, "o_derot", case), case.arrays()["attn_wo_a"]
    assert_within(_stage(out, "o_lora", case), spec.grouped_matmul(o, wo_a, spec_path.matmul),
                  spec.grouped_matmul(o, wo_a, spec_path.matmul_tolerance),
                  what="ATTN.LAYER: o_lora = bf16(o_derot · wo_aᵀ) per head group, fp32 sums in any order",
                  bf16=True, note=f" [{case!r}]")


def _compressing(case) -> bool:
    return case.start_pos == 0 and _compresses_here(profile(case.model), case.layer)


def _entry_positions(case):
    return np.arange(case.arrays()["kv_entries"].shape[0]) * profile(case.model).ratio(case.layer)


def _projects(case) -> bool:
    return "attn_wq_a" in case.arrays()


def _projects_output(case) -> bool:
    return "attn_wo_a" in case.arrays()


ATTN_STAGES = (
    ("q_latent", "FP8.LINEAR", _projects, _projection("q_latent", "attn_wq_a", "x")),
    ("q_norm", "ATTN.LAYER", _projects, _rms("q_norm", "q_latent", "attn_q_norm")),
    ("q_attn", "FP8.LINEAR", _projects, _projection("q_attn", "attn_wq_b", "q_norm")),
    ("q_rescale", "ATTN.Q_NORM", lambda case: True, _judge_q_rescale),
    ("q_attn_rot", "ROPE.POSITIONS", lambda case: True, _rotation("q_attn_rot", "q_rescale", "q", lambda c: c.positions)),
    ("kv_proj", "FP8.LINEAR", _projects, _projection("kv_proj", "attn_wkv", "x")),
    ("kv_normed", "ATTN.LAYER", _projects, _rms("kv_normed", "kv_proj", "attn_kv_norm")),
    ("kv_rot", "ROPE.POSITIONS", lambda case: True,
     _rotation("kv_rot", "kv_normed", "window_kv", lambda c: c.positions)),
    ("kv_window", "PATH.QDQ", lambda case: True, _judge_qdq("kv_window", "kv_rot", False)),
    ("cmp_rot", "ROPE.POSITIONS", _compressing, _rotation("cmp_rot", "kv_entries", "compressed_kv", _entry_positions)),
    ("cmp", "PATH.QDQ", _compressing, _judge_qdq("cmp", "cmp_rot", True)),
    ("kv", "ATTN.GATHER", lambda case: True, _judge_kv),
    ("o", "ATTN.PROB.ORDER", lambda case: True, _judge_o),
    ("o_derot", "ATTN.DEROTATE", lambda case: True, _judge_o_derot),
    ("o_lora", "ATTN.LAYER", _projects_output, _judge_o_lora),
    ("out", "FP8.LINEAR", _projects_output, _projection("out", "attn_wo_b", "o_lora")),
)


def _judge_reused_indices(target, case, out):
    window = _stage(out, "window_idx", case).astype(np.int64)
    layout = target.variant("window_layout")
    want = spec_path.attention_index(window, case.arrays()["source_topk"], case.seqlen, case.start_pos, layout=layout)
    _same(_stage(out, "indices", case), want, "PATH.CONCAT: [window | the index source's top-k + "
          f"{spec_path.kv_offset(case.seqlen, case.start_pos, layout=layout)}] (a reuse layer's lists)", case)


REUSE_STAGES = tuple((s.name, s.rule_id, s.judge) for s in STAGES if s.name == "window_idx") + (
    ("indices", "PATH.CONCAT", _judge_reused_indices),)


def attention_stage_verdicts(target, case) -> list[dict]:
    """Every stage of the case, index path first, judged on the target's own stage before."""
    stages = [(s.name, s.rule_id, s.judge) for s in STAGES if layer_kind(case) in s.kinds]
    stages += REUSE_STAGES if layer_kind(case) == "reuse" else ()
    stages += [(name, rule_id, judge) for name, rule_id, applies, judge in ATTN_STAGES if applies(case)]
    return judge_every_stage(stages, target, case, run_attention_layer(target, case))


def first_broken_attention_stage(target, case):
    """(stage, rule, message) of the first stage, index path first, that breaks its rule, or None."""
    return first_broken(attention_stage_verdicts(target, case))


PROJECTIONS_SINCE = 6     # the contract version whose attention_layer starts from x


def takes_projections(target) -> bool:
    """Whether attention_layer is given x and the projection weights: a target declaring contract 6
    or later; one declaring an earlier version is given q_attn and kv_normed, as then; an undeclared
    one where it answers a case from x with its stages (an adapter written before may not)."""
    if target.contract is not None:
        return target.contract >= PROJECTIONS_SINCE
    case = attention_case(PROBE_KEY, True)
    try:
        return "q_latent" in run_attention_layer(target, case)
    except Exception:
        return False


OUTPUT_SINCE = 7          # the contract version whose attention_layer ends with wo_a and wo_b


def takes_output(target) -> bool:
    """Whether attention_layer is given wo_a and wo_b (on the cases from x): a target declaring contract 7
    or later, never one declaring an earlier version; an undeclared one where it answers a case from x
    with them by o_lora (a stage a target returns is judged: an adapter written before ignores them)."""
    if target.contract is not None:
        return target.contract >= OUTPUT_SINCE
    if not takes_projections(target):
        return False
    try:
        return "o_lora" in run_attention_layer(target, attention_case(PROBE_KEY, True, True))
    except Exception:
        return False


PROJECTED_STAGES = ("q_latent", "q_norm", "q_attn", "kv_proj", "kv_normed")
OUTPUT_STAGES = ("o_lora", "out")


def withheld_stages(target, case) -> list[dict]:
    """The stages of a case from x the target is not given the inputs of, as verdicts 'not judged':
    the projections (given q_attn and kv_normed) before contract 6, the output projections before 7."""
    if case.seqlen > PROJECTED_TOKENS:
        return []
    rule_of = {name: rule_id for name, rule_id, _, _ in ATTN_STAGES}
    declared = f"contract {target.contract}" if target.contract is not None else "no CONTRACT declared"
    if not _projects(case):
        why = f"{declared}: q_attn and kv_normed given, not x and the projections (contract {PROJECTIONS_SINCE})"
        return not_judged(PROJECTED_STAGES + OUTPUT_STAGES, why, rule_of)
    if not _projects_output(case):
        how = "withholds" if target.contract is not None else "and no o_lora returned given"
        return not_judged(OUTPUT_STAGES, f"{declared} {how} wo_a and wo_b (contract {OUTPUT_SINCE})", rule_of)
    return []


PROBE_KEY = ("v4-flash", 0, 1, 126, 9)   # path.FIXED_LAYERS' one-token window decode: the cheapest case


def _every_layer_kind(fn):
    """forall over the fixed layer cases and KIND_CASES (explicit examples), then drawn layers."""
    from .path import ALL_KINDS, FIXED_LAYERS, LAYER_CHECK_KINDS, layer_keys
    LAYER_CHECK_KINDS["ATTN.LAYER"] = ALL_KINDS
    return forall(*(dict(key=key) for key in (*FIXED_LAYERS, *KIND_CASES)), key=layer_keys(ALL_KINDS))(fn)


@check("ATTN.LAYER", ops=("attention_layer",))
@_every_layer_kind
def every_attention_stage_on_the_stage_before(target, key):
    case = attention_case(key, takes_projections(target), takes_output(target))
    report_stages("ATTN.LAYER", case, attention_stage_verdicts(target, case) + withheld_stages(target, case))


@functools.lru_cache(maxsize=2)
def small_latent_case(output: bool) -> LayerCase:
    """V4.1's window layer 0, 3 tokens from x, with wq_a's and wkv's scales 2^-12 lower: q_latent and
    kv_proj of RMS about 2^-12, mean(x²) about 6e-8, where norm_eps = 1e-20 leaves q_norm and kv_norm
    alone and V4's 1e-6 shrinks them about 4-fold (on unit-RMS latents no eps shows)."""
    case = attention_layer_case(make_layer_case("v4.1-flash", 0, 3, 0, 41), 41, True, output)
    a = case.arrays()
    smaller = {f"{w}_scale": (a[f"{w}_scale"] - np.uint8(12)) for w in ("attn_wq_a", "attn_wkv")}
    return LayerCase(case.label + ", wq_a and wkv scales 2^-12", case.model, case.layer, case.start_pos,
                     tuple((name, smaller.get(name, x)) for name, x in case.inputs))


@check("ATTN.LAYER", ops=("attention_layer",))
def norm_eps_of_the_model_on_a_small_latent(target):
    if not takes_projections(target):       # given the normed q and KV (contract < 6): no norm to judge
        return
    case = small_latent_case(takes_output(target))
    report_stages("ATTN.LAYER", case, attention_stage_verdicts(target, case) + withheld_stages(target, case))


DUPLICATE_KEYS = (("v4.1-flash", 20, 12, 0, 4),)     # path.FIXED_LAYERS' ratio-1 prefill: 12 tokens in both caches


@check("ATTN.DUPLICATES", ops=("attention_layer",))
def a_token_in_both_caches_is_attended_twice(target):
    """A dense-mask target (attention_form): the layer's o, where each token is listed once per
    cache, judged as ATTN.LAYER judges it; a sparse-list target is judged by sparse_attention."""
    if target.variant("attention_form") != "dense_mask":
        skip("attention_form=sparse_list: judged on sparse_attention's repeated entries")
    for key in DUPLICATE_KEYS:
        case = attention_case(key, takes_projections(target), takes_output(target))
        _judge_o(target, case, run_attention_layer(target, case), "other",
                 "ATTN.DUPLICATES: the layer's o, each recent token attended once per cache (its window row and its "
                 "compressed row), any blocking")


def assert_row_parallel(partials, out, what: str):
    """ATTN.TP.REDUCE: out [T, dim] a BF16 value of the fp32 all-reduce of the ranks' BF16 partials
    [W, T, dim] (the trace route judges it: verify's targets run one rank)."""
    lo, hi = spec.row_parallel_bounds(partials)
    ok = spec.admitted(out, lo, hi)
    if not ok.all():
        t, c = (int(i) for i in np.argwhere(~ok)[0])
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} outputs outside the all-reduce's admitted "
                             f"interval; at (t, c) ({t}, {c}): got {float(np.asarray(out)[t, c])!r}, admitted "
                             f"[{round_bf16(lo[t, c])!r}, {round_bf16(hi[t, c])!r}] (partials "
                             f"{[float(p[t, c]) for p in partials]})")


OPS["row_parallel_reduce"] = ("row_parallel_reduce(partials [W, T, dim] f32, BF16 values) -> f32 [T, dim]: "
                              "RowParallelLinear's all-reduce of the W ranks' wo_b partials, as out")


@check("ATTN.TP.REDUCE", ops=("row_parallel_reduce",))
@forall(dict(world=2, seed=0, spread=0), dict(world=8, seed=1, spread=12), dict(world=3, seed=2, spread=6),
        world=st.sampled_from((2, 3, 4, 8)), seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from((0, 6, 12)))
def ranks_partials_summed_in_fp32_then_rounded_once(target, world, seed, spread):
    """BF16 partials whose magnitudes lie up to 2^spread apart: their fp32 sums round (a BF16 sum, or
    no BF16 rounding at the end, leaves the admitted set)."""
    rng = np.random.default_rng(seed)
    partials = round_bf16(rng.standard_normal((world, 3, 64)) * 2.0 ** rng.integers(-spread, spread + 1, (world, 3, 64)))
    got = as_numpy(target.row_parallel_reduce(_t(partials))).astype(np.float64)
    if got.shape != partials.shape[1:]:
        raise AssertionError(f"ATTN.TP.REDUCE: shape {got.shape}, expected {partials.shape[1:]}")
    assert_row_parallel(partials, got, f"ATTN.TP.REDUCE (W = {world}, partials 2^±{spread} apart)")
