"""`dsv4spec check-trace DIR`: judge a recorded trace (docs/TRACE.md) by the rules verify judges."""
from __future__ import annotations

import argparse
import sys

TARGET = "trace"
UNREADABLE = 3          # a trace that cannot be judged: corrupt, truncated, mislabelled, mismatched


def register(subparsers):
    p = subparsers.add_parser(
        "check-trace", help="judge a recorded trace of a forward (docs/TRACE.md), stage by stage",
        description="Judge every recorded stage of a trace (safetensors files and a JSON manifest, docs/TRACE.md) "
                    "by the judge verify uses for it, teacher-forced on the trace's own tensors, one layer-step at "
                    "a time; then the decode state across steps and the all-reduce across tensor-parallel ranks. "
                    "One row per rule, as verify's: PASS, FAIL, ERROR (a stage recorded without the tensor it is "
                    "judged from: the row names the tensor to record) or n/i (not recorded). Exit status: 0 no "
                    "FAIL or ERROR; 1 otherwise; 2 a usage error; 3 a trace that cannot be judged (corrupt, "
                    "truncated, mislabelled, shapes or dtypes the config rules out), in one line; 4 a report not "
                    "written.",
        epilog="Examples:\n  dsv4spec check-trace run/ --json r.json\n"
               "  dsv4spec check-trace run/ --rules ATTN,PATH --layers 2,20-24 --steps prefill,130-140\n"
               "  dsv4spec check-trace run/ --shard 1/2 --json r-1.json   # then: dsv4spec report merge r-*.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="DIR", help="the trace: its manifest.json here, or one rank's in each subdirectory")
    p.add_argument("--rules", metavar="PREFIX,...", help="rule id prefixes, e.g. ATTN,PATH.K")
    p.add_argument("--layers", metavar="L,...", help="layers to judge, e.g. 2,20-24 (default: every recorded one)")
    p.add_argument("--steps", metavar="S,...", help="steps to judge: prefill, decode, start positions or ranges "
                                                     "(e.g. prefill,130-140; default: every recorded one)")
    from dsv4spec.command import shard_argument
    p.add_argument("--shard", type=shard_argument, metavar="K/N", help="judge only shard K of N of the selected rules "
                   "(every rule in one shard); `dsv4spec report merge` joins the shards' --json reports")
    p.add_argument("--json", metavar="F", help="write verify's JSON report (schema_version 3); its header's "
                                                "`trace` holds every stage's verdict")
    p.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="F", help="write a Markdown report")
    p.add_argument("--quiet", action="store_true", help="no progress on standard error")
    p.set_defaults(func=check_trace)


def _selection(args) -> list[str]:
    from dsv4spec.command import UsageError, prefixes
    from dsv4spec.runner.shard import shard_of
    from dsv4spec.spec.rules import select
    rule_ids = [r.id for r in select(prefixes(args.rules))]
    if not rule_ids:
        raise UsageError(f"--rules {args.rules}: no rule id starts with these prefixes (dsv4spec rules lists them)")
    return shard_of(rule_ids, *args.shard) if args.shard else rule_ids


def check_trace(args) -> int:
    from dsv4spec.command import UsageError, prefixes
    from dsv4spec.runner import report
    from dsv4spec.trace import TraceError
    from dsv4spec.trace.check import Clock, judge_trace, open_trace, parse_numbers, rows_of, stage_lines, step_filter
    for path in filter(None, (args.json, args.junit, args.markdown)):
        report.check_writable(path)
    rule_ids = _selection(args)
    try:
        layers = parse_numbers(args.layers, "--layers") if args.layers else None
        steps = step_filter(args.steps)
    except ValueError as e:
        raise UsageError(str(e)) from None
    clock = Clock()
    selected = set(rule_ids)
    try:
        traces = open_trace(args.trace)
        judged = judge_trace(traces, selected.__contains__, layers, steps, _progress(args.quiet))
    except TraceError as e:
        print(f"dsv4spec check-trace: error: {e}", file=sys.stderr)
        return UNREADABLE
    if not judged.layer_steps:
        print(f"dsv4spec check-trace: error: {args.trace}: no recorded layer-step matches --layers/--steps "
              f"(it records {len(traces[0].layer_steps())})", file=sys.stderr)
        return 2
    rows = rows_of(judged, rule_ids, TARGET, clock.seconds())
    header = _header(args, traces, judged, rule_ids, prefixes(args.rules), clock.seconds())
    out = sys.stderr if "-" in (args.json, args.junit, args.markdown) else sys.stdout
    print(report.header_line(header), file=out)
    print(report.terminal(rows, color=out.isatty()), file=out)
    print("\nstages (departing first, in the order the forward computed them):", file=out)
    print("\n".join("  " + line for line in stage_lines(judged)), file=out)
    from dsv4spec.runner.suite import exit_status
    from types import SimpleNamespace
    status = exit_status(rows, [SimpleNamespace(name=TARGET, claims_conformance=True)])
    lost = []
    for path, write in ((args.json, report.to_json), (args.junit, report.to_junit), (args.markdown, report.to_markdown)):
        if path:
            try:
                report.write_atomically(path, write(rows, header))
            except ValueError as e:
                lost.append(str(e))
    print("\n" + report.conclusion(rows, {TARGET: True}, status), file=out)
    for why in lost:
        print(f"dsv4spec check-trace: error: {why}", file=sys.stderr)
    return 4 if lost else status


def _progress(quiet: bool):
    import time
    last = [0.0]

    def show(done, total, verdicts):
        if quiet or (time.monotonic() - last[0] < 5 and done < total and not sys.stderr.isatty()):
            return
        last[0] = time.monotonic()
        bad = sum(v.status != "PASS" for v in verdicts)
        line = f"[{done}/{total} layer-steps] {len(verdicts)} stages judged, {bad} departing"
        print(("\r" + line) if sys.stderr.isatty() else line, end="" if sys.stderr.isatty() and done < total else "\n",
              file=sys.stderr, flush=True)
    return show


def _header(args, traces, judged, rule_ids, prefixes, wall_s) -> dict:
    import shlex
    import dsv4spec
    from dsv4spec.runner import report
    from dsv4spec.runner.target import DEFAULT_TIMEOUT_S
    from dsv4spec.spec import RULES
    first = traces[0]
    return {"tool": {"name": "dsv4spec", "version": dsv4spec.__version__},
            "spec": {"rules": len(RULES), "digest": report.spec_digest()},
            "targets": [{"spec": f"trace:{args.trace}", "name": TARGET, "module": "dsv4spec.trace",
                         "version": str(first.model), "device": "cpu", "claims_conformance": True}],
            "profile": "ci", "seed": None, "timeout_s": DEFAULT_TIMEOUT_S, "examples_per_check": {},
            "rules": prefixes or "all", "max_examples": None,
            "shard": {"index": args.shard[0], "count": args.shard[1], "rules": rule_ids} if args.shard else None,
            "workers": 1, "worker_devices": [], "isolate": False, **report.environment(),
            "command": " ".join(shlex.quote(a) for a in ["dsv4spec", *sys.argv[1:]]), "wall_s": round(wall_s, 1),
            "trace": {"path": args.trace, "model": first.model, "world_size": first.world_size,
                      "variants": first.variants, "layer_steps": judged.layer_steps,
                      "layers": args.layers, "steps": args.steps,
                      "verdicts": [v.as_json() for v in judged.verdicts]}}
