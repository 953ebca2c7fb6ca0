"""The kernels as a serving engine calls them: device tensors in, device tensors out.

    from dsv4spec.kernels import device as D
    packed, scales = D.fp4_e8m0_quantize(k_bf16)              # uint8 [..., n/2], uint8 [..., n/32]
    scores = D.index_scores_fp4(qp, qs, kp, ks, w, visible)   # f32 [T, S]
    blocks = D.candidate_list(scores, compress_lens)          # int64 [T, 2048] ascending, -1 after
    pool = D.pool_positions(blocks, compress_lens)            # (int32 [T, 2048·8], int32 [T])
    picks = D.reindex_topk(q, k, w, pool, 512)                # int64 [T, 512] ascending, -1 after

Every function here launches Triton kernels on the tensors where they are and returns tensors on
the same device: no copy to or from the host, no host read-back of any value (the top-k engine
decides its overflow fallback on the device), so a call never synchronizes and a sequence of calls
can be captured in a CUDA graph.  The top-k engine under index_topk, candidate_list and
reindex_topk runs in one launch where a row is one program's (up to 64K positions) and two otherwise,
on workspaces made once per shape, device and stream and reused by later calls (those a CUDA graph
captured are kept for the process's life): calls on one stream may share them, since they run in
order.  The checks read only shapes, dtypes, devices and strides, never
values: what the suite's operations reject by reading the data (NaN inputs, counts out of range)
is the caller's contract here, and breaking it gives unspecified (but memory-safe) results.
The computed bits are those of the suite's `kernels` target, which wraps these launchers with
value checks and host copies.  Under the Triton interpreter (no GPU) the same functions take CPU
tensors.

Shapes and dtypes, per function:

    fp4_e4m3_quantize(x)         x bf16/f32 [..., n], n % 16 == 0 -> (uint8 [..., n/2], uint8 E4M3 [..., n/16])
    fp4_e8m0_quantize(x)         x bf16/f32 [..., n], n % 32 == 0 -> (uint8 [..., n/2], uint8 E8M0 [..., n/32])
    fp4_e4m3_dequantize(p, s, out_dtype=float32)   -> out_dtype [..., 2·p.shape[-1]]
    fp4_e8m0_dequantize(p, s, out_dtype=float32)   -> out_dtype [..., 2·p.shape[-1]]
    fp8_quantize(x, block)       x bf16/f32 [..., n]              -> (uint8 E4M3 [..., n], uint8 E8M0 [..., n/block])
    fp8_dequantize(q, s, block, out_dtype=float32) -> out_dtype [..., n]
    fp8_qdq(x, block)                                             -> f32 [..., n]
    index_scores_fp4(q_packed u8 [T,H,D/2], q_scales u8 [T,H,D/32], k_packed u8 [S,D/2],
                     k_scales u8 [S,D/32], w bf16 [T,H], visible int32 [T])  -> f32 [T,S]
    index_scores(q bf16 [T,H,D], k bf16 [S,D], w bf16 [T,H], visible int32 [T]) -> f32 [T,S]
    index_topk(scores f32 [T,S], visible int32 [T], k, order)     -> int64 [T,k]
    candidate_list(scores f32 [T,W], compress_lens int32 [T], topk_blocks=2048, block_size=8)
                                                                  -> int64 [T, min(topk_blocks, ceil(W/8))]
    pool_positions(blocks int64 [T,NB], compress_lens int32 [T], block_size=8)
                                                                  -> (int32 [T, NB·block_size], int32 [T])
    reindex_topk(q bf16 [T,H,D], k bf16 [S,D], w bf16 [T,H], pool, topk) -> int64 [T, topk]

Inputs must be contiguous (index_topk and candidate_list accept rows with a stride).
dsv4spec.kernels.ops registers these functions as torch custom operators (torch.ops.dsv4spec.*)
that torch.compile traces.

Graph-backed calls, the caller's choice where the host's launches cost more than the kernels (a
one-row top-k, a decode step: Triton's launcher takes 25-40 µs of host a launch):

    picks = D.graphed.index_topk(scores, visible, 512, "position")   # also candidate_list,
    picks = D.graphed.reindex_topk(q, k, w, pool, 512)               # pool_positions, index_scores(_fp4)
    step = D.graphed.wrap(decode_step)                               # a whole step, one graph
    tops = step(q, k_cache, w, lens)

Same signatures, shapes, dtypes and bits as the plain functions.  Each keeps an LRU of 16 CUDA graphs
keyed by its tensors' (data_ptr, shape, stride, dtype, device), its other arguments and the current
stream.  The first call of a key runs the function, then captures it (it synchronizes); later calls
replay the graph and return clones of its outputs (no synchronization; the returned tensors are the
caller's).  A key holds the graph's memory pool (outputs and intermediates) until it is evicted.
They call directly inside a caller's capture, under the interpreter, on CPU tensors, with
DSV4SPEC_GRAPHED=0, and after 16 captures in a row without a replay (addresses that change every
call); dsv4spec.kernels.graph_backed says more.  The plain functions above never synchronize and
cache nothing.
"""
from __future__ import annotations

import types

import torch


from .mode import INTERPRET
from .graph_backed import graph_backed
from .indexer import _launch_scores
from .pool import _candidate_list, _gather_blocks, _reindex_topk
from .quant import (E4M3_BLOCK, E8M0_BLOCK, fp4_dequantize_device, fp4_quantize_device,
                    fp8_dequantize_device, fp8_qdq_device, fp8_quantize_device)
from .topk import _topk_engine

_FLOATS = (torch.float32, torch.bfloat16)
_ORDERS = ("score", "position")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _on_device(op: str, name: str, t, dtypes, ndim: int | None = None, *, rows: bool = False) -> torch.Tensor:
    """t as it is, after the metadata checks (never its values)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"{op}: {name} is on {t.device}; the device API takes CUDA tensors "
                         f"(dsv4spec.kernels' operations take CPU tensors)")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} must be {' or '.join(map(_name, dtypes))}, got {_name(t.dtype)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if ndim is None and t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least one dimension")
    contiguous = t.stride(-1) == 1 if rows else t.is_contiguous()
    if not contiguous:
        raise ValueError(f"{op}: {name} must be contiguous{' in its rows' if rows else ''} (call .contiguous())")
    return t


def _same_device(op: str, **tensors):
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"{op}: {', '.join(tensors)} must be on one device, got "
                         f"{', '.join(f'{n} on {t.device}' for n, t in tensors.items())}")


def _shape(op: str, name: str, t: torch.Tensor, expected: tuple):
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def _multiple(op: str, n: int, block: int):
    if n % block:
        raise ValueError(f"{op}: the last dimension {n} is not a multiple of the block ({block})")


def _positive(op: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {v!r}")
    return v


# ------------------------------------------------------------------------------------------------
# codecs
# ------------------------------------------------------------------------------------------------
def _fp4_quantize(op: str, x, block: int):
    x = _on_device(op, "x", x, _FLOATS)
    _multiple(op, x.shape[-1], block)
    return fp4_quantize_device(x, block == E4M3_BLOCK)


def fp4_e4m3_quantize(x):
    """E2M1 payload (element 2i in the low nibble) and one E4M3 scale per 16 (FP4.KV.*)."""
    return _fp4_quantize("fp4_e4m3_quantize", x, E4M3_BLOCK)


def fp4_e8m0_quantize(x):
    """E2M1 payload and one E8M0 power-of-two scale per 32 (FP4.IDX.*)."""
    return _fp4_quantize("fp4_e8m0_quantize", x, E8M0_BLOCK)


def _codes_and_scales(op: str, codes, scales, per_scale: int, width: int):
    codes = _on_device(op, "codes", codes, (torch.uint8,))
    scales = _on_device(op, "scales", scales, (torch.uint8,))
    _same_device(op, codes=codes, scales=scales)
    _multiple(op, width, per_scale)
    _shape(op, "scales", scales, codes.shape[:-1] + (width // per_scale,))
    return codes, scales


def _fp4_dequantize(op: str, packed, scales, block: int, out_dtype):
    if out_dtype not in _FLOATS:
        raise TypeError(f"{op}: out_dtype must be float32 or bfloat16, got {out_dtype}")
    packed, scales = _codes_and_scales(op, packed, scales, block, 2 * packed.shape[-1])
    return fp4_dequantize_device(packed, scales, block == E4M3_BLOCK, out_dtype)


def fp4_e4m3_dequantize(packed, scales, out_dtype=torch.float32):
    return _fp4_dequantize("fp4_e4m3_dequantize", packed, scales, E4M3_BLOCK, out_dtype)


def fp4_e8m0_dequantize(packed, scales, out_dtype=torch.float32):
    return _fp4_dequantize("fp4_e8m0_dequantize", packed, scales, E8M0_BLOCK, out_dtype)


def fp8_quantize(x, block: int):
    """act_quant with ue8m0 scales: E4M3 bytes and one E8M0 scale per block (FP8.*)."""
    op = "fp8_quantize"
    x = _on_device(op, "x", x, _FLOATS)
    _multiple(op, x.shape[-1], _positive(op, "block", block))
    return fp8_quantize_device(x, block)


def fp8_dequantize(q, scales, block: int, out_dtype=torch.float32):
    op = "fp8_dequantize"
    if out_dtype not in _FLOATS:
        raise TypeError(f"{op}: out_dtype must be float32 or bfloat16, got {out_dtype}")
    q, scales = _codes_and_scales(op, q, scales, _positive(op, "block", block), q.shape[-1])
    return fp8_dequantize_device(q, scales, block, out_dtype)


def fp8_qdq(x, block: int):
    """The in-place act_quant's values: E4M3 quantize-dequantize per block, as fp32."""
    op = "fp8_qdq"
    x = _on_device(op, "x", x, _FLOATS)
    _multiple(op, x.shape[-1], _positive(op, "block", block))
    return fp8_qdq_device(x, block)


# ------------------------------------------------------------------------------------------------
# indexer
# ------------------------------------------------------------------------------------------------
def _visible(op: str, visible, T: int, name: str = "visible") -> torch.Tensor:
    visible = _on_device(op, name, visible, (torch.int32,), 1)
    _shape(op, name, visible, (T,))
    return visible


def _scores_out(T: int, S: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty((T, S), dtype=torch.float32, device=like.device)


def index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible):
    """Σ_h w·ReLU(q·k) of FP4 q and k (E2M1 + E8M0/32), BF16 at each step, −inf past visible[t]."""
    op = "index_scores_fp4"
    q_packed = _on_device(op, "q_packed", q_packed, (torch.uint8,), 3)
    T, H, half = q_packed.shape
    D = 2 * half
    _multiple(op, D, E8M0_BLOCK)
    k_packed = _on_device(op, "k_packed", k_packed, (torch.uint8,), 2)
    S = k_packed.shape[0]
    _shape(op, "k_packed", k_packed, (S, half))
    _shape(op, "q_scales", _on_device(op, "q_scales", q_scales, (torch.uint8,), 3), (T, H, D // 32))
    _shape(op, "k_scales", _on_device(op, "k_scales", k_scales, (torch.uint8,), 2), (S, D // 32))
    _shape(op, "w", _on_device(op, "w", w, (torch.bfloat16,), 2), (T, H))
    visible = _visible(op, visible, T)
    _same_device(op, q_packed=q_packed, q_scales=q_scales, k_packed=k_packed, k_scales=k_scales, w=w,
                 visible=visible)
    out = _scores_out(T, S, q_packed)
    if T and S:
        _launch_scores(q_packed, q_scales, k_packed, k_scales, w, visible, None, T, S, H, D, out,
                       fp4=True, bf16=True)
    return out


def _bf16_scores_inputs(op: str, q, k, w):
    q = _on_device(op, "q", q, (torch.bfloat16,), 3)
    k = _on_device(op, "k", k, (torch.bfloat16,), 2)
    T, H, D = q.shape
    _shape(op, "k", k, (k.shape[0], D))
    _shape(op, "w", _on_device(op, "w", w, (torch.bfloat16,), 2), (T, H))
    return q, k, w


def index_scores(q, k, w, visible):
    """Σ_h w·ReLU(q·k) of BF16 q and k, BF16 at each step (V4/V4.1), −inf past visible[t]."""
    op = "index_scores"
    q, k, w = _bf16_scores_inputs(op, q, k, w)
    (T, H, D), S = q.shape, k.shape[0]
    visible = _visible(op, visible, T)
    _same_device(op, q=q, k=k, w=w, visible=visible)
    out = _scores_out(T, S, q)
    if T and S:
        _launch_scores(q, None, k, None, w, visible, None, T, S, H, D, out, fp4=False, bf16=True)
    return out


def _scores_rows(op: str, scores) -> torch.Tensor:
    return _on_device(op, "scores", scores, (torch.float32,), 2, rows=True)


def index_topk(scores, visible, k: int, order: str):
    """The k best positions s < visible[t] of each row: order 'score' (V4, descending, ties to the
    lower position) or 'position' (V4.1, ascending); −1 after the min(k, visible[t]) valid ones."""
    op = "index_topk"
    scores = _scores_rows(op, scores)
    T, S = scores.shape
    visible = _visible(op, visible, T)
    _same_device(op, scores=scores, visible=visible)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= S:
        raise ValueError(f"{op}: k must be an int in [0, {S}] (the row width), got {k!r}")
    if order not in _ORDERS:
        raise ValueError(f"{op}: order must be one of {_ORDERS}, got {order!r}")
    if T == 0 or k == 0:
        return torch.full((T, k), -1, dtype=torch.int64, device=scores.device)
    return _topk_engine(scores, visible, k, by_score=order == "score", sync=False)


# ------------------------------------------------------------------------------------------------
# V4.1 candidate pool and re-index
# ------------------------------------------------------------------------------------------------
def candidate_list(scores, compress_lens, topk_blocks: int = 2048, block_size: int = 8):
    """The candidate source's pool as a list: the top min(topk_blocks, n_blocks) blocks of
    block_size by block maximum, the newest block forced in, ascending, −1 after the last (POOL.*)."""
    op = "candidate_list"
    scores = _scores_rows(op, scores)
    T, W = scores.shape
    lens = _visible(op, compress_lens, T, "compress_lens")
    _same_device(op, scores=scores, compress_lens=lens)
    _positive(op, "topk_blocks", topk_blocks)
    _positive(op, "block_size", block_size)
    if T == 0 or W == 0:
        return torch.full((T, 0), -1, dtype=torch.int64, device=scores.device)
    return _candidate_list(scores, lens, topk_blocks, block_size, sync=False)


def pool_positions(blocks, compress_lens, block_size: int = 8):
    """The positions of a block list below compress_lens[t]: (idx int32 [T, NB·block_size], a
    prefix of valid positions, −1 after; count int32 [T]), what reindex_topk scores."""
    op = "pool_positions"
    blocks = _on_device(op, "blocks", blocks, (torch.int64,), 2)
    lens = _visible(op, compress_lens, blocks.shape[0], "compress_lens")
    _same_device(op, blocks=blocks, compress_lens=lens)
    return _gather_blocks(blocks, lens, _positive(op, "block_size", block_size))


def reindex_topk(q, k, w, pool: tuple, topk: int):
    """A re-index layer: BF16 scores of the pool's positions only, the top-k in position order
    (ascending, −1 after the min(topk, count) valid ones)."""
    op = "reindex_topk"
    q, k, w = _bf16_scores_inputs(op, q, k, w)
    if not (isinstance(pool, tuple) and len(pool) == 2):
        raise TypeError(f"{op}: pool must be the (idx, count) pair pool_positions returns")
    idx = _on_device(op, "pool idx", pool[0], (torch.int32,), 2)
    count = _visible(op, pool[1], q.shape[0], "pool count")
    _shape(op, "pool idx", idx, (q.shape[0], idx.shape[1]))
    _same_device(op, q=q, k=k, w=w, idx=idx, count=count)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 0 <= topk <= idx.shape[1]:
        raise ValueError(f"{op}: topk must be an int in [0, {idx.shape[1]}] (the pool width), got {topk!r}")
    if q.shape[0] == 0 or topk == 0:
        return torch.full((q.shape[0], topk), -1, dtype=torch.int64, device=q.device)
    return _reindex_topk(q, k, w, (idx, count), topk, sync=False)


# ------------------------------------------------------------------------------------------------
# graph-backed calls (the module docstring)
# ------------------------------------------------------------------------------------------------
graphed = types.SimpleNamespace(
    index_scores_fp4=graph_backed(index_scores_fp4), index_scores=graph_backed(index_scores),
    index_topk=graph_backed(index_topk), candidate_list=graph_backed(candidate_list),
    pool_positions=graph_backed(pool_positions), reindex_topk=graph_backed(reindex_topk), wrap=graph_backed)
