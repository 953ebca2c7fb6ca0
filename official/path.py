"""official.path: the index lists, RoPE then quantization, and one layer's indexer path as the
official code computes them (V4-model Indexer/Attention L380-509; V4.1 upstream L488-580, L680-760).
A V4.1 KV source at a decode step that completes no group scores the cache published last
(published_k_*, PATH.K.PUBLISHED); its own K stages are still returned, as its own cache holds them.

BF16 tensors throughout, torch.topk with its own ties, int32 index lists.  The FP4 and FP8 bytes
come from the official codecs (official.quant); the reference itself keeps them as in-place QDQ.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec.models import profile
from ..spec.path import reads_published_k
from ..spec.pool import layer_role
from ..spec.quant import FP8_LINEAR_BLOCK
from .indexer import rotate_activation
from .rope import apply_rotary_emb, freqs_cis, rope_freqs

__all__ = ["window_index", "compressed_index", "attention_index", "rope_quantize", "kv_qdq", "index_layer",
           "window_ring"]

WINDOW = 128
BF16 = torch.bfloat16


def _codec(name: str):
    from . import quant
    fn = getattr(quant, name, None)
    if fn is None:
        raise NotImplementedError(f"official.quant.{name} (the official codec) is not available")
    return fn


def window_index(seqlen: int, start_pos: int, *, order: str = "v4.1") -> torch.Tensor:
    """get_window_topk_idxs; V4.1 lists a decode ring oldest first (−1 first), V4 pads −1 at the end."""
    win = WINDOW
    if start_pos == 0:
        end = torch.arange(seqlen).unsqueeze(1)
        idxs = (end - win + 1).clamp(0) + torch.arange(min(seqlen, win))
        return torch.where(idxs > end, -1, idxs).int()
    if order == "v4":
        if start_pos >= win - 1:
            p = start_pos % win
            idxs = torch.cat([torch.arange(p + 1, win), torch.arange(0, p + 1)])
        else:
            idxs = F.pad(torch.arange(start_pos + 1), (0, win - start_pos - 1), value=-1)
        return idxs.unsqueeze(0).int()
    oldest = start_pos % win + 1
    idxs = torch.cat([torch.arange(oldest, win), torch.arange(oldest)])
    return torch.where(idxs > start_pos, -1, idxs).unsqueeze(0).int()


def _compress_topk_idxs(ratio: int, seqlen: int, start_pos: int, offset: int) -> torch.Tensor:
    if start_pos > 0:
        return (torch.arange(0, (start_pos + 1) // ratio) + offset).unsqueeze(0)
    matrix = torch.arange(seqlen // ratio).repeat(seqlen, 1)
    mask = matrix >= torch.arange(1, seqlen + 1).unsqueeze(1) // ratio
    return torch.where(mask, -1, matrix + offset)


def _offset(seqlen: int, start_pos: int) -> int:
    return seqlen if start_pos == 0 else WINDOW


def compressed_index(seqlen: int, start_pos: int, *, model: str, layer: int) -> torch.Tensor:
    return _compress_topk_idxs(profile(model).ratio(layer), seqlen, start_pos, _offset(seqlen, start_pos)).int()


def attention_index(window_rows, compressed_rows, seqlen: int, start_pos: int) -> torch.Tensor:
    shifted = torch.where(compressed_rows >= 0, compressed_rows + _offset(seqlen, start_pos), -1)
    return torch.cat([window_rows.expand(shifted.shape[0], -1), shifted], dim=-1).int()


_QUANT = {"fp4_e8m0": ("fp4_e8m0_quantize", ()), "fp4_e4m3": ("fp4_e4m3_quantize", ()),
          "fp8_e8m0_32": ("fp8_quantize", (32,))}
_DEQUANT = {"fp4_e8m0": ("fp4_e8m0_dequantize", ()), "fp4_e4m3": ("fp4_e4m3_dequantize", ()),
            "fp8_e8m0_32": ("fp8_dequantize", (32,))}


def rope_quantize(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, fmt: str):
    """apply_rotary_emb on the last 64 dims of the BF16 entry, then its codec (L758 → L760, L706 → L707)."""
    rd = 2 * freqs.shape[0]
    y = x.to(BF16)
    apply_rotary_emb(y[..., -rd:], freqs_cis(positions, freqs.float()))
    name, extra = _QUANT[fmt]
    return _codec(name)(y, *extra)


def kv_qdq(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The in-place QDQ: the cache holds dequantize(quantize(x)) in BF16."""
    q, s = _codec(_QUANT[fmt][0])(x.to(BF16), *_QUANT[fmt][1])
    return _codec(_DEQUANT[fmt][0])(q, s, *_DEQUANT[fmt][1]).to(BF16).float()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    return (weight.float() * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))).to(dtype)


def _hadamard(x: torch.Tensor) -> torch.Tensor:
    """rotate_activation: fast_hadamard_transform's butterfly (official.indexer), BF16 in and out."""
    return rotate_activation(x.to(BF16).contiguous())


def _fp4(x: torch.Tensor):
    """fp4_act_quant(x, 32, True): the bytes, and the BF16 QDQ values the reference keeps."""
    packed, scales = _codec("fp4_e8m0_quantize")(x.to(BF16))
    return packed, scales, _codec("fp4_e8m0_dequantize")(packed, scales).to(BF16)


def index_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    m = profile(model)
    role = layer_role(m, layer)
    ratio = m.ratio(layer)
    x = inputs["x"].to(BF16)
    seqlen = x.shape[0]
    end_pos = start_pos + seqlen
    out = {"window_idx": window_index(seqlen, start_pos, order="v4" if m.hadamard else "v4.1")}
    if role.kind == "window":
        out["indices"] = out["window_idx"]
        return out
    offset = _offset(seqlen, start_pos)
    if role.kind == "hca":
        out["compressed_idx"] = _compress_topk_idxs(ratio, seqlen, start_pos, offset).int()
        out["indices"] = torch.cat([out["window_idx"].expand(seqlen, -1), out["compressed_idx"]], -1).int()
        return out
    rd, D, H = m.rope_dim, m.index_head_dim, m.index_n_heads
    table = freqs_cis(torch.arange(end_pos), rope_freqs(model, layer))
    # wq_b is float8_e4m3fn: linear() runs act_quant then fp8_gemm (V4-model L116-118, V4.1 L196-205)
    q = _codec("fp8_linear")(inputs["qr"].to(BF16), inputs["wq_b"], inputs["wq_b_scale"],
                             FP8_LINEAR_BLOCK[model]).to(BF16).unflatten(-1, (-1, D))   # this rank's heads
    out["q"] = q.clone()
    apply_rotary_emb(q[..., -rd:], table[start_pos:end_pos])
    out["q_rot"] = q.clone()
    if m.hadamard:
        q = _hadamard(q)
        out["q_had"] = q.clone()
    out["q_packed"], out["q_scales"], q = _fp4(q)

    entries = end_pos // ratio
    if role.kind == "reindex":
        out["k_packed"], out["k_scales"] = inputs["k_packed"], inputs["k_scales"]
        k = _codec("fp4_e8m0_dequantize")(inputs["k_packed"], inputs["k_scales"]).to(BF16)
    else:
        if role.kind == "csa":
            k = inputs["index_entry"].to(BF16).clone()
        else:
            k = F.linear(inputs["latent"].to(BF16), inputs["wk"].to(BF16))
            out["k"] = k.clone()
            k = _rms_norm(k, inputs["k_norm"].float(), m.norm_eps)
            out["k_normed"] = k.clone()
        apply_rotary_emb(k[..., -rd:], table[:entries * ratio:ratio])
        out["k_rot"] = k.clone()
        if m.hadamard:
            k = _hadamard(k)
            out["k_had"] = k.clone()
        out["k_packed"], out["k_scales"], k = _fp4(k)

    weights = F.linear(x, inputs["weights_proj"].to(BF16))
    out["w_raw"] = weights.clone()
    weights = weights * (D ** -0.5 * H ** -0.5)
    out["weights"] = weights.clone()
    if reads_published_k(m, layer, seqlen, start_pos):   # no latent: nothing published (L537); L554 reads layer 20's
        k = _codec("fp4_e8m0_dequantize")(inputs["published_k_packed"], inputs["published_k_scales"]).to(BF16)
    score = torch.einsum("shd,td->sht", q, k[:entries])
    score = all_reduce((score.relu_() * weights.unsqueeze(-1)).sum(dim=1))
    if start_pos == 0:
        compress_lens = (torch.arange(1, seqlen + 1) // ratio).unsqueeze(-1)
        score.masked_fill_(torch.arange(seqlen // ratio) >= compress_lens, float("-inf"))
    else:
        compress_lens = torch.tensor([[end_pos // ratio]])
    out["scores"] = score.clone()
    if role.kind == "candidate_source":
        out["candidates"] = _select_candidate_blocks(score, compress_lens, m.candidate_topk_blocks,
                                                     m.candidate_block_size)
    elif role.kind == "reindex":
        score = score.masked_fill(~inputs["candidates"], float("-inf"))
    k_top = min(m.index_topk, entries)
    if m.hadamard:                             # V4: descending score, −1 only in prefill
        idxs = score.topk(k_top, dim=-1)[1]
        topk = torch.where(idxs >= compress_lens, -1, idxs) if start_pos == 0 else idxs
    else:                                      # V4.1: ascending position, −1 at the tail
        idxs = score.topk(k_top, dim=-1, sorted=False).indices.sort(dim=-1).values
        topk = torch.where(idxs < compress_lens, idxs, -1)
    out["topk"] = topk
    out["indices"] = torch.cat([out["window_idx"].expand(seqlen, -1),
                                torch.where(topk >= 0, topk + offset, -1)], -1).int()
    return {k: (v.float() if v.dtype == BF16 else v) for k, v in out.items()}


def all_reduce(score: torch.Tensor) -> torch.Tensor:
    """dist.all_reduce(index_score) where world_size > 1 (V4-model L422-423, V41-model L558-559): the
    sum of every rank's partial score over its heads (n_local_heads of the global n_heads, whose
    factor the weights keep, V4-model L387-388, L418).  One process, world size 1: the identity."""
    return score


def _select_candidate_blocks(logits, compress_lens, topk_blocks: int, block_size: int) -> torch.Tensor:
    width = logits.size(-1)
    scores = F.pad(logits, (0, -width % block_size), value=float("-inf"))
    scores = scores.unflatten(-1, (-1, block_size)).amax(dim=-1)
    num_blocks = scores.size(-1)
    last = (compress_lens - 1) // block_size
    scores = scores.masked_fill(torch.arange(num_blocks) == last, float("inf"))
    top = scores.topk(min(topk_blocks, num_blocks), dim=-1)
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top.indices, top.values > float("-inf"))
    return keep.repeat_interleave(block_size, dim=-1)[..., :width]


def window_ring(prefill: int, decoded: int) -> torch.Tensor:
    """Attention.forward's window kv_cache, holding positions for KV: the prefill writes the last
    128 tokens split at s mod 128, each decode step slot start_pos mod 128."""
    win = WINDOW
    cache = torch.full((win,), -1, dtype=torch.int64)
    kv = torch.arange(prefill)
    if prefill <= win:
        cache[:prefill] = kv
    else:
        cutoff = prefill % win
        cache[cutoff:win], cache[:cutoff] = kv[-win:].split([win - cutoff, cutoff])
    for start_pos in range(prefill, prefill + decoded):
        cache[start_pos % win] = start_pos
    return cache
