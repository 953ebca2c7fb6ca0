"""One cause, one verdict: when several rules of a target fail on one shared operation, name the
rule whose clause comes first and mark the others "same cause as …".

Most checks judge one clause on the target's own outputs (a payload against its own scales), so
their failures are independent.  A few operations are judged whole by several rules, each from
another angle (the scores of `index_scores` by the formula, the BF16 rounding, the mask, the
chunking …), and one wrong step there fails all of them.  For those operations CLAUSE_ORDER lists
the rules in the order the computation meets their clauses (formula before rounding before the
mask; the compressor's groups before its gate before its norm); among the rules that fail on such
an operation, every check of which calls it, the first in that order is the cause.  The statuses
and the exit status stay as they are: only the details say which failure to read first.
"""
from __future__ import annotations

from dataclasses import replace

from .suite import ERROR, FAIL, TIMEOUT, checks_for

CLAUSE_ORDER = {
    "index_scores": ("IDX.SCORE.FORMULA", "IDX.SCORE.ROUNDING", "IDX.SCORE.V32_FP32", "IDX.MASK",
                     "IDX.SCORE.TP", "IDX.CHUNK"),
    "compress": ("CMP.GROUPS", "CMP.CAUSAL", "CMP.APE", "CMP.GATE", "CMP.OVERLAP", "CMP.RATIO1", "CMP.NORM",
                 "CMP.ROPE", "CMP.STREAM"),
    "rope_rotate": ("ROPE.SLICE", "ROPE.PAIRS", "ROPE.ROUNDING"),
    "rope_freqs": ("ROPE.THETA", "ROPE.YARN", "ROPE.SHARED"),
    "index_layer": ("PATH.Q.PROJ", "PATH.K.PROJ", "PATH.W.PROJ", "PATH.K.NORM", "ROPE.POSITIONS",
                    "PATH.HADAMARD", "PATH.ORDER", "PATH.LAYER"),
    "candidate_blocks": ("POOL.BLOCK_SCORE", "POOL.DROP_INF", "POOL.TOPK_BLOCKS", "POOL.PIN_EMPTY",
                         "POOL.PIN_NEWEST", "POOL.PIN_COUNTS", "POOL.MASK", "POOL.SIZE", "POOL.ALL_REACHABLE"),
}
BROKEN = (FAIL, ERROR, TIMEOUT)


def _failing_ops(row) -> set[str] | None:
    """The operations every failing check of the row calls (None: no failing check is known)."""
    by_name = {c.name: c for c in checks_for(row.rule_id)}
    failing = [by_name[n] for n, status in (row.checks or {}).items() if status in BROKEN and n in by_name]
    if not failing:
        return None
    return set.intersection(*(set(c.ops) for c in failing))


def causes(rows) -> dict[tuple[str, str], tuple[str, str]]:
    """{(rule, target): (the rule named as the cause, the shared operation)} for every failing row
    that another failing row of the same target explains."""
    out = {}
    by_target: dict[str, list] = {}
    for row in rows:
        if row.status in BROKEN:
            by_target.setdefault(row.target, []).append(row)
    for target, failing in by_target.items():
        ops = {row.rule_id: _failing_ops(row) for row in failing}
        for op, order in CLAUSE_ORDER.items():
            on_op = [rule for rule in order if ops.get(rule) and op in ops[rule]]
            for rule in on_op[1:]:
                out.setdefault((rule, target), (on_op[0], op))
    return out


def annotate(rows) -> list:
    """The rows, each failure explained by another marked "same cause as RULE (op): …" at the head
    of its detail; statuses unchanged."""
    found = causes(rows)
    marked = []
    for row in rows:
        cause = found.get((row.rule_id, row.target))
        if cause:
            row = replace(row, detail=f"same cause as {cause[0]} ({cause[1]}): {row.detail}")
        marked.append(row)
    return marked


def is_marked(row) -> bool:
    return row.detail.startswith("same cause as ")
