"""`dsv4spec claims`: the ledger of the source documents' numeric claims and their verdicts."""
from __future__ import annotations

import json
import textwrap


def register(subparsers):
    p = subparsers.add_parser(
        "claims", help="the source documents' numeric claims, recomputed, with verdicts",
        description="Every numeric claim of the three source documents with its sections and lines, the value the "
                    "spec computes and a verdict: reproduced, corrected (with the rule that says why) "
                    "or not checkable from the numerics alone.  Exit status 1 if a verdict no longer "
                    "holds.")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from dsv4spec.spec import claims
    entries = claims.ledger()
    if args.json:
        print(json.dumps(entries, indent=2, ensure_ascii=False))
    else:
        for e in entries:
            rule = f" [{e['rule']}]" if e["rule"] else ""
            print(f"{e['id']}: {e['verdict'].upper()}{rule}  stated {e['stated']!r}, computed {e['computed']!r}")
            print(textwrap.indent(textwrap.fill(e["claim"], 96), "    "))
            print(f"    source: {e['source']}")
            if e["note"]:
                print(textwrap.indent(textwrap.fill("note: " + e["note"], 96), "    "))
        counts = {}
        for e in entries:
            counts[e["verdict"]] = counts.get(e["verdict"], 0) + 1
        print(f"\n{len(entries)} claims: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    bad = claims.problems()
    for p in bad:
        print(f"dsv4spec claims: verdict broken: {p}", file=__import__("sys").stderr)
    return 1 if bad else 0
