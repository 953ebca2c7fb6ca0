"""Checks of the compressor rules (CMP.*).

The operations a target provides (all CPU torch, float32 tensors; x holds BF16 values, as the
official activations are BF16, and so does wkv at V4.1 ratio 1, a BF16 Linear there):

    compress(x, params, *, model, ratio) -> entries
        x [B, S, dim] float32, fed from position 0 in one prefill; entries [B, S // ratio, d].
    compressor_state(params, *, model, ratio, batch) -> state
        an opaque state holding nothing fed yet.
    compressor_feed(state, x) -> (state, entries)
        x [B, T, dim], T >= 1, the next T tokens; entries [B, E, d] for the E groups this chunk
        completed (E = 0 allowed).  The state passed in must not be modified (the suite may
        reuse it).  The official path is one chunk from position 0, then one token per call;
        chunks of several tokens after the first are the `streaming` extension.

params is a dict of float32 tensors: wkv [coff·d, dim], wgate [coff·d, dim] (ratio > 1),
ape [ratio, coff·d] (V4), norm [d] (RMSNorm weight), rope_freqs [rope_dim / 2] (the last
rope_dim channels are rotated; zeros give the pre-RoPE entry).  coff = 2 for V4 ratio 4, else 1.
A target must know from (model, ratio) whether windows overlap, whether ape applies, whether a
gate exists and which eps to use: those are the rules checked.

How checks isolate one rule: CMP.GATE, CMP.OVERLAP and CMP.APE compare the entry's direction
(rope_freqs = 0, norm weight 1, each entry scaled to unit RMS) with the reference, so an eps error
does not leak into them; CMP.NORM feeds repeated tokens through projections whose halves are
equal, so the pooled vector is W·x whatever the gate does; CMP.ROPE relates the target's entries
with and without rotation; CMP.GROUPS, CMP.CAUSAL and CMP.STREAM compare the target with itself.
Tolerances are spec.compressor.entry_tolerance (a first-order fp32 error bound plus the three BF16
roundings the official code makes at every ratio); prefill and decode paths differ by a few fp32
ulps (different GEMM shapes), and a BF16 rounding can turn those into one BF16 ulp, so nothing
here is compared bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from ..spec import compressor as spec
from ..spec import rope as spec_rope
from ..spec.indexer import round_bf16
from ..spec.models import profile
from ..spec.rules import V4, V41, V4_ALL
from .compare import as_numpy, assert_same_shape, assert_within as assert_bf16_within, difference_kind
from .rope import assert_table
from .checking import RUN, check, declared_choice, forall

OPS = {
    "compress": "compress(x [B,S,dim] f32, params, *, model, ratio) -> entries [B, S//ratio, d] f32",
    "compressor_state": "compressor_state(params, *, model, ratio, batch) -> state (opaque)",
    "compressor_feed": "compressor_feed(state, x [B,T,dim] f32) -> (state, entries [B,E,d] f32)",
}


@dataclass(frozen=True)
class Case:
    model: str
    ratio: int
    x: np.ndarray          # [B, S, dim] float32
    params: dict           # name -> float32 ndarray
    recipe: str = ""       # the make_case call that built it (shown in failures)

    def __repr__(self):
        return self.recipe or self.describe()

    def _repr_pretty_(self, printer, cycle):     # Hypothesis prints falsifying examples with this
        printer.text(repr(self))

    def but(self, note: str, **changes) -> "Case":
        """A modified copy whose repr says how it was modified."""
        return replace(self, recipe=f"{self!r} with {note}", **changes)

    def torch_params(self) -> dict:
        return {k: torch.from_numpy(v.copy()) for k, v in self.params.items()}

    def describe(self) -> str:
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in self.params.items())
        return f"model={self.model} ratio={self.ratio} x{list(self.x.shape)} {shapes}"


def make_case(model: str, ratio: int, seqlen: int, seed: int, *, batch: int = 1, dim: int = 6,
              d: int = 8, rope_pairs: int = 2, x_scale: float = 1.0, gate_scale: float = 1.0,
              ape: bool = True, symmetric: bool = False, repeated: bool = False,
              unit_norm: bool = False) -> Case:
    """A random case.  symmetric: equal halves in wkv/wgate/ape (overlap cannot be told apart);
    repeated: every token of a row equal; unit_norm: norm weight 1."""
    rng = np.random.default_rng(seed)
    coff = spec.channel_factor(model, ratio)

    wkv = rng.standard_normal((coff * d, dim)) / np.sqrt(dim)
    wgate = rng.standard_normal((coff * d, dim)) * gate_scale / np.sqrt(dim)
    ape_w = rng.standard_normal((ratio, coff * d)) if ape else np.zeros((ratio, coff * d))
    if symmetric and coff == 2:
        wkv[d:], wgate[d:], ape_w[:, d:] = wkv[:d], wgate[:d], ape_w[:, :d]
    x = bf16_values(rng.standard_normal((batch, seqlen, dim)) * x_scale)   # the official activations are BF16
    if repeated and seqlen:
        x[:] = x[:, :1]
    if not spec.has_gate(ratio):
        wkv = bf16_values(wkv)                    # V4.1 ratio 1: a BF16 Linear
    params = {"wkv": wkv, "norm": np.ones(d) if unit_norm else 1 + 0.5 * rng.standard_normal(d),
              "rope_freqs": spec.rope_frequencies(2 * rope_pairs, 160000.0)}
    if spec.has_gate(ratio):
        params["wgate"] = wgate
        if spec.has_ape(model):
            params["ape"] = ape_w
    options = dict(batch=batch, dim=dim, d=d, rope_pairs=rope_pairs, x_scale=x_scale, gate_scale=gate_scale,
                   ape=ape, symmetric=symmetric, repeated=repeated, unit_norm=unit_norm)
    recipe = f"make_case({model!r}, {ratio}, {seqlen}, {seed}, " + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")"
    return Case(model, ratio, x.astype(np.float32), {k: np.asarray(v, np.float32) for k, v in params.items()}, recipe)


@st.composite
def cases(draw, models=V4_ALL, ratios=None, groups=None, **fixed) -> Case:
    model = draw(st.sampled_from([m for m in models if not ratios or set(ratios) & set(spec.compressor_ratios(m))]))
    ratio = draw(st.sampled_from([r for r in spec.compressor_ratios(model) if not ratios or r in ratios]))
    groups = draw(groups if groups is not None else st.integers(0, 3 if ratio == 128 else 6))
    seqlen = max(0, groups * ratio + draw(st.sampled_from([0, 0, 1, -1, ratio // 2])))
    options = dict(batch=draw(st.integers(1, 2)), dim=draw(st.integers(1, 10)),
                   d=draw(st.sampled_from([8, 16])), rope_pairs=draw(st.integers(0, 4)),
                   x_scale=2.0 ** draw(st.integers(-3, 3)), gate_scale=2.0 ** draw(st.integers(-2, 3)),
                   repeated=draw(st.sampled_from([False, False, False, True])))
    options.update({k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in fixed.items()})
    return make_case(model, ratio, seqlen, draw(st.integers(0, 2**32 - 1)), **options)


def bf16_values(a) -> np.ndarray:
    """float32 values representable in BF16 (the official compressor's inputs are BF16 activations)."""
    return round_bf16(np.asarray(a, np.float64)).astype(np.float32)


def run_compress(target, case: Case, **param_overrides) -> np.ndarray:
    params = {**case.torch_params(), **{k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in param_overrides.items()}}
    out = target.compress(torch.from_numpy(case.x.copy()), params, model=case.model, ratio=case.ratio)
    return as_numpy(out).astype(np.float64)


def assert_within(actual, expected, tol, *, what: str, case: Case):
    """|actual - expected| <= tol elementwise; the first violations are listed with the entry index."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert_same_shape(actual, expected, what)
    bad = ~(np.abs(actual - expected) <= tol)
    if not bad.any():
        return
    lines = [f"{what}: {int(bad.sum())} of {bad.size} values outside the fp32 bound ({case.describe()}); "
             f"{difference_kind(actual, expected, bad)}"]
    for idx in list(zip(*np.nonzero(bad)))[:4]:
        idx = tuple(int(i) for i in idx)
        lines.append(f"  at [batch, entry, channel] {idx}: got {float(actual[idx])!r}, expected {float(expected[idx])!r} "
                     f"(bound {tol[idx]:.3g})")
    raise AssertionError("\n".join(lines))


def unit_rms(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = np.sqrt(np.mean(y * y, axis=-1, keepdims=True))
    return y / np.where(r > 0, r, 1.0), r


def _tolerance(target, x, case: Case) -> np.ndarray:
    """entry_tolerance of the inputs x, at the pooling precision the target declares (compressor_pooling)."""
    pooling = declared_choice(target, "compressor_pooling") if spec.has_gate(case.ratio) else "fp32"
    return spec.entry_tolerance(x, case.params, case.model, case.ratio, pooling)


def assert_direction(target, case: Case, what: str):
    """Compare entry directions (rope off, unit RMS) with the reference's pooled vectors."""
    zero_rope = np.zeros_like(case.params["rope_freqs"])
    case = case.but("rope_freqs 0, norm weight 1",
                    params={**case.params, "rope_freqs": zero_rope, "norm": np.ones_like(case.params["norm"])})
    got = run_compress(target, case)
    ref = spec.compress(case.x, case.params, case.model, case.ratio)
    tol = _tolerance(target, case.x, case)
    assert_same_shape(got, ref, what)
    got_dir, _ = unit_rms(got)
    ref_dir, ref_rms = unit_rms(ref)
    assert_within(got_dir, ref_dir, 2 * tol / np.where(ref_rms > 0, ref_rms, 1.0), what=what, case=case)


# --- CMP.GROUPS ---------------------------------------------------------------------------------

@check("CMP.GROUPS", ops=("compress",))
@forall(dict(case=make_case("v4-flash", 4, 3, 0)),
        dict(case=make_case("v4-flash", 128, 255, 1, dim=2)),
        dict(case=make_case("v4.1-flash", 2, 7, 2)),
        case=cases())
def prefill_emits_one_entry_per_complete_group(target, case):
    out = target.compress(torch.from_numpy(case.x), case.torch_params(), model=case.model, ratio=case.ratio)
    batch, seqlen, _ = case.x.shape
    want = (batch, seqlen // case.ratio, case.params["norm"].shape[0])
    assert tuple(out.shape) == want, (f"CMP.GROUPS: {seqlen} tokens at ratio {case.ratio} gave entries of shape "
                                      f"{tuple(out.shape)}, expected {want} ({case.describe()})")
    # entry j pools tokens j·m .. j·m+m−1 (and the m before them when windows overlap): the last
    # entry is unchanged when every token before its window changes
    start = (want[1] - 1 - spec.overlaps(case.model, case.ratio)) * case.ratio
    if start > 0:
        earlier = case.x.copy()
        earlier[:, :start] = bf16_values(np.random.default_rng(seqlen).standard_normal(earlier[:, :start].shape) * 3)
        got = run_compress(target, case.but(f"tokens < {start} replaced", x=earlier))[:, -1:]
        tol = _tolerance(target, case.x, case)[:, -1:]
        assert_within(got, as_numpy(out).astype(np.float64)[:, -1:], 2 * tol, case=case,
                      what=f"CMP.GROUPS: entry {want[1] - 1} changed when the tokens before its window (< {start}) "
                           f"changed")


@check("CMP.GROUPS", ops=("compressor_state", "compressor_feed"))
@forall(dict(case=make_case("v4-flash", 4, 9, 3)),
        case=cases(ratios=(1, 2, 4)))
def decode_emits_when_a_group_completes(target, case):
    batch, seqlen, _ = case.x.shape
    state = target.compressor_state(case.torch_params(), model=case.model, ratio=case.ratio, batch=batch)
    for t in range(seqlen):
        state, out = target.compressor_feed(state, torch.from_numpy(case.x[:, t:t + 1]))
        want = 1 if (t + 1) % case.ratio == 0 else 0
        assert out.shape[1] == want, (f"CMP.GROUPS: token {t} (ratio {case.ratio}) emitted {out.shape[1]} entries, "
                                      f"expected {want}: a group emits exactly when its last token arrives")


# --- CMP.CAUSAL ---------------------------------------------------------------------------------

@check("CMP.CAUSAL", ops=("compress",))
@forall(dict(case=make_case("v4-flash", 4, 16, 4), cut=0.5, seed=0),
        case=cases(), cut=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def entries_do_not_see_later_tokens(target, case, cut, seed):
    seqlen = case.x.shape[1]
    n = int(cut * seqlen)
    later = case.x.copy()
    later[:, n:] = bf16_values(np.random.default_rng(seed).standard_normal(later[:, n:].shape) * 3)
    prefix = case.but(f"the first {n} tokens", x=np.ascontiguousarray(case.x[:, :n]))
    got_prefix = run_compress(target, prefix)
    got_changed = run_compress(target, case.but(f"tokens >= {n} replaced", x=later))[:, :n // case.ratio]
    tol = _tolerance(target, prefix.x, case)
    assert_within(got_changed, got_prefix, 2 * tol,
                  what=f"CMP.CAUSAL: entries before token {n} changed when tokens >= {n} changed", case=case)


# --- CMP.OVERLAP, CMP.APE, CMP.GATE, CMP.RATIO1 -----------------------------------------------------

@check("CMP.OVERLAP", ops=("compress",))
# group 0 alone: its previous half weighs 0
@forall(dict(case=make_case("v4-pro", 4, 12, 5, ape=False, gate_scale=4.0)),
        dict(case=make_case("v4-flash", 4, 4, 6, ape=False)),
        case=cases(models=V4, ratios=(4,), ape=False))
def overlapping_windows_use_first_then_second_half(target, case):
    assert_direction(target, case, "CMP.OVERLAP: pooled direction (slots 0-3 previous group, first half)")


@check("CMP.APE", ops=("compress",))
@forall(dict(case=make_case("v4-flash", 128, 256, 7, symmetric=True)),
        case=cases(models=V4, symmetric=True, gate_scale=0.5))
def gate_scores_carry_the_positional_bias(target, case):
    assert_direction(target, case, "CMP.APE: pooled direction with ape[t mod m] added to the scores")


@check("CMP.GATE", ops=("compress",))
@forall(dict(case=make_case("v4.1-flash", 2, 8, 8, gate_scale=8.0)),
        dict(case=make_case("v4-pro", 128, 128, 9, ape=False, gate_scale=8.0, dim=3)),
        case=cases(ratios=(2, 128), ape=False))
def softmax_over_slots_per_channel(target, case):
    assert_direction(target, case, "CMP.GATE: pooled direction (softmax over the window per channel)")


def make_midpoint_case(seqlen: int, seed: int, *, batch: int = 1, dim: int = 4, d: int = 8, rope_pairs: int = 1,
                       midpoints: int = 1) -> Case:
    """A V4.1 ratio-1 case where rounding the projection to BF16 decides the entry's BF16 value.

    Every token is x = ±2^s on two columns (the rest random, multiplied by zero weights).  `midpoints`
    channels project to ±2^s·(1 + 2^-8 − 2^-16), just under a BF16 midpoint, so BF16 rounds them to
    ±2^s; the other d − midpoints (more of them) project to ±2^s·(1 − 2^-8), exact in BF16.  From the
    BF16 projections 1/RMS is 2^-s·(1 + f·2^-8) for f < 1 and the midpoint channels normalize to
    (1 + f·2^-8), BF16 1; from the fp32 projections the RMS is lower and they normalize past
    1 + 2^-8, BF16 1 + 2^-7.  The norm weights are powers of two, which keep both sides."""
    if not 1 <= midpoints < d / 2 or dim < 2:
        raise ValueError(f"make_midpoint_case: need 1 <= midpoints < d/2 and dim >= 2, got {midpoints}, d {d}, dim {dim}")
    rng = np.random.default_rng(seed)
    x = bf16_values(rng.standard_normal((batch, seqlen, dim)))
    cols = rng.permutation(dim)[:2]
    x[..., cols] = (rng.choice([-1.0, 1.0], (batch, seqlen)) * 2.0 ** rng.integers(-4, 5, (batch, seqlen)))[..., None]
    wkv = np.zeros((d, dim))
    wkv[:, cols[0]] = 1 - 2.0 ** -8
    mid = rng.permutation(d)[:midpoints]
    wkv[mid, cols[0]], wkv[mid, cols[1]] = 1.0, 2.0 ** -8 - 2.0 ** -16
    wkv *= rng.choice([-1.0, 1.0], (d, 1))
    norm = rng.choice([-1.0, 1.0], d) * 2.0 ** rng.integers(-2, 3, d)
    params = {"wkv": wkv, "norm": norm, "rope_freqs": spec.rope_frequencies(2 * rope_pairs, 160000.0)}
    recipe = (f"make_midpoint_case({seqlen}, {seed}, batch={batch}, dim={dim}, d={d}, rope_pairs={rope_pairs}, "
              f"midpoints={midpoints})")
    return Case("v4.1-flash", 1, x, {k: np.asarray(v, np.float32) for k, v in params.items()}, recipe)


@st.composite
def midpoint_cases(draw) -> Case:
    d = draw(st.sampled_from([8, 16]))
    return make_midpoint_case(draw(st.integers(1, 6)), draw(st.integers(0, 2**32 - 1)), batch=draw(st.integers(1, 2)),
                              dim=draw(st.integers(2, 10)), d=d, rope_pairs=draw(st.integers(0, 4)),
                              midpoints=draw(st.integers(1, d // 2 - 1)))


def ratio1_bf16_range(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest BF16 value of each ratio-1 entry before RoPE, as the official code can
    compute it: the fp32 sum wkv·x in any order (within (dim + 2)·u·Σ|x||W| of exact) rounded once to
    BF16, RMSNorm of those BF16 values in fp32 (relative (d + 8)·u), rounded to BF16."""
    x, wkv = np.asarray(case.x, np.float64), np.asarray(case.params["wkv"], np.float64)
    exact, spread = x @ wkv.T, (x.shape[-1] + 2) * spec.U32 * (np.abs(x) @ np.abs(wkv).T)
    lo, hi = round_bf16(exact - spread), round_bf16(exact + spread)
    least_sq = np.where(lo * hi > 0, np.minimum(lo * lo, hi * hi), 0.0)
    eps = profile(case.model).norm_eps
    inv_rms = [1 / np.sqrt(np.mean(sq, axis=-1, keepdims=True) + eps) for sq in (np.maximum(lo * lo, hi * hi), least_sq)]
    w = np.asarray(case.params["norm"], np.float64)
    corners = np.stack([w * p * r for p in (lo, hi) for r in inv_rms])
    slack = (lo.shape[-1] + 8) * spec.U32 * np.abs(corners).max(axis=0)
    return round_bf16(corners.min(axis=0) - slack), round_bf16(corners.max(axis=0) + slack)


def assert_ratio1_bf16_projection(got: np.ndarray, case: Case):
    """Where the rotation leaves the entry alone (the channels before the last rope_dim, and all of
    entry 0), the target's entry rounded to BF16 is within ratio1_bf16_range."""
    least, greatest = ratio1_bf16_range(case)
    assert_same_shape(got, least, "CMP.RATIO1")
    unrotated = np.zeros(got.shape, bool)
    unrotated[..., :got.shape[-1] - 2 * len(case.params["rope_freqs"])] = True
    unrotated[:, :1] = True
    rounded = round_bf16(got)
    bad = unrotated & ~((least <= rounded) & (rounded <= greatest))
    if not bad.any():
        return
    lines = [f"CMP.RATIO1: {int(bad.sum())} entry values, rounded to BF16, are not what BF16(RMSNorm(BF16(wkv·x))) "
             f"gives: the projection must be rounded once to BF16 before the norm ({case!r})"]
    for idx in list(zip(*np.nonzero(bad)))[:4]:
        idx = tuple(int(i) for i in idx)
        lines.append(f"  at [batch, entry, channel] {idx}: got {float(got[idx])!r} (BF16 {float(rounded[idx])!r}), "
                     f"expected BF16 {float(least[idx])!r}" + ("" if least[idx] == greatest[idx] else
                                                               f" to {float(greatest[idx])!r}"))
    raise AssertionError("\n".join(lines))


@check("CMP.RATIO1", ops=("compress",))
@forall(dict(case=make_midpoint_case(3, 0, dim=3, d=8, rope_pairs=2, midpoints=2)),
        case=st.one_of(cases(models=V41, ratios=(1,)), midpoint_cases()))
def ratio_one_is_normalized_projection(target, case):
    got = run_compress(target, case)
    ref = spec.compress(case.x, case.params, case.model, case.ratio)
    tol = _tolerance(target, case.x, case)
    assert_within(got, ref, tol, what="CMP.RATIO1: entry = RoPE(RMSNorm(wkv·x), t)", case=case)
    assert_ratio1_bf16_projection(got, case)


# --- CMP.NORM -----------------------------------------------------------------------------------

@check("CMP.NORM", ops=("compress",))
@forall(dict(case=make_case("v4.1-flash", 2, 6, 10, symmetric=True, repeated=True, rope_pairs=0), exponent=-10),
        dict(case=make_case("v4-flash", 4, 8, 11, symmetric=True, repeated=True, rope_pairs=0), exponent=-9),
        dict(case=make_case("v4-flash", 4, 8, 12, symmetric=True, repeated=True, rope_pairs=0, x_scale=0.0), exponent=0),
        case=cases(symmetric=True, repeated=True, rope_pairs=0), exponent=st.integers(-14, 2))
def rms_norm_with_profile_eps(target, case, exponent):
    # Repeated tokens and equal halves make every window hold one kv vector, so pooled = W·x for
    # any gate; the scale 2^exponent reaches the regime where eps (1e-6 V4, 1e-20 V4.1) matters.
    case = case.but(f"x scaled by 2^{exponent}", x=(case.x * np.float32(2.0 ** exponent)).astype(np.float32))
    got = run_compress(target, case)
    ref = spec.compress(case.x, case.params, case.model, case.ratio)
    tol = _tolerance(target, case.x, case)
    assert_within(got, ref, tol, what="CMP.NORM: entry = w·p / sqrt(mean(p^2) + eps)", case=case)


# --- CMP.ROPE -----------------------------------------------------------------------------------

@check("CMP.ROPE", ops=("compress",))
@forall(dict(case=make_case("v4-flash", 4, 20, 13, rope_pairs=4)),
        dict(case=make_case("v4.1-flash", 2, 10, 14, rope_pairs=1)),
        # and long rows: a group index past 256 with more significant bits than BF16 holds, so
        # positions (or the group cutoff) computed in BF16 rotate the wrong way (ratios ≤ 4: short)
        case=st.one_of(cases(rope_pairs=st.integers(1, 4)), cases(ratios=(1, 2, 4), rope_pairs=st.integers(1, 4),
                                                                   groups=st.integers(257, 300))))
def rope_at_the_groups_first_position(target, case):
    """And where the table's precision shows (the last frequency chosen by table_showing), the
    declared table's rotation (rope.assert_table)."""
    plain = run_compress(target, case, rope_freqs=np.zeros_like(case.params["rope_freqs"]))
    positions = np.arange(plain.shape[1]) * case.ratio
    freqs, j = table_showing(plain, positions, case.params["rope_freqs"])
    got = run_compress(target, case, rope_freqs=freqs)
    want = spec.rope(plain, positions, freqs)
    table = declared_choice(target, "rope_table")
    chosen = "" if j is None else f" (the last frequency {freqs[-1]!r}, where a BF16 table shows at entry {j})"
    assert_within(got, want, spec.rope_tolerance(plain, positions, freqs, table),
                  what=f"CMP.ROPE: entry j rotated at position j·{case.ratio}{chosen}", case=case)
    assert_table(np.swapaxes(got, 0, 1), np.swapaxes(plain, 0, 1), positions, freqs, table,
                 f"CMP.ROPE: entries rotated at j·{case.ratio}{chosen} ({case.describe()})")


def table_showing(plain, positions, freqs) -> tuple[np.ndarray, int | None]:
    """freqs with the last one replaced, where one is found, by an angle over j·ratio near which entry
    j's last pair turns to 0 in one channel (of the last 8 entries, the last first): there the rotated
    value is small beside the pair and a BF16 cos/sin table's own rounding shows
    (spec_rope.bf16_table_shows; at the very zero BF16 products would cancel too); (freqs, None) if
    none does."""
    entries = np.swapaxes(np.asarray(plain, np.float64), 0, 1)         # [entry, batch, d]
    if freqs.size == 0:
        return freqs, None
    for j in range(len(entries) - 1, max(len(entries) - 9, 0), -1):
        a, b = entries[j, 0, -2], entries[j, 0, -1]
        for zero in (np.arctan2(a, b), np.arctan2(-b, a)):             # a·cos − b·sin = 0, a·sin + b·cos = 0
            for off in NEAR_ZERO:
                chosen = np.array(freqs, np.float32)
                chosen[-1] = np.float32((zero + off) % np.pi / positions[j])
                if spec_rope.bf16_table_shows(entries, positions, chosen).any():
                    return chosen, j
    return freqs, None


NEAR_ZERO = tuple(s * 2.0 ** -e for e in (6, 5, 7, 4) for s in (1, -1))     # radians from the zero


# --- CMP.STREAM ---------------------------------------------------------------------------------

def _feed_all(target, case: Case, chunks) -> np.ndarray:
    state = target.compressor_state(case.torch_params(), model=case.model, ratio=case.ratio, batch=case.x.shape[0])
    entries, start = [], 0
    for size in chunks:
        state, out = target.compressor_feed(state, torch.from_numpy(case.x[:, start:start + size].copy()))
        entries.append(as_numpy(out).astype(np.float64))
        start += size
    return np.concatenate(entries, axis=1)


@check("CMP.STREAM", ops=("compress", "compressor_state", "compressor_feed"))
@forall(dict(case=make_case("v4-flash", 4, 13, 15), first=6), dict(case=make_case("v4.1-flash", 2, 7, 16), first=1),
        case=cases(), first=st.integers(1, 300))
def prefill_then_decode_matches_prefill(target, case, first):
    """The official path: one prefill chunk from position 0, then one token per call."""
    _decode_against_prefill(target, case, first, "CMP.STREAM: a prefill of {first} tokens then decode differs "
                                                 "from one prefill")


def _decode_against_prefill(target, case: Case, first: int, what: str):
    """A prefill of `first` tokens, then one token per call, against one prefill of everything."""
    seqlen = case.x.shape[1]
    if seqlen == 0:
        return
    first = min(first, seqlen)
    decoded = _feed_all(target, case, [first] + [1] * (seqlen - first))
    tol = _tolerance(target, case.x, case)
    assert_within(decoded, run_compress(target, case), 2 * tol, what=what.format(first=first), case=case)


@check("CMP.STREAM", ops=("compress", "compressor_state", "compressor_feed"), extension="streaming")
def chunked_feeding_matches_prefill(target):
    """A stateful test: random chunk sizes (1 = decode) against one prefill of everything fed."""

    class Streaming(RuleBasedStateMachine):
        @initialize(case=cases(), seed=st.integers(0, 2**32 - 1))
        def start(self, case, seed):
            self.case = case.but("the tokens fed so far", x=case.x[:, :0])
            self.rng = np.random.default_rng(seed)
            self.state = target.compressor_state(case.torch_params(), model=case.model, ratio=case.ratio,
                                                 batch=case.x.shape[0])
            self.entries = []

        @rule(size=st.sampled_from([1, 1, 1, 2, 3, 5, 8]), scale=st.sampled_from([0.5, 1.0, 4.0]))
        def feed(self, size, scale):
            case = self.case
            if case.ratio == 128:
                size = int(self.rng.choice([1, 7, 63, 128, 129]))
            chunk = bf16_values(self.rng.standard_normal((case.x.shape[0], size, case.x.shape[2])) * scale)
            before = case.x.shape[1]
            self.state, out = target.compressor_feed(self.state, torch.from_numpy(chunk.copy()))
            self.case = replace(case, x=np.concatenate([case.x, chunk], axis=1))
            completed = (before + size) // case.ratio - before // case.ratio
            assert out.shape[1] == completed, (f"CMP.STREAM: a chunk of {size} tokens after {before} emitted "
                                               f"{out.shape[1]} entries, expected {completed}")
            self.entries.append(as_numpy(out).astype(np.float64))

        @invariant()
        def same_as_prefill(self):
            if not hasattr(self, "case") or self.case.x.shape[1] == 0:
                return
            case = self.case
            streamed = np.concatenate(self.entries, axis=1)
            prefill = run_compress(target, case)
            tol = _tolerance(target, case.x, case)
            assert_within(streamed, prefill, 2 * tol,
                          what="CMP.STREAM: entries fed in chunks differ from one prefill", case=case)

    # Under the check's own settings (the suite's profile: derandomized at ci, no deadline, no health
    # check that a loaded machine could fail), never the process's default profile.  The explain
    # phase replays a failing machine hundreds of times (minutes); shrinking is kept.
    phases = [p for p in RUN.settings.phases if p != Phase.explain]
    run_state_machine_as_test(Streaming, settings=settings(RUN.settings, stateful_step_count=8, phases=phases))


# --- CMP.STATE ----------------------------------------------------------------------------------

@check("CMP.STATE", ops=("compress", "compressor_state", "compressor_feed"))
# decoding from before group 0 completes (its first half never written: score −inf), large scores
@forall(dict(case=make_case("v4-flash", 4, 13, 17, gate_scale=16.0), first=2),
        dict(case=make_case("v4.1-flash", 2, 9, 18, gate_scale=32.0), first=1),
        dict(case=make_case("v4-pro", 128, 260, 19, gate_scale=16.0, dim=3), first=129),
        case=cases(ratios=(2, 4, 128), gate_scale=st.sampled_from([8.0, 16.0, 32.0]),
                   x_scale=st.sampled_from([1.0, 2.0, 4.0])), first=st.one_of(st.integers(1, 260), st.sampled_from((2, 3, 4, 5, 6, 7, 8, 9, 130))))
def decode_pools_the_fp32_state(target, case, first):
    """Scores of tens: a state rounded to BF16 moves a softmax weight by several per cent."""
    _decode_against_prefill(target, case, first, "CMP.STATE: entries decoded from the state after a prefill of "
                                                 "{first} tokens differ from one prefill")


# --- the compressor's stages on a recorded layer (check-trace, trace/judge.py) -----------------------
# A layer's compressors as a trace names them: the KV compressor's stages and weights are cmp_pooled,
# cmp_normed, cmp_wkv, cmp_wgate, cmp_ape, cmp_norm; the V4 CSA indexer's own (head_dim 128, V4-model
# L398) the same names under idx_cmp_.  The same rules state both (V4-model L279-377 is one class).
KV_COMPRESSOR, INDEX_COMPRESSOR = "cmp_", "idx_cmp_"
COMPRESSOR_NAMES = {KV_COMPRESSOR: "the compressor", INDEX_COMPRESSOR: "the indexer's compressor"}


def pooled_rule(model: str, ratio: int) -> str:
    """The rule stating a prefill's pooled vectors: the window's shape where windows overlap."""
    return "CMP.RATIO1" if ratio == 1 else "CMP.OVERLAP" if spec.overlaps(model, ratio) else "CMP.GATE"


def recorded_params(tensors: dict, model: str, ratio: int, prefix: str = KV_COMPRESSOR) -> dict:
    """compress()'s params from a trace's tensors (KeyError naming the one not recorded)."""
    names = ["wkv"] + (["wgate"] if spec.has_gate(ratio) else []) + (["ape"] if spec.has_gate(ratio)
                                                                     and spec.has_ape(model) else [])
    return {name: tensors[prefix + name] for name in names}


def assert_pooled(target, x, params: dict, model: str, ratio: int, got, what: str):
    """got: the pooled vectors (BF16, before RMSNorm) of x's last len(got) complete groups, x fed from
    a group's first token: within twice pooled_tolerance of the exact ones (ENTRY_TOLERANCE's pooled part)."""
    pooling = declared_choice(target, "compressor_pooling") if spec.has_gate(ratio) else "fp32"
    ref, tol = spec.pooled(x, params, model, ratio), 2 * spec.pooled_tolerance(x, params, model, ratio, pooling)
    first = ref.shape[0] - len(got)
    if first < 0:
        raise AssertionError(f"{what}: {len(got)} pooled vectors, but {np.shape(x)[0]} tokens complete {ref.shape[0]} "
                             f"groups of {ratio} (CMP.GROUPS)")
    assert_bf16_within(got, ref[first:], tol[first:] + 1e-35, what=what, bf16=True)


def judge_pooled(target, case, out, prefix: str = KV_COMPRESSOR):
    """cmp_pooled of a prefill (ratio 1: of any step): from the step's x and the recorded wkv, wgate, ape."""
    ratio = profile(case.model).ratio(case.layer)
    assert_pooled(target, out["x"], recorded_params(out, case.model, ratio, prefix), case.model, ratio,
                  out[prefix + "pooled"], f"{pooled_rule(case.model, ratio)}: {COMPRESSOR_NAMES[prefix]}'s pooled "
                                          f"vectors, ratio {ratio} [{case!r}]")


def judge_normed(target, case, out, prefix: str = KV_COMPRESSOR):
    """cmp_normed = RMSNorm(cmp_pooled) with the recorded weight and the profile's eps, BF16."""
    p, weight = np.asarray(out[prefix + "pooled"], np.float64), np.asarray(out[prefix + "norm"], np.float64)
    tol, _ = spec.norm_tolerance(p, 0.0, weight, case.model)
    eps = profile(case.model).norm_eps
    assert_bf16_within(out[prefix + "normed"], spec.rms_norm(p, weight, eps), 2 * tol + 1e-35, bf16=True,
                       what=f"CMP.NORM: {COMPRESSOR_NAMES[prefix]}'s entry = w·p / sqrt(mean(p^2) + {eps:g}) [{case!r}]")
