"""The device API (dsv4spec.kernels.device) as torch custom operators, namespace `dsv4spec`.

    import dsv4spec.kernels.ops                     # registers them
    packed, scales = torch.ops.dsv4spec.fp4_e8m0_quantize(k_bf16)
    fn = torch.compile(decode_step, fullgraph=True)  # traces through them

Each operator calls the device function of the same name (same checks, same bits, no host
read-back) and has a fake implementation that gives its outputs' shapes and dtypes from the
inputs' alone, so torch.compile and torch.export trace a function calling them without running
the kernels.  The signatures are device.py's, with two changes that the operator schema needs:
reindex_topk takes the pool as two tensors (pool_idx, pool_count: what pool_positions returns),
and the defaults are spelled out.  The outputs are new tensors (no operator mutates or aliases
its inputs).  Calling an operator costs the dispatcher's overhead on the host on top of the
direct call (bench/bench_peers.py measures it: its `ops` rows); inside a compiled graph replayed
from a CUDA graph (torch.compile(mode="reduce-overhead")) the host cost is gone.
"""
from __future__ import annotations

import torch

from . import device as D

NAMESPACE = "dsv4spec"
_U8, _F32, _I32, _I64 = torch.uint8, torch.float32, torch.int32, torch.int64
# Defined through a Library with one kernel per device type, not torch.library.custom_op: the
# latter's Python wrapper (autograd, dispatch) adds some 50 µs per call on a loaded host, this path
# about 10 µs (bench/bench_peers.py's ops rows measure it on the GPU's host).
_LIB = torch.library.Library(NAMESPACE, "DEF")


def _op(name: str, fake):
    """Define dsv4spec::<name> from the typed function below (its schema inferred from the
    annotations), its kernel for CUDA and CPU tensors (the interpreter), and `fake`."""
    def register(fn):
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=()))
        for key in ("CUDA", "CPU"):
            _LIB.impl(name, fn, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
        op = getattr(torch.ops.dsv4spec, name)
        op.__doc__ = getattr(D, name).__doc__
        return op
    return register


def _new(like: torch.Tensor, shape, dtype):
    return like.new_empty(tuple(shape), dtype=dtype)


def _codec_fake(block: int):
    def fake(x):
        lead, n = tuple(x.shape[:-1]), x.shape[-1]
        return _new(x, lead + (n // 2,), _U8), _new(x, lead + (n // block,), _U8)
    return fake


def _dequantize_fake(per_byte: int):
    def fake(codes, scales, out_dtype=torch.float32):
        return _new(codes, tuple(codes.shape[:-1]) + (per_byte * codes.shape[-1],), out_dtype)
    return fake


# ------------------------------------------------------------------------------------------------
# codecs
# ------------------------------------------------------------------------------------------------
@_op("fp4_e4m3_quantize", _codec_fake(16))
def fp4_e4m3_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return D.fp4_e4m3_quantize(x)


@_op("fp4_e8m0_quantize", _codec_fake(32))
def fp4_e8m0_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return D.fp4_e8m0_quantize(x)


@_op("fp4_e4m3_dequantize", _dequantize_fake(2))
def fp4_e4m3_dequantize(packed: torch.Tensor, scales: torch.Tensor,
                        out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return D.fp4_e4m3_dequantize(packed, scales, out_dtype)


@_op("fp4_e8m0_dequantize", _dequantize_fake(2))
def fp4_e8m0_dequantize(packed: torch.Tensor, scales: torch.Tensor,
                        out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return D.fp4_e8m0_dequantize(packed, scales, out_dtype)


def _fp8_quantize_fake(x, block):
    return _new(x, x.shape, _U8), _new(x, tuple(x.shape[:-1]) + (x.shape[-1] // block,), _U8)


@_op("fp8_quantize", _fp8_quantize_fake)
def fp8_quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    return D.fp8_quantize(x, block)


@_op("fp8_dequantize", lambda q, scales, block, out_dtype=torch.float32: _new(q, q.shape, out_dtype))
def fp8_dequantize(q: torch.Tensor, scales: torch.Tensor, block: int,
                   out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return D.fp8_dequantize(q, scales, block, out_dtype)


@_op("fp8_qdq", lambda x, block: _new(x, x.shape, _F32))
def fp8_qdq(x: torch.Tensor, block: int) -> torch.Tensor:
    return D.fp8_qdq(x, block)


# ------------------------------------------------------------------------------------------------
# indexer
# ------------------------------------------------------------------------------------------------
@_op("index_scores_fp4", lambda qp, qs, kp, ks, w, visible: _new(qp, (qp.shape[0], kp.shape[0]), _F32))
def index_scores_fp4(q_packed: torch.Tensor, q_scales: torch.Tensor, k_packed: torch.Tensor,
                     k_scales: torch.Tensor, w: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return D.index_scores_fp4(q_packed, q_scales, k_packed, k_scales, w, visible)


@_op("index_scores", lambda q, k, w, visible: _new(q, (q.shape[0], k.shape[0]), _F32))
def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return D.index_scores(q, k, w, visible)


@_op("index_topk", lambda scores, visible, k, order: _new(scores, (scores.shape[0], k), _I64))
def index_topk(scores: torch.Tensor, visible: torch.Tensor, k: int, order: str) -> torch.Tensor:
    return D.index_topk(scores, visible, k, order)


# ------------------------------------------------------------------------------------------------
# V4.1 candidate pool and re-index
# ------------------------------------------------------------------------------------------------
def _candidate_list_fake(scores, compress_lens, topk_blocks=2048, block_size=8):
    T, W = scores.shape
    n_blocks = (W + block_size - 1) // block_size
    return _new(scores, (T, torch.sym_min(topk_blocks, n_blocks) if T and W else 0), _I64)


@_op("candidate_list", _candidate_list_fake)
def candidate_list(scores: torch.Tensor, compress_lens: torch.Tensor, topk_blocks: int = 2048,
                   block_size: int = 8) -> torch.Tensor:
    return D.candidate_list(scores, compress_lens, topk_blocks, block_size)


def _pool_positions_fake(blocks, compress_lens, block_size=8):
    T, NB = blocks.shape
    return _new(blocks, (T, NB * block_size), _I32), _new(blocks, (T,), _I32)


@_op("pool_positions", _pool_positions_fake)
def pool_positions(blocks: torch.Tensor, compress_lens: torch.Tensor,
                   block_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return D.pool_positions(blocks, compress_lens, block_size)


@_op("reindex_topk", lambda q, k, w, pool_idx, pool_count, topk: _new(q, (q.shape[0], topk), _I64))
def reindex_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, pool_idx: torch.Tensor,
                 pool_count: torch.Tensor, topk: int) -> torch.Tensor:
    return D.reindex_topk(q, k, w, (pool_idx, pool_count), topk)
