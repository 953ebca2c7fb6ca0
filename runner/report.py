"""Reports of a verify run: terminal matrix, JSON, JUnit XML, Markdown.

JSON (schema_version 4; runner/report.schema.json is its JSON Schema), one object:

    schema_version   4
    header           the run: tool {name, version}, spec {rules, digest} (the digest is a sha256
                     prefix of every rule's id, status, statement and knob: equal digests, equal
                     rules), targets [{spec, name, module, version, device, claims_conformance, and
                     load_error and usage_error when it could not be loaded}], profile,
                     seed (null when derandomized), timeout_s, examples_per_check {rule: n}
                     (the profile's size per rule: ci is sized by measured cost), rules (the
                     prefixes, or "all"),
                     workers, worker_devices, isolate, python, torch, device ("cpu" or "cuda"),
                     gpus [names], date (UTC, ISO 8601), command, wall_s (the run's wall time:
                     loading the targets and running every rule, the report's writing excluded),
                     slowest [{rule, target, seconds}] (the three longest rules, a second or more),
                     max_examples (--max-examples, null for the profile's), xfail [rules an --xfail
                     file expects to fail], shard ({index K, count N, rules [its rule ids]} of
                     `verify --shard K/N`, else null), entries {skip, xfail: [[prefix, reason]]} (the
                     --skip and --xfail files'), findings [what the process showed beyond the rows:
                     threads a target left running, a process it ended; each makes the exit status at
                     least 1, merged too]; a merged report (`report merge`) has no shard
                     but merged {count N, shards [K merged], missing [K], not_merged [rules of the
                     missing shards], runs [{shard, date, wall_s, device, command}]}
    interrupted      true when the run was stopped (Ctrl-C or SIGTERM: the header's interrupted_by)
                     before every result was in
    not_run          [{rule, target}] the results an interrupted run did not reach
    counts           {target: {status: n}}
    results          [{rule, target, status, detail, reproduce, seconds, checks {check: status},
                     stages [{stage, rule, status, detail}]}] in the order rule × target of a
                     single-process run; stages: a layer rule's verdict on each stage (PASS, FAIL,
                     VARIANT with the declared "knob=value" it was judged under, or "not judged"
                     with why: a contract version that withheld its inputs), those
                     of the failing case on a FAIL, else each stage's over every case; [] elsewhere

status is one of PASS, FAIL, ERROR, TIMEOUT, VARIANT, n/i (not implemented), SKIP.  Version 3 had
no stages; version 2
said NOT_IMPLEMENTED for n/i and had no not_run; version 1 had no header, counts or interrupted,
and held profile/targets/rules at the top level.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import xml.etree.ElementTree as ET

from dsv4spec.triton_mode import no_gpu_here

from ..spec import RULES
from .contract import printable
from .suite import ERROR, FAIL, NOT_IMPLEMENTED, NOT_JUDGED, PASS, SKIP, TIMEOUT, VARIANT, Row

SCHEMA_VERSION = 4
SHORT = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", TIMEOUT: "TIMEOUT", VARIANT: "VARIANT",
         NOT_IMPLEMENTED: "n/i", SKIP: "skip"}
PROBLEMS = (FAIL, ERROR, TIMEOUT)


def _matrix(rows: list[Row]):
    targets = list(dict.fromkeys(r.target for r in rows))
    rules = list(dict.fromkeys(r.rule_id for r in rows))
    cell = {(r.rule_id, r.target): r for r in rows}
    return targets, rules, cell


def spec_digest() -> str:
    text = "\n".join(f"{r.id}|{r.status}|{r.statement}|{r.knob}" for r in sorted(RULES.values(), key=lambda r: r.id))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment() -> dict:
    """The machine part of a report's header."""
    import datetime
    import platform
    version, gpus = _torch_and_gpus()
    return {"python": platform.python_version(), "torch": version,
            "device": "cuda" if gpus else "cpu", "gpus": gpus,
            "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()}


def _torch_and_gpus() -> tuple[str, list[str]]:
    """torch's version and the GPUs it sees; where torch is not imported and no GPU driver is here (a
    supervisor of CPU workers), the version from the installed package's metadata, without importing it."""
    if "torch" not in sys.modules and no_gpu_here():
        import importlib.metadata
        try:
            return importlib.metadata.version("torch"), []
        except importlib.metadata.PackageNotFoundError:
            pass
    import torch
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return torch.__version__, gpus


def header_line(header: dict) -> str:
    """One line for the terminal: what ran, where."""
    seed = "derandomized" if header.get("seed") is None else f"seed {header['seed']}"
    where = ", ".join(header.get("gpus") or []) or header.get("device", "")
    workers = header.get("workers", 1)
    sizes = sorted(set((header.get("examples_per_check") or {}).values()))
    examples = f" ({sizes[0]}{'–' + str(sizes[-1]) if len(sizes) > 1 else ''} examples a check)" if sizes else ""
    return (f"dsv4spec {header['tool']['version']} · rules {header['spec']['digest']} · profile "
            f"{header['profile']}{examples} · {seed} · torch {header.get('torch', '?')} · {where}"
            + (f" · {workers} workers on {', '.join(header['worker_devices'])}" if workers > 1 else "")
            + _shards(header)
            + (f" · {header['wall_s']:g} s" if "wall_s" in header else "")
            + ("; slowest: " + ", ".join(f"{r['rule']} on {r['target']} {r['seconds']:.1f} s"
                                         for r in header["slowest"]) if header.get("slowest") else ""))


def _shards(header: dict) -> str:
    """Which shard of the run a report holds ("shard 2/4"), or which shards it merged."""
    if header.get("shard"):
        return f" · shard {header['shard']['index']}/{header['shard']['count']}"
    merged = header.get("merged")
    if not merged:
        return ""
    n = merged["count"]
    missing = ", ".join(f"{k}/{n}" for k in merged["missing"])
    return f" · {len(merged['shards'])} of {n} shards merged" + (f" (INCOMPLETE: {missing} missing)" if missing else "")


def incompleteness(header: dict) -> list[str]:
    """What a merged report of an incomplete set of shards says first: the shards and rules it lacks."""
    merged = header.get("merged") or {}
    if not merged.get("missing"):
        return []
    shards = ", ".join(f"{k}/{merged['count']}" for k in merged["missing"])
    return [f"INCOMPLETE: shard{'s' * (len(merged['missing']) > 1)} {shards} not merged; their rules are "
            f"not in this report: {', '.join(merged['not_merged'])}"]


def slowest(rows: list[Row], n: int = 3) -> list[dict]:
    """The n rules that took longest (a second or more), for the header."""
    return [{"rule": r.rule_id, "target": r.target, "seconds": round(r.seconds, 1)}
            for r in sorted((r for r in rows if r.seconds >= 1), key=lambda r: -r.seconds)[:n]]


def terminal(rows: list[Row], color: bool = False) -> str:
    targets, rules, cell = _matrix(rows)
    paint = {PASS: "32", FAIL: "31", ERROR: "31", TIMEOUT: "33", VARIANT: "36"}
    width = max([len(r) for r in rules] + [4])
    cols = [max(len(t), 7) for t in targets]
    lines = ["rule".ljust(width) + "  " + "  ".join(t.ljust(c) for t, c in zip(targets, cols))]
    for rule_id in rules:
        parts = []
        for t, c in zip(targets, cols):
            status = cell[(rule_id, t)].status if (rule_id, t) in cell else ""
            text = SHORT.get(status, "-").ljust(c)
            parts.append(f"\033[{paint[status]}m{text}\033[0m" if color and status in paint else text)
        lines.append(rule_id.ljust(width) + "  " + "  ".join(parts))
    lines.append("")
    lines.append(summary(rows))
    for r in (r for r in rows if r.status in PROBLEMS):
        lines.append(f"\n{r.status} {r.rule_id} on {r.target}: {RULES[r.rule_id].title}")
        lines.extend("    " + line for line in r.detail.splitlines())
        if r.reproduce:
            lines.append(f"    reproduce: {r.reproduce}")
    for r in (r for r in rows if r.status == VARIANT or withheld(r)):
        lines.append(f"{r.status} {r.rule_id} on {r.target}: {r.detail}")
    return "\n".join(lines)


def withheld(row: Row) -> bool:
    """A passing row of a layer rule with stages not judged (a contract version withheld their inputs)."""
    return row.status == PASS and any(v["status"] == NOT_JUDGED for v in row.stages)


def counts(rows: list[Row]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r.target, {}).setdefault(r.status, 0)
        out[r.target][r.status] += 1
    return out


def summary(rows: list[Row]) -> str:
    return "\n".join(f"{t}: " + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(c.items()))
                     for t, c in counts(rows).items())


def conclusion(rows: list[Row], claims: dict[str, bool], status: int, expected=frozenset()) -> str:
    """The run's last line: the verdict on the targets that claim conformance, and what the others
    got, so that it never reads green over a FAIL in the table (rules `expected` to fail, an xfail
    file's, are counted apart)."""
    def problems(names, xfail=None):        # xfail None: whether expected or not
        found = counts([r for r in rows if r.target in names and r.status in PROBLEMS
                        and xfail in (None, r.rule_id in expected)])
        total = {s: sum(c.get(s, 0) for c in found.values()) for s in PROBLEMS}
        return ", ".join(f"{n} {s}" for s, n in total.items() if n)

    claiming = [t for t, c in claims.items() if c]
    others = [t for t, c in claims.items() if not c]
    bad = problems(claiming, xfail=False)
    verdict = f"{bad} (exit {status})" if bad else "no FAIL, ERROR or TIMEOUT" if status == 0 \
        else f"FAILURES (exit {status})"
    line = f"conformance claimed by {', '.join(claiming)}: {verdict}" if claiming \
        else f"no target claims conformance (exit {status})"
    known = problems(claiming, xfail=True)
    if known:
        line += f" ({known} expected by --xfail)"
    found = problems(others)
    if found:
        line += (f"; not claimed by {', '.join(others)} (CLAIMS_CONFORMANCE = False): {found}, "
                 "findings that do not change the exit status")
    return line


def interruption(not_run: list[tuple[str, str]], finished: int, cause: str = "Ctrl-C") -> list[str]:
    """What an interrupted run says in every format: how far it got and, per target, what did not run."""
    total = finished + len(not_run)
    lines = [f"INTERRUPTED ({cause}): {finished} of {total} results finished; not run:"]
    for target in dict.fromkeys(t for _, t in not_run):
        lines.append(f"  {target}: " + ", ".join(r for r, t in not_run if t == target))
    return lines


def to_json(rows: list[Row], header: dict, interrupted: bool = False, not_run=()) -> str:
    return json.dumps({
        "schema_version": SCHEMA_VERSION,
        "header": header,
        "interrupted": interrupted,
        "not_run": [{"rule": r, "target": t} for r, t in not_run],
        "counts": counts(rows),
        "results": [{"rule": r.rule_id, "target": r.target, "status": r.status, "detail": r.detail,
                     "reproduce": r.reproduce, "seconds": round(r.seconds, 3), "checks": r.checks,
                     "stages": r.stages}
                    for r in rows],
    }, indent=2)


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with every character XML 1.0 cannot hold (control characters such as ESC and NUL
    from a port's standard error) written as \\xNN, so that the JUnit file stays well-formed."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        text)


def to_junit(rows: list[Row], header: dict | None = None, interrupted: bool = False, not_run=()) -> str:
    """One testsuite per target, one testcase per rule; a failure's text ends with its reproduce
    command.  An interrupted run says so in each suite's properties, and every rule it did not
    reach is a skipped testcase "not run (interrupted)"."""
    suites = ET.Element("testsuites", name="dsv4spec")
    targets, _, _ = _matrix(rows)
    for t in dict.fromkeys([*targets, *(t for _, t in not_run)]):
        mine = [r for r in rows if r.target == t]
        missed = [rule for rule, target in not_run if target == t]
        suite = ET.SubElement(suites, "testsuite", name=xml_safe(t), tests=str(len(mine) + len(missed)),
                              failures=str(sum(r.status == FAIL for r in mine)),
                              errors=str(sum(r.status in (ERROR, TIMEOUT) for r in mine)),
                              skipped=str(sum(r.status in (SKIP, NOT_IMPLEMENTED) for r in mine) + len(missed)))
        if header or interrupted:
            props = ET.SubElement(suite, "properties")
            for key in ("profile", "seed", "torch", "device", "date") if header else ():
                ET.SubElement(props, "property", name=key, value=xml_safe(str(header.get(key))))
            if header and header.get("shard"):
                ET.SubElement(props, "property", name="shard", value=_shards(header).removeprefix(" · shard "))
            for line in incompleteness(header or {}):
                ET.SubElement(props, "property", name="incomplete", value=xml_safe(line))
            if interrupted:
                ET.SubElement(props, "property", name="interrupted", value="true")
        for r in mine:
            case = ET.SubElement(suite, "testcase", classname=xml_safe(f"{t}.{RULES[r.rule_id].family}"),
                                 name=r.rule_id, time=f"{r.seconds:.3f}")
            detail = xml_safe(r.detail)
            text = detail + (f"\n\nreproduce: {xml_safe(r.reproduce)}" if r.reproduce else "")
            first = detail.splitlines()[0] if detail else r.status
            if r.status == FAIL:
                ET.SubElement(case, "failure", message=first).text = text
            elif r.status in (ERROR, TIMEOUT):
                ET.SubElement(case, "error", message=f"{r.status}: {first}", type=r.status).text = text
            elif r.status in (SKIP, NOT_IMPLEMENTED):
                ET.SubElement(case, "skipped", message=f"{r.status}: {detail}")
            elif r.status == VARIANT or withheld(r):
                ET.SubElement(case, "system-out").text = detail
        for rule_id in missed:
            case = ET.SubElement(suite, "testcase", classname=xml_safe(f"{t}.{RULES[rule_id].family}"), name=rule_id,
                                 time="0")
            ET.SubElement(case, "skipped", message="not run (interrupted)")
    return ET.tostring(suites, encoding="unicode")


def to_markdown(rows: list[Row], header: dict | None = None, interrupted: bool = False, not_run=()) -> str:
    """The header, the rules × targets matrix, counts per target, and every failure in full; an
    interrupted run says so first, with the rules that did not run."""
    targets, rules, cell = _matrix(rows)
    lines = ["# dsv4spec conformance report", ""]
    lines += [f"**{line}**\n" for line in incompleteness(header or {})]
    lines += [f"**Finding: {printable(line)}**\n" for line in (header or {}).get("findings", [])]
    if interrupted:
        first, *rest = interruption(list(not_run), len(rows), (header or {}).get("interrupted_by", "Ctrl-C"))
        lines += [f"**{first}**", "", *(f"- {line.strip()}" for line in rest), ""]
    if header:
        lines += [f"`{header_line(header)}`", "",
                  "| target | version | device | claims conformance |", "|---|---|---|---|"]
        lines += [f"| {_cell(t['name'])} (`{_cell(t['spec'])}`) | {_cell(t.get('version') or '-')} | "
                  f"{_cell(t.get('device') or '-')} | "
                  f"{'yes' if t.get('claims_conformance') else 'no'} |" for t in header.get("targets", [])]
        lines.append("")
    lines += ["## Counts", "", "| target | " + " | ".join(SHORT.values()) + " |",
              "|---|" + "---|" * len(SHORT)]
    for t, c in counts(rows).items():
        lines.append(f"| {_cell(t)} | " + " | ".join(str(c.get(s, 0)) for s in SHORT) + " |")
    lines += ["", "## Matrix", "", "| rule | title | " + " | ".join(map(_cell, targets)) + " |",
              "|---|---|" + "---|" * len(targets)]
    for rule_id in rules:
        lines.append(f"| `{rule_id}` | {RULES[rule_id].title} | "
                     + " | ".join(SHORT.get(cell[(rule_id, t)].status, "-") if (rule_id, t) in cell else "-"
                                  for t in targets) + " |")
    problems = [r for r in rows if r.status in PROBLEMS + (VARIANT,) or withheld(r)]
    if problems:
        lines += ["", "## Details"]
    for r in problems:
        lines += ["", f"### {r.status} `{r.rule_id}` on {_cell(r.target)}", "", RULES[r.rule_id].statement, "",
                  *_fenced(r.detail)]
        if r.reproduce:
            lines += ["", "Reproduce:", "", *_fenced(r.reproduce, "sh")]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` as one cell of a Markdown table row: its `|` escaped, its line breaks spaces."""
    return printable(str(text)).replace("|", "\\|").replace("\n", " ")


def _fenced(text: str, language: str = "") -> list[str]:
    """A Markdown code block of `text` whose fence is longer than any run of backticks in it, so
    that nothing a target prints can close it."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, text, fence]


def check_writable(path: str) -> None:
    """Raise ValueError unless a report can be written at `path` (checked before a run starts)."""
    if os.path.isdir(path):
        raise ValueError(f"report path {path} is a directory; expected a file name")
    if _special(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"report path {path} is not writable")
        return
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"report path {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"report path {path}: folder {folder} is not writable")


def _special(path: str) -> bool:
    """True for what exists and is not a regular file once links are followed (a FIFO, a device,
    /dev/stdout): written through, never replaced."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def write_atomically(path: str, text: str) -> None:
    """Write a report at `path`.  A regular file (or none yet) is written to a temporary file
    beside it and renamed over it, so a reader never sees half a report; through a symbolic link
    that file is the link's target, and the link stays.  Anything else (a FIFO, a device,
    /dev/stdout) is opened and written through, never replaced.  The file's mode is that of the
    file it replaces, else 0666 less the umask (0644 as a rule), as `open` would give it."""
    if path == "-":
        try:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
        except (OSError, ValueError, AttributeError) as e:     # closed, or its reader gone
            raise ValueError(f"cannot write report to standard output: {getattr(e, 'strerror', '') or 'it is closed'}") from None
        return
    try:
        if _special(path):
            _write_through(path, text)
            return
        _replace(os.path.realpath(path), text)
    except OSError as e:
        raise ValueError(f"cannot write report {path}: {e.strerror or e}") from None


def _write_through(path: str, text: str) -> None:
    """Write to a FIFO or a device as it is; a FIFO no one reads is an error, not a hang."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise ValueError(f"cannot write report {path}: a FIFO with no reader (start its reader first)") from None
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _replace(path: str, text: str) -> None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".dsv4spec-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
