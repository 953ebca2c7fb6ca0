"""LAYOUT.md of an export: everything a port in another language reads, without the project's Python."""
from __future__ import annotations

import importlib

from ..properties.families import FAMILY_MODULES
from .vectors import EXPECTED, INFO, INPUTS, LEVELS

SAFETENSORS_SPEC = "https://github.com/huggingface/safetensors#format"

_TYPES = {"f32": "float32, 8 hex digits of the IEEE-754 bits (3f800000 = 1.0)",
          "bf16": "bfloat16, 4 hex digits of its bits (the top half of the float32 bits)",
          "f16": "float16, 4 hex digits of its bits", "f64": "float64, 16 hex digits of its bits",
          "u8": "uint8 (codes, scale bytes, packed nibbles, entry bytes), 2 hex digits",
          "i8": "int8, decimal", "i16": "int16, decimal", "i32": "int32, decimal",
          "i64": "int64 (positions, lengths, indices; -1 pads a top-k row), decimal",
          "b8": "bool, 0 or 1"}

_GRAMMAR = f"""
## The text records (vectors/, expected/, cases/*.txt and the files a port writes)

A file is a sequence of records.  Lines are separated by `\\n`; tokens in a line by one or more
spaces, the only separator (no `|`, no JSON; a comma only separates the names inside one header
value, `checks=a,b`).  Blank lines and lines starting with `#` are comments, also inside a record.

A record is a **header line** starting with `@`, followed by `key=value` fields (no spaces in a
value), then its **value lines**, up to the next header:

    @ id=7 rule=FP4.KV.SCALE checks=fp4_e4m3_scale_is_nearest_e4m3_of_amax_over_6 level=1 op=fp4_e4m3_quantize lines=1 result=tuple
    0 f32 2 1 16 3d4ccccd 3c23d70a 00000000 ...

Header fields: `id` (the record's number in its file, from 1), `rule` and `checks` (the rule and
the checks, comma-separated, that make this call), `level` (below), `op` (the operation),
`lines` (how many value lines follow: a reader can check it has them all), `result` (what the
operation returns: `tuple` of outputs named 0, 1, ...; `single`, one output named 0; `map`, named
outputs; `error`: the reference raised on these inputs, as the rule requires).

A value line is `NAME TYPE ...`.  In vectors/ the values are the operation's arguments: names
`0`, `1`, ... are positional, in that order; other names are keyword arguments.  Types:

| TYPE | line | meaning |
|---|---|---|
""" + "".join(f"| `{t}` | `NAME {t} RANK D1 .. DRANK V1 .. VN` | a tensor, C order, N = D1·…·DRANK values: {m} |\n"
              for t, m in _TYPES.items()) + """| `int` | `NAME int 64` | an integer argument |
| `float` | `NAME float 3ff0000000000000` | a float argument: 16 hex digits of its float64 bits |
| `bool` | `NAME bool 1` | a boolean argument, 0 or 1 |
| `str` | `NAME str position` | a string argument (never empty, never a space) |
| `none` | `NAME none` | no value (Python's None) |
| `ints` | `NAME ints 3 8 1 64` | a tuple of integers: the count, then the integers |
| `map` | `NAME map 2` | a mapping of K entries, given by the next K value lines, named `NAME.KEY` |

A tensor of rank 0 is `NAME f32 0 3f800000`.  Every line parses with `scanf("%s")` and
`strtoul(token, 16)` / `strtol(token, 10)`.
"""

_OUTPUTS = f"""
## What a port writes, and how it is judged

For each `{INPUTS}/RULE.txt` it implements, a port writes `OUT/RULE.txt` (same file name) holding,
for each record it answers, a header `@ id=N` (the input record's id; other fields are ignored)
and one value line per output: names `0`, `1`, ... for a `result=tuple` operation in the order of
the operation's outputs, `0` for `result=single`, the output names for `result=map`.  Output
dtypes are the operation's contract (the table below, and `{EXPECTED}/RULE.txt`, which holds
the reference's own outputs in exactly this form).  Where the operation rejects its inputs (a
malformed entry: `result=error` in `{EXPECTED}/`), write `@ id=N error=SHORT_REASON` and no
value lines.  Records of an operation the port does not implement are simply left out.

A port that implements some operations only declares them, so that what it leaves out reads n/i
and a crash before it wrote an output does not: a line `ops=OP1,OP2` (canonical names) in
`OUT/port.txt`, or `--ops OP1,OP2` on the command line (which wins).  A rule that calls none of
the declared operations and has no output file is then n/i; one that calls a declared operation
needs its file and every record of that operation (ERROR otherwise: an empty file answers none).
A port that declares nothing must write a file for every rule (a missing one is ERROR); an empty
file then reads n/i.  An empty declaration (`ops=`, `--ops ""`) is refused (exit 2).
`OUT/port.txt` may also hold `name=...`, `variant.KNOB=VALUE`, `extensions=A,B` and `contract=N` (the
contract version the port was written against, as a Python target's `CONTRACT`).

    dsv4spec golden check-vectors EXPORT OUT [--rules PREFIX,...] [--ops OP,...]

replays every rule's checks on those outputs (the same checks, comparison policies and failure
messages as `dsv4spec verify`, with the bits of the first differences decoded) and prints one row
per rule: PASS, FAIL (the check and clause it breaks, "matches KNOB=VALUE" when the outputs are
those of a known variant), VARIANT, NOT_IMPLEMENTED (no output for any record of the operations a
check needs), or ERROR (a missing or unreadable output file or record: named with its line; the
other records and rules are still judged).  Exit status 1 on any FAIL or ERROR.

`{EXPECTED}/` is one valid answer per record: codes, bytes and exact values must match it bit for
bit, but where a rule allows several answers (top-k among ties, a tolerance on a score) only
check-vectors judges.  A record's inputs are those the reference target received; check-vectors
needs the same dsv4spec and Hypothesis versions as the export (`{INFO}`), since it replays the same
deterministic examples.
"""

_CASES = f"""
## The golden cases (cases/)

Whole-tensor cases of the golden suite (`dsv4spec golden check` runs them on Python targets),
each in two forms holding the same inputs:

- `cases/NAME.txt`: one record `@ case=NAME op=... rule=... call=... inputs=x outputs=packed,scales
  positional=... lines=N`, its value lines named by input (then the extra arguments, as `int`/`str`
  lines).  Pass the inputs positionally in the order of `inputs=`, then the arguments named in
  `positional=` in that order, then the others by keyword; `call=mapping`: pass the inputs as one
  mapping from name to tensor and read the outputs from the mapping it returns.
- `cases/NAME.safetensors`: the safetensors container ({SAFETENSORS_SPEC}), of which these files use
  this subset: an 8-byte little-endian unsigned header length N; N bytes of a UTF-8 JSON object
  mapping each tensor name `in.INPUT` to `{{"dtype": "F32"|"U8"|"I64"|"I32"|"BOOL", "shape": [..],
  "data_offsets": [BEGIN, END]}}` (byte offsets into the data after the header), plus
  `"__metadata__"`: a flat object of strings `op`, `rule`, `call`, `inputs`, `outputs`,
  `positional` (comma-separated names) and `args` (space-separated `key=value`); then the data,
  little-endian, C order.

A port writes `OUT/NAME.txt` (one `@ case=NAME` header, one value line per output, named as in
`outputs=`) or `OUT/NAME.safetensors` (tensors `out.OUTPUT`), then

    dsv4spec golden check-outputs OUT [--rules PREFIX,...] [--ops OP,...]

compares bit for bit (rows sorted where their order is free), by case: PASS, FAIL (the first
difference decoded), MISSING, ERROR (a file that cannot be read; the others are still judged), or
n/i: no file for a case whose operation the port does not declare (`ops=` in `OUT/port.txt` or
`--ops`, as for check-vectors; a `kv_qdq` case is also `kv_qdq_FMT`'s).  Exit 1 on any FAIL,
MISSING or ERROR.
"""


def layout_text(recorded: dict, sections: list[str], level: int, layers: bool) -> str:
    from ..spec import RULES
    ops = op_contract()
    used = sorted({r.op for rv in recorded.values() for r in rv.records})
    with_vectors = [rv for rv in recorded.values() if rv.records]
    without = [rv for rv in recorded.values() if not rv.records]
    lines = ["# A dsv4spec export for a port in another language", "",
             "Everything here is text or a documented binary container; nothing needs Python, JSON "
             "inside JSON, or pickle.  Files are world-readable.", "",
             "| path | what |", "|---|---|",
             f"| `{INFO}` | `key=value` lines: the format version, the level, the dsv4spec and Hypothesis versions "
             "that made it, the input dtype of each operation |",
             f"| `{INPUTS}/RULE.txt` | per rule, the inputs of every call its checks make (records, below) |",
             f"| `{EXPECTED}/RULE.txt` | the reference's outputs for the same records, in the form a port writes |",
             "| `cases/NAME.txt`, `cases/NAME.safetensors` | the golden cases' inputs (below) |",
             "| `LAYOUT.md` | this file |", "",
             "## Levels (as TestFloat's)", "",
             *[f"- level {k}{' (this export)' if k == level else ''}: {v}" for k, v in LEVELS.items()], "",
             "Every record says its level; a level-N export holds levels 1..N.  Level 1 alone puts every rounding and "
             "selection decision on its boundary, one ulp below and one above; the generated sample adds what a "
             "boundary list misses.  `dsv4spec golden export DIR --level N` writes another.", ""]
    lines += _GRAMMAR.splitlines() + _OUTPUTS.splitlines()
    lines += ["", "## Operations in these vectors", "", "| op | contract |", "|---|---|"]
    lines += [f"| `{op}` | {ops.get(op, '').replace('|', '/')} |" for op in used]
    lines += ["", "## Rules", "", "What each rule requires (the rule book is SPEC.md in the dsv4spec repository, with the "
              "official code lines it cites; `dsv4spec rules` lists it):", "",
              "| rule | statement | records (level 1 / later) | operations | checks not in the vectors |",
              "|---|---|---|---|---|"]
    for rv in with_vectors:
        first = sum(1 for r in rv.records if r.head["level"] == 1)
        omitted = "; ".join(f"{k}: {v}" for k, v in rv.omitted.items()).replace("|", "/") or "none"
        statement = " ".join(RULES[rv.rule_id].statement.split()).replace("|", "/")
        lines.append(f"| `{rv.rule_id}` | {statement} | {first} / {len(rv.records) - first} | "
                     f"{', '.join(sorted({r.op for r in rv.records}))} | {omitted} |")
    if without:
        lines += ["", "Rules without vectors (judge them with `dsv4spec verify` through a Python or exec target):", ""]
        lines += [f"- `{rv.rule_id}` ({RULES[rv.rule_id].title}): "
                  + ("; ".join(f"{k}: {v}" for k, v in rv.omitted.items()) or "it has no check of its own")
                  for rv in without]
    lines += _CASES.splitlines()
    if not layers:
        lines += ["", "The PATH.LAYER cases (index_layer on full-size weights, about 100 MB) are written only with "
                  "`dsv4spec golden export DIR --layers`.", ""]
    lines += ["", *sections]
    return "\n".join(lines).rstrip() + "\n"


def op_contract() -> dict[str, str]:
    """{operation: its call, as the family module of properties/ writes it} for every operation."""
    contract = {}
    for family in FAMILY_MODULES:
        contract.update(getattr(importlib.import_module(f"dsv4spec.properties.{family}"), "OPS", {}))
    return contract
