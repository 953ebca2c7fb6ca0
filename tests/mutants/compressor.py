"""Compressor mutants: the impl with one realistic mistake each (rule caught on, in MUTANTS)."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

import dsv4spec.impl.compressor as ic
from dsv4spec.spec import compressor as spec
from dsv4spec.spec.models import profile

from . import mutant
from .rope import _rotate


def _compress(x, params, *, model, ratio, eps=None, score_fill=float("-inf"), rope_offset=0,
              look_ahead=False, normalize=True, mean_pool=False, drop_ape=False, swap_halves=False,
              emit_partial=False, skip_norm=False, no_previous=False, ape_shift=0, ape_at_128=True,
              softmax_dim=2, softmax_bf16=False, rope_pairing="adjacent", rope_first=False, shift_tokens=False,
              rope_shift=0, norm_weight=True, ratio1_fp32=False):
    """impl.compress with switches, each one mistake."""
    seqlen = x.shape[1]
    if shift_tokens:    # group boundaries one token early: entry j pools tokens j·m − 1 .. j·m + m − 2
        x = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
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
        pooled = kv[:, :groups] if ratio1_fp32 else kv[:, :groups].bfloat16().float()
    else:
        score = x @ wgate.T
        if mean_pool:
            score = torch.zeros_like(score)
        elif spec.has_ape(model) and not drop_ape and (ape_at_128 or ratio != 128):
            score = score + ape[(torch.arange(seqlen) + ape_shift) % ratio]
        kv = kv[:, :groups * ratio].unflatten(1, (groups, ratio))
        score = score[:, :groups * ratio].unflatten(1, (groups, ratio))
        if spec.overlaps(model, ratio):
            if look_ahead:   # the other half of the window from the NEXT group
                kv, score = kv.flip(1), score.flip(1)
            kv, score = ic._overlap_windows(kv, 0.0), ic._overlap_windows(score, score_fill)
            if look_ahead:
                kv, score = kv.flip(1), score.flip(1)
            if no_previous:   # a 4-slot window: the previous group's half left out
                score[:, :, :ratio] = float("-inf")
        weights = (score.bfloat16().softmax(dim=softmax_dim).float() if softmax_bf16
                   else score.softmax(dim=softmax_dim))
        pooled = (kv * weights).sum(dim=2)
    if not skip_norm and (normalize or ratio > 1):
        eps = profile(model).norm_eps if eps is None else eps
        pooled = ic._rms_norm(pooled, params["norm"] if norm_weight else torch.ones_like(params["norm"]), eps)
    positions = torch.arange(groups) * ratio + rope_offset * (ratio - 1) + rope_shift
    if rope_pairing == "half" or rope_first:
        return _rope_another_way(pooled, positions, params["rope_freqs"], half=rope_pairing == "half", first=rope_first)
    return ic._rope(pooled, positions, params["rope_freqs"])


def _rope_another_way(y, positions, freqs, *, half, first):
    """The entry's RoPE on the half-split (NeoX) pairs, or on the FIRST rope_dim channels."""
    if freqs.shape[0] == 0:
        return y
    return _rotate(y.transpose(0, 1), positions, freqs, half_split=half, first=first, rounded=False).transpose(0, 1)


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


def _feed_chunks_without_the_state(state, x):
    """A chunk of several tokens after the first fed from a fresh state at the same position (its
    incomplete group and previous window forgotten); one token at a time, as decode, is right."""
    if state.position and x.shape[1] > 1:
        fresh = ic.compressor_state(state.params, model=state.model, ratio=state.ratio, batch=x.shape[0])
        state = replace(fresh, position=state.position)
    return ic.compressor_feed(state, x)


MUTANTS.update({
    "cmp-groups-one-token-early": ("CMP.GROUPS", dict(compress=partial(_compress, shift_tokens=True))),
    "cmp-window-without-previous-group": ("CMP.OVERLAP", dict(compress=partial(_compress, no_previous=True))),
    "cmp-ape-row-off-by-one": ("CMP.APE", dict(compress=partial(_compress, ape_shift=1))),
    "cmp-ape-dropped-at-ratio-128": ("CMP.APE", dict(compress=partial(_compress, ape_at_128=False))),
    "cmp-softmax-over-channels": ("CMP.GATE", dict(compress=partial(_compress, softmax_dim=3))),
    "cmp-gate-softmax-in-bf16": ("CMP.GATE", dict(compress=partial(_compress, softmax_bf16=True))),
    "cmp-ratio1-rope-at-t-plus-1": ("CMP.RATIO1", dict(compress=partial(_compress, rope_shift=1))),
    "cmp-rope-half-split": ("CMP.ROPE", dict(compress=partial(_compress, rope_pairing="half"))),
    "cmp-rope-first-channels": ("CMP.ROPE", dict(compress=partial(_compress, rope_first=True))),
    "cmp-norm-weight-ignored": ("CMP.NORM", dict(compress=partial(_compress, norm_weight=False))),
    "cmp-ratio1-projection-in-fp32": ("CMP.RATIO1", dict(compress=partial(_compress, ratio1_fp32=True))),
    "cmp-chunks-fed-without-the-state": ("CMP.STREAM", dict(compressor_feed=_feed_chunks_without_the_state)),
})
# Further rules a mutant breaks (one clause each; the catalogue lists each (mutant, rule) pair).
ALSO = {"cmp-feed-forgets-previous-window": ("CMP.STATE",)}


def build(name: str):
    rule_id, overrides = MUTANTS[name]
    return rule_id, mutant(name, **overrides)


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, *build(name)) for name in MUTANTS] + [
        (name, rule_id, build(name)[1]) for name, rules in ALSO.items() for rule_id in rules]
