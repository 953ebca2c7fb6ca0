"""official.compressor: the compressor operations as the official code computes them.

Transcribed from the V4 `Compressor` (V4-model L279-377) and the V4.1 one (V41-model L429-485),
with their BF16 steps (V4-model L196, L362, L367; V41-model L485, L758): the activations are BF16 and are widened to fp32 for the fp32 wkv / wgate /
ape (V4.1 ratio 1: a BF16 Linear instead, no fp32); the pooled vector is cast back to BF16
(`norm(kv.to(dtype))`); RMSNorm computes in fp32 and returns BF16; RoPE multiplies in complex
fp32 and writes the BF16 entry in place.  One prefill from position 0, then one token per call
(the decode path) — the reference supports nothing else, so compressor_feed refuses a chunk of
several tokens after the first (the `streaming` extension, not declared here).

Compressor.forward returns None where the official one does (a prefill shorter than the ratio, a
decode step that completes no group: `if not should_compress: return`); the operations hand the
suite that result as an empty [B, 0, d] tensor, the contract's "E = 0 entries"
(properties/compressor.py), so every check reads one form and None never reaches a comparison.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ..spec.models import profile
from ..spec.rules import V4

__all__ = ["compress", "compressor_state", "compressor_feed"]

BF16 = torch.bfloat16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return (weight * x).to(dtype)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs in complex fp32 and copy the result back into x (in place)."""
    y = x
    x = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    x = torch.view_as_real(x * freqs_cis.view(1, x.size(1), x.size(-1))).flatten(-2)
    y.copy_(x)
    return y


def freqs_cis(freqs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """precompute_freqs_cis for the given positions: polar(1, outer(t, freqs)) in fp32."""
    angles = torch.outer(positions, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def overlap_transform(t: torch.Tensor, value: float) -> torch.Tensor:
    """[b, groups, m, 2d] -> [b, groups, 2m, d]: the previous group's first half, then this
    group's second half; group 0's previous half is `value`."""
    b, s, ratio, width = t.shape
    d = width // 2
    new = t.new_full((b, s, 2 * ratio, d), value)
    new[:, :, ratio:] = t[:, :, :, d:]
    new[:, 1:, :ratio] = t[:, :-1, :, :d]
    return new


class Compressor:
    def __init__(self, params: dict, model: str, ratio: int, batch: int):
        self.ratio, self.overlap = ratio, model in V4 and ratio == 4
        self.gated = ratio > 1                       # V4.1 ratio 1: norm(wkv(x)), no gate, no fp32
        coff = 1 + self.overlap
        self.wkv = params["wkv"].float() if self.gated else params["wkv"].to(BF16)
        self.wgate = params.get("wgate")
        self.ape = params.get("ape") if model in V4 else None
        self.norm_weight, self.eps = params["norm"], profile(model).norm_eps
        self.freqs = params["rope_freqs"]
        self.rope_head_dim = 2 * self.freqs.shape[0]
        width = self.wkv.shape[0]
        self.kv_state = torch.zeros(batch, coff * ratio, width)
        self.score_state = torch.full((batch, coff * ratio, width), float("-inf"))

    def forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor | None:
        dtype = x.dtype
        if not self.gated:
            kv = F.linear(x, self.wkv)
            positions = torch.arange(start_pos, start_pos + x.size(1))
            return self._finish(kv, positions)
        bsz, seqlen, _ = x.size()
        ratio, overlap = self.ratio, self.overlap
        x = x.float()
        kv, score = F.linear(x, self.wkv), F.linear(x, self.wgate)
        ape = self.ape if self.ape is not None else torch.zeros(ratio, score.size(-1))
        if start_pos == 0:
            should_compress = seqlen >= ratio
            remainder = seqlen % ratio
            cutoff = seqlen - remainder
            offset = ratio if overlap else 0
            if overlap and cutoff >= ratio:
                self.kv_state[:bsz, :ratio] = kv[:, cutoff - ratio: cutoff]
                self.score_state[:bsz, :ratio] = score[:, cutoff - ratio: cutoff] + ape
            if remainder > 0:
                kv, self.kv_state[:bsz, offset: offset + remainder] = kv.split([cutoff, remainder], dim=1)
                self.score_state[:bsz, offset: offset + remainder] = score[:, cutoff:] + ape[:remainder]
                score = score[:, :cutoff]
            kv = kv.unflatten(1, (-1, ratio))
            score = score.unflatten(1, (-1, ratio)) + ape
            if overlap:
                kv = overlap_transform(kv, 0)
                score = overlap_transform(score, float("-inf"))
            kv = (kv * score.softmax(dim=2)).sum(dim=2)
            positions = torch.arange(0, cutoff, ratio)
            if not should_compress:
                return None
        else:
            score = score + ape[start_pos % ratio]
            slot = (ratio if overlap else 0) + start_pos % ratio
            self.kv_state[:bsz, slot] = kv.squeeze(1)
            self.score_state[:bsz, slot] = score.squeeze(1)
            if (start_pos + 1) % ratio:
                return None
            if overlap:
                d = kv.size(-1) // 2
                kv_state = torch.cat([self.kv_state[:bsz, :ratio, :d], self.kv_state[:bsz, ratio:, d:]], dim=1)
                score_state = torch.cat([self.score_state[:bsz, :ratio, :d], self.score_state[:bsz, ratio:, d:]], dim=1)
                kv = (kv_state * score_state.softmax(dim=1)).sum(dim=1, keepdim=True)
                self.kv_state[:bsz, :ratio] = self.kv_state[:bsz, ratio:]
                self.score_state[:bsz, :ratio] = self.score_state[:bsz, ratio:]
            else:
                kv = (self.kv_state[:bsz] * self.score_state[:bsz].softmax(dim=1)).sum(dim=1, keepdim=True)
            positions = torch.tensor([start_pos + 1 - ratio])
        return self._finish(kv.to(dtype), positions)

    def _finish(self, kv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RMSNorm (BF16 out), then RoPE on the last rope_head_dim channels of the BF16 entry."""
        kv = rms_norm(kv, self.norm_weight, self.eps)
        if self.rope_head_dim and kv.size(1):
            apply_rotary_emb(kv[..., -self.rope_head_dim:], freqs_cis(self.freqs, positions))
        return kv


def _entries(out, x: torch.Tensor, width: int) -> torch.Tensor:
    """The contract's form of the official result: None (no group completed) is [B, 0, d]."""
    return torch.zeros(x.size(0), 0, width) if out is None else out.float()


def compress(x: torch.Tensor, params: dict, *, model: str, ratio: int) -> torch.Tensor:
    """One prefill from position 0: the entries of every complete group."""
    compressor = Compressor(params, model, ratio, x.size(0))
    return _entries(compressor.forward(x.to(BF16), 0), x, compressor.norm_weight.shape[0])


class State:
    def __init__(self, compressor: Compressor, position: int = 0):
        self.compressor, self.position = compressor, position


def compressor_state(params: dict, *, model: str, ratio: int, batch: int) -> State:
    return State(Compressor(params, model, ratio, batch))


def compressor_feed(state: State, x: torch.Tensor):
    """The first call is the prefill from position 0; every later call one decode token."""
    if state.position and x.size(1) != 1:
        raise ValueError(f"official compressor: after the prefill, one token per call (decode); got {x.size(1)} "
                         f"tokens at position {state.position} (chunked prefill is the 'streaming' extension)")
    state = State(copy.deepcopy(state.compressor), state.position)
    out = state.compressor.forward(x.to(BF16), state.position)
    state.position += x.size(1)
    return state, _entries(out, x, state.compressor.norm_weight.shape[0])
