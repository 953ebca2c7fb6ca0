"""The conformance suite's runner: one result per (rule, target), from the checks of properties/
(properties/checking.py: what a check is and what it may call, re-exported here under its old name).

Checks fail by raising AssertionError; any other exception is ERROR; a missing operation is
NOT_IMPLEMENTED; `skip(reason)` is SKIP.  A rule whose checks fail but pass under another value of
a knob its checks read is VARIANT ("detected: ...") or names the value it matches ("matches
e2m1_ties=toward_zero").
"""
from __future__ import annotations

import functools
import importlib
import os
import random
import shlex
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from hypothesis.errors import Unsatisfiable

from ..spec import RULES
from ..spec.rules import INFORMATIVE, KNOBS, select
from .contract import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT, NotImplementedOp, OperationTimeout, Target, printable
from ..properties.families import FAMILY_MODULES
from ..properties.checking import (  # noqa: F401 -- the checks' side, importable here as it always was
    CHECKS, CHOICES, CI_EXAMPLES, Check, DERANDOMIZED, ERROR, FAIL, LAYER_CHECKS, LAYER_DRAWS, NOT_IMPLEMENTED,
    NOT_JUDGED, PASS, PROFILES, RUN, Run, SEED_ALONE, SEVERITY, SKIP, Skip, TIMEOUT, VARIANT, _CHOSEN, _DECLARED,
    _DETECTED, _STAGES, _is_layer_check, check, declared_choice, detected, examples_from_the_seed_alone,
    examples_per_check, forall, hypothesis_profile, profile_for, record_stages, register_profile, settings_for,
    skip)


def load_checks() -> list[Check]:
    for family in FAMILY_MODULES:
        importlib.import_module(f"dsv4spec.properties.{family}")
    return CHECKS


def checks_for(rule_id: str) -> list[Check]:
    return [c for c in load_checks() if c.rule_id == rule_id]


@dataclass
class Outcome:
    status: str
    detail: str = ""
    seconds: float = 0.0
    detected: frozenset = frozenset()
    stages: list = field(default_factory=list)     # a layer rule's verdicts, stage by stage
    declared: frozenset = frozenset()     # the declared knob values its judges read (declared_choice)
    standing: tuple = ()    # the knobs read by each stage judge that failed on an explicit example


@dataclass
class Row:
    rule_id: str
    target: str
    status: str
    detail: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    checks: dict = field(default_factory=dict)
    stages: list = field(default_factory=list)     # [{stage, rule, status, detail}] of a layer rule

    def __setattr__(self, name, value):     # a target's words, shown by every report as they are
        super().__setattr__(name, printable(value) if name in _SHOWN and isinstance(value, str) else value)


_SHOWN = ("target", "detail", "reproduce")


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 2 ** 31)


def run_check(chk: Check, target: Target, profile: str = "ci", shrink: bool = True) -> Outcome:
    """One check against one target: PASS/FAIL/ERROR/TIMEOUT/NOT_IMPLEMENTED/SKIP."""
    RUN.settings = settings_for(chk.rule_id, profile, shrink, chk.name)
    models = RULES[chk.rule_id].applies_to
    if not target.serves(*models):          # a rule of other models than the target's: never asked
        return Outcome(NOT_IMPLEMENTED, f"missing {', '.join(chk.ops) or chk.rule_id} for {', '.join(models)} "
                                        f"(MODELS: {', '.join(target.models)})")
    if chk.ops and not target.has(*chk.ops):
        gone = {op: target.withheld(op) for op in chk.ops if not target.has(op)}
        plain = [op for op, why in gone.items() if why is None]
        return Outcome(NOT_IMPLEMENTED, "; ".join([f"missing {', '.join(plain)}"] * bool(plain)
                                                  + [why for why in gone.values() if why]))
    if chk.extension and chk.extension not in target.extensions:
        return Outcome(SKIP, f"extension {chk.extension} not declared")
    _DETECTED.clear()
    _STAGES.clear()
    _DECLARED.clear()
    target.received.call, target.received.unserved = None, ""
    start = time.perf_counter()
    standing = ()
    try:
        # A target's numeric warnings (NaN casts and the like) are not results; the checks judge values.
        # Short array reprs keep a falsifying example readable.
        with warnings.catch_warnings(), np.errstate(all="ignore"), \
                np.printoptions(threshold=24, edgeitems=3, linewidth=100):
            warnings.simplefilter("ignore", RuntimeWarning)
            chk.fn(target)
        status, detail = PASS, ""
    except NotImplementedOp as e:
        status, detail = NOT_IMPLEMENTED, f"missing {e}"
    except Unsatisfiable as e:      # every example asked for a model the target does not serve: n/i
        status, detail = (NOT_IMPLEMENTED, f"missing {target.received.unserved}") if target.received.unserved \
            else (ERROR, _describe(e))
    except Skip as e:
        status, detail = SKIP, str(e)
    except OperationTimeout as e:
        status, detail = TIMEOUT, str(e)
    except BaseException as e:  # noqa: BLE001 -- a target may raise anything; we report it
        if isinstance(e, KeyboardInterrupt):
            raise
        status, detail = (FAIL if _is_assertion(e) else ERROR), _describe(e)
        if status == ERROR or "default_rng" in detail:
            detail = _with_origin(detail, e, target)
        if getattr(_reported(e), "stages", None) is not None:      # the counterexample's own verdicts
            _STAGES.clear()
            record_stages(_reported(e).stages)
        standing = _standing(e)
    return Outcome(status, detail, time.perf_counter() - start, frozenset(_DETECTED), list(_STAGES.values()),
                   frozenset(_DECLARED), standing)


def _standing(e: BaseException) -> tuple:
    """The knobs read by each stage judge that failed on an explicit example: a run of the check under
    other values of knobs outside one of them judges that example again and fails it again."""
    raised = e.exceptions if isinstance(e, BaseExceptionGroup) else (e,)
    return tuple(v.knobs for x in raised if getattr(x, "on_explicit_example", False)
                 for v in getattr(x, "stages", ()) if v["status"] == FAIL and getattr(v, "knobs", None) is not None)


def run_rule(rule_id: str, target: Target, profile: str = "ci") -> Row:
    """Every check of one rule against one target, with variant naming.

    The detail holds the first failing check in full and one line for each other failing check."""
    r = RULES[rule_id]
    chks = checks_for(rule_id)
    if not chks:
        why = "informative: no check" if r.status == INFORMATIVE else "no check written for this rule"
        return Row(rule_id, target.name, SKIP if r.status == INFORMATIVE else ERROR, why)
    read: set = set()
    probe = _reading(target, read)
    outcomes = {c.name: run_check(c, probe, profile) for c in chks}
    # A rule is judged on the checks the target could run; n/i only when it could run none.
    ran = [o.status for o in outcomes.values() if o.status not in (NOT_IMPLEMENTED, SKIP)]
    status = max(ran or [o.status for o in outcomes.values()], key=SEVERITY.index)
    failing = [(n, o) for n, o in outcomes.items() if o.status in (FAIL, ERROR, TIMEOUT) and o.detail]
    same = [f"{n}: {o.detail}" for n, o in outcomes.items() if o.status == status and o.detail]
    detail = same[0] if same else ""
    others = [f"{o.status} {n}: {o.detail.splitlines()[0]}" for n, o in failing
              if not detail.startswith(f"{n}: ")]
    if others:
        detail += f"\nalso failing ({len(others)} more check{'s' * (len(others) > 1)}):\n" \
                  + "\n".join("  " + line for line in others)
    missing = len(outcomes) - len(ran)
    if ran and missing and status == PASS:
        why = sorted({o.detail for o in outcomes.values() if o.status in (NOT_IMPLEMENTED, SKIP)})
        detail = f"{len(ran)} of {len(outcomes)} checks ran; the others: " + "; ".join(why)
    stages = next((o.stages for o in outcomes.values() if o.status == status and o.stages), [])
    withheld = [v for v in stages if v["status"] == NOT_JUDGED]
    if status == PASS and withheld and not detail:
        detail = f"every stage judged passes; not judged: {', '.join(v['stage'] for v in withheld)} " \
                 f"({'; '.join(dict.fromkeys(v['detail'] for v in withheld))})"
    choices = sorted({f"{k}={v}" for o in outcomes.values() for k, v in o.detected if v != KNOBS[k].canonical})
    used = {f"{k}={v}" for o in outcomes.values() for k, v in o.declared}
    if r.knob and target.variant(r.knob) != KNOBS[r.knob].canonical:
        used.add(f"{r.knob}={target.variant(r.knob)}")
    if status == PASS and used:
        status, detail = VARIANT, "passes under declared " + ", ".join(sorted(used)) + _stages_under(stages)
    elif status == PASS and choices:
        status, detail = VARIANT, "detected: " + ", ".join(choices)
    elif status in (FAIL, ERROR):   # (an ERROR too: a target may reject what it reads in the wrong place)
        match = _matching_variant(r.knob, read, chks, target, profile, outcomes.values())
        if match and all(k in CHOICES and k not in target.declared for k, _ in match):
            status, detail = VARIANT, "detected: " + _named(match)
        elif match:
            detail = f"matches {_named(match)} (undeclared); " + detail
    seconds = sum(o.seconds for o in outcomes.values())
    repro = reproduce_command(target.spec, rule_id, profile, timeout=target.timeout) \
        if status in (FAIL, ERROR, TIMEOUT) else ""
    return Row(rule_id, target.name, status, detail, repro, seconds, {n: o.status for n, o in outcomes.items()}, stages)


def _stages_under(stages: list[dict]) -> str:
    """A layer rule's stages judged under a declared choice, each with the choice it read."""
    under = [f"{v['stage']} ({v['detail']})" for v in stages if v["status"] == VARIANT]
    return f"; stages VARIANT: {', '.join(under)}" if under else ""


def _reading(target: Target, read: set) -> Target:
    """A view of `target` that records in `read` every knob its checks ask for."""
    view = Target.__new__(Target)
    view.__dict__.update(target.__dict__)
    view.variant = lambda knob: (read.add(knob), Target.variant(target, knob))[1]
    return view


def _matching_variant(knob: str | None, read: set, chks: list[Check], target: Target,
                      profile: str, outcomes=()) -> list[tuple[str, str]] | None:
    """The undeclared knob values under which every check of a failing rule passes.

    Tried: each other value of the rule's own knob, then each other value of another knob the
    rule's checks read, alone (a choice another rule governs: an undeclared act_quant floor in a
    656-byte entry is LAYOUT.V32.MLA's, not a field order), then each value of the rule's own knob
    together with one such other value; for a rule without a knob, each other value of a knob its
    checks read that is an implementation-defined choice (the target may make it without saying) or
    a choice its judges read through declared_choice (a precision choice it should have declared:
    rope_table=bf16 on ROPE.PAIRS).
    Pairs are enough: a check judges one clause, so the knobs it reads are that clause's and the
    few its oracle shares; a third deviation in the same check breaks another clause, whose own
    rule names it.  Bounded by (values of the rule's knob) x (other values of the knobs read),
    about ten runs without shrinking.

    A variant is named only if it tells the target from the canonical reading: passing checks that
    the reference implementation (impl, canonical) passes as well show only a wider tolerance (the
    attn_order knob's list_order admits fp32 probabilities too), so such a variant is not named.
    A knob of a step left out on purpose (declared_only: kv_qdq, index_qdq, …) is never tried: its
    stages are whole layers, and a port that leaves a step out says so.  Nor is a combination that
    leaves alone every knob a stage read that failed on an explicit example (`outcomes`' standing):
    the check fails again there.
    """
    def others(k):
        return [(k, v) for v in KNOBS[k].values if v != target.variant(k)]

    if knob is not None and KNOBS[knob].declared_only:
        knob = None
    read = {k for k in read if not KNOBS[k].declared_only}

    if knob is None:
        combos = [[o] for k in sorted(read & (CHOICES | _CHOSEN)) for o in others(k)]
    else:
        own = others(knob)
        pairs = [p for k in sorted(read - {knob}) for p in others(k)]
        combos = [[o] for o in own] + [[p] for p in pairs] + [[o, p] for o in own for p in pairs]
    for combo in combos:
        if _still_failing(combo, outcomes) or REFERENCE_PASSES.get(_asking(chks, combo, profile)):
            continue
        view = target
        for k, v in combo:
            view = view.expecting(k, v)
        if _passes(chks, view, profile) and not _reference_passes(chks, combo, profile):
            return combo
    return None


# Whether the reference implementation passes a rule's checks judged as if it declared a combination:
# the same answer each time a process asks (the seed and the example count are in the question), so
# asked once.  A combination the reference is known to pass names no variant: the target need not run.
REFERENCE_PASSES: dict = {}


def _asking(chks: list[Check], combo: list[tuple[str, str]], profile: str) -> tuple:
    return tuple(chks), tuple(combo), profile, RUN.seed, RUN.max_examples


def _reference_passes(chks: list[Check], combo: list[tuple[str, str]], profile: str) -> bool:
    asking = _asking(chks, combo, profile)
    if asking not in REFERENCE_PASSES:
        REFERENCE_PASSES[asking] = _passes(chks, _reference_expecting(combo), profile)
    return REFERENCE_PASSES[asking]


def _still_failing(combo: list[tuple[str, str]], outcomes) -> bool:
    changed = {k for k, _ in combo}
    return any(not changed & knobs for o in outcomes for knobs in o.standing)


def _passes(chks: list[Check], target: Target, profile: str) -> bool:
    return all(run_check(c, target, profile, shrink=False).status in (PASS, NOT_IMPLEMENTED, SKIP) for c in chks)


def _reference_expecting(combo: list[tuple[str, str]]) -> Target:
    """The reference implementation (canonical in every knob) judged as if it declared `combo`."""
    from .target import load_target
    view = load_target("impl")
    for k, v in combo:
        view = view.expecting(k, v)
    return view


def _named(combo: list[tuple[str, str]]) -> str:
    return " + ".join(f"{k}={v}" for k, v in combo)


def reproduce_command(target_spec: str, rule_id: str, profile: str, seed: int | None = None,
                      timeout: float | None = None, isolate: bool | None = None) -> str:
    """A shell command that reruns one rule on one target, as printed, from any directory."""
    seed = RUN.seed if seed is None else seed
    parts = [RUN.program or program(), "verify", "--target", target_spec, "--rules", rule_id,
             "--profile", profile]
    if seed is not None and profile not in DERANDOMIZED:
        parts += ["--seed", str(seed)]
    if timeout is not None and timeout != DEFAULT_TIMEOUT:
        parts += ["--timeout", f"{timeout:g}"]
    if RUN.max_examples:
        parts += ["--max-examples", str(RUN.max_examples)]
    if RUN.isolate if isolate is None else isolate:
        parts.append("--isolate")
    return " ".join([parts[0]] + [shlex.quote(p) for p in parts[1:]])


def program(target_specs=()) -> str:
    """How to call dsv4spec from any directory: `dsv4spec` when that is this installation's
    command on PATH, else this interpreter with -m; prefixed with PYTHONPATH when dsv4spec or a
    target's module would not be found by a fresh interpreter elsewhere (a module beside the user,
    a checkout on PYTHONPATH)."""
    from .target import BUILTIN, _entry_points
    script = shutil.which("dsv4spec")
    ours = script and os.path.realpath(os.path.dirname(script)) == os.path.realpath(os.path.dirname(sys.executable))
    command = "dsv4spec" if ours else f"{shlex.quote(sys.executable)} -m dsv4spec"
    named = {**_entry_points(), **BUILTIN}
    modules = ["dsv4spec"] + [s.partition(":")[0].split(".")[0] for s in target_specs if s not in named]
    paths = list(dict.fromkeys(p for m in dict.fromkeys(modules) for p in [_home_if_local(m)] if p))
    return (f"PYTHONPATH={shlex.quote(os.pathsep.join(paths))} " if paths else "") + command


@functools.lru_cache(maxsize=None)
def _home_if_local(module: str) -> str | None:
    """The folder `module` is imported from, when a fresh interpreter started in / without
    PYTHONPATH would not find this same module; else None."""
    import importlib.util
    import subprocess
    found = importlib.util.find_spec(module)
    if found is None or not found.origin:
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = f"import importlib.util; s = importlib.util.find_spec({module!r}); print(s and s.origin)"
    elsewhere = subprocess.run([sys.executable, "-c", probe], cwd="/", env=env, capture_output=True, text=True)
    if elsewhere.stdout.strip() == found.origin:
        return None
    origin = os.path.dirname(found.origin)
    return os.path.dirname(origin) if found.submodule_search_locations else origin


def verify(targets: list[Target], prefixes: list[str] | None = None, profile: str = "ci",
           progress=None, rule_ids: list[str] | None = None) -> list[Row]:
    """Every selected rule (by prefixes, or the rule_ids given) on every target, in this process,
    target by target."""
    rules = [RULES[r] for r in rule_ids] if rule_ids is not None else select(prefixes)
    load_checks()
    rows = []
    for t in targets:
        for r in rules:
            row = run_rule(r.id, t, profile)
            rows.append(row)
            if progress:
                progress(row)
    return rows


def exit_status(rows: list[Row], targets: list[Target], expected=frozenset()) -> int:
    """0 when every target that claims conformance has no FAIL, ERROR or TIMEOUT (on a rule not
    listed as `expected` to fail: an xfail file's)."""
    claiming = {t.name for t in targets if t.claims_conformance}
    bad = [r for r in rows if r.target in claiming and r.status in (FAIL, ERROR, TIMEOUT) and r.rule_id not in expected]
    return 1 if bad else 0


def _is_assertion(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return all(_is_assertion(x) for x in e.exceptions)
    return isinstance(e, AssertionError)


# Hypothesis's own advice is about editing a test file, which a target's author does not have.
_INTERNAL = ("@reproduce_failure", "reproduce this test case", "Hypothesis", "settings(", "--hypothesis",
             "Verbosity")


def _with_origin(detail: str, e: BaseException, target: Target) -> str:
    """A detail with where in the target the exception was raised (file:line of the target's
    frames; every frame with RUN.debug) and the inputs of the call it was raised in."""
    frames = _target_frames(e)
    if frames is None:          # not raised in a call into the target: the check's own draw says it
        return detail
    if frames and not RUN.debug and len(frames) > 3:
        frames = [frames[0], None, *frames[-2:]]
    where = ["raised in the target" + (" (every frame, --debug)" if RUN.debug else "") + ":"] + [
        "  …" if f is None else f"  {f.filename}:{f.lineno} in {f.name}" + (f": {f.line}" if f.line else "")
        for f in frames] if frames else []
    return "\n".join([detail, *where, target.received.describe(_reported(e))])


def _reported(e: BaseException) -> BaseException:
    """The exception a detail describes: of several (an ExceptionGroup of Hypothesis's), the first."""
    return e.exceptions[0] if isinstance(e, BaseExceptionGroup) else e


def _target_frames(e: BaseException):
    """The frames below the suite's call into the target (the operation's own code, innermost
    last); [] when the exception is the contract's, on a result; None when it was not raised in a
    call into the target."""
    import traceback
    from . import contract as target_module
    e = _reported(e)
    ours = os.path.realpath(target_module.__file__)
    frames = traceback.extract_tb(e.__traceback__)
    entry = next((i for i, f in enumerate(frames) if f.name == "call" and os.path.realpath(f.filename) == ours), None)
    if entry is None:
        return None
    mine = frames[entry + 1:]
    return [] if not mine or os.path.realpath(mine[0].filename) == ours else mine


def _describe(e: BaseException, limit: int = 2500, max_lines: int = 40) -> str:
    # several distinct failing examples (Hypothesis's group): the first in full, the others a line each
    others = list(e.exceptions[1:]) if isinstance(e, BaseExceptionGroup) else []
    e = _reported(e)
    text = _first_example(e, max_lines)
    text = text if len(text) <= limit else text[:limit] + " …"
    if others:
        heads = [_first_example(o, 1).splitlines()[0][:200] for o in others[:_MORE_EXAMPLES]]
        more = len(others) - len(heads)
        text += (f"\nalso failing: {len(others)} more example{'s' * (len(others) > 1)} with another error:\n"
                 + "\n".join("  " + h for h in heads) + (f"\n  … and {more} more" if more else ""))
    return text


_MORE_EXAMPLES = 4     # the other failing examples of a check, one line each


def _first_example(e: BaseException, max_lines: int) -> str:
    text = f"{type(e).__name__}: {e}" if not isinstance(e, AssertionError) else str(e)
    notes = [n for n in getattr(e, "__notes__", []) if n.strip() and not any(k in n for k in _INTERNAL)]
    if notes:
        text += "\n" + "\n".join(notes)
    for words in ("Failing explicit example:", "Falsifying explicit example:", "Failing test case:",
                  "Falsifying example:"):
        text = text.replace(words, "counterexample:")
    lines = text.splitlines()
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"… ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)
