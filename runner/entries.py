"""Skip and xfail files, shared by `dsv4spec verify --skip/--xfail` and the pytest plugin's
--dsv4spec-skip/--dsv4spec-xfail: one entry a line, a rule id or prefix, then the reason.

    # known.txt
    FP4.KV.SCALE      our E4M3 scale uses the reciprocal (ticket 123)
    IDX.TOPK          ties broken by position
"""
from __future__ import annotations

from ..spec.rules import _matches


def read_entries(path: str | None, option: str) -> list[tuple[str, str, int]]:
    """(rule prefix, reason, line number) of each entry of a skip or xfail file; ValueError
    naming the option when it cannot be read."""
    if not path:
        return []
    try:
        text = open(path).read()
    except OSError as e:
        raise ValueError(f"{option}: cannot read {path}: {e.strerror}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            prefix, _, reason = line.partition(" ")
            entries.append((prefix, reason.strip() or "listed in " + path, number))
    return entries


def matching(entries, rule_id: str):
    """The first entry whose prefix selects `rule_id`, else None."""
    return next((e for e in entries if _matches(rule_id, e[0])), None)


def stale(entries, rule_ids, option: str) -> list[str]:
    """A warning for each entry that matches none of the selected rules (a stale list shows up)."""
    return [f"{option} line {number}: {prefix!r} matches none of the selected rules"
            for prefix, _, number in entries if not any(_matches(r, prefix) for r in rule_ids)]
