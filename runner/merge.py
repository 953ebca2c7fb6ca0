"""`dsv4spec report merge`: the JSON reports of the shards of one verify run (`verify --shard K/N`)
put back together as the report of the whole run, in the order and with the exit status an
unsharded run would have.

Reports are one run when they agree on the tool version, the rules' digest, the profile, the
seed, the targets (their specs; name, module, version and claim where they loaded), the rule
selection, --max-examples, --timeout and N; anything else, a shard given twice or a shard missing
(unless allowed, and then the report says it is incomplete) is refused with a ValueError naming
what differs.  The machine may differ from shard to shard (a CI
matrix's jobs), and so may the targets' devices.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..spec import select
from . import causes
from .report import SCHEMA_VERSION, slowest, spec_digest
from .suite import Row

TARGET_KEYS = ("spec", "name", "module", "version", "claims_conformance")
ONE_RUN = (
    ("tool version", lambda h: h["tool"]["version"]),
    ("rules digest", lambda h: h["spec"]["digest"]),
    ("profile", lambda h: h["profile"]),
    ("seed", lambda h: h["seed"]),
    ("targets", lambda h: [t["spec"] for t in h["targets"]]),
    ("rule selection (--rules)", lambda h: h["rules"]),
    ("--max-examples", lambda h: h.get("max_examples")),
    ("--timeout", lambda h: h["timeout_s"]),
    ("shard count N", lambda h: h["shard"]["count"]),
    ("--skip entries", lambda h: (h.get("entries") or {}).get("skip")),
    ("--xfail entries", lambda h: (h.get("entries") or {}).get("xfail")),
)
SAME_CAUSE = re.compile(r"^same cause as [A-Z0-9_.]+ \([^)]*\): ")


@dataclass
class Merged:
    rows: list[Row]
    header: dict
    interrupted: bool
    not_run: list[tuple[str, str]]
    expected: set = field(default_factory=set)     # rules an --xfail file expects to fail
    findings: list = field(default_factory=list)   # the shards' process-level findings (exit status 1 at least)


def read(path: str) -> dict:
    """A shard's JSON report; ValueError naming the file and what was expected."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot be read: {e.strerror or e}") from None
    except ValueError as e:         # not JSON, or not UTF-8
        raise ValueError(f"{path}: expected a JSON report of dsv4spec verify --json, not JSON: {e}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: expected a dsv4spec verify JSON report of schema_version {SCHEMA_VERSION}, "
                         f"found schema_version {version!r}")
    problem = malformed(data)
    if problem:
        raise ValueError(f"{path}: a malformed report: {problem}")
    if not data["header"].get("shard"):
        raise ValueError(f"{path}: expected a shard's report (verify --shard K/N), found an unsharded run's")
    return data


# What merge reads of a report, and the type of each (report.schema.json states all of it)
_HEADER = {"tool": dict, "spec": dict, "profile": str, "targets": list, "rules": (str, list), "timeout_s": (int, float),
           "examples_per_check": dict, "date": str, "command": str, "device": str}
_RESULT = {"rule": str, "target": str, "status": str, "detail": str, "reproduce": str, "seconds": (int, float),
           "checks": dict}


def malformed(data: dict) -> str:
    """What a report lacks of what merge reads (empty when nothing)."""
    from ..spec import RULES
    from .report import SHORT

    def lacks(record, fields, where):
        if not isinstance(record, dict):
            return f"{where} is not an object"
        return next((f"{where}.{k} is missing or not {getattr(t, '__name__', 'of its type')}"
                     for k, t in fields.items() if not isinstance(record.get(k), t)), "")
    problem = lacks(data, {"header": dict, "results": list, "not_run": list, "interrupted": bool}, "the report") \
        or lacks(data["header"], _HEADER, "header") or lacks(data["header"]["tool"], {"version": str}, "header.tool") \
        or lacks(data["header"]["spec"], {"digest": str}, "header.spec")
    shard = data["header"].get("shard") if not problem else None
    problem = problem or (shard is not None and lacks(shard, {"index": int, "count": int, "rules": list}, "header.shard"))
    for i, t in enumerate(data["header"]["targets"] if not problem else ()):
        problem = problem or lacks(t, {"spec": str, "name": str}, f"header.targets[{i}]")
    for i, r in enumerate(data["results"] if not problem else ()):
        problem = problem or lacks(r, _RESULT, f"results[{i}]") or (
            r["rule"] not in RULES and f"results[{i}].rule {r['rule']!r} is not a rule of this dsv4spec") or (
            r["status"] not in SHORT and f"results[{i}].status {r['status']!r} is not a status")
    for i, r in enumerate(data["not_run"] if not problem else ()):
        problem = problem or lacks(r, {"rule": str, "target": str}, f"not_run[{i}]")
    return problem or ""



def merge(reports: list[tuple[str, dict]], allow_incomplete: bool = False) -> Merged:
    """The whole run's report from its shards' [(path, parsed JSON)]."""
    if not reports:
        raise ValueError("expected the JSON reports of a run's shards, got none")
    _check_one_run(reports)
    by_index = _by_index(reports)
    first = by_index[min(by_index)]["header"]
    n = first["shard"]["count"]
    missing = [k for k in range(1, n + 1) if k not in by_index]
    if missing and not allow_incomplete:
        raise ValueError(f"shard{'s' * (len(missing) > 1)} {_listed(missing, n)} missing (have "
                         f"{_listed(sorted(by_index), n)}); merge every shard, or pass --allow-incomplete to "
                         "merge these and mark the report incomplete")
    selection = [r.id for r in select(None if first["rules"] == "all" else first["rules"])]
    not_merged = _check_partition(by_index, selection, complete=not missing)
    rows = _rows(by_index, selection, [t["name"] for t in first["targets"]])
    header = _header(by_index, first, selection, missing, not_merged, rows)
    not_run = [(e["rule"], e["target"]) for k in sorted(by_index) for e in by_index[k]["not_run"]]
    findings = [f"shard {k}/{n}: {f}" for k, d in by_index.items() for f in d["header"].get("findings", [])]
    header["findings"] = findings
    return Merged(rows, header, any(d["interrupted"] for d in by_index.values()), not_run,
                  {r for d in by_index.values() for r in d["header"].get("xfail", [])}, findings)


def _check_one_run(reports: list[tuple[str, dict]]) -> None:
    (first_path, first), *others = reports
    for what, key in ONE_RUN:
        for path, data in others:
            if key(data["header"]) != key(first["header"]):
                raise ValueError(f"not one run: {what} differs: {key(first['header'])!r} in {first_path}, "
                                 f"{key(data['header'])!r} in {path}")
    for i, spec in enumerate(first["header"]["targets"]):
        loaded = [(path, {k: d["header"]["targets"][i].get(k) for k in TARGET_KEYS}) for path, d in reports
                  if not d["header"]["targets"][i].get("load_error")]
        for path, record in loaded[1:]:
            if record != loaded[0][1]:
                raise ValueError(f"not one run: targets differ: {loaded[0][1]!r} in {loaded[0][0]}, {record!r} in {path}")
    if first["header"]["spec"]["digest"] != spec_digest():
        raise ValueError(f"the reports were written under rules digest {first['header']['spec']['digest']} "
                         f"(dsv4spec {first['header']['tool']['version']}); this dsv4spec's rules are "
                         f"{spec_digest()}: merge with the version that wrote them")


def _by_index(reports: list[tuple[str, dict]]) -> dict[int, dict]:
    given: dict[int, list[tuple[str, dict]]] = {}
    for path, data in reports:
        given.setdefault(data["header"]["shard"]["index"], []).append((path, data))
    twice = {k: [p for p, _ in g] for k, g in given.items() if len(g) > 1}
    if twice:
        k, paths = min(twice.items())
        raise ValueError(f"shard {k} given more than once: {', '.join(paths)}; expected each shard once")
    return {k: g[0][1] for k, g in sorted(given.items())}


def _listed(indices: list[int], n: int) -> str:
    return ", ".join(f"{k}/{n}" for k in indices)


def _check_partition(by_index: dict[int, dict], selection: list[str], complete: bool) -> list[str]:
    """The selected rules no shard holds; ValueError when the shards overlap, hold a rule outside
    the selection, report a rule outside their own, or (complete) leave a rule out."""
    owner: dict[str, int] = {}
    for k, data in by_index.items():
        mine = data["header"]["shard"]["rules"]
        for rule in mine:
            if rule in owner:
                raise ValueError(f"shards {owner[rule]} and {k} both hold {rule}; expected disjoint shards")
            owner[rule] = k
        stray = sorted({r["rule"] for r in data["results"]} - set(mine))
        if stray:
            raise ValueError(f"shard {k} reports rules outside its shard: {', '.join(stray)}")
        _check_whole(k, data, mine)
    outside = sorted(set(owner) - set(selection))
    if outside:
        raise ValueError(f"the shards hold rules outside the selection: {', '.join(outside)}")
    not_merged = [r for r in selection if r not in owner]
    if complete and not_merged:
        raise ValueError(f"the shards leave out rules of the selection: {', '.join(not_merged)}")
    return not_merged


def _check_whole(k: int, data: dict, mine: list[str]) -> None:
    """ValueError when shard k lacks a result its run had (every rule of its shard on every target
    it loaded, unless listed as not run by an interrupted run), or holds one twice: rows deleted or
    copied by hand."""
    header = data["header"]
    loaded = [t["name"] for t in header["targets"] if not t.get("load_error")]
    held = [(r["rule"], r["target"]) for r in data["results"]]
    twice = sorted({pair for pair in held if held.count(pair) > 1})
    if twice:
        raise ValueError(f"shard {k} holds the result of {twice[0][0]} on {twice[0][1]} more than once")
    accounted = set(held) | {(e["rule"], e["target"]) for e in data["not_run"]}
    lacking = [(rule, t) for t in loaded for rule in mine if (rule, t) not in accounted]
    if lacking and not any(t.get("load_error") for t in header["targets"]):
        raise ValueError(f"shard {k}'s report lacks {len(lacking)} of its results ({lacking[0][0]} on "
                         f"{lacking[0][1]}{', …' if len(lacking) > 1 else ''}): rows deleted? merge the reports "
                         f"verify wrote")


def _rows(by_index: dict[int, dict], selection: list[str], targets: list[str]) -> list[Row]:
    """Every shard's rows in the single-process order (target by target, rule by rule), each
    failure's cause named again over the whole run (a shard saw only its own rules)."""
    rows = [Row(r["rule"], r["target"], r["status"], SAME_CAUSE.sub("", r["detail"], count=1), r["reproduce"],
                r["seconds"], r["checks"], r.get("stages", []))
            for data in by_index.values() for r in data["results"]]
    rule_at = {r: i for i, r in enumerate(selection)}
    rows.sort(key=lambda row: (targets.index(row.target) if row.target in targets else len(targets),
                               rule_at[row.rule_id]))
    return causes.annotate(rows) if any(_explicable(r) for r in rows) else rows


def _explicable(row: Row) -> bool:
    """Whether a row is a failure that causes.annotate could tie to another (it loads every check to
    know, and with them torch: a merge of other rows does without)."""
    return row.status in causes.BROKEN and (row.rule_id in causes.LAYER_RULES or any(
        row.rule_id in order for order in causes.CLAUSE_ORDER.values()))


def _target(in_each_shard: list[dict]) -> dict:
    """A target's record as a shard that loaded it wrote it, with the first load error any shard met
    (a worker may fail in one job only)."""
    loaded = [t for t in in_each_shard if not t.get("load_error")]
    failed = [t for t in in_each_shard if t.get("load_error")]
    return {**(loaded or failed)[0], **({k: failed[0][k] for k in ("load_error", "usage_error")} if failed else {})}


def _header(by_index: dict[int, dict], first: dict, selection: list[str], missing: list[int],
            not_merged: list[str], rows: list[Row]) -> dict:
    import shlex
    import sys
    headers = [d["header"] for d in by_index.values()]
    sizes = {r: n for h in headers for r, n in h["examples_per_check"].items()}
    header = {k: v for k, v in first.items() if k not in ("shard", "wall_s")}
    header.update(
        targets=[_target([h["targets"][i] for h in headers]) for i in range(len(first["targets"]))],
        examples_per_check={r: sizes[r] for r in selection if r in sizes},
        xfail=sorted({r for h in headers for r in h.get("xfail", [])}),
        slowest=slowest(rows),
        command=" ".join(shlex.quote(a) for a in ["dsv4spec", *sys.argv[1:]]),
        merged={"count": first["shard"]["count"], "shards": sorted(by_index), "missing": missing,
                "not_merged": not_merged,
                "runs": [{"shard": k, "date": h["date"], "wall_s": h.get("wall_s"), "device": h["device"],
                          "command": h["command"]} for k, h in zip(by_index, headers)]})
    return header
