"""Reports of a verify run: terminal matrix, JSON, JUnit XML, Markdown."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from ..spec import RULES
from .suite import ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIP, TIMEOUT, VARIANT, Row

SCHEMA_VERSION = 1
SHORT = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", TIMEOUT: "TIMEOUT", VARIANT: "VARIANT",
         NOT_IMPLEMENTED: "n/i", SKIP: "skip"}


def _matrix(rows: list[Row]):
    targets = list(dict.fromkeys(r.target for r in rows))
    rules = list(dict.fromkeys(r.rule_id for r in rows))
    cell = {(r.rule_id, r.target): r for r in rows}
    return targets, rules, cell


def terminal(rows: list[Row], color: bool = False) -> str:
    targets, rules, cell = _matrix(rows)
    paint = {PASS: "32", FAIL: "31", ERROR: "31", TIMEOUT: "33", VARIANT: "36"}
    width = max([len(r) for r in rules] + [4])
    cols = [max(len(t), 7) for t in targets]
    lines = ["rule".ljust(width) + "  " + "  ".join(t.ljust(c) for t, c in zip(targets, cols))]
    for rule_id in rules:
        parts = []
        for t, c in zip(targets, cols):
            status = cell[(rule_id, t)].status
            text = SHORT[status].ljust(c)
            parts.append(f"\033[{paint[status]}m{text}\033[0m" if color and status in paint else text)
        lines.append(rule_id.ljust(width) + "  " + "  ".join(parts))
    lines.append("")
    lines.append(summary(rows))
    problems = [r for r in rows if r.status in (FAIL, ERROR, TIMEOUT)]
    for r in problems:
        lines.append(f"\n{r.status} {r.rule_id} on {r.target}: {RULES[r.rule_id].title}")
        lines.extend("    " + line for line in r.detail.splitlines())
        if r.reproduce:
            lines.append(f"    reproduce: {r.reproduce}")
    notes = [r for r in rows if r.status == VARIANT]
    for r in notes:
        lines.append(f"VARIANT {r.rule_id} on {r.target}: {r.detail}")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    targets, _, _ = _matrix(rows)
    out = []
    for t in targets:
        counts = {}
        for r in rows:
            if r.target == t:
                counts[r.status] = counts.get(r.status, 0) + 1
        out.append(f"{t}: " + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(counts.items())))
    return "\n".join(out)


def to_json(rows: list[Row], meta: dict) -> str:
    return json.dumps({
        "schema_version": SCHEMA_VERSION,
        **meta,
        "results": [{"rule": r.rule_id, "target": r.target, "status": r.status, "detail": r.detail,
                     "reproduce": r.reproduce, "seconds": round(r.seconds, 3), "checks": r.checks}
                    for r in rows],
    }, indent=2)


def to_junit(rows: list[Row]) -> str:
    suites = ET.Element("testsuites", name="dsv4spec")
    targets, _, _ = _matrix(rows)
    for t in targets:
        mine = [r for r in rows if r.target == t]
        suite = ET.SubElement(suites, "testsuite", name=t, tests=str(len(mine)),
                              failures=str(sum(r.status == FAIL for r in mine)),
                              errors=str(sum(r.status in (ERROR, TIMEOUT) for r in mine)),
                              skipped=str(sum(r.status in (SKIP, NOT_IMPLEMENTED) for r in mine)))
        for r in mine:
            case = ET.SubElement(suite, "testcase", classname=f"{t}.{RULES[r.rule_id].family}",
                                 name=r.rule_id, time=f"{r.seconds:.3f}")
            if r.status == FAIL:
                ET.SubElement(case, "failure", message=r.detail.splitlines()[0] if r.detail else "").text = r.detail
            elif r.status in (ERROR, TIMEOUT):
                ET.SubElement(case, "error", message=r.status).text = r.detail
            elif r.status in (SKIP, NOT_IMPLEMENTED):
                ET.SubElement(case, "skipped", message=f"{r.status}: {r.detail}")
            elif r.status == VARIANT:
                ET.SubElement(case, "system-out").text = r.detail
    return ET.tostring(suites, encoding="unicode")


def to_markdown(rows: list[Row]) -> str:
    targets, rules, cell = _matrix(rows)
    lines = ["| rule | title | " + " | ".join(targets) + " |", "|---|---|" + "---|" * len(targets)]
    for rule_id in rules:
        lines.append(f"| `{rule_id}` | {RULES[rule_id].title} | "
                     + " | ".join(cell[(rule_id, t)].status for t in targets) + " |")
    return "\n".join(lines) + "\n"
