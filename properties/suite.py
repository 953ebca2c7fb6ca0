"""The conformance suite: checks, the runner, and one result per (rule, target).

A check is a function of one argument, the target, registered for exactly one rule; `forall`
runs its body under Hypothesis with the target bound outside (and the profile read at run time):

    @check("FP4.E2M1.RNE", ops=("e2m1_encode",))
    @forall(dict(x=TIES), x=finite_f32())
    def e2m1_rounds_to_nearest_even(target, x):
        assert_bytes_equal(target.e2m1_encode(x), spec_codes(x), ...)

Checks fail by raising AssertionError (use properties.compare); any other exception is ERROR; a
missing operation is NOT_IMPLEMENTED; `skip(reason)` is SKIP.  Oracles must read the target's
expected variants with `target.variant(knob)`: that is how a declared variant is honoured and how
an undeclared deviation is named ("matches e2m1_ties=toward_zero").
"""
from __future__ import annotations

import functools
import importlib
import inspect
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, Phase, example, given, settings

from ..spec import RULES
from ..spec.rules import EXTENSIONS, INFORMATIVE, KNOBS, select
from .target import NotImplementedOp, Target

PASS, FAIL, ERROR, TIMEOUT = "PASS", "FAIL", "ERROR", "TIMEOUT"
NOT_IMPLEMENTED, SKIP, VARIANT = "NOT_IMPLEMENTED", "SKIP", "VARIANT"
# When a rule has several checks, the worst outcome is the rule's.
SEVERITY = [PASS, VARIANT, SKIP, NOT_IMPLEMENTED, TIMEOUT, FAIL, ERROR]

FAMILY_MODULES = ("formats", "quant", "indexer", "pool", "compressor", "layout", "budget", "rope", "path")

# The explain phase can take minutes on a failing stateful check; reports already decode the failure.
_phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_health = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example]
settings.register_profile("ci", phases=_phases, derandomize=True, max_examples=25, deadline=None, database=None,
                          print_blob=True, suppress_health_check=_health)
settings.register_profile("dev", phases=_phases, max_examples=100, deadline=None, database=None, print_blob=True,
                          suppress_health_check=_health)
settings.register_profile("thorough", max_examples=2000, deadline=None, database=None,
                          print_blob=True, suppress_health_check=_health)
PROFILES = ("ci", "dev", "thorough")
TIME_LIMIT_S = {"ci": 600, "dev": 1800, "thorough": 7200}


class Skip(Exception):
    """The check does not apply to this target (a reason is given)."""


def skip(reason: str):
    raise Skip(reason)


@dataclass(frozen=True)
class Check:
    rule_id: str
    name: str
    fn: object
    ops: tuple[str, ...]
    extension: str | None = None   # beyond the official domain: runs only for targets declaring it

    @property
    def id(self) -> str:
        return f"{self.rule_id}::{self.name}"


CHECKS: list[Check] = []


def forall(*examples: dict, **strategies):
    """Make `fn(target, **drawn)` a check `fn(target)` that runs it under Hypothesis @given.

    The target is bound outside Hypothesis (it must never see it); each dict in `examples` is a
    permanent @example.
    """
    def wrap(fn):
        @functools.wraps(fn)
        def run(target):
            def inner(**drawn):
                fn(target, **drawn)
            inner.__signature__ = inspect.Signature(
                [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in strategies])
            test = given(**strategies)(inner)
            for ex in reversed(examples):
                test = example(**ex)(test)
            test()
        del run.__wrapped__               # the check's own signature is (target)
        return run
    return wrap



def check(rule_id: str, *, ops: tuple[str, ...] = (), extension: str | None = None):
    """Register the decorated function as a check of `rule_id` needing the operations `ops`; a check
    of a clause beyond the official domain names its extension (a rule's extension covers all its checks)."""
    if rule_id not in RULES:
        raise KeyError(f"check for undeclared rule {rule_id!r}")
    extension = extension or RULES[rule_id].extension
    if extension is not None and extension not in EXTENSIONS:
        raise KeyError(f"check of {rule_id}: unknown extension {extension!r}")

    def register(fn):
        CHECKS.append(Check(rule_id, fn.__name__, fn, tuple(ops), extension))
        return fn

    return register


def load_checks() -> list[Check]:
    for family in FAMILY_MODULES:
        importlib.import_module(f"{__package__}.{family}")
    return CHECKS


def checks_for(rule_id: str) -> list[Check]:
    return [c for c in load_checks() if c.rule_id == rule_id]


@dataclass
class Outcome:
    status: str
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Row:
    rule_id: str
    target: str
    status: str
    detail: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    checks: dict = field(default_factory=dict)


def run_check(chk: Check, target: Target, profile: str = "ci") -> Outcome:
    """One check against one target: PASS/FAIL/ERROR/TIMEOUT/NOT_IMPLEMENTED/SKIP."""
    settings.load_profile(profile)
    if chk.ops and not target.has(*chk.ops):
        missing = [op for op in chk.ops if not target.has(op)]
        return Outcome(NOT_IMPLEMENTED, "missing " + ", ".join(missing))
    if chk.extension and chk.extension not in target.extensions:
        return Outcome(SKIP, f"extension {chk.extension} not declared")
    start = time.perf_counter()
    try:
        # A target's numeric warnings (NaN casts and the like) are not results; the checks judge values.
        with _time_limit(TIME_LIMIT_S[profile]), warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            chk.fn(target)
        status, detail = PASS, ""
    except NotImplementedOp as e:
        status, detail = NOT_IMPLEMENTED, f"missing {e}"
    except Skip as e:
        status, detail = SKIP, str(e)
    except _Timeout:
        status, detail = TIMEOUT, f"over {TIME_LIMIT_S[profile]} s"
    except BaseException as e:  # noqa: BLE001 -- a target may raise anything; we report it
        if isinstance(e, KeyboardInterrupt):
            raise
        status, detail = (FAIL if _is_assertion(e) else ERROR), _describe(e)
    return Outcome(status, detail, time.perf_counter() - start)


def run_rule(rule_id: str, target: Target, profile: str = "ci") -> Row:
    """Every check of one rule against one target, with variant naming."""
    r = RULES[rule_id]
    chks = checks_for(rule_id)
    repro = f"dsv4spec verify --target {target.spec} --rules {rule_id} --profile {profile}"
    if not chks:
        why = "informative: no check" if r.status == INFORMATIVE else "no check written for this rule"
        return Row(rule_id, target.name, SKIP if r.status == INFORMATIVE else ERROR, why)
    outcomes = {c.name: run_check(c, target, profile) for c in chks}
    # A rule is judged on the checks the target could run; n/i only when it could run none.
    ran = [o.status for o in outcomes.values() if o.status not in (NOT_IMPLEMENTED, SKIP)]
    status = max(ran or [o.status for o in outcomes.values()], key=SEVERITY.index)
    failing = [f"{n}: {o.detail}" for n, o in outcomes.items() if o.status == status and o.detail]
    detail = failing[0] if failing else ""
    missing = len(outcomes) - len(ran)
    if ran and missing and status == PASS:
        why = sorted({o.detail for o in outcomes.values() if o.status in (NOT_IMPLEMENTED, SKIP)})
        detail = f"{len(ran)} of {len(outcomes)} checks ran; the others: " + "; ".join(why)
    if r.knob and status == PASS and target.variant(r.knob) != KNOBS[r.knob].canonical:
        status, detail = VARIANT, f"passes under declared {r.knob}={target.variant(r.knob)}"
    elif r.knob and status == FAIL:
        match = _matching_variant(r.knob, chks, target, profile)
        if match:
            detail = f"matches {r.knob}={match} (undeclared); " + detail
    seconds = sum(o.seconds for o in outcomes.values())
    return Row(rule_id, target.name, status, detail, repro if status in (FAIL, ERROR) else "",
               seconds, {n: o.status for n, o in outcomes.items()})


def _matching_variant(knob: str, chks: list[Check], target: Target, profile: str) -> str | None:
    for value in KNOBS[knob].values:
        if value == target.variant(knob):
            continue
        view = target.expecting(knob, value)
        if all(run_check(c, view, profile).status in (PASS, NOT_IMPLEMENTED, SKIP) for c in chks):
            return value
    return None


def verify(targets: list[Target], prefixes: list[str] | None = None, profile: str = "ci",
           progress=None) -> list[Row]:
    rules = select(prefixes)
    load_checks()
    rows = []
    for t in targets:
        for r in rules:
            row = run_rule(r.id, t, profile)
            rows.append(row)
            if progress:
                progress(row)
    return rows


def exit_status(rows: list[Row], targets: list[Target]) -> int:
    """0 when every target that claims conformance has no FAIL, ERROR or TIMEOUT."""
    claiming = {t.name for t in targets if t.claims_conformance}
    bad = [r for r in rows if r.target in claiming and r.status in (FAIL, ERROR, TIMEOUT)]
    return 1 if bad else 0


def _is_assertion(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return all(_is_assertion(x) for x in e.exceptions)
    return isinstance(e, AssertionError)


def _describe(e: BaseException, limit: int = 1500) -> str:
    if isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    text = f"{type(e).__name__}: {e}" if not isinstance(e, AssertionError) else str(e)
    notes = [n for n in getattr(e, "__notes__", []) if n.strip()]
    if notes:
        text += "\n" + "\n".join(notes)
    return text if len(text) <= limit else text[:limit] + " …"


class _Timeout(Exception):
    pass


class _time_limit:
    def __init__(self, seconds: int):
        self.seconds = seconds
        self.armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.alarm(self.seconds)

    def _fire(self, *_):
        raise _Timeout()

    def __exit__(self, *exc):
        if self.armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.previous)
        return False
