"""One cause, one verdict: when several rules of a target fail on one shared operation, name the
rule whose clause the evidence shows broken and mark the others "same cause as …".

Most checks judge one clause on the target's own outputs (a payload against its own scales), so
their failures are independent.  A few operations are judged whole by several rules, each from
another angle (the scores of `index_scores` by the formula, the BF16 rounding, the mask, the
chunking …), and one wrong step there fails all of them.  For those operations CLAUSE_ORDER lists
the rules in the order the computation meets their clauses (formula before rounding before the
mask; the compressor's groups before its gate before its norm).  Some clauses also have a probe
(PROBES): one small call of the operation on which that clause alone decides the result.  Among the
rules that fail on such an operation, every check of which calls it, the cause is the first in
that order whose probe fails on the target; else the first without a probe; a rule whose probe
passes (its clause shown intact in isolation) leads only when nothing else can.  The probes run
only where the targets are given (verify's own report; a merge of shards keeps the order alone).
A layer rule (PATH.LAYER on index_layer, ATTN.LAYER on attention_layer) names the first stage that
breaks its own rule; when that rule fails too, it is the cause (followed to its own cause).  The statuses and the
exit status stay as they are: only the details say which failure to read first.
"""
from __future__ import annotations

import re
from dataclasses import replace

from .suite import ERROR, FAIL, TIMEOUT, checks_for

CLAUSE_ORDER = {
    "index_scores": ("IDX.SCORE.FORMULA", "IDX.SCORE.ROUNDING", "IDX.SCORE.V32_FP32", "IDX.MASK",
                     "IDX.SCORE.TP", "IDX.CHUNK"),
    "compress": ("CMP.GROUPS", "CMP.CAUSAL", "CMP.APE", "CMP.GATE", "CMP.OVERLAP", "CMP.RATIO1", "CMP.NORM",
                 "CMP.ROPE", "CMP.STREAM"),
    "rope_rotate": ("ROPE.SLICE", "ROPE.PAIRS", "ROPE.ROUNDING"),
    "rope_freqs": ("ROPE.THETA", "ROPE.YARN", "ROPE.SHARED"),
    # scores first (every ATTN check reads them), then the list, the rescale, the probabilities
    # (BF16 before blocking), the sink, the output; the running max's start last: its V4.1 rows
    # (leading −1 entries) also fail on each of those (tests/mutants/attn.py's sparse mutants, each
    # first on its own rule)
    "sparse_attention": ("ATTN.SCORE", "ATTN.GATHER", "ATTN.DUPLICATES", "ATTN.RESCALE", "ATTN.PROB.BF16",
                         "ATTN.PROB.ORDER", "ATTN.SINK", "ATTN.OUTPUT", "ATTN.INIT"),
    "index_layer": ("PATH.Q.PROJ", "PATH.K.PROJ", "PATH.W.PROJ", "IDX.WEIGHT.SCALE", "PATH.K.NORM", "ROPE.POSITIONS",
                    "PATH.HADAMARD", "PATH.ORDER", "PATH.LAYER"),
    "candidate_blocks": ("POOL.BLOCK_SCORE", "POOL.DROP_INF", "POOL.TOPK_BLOCKS", "POOL.PIN_EMPTY",
                         "POOL.PIN_NEWEST", "POOL.PIN_COUNTS", "POOL.MASK", "POOL.SIZE", "POOL.ALL_REACHABLE"),
}
BROKEN = (FAIL, ERROR, TIMEOUT)
# the layer rules and their operation; each failure's detail names "first broken stage 'x' (RULE)"
LAYER_RULES = {"PATH.LAYER": "index_layer", "ATTN.LAYER": "attention_layer"}
FIRST_BROKEN = re.compile(r"first broken stage '(\w+)' \(([A-Z0-9_.]+)\)")


def _failing_ops(row) -> set[str] | None:
    """The operations every failing check of the row calls (None: no failing check is known)."""
    by_name = {c.name: c for c in checks_for(row.rule_id)}
    failing = [by_name[n] for n, status in (row.checks or {}).items() if status in BROKEN and n in by_name]
    if not failing:
        return None
    return set.intersection(*(set(c.ops) for c in failing))


def _gather_probe(target) -> bool:
    """ATTN.GATHER alone: q = 0 makes every score 0 and every probability 1 (the scale, the rounding
    and the max then change nothing), the sink adds nothing beside 4, and kv row r holds 4 at channel r:
    the output is 1 exactly at the channels of the listed rows, 0 elsewhere; −1 adds nothing.  Int64
    and int32 lists alike (the contract takes both)."""
    import torch
    kv = torch.eye(16, 32) * 4
    listed = [3, -1, 7, 11, 12]
    expected = torch.zeros(1, 1, 32)
    expected[0, 0, [r for r in listed if r >= 0]] = 1.0
    args = (torch.zeros(1, 1, 32), kv, torch.tensor([-100.0]))
    return all(torch.equal(target.sparse_attention(*args, torch.tensor([listed], dtype=dtype), 0.125,
                                                   model=_attention_model(target)).float(), expected)
               for dtype in (torch.int64, torch.int32))


def _attention_model(target) -> str:
    """A V4 or V4.1 model the target serves (V3.2's attention is outside the ATTN rules)."""
    return next(m for m in target.models if not m.startswith("v3"))


def _newest_probe(target) -> bool:
    """POOL.PIN_NEWEST alone: rows whose newest block scores below every older block keep it."""
    from ..properties.pool import _pool_check, make_pool
    try:
        _pool_check(target, make_pool("weak_newest", 1, 3, 61, 3), ("newest",), "POOL.PIN_NEWEST probe")
    except AssertionError:
        return False
    return True


# a clause's probe: True when the target keeps that clause on an input where it alone decides
PROBES = {"ATTN.GATHER": _gather_probe, "POOL.PIN_NEWEST": _newest_probe}
PROBE_FAILS, NO_PROBE, PROBE_PASSES = 0, 1, 2


def _probed(rule: str, target) -> int:
    """How the evidence ranks `rule` as a cause on `target` (PROBE_FAILS first)."""
    if target is None or rule not in PROBES:
        return NO_PROBE
    try:
        return PROBE_PASSES if PROBES[rule](target) else PROBE_FAILS
    except Exception:  # noqa: BLE001 -- a probe the target cannot take (its SHAPES, an exception) says nothing
        return NO_PROBE


def _cause_first(on_op: list[str], target) -> list[str]:
    """The failing rules of one operation, the cause first: by their probes, then by CLAUSE_ORDER."""
    if len(on_op) < 2:
        return on_op
    return sorted(on_op, key=lambda rule: _probed(rule, target))      # stable: CLAUSE_ORDER within a rank


def causes(rows, targets=()) -> dict[tuple[str, str], tuple[str, str]]:
    """{(rule, target): (the rule named as the cause, the shared operation)} for every failing row
    that another failing row of the same target explains; `targets` (by name) are probed."""
    by_name = {t.name: t for t in targets}
    out = {}
    by_target: dict[str, list] = {}
    for row in rows:
        if row.status in BROKEN:
            by_target.setdefault(row.target, []).append(row)
    for target, failing in by_target.items():
        for row in failing:
            stage = FIRST_BROKEN.search(row.detail) if row.rule_id in LAYER_RULES else None
            if stage and stage[2] != row.rule_id and any(r.rule_id == stage[2] for r in failing):
                out[row.rule_id, target] = (stage[2], f"{LAYER_RULES[row.rule_id]} stage {stage[1]}")
        ops = {row.rule_id: _failing_ops(row) for row in failing}
        for op, order in CLAUSE_ORDER.items():
            on_op = _cause_first([rule for rule in order if ops.get(rule) and op in ops[rule]], by_name.get(target))
            for rule in on_op[1:]:
                out.setdefault((rule, target), (on_op[0], op))
    return {key: _root(out, *cause, key[1]) for key, cause in out.items()}


def _root(found: dict, rule: str, op: str, target: str) -> tuple[str, str]:
    """The cause of a cause, to the first (a layer rule's stage rule may itself be explained)."""
    for _ in range(len(found)):
        if (rule, target) not in found:
            break
        rule, op = found[rule, target]
    return rule, op


def annotate(rows, targets=()) -> list:
    """The rows, each failure explained by another marked "same cause as RULE (op): …" at the head
    of its detail; statuses unchanged.  `targets`: those of the rows, whose clauses may be probed."""
    found = causes(rows, targets)
    marked = []
    for row in rows:
        cause = found.get((row.rule_id, row.target))
        if cause:
            row = replace(row, detail=f"same cause as {cause[0]} ({cause[1]}): {row.detail}")
        marked.append(row)
    return marked


def is_marked(row) -> bool:
    return row.detail.startswith("same cause as ")
