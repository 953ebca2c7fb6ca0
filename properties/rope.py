"""Checks of RoPE per layer (ROPE.*).

Operation contract (torch CPU tensors; a target provides any subset):

    rope_freqs(model: str, layer: int, use: str) -> f32 [rope_dim / 2]
        the frequency table layer `layer` uses for `use` in ("q", "window_kv", "compressed_kv",
        "index_q", "index_k").
    rope_rotate(x [T, ..., D] BF16 values, positions int64 [T], freqs f32 [d/2]) -> f32, x's shape
        the last 2·len(freqs) channels rotated at the given positions by the given table.

How checks isolate one rule: ROPE.THETA reads dims 0-14 (below every YaRN ramp); ROPE.YARN reads
the multipliers f_i / f_1^i relative to the target's own base; the rotation rules take the table as
an input, so a table error is never blamed on the rotation.  ROPE.POSITIONS is checked on the
stages of a layer (properties/path.py), where the positions are chosen.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import indexer as spec_indexer
from ..spec import rope as spec
from ..spec.models import PROFILES, profile
from .compare import as_numpy, assert_equal, difference_kind
from .checking import check, declared_choice, forall

OPS = {
    "rope_freqs": "rope_freqs(model, layer, use) -> f32 [rope_dim/2]: the layer's table (one per layer)",
    "rope_rotate": "rope_rotate(x [T,...,D], positions int64 [T], freqs f32 [d/2]) -> f32: last 2·len(freqs) "
                   "channels rotated as consecutive pairs, BF16 values",
}

V4_MODELS = tuple(m for m, p in PROFILES.items() if p.rope is not None)


def layers(model: str) -> list[int]:
    """One layer of each ratio the model has (window-only layers included)."""
    ratios = profile(model).compress_ratios
    return [ratios.index(r) for r in sorted(set(ratios))]


def _freqs(target, model, layer, use="q") -> np.ndarray:
    return as_numpy(target.rope_freqs(model, layer, use)).astype(np.float64)


def _within(got, ref, tol, what):
    bad = np.flatnonzero(~(np.abs(np.asarray(got) - ref) <= tol))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} of {np.size(ref)} off; at dim {i}: got {np.ravel(got)[i]!r}, "
                             f"expected {np.ravel(ref)[i]!r} ± {np.ravel(tol)[i]:.3g}; "
                             f"{difference_kind(got, ref, ~(np.abs(np.asarray(got) - ref) <= tol))}")


@check("ROPE.THETA", ops=("rope_freqs",))
@forall(model=st.sampled_from(V4_MODELS), pick=st.integers(0, 10))
def base_theta_per_layer_kind(target, model, pick):
    m = profile(model)
    for layer in layers(model) + [pick % len(m.compress_ratios)]:
        theta, _ = spec.layer_rope(m, layer)
        i = np.arange(15)
        want = theta ** (-2.0 * i / m.rope_dim)
        got = _freqs(target, model, layer)[:15]
        _within(got, want, spec.FREQ_RTOL * want,
                f"ROPE.THETA: {model} layer {layer} (ratio {m.ratio(layer)}) must use θ = {theta:g}")


@check("ROPE.YARN", ops=("rope_freqs",))
@forall(model=st.sampled_from(V4_MODELS))
def yarn_on_compressed_layers_only(target, model):
    m = profile(model)
    for layer in layers(model):
        theta, yarn = spec.layer_rope(m, layer)
        own_theta, factors = spec.yarn_factors_of(_freqs(target, model, layer))
        want = spec.yarn_factor(m, own_theta) if yarn else np.ones(m.rope_dim // 2)
        what = (f"ROPE.YARN: {model} layer {layer} (ratio {m.ratio(layer)}) multipliers f_i/f_1^i "
                + ("ramp/16 + 1 − ramp, ramp over dims 15..25" if yarn else "all 1 (no YaRN on window layers)"))
        _within(factors, want, spec.YARN_RTOL * want, what)


@check("ROPE.SHARED", ops=("rope_freqs",))
@forall(model=st.sampled_from(V4_MODELS))
def one_table_per_layer(target, model):
    for layer in layers(model):
        q = _freqs(target, model, layer, "q")
        for use in spec.USES[1:]:
            assert_equal(_freqs(target, model, layer, use), q,
                         what=f"ROPE.SHARED: {model} layer {layer}: the {use} table must be the q table")


# ------------------------------------------------------------------------------------------------
# the rotation
# ------------------------------------------------------------------------------------------------
def _rotate(target, x, positions, freqs) -> np.ndarray:
    out = target.rope_rotate(torch.tensor(x, dtype=torch.float32), torch.tensor(positions, dtype=torch.int64),
                             torch.tensor(freqs, dtype=torch.float32))
    return as_numpy(out).astype(np.float64)


def _table(model: str, layer: int) -> np.ndarray:
    return spec.frequencies_fp32(profile(model), layer)


@check("ROPE.PAIRS", ops=("rope_rotate",))
@forall(dict(pair=0, position=1, heads=1), dict(pair=31, position=70000, heads=2),
        pair=st.integers(0, 31), position=st.integers(1, 2 ** 20), heads=st.integers(1, 3))
def consecutive_pairs_rotate_by_plus_angle(target, pair, position, heads):
    """Unit vectors on channel 2i and 2i+1 of the rotated slice: the pair (2i, 2i+1) turns by +p·f_i;
    and rows on which the table's precision shows (table_rows), judged by the table declared."""
    freqs = _table("v4.1-flash", 20)
    D = 128
    rows, at = table_rows(pair, position, freqs)
    x = np.zeros((2 + len(rows), heads, D))
    x[0, :, D - 64 + 2 * pair] = 1.0
    x[1, :, D - 64 + 2 * pair + 1] = 1.0
    x[2:, :, D - 64:] = rows[:, None, :]
    positions = np.array([position, position] + [at] * len(rows))
    got = _rotate(target, x, positions, freqs)
    ref = spec.rotate_exact(x, positions, freqs)
    table = declared_choice(target, "rope_table")
    tol = spec.rotate_tolerance(x, positions, freqs, table)
    _within(got[:2], ref[:2], tol[:2],
            f"ROPE.PAIRS: e_(2·{pair}) and e_(2·{pair}+1) at position {position} must turn within their pair by +p·f")
    what = f"ROPE.PAIRS: {len(rows)} vectors on pair {pair} at position {at}"
    assert_table(got[2:], x[2:], positions[2:], freqs, table, what)
    _within(got[2:], ref[2:], tol[2:], what + " must turn within their pair by +p·f")


# The positions table_rows tries, from the drawn one: the next 63, then further (a small angle's BF16
# sine is off by less than the fp32 table's own error bound).
PROBE_STEPS = (*range(64), *(2 ** j for j in range(6, 21)))


def table_rows(pair: int, position: int, freqs) -> tuple[np.ndarray, int]:
    """Rows [R, 2·len(freqs)] of the rotated slice, nonzero on pair `pair`, and a position, the first
    of PROBE_STEPS from `position` where a BF16 cos/sin table shows on them (spec.bf16_table_shows):
    BF16 pairs r·(sin, cos) and r·(cos, −sin) of that angle, r = 1 + j/16, which the rotation turns to
    nearly 0 in one channel, leaving the table's own rounding.  No rows where none shows."""
    f = np.asarray(freqs)[pair:pair + 1]
    for at in (position + step for step in PROBE_STEPS):
        c, s = np.cos(spec.angles([at], f)[0, 0]), np.sin(spec.angles([at], f)[0, 0])
        r = 1 + np.arange(16)[:, None] / 16
        pairs = spec_indexer.round_bf16(np.concatenate([r * [s, c], r * [c, -s]]))
        if spec.bf16_table_shows(pairs[:, None, :], np.full(len(pairs), at), f).any():
            rows = np.zeros((len(pairs), 2 * len(freqs)))
            rows[:, 2 * pair:2 * pair + 2] = pairs
            return rows, at
    return np.zeros((0, 2 * len(freqs))), position


def assert_table(got, x, positions, freqs, table: str, what: str):
    """Where the table's precision shows (spec.bf16_table_shows: no value is both the fp32 table's and
    a BF16 table's), got is the declared table's: the official fp32 one (V4-model L227-228, torch.polar
    of the fp32 angles) within ROPE.ROUNDING's interval, or under rope_table=bf16 a BF16 one."""
    shows = spec.bf16_table_shows(x, positions, freqs)
    got, exact = np.asarray(got, np.float64), spec.rotate_exact(x, positions, freqs)
    if table == "bf16":
        ok = spec.bf16_table_admits(got, x, positions, freqs)
    else:
        ok = np.abs(got - exact) <= spec.rotate_tolerance(x, positions, freqs)
    bad = shows & ~ok
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of the {int(shows.sum())} elements where a BF16 cos/sin table is told from "
            f"the fp32 one read another table than the {table} one (rope_table={table}); at {at}: got {got[at]!r}, "
            f"exact by the fp32 table {exact[at]!r}; {difference_kind(got, exact, bad)}")


@check("ROPE.SLICE", ops=("rope_rotate",))
@forall(dict(seed=0, D=128), dict(seed=1, D=512), seed=st.integers(0, 2 ** 32 - 1), D=st.sampled_from((128, 512)))
def only_the_last_64_channels_rotate(target, seed, D):
    rng = np.random.default_rng(seed)
    x = spec_indexer.round_bf16(rng.standard_normal((3, 2, D)))
    positions = rng.integers(1, 5000, 3)
    got = _rotate(target, x, positions, _table("v4-flash", 2))
    assert_equal(got[..., :D - 64], x[..., :D - 64].astype(np.float32).astype(np.float64),
                 what=f"ROPE.SLICE: channels 0..{D - 65} (NoPE) must pass unchanged")
    moved = np.abs(got[..., D - 64:] - x[..., D - 64:]).max()
    assert moved > 0, f"ROPE.SLICE: the last 64 of {D} channels were not rotated at positions {positions.tolist()}"


@check("ROPE.ROUNDING", ops=("rope_rotate",))
@forall(dict(seed=0, spread=0, far=False), dict(seed=2, spread=20, far=True),
        seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from((0, 8, 30)), far=st.booleans())
def rotation_is_fp32_rounded_once_to_bf16(target, seed, spread, far):
    """Drawn BF16 vectors, and the rows of one pair on which the table's precision shows
    (table_rows, after the drawn tokens), judged by the table declared."""
    rng = np.random.default_rng(seed)
    x = spec_indexer.round_bf16(rng.standard_normal((4, 3, 128)) * 2.0 ** rng.integers(-spread, spread + 1, (4, 3, 128)))
    positions = rng.integers(0, 2 ** 20 if far else 4096, 4)
    freqs = _table("v4.1-flash", int(rng.integers(0, 2)) * 20)
    rows, at = table_rows(int(rng.integers(0, 32)), int(positions[0]), freqs)
    probe = np.zeros((len(rows), 3, 128))
    probe[..., 64:] = rows[:, None, :]
    x, positions = np.concatenate([x, probe]), np.concatenate([positions, np.full(len(rows), at)])
    got = _rotate(target, x, positions, freqs)
    if not spec_indexer.is_bf16(got).all():
        raise AssertionError("ROPE.ROUNDING: the rotated values must be written back as BF16")
    table = declared_choice(target, "rope_table")
    assert_table(got[4:], x[4:], positions[4:], freqs, table,
                 f"ROPE.ROUNDING: {len(rows)} vectors the rotation at position {at} turns to nearly 0 in one channel")
    _within(got, spec.rotate_exact(x, positions, freqs), spec.rotate_tolerance(x, positions, freqs, table),
            "ROPE.ROUNDING: fp32 rotation by fl32(p·f), one BF16 rounding")
