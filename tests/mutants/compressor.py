"""Compressor mutants: the impl with one realistic mistake each (rule caught on, in MUTANTS)."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

import dsv4spec.impl.compressor as ic
from dsv4spec.spec import compressor as spec
from dsv4spec.spec.models import profile

from . import mutant


def _compress(x, params, *, model, ratio, eps=None, score_fill=float("-inf"), rope_offset=0,
              look_ahead=False, normalize=True, mean_pool=False, drop_ape=False, swap_halves=False,
              emit_partial=False, skip_norm=False):
    """impl.compress with switches, each one mistake."""
    seqlen = x.shape[1]
    if emit_partial and seqlen % ratio:
        pad = ratio - seqlen % ratio
        x = torch.cat([x, x[:, -1:].expand(-1, pad, -1)], dim=1)
        seqlen += pad
    groups = seqlen // ratio
    wkv, wgate = params["wkv"], params.get("wgate")
    ape = params.get("ape")
    if swap_halves and spec.overlaps(model, ratio):
        d = wkv.shape[0] // 2
        wkv, wgate = (torch.cat([w[d:], w[:d]]) for w in (wkv, wgate))
        ape = torch.cat([ape[:, d:], ape[:, :d]], dim=1)
    kv = x @ wkv.T
    if not spec.has_gate(ratio):
        pooled = kv[:, :groups]
    else:
        score = x @ wgate.T
        if mean_pool:
            score = torch.zeros_like(score)
        elif spec.has_ape(model) and not drop_ape:
            score = score + ape[torch.arange(seqlen) % ratio]
        kv = kv[:, :groups * ratio].unflatten(1, (groups, ratio))
        score = score[:, :groups * ratio].unflatten(1, (groups, ratio))
        if spec.overlaps(model, ratio):
            if look_ahead:   # the other half of the window from the NEXT group
                kv, score = kv.flip(1), score.flip(1)
            kv, score = ic._overlap_windows(kv, 0.0), ic._overlap_windows(score, score_fill)
            if look_ahead:
                kv, score = kv.flip(1), score.flip(1)
        pooled = (kv * score.softmax(dim=2)).sum(dim=2)
    if not skip_norm and (normalize or ratio > 1):
        eps = profile(model).norm_eps if eps is None else eps
        pooled = ic._rms_norm(pooled, params["norm"], eps)
    return ic._rope(pooled, torch.arange(groups) * ratio + rope_offset * (ratio - 1), params["rope_freqs"])


def _feed_forgetting_previous(state, x):
    """Each chunk starts with an empty previous window (the overlap state is not carried)."""
    if spec.overlaps(state.model, state.ratio):
        kv, score = state.kv.clone(), state.score.clone()
        kv[:, :state.ratio], score[:, :state.ratio] = 0.0, float("-inf")
        state = replace(state, kv=kv, score=score)
    return ic.compressor_feed(state, x)


def _feed_keeping_a_bf16_state(state, x):
    """The state's slots stored in BF16 (rounded when a call returns)."""
    state, out = ic.compressor_feed(state, x)
    return replace(state, kv=state.kv.bfloat16().float(), score=state.score.bfloat16().float()), out


def _state_scores_from_zero(params, *, model, ratio, batch):
    """The score state starts at 0 instead of −inf."""
    state = ic.compressor_state(params, model=model, ratio=ratio, batch=batch)
    return replace(state, score=torch.zeros_like(state.score))


MUTANTS = {
    "cmp-partial-group-emitted": ("CMP.GROUPS", dict(compress=partial(_compress, emit_partial=True))),
    "cmp-overlap-looks-ahead": ("CMP.CAUSAL", dict(compress=partial(_compress, look_ahead=True))),
    "cmp-overlap-halves-swapped": ("CMP.OVERLAP", dict(compress=partial(_compress, swap_halves=True))),
    "cmp-group0-previous-score-0": ("CMP.OVERLAP", dict(compress=partial(_compress, score_fill=0.0))),
    "cmp-ape-dropped": ("CMP.APE", dict(compress=partial(_compress, drop_ape=True))),
    "cmp-mean-pool": ("CMP.GATE", dict(compress=partial(_compress, mean_pool=True))),
    "cmp-ratio1-unnormalized": ("CMP.RATIO1", dict(compress=partial(_compress, normalize=False))),
    "cmp-eps-1e-6-everywhere": ("CMP.NORM", dict(compress=partial(_compress, eps=1e-6))),
    "cmp-norm-skipped": ("CMP.NORM", dict(compress=partial(_compress, skip_norm=True))),
    "cmp-rope-at-last-token": ("CMP.ROPE", dict(compress=partial(_compress, rope_offset=1))),
    "cmp-feed-forgets-previous-window": ("CMP.STREAM", dict(compressor_feed=_feed_forgetting_previous)),
    "cmp-state-in-bf16": ("CMP.STATE", dict(compressor_feed=_feed_keeping_a_bf16_state)),
    "cmp-state-scores-from-0": ("CMP.STATE", dict(compressor_state=_state_scores_from_zero)),
}


def build(name: str):
    rule_id, overrides = MUTANTS[name]
    return rule_id, mutant(name, **overrides)


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, *build(name)) for name in MUTANTS]
