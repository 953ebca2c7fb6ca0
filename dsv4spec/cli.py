"""The `dsv4spec` command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_TARGETS = ["impl", "kernels", "ml_dtypes", "torch"]


class UsageError(Exception):
    """A mistake in the command line or its inputs: reported in one line, exit status 2."""


def cmd_rules(args) -> int:
    from dsv4spec.spec import select
    rules = select(_prefixes(args.rules))
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
    from dsv4spec.properties.suite import FAMILY_MODULES, load_checks
    checks = load_checks()
    families = [f for f in FAMILY_MODULES if not args.family or f == args.family]
    if not families:
        raise UsageError(f"unknown family {args.family!r}; expected one of {', '.join(FAMILY_MODULES)}")
    table = {}
    for family in families:
        ops = getattr(importlib.import_module(f"dsv4spec.properties.{family}"), "OPS", {})
        for op, doc in ops.items():
            rules = sorted({c.rule_id for c in checks if op in c.ops})
            table.setdefault(family, []).append({"op": op, "signature": doc, "rules": rules})
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
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
    from dsv4spec.properties import causes, report
    from dsv4spec.properties.suite import DERANDOMIZED, RUN, exit_status, new_seed, program
    rule_ids, specs = _checked_verify_args(args)
    RUN.seed = None if args.profile in DERANDOMIZED else (args.seed if args.seed is not None else new_seed())
    RUN.program = program(specs)
    progress = Progress(len(rule_ids) * len(specs), quiet=args.quiet, tty=sys.stderr.isatty())
    started = time.monotonic()
    rows, targets, interrupted = _run_verify(args, specs, rule_ids, progress)
    progress.end()
    rows = causes.annotate(rows)       # one cause, one verdict: the others "same cause as …"
    header = _header(args, targets, _prefixes(args.rules))
    header["wall_s"] = round(time.monotonic() - started, 1)
    print(report.header_line(header))
    print(report.terminal(rows, color=sys.stdout.isatty()))
    for path, text in ((args.json, lambda: report.to_json(rows, header, interrupted)),
                       (args.junit, lambda: report.to_junit(rows, header)),
                       (args.markdown, lambda: report.to_markdown(rows, header))):
        if path:
            report.write_atomically(path, text())
    if interrupted:
        print(f"\ninterrupted: {len(rows)} of {progress.total} results finished", file=sys.stderr)
        return 130
    unloadable = [t for t in targets if getattr(t, "load_error", "")]
    for t in unloadable:
        print(f"dsv4spec verify: error: {t.load_error}", file=sys.stderr)
    status = 3 if unloadable else exit_status(rows, targets)
    claiming = [t.name for t in targets if t.claims_conformance]
    print(f"\nconformance claimed by {', '.join(claiming) or 'no target'}: "
          + ("no FAIL, ERROR or TIMEOUT" if status == 0 else f"FAILURES (exit {status})"))
    return status


def _checked_verify_args(args) -> tuple[list[str], list[str]]:
    """The rule ids and target specs of a verify run; a usage error for anything wrong, before any run."""
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import PROFILES
    from dsv4spec.properties.target import locate
    from dsv4spec.spec import select
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile {args.profile!r}; expected one of {', '.join(PROFILES)}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    rule_ids = [r.id for r in select(_prefixes(args.rules))]
    for path in filter(None, (args.json, args.junit, args.markdown)):
        report.check_writable(path)
    specs = list(dict.fromkeys(args.target or DEFAULT_TARGETS))
    for spec in specs:
        locate(spec)
    return rule_ids, specs


def _run_verify(args, specs, rule_ids, progress):
    """(rows, targets, interrupted): in this process, or in worker processes for --isolate/--jobs."""
    from dsv4spec.properties.suite import RUN, load_checks, verify
    from dsv4spec.properties.target import load_target
    workers = args.jobs > 1 or args.isolate
    targets = [] if workers else [load_target(spec) for spec in specs]
    for t in targets:
        t.timeout = args.timeout
    try:
        if not workers:
            load_checks()
            return verify(targets, _prefixes(args.rules), args.profile, progress), targets, False
        from dsv4spec.properties import workers as pool
        rows, infos = pool.run(specs, rule_ids, args.profile, jobs=args.jobs, seed=RUN.seed,
                               timeout=args.timeout, isolate=args.isolate, progress=progress)
        return rows, [infos[s] for s in specs], False
    except KeyboardInterrupt:
        names = list(dict.fromkeys(r.target for r in progress.rows))
        rows = sorted(progress.rows, key=lambda r: (names.index(r.target), rule_ids.index(r.rule_id)))
        return rows, targets or [_Unloaded(s) for s in specs], True


class _Unloaded:
    """A target whose worker was stopped before it reported (Ctrl-C)."""

    def __init__(self, spec):
        self.spec = self.name = spec
        self.claims_conformance, self.module, self.version, self.device = False, "", "", ""


def _header(args, targets, prefixes) -> dict:
    import shlex
    import dsv4spec
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import RUN
    from dsv4spec.properties.workers import devices_for
    from dsv4spec.spec import RULES
    devices = [f"cuda:{d}" if d is not None else report.environment()["device"] for d in devices_for(args.jobs)] \
        if args.jobs > 1 or args.isolate else []
    return {"tool": {"name": "dsv4spec", "version": dsv4spec.__version__},
            "spec": {"rules": len(RULES), "digest": report.spec_digest()},
            "targets": [{"spec": t.spec, "name": t.name, "module": t.module, "version": t.version,
                         "device": str(t.device),
                         "claims_conformance": t.claims_conformance} for t in targets],
            "profile": args.profile, "seed": RUN.seed, "timeout_s": args.timeout,
            "rules": prefixes or "all", "workers": args.jobs, "worker_devices": devices,
            "isolate": bool(args.isolate), **report.environment(),
            "command": " ".join(shlex.quote(a) for a in ["dsv4spec", *sys.argv[1:]])}


class Progress:
    """Progress on standard error: one rewritten line on a terminal; when piped, a line every few
    seconds and one per FAIL/ERROR/TIMEOUT as it happens."""

    EVERY_S = 10.0

    def __init__(self, total: int, quiet: bool, tty: bool):
        import time
        self.total, self.quiet, self.tty = total, quiet, tty
        self.rows, self.clock = [], time.monotonic
        self.last = self.clock()

    def __call__(self, row):
        self.rows.append(row)
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


def _prefixes(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("rules", help="list the rules (id, status, policy, title)")
    p.add_argument("--rules", metavar="PREFIX,...", help="only rules whose id starts with a prefix")
    p.add_argument("--json", action="store_true", help="full rule records as JSON")
    p.set_defaults(func=cmd_rules)

    p = sub.add_parser("ops", help="the operations a target may implement, and the rules checking each")
    p.add_argument("--family", metavar="F", help="one family: quant, indexer, pool, compressor, layout, budget")
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
                    "status: 0 when every target that claims conformance (impl, kernels, official, and "
                    "any third-party target with CLAIMS_CONFORMANCE = True) has no FAIL/ERROR/TIMEOUT; "
                    "1 otherwise; 2 on a usage error; 3 when a target could not be loaded; 130 when "
                    "interrupted (what finished is printed). The ml_dtypes and torch targets are element "
                    "casts whose deviations are findings, not failures.",
        epilog="A target: impl, kernels, official, ml_dtypes, torch; an entry point of group "
               "dsv4spec.targets; a module (pkg.module, or mytarget for mytarget.py in the working "
               "directory); pkg.module:attr (a module, an object, a class to instantiate, or one "
               "operation function named like it); pkg.module:attr() (a factory to call).")
    p.add_argument("--target", action="append", metavar="T", help="a target (repeatable; default: impl, "
                   "kernels, ml_dtypes, torch)")
    p.add_argument("--rules", metavar="PREFIX,...", help="rule id prefixes, e.g. FMT,FP4,FP8 or POOL.PIN")
    p.add_argument("--profile", default="ci", help="Hypothesis profile: ci (default, derandomized), "
                                                   "dev, thorough")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the dev and thorough profiles "
                   "(default: a fresh one, printed; ci is derandomized)")
    from dsv4spec.properties.target import DEFAULT_TIMEOUT_S
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds one operation call may take (default {DEFAULT_TIMEOUT_S:g}); beyond it: TIMEOUT")
    p.add_argument("--isolate", action="store_true", help="run targets in worker processes: a crash or a "
                   "hang (even in C code) costs only the rule that was running")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="spread the rules over N worker "
                   "processes (each pinned to its own GPU when several are visible); implies --isolate")
    p.add_argument("--json", metavar="F", help="write a JSON report (schema_version 2, see "
                                                "dsv4spec/properties/report.py)")
    p.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="F", help="write a Markdown report (matrix, counts, failures)")
    p.add_argument("--quiet", action="store_true", help="no progress on standard error")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error")
    p.set_defaults(func=cmd_verify)

    from dsv4spec import cmd_bench, cmd_budget, cmd_claims, cmd_coverage, cmd_golden, cmd_mutate
    for module in (cmd_budget, cmd_claims, cmd_golden, cmd_coverage, cmd_bench, cmd_mutate):
        module.register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from dsv4spec.properties.target import TargetLoadError
    try:
        return args.func(args) or 0
    except (UsageError, ValueError, FileNotFoundError, TargetLoadError) as e:
        if args.debug:
            raise
        print(f"dsv4spec {args.command}: error: {e}", file=sys.stderr)
        return 3 if isinstance(e, TargetLoadError) else 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
