"""The indexer path put together, readable torch (CPU): index lists, RoPE-then-quantize, what main
attention reads, a pool-only re-index scan, and one layer's path returning every stage by name.

Operations (contract in dsv4spec.properties.path):

    window_index(seqlen, start_pos) -> int32 [T, W]
    compressed_index(seqlen, start_pos, *, model, layer) -> int32 [T, C]       (V4 HCA)
    attention_index(window_rows, compressed_rows, seqlen, start_pos) -> int32 [T, W + C]
    rope_quantize(x [T, D], positions [T], freqs [d/2], fmt) -> (payload u8, scales u8)
    kv_qdq(x [..., D], fmt) -> f32                                            (BF16 values)
    pool_scan_topk(q, k, w, visible, pool, topk) -> int64 [T, topk]
    index_layer(inputs: dict, *, model, layer, start_pos=0) -> dict of stages
        (a V4.1 KV source decoding a step that completes no group scores published_k_*: PATH.K.PUBLISHED)
"""
from __future__ import annotations

import torch

from ..spec import path as spec
from ..spec import pool as spec_pool
from ..spec.quant import FP8_LINEAR_BLOCK
from ..spec.models import profile
from ..spec.rope import compressed_positions
from .indexer import (_bf16, _bf16_values, _tensor, _topk_from, _visibility_mask, _visible, hadamard,
                      index_scores, index_weights)
from .pool import candidate_blocks
from .quant import (fp4_e4m3_dequantize, fp4_e4m3_quantize, fp4_e8m0_dequantize, fp4_e8m0_quantize,
                    fp8_dequantize, fp8_linear, fp8_quantize)
from .rope import rope_freqs, rope_rotate

__all__ = ["window_index", "compressed_index", "attention_index", "rope_quantize", "kv_qdq",
           "pool_scan_topk", "index_layer", "window_ring"]

FORMATS = ("fp4_e8m0", "fp4_e4m3", "fp8_e8m0_32")
FP8_WINDOW_BLOCK = 32


# ------------------------------------------------------------------------------------------------
# index lists
# ------------------------------------------------------------------------------------------------
def _counts(op: str, seqlen, start_pos) -> None:
    for name, v, low in (("seqlen", seqlen, 1), ("start_pos", start_pos, 0)):
        if not isinstance(v, int) or v < low:
            raise ValueError(f"{op}: {name} must be an int ≥ {low}, got {v!r}")
    if start_pos > 0 and seqlen != 1:
        raise ValueError(f"{op}: the reference decodes one token at a time (start_pos > 0 needs seqlen 1), "
                         f"got seqlen {seqlen}; chunked prefill is an extension")


def window_index(seqlen: int, start_pos: int) -> torch.Tensor:
    """Prefill row i: i−127 … i clipped at 0, then −1; decode: the 128 ring slots, −1 where unfilled."""
    _counts("window_index", seqlen, start_pos)
    win = spec.WINDOW
    if start_pos == 0:
        i = torch.arange(seqlen)[:, None]
        rows = (i - win + 1).clamp(min=0) + torch.arange(min(seqlen, win))[None, :]
        return torch.where(rows > i, -1, rows).int()
    filled = min(start_pos + 1, win)
    slots = torch.full((win,), -1, dtype=torch.int64)
    slots[:filled] = torch.arange(start_pos + 1 - filled, start_pos + 1).remainder(win).sort().values
    return slots[None, :].int()


def _ratio(op: str, model: str, layer: int) -> int:
    m = profile(model)
    if not isinstance(layer, int) or not 0 <= layer < len(m.compress_ratios):
        raise ValueError(f"{op}: {model} has layers 0..{len(m.compress_ratios) - 1}, got {layer!r}")
    return m.ratio(layer)


def compressed_index(seqlen: int, start_pos: int, *, model: str, layer: int) -> torch.Tensor:
    """Every visible compressed entry (no indexer), ascending, + the compressed block's offset."""
    op = "compressed_index"
    _counts(op, seqlen, start_pos)
    ratio = _ratio(op, model, layer)
    role = spec_pool.layer_role(profile(model), layer)
    if role.kind != "hca":
        raise ValueError(f"{op}: layer {layer} of {model} is a {role.kind!r} layer (ratio {ratio}); "
                         f"expected a layer without an indexer (V4 HCA, ratio 128)")
    offset = spec.kv_offset(seqlen, start_pos)
    if start_pos > 0:
        return (torch.arange((start_pos + 1) // ratio) + offset)[None, :].int()
    j = torch.arange(seqlen // ratio)[None, :]
    visible = (torch.arange(1, seqlen + 1) // ratio)[:, None]
    return torch.where(j >= visible, -1, j + offset).int()


def attention_index(window_rows: torch.Tensor, compressed_rows: torch.Tensor, seqlen: int,
                    start_pos: int) -> torch.Tensor:
    """[window | compressed + offset], −1 kept, int32."""
    op = "attention_index"
    _counts(op, seqlen, start_pos)
    window_rows = _tensor(op, "window_rows", window_rows, 2, integer=True).long()
    compressed_rows = _tensor(op, "compressed_rows", compressed_rows, 2, integer=True).long()
    if window_rows.shape[0] != compressed_rows.shape[0]:
        raise ValueError(f"{op}: {window_rows.shape[0]} window rows but {compressed_rows.shape[0]} compressed rows; "
                         f"expected one row per query in both")
    offset = spec.kv_offset(seqlen, start_pos)
    shifted = torch.where(compressed_rows >= 0, compressed_rows + offset, -1)
    return torch.cat([window_rows, shifted], dim=-1).int()


# ------------------------------------------------------------------------------------------------
# RoPE, then quantize; what attention reads
# ------------------------------------------------------------------------------------------------
def _format(op: str, fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"{op}: fmt must be one of {FORMATS} (index K, V4.1 main KV, V4.1 window), got {fmt!r}")
    return fmt


def _quantize(x: torch.Tensor, fmt: str):
    if fmt == "fp4_e8m0":
        return fp4_e8m0_quantize(x)
    if fmt == "fp4_e4m3":
        return fp4_e4m3_quantize(x)
    return fp8_quantize(x, FP8_WINDOW_BLOCK)


def _dequantize(payload, scales, fmt: str) -> torch.Tensor:
    if fmt == "fp4_e8m0":
        return fp4_e8m0_dequantize(payload, scales)
    if fmt == "fp4_e4m3":
        return fp4_e4m3_dequantize(payload, scales)
    return fp8_dequantize(payload, scales, FP8_WINDOW_BLOCK)


def rope_quantize(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, fmt: str):
    """The cache entry: RoPE on the last 2·len(freqs) channels first, then the codec of `fmt`."""
    _format("rope_quantize", fmt)
    return _quantize(rope_rotate(x, positions, freqs), fmt)


def kv_qdq(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """What main attention reads: dequantize(quantize(x)), BF16-exact, as the in-place QDQ writes it."""
    fmt = _format("kv_qdq", fmt)
    x = _bf16_values("kv_qdq", "x", _tensor("kv_qdq", "x", x, floating=True))
    return _dequantize(*_quantize(x, fmt), fmt)


# ------------------------------------------------------------------------------------------------
# a re-index that scores only the pool
# ------------------------------------------------------------------------------------------------
def pool_scan_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor,
                   pool: torch.Tensor, topk: int) -> torch.Tensor:
    """Per row, score only the visible pool positions, then take the top-k in V4.1 order."""
    op = "pool_scan_topk"
    pool = _tensor(op, "pool", pool, 2, boolean=True)
    T, S = q.shape[0], k.shape[0]
    if tuple(pool.shape) != (T, S):
        raise ValueError(f"{op}: pool has shape {tuple(pool.shape)}, expected [T, S] = [{T}, {S}]")
    if not isinstance(topk, int) or not 0 <= topk <= S:
        raise ValueError(f"{op}: topk must be an int in [0, {S}], got {topk!r}")
    visible = _visible(op, visible, T, S)
    eligible = pool & _visibility_mask(visible, S)
    scores = torch.full((T, S), float("-inf"))
    for t in range(T):
        cols = eligible[t].nonzero().flatten()
        if cols.numel():
            row = index_scores(q[t:t + 1], k[cols], w[t:t + 1], torch.tensor([cols.numel()]), "bf16")
            scores[t, cols] = row[0]
    return _topk_from(scores, eligible, topk, "position")


# ------------------------------------------------------------------------------------------------
# one layer's path
# ------------------------------------------------------------------------------------------------
def layer_input(op: str, inputs: dict, name: str, shape: tuple) -> torch.Tensor:
    if name not in inputs:
        raise ValueError(f"{op}: inputs lack {name!r} (expected shape {list(shape)})")
    x = _tensor(op, name, inputs[name], len(shape))
    if any(want is not None and got != want for got, want in zip(x.shape, shape)):
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}, expected {[s if s is not None else '*' for s in shape]}")
    return x


def bf16_layer_input(op: str, inputs: dict, name: str, shape: tuple) -> torch.Tensor:
    """A finite BF16-valued input (activations and weights), as float32."""
    x = layer_input(op, inputs, name, shape)
    if not x.is_floating_point():
        raise TypeError(f"{op}: {name} must be float32 or bfloat16, got {x.dtype}")
    x = x.float()
    if not torch.equal(x, _bf16(x)):
        raise ValueError(f"{op}: {name} must hold finite BF16-representable values (round them first)")
    return x


def index_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    """Every stage of one layer's indexer path, by name (see spec/path.py for the stage list)."""
    op = "index_layer"
    m = profile(model)
    ratio = _ratio(op, model, layer)
    role = spec_pool.layer_role(m, layer)
    x = bf16_layer_input(op, inputs, "x", (None, m.dim))
    T = x.shape[0]
    _counts(op, T, start_pos)
    end_pos = start_pos + T
    positions = torch.arange(start_pos, end_pos)
    out = {"window_idx": window_index(T, start_pos)}
    if role.kind == "window":
        out["indices"] = out["window_idx"]
        return out
    if role.kind == "hca":
        out["compressed_idx"] = compressed_index(T, start_pos, model=model, layer=layer)
        out["indices"] = attention_index(out["window_idx"], _unshift(out["compressed_idx"], T, start_pos),
                                         T, start_pos)
        return out
    if role.kind == "reuse" or role.topk_source != layer:
        raise ValueError(f"{op}: layer {layer} of {model} reuses layer {role.topk_source}'s top-k; "
                         f"expected a layer that runs its own indexer")
    H, D, E = m.index_n_heads, m.index_head_dim, end_pos // ratio
    freqs = rope_freqs(model, layer, "index_q")
    qr = bf16_layer_input(op, inputs, "qr", (T, m.q_lora_rank))
    b = FP8_LINEAR_BLOCK[model]
    wq_b = layer_input(op, inputs, "wq_b", (H * D, m.q_lora_rank))
    wq_b_scale = layer_input(op, inputs, "wq_b_scale", (-(-H * D // b), m.q_lora_rank // b))
    q = fp8_linear(qr, wq_b, wq_b_scale, b).view(T, H, D)
    q_rot = rope_rotate(q, positions, freqs)
    out.update(q=q, q_rot=q_rot)
    if m.hadamard:
        out["q_had"] = hadamard(q_rot)
    out["q_packed"], out["q_scales"] = fp4_e8m0_quantize(out.get("q_had", q_rot))

    k_positions = _k_positions(E, ratio)
    if role.kind == "csa":
        entry = bf16_layer_input(op, inputs, "index_entry", (E, D))
        out["k_rot"] = rope_rotate(entry, k_positions, rope_freqs(model, layer, "index_k"))
        out["k_had"] = hadamard(out["k_rot"])
        out["k_packed"], out["k_scales"] = fp4_e8m0_quantize(out["k_had"])
    elif role.kind == "reindex":
        out["k_packed"] = layer_input(op, inputs, "k_packed", (E, D // 2))
        out["k_scales"] = layer_input(op, inputs, "k_scales", (E, D // 32))
    else:
        latent = bf16_layer_input(op, inputs, "latent", (E, m.head_dim))
        wk = bf16_layer_input(op, inputs, "wk", (D, m.head_dim))
        k_norm = bf16_layer_input(op, inputs, "k_norm", (D,))
        k = _project(latent, wk)
        normed = _rms_norm(k, k_norm, m.norm_eps)
        out.update(k=k, k_normed=normed, k_rot=rope_rotate(normed, k_positions, rope_freqs(model, layer, "index_k")))
        out["k_packed"], out["k_scales"] = fp4_e8m0_quantize(out["k_rot"])

    weights_proj = bf16_layer_input(op, inputs, "weights_proj", (H, m.dim))
    out["w_raw"] = _project(x, weights_proj)
    out["weights"] = index_weights(out["w_raw"], model)
    visible = torch.div(positions + 1, ratio, rounding_mode="floor")
    own_k = fp4_e8m0_dequantize(out["k_packed"], out["k_scales"])
    scores = index_scores(fp4_e8m0_dequantize(out["q_packed"], out["q_scales"]),
                          _scored_keys(op, inputs, m, layer, T, start_pos, own_k), out["weights"], visible)
    out["scores"] = scores
    k_top = min(m.index_topk, E)
    eligible = _visibility_mask(visible, E)
    if role.kind == "candidate_source":
        out["candidates"] = candidate_blocks(scores, visible, m.candidate_topk_blocks, m.candidate_block_size)
    if role.kind == "reindex":
        candidates = _tensor(op, "candidates", layer_input(op, inputs, "candidates", (T, E)), boolean=True)
        eligible = eligible & candidates
        scores = scores.masked_fill(~eligible, float("-inf"))
    out["topk"] = _topk_from(scores, eligible, k_top, "score" if model in spec.V4 else "position")
    out["indices"] = attention_index(out["window_idx"], out["topk"], T, start_pos)
    return out


def _scored_keys(op: str, inputs: dict, m, layer: int, seqlen: int, start_pos: int,
                 own_k: torch.Tensor) -> torch.Tensor:
    """The index keys the layer scores: its own, or at a V4.1 decode step where it publishes
    nothing, the first rows of the cache published last (PATH.K.PUBLISHED)."""
    if not spec.reads_published_k(m, layer, seqlen, start_pos):
        return own_k
    rows, D = spec.published_k_rows(m, start_pos), m.index_head_dim
    packed = layer_input(op, inputs, "published_k_packed", (rows, D // 2))
    scales = layer_input(op, inputs, "published_k_scales", (rows, D // 32))
    return fp4_e8m0_dequantize(packed, scales)[:own_k.shape[0]]


def _project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A BF16 Linear: fp32 accumulation, one rounding."""
    return _bf16(x @ w.T)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _bf16(weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)))


def _k_positions(entries: int, ratio: int) -> torch.Tensor:
    """Compressed entry j sits at the position of its group's first token, j·ratio."""
    return torch.from_numpy(compressed_positions(entries, ratio))


def _unshift(rows: torch.Tensor, seqlen: int, start_pos: int) -> torch.Tensor:
    offset = spec.kv_offset(seqlen, start_pos)
    return torch.where(rows >= 0, rows - offset, -1)


# ------------------------------------------------------------------------------------------------
# the window KV ring
# ------------------------------------------------------------------------------------------------
def window_ring(prefill: int, decoded: int) -> torch.Tensor:
    """The position each of the 128 ring slots holds after a prefill and `decoded` one-token steps
    (−1: not written): the last 128 positions, p in slot p mod 128."""
    for name, v, low in (("prefill", prefill, 1), ("decoded", decoded, 0)):
        if not isinstance(v, int) or v < low:
            raise ValueError(f"window_ring: {name} must be an int ≥ {low}, got {v!r}")
    end = prefill + decoded
    positions = torch.arange(max(0, end - spec.WINDOW), end)
    ring = torch.full((spec.WINDOW,), -1, dtype=torch.int64)
    ring[positions % spec.WINDOW] = positions
    return ring
