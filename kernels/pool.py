"""Triton kernels of the V4.1 candidate pool (V41-model L583-610, select_candidate_blocks) and the re-index top-k.

    candidate_blocks(scores [T,W], compress_lens [T], topk_blocks=2048, block_size=8) -> bool [T,W]
    reindex_topk(q [T,H,D], k [S,D], w [T,H], visible [T], pool bool [T,S], topk)     -> i64 [T,topk]

candidate_blocks: one streaming kernel reduces each row to its block maxima (padding past W is
−inf) and pins the newest block, (compress_lens − 1) // block_size, to +inf when compress_lens > 0.
When a row has at most topk_blocks blocks every block is selected, so a second kernel writes the
mask of the blocks with a score above −inf.  Otherwise the radix top-k engine of kernels.indexer
runs on the block scores with −inf blocks excluded (the reference's "top-n, then drop −inf" keeps
exactly the top-min(n, #finite) finite blocks) and marks the chosen blocks' positions directly.
Equal block maxima: the lowest block index wins.

reindex_topk never scores a full row to mask it afterwards: the pool is gathered, per row and in
ascending order, into the list of positions that are in the pool and visible (<= 16384 for a real
pool): one kernel counts each chunk of 4096 positions, a second writes each chunk's positions from
the prefix of the counts before it (T x S/4096 programs each; one program per row scanning the
whole mask took ~64 dependent steps for a 262144-entry row).  Both read the mask as 64-bit words,
8 positions a load, and scan word counts, not bytes (read byte by byte, with a scan of 4096
bytes, the two took 252 µs for a [64, 1M] mask on the H200, 72 % of the re-index at 1M).  The
score kernel of kernels.indexer reads K through that list; the top-k engine selects slots of the
compact row, and the slots map back to positions, still ascending (V4.1 order).  _reindex_topk
takes the gathered pool, so the re-index layers of one decode step share one gather.

A decode step need not scan a mask at all: _candidate_list gives the chosen blocks as a list
(ascending block indices, the same top-k engine on the same block maxima) and _gather_blocks
expands it into the same gathered pool, bit for bit, in time that grows with the pool, not with
the context.  _candidate_list_of_keys goes one step further: the score kernel itself writes each
row's block maxima (kernels.indexer, BLOCK_MAX), so the [T, S] scores of the decode step's
candidate layer are never written, read back, or reduced by a launch of their own.  A re-index
layer's top-k over its pool (<= 16384 scores) runs in one program (_row_topk: the row in
registers, four 8-bit radix passes, a prefix sum into position order), one launch where the top-k
engine takes five; the same picks, off by default since the engine measured faster on the H200
(DSV4SPEC_ROW_TOPK=1 turns it on; =2: also the chunked kernel for rows of up to 65536, such as a 1M
context's 32768 block maxima).

The device functions (_candidate_blocks, _candidate_list, _gather_pool, _gather_blocks,
_reindex_topk) read nothing back to the host with sync=False (kernels.indexer's top-k engine then
decides its fallback on the device): a decode step built on them is captured whole in a CUDA
graph, as serving engines run decode.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .mode import INTERPRET
from .indexer import (_check_k, _check_lengths, _device, _float_input, _launch_scores, _need_tensor,
                      _score_inputs)
from .topk import _boundary_bin, _order_key, _pow2, _topk_engine

# Layer roles are host-side configuration, not device work: the kernels target serves impl's table so
# that a serving engine built on these kernels is checked on LAYER.* as a whole.
from ..impl.pool import layer_role

__all__ = ["candidate_blocks", "reindex_topk", "layer_role"]


@triton.jit
def _block_max_kernel(x_ptr, lens_ptr, out_ptr, W, NB, block, x_stride,
                      BLOCK_B: tl.constexpr, BS_PAD: tl.constexpr):
    """out[r, b] = max(x[r, b*block : (b+1)*block]) (−inf padding); the newest block is +inf."""
    row = tl.program_id(0)
    pb = tl.program_id(1)
    b = pb * BLOCK_B + tl.arange(0, BLOCK_B)
    j = tl.arange(0, BS_PAD)
    pos = b[:, None] * block + j[None, :]
    m = (b[:, None] < NB) & (j[None, :] < block) & (pos < W)
    x = tl.load(x_ptr + row * x_stride + pos, mask=m, other=float("-inf"))
    best = tl.max(x, axis=1)
    n = tl.load(lens_ptr + row)
    newest = tl.where(n > 0, (n - 1) // block, -1)  # n >= 1 here, so // is floor division
    best = tl.where(b == newest, float("inf"), best)
    tl.store(out_ptr + row * NB + b, best, mask=b < NB)


@triton.jit
def _finite_blocks_mask_kernel(bs_ptr, out_ptr, W, NB, block, BLOCK_W: tl.constexpr):
    """Every block selected: mark positions whose block score is above −inf."""
    row = tl.program_id(0)
    pw = tl.program_id(1)
    w = pw * BLOCK_W + tl.arange(0, BLOCK_W)
    s = tl.load(bs_ptr + row * NB + w // block, mask=w < W, other=float("-inf"))
    tl.store(out_ptr + row * W + w, (s > float("-inf")).to(tl.int8), mask=w < W)


def _positive_int(op: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {v}")
    return v


def candidate_blocks(scores, compress_lens, topk_blocks: int = 2048, block_size: int = 8) -> torch.Tensor:
    """select_candidate_blocks: bool [T,W], whole blocks of the top min(topk_blocks, n_blocks)."""
    op = "candidate_blocks"
    scores = _float_input(op, "scores", scores, 2, False)
    T, W = scores.shape
    lens = _check_lengths(op, compress_lens, T, W, "compress_lens")
    topk_blocks = _positive_int(op, "topk_blocks", topk_blocks)
    block_size = _positive_int(op, "block_size", block_size)
    reachable = torch.arange(W)[None, :] < lens[:, None]
    if bool((scores.masked_fill(reachable, float("-inf")) != float("-inf")).any()):
        raise ValueError(f"{op}: scores at positions >= compress_lens must be -inf (the causal mask)")
    if T == 0 or W == 0:
        return torch.zeros((T, W), dtype=torch.bool)
    dev = _device()
    return _candidate_blocks(scores.to(dev), lens.to(dev), topk_blocks, block_size).cpu().view(torch.bool)


def _block_scores(x: torch.Tensor, lens_d: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each row's block maxima, f32 [T, n_blocks], the newest block pinned to +inf."""
    T, W = x.shape
    n_blocks = triton.cdiv(W, block_size)
    block_scores = torch.empty((T, n_blocks), dtype=torch.float32, device=x.device)
    block_b = 64 if INTERPRET else max(16, 4096 // _pow2(block_size))
    _block_max_kernel[(T, triton.cdiv(n_blocks, block_b))](
        x, lens_d, block_scores, W, n_blocks, block_size, x.stride(0),
        BLOCK_B=block_b, BS_PAD=_pow2(block_size), num_warps=4 if INTERPRET else 8)
    return block_scores


def _candidate_blocks(x: torch.Tensor, lens_d: torch.Tensor, topk_blocks: int, block_size: int, *,
                      sync: bool = True):
    """The device part of candidate_blocks: x [T,W] f32 and lens int32 on the device -> int8 mask
    (sync: the top-k engine's, False for a CUDA graph)."""
    T, W = x.shape
    block_scores = _block_scores(x, lens_d, block_size)
    n_blocks = block_scores.shape[1]
    out = torch.zeros((T, W), dtype=torch.int8, device=x.device)
    if n_blocks <= topk_blocks:
        block_w = 1024 if INTERPRET else 4096
        _finite_blocks_mask_kernel[(T, triton.cdiv(W, block_w))](
            block_scores, out, W, n_blocks, block_size, BLOCK_W=block_w, num_warps=4 if INTERPRET else 8)
    else:
        everything = torch.full((T,), n_blocks, dtype=torch.int32, device=x.device)
        _topk_engine(block_scores, everything, topk_blocks, drop_neg_inf=True, mask_out=out,
                     mask_block=block_size, sync=sync)
    return out


def _candidate_list(x: torch.Tensor, lens_d: torch.Tensor, topk_blocks: int, block_size: int, *,
                    sync: bool = True) -> torch.Tensor:
    """The blocks _candidate_blocks marks, as a list: int64 [T, min(topk_blocks, n_blocks)], the
    chosen block indices ascending, -1 after the last.  What a decode step hands the re-index
    layers (through _gather_blocks): O(pool) to expand, where the mask is O(context) to scan."""
    return _top_blocks(_block_scores(x, lens_d, block_size), topk_blocks, sync=sync)


def _candidate_list_of_keys(q, qs, k, ks, w, vis32: torch.Tensor, topk_blocks: int, block_size: int, *,
                            fp4: bool = True, sync: bool = True) -> torch.Tensor:
    """_candidate_list of the BF16 index scores of q and k (FP4 with their scales qs, ks when fp4;
    on the device, as _launch_scores takes them), visible = compress_lens = vis32: the score kernel
    writes each row's block maxima itself (the newest block +inf), so the [T, S] scores are never
    written or read again, and one launch fewer runs."""
    T, H = q.shape[:2]
    S = k.shape[0]
    D = 2 * q.shape[2] if fp4 else q.shape[2]
    block_scores = torch.empty((T, triton.cdiv(S, block_size)), dtype=torch.float32, device=q.device)
    _launch_scores(q, qs, k, ks, w, vis32, None, T, S, H, D, block_scores, fp4=fp4, bf16=True,
                   block_max=block_size)
    return _top_blocks(block_scores, topk_blocks, sync=sync)


def _top_blocks(block_scores: torch.Tensor, topk_blocks: int, *, sync: bool) -> torch.Tensor:
    """The top min(topk_blocks, n_blocks) blocks above −inf of each row of block maxima, ascending."""
    T, n_blocks = block_scores.shape
    k = min(topk_blocks, n_blocks)
    if _row_topk_fits(block_scores, n_blocks):
        return _row_topk(block_scores, None, k, drop_neg_inf=True)
    everything = _filled(T, n_blocks, block_scores.device)
    return _topk_engine(block_scores, everything, k, drop_neg_inf=True, sync=sync)


# One-program top-k for the decode step's short rows (a re-index layer's pool of <= 16384 scores):
# the whole row is held in one program's registers, an 8-bit radix select of four passes runs on it
# there, and the picks leave in position order by a prefix sum: one launch and no intermediate in
# memory, where the top-k engine takes five.  Rows longer than _ROW_TOPK_MAX go to the engine (the
# 32768 block maxima of a 1M context would need 64 keys a thread of 16 warps: ptxas spills 14 KB
# a thread at sm_90; 16384 at 16 warps fits in 128 registers).  Used eagerly, off in a CUDA graph
# capture: on the H200 (12-02, docs/records/h200/2026-12-02-ab-decode.md) top-512 of 16384 took 75 / 75 µs
# eager / graph at 16 warps and 55 / 56 at 32, the engine 54 / 44, but the whole step eagerly 466 µs
# with it against 917 without (four launches fewer a layer: the host is the eager step's cost).
# DSV4SPEC_ROW_TOPK=0 turns it off, =1 on in a capture too; =2 also serves rows of up to _ROW_TOPK_CHUNKS chunks of
# _ROW_TOPK_MAX by the chunked kernel (the block row of a 1M context: 2 chunks read from L2 at
# each pass), which no measurement has yet shown faster than the engine (bench/ab_decode.py).
_ROW_TOPK_MAX = 16384
_ROW_TOPK_CHUNKS = 4
_ROW_TOPK_WARPS = None     # None: n_pad / 1024, within [4, 16] (the A/B sets it)


def _row_topk_mode(x: torch.Tensor) -> str:
    """DSV4SPEC_ROW_TOPK, or by default "1" eagerly and "0" inside a CUDA graph capture."""
    mode = os.environ.get("DSV4SPEC_ROW_TOPK")
    if mode is not None:
        return mode
    return "0" if x.is_cuda and torch.cuda.is_current_stream_capturing() else "1"


def _row_topk_fits(x: torch.Tensor, n: int) -> bool:
    mode = _row_topk_mode(x)
    return (mode != "0" and n <= _ROW_TOPK_MAX) or (mode == "2" and n <= _ROW_TOPK_CHUNKS * _ROW_TOPK_MAX)


@triton.jit
def _row_topk_kernel(x_ptr, n_ptr, remap_ptr, out_ptr, N, x_stride, k, out_stride, remap_stride,
                     N_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_N: tl.constexpr,
                     DROP_NEG_INF: tl.constexpr, REMAP: tl.constexpr):
    """out[r] = the positions of the top min(k, #valid) keys of row r, ascending, -1 after (valid:
    s < n[r] (N without HAS_N), and x > −inf with DROP_NEG_INF); equal keys: the lowest positions.
    Four 8-bit radix passes find the k-th key K and how many keys equal to K are taken; the chosen
    positions (remap[r, s] with REMAP) land at their prefix-sum slots."""
    row = tl.program_id(0)
    pos = tl.arange(0, N_PAD)
    n = N
    if HAS_N:
        n = tl.minimum(tl.load(n_ptr + row), N)
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + pos, mask=pos < n, other=float("-inf"))
    ok = pos < n
    if DROP_NEG_INF:
        ok = ok & (x != float("-inf"))
    key = tl.where(ok, _order_key(x), 0)   # valid keys are >= 1: key != 0 is the valid mask
    need = tl.minimum(tl.sum(ok.to(tl.int32), axis=0), k).to(tl.int64)
    rem = need
    prefix = tl.zeros((), tl.uint32)
    for p in tl.static_range(4):
        m = key != 0
        if p > 0:
            m = m & ((key >> (32 - 8 * p)) == prefix)
        hist = tl.histogram(((key >> (24 - 8 * p)) & 255).to(tl.int32), 256, mask=m)
        bnd, _, above = _boundary_bin(hist, rem, 256)
        prefix = (prefix << 8) | bnd.to(tl.uint32)
        rem -= above
    # one prefix sum of (key == K) + (key > K) << 16 counts both up to each position (N <= 2^15
    # each: no carry between the halves); the first rem keys equal to K are taken
    gt = (key > prefix) & (key != 0) & (need > 0)
    eq = (key == prefix) & (key != 0) & (need > 0)
    both = tl.cumsum(eq.to(tl.uint32) | (gt.to(tl.uint32) << 16), axis=0)
    n_eq = (both & 0xFFFF).to(tl.int64)
    chosen = gt | (eq & (n_eq <= rem))
    slot = (both >> 16).to(tl.int64) + tl.minimum(n_eq, rem) - 1
    out = out_ptr + row.to(tl.int64) * out_stride
    if REMAP:
        val = tl.load(remap_ptr + row.to(tl.int64) * remap_stride + pos, mask=chosen, other=0).to(tl.int64)
    else:
        val = pos.to(tl.int64)
    tl.store(out + slot, val, mask=chosen)
    j = tl.arange(0, K_PAD)
    tl.store(out + j, tl.full((K_PAD,), -1, tl.int64), mask=(j >= need) & (j < k))


@triton.jit
def _chunk_keys(x_ptr, row, c, n, x_stride, CHUNK: tl.constexpr, DROP_NEG_INF: tl.constexpr):
    """Positions and order keys of chunk c of a row (0: not valid; valid keys are >= 1)."""
    pos = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + pos, mask=pos < n, other=float("-inf"))
    ok = pos < n
    if DROP_NEG_INF:
        ok = ok & (x != float("-inf"))
    return pos, tl.where(ok, _order_key(x), 0)


@triton.jit
def _row_topk_chunked_kernel(x_ptr, n_ptr, remap_ptr, out_ptr, N, x_stride, k, out_stride, remap_stride,
                             CHUNK: tl.constexpr, K_PAD: tl.constexpr, HAS_N: tl.constexpr,
                             DROP_NEG_INF: tl.constexpr, REMAP: tl.constexpr):
    """_row_topk_kernel for rows longer than one program holds: each radix pass and the final
    placement read the row again, CHUNK keys at a time (from L2: the row was just written), and
    the placement carries the counts of the chunks before."""
    row = tl.program_id(0)
    n = N
    if HAS_N:
        n = tl.minimum(tl.load(n_ptr + row), N)
    n_chunks = tl.cdiv(n, CHUNK)
    rem = tl.zeros((), tl.int64)
    need = tl.zeros((), tl.int64)
    prefix = tl.zeros((), tl.uint32)
    for p in tl.static_range(4):
        hist = tl.zeros((256,), tl.int32)
        c = 0
        while c < n_chunks:   # (a while: the interpreter cannot range over a run-time bound)
            key = _chunk_keys(x_ptr, row, c, n, x_stride, CHUNK, DROP_NEG_INF)[1]
            m = key != 0
            if p > 0:
                m = m & ((key >> (32 - 8 * p)) == prefix)
            hist += tl.histogram(((key >> (24 - 8 * p)) & 255).to(tl.int32), 256, mask=m)
            c += 1
        if p == 0:
            need = tl.minimum(tl.sum(hist, axis=0), k).to(tl.int64)
            rem = need
        bnd, tied, above = _boundary_bin(hist, rem, 256)
        prefix = (prefix << 8) | bnd.to(tl.uint32)
        rem -= above
    out = out_ptr + row.to(tl.int64) * out_stride
    gt_before = tl.zeros((), tl.int64)
    eq_before = tl.zeros((), tl.int64)
    c = 0
    while c < n_chunks:
        pos, key = _chunk_keys(x_ptr, row, c, n, x_stride, CHUNK, DROP_NEG_INF)
        gt = (key > prefix) & (key != 0) & (need > 0)
        eq = (key == prefix) & (key != 0) & (need > 0)
        both = tl.cumsum(eq.to(tl.uint32) | (gt.to(tl.uint32) << 16), axis=0)
        n_eq = eq_before + (both & 0xFFFF).to(tl.int64)
        chosen = gt | (eq & (n_eq <= rem))
        slot = gt_before + (both >> 16).to(tl.int64) + tl.minimum(n_eq, rem) - 1
        if REMAP:
            val = tl.load(remap_ptr + row.to(tl.int64) * remap_stride + pos, mask=chosen, other=0).to(tl.int64)
        else:
            val = pos.to(tl.int64)
        tl.store(out + slot, val, mask=chosen)
        gt_before += tl.sum(gt.to(tl.int64), axis=0)
        eq_before += tl.sum(eq.to(tl.int64), axis=0)
        c += 1
    j = tl.arange(0, K_PAD)
    tl.store(out + j, tl.full((K_PAD,), -1, tl.int64), mask=(j >= need) & (j < k))


def _row_topk(x: torch.Tensor, n_valid: torch.Tensor | None, k: int, *, drop_neg_inf: bool = False,
              remap: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """_topk_engine(x, n_valid, k, by_score=False, drop_neg_inf, remap): one program a row, one
    launch, nothing read back (int64 [R, k]); rows longer than chunk (default _ROW_TOPK_MAX; a
    power of two, tests pass small ones) by the chunked kernel."""
    R, N = x.shape
    out = torch.empty((R, k), dtype=torch.int64, device=x.device)
    chunk = chunk or _ROW_TOPK_MAX
    n_pad = min(_pow2(N, 16), chunk)
    warps = 4 if INTERPRET else _ROW_TOPK_WARPS or max(4, min(16, n_pad // 1024))
    args = (x, x if n_valid is None else n_valid, x if remap is None else remap, out, N, x.stride(0), k,
            out.stride(0), 0 if remap is None else remap.stride(0))
    flags = dict(K_PAD=_pow2(k), HAS_N=n_valid is not None, DROP_NEG_INF=drop_neg_inf, REMAP=remap is not None,
                 num_warps=warps)
    if N <= chunk:
        _row_topk_kernel[(R,)](*args, N_PAD=n_pad, **flags)
    else:
        _row_topk_chunked_kernel[(R,)](*args, CHUNK=chunk, **flags)
    return out


_FILLED: dict = {}   # (device, rows, value) -> a read-only int32 [rows] of value (no fill launch a call)
_FILLED_CAPTURED: dict = {}   # those a CUDA graph captured: kept while the process lives (a replay reads them)


def _filled(rows: int, value: int, device: torch.device) -> torch.Tensor:
    """int32 [rows] of value, made once per (device, rows, value) outside a CUDA graph capture (a
    tensor filled inside one holds its value only once the graph replays)."""
    key = (str(device), rows, value)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if key in _FILLED:
        if capturing:
            _FILLED_CAPTURED[key] = _FILLED[key]
        return _FILLED[key]
    t = torch.full((rows,), value, dtype=torch.int32, device=device)
    if not capturing:
        if len(_FILLED) >= 64:
            _FILLED.clear()
        _FILLED[key] = t
    return t


@triton.jit
def _gather_blocks_kernel(blocks_ptr, vis_ptr, idx_ptr, count_ptr, NB, BLOCK_SIZE: tl.constexpr,
                          BS_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """Blocks [c*CHUNK, (c+1)*CHUNK) of row r's list to their positions below visible[r], slot
    j*BLOCK_SIZE + i for position i of the row's j-th block, -1 elsewhere; program c = 0 writes
    count[r], the row's positions below visible, from the whole list (distinct blocks: each adds
    min(max(visible - first, 0), BLOCK_SIZE)), so count needs no zeroing and no atomics.
    Ascending blocks, -1 after the last, make the valid slots a prefix of the row."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    j = c * CHUNK + tl.arange(0, CHUNK)
    i = tl.arange(0, BS_PAD)
    vis = tl.load(vis_ptr + row)
    block = tl.load(blocks_ptr + row.to(tl.int64) * NB + j, mask=j < NB, other=-1)
    pos = block[:, None] * BLOCK_SIZE + i[None, :]
    in_row = (j[:, None] < NB) & (i[None, :] < BLOCK_SIZE)
    ok = in_row & (block[:, None] >= 0) & (pos < vis)
    slot = j[:, None] * BLOCK_SIZE + i[None, :]
    tl.store(idx_ptr + row.to(tl.int64) * NB * BLOCK_SIZE + slot, tl.where(ok, pos, -1).to(tl.int32),
             mask=in_row)
    if c == 0:
        total = tl.zeros((CHUNK,), tl.int32)
        start = 0
        while start < NB:   # (a while: the interpreter cannot range over a run-time bound)
            jj = start + tl.arange(0, CHUNK)
            b = tl.load(blocks_ptr + row.to(tl.int64) * NB + jj, mask=jj < NB, other=-1)
            seen = tl.minimum(tl.maximum(vis - b * BLOCK_SIZE, 0), BLOCK_SIZE)
            total += tl.where(b >= 0, seen, 0).to(tl.int32)
            start += CHUNK
        tl.store(count_ptr + row, tl.sum(total, axis=0))


def _gather_blocks(blocks: torch.Tensor, vis32: torch.Tensor, block_size: int) -> tuple:
    """_gather_pool's (idx int32 [T, NB*block_size], count int32 [T]) from a list of blocks
    (int64 [T,NB], ascending, -1 after the last, as _candidate_list gives them), not a mask."""
    T, nb = blocks.shape
    idx = torch.empty((T, nb * block_size), dtype=torch.int32, device=blocks.device)
    count = torch.empty((T,), dtype=torch.int32, device=blocks.device)
    chunk = 64 if INTERPRET else 256
    _gather_blocks_kernel[(T, triton.cdiv(nb, chunk))](blocks, vis32, idx, count, nb, BLOCK_SIZE=block_size,
                                                      BS_PAD=_pow2(block_size), CHUNK=chunk, num_warps=4)
    return idx, count


_LOW7 = tl.constexpr(0x7F7F7F7F7F7F7F7F)   # the low 7 bits of each byte of a 64-bit word
_HIGH = tl.constexpr(0x8080808080808080)   # the top bit of each byte
_BYTE_ONES = tl.constexpr(0x0101010101010101)


@triton.jit
def _pool_words(words_ptr, vis_ptr, row, c, S, row_words, WORDS: tl.constexpr):
    """Chunk c of a row's pool mask read as 64-bit words of 8 positions (8 bytes, one load each):
    per word, its first position, its in-pool flags (bit 8b+7 set when byte b is nonzero and its
    position is visible, s < min(visible, S)) and their count."""
    n = tl.minimum(tl.load(vis_ptr + row), S)
    word = c * WORDS + tl.arange(0, WORDS)
    first = word * 8
    w = tl.load(words_ptr + row.to(tl.int64) * row_words + word, mask=word < row_words, other=0)
    w = w.to(tl.uint64, bitcast=True)
    nonzero = (((w & _LOW7) + _LOW7) | w) & _HIGH  # no carry crosses a byte: 0x7F + 0x7F < 0x100
    seen = tl.minimum(tl.maximum(n - first, 0), 8)  # this word's visible bytes
    low_bytes = (tl.full((WORDS,), 1, tl.uint64) << (8 * tl.minimum(seen, 7)).to(tl.uint64)) - 1
    flags = tl.where(seen == 8, nonzero, nonzero & low_bytes)
    count = (((flags >> 7) * _BYTE_ONES) >> 56).to(tl.int32)  # the byte sum lands in the top byte
    return first, flags, count


@triton.jit
def _pool_count_kernel(words_ptr, vis_ptr, counts_ptr, S, row_words, NC, WORDS: tl.constexpr):
    """counts[r, c] = the pool positions s < visible[r] of chunk c (WORDS words of 8 positions)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    _, _, count = _pool_words(words_ptr, vis_ptr, row, c, S, row_words, WORDS)
    tl.store(counts_ptr + row * NC + c, tl.sum(count, axis=0))


@triton.jit
def _gather_kernel(words_ptr, vis_ptr, counts_ptr, idx_ptr, count_ptr, S, row_words, NC, width,
                   NC_PAD: tl.constexpr, WORDS: tl.constexpr):
    """Chunk c's pool positions, ascending, into idx[r] from the slot that the chunks before it
    fill (the exclusive prefix of counts); chunk 0 writes the row's total.  The prefix runs over
    words, then each word writes its up to 8 positions byte by byte."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    ci = tl.arange(0, NC_PAD)
    counts = tl.load(counts_ptr + row * NC + ci, mask=ci < NC, other=0)
    before = tl.sum(tl.where(ci < c, counts, 0), axis=0)
    first, flags, count = _pool_words(words_ptr, vis_ptr, row, c, S, row_words, WORDS)
    slot = before + tl.cumsum(count, axis=0) - count
    out = idx_ptr + row.to(tl.int64) * width
    for b in tl.static_range(8):
        bit = ((flags >> (8 * b + 7)) & 1).to(tl.int32)
        tl.store(out + slot, first + b, mask=(bit != 0) & (slot < width))
        slot += bit
    if c == 0:
        tl.store(count_ptr + row, tl.sum(counts, axis=0))


_GATHER_BLOCK = 4096  # GPU: positions a program of the count and gather kernels reads
_GATHER_WARPS = 4


def _gather_pool(pool_u8: torch.Tensor, vis32: torch.Tensor, width: int, block: int | None = None) -> tuple:
    """Per row, the positions s < visible[t] with pool[t,s] != 0, in ascending order, -1 padded
    to width (>= every row's count): (idx int32 [T,width], count int32 [T]).  The mask is read as
    64-bit words (a row padded to whole words if needed); chunks of block positions are counted,
    then each chunk writes from its prefix: two launches of T x S/block programs (block, a multiple
    of 8, overrides the default for tests)."""
    T, S = pool_u8.shape
    dev = pool_u8.device
    if S % 8 or pool_u8.data_ptr() % 8 or pool_u8.stride() != (S, 1):   # a new, aligned copy
        padded = torch.zeros((T, S + (-S % 8)), dtype=pool_u8.dtype, device=dev)
        padded[:, :S] = pool_u8
        pool_u8 = padded
    words = pool_u8.view(torch.int64)
    row_words = words.shape[1]
    block = block or (256 if INTERPRET else _GATHER_BLOCK)
    nc = triton.cdiv(S, block)
    counts = torch.empty((T, nc), dtype=torch.int32, device=dev)
    idx = torch.full((T, width), -1, dtype=torch.int32, device=dev)
    count = torch.empty((T,), dtype=torch.int32, device=dev)
    warps = 4 if INTERPRET else _GATHER_WARPS
    _pool_count_kernel[(T, nc)](words, vis32, counts, S, row_words, nc, WORDS=block // 8, num_warps=warps)
    _gather_kernel[(T, nc)](words, vis32, counts, idx, count, S, row_words, nc, width, NC_PAD=_pow2(nc),
                            WORDS=block // 8, num_warps=warps)
    return idx, count


def reindex_topk(q, k, w, visible, pool, topk: int) -> torch.Tensor:
    """V4.1 re-index: BF16 scores masked to the pool, top-k in position order (int64 [T,topk]).

    Only the pool's visible positions are scored: they are gathered per row (ascending) and the
    score kernel reads K through that list; the row top-k then runs on <= |pool| columns.
    """
    op = "reindex_topk"
    q, k, w, vis = _score_inputs(op, q, k, w, visible, True)
    T, S = q.shape[0], k.shape[0]
    pool = _need_tensor("pool", op, pool, 2, (torch.bool,))
    if tuple(pool.shape) != (T, S):
        raise ValueError(f"{op}: pool has shape {tuple(pool.shape)}, expected the scores' [T, S] = [{T}, {S}]")
    topk = _check_k(op, topk, S, "topk")
    if T == 0 or topk == 0 or S == 0:
        return torch.full((T, topk), -1, dtype=torch.int64)
    reach = pool & (torch.arange(S)[None, :] < vis[:, None])
    width = _pow2(int(reach.sum(1).max()), 16)
    dev = _device()
    gathered = _gather_pool(pool.contiguous().view(torch.uint8).to(dev), vis.to(dev), width)
    return _reindex_topk(q.to(dev), k.to(dev), w.to(dev), gathered, topk).cpu()


def _reindex_topk(q, k, w, gathered: tuple, topk: int, *, sync: bool = True) -> torch.Tensor:
    """The device part of reindex_topk on a pool gathered by _gather_pool (idx [T,width], count
    [T]): the re-index layers of one step share one gather.  sync: the top-k engine's, False for
    a CUDA graph."""
    T, H, D = q.shape
    idx, count = gathered
    width = idx.shape[1]
    pscores = torch.empty((T, width), dtype=torch.float32, device=q.device)
    _launch_scores(q, None, k, None, w, count, idx, T, width, H, D, pscores, fp4=False, bf16=True)
    if _row_topk_fits(pscores, width):
        return _row_topk(pscores, count, topk, remap=idx)
    return _topk_engine(pscores, count, topk, by_score=False, remap=idx, sync=sync)
