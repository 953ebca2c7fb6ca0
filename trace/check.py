"""check-trace's engine: open a trace (one directory, or one per tensor-parallel rank), judge it one
layer-step at a time, and turn the verdicts into verify's rows (one per rule: n/i where no recorded
stage is judged by it)."""
from __future__ import annotations

import os
import time

from ..runner.suite import ERROR, FAIL, NOT_IMPLEMENTED, PASS, Row
from .format import MANIFEST, Step, Trace, TraceError
from .judge import Judged, TraceTarget, case_of, judge_layer_step
from .steps import History, judge_all_reduce, judge_index_all_reduce, judge_same_topk

SHOWN = 6          # failing stages a row's detail lists (the earliest departing first)


def open_trace(path: str) -> list[Trace]:
    """The ranks of a trace: `path` itself (world size 1), or its subdirectories holding one rank each."""
    if not os.path.isdir(path):
        raise TraceError(f"{path}: no such directory")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        traces = [Trace(path)]
    else:
        subdirs = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, MANIFEST)))
        if not subdirs:
            raise TraceError(f"{path}: no {MANIFEST} here nor in a subdirectory (not a trace, or its writing never finished)")
        traces = sorted((Trace(os.path.join(path, d)) for d in subdirs), key=lambda t: t.rank)
    first = traces[0]
    W = first.world_size
    ranks = [t.rank for t in traces]
    if ranks != list(range(W)) or any(t.world_size != W for t in traces):
        raise TraceError(f"{path}: ranks {ranks} of world sizes {sorted({t.world_size for t in traces})}; a trace of "
                         f"world size {W} holds ranks 0…{W - 1}, one directory each")
    for t in traces[1:]:
        for what in ("model", "config", "variants"):
            if getattr(t, what) != getattr(first, what):
                raise TraceError(f"{t.path}: {what} differs from rank 0's ({first.path}): not one run")
        if t.layer_steps() != first.layer_steps():
            raise TraceError(f"{t.path}: records other layer-steps than rank 0's: not one run")
    return traces


def parse_numbers(text: str, what: str) -> set[int]:
    """'2,5-7' -> {2, 5, 6, 7}; ValueError naming `what`."""
    out = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{what}: expected numbers and ranges like 2,5-7, got {part!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def step_filter(text: str | None):
    """--steps: prefill, decode, start positions and ranges (0 is the prefill): which steps to judge."""
    if not text:
        return lambda step: True
    kinds = {p.strip() for p in text.split(",")} & {"prefill", "decode"}
    positions = parse_numbers(",".join(p for p in text.split(",") if p.strip() not in kinds), "--steps")
    return lambda step: step.kind in kinds or step.start_pos in positions


def judge_trace(traces: list[Trace], wanted, layers: set | None = None, steps=lambda s: True,
                progress=lambda done, total, verdicts: None) -> Judged:
    """Every selected layer-step of every rank, in forward order; its verdicts in the order computed."""
    first = traces[0]
    target = TraceTarget(first.variants)
    histories = [History(first.model, target) for _ in traces]      # every rank keeps its own decode state
    todo = [(layer, step) for layer, step in first.layer_steps()
            if (layers is None or layer in layers) and steps(step)]
    judged = Judged()
    for done, (layer, step) in enumerate(todo, 1):
        ranks = [t.load(layer, step) for t in traces]
        for rank, tensors in enumerate(ranks):
            verdicts = judge_layer_step(target, first.model, layer, step, tensors, wanted, first.world_size)
            verdicts += histories[rank].judge(layer, step, tensors, wanted)
            if first.world_size > 1:
                for v in verdicts:
                    v.rank = rank
            judged.verdicts += verdicts
        if first.world_size > 1:
            cases = [case_of(first.model, layer, step, tensors) for tensors in ranks]
            judged.verdicts += judge_index_all_reduce(target, cases, ranks, wanted)
            judged.verdicts += judge_same_topk(layer, step, ranks, wanted)
            judged.verdicts += judge_all_reduce(layer, step, ranks, wanted)
        judged.layer_steps = done
        progress(done, len(todo), judged.verdicts)
    return judged


def rows_of(judged: Judged, rule_ids: list[str], target: str = "trace", seconds: float = 0.0) -> list[Row]:
    """verify's rows: per rule, ERROR or FAIL if a stage it judges departs (the earliest first), PASS if
    every judged stage passes, n/i if no recorded stage is judged by it."""
    by_rule: dict[str, list] = {}
    for v in judged.verdicts:
        by_rule.setdefault(v.rule, []).append(v)
    rows = []
    for rule in rule_ids:
        vs = by_rule.get(rule, [])
        bad = [v for v in vs if v.status != PASS]
        status = ERROR if any(v.status == ERROR for v in bad) else FAIL if bad else PASS if vs else NOT_IMPLEMENTED
        if bad:
            detail = "\n".join(f"{v.status} {v.place()}: {v.detail}" for v in bad[:SHOWN])
            detail += f"\n… and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
            detail = f"{len(bad)} of {len(vs)} recorded stages depart (the earliest first)\n" + detail
        elif vs:
            stages = sorted({v.stage for v in vs})
            detail = f"{len(vs)} recorded stages pass ({', '.join(stages)}) on {len({(v.layer, v.step) for v in vs})} layer-steps"
        else:
            detail = "no recorded stage of this trace is judged by this rule"
        rows.append(Row(rule, target, status, detail, seconds=seconds * len(vs) / max(1, len(judged.verdicts))))
    return rows


def stage_lines(judged: Judged) -> list[str]:
    """Every stage's verdict, departing ones first in forward order, then the passing ones counted by stage."""
    bad = [f"{v.status:5} {v.rule:<20} {v.place()}" for v in judged.verdicts if v.status != PASS]
    passing: dict = {}
    for v in judged.verdicts:
        if v.status == PASS:
            passing.setdefault((v.stage, v.rule), []).append(v)
    good = [f"PASS  {rule:<20} stage {stage}: {len(vs)} layer-steps" for (stage, rule), vs in passing.items()]
    return bad + good


class Clock:
    def __init__(self):
        self.started = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.started


__all__ = ["open_trace", "judge_trace", "rows_of", "stage_lines", "step_filter", "parse_numbers", "Step"]
