"""The vocabulary of coverage's boundaries: a recorded call, a boundary, and the helpers every
family's module builds its boundaries with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...spec import formats as F

LEVELS = ("element", "scale", "range", "layout")
F32 = np.float32


# ---------------------------------------------------------------------------------------------
# A recorded call
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    op: str
    args: tuple          # numpy arrays (tensors converted) and plain Python values
    kwargs: dict
    drawn: int | None = None   # the number of the randomly drawn example that made it (from 1); 0: an
    check: str = ""            # explicit @example; None: a fixed sweep.  The check that made it


def of(calls, *ops):
    return [c for c in calls if c.op in ops]


# ---------------------------------------------------------------------------------------------
# Boundaries
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Boundary:
    name: str
    level: str
    reached: object      # calls -> bool
    op: str = ""         # the operation whose calls it reads (seen); "" for one that reads several


def f32_step(v, ulps: int) -> F32:
    """The fp32 `ulps` steps above (below, when negative) the positive fp32 v."""
    return F.f32_from_bits(F.f32_bits(F32(v)) + ulps)[()]


def around(name: str, level: str, point, hit) -> list[Boundary]:
    """The boundary at `point` and one fp32 ulp either side: hit(calls, value) says whether some
    recorded input puts the decision's quantity exactly on value."""
    return [Boundary(f"{name}: {where}", level, lambda calls, v=f32_step(point, d): hit(calls, v))
            for where, d in (("exactly", 0), ("1 ulp below", -1), ("1 ulp above", 1))]


# ---------------------------------------------------------------------------------------------
# Argument-level boundaries: the inputs where a clause decides (not element values)
# ---------------------------------------------------------------------------------------------

def arg(c: Call, i: int, name: str):
    return c.args[i] if len(c.args) > i else c.kwargs.get(name)


def seen(op: str, name: str, level: str, pred) -> Boundary:
    """Some call of `op` satisfies pred(call)."""
    return Boundary(name, level, lambda calls: any(bool(pred(c)) for c in of(calls, op)), op)


def _rows(c, i=0):
    x = np.asarray(arg(c, i, "x"))
    return x.reshape(-1, x.shape[-1]).shape[0] if x.ndim else 0
