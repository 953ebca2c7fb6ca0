"""Comparison policies.  Every failure names the rule's clause and decodes the first mismatch."""
from __future__ import annotations

import numpy as np

from ..spec.indexer import is_bf16


def as_numpy(x) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (bf16 widened exactly to float32)."""
    if hasattr(x, "detach"):
        import torch
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            x = x.view(torch.uint8)
        return x.numpy()
    return np.asarray(x)


def _index(flat_i: int, shape) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat_i, shape)) if shape else ()


# A value off by at most this much relative to the exact result is what the same computation gives
# with less precision: four BF16 roundings (2^-8 each), the most a BF16 pipeline of a few steps loses.
PRECISION_RTOL = 2.0 ** -6


def difference_kind(got, exact, off=None) -> str:
    """Whether the values off (the mask `off`, all when None) differ from the exact results in
    precision or in logic: of precision when each lies within PRECISION_RTOL of its exact result,
    relative to the larger of that result and its row's RMS (a row's small values carry the rounding
    of the large ones they were computed from: a rotation, a normalised sum), the same quantity
    computed less precisely; of logic otherwise."""
    got, exact = np.asarray(got, np.float64), np.broadcast_to(np.asarray(exact, np.float64), np.shape(got))
    off = np.ones(got.shape, bool) if off is None else np.asarray(off, bool)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        finite = np.where(np.isfinite(exact), exact, 0.0)
        row = np.sqrt(np.mean(finite * finite, axis=-1, keepdims=True)) if got.ndim else np.abs(finite)
        rel = np.where(got == exact, 0.0, np.abs(got - exact) / np.maximum(np.abs(exact), row))[off]
    worst = float(np.nanmax(np.where(np.isnan(rel), np.inf, rel), initial=0.0))
    if worst <= PRECISION_RTOL:
        return (f"a difference of precision: every value off lies within {worst:.2g} of its exact result "
                f"(relative to it or its row's RMS; ≤ 2^-6, four BF16 roundings)")
    return (f"a difference of logic: a value off lies {worst:.2g} from its exact result (relative to it or its "
            f"row's RMS), more than precision explains (2^-6, four BF16 roundings)")


def assert_same_shape(actual, expected, what: str):
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")


FTZ_HINT = "the mismatches are subnormal values flushed to zero (FTZ/DAZ)"
SMALLEST_NORMAL = 2.0 ** -126           # of fp32 and of BF16 alike


def _subnormal(v: np.ndarray) -> np.ndarray:
    v = np.abs(np.asarray(v, dtype=np.float64))
    return (v > 0) & (v < SMALLEST_NORMAL)


def flush_hint(got, want, bad, inputs=None) -> list[str]:
    """[FTZ_HINT] when every mismatch (flat indices `bad` of the values got and want) is a zero where
    an fp32/BF16 subnormal was due, or a zero out of a subnormal input (as a zero input would give)."""
    got, want = np.asarray(got, np.float64).reshape(-1)[bad], np.asarray(want, np.float64).reshape(-1)[bad]
    due = _subnormal(want)
    if inputs is not None:
        due |= _subnormal(np.asarray(inputs, np.float64).reshape(-1)[bad])
    return [FTZ_HINT] if bad.size and bool(np.all((got == 0) & due)) else []


def assert_bytes_equal(actual, expected, *, what: str, decode=None, context=None, limit: int = 4,
                       values=None, inputs=None):
    """Exact equality of integer codes/bytes.

    decode(code) -> str renders one code (e.g. 'sign=1 exp=2 man=1 (-3.0)'); context(index) -> str
    describes the input that produced the element at that index; values(codes) -> floats, with
    `inputs` (one per code), lets the message say when the mismatches are flushed subnormals.
    """
    a, e = as_numpy(actual), as_numpy(expected)
    assert_same_shape(a, e, what)
    bad = np.flatnonzero(a.reshape(-1).astype(np.int64) != e.reshape(-1).astype(np.int64))
    if bad.size == 0:
        return
    lines = [f"{what}: {bad.size} of {a.size} differ"]
    for flat in bad[:limit]:
        idx = _index(flat, a.shape)
        got, want = int(a.reshape(-1)[flat]), int(e.reshape(-1)[flat])
        show = (lambda v: f"0x{v:02x} {decode(v)}") if decode else (lambda v: f"0x{v:02x}")
        line = f"  at {idx}: got {show(got)}, expected {show(want)}"
        if context:
            line += f"; {context(idx)}"
        lines.append(line)
    if values is not None:
        lines += flush_hint(values(a), values(e), bad, inputs)
    raise AssertionError("\n".join(lines))


def assert_equal(actual, expected, *, what: str, context=None, limit: int = 4):
    """Exact equality of values (NaN equal to NaN, -0 distinct from +0 for floats)."""
    a, e = as_numpy(actual), as_numpy(expected)
    assert_same_shape(a, e, what)
    if a.dtype.kind == "f" or e.dtype.kind == "f":
        a64, e64 = a.astype(np.float64).reshape(-1), e.astype(np.float64).reshape(-1)
        same = (a64 == e64) & (np.signbit(a64) == np.signbit(e64)) | (np.isnan(a64) & np.isnan(e64))
    else:
        same = a.reshape(-1) == e.reshape(-1)
    bad = np.flatnonzero(~same)
    if bad.size == 0:
        return
    lines = [f"{what}: {bad.size} of {a.size} differ"]
    if a.dtype.kind == "f" and e.dtype.kind == "f":
        lines[0] += "; " + difference_kind(a, e, ~same.reshape(a.shape))
    for flat in bad[:limit]:
        idx = _index(flat, a.shape)
        line = f"  at {idx}: got {a.reshape(-1)[flat]!r}, expected {e.reshape(-1)[flat]!r}"
        if context:
            line += f"; {context(idx)}"
        lines.append(line)
    if a.dtype.kind == "f" and e.dtype.kind == "f":
        lines += flush_hint(a, e, bad)
    raise AssertionError("\n".join(lines))


def assert_close(actual, expected, *, what: str, atol: float, rtol: float, limit: int = 4):
    """|a − e| ≤ atol + rtol·|e| where both are finite; ±inf and NaN positions must match exactly."""
    a = as_numpy(actual).astype(np.float64)
    e = as_numpy(expected).astype(np.float64)
    assert_same_shape(a, e, what)
    af, ef = a.reshape(-1), e.reshape(-1)
    anomaly = ~np.isfinite(ef) | ~np.isfinite(af)
    same_anomaly = (af == ef) | (np.isnan(af) & np.isnan(ef))
    finite = ~anomaly
    err = np.abs(af - ef)
    bad = np.flatnonzero((anomaly & ~same_anomaly) | (finite & (err > atol + rtol * np.abs(ef))))
    if bad.size == 0:
        return
    lines = [f"{what}: {bad.size} of {a.size} outside atol={atol:g} rtol={rtol:g}"]
    for flat in bad[:limit]:
        lines.append(f"  at {_index(flat, a.shape)}: got {af[flat]!r}, expected {ef[flat]!r}")
    raise AssertionError("\n".join(lines))


def assert_within(got, expected, tol, *, what: str, bf16: bool = False, note: str = ""):
    """|got − expected| ≤ tol elementwise (NaN fails), after got's shape and (bf16) its BF16 values;
    the message counts the misses and shows the first, then `note`."""
    got = np.asarray(got, np.float64)
    if got.shape != np.shape(expected):
        raise AssertionError(f"{what}: shape {got.shape}, expected {np.shape(expected)}{note}")
    if bf16 and not is_bf16(got).all():
        raise AssertionError(f"{what}: not BF16-representable{note}")
    off = ~(np.abs(got - expected) <= tol)
    bad = np.argwhere(off)
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        kind = difference_kind(got, expected, off)
        raise AssertionError(f"{what}: {len(bad)} of {got.size} off; at {i}: got {got[i]!r}, expected "
                             f"{expected[i]!r} ± {tol[i]:.3g}; {kind}{note}")
