"""The `dsv4spec` command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
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
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import PROFILES, exit_status, verify
    from dsv4spec.properties.target import load_target
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile {args.profile!r}; expected one of {', '.join(PROFILES)}")
    prefixes = _prefixes(args.rules)
    from dsv4spec.spec import select
    select(prefixes)  # validate before loading targets
    targets = []
    for spec in args.target or DEFAULT_TARGETS:
        try:
            targets.append(load_target(spec))
        except ValueError as e:
            raise UsageError(str(e)) from None
    total = len(select(prefixes)) * len(targets)
    done = [0]
    tty = sys.stderr.isatty()

    def progress(row):
        done[0] += 1
        if not args.quiet:
            line = f"[{done[0]}/{total}] {row.target:<10} {row.rule_id:<28} {row.status:<16}"
            print("\r" + line if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    rows = verify(targets, prefixes, args.profile, progress)
    if not args.quiet and tty:
        print(file=sys.stderr)
    print(report.terminal(rows, color=sys.stdout.isatty()))
    meta = {"profile": args.profile, "targets": [t.spec for t in targets],
            "rules": prefixes or "all"}
    for path, text in ((args.json, lambda: report.to_json(rows, meta)),
                       (args.junit, lambda: report.to_junit(rows)),
                       (args.markdown, lambda: report.to_markdown(rows))):
        if path:
            Path(path).write_text(text())
    status = exit_status(rows, targets)
    claiming = [t.name for t in targets if t.claims_conformance]
    print(f"\nconformance claimed by {', '.join(claiming) or 'no target'}: "
          + ("no FAIL, ERROR or TIMEOUT" if status == 0 else "FAILURES (exit 1)"))
    return status


def _prefixes(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv4spec",
        description="Executable specification of DeepSeek-V3.2/V4/V4.1 sparse-attention indexing and "
                    "KV-cache quantization numerics: list the rules, verify implementations against them.",
        epilog="Examples:\n"
               "  dsv4spec rules --rules FP4\n"
               "  dsv4spec ops --family quant          # what a target implements\n"
               "  dsv4spec verify --target impl --target kernels --rules FMT,FP4,FP8\n"
               "  dsv4spec verify --target mypkg.fp4:Codec --json out.json --junit out.xml\n"
               "  dsv4spec budget --model v4.1-flash --json\n"
               "  dsv4spec claims\n"
               "  dsv4spec bench --record          # on a CUDA GPU: kernels vs torch vs ceilings",
        formatter_class=argparse.RawDescriptionHelpFormatter)
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
                    "status 0 when every target that claims conformance (impl, kernels, and any "
                    "third-party target with CLAIMS_CONFORMANCE = True) has no FAIL/ERROR/TIMEOUT; "
                    "1 otherwise; 2 on a usage error. The ml_dtypes and torch targets are element "
                    "casts whose deviations are findings, not failures.")
    p.add_argument("--target", action="append", metavar="T",
                   help="impl, kernels, ml_dtypes, torch, an entry point of group dsv4spec.targets, "
                        "or pkg.module[:attr] (repeatable; default: all four built-ins)")
    p.add_argument("--rules", metavar="PREFIX,...", help="rule id prefixes, e.g. FMT,FP4,FP8 or POOL.PIN")
    p.add_argument("--profile", default="ci", help="Hypothesis profile: ci (default, derandomized), "
                                                   "dev, thorough")
    p.add_argument("--json", metavar="F", help="write a JSON report (schema_version 1)")
    p.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="F", help="write a Markdown matrix")
    p.add_argument("--quiet", action="store_true", help="no progress line on standard error")
    p.set_defaults(func=cmd_verify)

    from dsv4spec import cmd_bench, cmd_budget, cmd_claims, cmd_golden
    for module in (cmd_budget, cmd_claims, cmd_golden, cmd_bench):
        module.register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"dsv4spec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
