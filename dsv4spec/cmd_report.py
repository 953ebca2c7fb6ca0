"""`dsv4spec report merge`: the shards' JSON reports of one `verify --shard K/N` run, as one report."""
from __future__ import annotations

import sys


def register(subparsers):
    p = subparsers.add_parser("report", help="work on verify's reports: merge the shards of one run",
                              description="Work on the JSON reports of dsv4spec verify.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    m = sub.add_parser(
        "merge", help="join the --json reports of a run's shards (verify --shard K/N) into one report",
        description="Join the JSON reports of the N shards of one verify run (verify --shard K/N --json) "
                    "into the report of the whole run: the matrix printed, the reports written, and the "
                    "exit status of verify (0: every target that claims conformance has no FAIL, ERROR or "
                    "TIMEOUT and no shard reports a process-level finding (threads a target left running, a process it "
                    "ended); 1 otherwise; 2 on a usage error; 3 when a shard could not load a target; 130 when a "
                    "shard was interrupted by Ctrl-C, 143 by SIGTERM). Refused "
                    "(exit 2) unless the reports are one run (the same tool version, rules digest, profile, "
                    "seed, targets, rule selection, --max-examples, --timeout, --skip and --xfail entries and N), every "
                    "shard is there exactly once and holds every result its run had.",
        epilog="Example, after a CI matrix ran `dsv4spec verify --target mytarget --shard K/4 --json r-K.json`:\n"
               "  dsv4spec report merge r-1.json r-2.json r-3.json r-4.json --junit all.xml --markdown all.md",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    m.add_argument("reports", nargs="+", metavar="SHARD.json", help="the shards' JSON reports, in any order")
    m.add_argument("--allow-incomplete", action="store_true",
                   help="merge even when shards are missing: the report says INCOMPLETE and names the rules "
                        "it lacks; the exit status judges the results that are there")
    m.add_argument("--json", metavar="F", help="write the merged JSON report (schema_version 4)")
    m.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    m.add_argument("--markdown", metavar="F", help="write a Markdown report")
    m.set_defaults(func=merge)


def merge(args) -> int:
    from types import SimpleNamespace
    from dsv4spec.runner import merge, report
    from dsv4spec.runner.suite import exit_status
    for path in filter(None, (args.json, args.junit, args.markdown)):
        report.check_writable(path)
    shards = [(path, merge.read(path)) for path in args.reports]
    run = merge.merge(shards, args.allow_incomplete)
    if run.interrupted:         # by the signal that stopped a shard: SIGTERM (a CI job cancelled) or Ctrl-C
        run.header["interrupted_by"] = next((d["header"]["interrupted_by"] for _, d in shards
                                             if d["header"].get("interrupted_by") == "SIGTERM"), "Ctrl-C")
    targets = [SimpleNamespace(**t) for t in run.header["targets"]]
    print(report.header_line(run.header))
    print(report.terminal(run.rows, color=sys.stdout.isatty()))
    for path, write in ((args.json, report.to_json), (args.junit, report.to_junit), (args.markdown, report.to_markdown)):
        if path:
            report.write_atomically(path, write(run.rows, run.header, run.interrupted, run.not_run))
    for line in report.incompleteness(run.header):
        print(f"dsv4spec report merge: warning: {line}", file=sys.stderr)
    if run.interrupted:
        cause = run.header["interrupted_by"]
        print("\n" + "\n".join(report.interruption(run.not_run, len(run.rows), cause)), file=sys.stderr)
        return 143 if cause == "SIGTERM" else 130
    unloadable = [t for t in targets if getattr(t, "load_error", "")]
    for t in unloadable:
        print(f"dsv4spec report merge: error: {t.load_error}", file=sys.stderr)
    usage = any(t.usage_error for t in unloadable)
    for finding in run.findings:        # what a shard's process did beyond its rows: exit 1 at least, as it did
        print(f"dsv4spec report merge: error: {finding}", file=sys.stderr)
    status = 2 if usage else 3 if unloadable else max(exit_status(run.rows, targets, run.expected),
                                                      1 if run.findings else 0)
    claims = {t.name: t.claims_conformance for t in targets}
    print("\n" + report.conclusion(run.rows, claims, status, run.expected))
    return status
