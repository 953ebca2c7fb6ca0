"""What a check is and what it may call: the checks' side of the suite, which the family modules
import (the runner, dsv4spec.runner.suite, runs them).

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

import contextlib
import functools
import inspect
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, example, given, seed as hypothesis_seed, settings

from ..spec import RULES
from ..spec.rules import EXTENSIONS, IMPLEMENTATION_DEFINED, KNOBS

PASS, FAIL, ERROR, TIMEOUT = "PASS", "FAIL", "ERROR", "TIMEOUT"
# One word for a missing operation everywhere (matrix, progress, JSON, JUnit, pytest): n/i.
NOT_IMPLEMENTED, SKIP, VARIANT = "n/i", "SKIP", "VARIANT"
# A layer rule's stage the target was not given the inputs of (properties/stages.py)
NOT_JUDGED = "not judged"
# When a rule has several checks, the worst outcome is the rule's.
SEVERITY = [PASS, VARIANT, SKIP, NOT_IMPLEMENTED, TIMEOUT, FAIL, ERROR]

# The explain phase can take minutes on a failing stateful check; reports already decode the failure.
_phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_health = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example]
# print_blob is off: a report's reproduction is the printed command with its --seed, not a decorator.
# Registered under names of the suite's own (dsv4spec-ci, ...), each from Hypothesis's defaults, and
# applied to each check by decorator, never loaded: the user's profiles (Hypothesis's built-in `ci`
# under CI=true, their own `dev`) and the profile their tests run under stay as they were.
_BASE = dict(phases=_phases, deadline=None, database=None, print_blob=False, suppress_health_check=_health)


def register_profile(name: str, parent: str = "default", **values):
    """Register the suite's profile `name` (a child of its profile `parent`) under its own name."""
    settings.register_profile(hypothesis_profile(name), parent=settings.get_profile(
        parent if parent == "default" else hypothesis_profile(parent)), **values)


def hypothesis_profile(name: str) -> str:
    """The name under which the suite's profile `name` is registered with Hypothesis."""
    return f"dsv4spec-{name}"


register_profile("ci", **_BASE, derandomize=True, max_examples=25)
register_profile("dev", **_BASE, max_examples=100)
register_profile("thorough", **{**_BASE, "phases": tuple(Phase)}, max_examples=2000)
PROFILES = ("ci", "dev", "thorough")
DERANDOMIZED = ("ci",)


@contextlib.contextmanager
def examples_from_the_seed_alone():
    """While a check runs: Hypothesis mixes the literals of every 'local' module that happens to be
    imported into its examples, so one seed drew different examples in the CLI, in a worker process
    and under pytest, and in a checkout versus an installed wheel: a printed seed did not reproduce.
    The checks carry their own edge values, so the suite turns that mining off for its own checks
    only (a private hook of Hypothesis, present in the range pyproject.toml pins and tested in
    tests/test_suite.py; without it, nothing changes) and gives it back after each, so that a
    user's own Hypothesis tests in the same process (the pytest plugin) draw as they would alone."""
    try:
        from hypothesis.internal.conjecture import providers
        original, cache = providers._get_local_constants, providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: _NO_LOCAL_CONSTANTS
    cache.clear()                   # filtered from the constants of whoever ran before
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


def _no_local_constants():
    """Hypothesis's collection of local constants, emptied (None without the private hook)."""
    import copy
    try:
        from hypothesis.internal.conjecture import providers
        empty = copy.deepcopy(providers._local_constants)
        for name in ("integers", "floats", "bytes", "strings"):
            getattr(empty, name).clear()
        return empty
    except (ImportError, AttributeError):
        return None


_NO_LOCAL_CONSTANTS = _no_local_constants()
SEED_ALONE = _NO_LOCAL_CONSTANTS is not None
# Examples per check in the ci profile, by rule-id prefix (the longest matching prefix wins; 25
# otherwise), sized by measurement.  CPU ms per generated example, impl / kernels in the Triton
# interpreter: FMT 1–3 / 5–9; FP4 2–5 / 12–26; FP8 1–3 / 9–13; IDX.VISIBLE, IDX.WEIGHT 1 / 6;
# the other IDX 1–20 / 16–75; POOL 1–8 / 55–68 (POOL.SIZE 480); HAD.MATRIX 54 / 110; FP8.LINEAR
# about 300 (impl, one K-block GEMM of real width an example).  About 3 s of
# interpreted kernel time per rule, so that `make test` stays well under 10 minutes on 2 cores.
# A layer check (index_layer, attention_layer) costs 2–5 CPU s a case at the profile's real widths:
# its fixed cases (path.FIXED_LAYERS) run as explicit examples and ci draws 2 more (a key "RULE::check" sizes one
# check of a rule whose other checks are cheap).
LAYER_CHECKS = ("PATH.Q.PROJ", "PATH.K.PROJ", "PATH.K.NORM", "PATH.HADAMARD", "PATH.W.PROJ", "ROPE.POSITIONS",
                "PATH.ORDER::layer_quantizes_after_rope", "PATH.LAYER", "ATTN.LAYER", "PATH.K.PUBLISHED")
CI_EXAMPLES = {"FMT": 400, "FP4": 200, "FP8": 200, "FP8.LINEAR": 50, "IDX": 50, "IDX.VISIBLE": 400, "IDX.WEIGHT": 400,
               "POOL": 50, "POOL.SIZE": 25, **dict.fromkeys(LAYER_CHECKS, 2)}
# The layer checks draw whole layers: dev and thorough draw 10 and 100 of them (a dev seed's layer
# rules then take minutes, not hours), every other check the profile's own count.
LAYER_DRAWS = {"dev": 10, "thorough": 100}
for _n in set(CI_EXAMPLES.values()):
    register_profile(f"ci/{_n}", parent="ci", max_examples=_n)
for _p, _n in LAYER_DRAWS.items():
    register_profile(f"{_p}/{_n}", parent=_p, max_examples=_n)
for _p in (*PROFILES, *(f"ci/{_n}" for _n in set(CI_EXAMPLES.values())), *(f"{p}/{n}" for p, n in LAYER_DRAWS.items())):
    # naming a variant only asks whether a check passes: no shrinking
    register_profile(f"{_p}-noshrink", parent=_p, phases=(Phase.explicit, Phase.reuse, Phase.generate))


def profile_for(rule_id: str, profile: str, check: str | None = None) -> str:
    """The Hypothesis profile a rule's checks (or its check named `check`) run under: ci is sized
    per rule (CI_EXAMPLES); dev and thorough draw LAYER_DRAWS layers in a layer check."""
    if profile != "ci":
        return f"{profile}/{LAYER_DRAWS[profile]}" if profile in LAYER_DRAWS and _is_layer_check(rule_id, check) else profile
    if f"{rule_id}::{check}" in CI_EXAMPLES:
        return f"ci/{CI_EXAMPLES[f'{rule_id}::{check}']}"
    prefixes = [p for p in CI_EXAMPLES if rule_id == p or rule_id.startswith(p + ".")]
    return f"ci/{CI_EXAMPLES[max(prefixes, key=len)]}" if prefixes else "ci"


def _is_layer_check(rule_id: str, check: str | None) -> bool:
    return rule_id in LAYER_CHECKS or f"{rule_id}::{check}" in LAYER_CHECKS


def settings_for(rule_id: str, profile: str, shrink: bool = True, check: str | None = None) -> settings:
    """The Hypothesis settings a rule's checks run under (the suite's own registered profile)."""
    sized = profile_for(rule_id, profile, check)
    chosen = settings.get_profile(hypothesis_profile(sized if shrink else f"{sized}-noshrink"))
    return settings(chosen, max_examples=RUN.max_examples) if RUN.max_examples else chosen


def examples_per_check(rule_ids: list[str], profile: str) -> dict[str, int]:
    """The examples each check of each rule generates in a profile (--max-examples included): the
    cost a report's header shows, since a check's time is about examples × ms per example."""
    return {r: settings_for(r, profile).max_examples for r in rule_ids}


class Skip(Exception):
    """The check does not apply to this target (a reason is given)."""


def skip(reason: str):
    raise Skip(reason)


_DETECTED: set = set()
# Knobs of implementation-defined rules: choices a target may make without declaring them.  A rule
# that fails as expected but passes under another value of one of these is VARIANT ("detected").
CHOICES = frozenset(r.knob for r in RULES.values() if r.status == IMPLEMENTATION_DEFINED and r.knob)


def detected(knob: str, value: str):
    """Record which allowed choice of an implementation-defined knob the target made (undeclared).

    A check of an implementation-defined rule accepts every allowed behaviour of a target that
    declares none, and reports here the one it saw; the rule is then PASS for the canonical choice
    and VARIANT ("detected: knob=value") for another.
    """
    _DETECTED.add((knob, value))


_STAGES: dict = {}


def record_stages(verdicts: list[dict]):
    """Record a layer case's verdicts stage by stage (properties/stages.py): over a check's examples
    each stage keeps its worst verdict (FAIL, then VARIANT: passed under a declared choice, then PASS,
    then not judged) and its first detail."""
    rank = (NOT_JUDGED, PASS, VARIANT, FAIL)
    for v in verdicts:
        kept = _STAGES.get(v["stage"])
        if kept is None or rank.index(v["status"]) > rank.index(kept["status"]):
            _STAGES[v["stage"]] = dict(v)


_DECLARED: set = set()
_CHOSEN: set = set()        # the knobs judges read through declared_choice: tried in naming a variant


def declared_choice(target, knob: str) -> str:
    """The target's value of `knob`, for a judge whose reading it changes; a value other than the
    canonical one is recorded, and a rule whose checks pass under it reads VARIANT ("passes under
    declared knob=value"), whatever knob the rule itself names (a declared step left out, a
    precision choice: runner/suite.py's run_rule).  Undeclared, such a choice is named on a failing rule
    without a knob of its own too (_matching_variant)."""
    _CHOSEN.add(knob)
    value = target.variant(knob)
    if value != KNOBS[knob].canonical:
        _DECLARED.add((knob, value))
    return value


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
    permanent @example.  The run's seed (RUN.seed) seeds every check of a randomized profile.
    """
    def wrap(body):
        @functools.wraps(body)
        def run(target):
            fn = _marking_explicit(_announced(body, target, len(examples)), len(examples))
            # inner's source is what Hypothesis hashes into a derandomized profile's draws: keep it as is
            def inner(**drawn):
                fn(target, **drawn)
            inner.__name__ = inner.__qualname__ = body.__name__  # Hypothesis names it in a falsifying example
            inner.__signature__ = inspect.Signature(
                [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in strategies])
            test = given(**strategies)(inner)
            for ex in reversed(examples):
                test = example(**ex)(test)
            if RUN.seed is not None:
                test = hypothesis_seed(RUN.seed)(test)
            with examples_from_the_seed_alone():
                settings(RUN.settings)(test)()
        del run.__wrapped__               # the check's own signature is (target)
        return run
    return wrap


def _announced(fn, target, explicit: int):
    """fn, telling a target that listens (coverage's recorder: target.example_starts) whether each
    example is one of the `explicit` @examples (Phase.explicit runs them first) or a drawn one."""
    started = getattr(target, "example_starts", None)
    if started is None:
        return fn
    count = iter(range(1, 1 << 62))

    def announced(target, **drawn):
        started(explicit=next(count) <= explicit)
        return fn(target, **drawn)
    return announced


def _marking_explicit(fn, explicit: int):
    """fn, marking what it raises on one of the `explicit` @examples (on_explicit_example): every run
    of the check, shrinking or not, runs each of them (Phase.explicit, first)."""
    count = iter(range(1, 1 << 62))

    def marked(target, **drawn):
        on_explicit = next(count) <= explicit
        try:
            return fn(target, **drawn)
        except Exception as e:
            e.on_explicit_example = on_explicit
            raise
    return marked


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


class Run:
    """The settings of the run in progress, read by the checks' runner: the seed of randomized
    profiles and the program that reproduces a result (`reproduce_command`)."""

    def __init__(self):
        self.seed: int | None = None
        self.program: str | None = None
        self.isolate = False            # reproduce in a worker process too (a crash or hang stays contained)
        self.debug = False              # an ERROR lists every frame of the target's, not the first and last two
        self.max_examples: int | None = None    # examples per check, overriding the profile's (--max-examples)
        self.settings = settings.get_profile(hypothesis_profile("ci"))     # of the check now running


RUN = Run()
