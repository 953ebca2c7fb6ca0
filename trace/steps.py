"""The judgements across steps, layers and ranks of a trace, from what earlier layer-steps left:
the window ring (PATH.WINDOW.RING), the compressors' state (CMP.STATE), the compressed cache a decode step reads (PATH.QDQ), the index-K
cache a V4.1 source scores where it publishes nothing (PATH.K.PUBLISHED), the pool and index K a
re-index layer takes from layer 20 and the lists a reuse layer takes from its source (POOL.REINDEX,
LAYER.V41), each kept per tensor-parallel rank; and across the ranks, the indexer's all-reduced scores
and the keys they score (IDX.SCORE.TP, PATH.K.PUBLISHED), their top-k (IDX.TOPK.TP) and wo_b's
all-reduce (ATTN.TP.REDUCE).  Each keeps rows, not layers: the newest 128 window rows of a layer, the
cache rows seen, one publication."""
from __future__ import annotations

import functools

import numpy as np

from ..properties import path as path_checks
from ..properties.attn import assert_row_parallel
from ..properties.compressor import (COMPRESSOR_NAMES, INDEX_COMPRESSOR, KV_COMPRESSOR, assert_pooled,
                                     recorded_params)
from ..properties.compare import assert_bytes_equal, assert_equal
from ..spec import compressor as spec_compressor
from ..spec import path as spec_path
from ..spec.models import profile
from ..spec.pool import layer_role
from .format import Step
from .judge import ERROR, FAIL, MISSING, PASS, Verdict, locate, record_this, stage_table


class History:
    """What the layer-steps judged so far leave for the next ones."""

    def __init__(self, model: str, target=None):
        self.m, self.target = profile(model), target
        self.x: dict[int, dict] = {}                   # compressing layer -> {position: x row}, its last 2·ratio
        self.prefill: dict[int, int] = {}              # layer -> its prefill's length
        self.window: dict[int, dict] = {}              # layer -> {position: window KV row}
        self.cache: dict[int, dict] = {}               # KV-source layer -> {entry: cache row}
        self.published: tuple | None = None            # (end position, k_packed, k_scales) of the last publication
        self.this_step: dict = {}                      # (layer, stage) -> tensor, of the step being judged
        self.step: Step | None = None

    def judge(self, layer: int, step: Step, tensors: dict, wanted) -> list[Verdict]:
        if step != self.step:
            self.step, self.this_step = step, {}
        verdicts = []
        for stage, rule, judge in self._judges(layer, step, tensors):
            if wanted(rule):
                v = Verdict(layer, step, stage, rule, PASS)
                try:
                    judge(layer, step, tensors)
                except AssertionError as e:
                    v.status, v.detail = FAIL, locate(str(e), v)
                except KeyError as e:
                    v.status, v.detail = ERROR, record_this(str(e).strip("'\""), stage)
                verdicts.append(v)
        self._keep(layer, step, tensors)
        return verdicts

    def _judges(self, layer: int, step: Step, tensors: dict):
        role = layer_role(self.m, layer)
        if step.start_pos and "window_cache" in tensors and self._ring_known(layer, step):
            yield "window_cache", "PATH.WINDOW.RING", self._ring
        for prefix in (INDEX_COMPRESSOR, KV_COMPRESSOR):           # in the order the forward runs them
            if step.start_pos and self.m.ratio(layer) > 1 and prefix + "pooled" in tensors \
                    and self._window_known(layer, step):
                yield prefix + "pooled", "CMP.STATE", functools.partial(self._compressor_state, prefix=prefix)
        source = role.kv_source if role.kv_source >= 0 else layer
        if step.start_pos and "kv_cache" in tensors and self.cache.get(source):
            yield "kv_cache", "PATH.QDQ", self._cache
        if "published_k_packed" in tensors and self.published and self.published[0] == step.start_pos:
            yield "published_k_packed", "PATH.K.PUBLISHED", self._published
        if role.kind == "reindex" and (role.pool_source, "candidates") in self.this_step and "candidates" in tensors:
            yield "candidates", "POOL.REINDEX", self._pool
        if role.kind == "reindex" and (role.kv_source, "k_packed") in self.this_step and "k_packed" in tensors:
            yield "k_packed", "LAYER.V41", self._index_k
        if role.kind == "reuse" and (role.topk_source, "topk") in self.this_step and "source_topk" in tensors:
            yield "source_topk", "LAYER.V41", self._reused

    def _ring_known(self, layer: int, step: Step) -> bool:
        return layer in self.prefill and bool(self.window.get(layer))

    def _ring(self, layer: int, step: Step, tensors: dict):
        """Slot q holds the window KV row of the newest position ≡ q mod 128 before this step (the
        rows this trace recorded; the others are not judged)."""
        prefill = self.prefill[layer]
        slots = spec_path.window_ring(prefill, step.start_pos - prefill, self.m.window)
        rows = self.window[layer]
        known = [q for q, p in enumerate(slots) if p in rows]
        got = tensors["window_cache"][known]
        want = np.stack([rows[slots[q]] for q in known])
        assert_equal(got, want, what=f"PATH.WINDOW.RING: the ring before decode at {step.start_pos} holds, in slots "
                                     f"{known[0]}…{known[-1]}, the window KV of positions "
                                     f"{[int(slots[q]) for q in known][:4]}… as their steps wrote it",
                     context=lambda i: f"ring slot {known[i[0]]}")

    def _window(self, layer: int, step: Step) -> range:
        """The positions a decode step's completed group pools: its group (and, overlapping, the one before)."""
        ratio = self.m.ratio(layer)
        first = ((step.start_pos + 1) // ratio - 1 - spec_compressor.overlaps(self.m.name, ratio)) * ratio
        return range(max(0, first), step.start_pos)

    def _window_known(self, layer: int, step: Step) -> bool:
        return all(p in self.x.get(layer, {}) for p in self._window(layer, step))

    def _compressor_state(self, layer: int, step: Step, tensors: dict, prefix: str):
        """The group a decode step completes is pooled from the fp32 state its tokens left: as a prefill
        of those tokens pools it (CMP.STATE), judged on the tokens' recorded x."""
        ratio, rows = self.m.ratio(layer), self.x[layer]
        x = np.concatenate([np.stack([rows[p] for p in self._window(layer, step)]), tensors["x"]])
        entry = (step.start_pos + 1) // ratio - 1
        assert_pooled(self.target, x, recorded_params(tensors, self.m.name, ratio, prefix), self.m.name, ratio,
                      tensors[prefix + "pooled"], f"CMP.STATE: {COMPRESSOR_NAMES[prefix]}'s entry {entry}, completed "
                                                  f"at decode {step.start_pos}, pooled from the state of positions "
                                                  f"{self._window(layer, step)[0]}…{step.start_pos} as one prefill "
                                                  f"of them pools it")

    def _cache(self, layer: int, step: Step, tensors: dict):
        role = layer_role(self.m, layer)
        seen = self.cache[role.kv_source if role.kv_source >= 0 else layer]
        got = tensors["kv_cache"]
        known = [j for j in sorted(seen) if j < got.shape[0]]
        if known:
            assert_equal(got[known], np.stack([seen[j] for j in known]),
                         what=f"PATH.QDQ: the compressed entries a decode step reads are those written when each "
                              f"completed (entries {known[0]}…{known[-1]})")

    def _published(self, layer: int, step: Step, tensors: dict):
        _, packed, scales = self.published
        P = tensors["published_k_packed"].shape[0]
        what = (f"PATH.K.PUBLISHED: the index-K cache scored at decode {step.start_pos} is the one layer "
                f"{spec_path.last_publisher(self.m)} published at the step before")
        assert_bytes_equal(tensors["published_k_packed"], packed[:P], what=what + " (payload)")
        assert_bytes_equal(tensors["published_k_scales"], scales[:P], what=what + " (scales)")

    def _pool(self, layer: int, step: Step, tensors: dict):
        source = layer_role(self.m, layer).pool_source
        assert_equal(np.asarray(tensors["candidates"], bool), np.asarray(self.this_step[source, "candidates"], bool),
                     what=f"POOL.REINDEX: the pool a re-index layer masks with is layer {source}'s of the same step")

    def _index_k(self, layer: int, step: Step, tensors: dict):
        source = layer_role(self.m, layer).kv_source
        what = f"LAYER.V41: a re-index layer scores layer {source}'s index K of the same step"
        assert_bytes_equal(tensors["k_packed"], self.this_step[source, "k_packed"], what=what + " (payload)")
        assert_bytes_equal(tensors["k_scales"], self.this_step[source, "k_scales"], what=what + " (scales)")

    def _reused(self, layer: int, step: Step, tensors: dict):
        source = layer_role(self.m, layer).topk_source
        assert_equal(np.asarray(tensors["source_topk"], np.int64), np.asarray(self.this_step[source, "topk"], np.int64),
                     what=f"LAYER.V41: a reuse layer attends to layer {source}'s top-k of the same step")

    def _keep(self, layer: int, step: Step, tensors: dict):
        if self.m.ratio(layer) > 1 and "x" in tensors:
            rows = self.x[layer] = {} if step.start_pos == 0 else self.x.setdefault(layer, {})
            for t, row in enumerate(tensors["x"]):
                rows[step.start_pos + t] = row
            for p in sorted(rows)[:-2 * self.m.ratio(layer)]:
                del rows[p]
        for stage in ("candidates", "k_packed", "k_scales", "topk"):
            if stage in tensors:
                self.this_step[layer, stage] = tensors[stage]
        if "kv_window" in tensors:
            if step.start_pos == 0:
                self.prefill[layer], self.window[layer] = step.seqlen, {}
            rows = self.window.setdefault(layer, {})
            for t, row in enumerate(tensors["kv_window"]):
                rows[step.start_pos + t] = row
            for p in sorted(rows)[:-self.m.window]:
                del rows[p]
        role = layer_role(self.m, layer)
        source = role.kv_source if role.kv_source >= 0 else layer
        rows = tensors.get("cmp") if step.start_pos == 0 else tensors.get("kv_cache")
        if rows is not None and source >= 0:
            seen = self.cache.setdefault(source, {})
            for j in range(len(seen), rows.shape[0]):
                seen[j] = rows[j]
        if self.m.kv_source_layers and layer == spec_path.last_publisher(self.m) and "k_packed" in tensors \
                and role.kind != "reindex":
            self.published = (step.start_pos + step.seqlen, tensors["k_packed"], tensors["k_scales"])


# the indexer's judgements of every rank's scores (W > 1): the all-reduce, and the keys it scores
# (scored_k first, as the stages of one rank: properties/path.py STAGES)
SHARDED_SCORES = (("scored_k", "PATH.K.PUBLISHED", path_checks.judge_sharded_scored_keys),
                  ("scores", "IDX.SCORE.TP", path_checks.judge_sharded_scores))


def judge_index_all_reduce(target, cases: list, ranks: list[dict], wanted) -> list[Verdict]:
    """IDX.SCORE.TP and PATH.K.PUBLISHED on one layer-step of every rank (cases: each rank's): each rank's
    scores the all-reduce of the ranks' head shards over its own keys (an indexer layer whose ranks all
    record their scores)."""
    if not all("scores" in r for r in ranks):
        return []
    verdicts, layer_stages = [], {name for name, *_ in stage_table(cases[0])}
    for stage, rule, judge in SHARDED_SCORES:
        for rank, case in enumerate(cases):
            if not wanted(rule) or stage not in layer_stages:
                continue
            v = Verdict(case.layer, Step(case.start_pos, case.seqlen), stage, rule, PASS, rank=rank)
            verdicts.append(failing(v, judge, target, case, ranks, rank))
    return verdicts


def judge_all_reduce(layer: int, step: Step, ranks: list[dict], wanted) -> list[Verdict]:
    """ATTN.TP.REDUCE on one layer-step of every rank: each rank's out the all-reduce of the partials."""
    if not wanted("ATTN.TP.REDUCE") or not all("out" in r for r in ranks):
        return []
    verdicts = []
    partials = [r.get("out_partial") for r in ranks]
    for rank, tensors in enumerate(ranks):
        v = Verdict(layer, step, "out", "ATTN.TP.REDUCE", PASS, rank=rank)
        if any(p is None for p in partials):
            v.status = ERROR
            v.detail = (f"stage out is judged from every rank's out_partial, which rank "
                        f"{partials.index(None)}'s trace does not hold: record 'out_partial'")
        else:
            failing(v, assert_row_parallel, np.stack(partials), tensors["out"],
                    f"ATTN.TP.REDUCE: out = bf16(Σ_r fp32(out_partial_r)) over {len(ranks)} ranks")
        verdicts.append(v)
    return verdicts


def judge_same_topk(layer: int, step: Step, ranks: list[dict], wanted) -> list[Verdict]:
    """IDX.TOPK.TP on one layer-step of every rank: each rank's top-k lists are rank 0's, as sets per
    token (each rank's order is its own IDX.TOPK.SELECTION's)."""
    if not wanted("IDX.TOPK.TP") or not all("topk" in r for r in ranks):
        return []
    first = np.sort(np.asarray(ranks[0]["topk"], np.int64), axis=-1)
    verdicts = []
    for rank in range(1, len(ranks)):
        v = Verdict(layer, step, "topk", "IDX.TOPK.TP", PASS, rank=rank)
        failing(v, assert_equal, np.sort(np.asarray(ranks[rank]["topk"], np.int64), axis=-1), first,
                what=f"IDX.TOPK.TP: rank {rank}'s top-k lists are rank 0's (sorted, per token)")
        verdicts.append(v)
    return verdicts


def failing(v: Verdict, judge, *args, **kwargs) -> Verdict:
    """v FAILs with the judge's message, placed, if the judge raises an AssertionError (an ERROR
    naming the tensor to record, if the judge found one missing)."""
    try:
        judge(*args, **kwargs)
    except AssertionError as e:
        missing = MISSING.search(str(e))
        v.status, v.detail = (ERROR, record_this(missing.group(1), v.stage)) if missing else (FAIL, locate(str(e), v))
    return v
