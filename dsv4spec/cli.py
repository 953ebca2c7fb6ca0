"""The `dsv4spec` command line."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from dsv4spec.command import (  # noqa: F401 -- Terminated and UsageError re-exported where they always were
    SIGNALLED, Terminated, Unloaded, UsageError, act_on_a_signal, handled, prefixes, printed, processes_finding,
    report_finding, report_processes_left, report_threads_left, shard_argument, terminated_as_interrupted,
    threads_finding)
from dsv4spec.interpreter import skip_dead_overflow_checks

DEFAULT_TARGETS = ["impl", "kernels", "ml_dtypes", "torch"]
STDOUT = "-"        # a report path meaning standard output (the matrix then goes to standard error)


def cmd_rules(args) -> int:
    from dsv4spec.spec import select
    rules = select(prefixes(args.rules))
    if not rules:
        raise UsageError("the rule registry is empty")
    if args.json:
        print(json.dumps([{"id": r.id, "title": r.title, "statement": r.statement, "status": r.status,
                           "applies_to": list(r.applies_to), "policy": r.policy,
                           "sources": list(r.sources), "knob": r.knob, "differs": r.differs}
                          for r in rules], indent=2))
        return 0
    width = max(len(r.id) for r in rules)
    for r in rules:
        status = {"normative": "N", "implementation-defined": "I", "informative": "i"}[r.status]
        print(f"{r.id.ljust(width)}  {status}  {r.policy:<10}  {r.title}")
    print(f"\n{len(rules)} rules (N normative, I implementation-defined, i informative); "
          f"`dsv4spec rules --json` for the full records, SPEC.md for the text.")
    return 0


def cmd_ops(args) -> int:
    """The operation contract: every operation a target may provide, and the rules that check it."""
    import importlib
    from dsv4spec.runner.suite import FAMILY_MODULES, load_checks
    checks = load_checks()
    families = [f for f in FAMILY_MODULES if not args.family or f == args.family]
    if not families:
        raise UsageError(f"unknown family {args.family!r}; expected one of {', '.join(FAMILY_MODULES)}")
    declared = {f: getattr(importlib.import_module(f"dsv4spec.properties.{f}"), "OPS", {}) for f in FAMILY_MODULES}
    every = {op: doc for ops in declared.values() for op, doc in ops.items()}
    table = {}
    for family in families:
        module = f"dsv4spec.properties.{family}"
        ops = declared[family] or {     # formats: its checks call quant's element codecs
            op: every[op] for op in sorted({op for c in checks if c.fn.__module__ == module for op in c.ops})
            if args.family or op not in every}      # listed once, under the family that declares it
        for op, doc in ops.items():
            rules = sorted({c.rule_id for c in checks if op in c.ops})
            table.setdefault(family, []).append({"op": op, "signature": doc, "rules": rules})
    from dsv4spec.runner.target import CONTRACT_CHANGES, CONTRACT_VERSION
    if args.json:
        contract = {"version": CONTRACT_VERSION,
                    "changes": [{"version": v, "date": date, "change": text}
                                for v, (date, text) in CONTRACT_CHANGES.items()]}
        print(json.dumps({"contract": contract, **table}, indent=2))
        return 0
    print(f"# contract version {CONTRACT_VERSION} (a target may declare CONTRACT = N, the version it was "
          "written against; docs/ADAPTERS.md lists the changes)\n")
    for family, ops in table.items():
        print(f"# {family}  (contract: properties/{family}.py)")
        for entry in ops:
            print(f"  {entry['signature']}")
            print(f"      checked by: {', '.join(entry['rules']) or '-'}")
        print()
    return 0


def cmd_spec(args) -> int:
    from dsv4spec.spec.document import render
    text = render()
    if args.write:
        Path(args.write).write_text(text)
        print(f"wrote {args.write}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_verify(args) -> int:
    from dsv4spec.runner.entries import matching
    from dsv4spec.runner.suite import DERANDOMIZED, RUN, new_seed, program
    rule_ids, specs, skip, xfail = _checked_verify_args(args)
    if args.seed is not None and args.profile in DERANDOMIZED:
        print(f"dsv4spec verify: --seed {args.seed} is ignored: profile {args.profile} is derandomized "
              "(--profile dev or thorough takes a seed)", file=sys.stderr)
    RUN.seed = None if args.profile in DERANDOMIZED else (args.seed if args.seed is not None else new_seed())
    RUN.program = program(specs)
    RUN.debug = bool(getattr(args, "debug", False))
    RUN.max_examples = args.max_examples
    run = _Run(args, specs, rule_ids, [r for r in rule_ids if not matching(skip, r)], skip, xfail)
    # The command (not the library) outlives its targets: an in-process run goes on in a forked
    # child, whose end without a verdict (os._exit, C exit, a signal) the parent reports itself.
    if _forks(args):
        from dsv4spec import guard
        return guard.supervised(run)
    with terminated_as_interrupted():
        return run.here()


def _forks(args) -> bool:
    """Whether verify runs in a child forked by the command (dsv4spec/guard.py): the command's own
    process must then leave CUDA alone until the fork (a CUDA driver initialized before fork() is
    unusable in the child), so the child, not it, chooses where the kernels run."""
    return (args.command == "verify" and getattr(args, "command_line", False)
            and not (args.jobs > 1 or args.isolate) and hasattr(os, "fork"))


class _Run:
    """One verify run: its selection, run in this process (`here`), and its reports (`conclude`)."""

    def __init__(self, args, specs, rule_ids, run_ids, skip, xfail):
        self.args, self.specs, self.rule_ids, self.run_ids, self.skip, self.xfail = \
            args, specs, rule_ids, run_ids, skip, xfail
        self.started = time.monotonic()
        self.on_row = self.on_targets = self.on_loading = lambda _: None      # the guard's (dsv4spec/guard.py)

    def here(self) -> int:
        args = self.args
        progress = Progress(len(self.run_ids) * len(self.specs), quiet=args.quiet, tty=sys.stderr.isatty(),
                            also=self.on_row)
        rows, targets, interrupted = _run_verify(args, self.specs, self.run_ids, progress, self.on_targets,
                                                  self.on_loading)
        progress.end()
        interrupted = interrupted or bool(SIGNALLED.get("signal"))     # one that came after the last safe point
        SIGNALLED["acted"] = True
        status = self.conclude(rows, targets, interrupted, findings=self.process_findings(targets))
        if SIGNALLED.get("signal") and not interrupted:        # came while the reports were written: said so
            status = 128 + SIGNALLED["signal"]
        return status

    def process_findings(self, targets) -> list[str]:
        """What the rows cannot say: threads and processes a target left running in a worker
        (--isolate, --jobs) or, in the guard's child, threads in this process (the guard looks for
        processes), and what an exec port left running, its port closed here."""
        from dsv4spec.runner.exec_target import left_by
        from dsv4spec.runner.workers import threads_left
        findings = []
        for t in targets:
            where = f"{t.name}'s worker process"
            findings += [threads_finding(t.threads_left, where)] if getattr(t, "threads_left", []) else []
            findings += [processes_finding(t.processes_left, where)] if getattr(t, "processes_left", []) else []
            if left := left_by(t, close=True):
                findings.append(processes_finding(left, "the process group of its exec port or a session it started"))
        here = threads_left() if _forks(self.args) else []
        return findings + ([threads_finding(here)] if here else [])

    def conclude(self, rows, targets, interrupted, forced=0, findings=()) -> int:
        """Print and write the reports of `rows`, with the process-level `findings` (each makes the
        exit status at least 1, as does `forced`: the guard's report of a process the target ended);
        the exit status."""
        from dsv4spec.runner import causes, report
        from dsv4spec.runner.entries import matching
        from dsv4spec.runner.suite import exit_status
        args, rule_ids, run_ids = self.args, self.rule_ids, self.run_ids
        rows = _listed(rows, targets, rule_ids, self.skip, self.xfail)
        rows = causes.annotate(rows, targets)       # one cause, one verdict: the others "same cause as …"
        expected = {r for r in rule_ids if matching(self.xfail, r)}
        header = _header(args, targets, prefixes(args.rules), rule_ids)
        header["xfail"] = sorted(expected)
        header["wall_s"] = round(time.monotonic() - self.started, 1)
        header["slowest"] = report.slowest(rows)
        header["entries"] = {"skip": [[p, why] for p, why, _ in self.skip], "xfail": [[p, why] for p, why, _ in self.xfail]}
        findings = list(findings) + ([f"the target ended the process running the suite before its verdict (exit "
                                      f"status {forced} at least)"] if forced and not findings else [])
        header["findings"] = findings
        for finding in findings:
            report_finding(finding)
        cause = "SIGTERM" if SIGNALLED.get("signal") == signal.SIGTERM else "Ctrl-C"
        if interrupted:
            header["interrupted_by"] = cause
        done = {(r.rule_id, r.target) for r in rows}
        not_run = [(r, t.name) for t in targets for r in run_ids if (r, t.name) not in done] if interrupted else []
        unloadable = [t for t in targets if getattr(t, "load_error", "")]
        table = _table_stream(args)
        shown = True
        if not unloadable or interrupted:     # a target that cannot be loaded: its one line, as on every route
            shown = printed(report.header_line(header), table)
            shown &= printed(report.terminal(rows, color=colored(table)), table)
        unwritten = []
        for path, write in ((args.json, report.to_json), (args.junit, report.to_junit),
                            (args.markdown, report.to_markdown)):
            if path:
                try:
                    report.write_atomically(path, write(rows, header, interrupted, not_run))
                except ValueError as e:         # one report lost; the others and the verdict still come
                    unwritten.append(str(e))
        if interrupted:
            print("\n" + "\n".join(report.interruption(not_run, len(rows), cause)), file=sys.stderr)
            status = 128 + SIGNALLED.get("signal", signal.SIGINT)
        elif unloadable:
            for t in unloadable:
                print(f"dsv4spec verify: error: {report.printable(t.load_error)}", file=sys.stderr)
            status = 2 if any(getattr(t, "usage_error", False) for t in unloadable) else 3
        else:
            status = max(exit_status(rows, targets, expected), forced, 1 if findings else 0)
            shown &= printed("\n" + report.conclusion(rows, {t.name: t.claims_conformance for t in targets}, status,
                                                       expected), table)
        if not shown:
            unwritten.append("standard output is closed or has no reader: the matrix and the verdict line were "
                             "not written (the reports to files were)")
        for why in unwritten:
            print(f"dsv4spec verify: error: {why}", file=sys.stderr)
        return REPORT_LOST if unwritten else status


REPORT_LOST = 4        # a report could not be written (the others and the verdict line were), or standard output was lost


def _table_stream(args):
    """Where the matrix and the verdict go: standard output, unless a report is written there."""
    return sys.stderr if STDOUT in (args.json, args.junit, args.markdown) else sys.stdout


def colored(stream) -> bool:
    """ANSI colours on a terminal, unless $NO_COLOR is set and not empty (https://no-color.org)."""
    return stream is not None and stream.isatty() and not os.environ.get("NO_COLOR")


def _listed(rows, targets, rule_ids, skip, xfail):
    """The rows with a SKIP row for each rule of the skip file and the xfail file's reason on the
    rows of the rules it expects to fail, in the order rule × target."""
    from dsv4spec.runner.entries import matching
    from dsv4spec.runner.suite import FAIL, ERROR, SKIP, TIMEOUT, Row
    names = [t.name for t in targets]
    rows = rows + [Row(r, t, SKIP, f"--skip line {e[2]}: {e[1]}") for t in names for r in rule_ids
                   for e in [matching(skip, r)] if e]
    for row in rows:
        entry = matching(xfail, row.rule_id)
        if entry and row.status in (FAIL, ERROR, TIMEOUT):
            row.detail = f"expected to fail (--xfail line {entry[2]}: {entry[1]})\n" + row.detail
    order = {(t, r): i for i, (t, r) in enumerate((t, r) for t in names for r in rule_ids)}
    return sorted(rows, key=lambda r: order.get((r.target, r.rule_id), len(order)))


def _checked_verify_args(args) -> tuple[list[str], list[str]]:
    """The rule ids and target specs of a verify run; a usage error for anything wrong, before any run."""
    from dsv4spec.runner import report
    from dsv4spec.runner.entries import read_entries, stale
    from dsv4spec.runner.suite import PROFILES
    from dsv4spec.runner.target import targets_from_environment, timeout_seconds
    from dsv4spec.spec import select
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile {args.profile!r}; expected one of {', '.join(PROFILES)}")
    try:
        timeout_seconds(args.timeout)
    except ValueError as e:
        raise UsageError(f"--timeout {e}") from None
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError(f"--max-examples must be at least 1, got {args.max_examples}")
    rule_ids = [r.id for r in select(prefixes(args.rules))]
    paths = [p for p in (args.json, args.junit, args.markdown) if p]
    if paths.count(STDOUT) > 1:
        raise UsageError("only one of --json, --junit and --markdown can be written to standard output (-)")
    for path in paths:
        if path != STDOUT:
            report.check_writable(path)
    specs = list(dict.fromkeys(args.target or targets_from_environment() or _default_targets()))
    for spec in specs:
        _locate(spec)
    skip, xfail = read_entries(args.skip, "--skip"), read_entries(args.xfail, "--xfail")
    for kind, entries in (("--skip", skip), ("--xfail", xfail)):
        for warning in stale(entries, rule_ids, kind):
            print(f"dsv4spec verify: warning: {warning}", file=sys.stderr)
    if args.shard:
        from dsv4spec.runner.shard import shard_of
        rule_ids = shard_of(rule_ids, *args.shard)
    return rule_ids, specs, skip, xfail


def _locate(spec: str) -> None:
    """locate(spec): a spec naming no target is a usage error before any run; one naming a target
    that cannot be loaded (an exec: port with no such file or program) is left to the run's load,
    which writes the reports with its ERROR as for any target that cannot be loaded."""
    from dsv4spec.runner.target import TargetLoadError, locate
    try:
        locate(spec)
    except TargetLoadError:
        pass


TESTED_TRITON = "3.6"       # the Triton series the kernels are tested on (the kernels extra pins 3.6.0)


def _default_targets() -> list[str]:
    """The built-in targets; kernels only where the tested Triton is installed (an extra: pip
    install 'dsv4spec[kernels]'), else all but kernels, saying why (`--target kernels` still runs them)."""
    import importlib.util
    try:
        triton = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        triton = False
    version = _triton_version() if triton else None
    if version is not None and version.split(".")[:2] == TESTED_TRITON.split("."):
        return DEFAULT_TARGETS
    why = "Triton is not installed" if not triton else \
        f"Triton {version or '(of unknown version)'} is installed; the kernels are tested on Triton {TESTED_TRITON}"
    print(f"dsv4spec verify: kernels left out: {why} (pip install 'dsv4spec[kernels]'; --target kernels runs them "
          f"anyway); every other target and rule runs without it", file=sys.stderr)
    return [t for t in DEFAULT_TARGETS if t != "kernels"]


def _triton_version() -> str | None:
    from importlib import metadata
    for distribution in ("triton", "pytorch-triton"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def _run_verify(args, specs, rule_ids, progress, on_targets=lambda _: None, on_loading=lambda _: None):
    """(rows, targets, interrupted): in this process, or in worker processes for --isolate/--jobs."""
    from dsv4spec.runner.suite import RUN, load_checks, verify
    workers = args.jobs > 1 or args.isolate
    targets = []
    try:
        for spec in [] if workers else specs:
            on_loading(spec)
            targets.append(_loaded(spec, args.timeout))
        on_targets(targets)
        act_on_a_signal()
        if not workers:
            load_checks()
            loaded = [t for t in targets if not getattr(t, "load_error", "")]
            rows = verify(loaded, profile=args.profile, progress=progress, rule_ids=rule_ids)
            return rows + _unloaded_rows(targets, rule_ids), targets, False
        from dsv4spec.runner import workers as pool
        rows, infos = pool.run(specs, rule_ids, args.profile, jobs=args.jobs, seed=RUN.seed,
                               timeout=args.timeout, isolate=args.isolate, progress=progress)
        return rows, [infos[s] for s in specs], False
    except KeyboardInterrupt as e:
        names = list(dict.fromkeys(r.target for r in progress.rows))
        rows = sorted(progress.rows, key=lambda r: (names.index(r.target), rule_ids.index(r.rule_id)))
        infos = getattr(e, "infos", None)       # the worker run's (workers.Interrupted)
        return rows, targets or ([infos[s] for s in specs] if infos else [Unloaded(s) for s in specs]), True


def _loaded(spec: str, timeout: float):
    """The target `spec` names, or, where it cannot be loaded, what a worker reports of it: its load
    error (a usage error where the spec names no target), so that every route writes the same reports."""
    from dsv4spec.runner.suite import RUN
    from dsv4spec.runner.target import TargetLoadError, TargetNotFound, load_target
    from dsv4spec.runner.workers import TargetInfo
    try:
        target = load_target(spec)
    except (TargetNotFound, TargetLoadError) as e:
        if RUN.debug:           # --debug: its traceback instead
            raise
        return TargetInfo(spec, spec, load_error=str(e), usage_error=isinstance(e, TargetNotFound))
    target.timeout = timeout
    return target


def _unloaded_rows(targets, rule_ids) -> list:
    """An ERROR row, naming the load error, for each rule on each target that could not be loaded
    (not shown as progress: the load error is one line)."""
    from dsv4spec.runner.suite import ERROR, Row
    return [Row(r, t.name, ERROR, t.load_error) for t in targets if getattr(t, "load_error", "") for r in rule_ids]


def _header(args, targets, prefixes, rule_ids) -> dict:
    import shlex
    import dsv4spec
    from dsv4spec.runner import report
    from dsv4spec.runner.suite import RUN, examples_per_check
    from dsv4spec.runner.workers import devices_for
    from dsv4spec.spec import RULES
    devices = [f"cuda:{d}" if d is not None else report.environment()["device"] for d in devices_for(args.jobs)] \
        if args.jobs > 1 or args.isolate else []
    return {"tool": {"name": "dsv4spec", "version": dsv4spec.__version__},
            "spec": {"rules": len(RULES), "digest": report.spec_digest()},
            "targets": [{"spec": t.spec, "name": t.name, "module": t.module, "version": t.version,
                         "device": str(t.device), "claims_conformance": t.claims_conformance,
                         **({"load_error": t.load_error, "usage_error": bool(getattr(t, "usage_error", False))}
                            if getattr(t, "load_error", "") else {})} for t in targets],
            "profile": args.profile, "seed": RUN.seed, "timeout_s": args.timeout,
            "examples_per_check": examples_per_check(rule_ids, args.profile),
            "rules": prefixes or "all", "max_examples": args.max_examples,
            "shard": {"index": args.shard[0], "count": args.shard[1], "rules": rule_ids} if args.shard else None,
            "workers": args.jobs, "worker_devices": devices,
            "isolate": bool(args.isolate), **report.environment(),
            "command": " ".join(shlex.quote(a) for a in ["dsv4spec", *sys.argv[1:]])}


class Progress:
    """Progress on standard error: one rewritten line on a terminal; when piped, a line every few
    seconds and one per FAIL/ERROR/TIMEOUT as it happens."""

    EVERY_S = 10.0

    def __init__(self, total: int, quiet: bool, tty: bool, also=lambda _: None):
        import time
        self.total, self.quiet, self.tty, self.also = total, quiet, tty, also
        self.rows, self.clock = [], time.monotonic
        self.last = self.clock()

    def __call__(self, row):
        self.rows.append(row)
        self.also(row)
        act_on_a_signal()           # a safe point: a signal recorded during the row ends the run here
        if self.quiet:
            return
        done = len(self.rows)
        if self.tty:
            line = f"[{done}/{self.total}] {row.target:<10} {row.rule_id:<28} {row.status:<16}"
            print("\r" + line, end="", file=sys.stderr, flush=True)
            return
        if row.status in ("FAIL", "ERROR", "TIMEOUT"):
            print(f"[{done}/{self.total}] {row.status} {row.rule_id} on {row.target}", file=sys.stderr, flush=True)
        elif self.clock() - self.last >= self.EVERY_S or done == self.total:
            print(f"[{done}/{self.total}] {self._counts()}", file=sys.stderr, flush=True)
        else:
            return
        self.last = self.clock()

    def _counts(self) -> str:
        counts = {}
        for r in self.rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

    def end(self):
        if self.tty and not self.quiet and self.rows:
            print(file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dsv4spec",
        description="Executable specification of DeepSeek-V3.2/V4/V4.1 sparse-attention indexing and "
                    "KV-cache quantization numerics: list the rules, verify implementations against them.",
        epilog="Examples:\n"
               "  dsv4spec rules --rules FP4\n"
               "  dsv4spec ops --family quant          # what a target implements\n"
               "  dsv4spec verify --target impl --target kernels --rules FMT,FP4,FP8\n"
               "  dsv4spec verify --target mypkg.fp4:Codec --json out.json --junit out.xml\n"
               "  dsv4spec coverage --profile ci --rules FP4,POOL\n"
               "  dsv4spec budget --model v4.1-flash --json\n"
               "  dsv4spec claims\n"
               "  dsv4spec bench --record          # on a CUDA GPU: kernels vs torch vs ceilings",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    from dsv4spec import __version__
    parser.add_argument("--version", action="version", version=f"dsv4spec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rules", help="list the rules (id, status, policy, title)")
    p.add_argument("--rules", metavar="PREFIX,...", help="only rules whose id starts with a prefix")
    p.add_argument("--json", action="store_true", help="full rule records as JSON")
    p.set_defaults(func=cmd_rules)

    p = sub.add_parser("ops", help="the operations a target may implement, and the rules checking each")
    from dsv4spec.runner.suite import FAMILY_MODULES
    p.add_argument("--family", metavar="F", help=f"one family: {', '.join(FAMILY_MODULES)}")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("spec", help="render the rule registry as Markdown (the text of SPEC.md)")
    p.add_argument("--write", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(func=cmd_spec)

    p = sub.add_parser(
        "verify", help="run the conformance suite and print the rules x targets matrix",
        description="Run every check of the selected rules against each target and print one result "
                    "per (rule, target): PASS, FAIL, ERROR, TIMEOUT, VARIANT (passes only under a "
                    "declared non-canonical knob), n/i (operation not implemented) or skip. Exit "
                    "status: 0 when every target that claims conformance (every target you name, unless it "
                    "sets CLAIMS_CONFORMANCE = False) has no FAIL/ERROR/TIMEOUT; "
                    "1 otherwise; 2 on a usage error (a target that implements no operation included); 3 when a "
                    "target could not be loaded; 130 when "
                    "interrupted (Ctrl-C), 143 on SIGTERM (what finished is printed and written); 4 when a "
                    "report could not be written (the others and the verdict line were). The ml_dtypes and torch targets are element "
                    "casts whose deviations are findings, not failures.",
        epilog="A target: impl, kernels, official, ml_dtypes, torch; an entry point of group "
               "dsv4spec.targets; a module (pkg.module, or mytarget for mytarget.py in the working "
               "directory); pkg.module:attr (a module, an object, a class to instantiate, or one "
               "operation function named like it); pkg.module:attr() (a factory to call); exec:CMD (a port in "
               "any language, started as a child process and called over PROTOCOL.md: exec:./myport); "
               "official-kernels:PATH (or official-kernels with $DSV4SPEC_OFFICIAL_KERNEL), your own copy "
               "of the official V4 kernel.py run as it is (a CUDA GPU and TileLang; bench/official_kernels.sh).")
    p.add_argument("--target", action="append", metavar="T", help="a target (repeatable; default: "
                   "$DSV4SPEC_TARGET, comma-separated, else impl, kernels, ml_dtypes, torch)")
    p.add_argument("--rules", metavar="PREFIX,...", help="rule id prefixes, e.g. FMT,FP4,FP8 or POOL.PIN")
    p.add_argument("--profile", default="ci", help="Hypothesis profile: ci (default, derandomized), "
                                                   "dev, thorough")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the dev and thorough profiles "
                   "(default: a fresh one, printed; ci is derandomized)")
    from dsv4spec.runner.target import DEFAULT_TIMEOUT_S
    p.add_argument("--max-examples", type=int, metavar="N", help="examples per check, instead of the "
                   "profile's (ci sizes them per rule: FMT 400, FP4/FP8 200, IDX/POOL 50, the layer checks 2 "
                   "drawn cases after their fixed ones, else 25; dev and thorough draw 10 and 100 layers in a layer check)")
    p.add_argument("--skip", metavar="FILE", help="rules not to run: `RULE-or-prefix reason` per line (# comments), "
                   "reported SKIP with the reason")
    p.add_argument("--xfail", metavar="FILE", help="rules expected to fail, same format: their FAIL, ERROR or "
                   "TIMEOUT is shown with the reason and does not change the exit status")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds one operation call may take (default {DEFAULT_TIMEOUT_S:g}); beyond it: TIMEOUT")
    p.add_argument("--isolate", action="store_true", help="run targets in worker processes: a crash or a "
                   "hang (even in C code) costs only the rule that was running")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="spread the rules over N worker "
                   "processes (each pinned to its own GPU when several are visible); implies --isolate")
    p.add_argument("--shard", type=shard_argument, metavar="K/N", help="run only shard K of N (1 <= K <= N) of the "
                   "selected rules, for N CI jobs: every rule in exactly one shard, the same split on every "
                   "machine, balanced by the rules' expected cost; `dsv4spec report merge` joins the shards' "
                   "--json reports")
    p.add_argument("--json", metavar="F", help="write a JSON report (schema_version 4; its JSON Schema: "
                                                "dsv4spec/runner/report.schema.json); F - is standard "
                                                "output, as for --junit and --markdown (the matrix then goes "
                                                "to standard error)")
    p.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="F", help="write a Markdown report (matrix, counts, failures)")
    p.add_argument("--quiet", action="store_true", help="no progress on standard error")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error; an ERROR raised in a target lists every frame "
                        "of the target's (else the first and the last two)")
    p.set_defaults(func=cmd_verify)

    from dsv4spec import cmd_bench, cmd_budget, cmd_claims, cmd_coverage, cmd_golden, cmd_mutate, cmd_report, cmd_trace
    for module in (cmd_trace, cmd_report, cmd_budget, cmd_claims, cmd_golden, cmd_coverage, cmd_bench, cmd_mutate):
        module.register(sub)
    return parser


RUNS_TARGETS = {"verify", "golden", "coverage", "mutate"}     # the commands that may interpret kernels


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = argv is None        # the `dsv4spec` command itself, not a library call
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in RUNS_TARGETS and not _forks(args):
        skip_dead_overflow_checks()     # our own process (dsv4spec/interpreter.py: why no result changes)
    return handled(lambda: args.func(args) or 0, args)


if __name__ == "__main__":
    sys.exit(main())
