"""The KV compressor, readable torch (CPU, fp32), after the official V4 and V4.1 `Compressor`.

Operations (the contract is in dsv4spec.properties.compressor):

    compress(x [B, S, dim] f32, params, *, model, ratio) -> entries [B, S // ratio, d] f32
        one prefill from position 0, vectorized like the official prefill path;
    compressor_state(params, *, model, ratio, batch) -> state
        a fresh state (nothing fed yet);
    compressor_feed(state, x [B, T, dim] f32) -> (state, entries [B, E, d] f32)
        T >= 1 more tokens, processed one at a time like the official decode path; E is the
        number of groups completed by this chunk (0 when none).  The state given is not modified.

params: a dict of fp32 tensors: wkv [coff·d, dim], wgate [coff·d, dim] (ratio > 1),
ape [ratio, coff·d] (V4 only), norm [d], rope_freqs [rope_dim / 2].
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..spec import compressor as spec
from ..spec.models import profile

__all__ = ["compress", "compressor_state", "compressor_feed"]


def compress(x: torch.Tensor, params: dict, *, model: str, ratio: int) -> torch.Tensor:
    _check(params, model, ratio, x=x, what="compress")
    seqlen = x.shape[1]
    kv = _project(x, params["wkv"], ratio)
    groups = seqlen // ratio
    if not spec.has_gate(ratio):
        pooled = kv[:, :groups]
    else:
        score = x @ params["wgate"].T
        if spec.has_ape(model):
            score = score + params["ape"][torch.arange(seqlen) % ratio]
        cutoff = groups * ratio
        kv = kv[:, :cutoff].unflatten(1, (groups, ratio))
        score = score[:, :cutoff].unflatten(1, (groups, ratio))
        if spec.overlaps(model, ratio):
            kv, score = _overlap_windows(kv, 0.0), _overlap_windows(score, float("-inf"))
        pooled = (kv * score.softmax(dim=2)).sum(dim=2)
    normed = _rms_norm(pooled, params["norm"], profile(model).norm_eps)
    return _rope(normed, torch.arange(groups) * ratio, params["rope_freqs"])


@dataclass(frozen=True)
class CompressorState:
    params: dict
    model: str
    ratio: int
    position: int          # tokens fed so far
    kv: torch.Tensor       # [B, coff·ratio, coff·d]: slots [0, m) previous group (overlap), then current
    score: torch.Tensor    # same shape, -inf where empty


def compressor_state(params: dict, *, model: str, ratio: int, batch: int) -> CompressorState:
    _check(params, model, ratio, what="compressor_state")
    coff = spec.channel_factor(model, ratio)
    width = params["wkv"].shape[0]
    kv = torch.zeros(batch, coff * ratio, width, dtype=torch.float32)
    score = torch.full_like(kv, float("-inf"))
    return CompressorState(params, model, ratio, 0, kv, score)


def compressor_feed(state: CompressorState, x: torch.Tensor):
    _check(state.params, state.model, state.ratio, x=x, what="compressor_feed")
    if x.shape[0] != state.kv.shape[0]:
        raise ValueError(f"compressor_feed: batch {x.shape[0]} differs from the state's {state.kv.shape[0]}")
    state = replace(state, kv=state.kv.clone(), score=state.score.clone())
    entries = []
    for t in range(x.shape[1]):
        state, entry = _step(state, x[:, t])
        if entry is not None:
            entries.append(entry)
    d = state.params["norm"].shape[0]
    out = torch.stack(entries, dim=1) if entries else torch.zeros(x.shape[0], 0, d)
    return state, out


def _step(state: CompressorState, x: torch.Tensor):
    """One token (the official decode step); mutates the state's buffers, returns the entry or None."""
    p, ratio, pos = state.params, state.ratio, state.position
    state = replace(state, position=pos + 1)
    kv = _project(x, p["wkv"], ratio)
    if not spec.has_gate(ratio):
        pooled = kv
    else:
        score = x @ p["wgate"].T
        if spec.has_ape(state.model):
            score = score + p["ape"][pos % ratio]
        overlap = spec.overlaps(state.model, ratio)
        slot = (ratio if overlap else 0) + pos % ratio
        state.kv[:, slot], state.score[:, slot] = kv, score
        if (pos + 1) % ratio:
            return state, None
        if overlap:
            d = kv.shape[-1] // 2
            window_kv = torch.cat([state.kv[:, :ratio, :d], state.kv[:, ratio:, d:]], dim=1)
            window_score = torch.cat([state.score[:, :ratio, :d], state.score[:, ratio:, d:]], dim=1)
            state.kv[:, :ratio], state.score[:, :ratio] = state.kv[:, ratio:], state.score[:, ratio:]
        else:
            window_kv, window_score = state.kv, state.score
        pooled = (window_kv * window_score.softmax(dim=1)).sum(dim=1)
    normed = _rms_norm(pooled, p["norm"], profile(state.model).norm_eps)
    return state, _rope(normed, torch.tensor([pos + 1 - ratio]), p["rope_freqs"])


def _project(x: torch.Tensor, wkv: torch.Tensor, ratio: int) -> torch.Tensor:
    """wkv·x in fp32; at ratio 1 (a BF16 Linear, CMP.RATIO1) that sum rounded once to BF16."""
    kv = x @ wkv.T
    return kv if spec.has_gate(ratio) else kv.bfloat16().float()


def _overlap_windows(t: torch.Tensor, fill: float) -> torch.Tensor:
    """[B, groups, m, 2d] -> [B, groups, 2m, d] (the official overlap_transform)."""
    b, groups, m, width = t.shape
    d = width // 2
    out = t.new_full((b, groups, 2 * m, d), fill)
    out[:, :, m:] = t[:, :, :, d:]
    out[:, 1:, :m] = t[:, :-1, :, :d]
    return out


def _rms_norm(p: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (p * torch.rsqrt(p.square().mean(-1, keepdim=True) + eps))


def _rope(y: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of the last 2·len(freqs) channels by position·f (angles in fp32)."""
    rd = 2 * freqs.shape[0]
    if rd == 0:
        return y
    angle = positions.to(torch.float32)[:, None] * freqs
    cos, sin = angle.cos(), angle.sin()
    a, b = y[..., -rd::2], y[..., -rd + 1::2]
    out = y.clone()
    out[..., -rd::2] = a * cos - b * sin
    out[..., -rd + 1::2] = a * sin + b * cos
    return out


def _check(params: dict, model: str, ratio: int, *, x=None, what: str):
    if ratio not in spec.compressor_ratios(model):
        raise ValueError(f"{what}: {model} has no ratio-{ratio} compressor; its ratios are "
                         f"{spec.compressor_ratios(model)}")
    need = ["wkv", "norm", "rope_freqs"] + (["wgate"] if spec.has_gate(ratio) else []) \
        + (["ape"] if spec.has_ape(model) and spec.has_gate(ratio) else [])
    missing = [k for k in need if k not in params]
    if missing:
        raise ValueError(f"{what}: params lack {', '.join(missing)}")
    for k in need:
        if not isinstance(params[k], torch.Tensor) or params[k].dtype != torch.float32:
            raise TypeError(f"{what}: params[{k!r}] must be a float32 tensor")
    d = params["norm"].shape[0]
    coff = spec.channel_factor(model, ratio)
    if params["wkv"].shape[0] != coff * d:
        raise ValueError(f"{what}: wkv has {params['wkv'].shape[0]} rows, expected coff·d = {coff}·{d}")
    if 2 * params["rope_freqs"].shape[0] > d:
        raise ValueError(f"{what}: rope_dim {2 * params['rope_freqs'].shape[0]} exceeds d = {d}")
    if x is not None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 3:
            raise TypeError(f"{what}: x must be a float32 tensor [batch, tokens, dim]")
        if x.shape[-1] != params["wkv"].shape[1]:
            raise ValueError(f"{what}: x has dim {x.shape[-1]}, wkv expects {params['wkv'].shape[1]}")
