"""Test vectors of every check, for a port that cannot run as a target (a simulator, air-gapped CI).

Export runs each rule's checks against a reference target (impl) through a recorder and writes
every operation call they make, the explicit examples first (the boundary sweeps of
properties/boundaries.py and every @example: level 1), then a fixed, derandomized sample of
generated examples (level 2: 25 per check; level 3: the ci profile's per-rule counts), one text
record per call, tagged with its rule and checks.  Judging replays the same checks, in the same
deterministic order, against a target that answers each call with the output the port wrote for
that record: the checks' own oracles, comparison policies and failure messages judge the port,
and a failing rule is probed for the variant it matches exactly as `verify` does.

A record is one header line and its value lines (LAYOUT.md states the grammar):

    @ id=7 rule=FP4.KV.SCALE checks=fp4_e4m3_scale_... level=1 op=fp4_e4m3_quantize lines=1 result=tuple
    0 f32 2 1 16 3f800000 00000000 ...

A value line is `NAME TYPE ...`: a tensor `NAME DTYPE RANK D1 .. DRANK V1 .. VN` (floats as
hex bit patterns, integers in decimal, bytes as 2 hex digits), or a scalar `NAME int 5`,
`NAME float <16 hex digits of the f64 bits>`, `NAME bool 1`, `NAME str TOKEN`, `NAME none`,
`NAME ints N V1 .. VN`; a mapping `NAME map K` is followed by its K entries named `NAME.KEY`.
"""
from __future__ import annotations

import hashlib
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = 1
LEVELS = {1: "the explicit examples of every check (boundaries, @example values)",
          2: "level 1 and 25 generated examples per check (derandomized: the same on every machine)",
          3: "level 1 and the ci profile's generated examples (its per-rule counts)"}
DEFAULT_LEVEL = 2
MAX_RECORD_CHARS = 8_000_000       # a check with a larger call (full-size layer weights) needs a live target
INPUTS, EXPECTED, INFO = "vectors", "expected", "export.txt"
FILE_MODE, DIR_MODE = 0o644, 0o755

# dtype name in a record -> (numpy dtype of the values as written, hex digits or None for decimal)
TENSOR_TYPES = {"f32": (np.uint32, 8), "f64": (np.uint64, 16), "f16": (np.uint16, 4), "bf16": (np.uint16, 4),
                "u8": (np.uint8, 2), "i8": (np.int8, None), "i16": (np.int16, None), "i32": (np.int32, None),
                "i64": (np.int64, None), "b8": (np.uint8, None)}
_NUMPY_NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "uint8": "u8", "int8": "i8",
                "int16": "i16", "int32": "i32", "int64": "i64", "bool": "b8"}
_TORCH_NAMES = {**{f"torch.{k}": v for k, v in _NUMPY_NAMES.items()}, "torch.bfloat16": "bf16"}


class Unwritable(Exception):
    """A value with no text form (an opaque state object, a string with spaces)."""


class VectorError(BaseException):
    """A call the vectors cannot answer: not exported, or the port's output for it missing or
    unreadable.  Not an Exception, so that no check takes it for the port rejecting its input
    (LAYOUT.REJECT's checks expect a raise): it is ERROR, and Hypothesis stops at once."""


class PortError(ValueError):
    """The port wrote `error=...` for a vector: it rejected those inputs (the contract's ValueError)."""


# ------------------------------------------------------------------------------------------------
# Values as text and back
# ------------------------------------------------------------------------------------------------

def _array(v) -> tuple[str, np.ndarray]:
    """(record dtype, the values as the integers written) of a tensor or array."""
    if hasattr(v, "detach"):
        name = _TORCH_NAMES.get(str(v.dtype))
        if name is None:
            raise Unwritable(f"tensor dtype {v.dtype}")
        import torch
        t = v.detach().cpu().contiguous()
        t = t.view(torch.int16) if name == "bf16" else t
        a = t.numpy()
    else:
        a = np.asarray(v)
        name = _NUMPY_NAMES.get(str(a.dtype))
        if name is None:
            raise Unwritable(f"array dtype {a.dtype}")
    kind, _ = TENSOR_TYPES[name]
    return name, np.ascontiguousarray(a).view(kind) if name != "b8" else a.astype(np.uint8)


def value_lines(name: str, v) -> list[str]:
    """The text lines of one value named `name`."""
    if " " in name or not name:
        raise Unwritable(f"name {name!r}")
    if isinstance(v, bool):
        return [f"{name} bool {int(v)}"]
    if isinstance(v, (int, np.integer)) and not isinstance(v, np.ndarray):
        return [f"{name} int {int(v)}"]
    if isinstance(v, float):
        return [f"{name} float {np.float64(v).view(np.uint64):016x}"]
    if isinstance(v, str):
        if not v or any(c.isspace() for c in v):
            raise Unwritable(f"string {v!r}")
        return [f"{name} str {v}"]
    if v is None:
        return [f"{name} none"]
    if isinstance(v, (tuple, list)) and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in v):
        return [" ".join([name, "ints", str(len(v)), *(str(int(i)) for i in v)])]
    if isinstance(v, dict):
        lines = [f"{name} map {len(v)}"]
        for key, item in v.items():
            lines += value_lines(f"{name}.{key}", item)
        return lines
    if hasattr(v, "detach") or isinstance(v, (np.ndarray, np.generic)):
        dtype, a = _array(v)
        digits = TENSOR_TYPES[dtype][1]
        values = (f"{int(w):0{digits}x}" for w in a.reshape(-1)) if digits else (str(int(w)) for w in a.reshape(-1))
        return [" ".join([name, dtype, str(a.ndim), *(str(d) for d in a.shape), *values])]
    raise Unwritable(f"a {type(v).__name__}")


def parse_value(tokens: list[str]):
    """One value line's tokens -> (name, value); a tensor comes back as a numpy array of its dtype
    (bf16 as a torch tensor).  ValueError names what was expected."""
    if len(tokens) < 2:
        raise ValueError("expected `NAME TYPE ...`")
    name, kind, rest = tokens[0], tokens[1], tokens[2:]
    if kind in TENSOR_TYPES:
        if not rest or not rest[0].isdigit():
            raise ValueError(f"{name}: expected the rank after {kind}")
        rank = int(rest[0])
        if len(rest) < 1 + rank or not all(d.isdigit() for d in rest[1:1 + rank]):
            raise ValueError(f"{name}: expected {rank} dimensions after the rank")
        shape = tuple(int(d) for d in rest[1:1 + rank])
        values = rest[1 + rank:]
        n = int(np.prod(shape, dtype=np.int64))
        if len(values) != n:
            raise ValueError(f"{name}: {len(values)} values for shape {list(shape)}, expected {n}")
        storage, digits = TENSOR_TYPES[kind]
        try:
            ints = [int(w, 16 if digits else 10) for w in values]
            a = np.array(ints, dtype=np.uint64 if digits else np.int64)
            a = a.astype(storage).reshape(shape) if digits else np.array(ints, dtype=storage).reshape(shape)
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{name}: a value is not a{' hex' if digits else 'n'} {kind} ({e})") from None
        return name, _typed(kind, a)
    try:
        if kind == "int" and len(rest) == 1:
            return name, int(rest[0])
        if kind == "float" and len(rest) == 1:
            return name, float(np.array([int(rest[0], 16)], dtype=np.uint64).view(np.float64)[0])
        if kind == "bool" and rest in (["0"], ["1"]):
            return name, rest == ["1"]
        if kind == "str" and len(rest) == 1:
            return name, rest[0]
        if kind == "none" and not rest:
            return name, None
        if kind == "map" and len(rest) == 1 and rest[0].isdigit():
            return name, {}                      # its entries follow, named NAME.KEY
        if kind == "ints" and rest and len(rest) == 1 + int(rest[0]):
            return name, tuple(int(i) for i in rest[1:])
    except ValueError:
        pass
    raise ValueError(f"{name}: a {kind!r} value line must be `NAME {kind} ...` as LAYOUT.md states; "
                     f"got {' '.join(tokens[:6])}{' …' if len(tokens) > 6 else ''}")


def _typed(kind: str, a: np.ndarray):
    if kind == "bf16":
        import torch
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    if kind == "b8":
        return a.astype(bool)
    return a.view({"f32": np.float32, "f64": np.float64, "f16": np.float16}.get(kind, a.dtype))


def call_lines(args: tuple, kwargs: dict) -> list[str]:
    lines = []
    for i, a in enumerate(args):
        lines += value_lines(str(i), a)
    for k, v in kwargs.items():
        lines += value_lines(k, v)
    return lines


def result_lines(result) -> tuple[str, list[str]]:
    """(result kind: tuple, map or single, the lines of the outputs)."""
    if isinstance(result, tuple):
        return "tuple", [line for i, r in enumerate(result) for line in value_lines(str(i), r)]
    if isinstance(result, dict):
        return "map", [line for k, r in result.items() for line in value_lines(str(k), r)]
    return "single", value_lines("0", result)


def key_of(op: str, lines: list[str]) -> str:
    return hashlib.sha256("\n".join([op, *lines]).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------
# Records and files
# ------------------------------------------------------------------------------------------------

@dataclass
class Record:
    id: int
    op: str
    lines: list[str]                  # the value lines
    head: dict = field(default_factory=dict)
    line_no: int = 0                  # where its header is in its file

    def text(self) -> str:
        head = " ".join(f"{k}={v}" for k, v in self.head.items())
        return "\n".join([f"@ id={self.id} {head}".rstrip(), *self.lines])


def parse_header(line: str) -> dict:
    fields = {}
    for token in line.split()[1:]:
        key, eq, value = token.partition("=")
        if not eq or not key:
            raise ValueError(f"header field {token!r} is not key=value")
        fields[key] = value
    return fields


def read_records(path: Path) -> tuple[list[tuple[int, dict, list[tuple[int, str]]]], list[str]]:
    """The records of a file as (line number, header fields, [(line number, value line)]), and the
    problems of lines outside any record.  Blank lines and lines starting with # are comments."""
    records, stray = [], []
    text = path.read_bytes().decode("utf-8", errors="replace")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("@"):
            try:
                records.append((n, parse_header(line), []))
            except ValueError as e:
                records.append((n, {"_error": f"line {n}: {e}"}, []))
        elif records:
            records[-1][2].append((n, line))
        else:
            stray.append(f"line {n}: a value line before any `@ id=N` header")
    return records, stray


def write_text(path: Path, text: str):
    path.write_text(text)
    os.chmod(path, FILE_MODE)


def make_dir(path: Path):
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def rule_file(rule_id: str) -> str:
    return f"{rule_id}.txt"


# ------------------------------------------------------------------------------------------------
# Profiles: the levels, never shrinking (a shrunk input is not in the vectors)
# ------------------------------------------------------------------------------------------------

def _profiles():
    from hypothesis import Phase
    from ..runner.suite import CI_EXAMPLES, register_profile
    phases = {1: (Phase.explicit,), 2: (Phase.explicit, Phase.generate)}
    register_profile("vectors-1", parent="ci", phases=phases[1])
    register_profile("vectors-2", parent="ci", phases=phases[2], max_examples=25)
    for n in {25, *CI_EXAMPLES.values()}:
        register_profile(f"vectors-3/{n}", parent="ci", phases=phases[2], max_examples=n)
    for name in ["vectors-1", "vectors-2", *(f"vectors-3/{n}" for n in {25, *CI_EXAMPLES.values()})]:
        register_profile(f"{name}-noshrink", parent=name)


def profile(level: int, rule_id: str) -> str:
    """The Hypothesis profile of a level for one rule (run_check adds -noshrink, the same)."""
    from ..runner.suite import profile_for
    _profiles()
    if level == 3:
        sized = profile_for(rule_id, "ci")
        return "vectors-3/" + (sized.partition("/")[2] or "25")
    return f"vectors-{level}"


@contextmanager
def only_checks(rule_id: str, names):
    """suite.run_rule judging `rule_id` on the named checks alone (those the vectors hold)."""
    from ..runner import suite
    original = suite.checks_for
    suite.checks_for = lambda r: [c for c in original(r) if r != rule_id or c.name in names]
    try:
        yield
    finally:
        suite.checks_for = original


# ------------------------------------------------------------------------------------------------
# Export: record the calls of every check on the reference target
# ------------------------------------------------------------------------------------------------

class _TooLarge(BaseException):
    """A call too large for a text record (stops the check at once; it is left to verify)."""


class _Recording:
    """A provider that passes every operation to `inner` and keeps each call's text form."""

    def __init__(self, inner, ops):
        self._inner, self._ops = inner, ops
        self.calls: list[tuple] = []         # (op, in lines, result kind, out lines) or (op, None, why)

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name not in self._ops or not callable(value):
            return value

        def recorded(*args, **kwargs):
            try:
                lines = call_lines(args, kwargs)
            except Unwritable as e:
                lines, why = None, f"{name} takes {e}"
            if lines is not None and sum(map(len, lines)) > MAX_RECORD_CHARS:
                self.calls.append((name, None, f"{name} with {sum(map(len, lines)) / 1e6:.0f} MB of inputs"))
                raise _TooLarge(name)        # the check stays with verify: no need to run the rest of it
            try:
                result = value(*args, **kwargs)
            except Exception as e:       # noqa: BLE001 -- a check that expects a raise (LAYOUT.REJECT)
                if lines is not None:
                    self.calls.append((name, lines, "error", [f"# {type(e).__name__}: {e}".splitlines()[0]]))
                raise
            if lines is not None:
                try:
                    kind, out = result_lines(result)
                    self.calls.append((name, lines, kind, out))
                    return result
                except Unwritable as e:
                    why = f"{name} returns {e}"
            self.calls.append((name, None, why))
            return result
        return recorded


@dataclass
class RuleVectors:
    rule_id: str
    records: list[Record]
    expected: list[Record]
    checks: list[str]                 # the checks the vectors hold
    omitted: dict[str, str]           # check -> why it is not in the vectors


def record_rule(rule_id: str, reference, level: int, canonical=None) -> RuleVectors:
    """Every call the checks of one rule make on the reference target, levels 1..`level`.

    Where the reference makes a non-canonical choice of an implementation-defined knob (impl
    rejects NaN input, the official code keeps it in its block), a check takes one branch on it and
    another on a port making the canonical choice; the calls of the `canonical` target (spec/'s
    quantizers) on that check are recorded too."""
    from ..runner.suite import PASS, checks_for
    by_key: dict[str, Record] = {}
    expected: dict[str, Record] = {}
    checks, omitted = [], {}
    for chk in checks_for(rule_id):
        calls, statuses = _calls(chk, reference, level, rule_id)
        if canonical is not None and _non_canonical(statuses):
            more, again = _calls(chk, canonical, level, rule_id)
            if all(o.status == PASS or _no_examples(o) for o in again):
                calls += more
        bad = [o for o in statuses if o.status != PASS and not _no_examples(o)]
        unwritable = [c[2] for _, c in calls if c[1] is None]
        unwritable += [f"{c[0]} with {_size(c) / 1e6:.0f} MB of values" for _, c in calls
                       if c[1] is not None and _size(c) > MAX_RECORD_CHARS][:1]
        if unwritable:
            omitted[chk.name] = f"needs a live target ({unwritable[0]}): run it with `dsv4spec verify`"
            continue
        if bad:
            omitted[chk.name] = f"{bad[0].status} on the reference: {bad[0].detail.splitlines()[0] if bad[0].detail else ''}"
            continue
        if not calls:
            omitted[chk.name] = "makes no operation call"
            continue
        checks.append(chk.name)
        for lv, (op, lines, kind, out) in calls:
            key = key_of(op, lines)
            if key not in by_key:
                n = len(by_key) + 1
                by_key[key] = Record(n, op, lines, {"rule": rule_id, "checks": chk.name, "level": lv, "op": op,
                                                     "lines": len(lines), "result": kind})
                raised = kind == "error"            # out is then one comment line: what it raised
                expected[key] = Record(n, op, out, {"op": op, "lines": 0 if raised else len(out), "result": kind}
                                       | ({"error": "raised"} if raised else {}))
            elif chk.name not in by_key[key].head["checks"].split(","):
                by_key[key].head["checks"] += "," + chk.name
    return RuleVectors(rule_id, list(by_key.values()), list(expected.values()), checks, omitted)


class _SpecQuantizers:
    """spec/'s exact quantizers as a target: the canonical choice of every knob (NaN kept in its
    block, where impl rejects it), on any input dtype."""
    NAME = "spec"

    def __getattr__(self, op):
        from ..spec import quant as Q
        if op not in ("fp4_e4m3_quantize", "fp4_e8m0_quantize", "fp8_quantize"):
            raise AttributeError(op)

        def run(x, *args, **kwargs):
            import torch
            from ..properties.compare import as_numpy
            return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in getattr(Q, op)(as_numpy(x), *args, **kwargs))
        return run


def _calls(chk, reference, level: int, rule_id: str):
    """([(level, call)], outcomes) of one check on a recording view of `reference`."""
    from ..runner.suite import run_check
    from ..runner.target import Target
    recording = _Recording(reference.provider, _known_ops())
    target = Target(recording, reference.spec, name=reference.name)
    target.timeout, target.input_dtypes = 0, reference.input_dtypes
    calls, outcomes = [], []
    for lv in (1, level) if level > 1 else (1,):        # a level's sample includes the levels below
        recording.calls = []
        outcomes.append(run_check(chk, target, profile(lv, rule_id), shrink=False))
        calls += [(lv, c) for c in recording.calls]
    return calls, outcomes


def _non_canonical(outcomes) -> bool:
    from ..spec.rules import KNOBS
    return any(v != KNOBS[k].canonical for o in outcomes for k, v in o.detected)


def _size(call) -> int:
    return sum(len(line) for line in call[1]) + sum(len(line) for line in call[3])


def _no_examples(outcome) -> bool:
    """Level 1 of a check without explicit examples: Hypothesis was told to run none."""
    return "SkipTest" in outcome.detail and "no test cases" in outcome.detail


def _known_ops() -> set[str]:
    from ..runner.target import known_ops
    return known_ops()


def export(out: Path, rules: list[str] | None = None, level: int = DEFAULT_LEVEL,
           reference: str = "impl", bf16: bool = False) -> dict:
    """Write vectors/<RULE>.txt (inputs), expected/<RULE>.txt (the reference's outputs) and
    export.txt for every selected rule; returns {rule: RuleVectors} (the rules without vectors too).
    `bf16`: the operations the official code feeds BF16 receive BF16 tensors (a BF16-only port)."""
    from hypothesis import __version__ as hypothesis_version

    from .. import __version__
    from ..runner.suite import load_checks
    from ..runner.target import Target, load_target
    from ..spec import RULES
    from ..spec.rules import select
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)} ({'; '.join(f'{k}: {v}' for k, v in LEVELS.items())})")
    load_checks()
    target = load_target(reference)
    if bf16:            # the official domain: BF16 inputs where the official code takes them
        from ..official import INPUT_DTYPES
        target.input_dtypes = {**target.input_dtypes, **INPUT_DTYPES}
    canonical = Target(_SpecQuantizers(), "spec")
    canonical.input_dtypes = target.input_dtypes
    out = Path(out)
    for d in (out, out / INPUTS, out / EXPECTED):
        make_dir(d)
    done = {}
    for r in select(rules):
        rv = record_rule(r.id, target, level, canonical)
        done[r.id] = rv
        if not rv.records:
            continue
        head = [f"# rule {r.id}: {RULES[r.id].title}", f"# checks: {', '.join(rv.checks)}"]
        head += [f"# not in these vectors: {name}: {why}" for name, why in rv.omitted.items()]
        write_text(out / INPUTS / rule_file(r.id), "\n".join(head + [rec.text() for rec in rv.records]) + "\n")
        write_text(out / EXPECTED / rule_file(r.id),
                   "\n".join([f"# {reference}'s outputs for {INPUTS}/{rule_file(r.id)}: one valid answer; "
                              "judge with `dsv4spec golden check-vectors`"] + [rec.text() for rec in rv.expected]) + "\n")
    info = {"format": FORMAT, "level": level, "reference": reference, "dsv4spec": __version__,
            "hypothesis": hypothesis_version}
    info.update({f"input_dtype.{op}": dtype for op, dtype in sorted(target.input_dtypes.items(), key=str) if op})
    info["input_dtype"] = target.input_dtypes[None]
    write_text(out / INFO, "".join(f"{k}={v}\n" for k, v in info.items()))
    return done


def read_info(export_dir: Path) -> dict:
    path = Path(export_dir) / INFO
    if not path.is_file():
        raise FileNotFoundError(f"no {INFO} in {export_dir}: not a directory written by `dsv4spec golden export`")
    info = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    if info.get("format") != str(FORMAT):
        raise ValueError(f"{path}: vector format {info.get('format')!r}, this dsv4spec reads format {FORMAT}")
    return info


# ------------------------------------------------------------------------------------------------
# Judging a port's outputs: the checks replayed on the outputs it wrote
# ------------------------------------------------------------------------------------------------

@dataclass
class PortOutputs:
    """The outputs a port wrote for one rule's vectors: id -> (kind, {name: value}) or an error text."""
    results: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    raised: dict = field(default_factory=dict)        # id -> the port's own error text (it raised)
    file_error: str | None = None


def read_outputs(path: Path, records: dict[int, Record]) -> PortOutputs:
    """Parse a port's output file; every problem is kept against the record it concerns."""
    got = PortOutputs()
    if not path.is_file():
        got.file_error = f"{path} is not a regular file (never read: it could block)" if path.exists() \
            else f"no output file {path}"
        return got
    try:
        groups, stray = read_records(path)
    except OSError as e:
        got.file_error = f"{path}: cannot be read ({e})"
        return got
    if stray:
        got.file_error = f"{path.name} {stray[0]}"
    for n, head, lines in groups:
        where = f"{path.name} line {n}"
        if "_error" in head or not head.get("id", "").isdigit():
            got.file_error = got.file_error or f"{path.name} {head.get('_error') or f'line {n}: header without id=N'}"
            continue
        rid = int(head["id"])
        if rid not in records:
            continue
        if "error" in head:
            got.raised[rid] = f"the port raised on vector {rid} ({where}): {head['error']}" \
                + (" " + " ".join(l for _, l in lines) if lines else "")
            continue
        try:
            if "lines" in head and head["lines"].isdigit() and int(head["lines"]) != len(lines):
                raise ValueError(f"header says lines={head['lines']}, {len(lines)} value lines follow (truncated?)")
            values = {}
            for m, line in lines:
                try:
                    name, value = parse_value(line.split())
                except ValueError as e:
                    raise ValueError(f"line {m}: {e}") from None
                values[name] = value
            got.results[rid] = values
        except ValueError as e:
            got.errors[rid] = f"{path.name}: vector {rid} (header at line {n}) unreadable: {e}"
    return got


def _result(kind: str, values: dict, expected_names: list[str]):
    """The port's outputs in the form the operation returns (tensors as torch tensors)."""
    import torch

    def torched(v):
        return torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
    top = {k: torched(v) for k, v in values.items() if "." not in k}
    for k in [k for k, v in values.items() if "." in k]:                 # map entries of a map output
        parent, _, key = k.partition(".")
        if isinstance(top.get(parent), dict):
            top[parent][key] = torched(values[k])
    if kind == "map":
        return top
    if kind == "single":
        if "0" not in top:
            raise VectorError(f"no output line named 0 (expected {', '.join(expected_names)})")
        return top["0"]
    missing = [n for n in expected_names if n not in top]
    if missing:
        raise VectorError(f"no output line named {', '.join(missing)} (expected {', '.join(expected_names)})")
    return tuple(top[n] for n in expected_names)


class _Replay:
    """A provider answering each call with the port's output for the vector of the same inputs."""

    def __init__(self, rule_id, records: list[Record], expected: dict[int, Record], outputs: PortOutputs,
                 info: dict, where: str, declared: dict, required: set = frozenset()):
        self.NAME = declared.get("name") or f"vectors:{where}"
        self.VARIANTS = {k[len("variant."):]: v for k, v in declared.items() if k.startswith("variant.")}
        self.EXTENSIONS = set(declared.get("extensions", "").split(",")) - {""}
        self.INPUT_DTYPE = info.get("input_dtype", "float32")
        self.INPUT_DTYPES = {k.partition(".")[2]: v for k, v in info.items() if k.startswith("input_dtype.")}
        if "contract" in declared:           # the contract version it was written against (CONTRACT)
            self.CONTRACT = int(declared["contract"])
        self._rule, self._info = rule_id, info
        self._by_key = {key_of(r.op, r.lines): r for r in records}
        self._expected, self._outputs = expected, outputs
        answered = set(outputs.results) | set(outputs.errors) | set(outputs.raised)
        # a declared operation answers every record of it: one it left out (an empty file) is ERROR
        self._ops = {r.op for r in records if r.id in answered or outputs.file_error} | set(required)
        self._methods = {op: self._answering(op) for op in self._ops}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._methods[name]
        except KeyError:
            raise AttributeError(name) from None

    def _answering(self, op):
        def answer(*args, **kwargs):
            try:
                record = self._by_key.get(key_of(op, call_lines(args, kwargs)))
            except Unwritable as e:
                raise VectorError(f"{op} called with {e}, which no vector holds") from None
            if record is None:
                raise VectorError(
                    f"{op} called with inputs no vector of {self._rule} holds (exported by dsv4spec "
                    f"{self._info.get('dsv4spec')} with hypothesis {self._info.get('hypothesis')} at level "
                    f"{self._info.get('level')}: export again with this installation; or the check built "
                    f"them from the port's own earlier outputs, which then already differ)")
            if record.id in self._outputs.raised:
                raise PortError(self._outputs.raised[record.id])
            if record.id in self._outputs.errors:
                raise VectorError(self._outputs.errors[record.id])
            if record.id not in self._outputs.results:
                raise VectorError(self._outputs.file_error and f"{self._outputs.file_error} (vector {record.id})"
                                  or f"no output for vector {record.id} (its header at line {record.line_no} "
                                     f"of {INPUTS}/{rule_file(self._rule)})")
            want, got = self._expected[record.id], self._outputs.results[record.id]
            names = [line.split()[0] for line in want.lines if not line.startswith("#") and "." not in line.split()[0]]
            if not names:           # the reference rejected these inputs: the port's outputs 0, 1, … as written
                names = [str(i) for i in range(len(got)) if str(i) in got]
            try:
                kind = want.head.get("result", "tuple")
                if kind == "error":
                    kind = "tuple" if len(names) > 1 else "single"
                return _result(kind, got, names)
            except VectorError as e:
                raise VectorError(f"vector {record.id}: {e}") from None
        answer.__name__ = op
        return answer


def load_rule(export_dir: Path, rule_id: str) -> tuple[list[Record], dict[int, Record]]:
    """(input records, expected records by id) of one rule."""
    export_dir = Path(export_dir)

    def records(path):
        groups, _ = read_records(path)
        out = []
        for n, head, lines in groups:
            rid = int(head.pop("id"))
            out.append(Record(rid, head.get("op", ""), [l for _, l in lines], head, n))
        return out
    inputs = records(export_dir / INPUTS / rule_file(rule_id))
    expected = {r.id: r for r in records(export_dir / EXPECTED / rule_file(rule_id))}
    return inputs, expected


def exported_rules(export_dir: Path) -> list[str]:
    return sorted(p.name[:-4] for p in (Path(export_dir) / INPUTS).glob("*.txt"))


_NUMPY_REPR = re.compile(r"np\.(?:float|int|uint|bool|complex|str_)\w*\(([^()]*)\)")


def plain(text: str) -> str:
    """A message without numpy's reprs: np.float32(0.5) -> 0.5."""
    return _NUMPY_REPR.sub(r"\1", text)


def judge(export_dir: Path, port_dir: Path, rules: list[str] | None = None, program: str = "dsv4spec",
          ops: str | None = None):
    """One suite Row per exported rule selected: the rule's checks replayed on the port's outputs
    (port_dir/<RULE>.txt).  A missing or unreadable file is ERROR on the checks that need it.  Where
    the port declares its operations (`ops`, else port.txt's ops=), a rule that calls none of them
    and has no output file is n/i, as `verify` reads a target without them."""
    from ..runner.suite import ERROR, NOT_IMPLEMENTED, Row, load_checks, run_rule
    from ..runner.target import Target
    from ..spec.rules import _matches
    export_dir, port_dir = Path(export_dir), Path(port_dir)
    info = read_info(export_dir)
    level = int(info["level"])
    if not port_dir.is_dir():
        raise FileNotFoundError(f"{port_dir} is not a directory of port outputs")
    load_checks()
    declared = read_declarations(port_dir)
    implemented = declared_ops(port_dir, ops)
    chosen = [r for r in exported_rules(export_dir) if not rules or any(_matches(r, p) for p in rules)]
    if rules and not chosen:
        raise ValueError(f"no exported vectors for a rule matching {', '.join(rules)}; the export holds "
                         f"{', '.join(exported_rules(export_dir))}")
    rows = []
    for rule_id in chosen:
        records, expected = load_rule(export_dir, rule_id)
        outputs = read_outputs(port_dir / rule_file(rule_id), {r.id: r for r in records})
        names = _checks_of(export_dir / INPUTS / rule_file(rule_id))
        repro = f"{program} golden check-vectors {export_dir} {port_dir} --rules {rule_id}"
        called = sorted({r.op for r in records})
        required = set(called) & implemented if implemented is not None else set()
        if implemented is not None and not required and not (port_dir / rule_file(rule_id)).exists():
            rows.append(Row(rule_id, f"vectors:{port_dir}", NOT_IMPLEMENTED,
                            f"missing {', '.join(called)} (not among the operations the port declares)"))
            continue
        if outputs.file_error and not outputs.results and not outputs.errors:
            rows.append(Row(rule_id, f"vectors:{port_dir}", ERROR, outputs.file_error, repro))
            continue
        replay = _Replay(rule_id, records, expected, outputs, info, str(port_dir), declared, required)
        target = Target(replay, f"vectors:{port_dir}")
        target.timeout = 0
        with only_checks(rule_id, names):
            row = run_rule(rule_id, target, profile(level, rule_id))
        row.detail = plain(row.detail)
        if outputs.file_error and row.status not in ("FAIL", "ERROR"):
            row.status, row.detail = ERROR, outputs.file_error
        row.reproduce = repro if row.status in ("FAIL", "ERROR") else ""
        rows.append(row)
    return rows


PORT = "port.txt"


def declared_ops(port_dir: Path, ops: str | None = None) -> frozenset | None:
    """The operations a port declares it implements: `ops` (comma-separated, the command line's
    --ops), else OUT/port.txt's `ops=`; None where it declares none.  Unknown names are a ValueError."""
    from ..runner.target import known_ops
    text = ops if ops is not None else read_declarations(port_dir).get("ops")
    if text is None:
        return None
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    where = "--ops" if ops is not None else f"{Path(port_dir) / PORT} ops="
    if not names:       # declaring nothing is not conformance: every rule would read n/i
        raise ValueError(f"{where} declares no operation; name the operations the port implements "
                         f"(`dsv4spec ops` lists them), or leave it out to expect every output")
    unknown = sorted(names - known_ops())
    if unknown:
        raise ValueError(f"{where} names operations the contract does not know: {', '.join(unknown)} "
                         f"(`dsv4spec ops` lists them)")
    return names


def read_declarations(port_dir: Path) -> dict:
    """OUT/port.txt, optional: `name=...`, `variant.KNOB=VALUE` (the implementation-defined choices
    and variants the port declares, as a Python target's VARIANTS), `extensions=A,B`, `ops=A,B` (the
    operations it implements), `contract=N` (the contract version it was written against, as a
    Python target's CONTRACT)."""
    path = Path(port_dir) / PORT
    if not path.exists():
        return {}
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file (never read: it could block)")
    declared = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            key, eq, value = line.strip().partition("=")
            if not eq:
                raise ValueError(f"{path} line {n}: expected key=value (name=, variant.KNOB=VALUE, extensions=, ops=, "
                                 f"contract=)")
            declared[key] = value
    from ..spec.rules import check_variants
    check_variants({k[len("variant."):]: v for k, v in declared.items() if k.startswith("variant.")})
    from ..runner.contract import CONTRACT_VERSION
    if "contract" in declared and not (declared["contract"].isdigit() and 1 <= int(declared["contract"]) <= CONTRACT_VERSION):
        raise ValueError(f"{path} contract= must be the contract version the port was written against, an integer "
                         f"from 1 to {CONTRACT_VERSION}, got {declared['contract']!r}")
    return declared


def _checks_of(path: Path) -> set[str]:
    for line in path.read_text().splitlines():
        if line.startswith("# checks: "):
            return set(line[len("# checks: "):].split(", "))
    return set()


# ------------------------------------------------------------------------------------------------
# A Python target as a port: answer the vectors with its operations (what a port's loop does)
# ------------------------------------------------------------------------------------------------

def parse_call(lines: list[str]) -> tuple[list, dict]:
    """The positional and keyword arguments of a record's value lines (tensors as torch tensors)."""
    import torch
    values: dict = {}
    for line in lines:
        name, value = parse_value(line.split())
        parent, dot, key = name.partition(".")
        if dot and isinstance(values.get(parent), dict):
            values[parent][key] = torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value
        else:
            values[name] = torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value
    args = [values.pop(str(i)) for i in range(len(values)) if str(i) in values]
    return args, values


def answer(export_dir: Path, out_dir: Path, target, rules: list[str] | None = None):
    """Write out_dir/RULE.txt: `target`'s outputs for every exported record of an operation it has
    (`@ id=N error=...` where it raises), as a port would."""
    from ..spec.rules import _matches
    export_dir, out_dir = Path(export_dir), Path(out_dir)
    make_dir(out_dir)
    for rule_id in exported_rules(export_dir):
        if rules and not any(_matches(rule_id, p) for p in rules):
            continue
        records, _ = load_rule(export_dir, rule_id)
        text = []
        for r in records:
            if not target.has(r.op):
                continue
            args, kwargs = parse_call(r.lines)
            try:
                _, lines = result_lines(getattr(target, r.op)(*args, **kwargs))
            except Exception as e:      # noqa: BLE001 -- the port rejects these inputs
                text.append(f"@ id={r.id} error={type(e).__name__}")
                continue
            text += [f"@ id={r.id}", *lines]
        if text:
            write_text(out_dir / rule_file(rule_id), "\n".join(text) + "\n")
    lines = [f"name={target.name}", *(f"variant.{k}={v}" for k, v in target.declared.items())]
    lines += [f"extensions={','.join(sorted(target.extensions))}"] if target.extensions else []
    lines += [f"contract={target.contract}"] if target.contract is not None else []
    write_text(out_dir / PORT, "\n".join(lines) + "\n")
