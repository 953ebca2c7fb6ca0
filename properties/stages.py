"""A layer rule's verdict, stage by stage (PATH.LAYER, ATTN.LAYER).

Every stage of a layer is judged from the target's own output of the stage before (teacher
forcing), so each stage has a verdict of its own: a broken early stage hides nothing after it.  A
layer check judges every stage of a case (`judge_every_stage`), records the verdicts for the row
(`suite.record_stages`), and fails naming the earliest broken stage first (the cause line, read by
causes.FIRST_BROKEN) and then every other, each with its rule.  A stage the target was not given
the inputs of (a contract version that withheld them) is listed as not judged, with why.
"""
from __future__ import annotations

import hashlib

import numpy as np

from .checking import NOT_JUDGED, PASS, FAIL, VARIANT, record_stages


class StageFailures(AssertionError):
    """A layer rule's failure: `stages` holds every stage's verdict on the failing case."""

    def __init__(self, message: str, stages: list[dict]):
        super().__init__(message)
        self.stages = stages


class Verdict(dict):
    """A stage's verdict; `knobs`: the knobs its judge read (the verdict stands under any value of the
    others), None where no judge ran."""
    knobs = None


def verdict(stage: str, rule: str, status: str, detail: str = "") -> dict:
    return Verdict(stage=stage, rule=rule, status=status, detail=detail)


def judge_every_stage(stages, target, case, out) -> list[dict]:
    """Each (name, rule, judge) of `stages` judged on `out`: a verdict per stage, in stage order; a
    stage whose judge passed it under a declared choice (returning "knob=value") reads VARIANT with it."""
    verdicts = []
    for name, rule_id, judge in stages:
        knobs: set = set()
        try:
            choice = judge(_recording(target, knobs), case, out)
        except AssertionError as e:
            verdicts.append(verdict(name, rule_id, FAIL, str(e)))
        except Exception as e:      # noqa: BLE001 -- the judge could not read what a broken stage left
            broken = first_broken(verdicts)
            if broken is None:
                raise
            verdicts.append(verdict(name, rule_id, FAIL, f"{rule_id}: stage {name!r} cannot be judged on what "
                                                         f"stage {broken[0]!r} left ({type(e).__name__}: {e}) [{case!r}]"))
        else:
            verdicts.append(verdict(name, rule_id, VARIANT, choice) if choice else verdict(name, rule_id, PASS))
        verdicts[-1].knobs = frozenset(knobs)
    return verdicts


def _recording(target, knobs: set):
    """A view of `target` that adds to `knobs` every knob asked of it (through the target's own
    `variant`, so that a view recording for the whole rule records it too)."""
    view = type(target).__new__(type(target))
    view.__dict__.update(target.__dict__)
    view.variant = lambda knob: (knobs.add(knob), target.variant(knob))[1]
    return view


def first_broken(verdicts: list[dict]):
    """(stage, rule, message) of the earliest broken stage, or None."""
    return next(((v["stage"], v["rule"], v["detail"]) for v in verdicts if v["status"] == FAIL), None)


def summary(verdicts: list[dict]) -> str:
    """One line: each stage and its verdict in order (a VARIANT with its choice); then the stages not
    judged, with why."""
    judged = " · ".join(_read(v) for v in verdicts if v["status"] != NOT_JUDGED)
    withheld = [v for v in verdicts if v["status"] == NOT_JUDGED]
    reasons = dict.fromkeys(v["detail"] for v in withheld)
    return f"stage by stage: {judged}" + "".join(
        f"; not judged: {', '.join(v['stage'] for v in withheld if v['detail'] == why)} ({why})" for why in reasons)


def _read(v: dict) -> str:
    return f"{v['stage']} {v['status']}" + (f" ({v['detail']})" if v["status"] == VARIANT else "")


def report(rule_id: str, case, verdicts: list[dict]) -> None:
    """Record the verdicts; on a broken stage raise StageFailures: the earliest broken stage (the
    cause line), every broken stage with its rule, the stage-by-stage line, the earliest's message
    in full and the first line of each later one's."""
    record_stages(verdicts)
    broken = [v for v in verdicts if v["status"] == FAIL]
    if not broken:
        return
    first, later = broken[0], broken[1:]
    lines = [f"{rule_id}: first broken stage {first['stage']!r} ({first['rule']}) [{case!r}]; "
             f"{len(broken)} of {sum(v['status'] != NOT_JUDGED for v in verdicts)} stages broken: "
             + ", ".join(f"{v['stage']} ({v['rule']})" for v in broken),
             summary(verdicts), first["detail"]]
    lines += [f"also broken, stage {v['stage']!r} ({v['rule']}): {v['detail'].splitlines()[0]}" for v in later]
    raise StageFailures("\n".join(lines), verdicts)


def not_judged(stages, why: str, rule_of: dict) -> list[dict]:
    """The verdicts 'not judged' of the stages `stages` (names), each with its rule, and why."""
    return [verdict(name, rule_of[name], NOT_JUDGED, why) for name in stages]


def content_key(*parts) -> str:
    """A digest of arrays' dtypes, shapes and bytes and of other values' reprs."""
    digest = hashlib.sha1()
    for part in parts:
        if isinstance(part, np.ndarray):
            digest.update(f"{part.dtype}{part.shape}".encode())
            digest.update(np.ascontiguousarray(part).view(np.uint8).ravel())
        else:
            digest.update(repr(part).encode())
    return digest.hexdigest()


class Kept:
    """A stage's reference values, kept by the content of what they are computed from while they fit
    `budget` bytes (the least recently used dropped first): every target that writes the same stage
    before (impl, official, most mutants) is judged on one computation."""

    def __init__(self, budget: int):
        self.budget, self.values = budget, {}

    def get(self, compute, *parts):
        key = content_key(*parts)
        value = self.values.pop(key, None)
        if value is None:
            value = compute()
        self.values[key] = value
        while len(self.values) > 1 and sum(a.nbytes for v in self.values.values() for a in v) > self.budget:
            self.values.pop(next(iter(self.values)))
        return value
