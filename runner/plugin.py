"""The pytest route: `pytest --dsv4spec-target T [...]` runs the suite as one pytest item per
(rule, target), beside a project's own tests.  Registered through the `pytest11` entry point, so it
is active wherever dsv4spec is installed, and does nothing without --dsv4spec-target.

    pytest --dsv4spec-target mypkg.fp4:Codec --dsv4spec-profile dev --dsv4spec-rules FP4,FMT \\
           --dsv4spec-xfail known.txt --dsv4spec-skip skip.txt [--dsv4spec-isolate]

With --dsv4spec-isolate the targets run in one worker process kept for the session (as `dsv4spec
verify --isolate`): a segfault, an abort or a hang in C code is that item's ERROR or TIMEOUT, a
fresh worker takes the next item, and the session completes with its summary and --junitxml.
Items are then named by the target's spec (the target is not imported in pytest's process).
Without it the session is forked before any target is loaded (pytest_guard.py): a target that ends
pytest's process is the running item's error, with the summary, --junitxml and exit status 1.  A
non-daemon thread a target leaves running is named in the summary and makes the exit status 1.

PASS and VARIANT pass; NOT_IMPLEMENTED and SKIP are skipped with their reason; FAIL, ERROR and
TIMEOUT fail with the decoded counterexample and the command that reproduces them -- XFAIL on a
target that sets CLAIMS_CONFORMANCE = False, as `dsv4spec verify` exits 0 for it.  Skip and xfail
files hold one entry a line, a rule id or prefix, then the reason:

    # known.txt
    FP4.KV.SCALE      our E4M3 scale uses the reciprocal (ticket 123)
    IDX.TOPK          ties broken by position

An entry that matches no selected rule is reported as a warning, so a stale list shows up.  The
seed of a dev or thorough run is --dsv4spec-seed, else $DSV4SPEC_SEED, else a fresh one; it is
printed in the header and every reproduce line, and shared by pytest-xdist workers.

Hypothesis's own options keep their meaning for the project's tests and leave the suite's alone:
the suite runs under profiles of its own (`dsv4spec-ci`, ...), applied to its checks only, so no
profile of the user's (Hypothesis's built-in `ci` under CI=true included) changes.
`--hypothesis-seed N` seeds a dev or thorough run as --dsv4spec-seed would (the two must agree)
and is reported ignored for the derandomized ci profile; `--hypothesis-profile NAME` applies to
the project's tests only, and naming one of the suite's profiles that is not registered with
Hypothesis is refused in one line (the suite's profile is --dsv4spec-profile).
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest

from .entries import matching, read_entries, stale

SEED_VARIABLE = "DSV4SPEC_SEED"


def _timeout(text: str) -> float:
    import argparse
    from .target import timeout_seconds
    try:
        return timeout_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pytest_addoption(parser):
    group = parser.getgroup("dsv4spec", "dsv4spec conformance suite")
    group.addoption("--dsv4spec-target", action="append", default=[], metavar="T",
                    help="a target, as for `dsv4spec verify --target` (repeatable; default: $DSV4SPEC_TARGET, "
                         "comma-separated); enables the suite")
    group.addoption("--dsv4spec-max-examples", type=int, metavar="N", help="examples per check, instead of the profile's")
    group.addoption("--dsv4spec-profile", default="ci", metavar="P", help="ci (default), dev or thorough")
    group.addoption("--dsv4spec-rules", metavar="PREFIX,...", help="only rules whose id starts with a prefix")
    group.addoption("--dsv4spec-seed", type=int, metavar="N", help="seed of the dev and thorough profiles")
    group.addoption("--dsv4spec-timeout", type=_timeout, metavar="S",
                    help="seconds one operation call may take (positive, finite, at most a day)")
    group.addoption("--dsv4spec-isolate", action="store_true",
                    help="run the targets in a worker process, as `dsv4spec verify --isolate`: a crash or a "
                         "hang (even in C code) costs only the rule that was running, not the session")
    group.addoption("--dsv4spec-skip", metavar="FILE", help="rules to skip: `RULE-or-prefix reason` per line")
    group.addoption("--dsv4spec-xfail", metavar="FILE", help="rules expected to fail: `RULE-or-prefix reason` per line")


class Settings:
    """What the options select, resolved once per session."""

    def __init__(self, config):
        from .suite import DERANDOMIZED, PROFILES, RUN, new_seed, program
        from .target import TargetLoadError, TargetNotFound, load_target, locate
        from ..spec.rules import select
        get = config.getoption
        self.profile = get("dsv4spec_profile")
        if self.profile not in PROFILES:
            raise pytest.UsageError(f"--dsv4spec-profile: unknown profile {self.profile!r}; expected one of "
                                    f"{', '.join(PROFILES)}")
        prefixes = [p.strip() for p in (get("dsv4spec_rules") or "").split(",") if p.strip()] or None
        self.isolate = get("dsv4spec_isolate")
        try:
            self.rules = [r.id for r in select(prefixes)]
            self.targets = [Isolated(locate(spec), spec) if self.isolate else load_target(spec)
                            for spec in target_specs(config)]
        except (ValueError, TargetNotFound, TargetLoadError) as e:
            raise pytest.UsageError(f"dsv4spec: {e}") from None
        for t in self.targets:
            t.timeout = get("dsv4spec_timeout") or t.timeout
        seed, self.notes = _seed_option(config, self.profile, DERANDOMIZED)
        seed = seed if seed is not None else int(os.environ.get(SEED_VARIABLE) or new_seed())
        os.environ[SEED_VARIABLE] = str(seed)       # pytest-xdist workers, started later, share it
        RUN.seed = None if self.profile in DERANDOMIZED else seed
        RUN.program = program(target_specs(config))
        RUN.max_examples = get("dsv4spec_max_examples")
        RUN.isolate = self.isolate
        self.seed = RUN.seed
        try:
            self.skip = read_entries(get("dsv4spec_skip"), "--dsv4spec-skip")
            self.xfail = read_entries(get("dsv4spec_xfail"), "--dsv4spec-xfail")
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None


def _seed_option(config, profile: str, derandomized) -> tuple[int | None, list[str]]:
    """The seed --dsv4spec-seed or --hypothesis-seed asks for, and what the header says about them."""
    ours, theirs = config.getoption("dsv4spec_seed"), config.getoption("hypothesis_seed", None)
    if theirs is None:
        return ours, []
    try:
        theirs = int(theirs)
    except ValueError:
        raise pytest.UsageError(f"dsv4spec: --hypothesis-seed {theirs!r}: the suite's seed is an integer; "
                                "give an integer or --dsv4spec-seed") from None
    if profile in derandomized:
        return ours, [f"--hypothesis-seed {theirs} ignored by dsv4spec: profile {profile} is derandomized "
                      "(--dsv4spec-profile dev takes a seed)"]
    if ours is not None and ours != theirs:
        raise pytest.UsageError(f"dsv4spec: --dsv4spec-seed {ours} and --hypothesis-seed {theirs} disagree; give one")
    return theirs, []


class Isolated:
    """A target loaded only in the worker process (--dsv4spec-isolate): named by its spec here."""

    def __init__(self, _ref: str, spec: str):
        from .target import DEFAULT_TIMEOUT_S
        self.spec = self.name = spec
        self.claims_conformance, self.timeout = True, DEFAULT_TIMEOUT_S


def target_specs(config) -> list[str]:
    """--dsv4spec-target, else $DSV4SPEC_TARGET (comma-separated), as array-api-tests' module variable."""
    from .target import targets_from_environment
    return config.getoption("dsv4spec_target") or targets_from_environment()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not target_specs(config):
        return
    _refuse_an_unregistered_suite_profile(config)
    from . import pytest_guard
    if pytest_guard.guarded(config):        # before any target is loaded: it may end the process
        pytest_guard.fork_the_session(config)
    config.pluginmanager.register(Session(Settings(config)), "dsv4spec-session")


def _refuse_an_unregistered_suite_profile(config):
    """--hypothesis-profile dev (meaning the suite's dev) would crash Hypothesis's own plugin."""
    from hypothesis import settings
    from .suite import PROFILES
    name = config.getoption("hypothesis_profile", None)
    if name in PROFILES:
        try:
            settings.get_profile(name)
        except Exception:       # noqa: BLE001 -- InvalidArgument: not registered
            raise pytest.UsageError(f"dsv4spec: --hypothesis-profile {name}: Hypothesis has no profile {name!r} "
                                    f"(that option selects a profile of your tests); the suite's profile is "
                                    f"--dsv4spec-profile {name}") from None


class Session:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.pool = None
        self.left: dict[str, list[str]] = {}        # what the targets left running: threads, processes
        self.exitstatus = 0

    def run_rule(self, rule_id: str, target, profile: str):
        """One rule's row, in this process or (--dsv4spec-isolate) in the session's worker."""
        from .suite import load_checks, run_rule
        if not self.settings.isolate:
            load_checks()
            return run_rule(rule_id, target, profile)
        from . import workers
        if self.pool is None:
            self.pool = workers.Pool(jobs=1, seed=self.settings.seed, timeout=target.timeout, isolate=True)
        rows, infos = self.pool.run([target.spec], [rule_id], profile)
        target.claims_conformance = infos[target.spec].claims_conformance or bool(infos[target.spec].load_error)
        self._note(infos[target.spec])
        return rows[0]

    def _note(self, info):
        """What a target left running in its worker (a TargetInfo), kept for the findings."""
        for kind in ("threads", "processes"):
            self._left(f"non-daemon thread(s) in {info.spec}'s worker" if kind == "threads"
                       else f"process(es) from {info.spec}'s worker (ended)", getattr(info, f"{kind}_left"))

    def _left(self, what: str, names: list[str]):
        known = self.left.setdefault(what, [])
        known.extend(n for n in names if n not in known)

    def _end_the_targets(self):
        """Close the exec ports and the worker before the verdict: a process a port left running
        after it ended (named, killed) is a finding, as in `dsv4spec verify`."""
        from .exec_target import left_by
        if self.pool is not None:
            self.pool.close()
            for info in self.pool.infos.values():
                self._note(info)
        for target in self.settings.targets:
            self._left(f"process(es) from {target.spec}'s exec port (ended)", left_by(target, close=True))

    def findings(self) -> list[str]:
        """What the targets left running, each a line; the session's exit status is at least 1 for any."""
        from .workers import threads_left
        if not self.settings.isolate and (left := threads_left()):
            self.left["non-daemon thread(s) in pytest's process"] = left
        return [f"dsv4spec: the targets left {len(names)} {what} running: {', '.join(names)}; a target must "
                f"end what it starts (exit status 1 at least; the session ended regardless)"
                for what, names in self.left.items() if names]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self._end_the_targets()
        if self.findings():
            session.exitstatus = max(int(exitstatus), 1)
        self.exitstatus = int(session.exitstatus)

    def pytest_terminal_summary(self, terminalreporter):
        for line in self.findings():
            terminalreporter.write_line(line, red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        if self.pool is not None:
            self.pool.close()
        if self.findings() and not self.settings.isolate:      # a thread that would hold the process at exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exitstatus)

    def pytest_report_header(self, config):
        s = self.settings
        seed = "derandomized" if s.seed is None else f"seed {s.seed}"
        return [f"dsv4spec: profile {s.profile} ({seed}); targets {', '.join(t.spec for t in s.targets)}; "
                f"{len(s.rules)} rules", *(f"dsv4spec: {note}" for note in s.notes)]

    def pytest_collection_modifyitems(self, session, config, items):
        s = self.settings
        for kind, entries in (("--dsv4spec-skip", s.skip), ("--dsv4spec-xfail", s.xfail)):
            for warning in stale(entries, s.rules, kind):
                warnings.warn(pytest.PytestConfigWarning(warning))
        for target in s.targets:
            for rule_id in s.rules:
                name = f"{rule_id}[{target.name}]"
                item = RuleItem.from_parent(session, name=name, nodeid=f"dsv4spec::{name}", rule_id=rule_id,
                                            target=target, profile=s.profile, runner=self)
                skip, xfail = matching(s.skip, rule_id), matching(s.xfail, rule_id)
                if skip:
                    item.add_marker(pytest.mark.skip(reason=skip[1]))
                elif xfail:
                    item.add_marker(pytest.mark.xfail(reason=xfail[1], raises=RuleFailed, strict=False))
                items.append(item)


class RuleFailed(Exception):
    """A FAIL, ERROR or TIMEOUT row."""


class RuleItem(pytest.Item):
    def __init__(self, *, rule_id, target, profile, runner, **kwargs):
        super().__init__(**kwargs)
        self.rule_id, self.target, self.profile, self.runner = rule_id, target, profile, runner
        self.row = None

    def runtest(self):
        from .suite import ERROR, FAIL, NOT_IMPLEMENTED, SKIP, TIMEOUT, VARIANT
        self.row = self.runner.run_rule(self.rule_id, self.target, self.profile)
        self.user_properties.append(("dsv4spec_status", self.row.status))
        if self.row.status in (NOT_IMPLEMENTED, SKIP):
            pytest.skip(f"{self.row.status}: {self.row.detail}")
        if self.row.status in (FAIL, ERROR, TIMEOUT) and not self.target.claims_conformance:
            pytest.xfail(f"{self.row.status} on a target that claims no conformance (CLAIMS_CONFORMANCE = False): "
                         + (self.row.detail.splitlines() or [""])[0])
        if self.row.status in (FAIL, ERROR, TIMEOUT):
            raise RuleFailed(self.row.status)
        if self.row.status == VARIANT:
            self.user_properties.append(("dsv4spec_variant", self.row.detail))

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, RuleFailed) and self.row is not None:
            from ..spec import RULES
            r = self.row
            return "\n".join([f"{r.status} {r.rule_id} on {r.target}: {RULES[r.rule_id].title}", "", r.detail, "",
                              f"reproduce: {r.reproduce}"])
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return "dsv4spec", 0, f"{self.rule_id}[{self.target.name}]"
