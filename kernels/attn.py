"""Triton kernel for the attn family: sparse attention over index lists (prefill and decode).

One program owns one token, BLOCK_H = 16 heads (fewer are padded with zero q, as V4's launcher
does) and a slice of BLOCK_DV output channels.  It walks the token's list in blocks of 64 entries
in list order, as the official kernel: gathers the 64 KV rows (−1 read as 0), scores them on the
tensor cores (BF16 operands, fp32 accumulation) times the fp32 scale (−inf at −1), updates the
running max (−inf for V4, −1e30 for V4.1), adds the fp32 probabilities to the sum and their BF16
roundings times the rows' output slice to the fp32 accumulator, both rescaled by exp(old − new).
Then the sink in the denominator, the division and the BF16 output.

Splitting the output channels over programs (BLOCK_DV < D, chosen when tokens × head groups are
too few to fill the GPU, i.e. at decode) repeats the scores in every slice program; they are the
same computation on the same data, so the running maxima, and hence the probabilities' roundings,
are those of the unsplit kernel (only the second product's tile shape changes).  The list is never split (that would round against other maxima: the
attn_order=split variant).

Two further launch paths (chosen by shape in `choose_path`; `launch(path=...)` forces one):

- "wide": the same kernel with BLOCK_H = 32 or 64 heads a program, so that each gathered KV row
  serves more heads (fewer re-gathers of the same rows at larger T).
- "split" / "split_fused": split-K with the EXACT running max.  The running max the official
  kernel holds after block j is the prefix max of init and the block maxima of blocks 0..j, so a
  first launch computes every (token, head group, block)'s scores (stored, fp32) and block maxima
  in parallel; a second, per chunk of CHUNK consecutive blocks, starts from the prefix max of the
  blocks before the chunk and runs the official online softmax over its blocks (the same maxima,
  hence the same BF16 roundings of every probability), writing its fp32 numerator, sum and end
  max; the combine rescales each chunk's partials by exp(m_end − M) (M = the last chunk's end max
  = the official final max) and sums them in chunk order: only the fp32 rescale order differs from
  the sequential kernel, within ATTN's tolerance (the rescales' term).  "split" combines in a third
  launch; "split_fused" lets the last chunk program of each (token, head group, channel slice) to
  finish combine, found by an atomic counter that it resets to 0 (no host sync, graph-capturable;
  one launch at a time per device: the counters are shared).

Exactness: BF16 roundings by the quant kernels' integer arithmetic (`_bf16_round`, identical on
the GPU and in the interpreter); the fp32 dots, exp and division are within ATTN's tolerance.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..impl.attn import check_attention_inputs
from ..spec import attn as spec
from .quant import INTERPRETED, _bf16_round, _device

__all__ = ["sparse_attention"]

BLOCK_H = 16
SM_TARGET = 128            # programs below which the output channels are split (decode)
STAGES = 2                 # software pipelining of the list's blocks on the GPU
PATHS = ("serial", "wide", "split", "split_fused")
FORCE_PATH = None          # a path name: every launch takes it (tests and benchmarks)
# The A/B of 2026-12-02 (docs/records/h200/2026-12-02-ab-attn.md): split-K is faster only replayed from a
# CUDA graph at T = 1 (20 µs against 34), slower eagerly (its three launches) and at T ≥ 32; the
# serial path with 4 warps is 0.90× at prefill 1024.  So: serial by default, split on request.
SPLIT_MAX_TOKENS = 0       # auto: split-K at T ≤ this, else the serial path
PREFILL_TOKENS = 1024      # from here on the serial path runs 4 warps a program
CHUNK_MAX_DV = 256         # the chunk kernel's default channel slice at most (sm_90: 512 spills)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a·b with fp32 accumulation: BF16 tensor-core operands, or (IEEE: the interpreter, whose BF16
    dot multiplies raw bits) the same BF16 values as fp32 operands."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _block_scores(q, start, t, idx_ptr, kv_ptr, K, scale, dims, D: tl.constexpr, BLOCK_K: tl.constexpr,
                  IEEE: tl.constexpr):
    """The block of list entries from `start`: the gathered rows (−1 read as 0) and their fp32
    scores × scale, −inf at −1 and past K."""
    entry = start + tl.arange(0, BLOCK_K)
    idx = tl.load(idx_ptr + t * K + entry, mask=entry < K, other=-1)
    valid = idx != -1
    row = tl.where(valid, idx, 0).to(tl.int64)
    keys = tl.load(kv_ptr + row[:, None] * D + dims[None, :], mask=valid[:, None], other=0.0)
    s = _dot(q, tl.trans(keys), IEEE) * scale
    return tl.where(valid[None, :], s, float("-inf")), keys, row, valid, entry


@triton.jit
def _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D: tl.constexpr,
           BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, IEEE: tl.constexpr):
    """One block of 64 list entries: gather, score, running max, both sums rescaled."""
    s, keys, row, valid, entry = _block_scores(q, start, t, idx_ptr, kv_ptr, K, scale, dims, D, BLOCK_K, IEEE)
    m_new = tl.maximum(m, tl.max(s, 1))
    rescale = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    total = total * rescale + tl.sum(p, 1)
    if BLOCK_DV == D:
        values = keys                                 # K = V: the same rows
    else:
        values = tl.load(kv_ptr + row[:, None] * D + dv[None, :], mask=valid[:, None], other=0.0)
    acc = acc * rescale[:, None] + _dot(_bf16_round(p).to(tl.bfloat16), values, IEEE)
    return acc, total, m_new


@triton.jit
def _sparse_attention_kernel(q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr, H, K, scale, init,
                             D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                             BLOCK_DV: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    dims = tl.arange(0, D)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + (t * H + heads)[:, None] * D + dims[None, :], mask=head_ok[:, None], other=0.0)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    m = tl.full((BLOCK_H,), 0.0, tl.float32) + init
    if STAGES > 0:
        for start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc, total, m = _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D, BLOCK_K,
                                   BLOCK_DV, IEEE)
    else:                                  # the interpreter cannot range over run-time scalars
        start = 0
        while start < K:
            acc, total, m = _block(q, acc, total, m, start, t, idx_ptr, kv_ptr, K, scale, dims, dv, D, BLOCK_K,
                                   BLOCK_DV, IEEE)
            start += BLOCK_K
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
    total = total + tl.exp(sink - m)
    o = _bf16_round(acc / total[:, None])
    tl.store(out_ptr + (t * H + heads)[:, None] * D + dv[None, :], o, mask=head_ok[:, None])


# ------------------------------------------------------------------------------------------------
# split-K with the exact running max
# ------------------------------------------------------------------------------------------------
@triton.jit
def _attn_scores_kernel(q_ptr, kv_ptr, idx_ptr, s_ptr, bmax_ptr, H, K, NB, scale, D: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    """Program (token·head group, block j): the block's fp32 scores s[t, h, 64j ..] (−inf at −1 and
    past K) and their max bmax[t, h, j]."""
    groups = tl.cdiv(H, BLOCK_H)
    t = (tl.program_id(0) // groups).to(tl.int64)
    heads = (tl.program_id(0) % groups) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    j = tl.program_id(1)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + (t * H + heads)[:, None] * D + dims[None, :], mask=head_ok[:, None], other=0.0)
    s, keys, row, valid, entry = _block_scores(q, j * BLOCK_K, t, idx_ptr, kv_ptr, K, scale, dims, D, BLOCK_K, IEEE)
    th = t * H + heads
    tl.store(s_ptr + th[:, None] * (NB * BLOCK_K) + entry[None, :], s, mask=head_ok[:, None])
    tl.store(bmax_ptr + th * NB + j, tl.max(s, 1), mask=head_ok)


@triton.jit
def _chunk_block(acc, total, m, j, t, th, head_ok, idx_ptr, kv_ptr, s_ptr, bmax_ptr, K, NB, D: tl.constexpr,
                 BLOCK_K: tl.constexpr, dv, IEEE: tl.constexpr):
    """Block j of the official online softmax, its scores and block max read back from the first launch."""
    m_new = tl.maximum(m, tl.load(bmax_ptr + th * NB + j, mask=head_ok, other=0.0))
    entry = j * BLOCK_K + tl.arange(0, BLOCK_K)
    s = tl.load(s_ptr + th[:, None] * (NB * BLOCK_K) + entry[None, :], mask=head_ok[:, None], other=0.0)
    rescale = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    total = total * rescale + tl.sum(p, 1)
    idx = tl.load(idx_ptr + t * K + entry, mask=entry < K, other=-1)
    valid = idx != -1
    row = tl.where(valid, idx, 0).to(tl.int64)
    values = tl.load(kv_ptr + row[:, None] * D + dv[None, :], mask=valid[:, None], other=0.0)
    acc = acc * rescale[:, None] + _dot(_bf16_round(p).to(tl.bfloat16), values, IEEE)
    return acc, total, m_new


@triton.jit
def _combine_chunk(acc, total, c, M, part_ptr, psum_ptr, pmax_ptr, th, head_ok, NC, D: tl.constexpr, dv):
    """Chunk c's partials rescaled by exp(m_c − M) and added (.cg: written by other SMs)."""
    w = tl.exp(tl.load(pmax_ptr + th * NC + c, mask=head_ok, other=0.0, cache_modifier=".cg") - M)
    total = total + tl.load(psum_ptr + th * NC + c, mask=head_ok, other=0.0, cache_modifier=".cg") * w
    part = tl.load(part_ptr + (th * NC + c)[:, None] * D + dv[None, :], mask=head_ok[:, None], other=0.0,
                   cache_modifier=".cg")
    return acc + part * w[:, None], total


@triton.jit
def _combine(part_ptr, psum_ptr, pmax_ptr, sink_ptr, out_ptr, th, heads, head_ok, NC, D: tl.constexpr,
             dv, BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr, STAGES: tl.constexpr):
    """o = bf16(Σ_c N_c·exp(m_c − M) / (Σ_c L_c·exp(m_c − M) + exp(sink − M))), chunks in list order;
    M = the last chunk's end max (the official final running max)."""
    M = tl.load(pmax_ptr + th * NC + NC - 1, mask=head_ok, other=0.0, cache_modifier=".cg")
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if STAGES > 0:
        for c in tl.range(0, NC, num_stages=STAGES):
            acc, total = _combine_chunk(acc, total, c, M, part_ptr, psum_ptr, pmax_ptr, th, head_ok, NC, D, dv)
    else:                                  # the interpreter cannot range over run-time scalars
        c = 0
        while c < NC:
            acc, total = _combine_chunk(acc, total, c, M, part_ptr, psum_ptr, pmax_ptr, th, head_ok, NC, D, dv)
            c += 1
    total = total + tl.exp(tl.load(sink_ptr + heads, mask=head_ok, other=0.0) - M)
    o = _bf16_round(acc / total[:, None])
    tl.store(out_ptr + th[:, None] * D + dv[None, :], o, mask=head_ok[:, None])


@triton.jit
def _chunk_kernel(kv_ptr, idx_ptr, s_ptr, bmax_ptr, part_ptr, psum_ptr, pmax_ptr, sink_ptr, out_ptr, count_ptr,
                  H, K, NB, NC, init, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, NB_P2: tl.constexpr, IEEE: tl.constexpr,
                  FUSED: tl.constexpr, STAGES: tl.constexpr):
    """Program (token·head group, chunk c, channel slice): blocks CHUNK·c .. of the online softmax,
    starting from the exact running max before them; FUSED: the last chunk to finish combines."""
    groups = tl.cdiv(H, BLOCK_H)
    t = (tl.program_id(0) // groups).to(tl.int64)
    heads = (tl.program_id(0) % groups) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    th = t * H + heads
    c = tl.program_id(1)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    first = c * CHUNK
    last = tl.minimum(first + CHUNK, NB)
    before = tl.arange(0, NB_P2)                  # the running max the official kernel holds here
    maxima = tl.load(bmax_ptr + th[:, None] * NB + before[None, :], mask=head_ok[:, None] & (before < first)[None, :],
                     other=float("-inf"))
    m = tl.maximum(tl.full((BLOCK_H,), 0.0, tl.float32) + init, tl.max(maxima, 1))
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if STAGES > 0:
        for j in tl.range(first, last, num_stages=STAGES):
            acc, total, m = _chunk_block(acc, total, m, j, t, th, head_ok, idx_ptr, kv_ptr, s_ptr, bmax_ptr, K, NB,
                                         D, BLOCK_K, dv, IEEE)
    else:                                  # the interpreter cannot range over run-time scalars
        j = first
        while j < last:
            acc, total, m = _chunk_block(acc, total, m, j, t, th, head_ok, idx_ptr, kv_ptr, s_ptr, bmax_ptr, K, NB,
                                         D, BLOCK_K, dv, IEEE)
            j += 1
    tl.store(part_ptr + (th * NC + c)[:, None] * D + dv[None, :], acc, mask=head_ok[:, None])
    tl.store(psum_ptr + th * NC + c, total, mask=head_ok)
    tl.store(pmax_ptr + th * NC + c, m, mask=head_ok)
    if FUSED:
        tl.debug_barrier()                 # every thread's partials stored before the count
        counter = count_ptr + tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)
        done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if done == NC - 1:                 # the last chunk of this (token, heads, slice): combine
            _combine(part_ptr, psum_ptr, pmax_ptr, sink_ptr, out_ptr, th, heads, head_ok, NC, D, dv, BLOCK_H,
                     BLOCK_DV, STAGES)
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _combine_kernel(part_ptr, psum_ptr, pmax_ptr, sink_ptr, out_ptr, H, NC, D: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr, STAGES: tl.constexpr):
    groups = tl.cdiv(H, BLOCK_H)
    t = (tl.program_id(0) // groups).to(tl.int64)
    heads = (tl.program_id(0) % groups) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    _combine(part_ptr, psum_ptr, pmax_ptr, sink_ptr, out_ptr, t * H + heads, heads, head_ok, NC, D, dv, BLOCK_H,
             BLOCK_DV, STAGES)


def _slice(T: int, groups: int, D: int, pieces: int = 1) -> int:
    """Output channels per program: all of them unless too few programs would run (decode)."""
    dv = D
    while T * groups * pieces * (D // dv) < SM_TARGET and dv > 64 and not INTERPRETED:
        dv //= 2
    return dv


def choose_path(T: int, H: int, D: int, K: int) -> str:
    """The launch path for a shape: split-K at T ≤ SPLIT_MAX_TOKENS, else the serial kernel;
    FORCE_PATH overrides (path="split_fused", chunk=2 is the fastest at T = 1 in a CUDA graph)."""
    if FORCE_PATH is not None:
        return FORCE_PATH
    return "split_fused" if T <= SPLIT_MAX_TOKENS and K > spec.BLOCK else "serial"


def sparse_attention(q, kv, sink, indices, scale, *, model: str) -> torch.Tensor:
    """The launcher: CPU tensors in and out (the kernel on CUDA, or in the interpreter)."""
    op = "sparse_attention"
    try:
        init = spec.running_max_init(spec.model_of(model))
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None
    q, kv, sink, indices, scale = check_attention_inputs(op, q, kv, sink, indices, scale)
    out = launch(*(x.to(_device()) for x in (q.bfloat16(), kv.bfloat16(), sink, indices.to(torch.int32))),
                 float(scale), init)
    return out.float().cpu()


def _warps(D: int) -> int:
    return 4 if D <= 128 else 8


def config(D: int, dv: int, block_h: int = BLOCK_H, warps: int | None = None, stages: int = STAGES) -> dict:
    """The compile-time arguments of one serial or wide launch (the sm_90 compile test builds these)."""
    return dict(D=D, BLOCK_H=block_h, BLOCK_K=spec.BLOCK, BLOCK_DV=dv, IEEE=INTERPRETED,
                STAGES=0 if INTERPRETED else stages, num_warps=warps or _warps(D))


def scores_config(D: int, block_h: int = BLOCK_H, warps: int | None = None) -> dict:
    """The compile-time arguments of the split path's first launch."""
    return dict(D=D, BLOCK_H=block_h, BLOCK_K=spec.BLOCK, IEEE=INTERPRETED, num_warps=warps or _warps(D))


def chunk_config(D: int, dv: int, chunk: int, fused: bool, block_h: int = BLOCK_H, warps: int | None = None,
                 blocks: int = 10) -> dict:
    """The compile-time arguments of the split path's chunk launch (blocks: of the list)."""
    return dict(D=D, BLOCK_H=block_h, BLOCK_K=spec.BLOCK, BLOCK_DV=dv, CHUNK=chunk,
                NB_P2=triton.next_power_of_2(max(blocks, 1)), IEEE=INTERPRETED,
                FUSED=fused, STAGES=0 if INTERPRETED else STAGES, num_warps=warps or (4 if dv <= 64 else 8))


def combine_config(D: int, dv: int, block_h: int = BLOCK_H) -> dict:
    return dict(D=D, BLOCK_H=block_h, BLOCK_DV=dv, STAGES=0 if INTERPRETED else STAGES, num_warps=4)


_COUNTERS: dict = {}
_COUNTERS_OUTGROWN: list = []   # buffers a larger call replaced: kept, since a CUDA graph may have captured them


def _counters(n: int, device) -> torch.Tensor:
    """The split_fused path's arrival counters (zero between launches: the last arrival resets its own)."""
    key = str(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _COUNTERS_OUTGROWN.append(buf)
        buf = _COUNTERS[key] = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
    return buf


def launch(q, kv, sink, indices, scale: float, init: float, block_dv: int | None = None, *,
           path: str | None = None, block_h: int | None = None, chunk: int = 1,
           scores_block_h: int | None = None, warps: int | None = None, stages: int = STAGES,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Device tensors in (q [T, H, D] BF16, kv [N, D] BF16, sink [H] fp32, indices [T, K] int32),
    the BF16 output [T, H, D] out; D a power of two ≥ 16.  path: one of PATHS (None: choose_path);
    block_h heads a program (serial 16, wide 32), chunk blocks of 64 a split program, warps a
    program's warps (None: by shape), stages the GPU's software pipelining of the list's blocks;
    out a BF16 [T, H, D] tensor to write into (benchmarks poison it)."""
    T, H, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"sparse_attention (kernels): head dim must be a power of two ≥ 16, got {D}")
    K = indices.shape[1]
    path = path or choose_path(T, H, D, K)
    if path not in PATHS:
        raise ValueError(f"sparse_attention (kernels): path must be one of {PATHS}, got {path!r}")
    if block_dv is not None and (block_dv > D or D % block_dv or block_dv & (block_dv - 1)):
        raise ValueError(f"sparse_attention (kernels): block_dv must be a power of two dividing {D}, got {block_dv}")
    out = torch.empty(T, H, D, dtype=torch.bfloat16, device=q.device) if out is None else out
    if T == 0:
        return out
    q, kv, indices, sink = q.contiguous(), kv.contiguous(), indices.contiguous(), sink.float().contiguous()
    if path.startswith("split") and K > 0:
        return _launch_split(q, kv, sink, indices, scale, init, out, block_dv, block_h or BLOCK_H, chunk,
                             scores_block_h or block_h or BLOCK_H, path == "split_fused", warps)
    bh = block_h or (32 if path == "wide" else BLOCK_H)
    groups = triton.cdiv(H, bh)
    dv = block_dv or _slice(T, groups, D)
    warps = warps or (4 if T >= PREFILL_TOKENS else None)
    _sparse_attention_kernel[(T, groups, D // dv)](q, kv, sink, indices, out, H, K, scale, init,
                                                   **config(D, dv, bh, warps, stages))
    return out


def _launch_split(q, kv, sink, indices, scale, init, out, block_dv, bh, chunk, bh_scores, fused, warps):
    T, H, D = q.shape
    K = indices.shape[1]
    NB = triton.cdiv(K, spec.BLOCK)
    NC = triton.cdiv(NB, chunk)
    groups = triton.cdiv(H, bh)
    dv = block_dv or min(_slice(T, groups, D, NC), CHUNK_MAX_DV)
    f32 = dict(dtype=torch.float32, device=q.device)
    s = torch.empty(T, H, NB * spec.BLOCK, **f32)
    bmax = torch.empty(T, H, NB, **f32)
    part = torch.empty(T, H, NC, D, **f32)
    psum = torch.empty(T, H, NC, **f32)
    pmax = torch.empty(T, H, NC, **f32)
    count = _counters(T * groups * (D // dv), q.device) if fused else psum
    _attn_scores_kernel[(T * triton.cdiv(H, bh_scores), NB)](q, kv, indices, s, bmax, H, K, NB, scale,
                                                               **scores_config(D, bh_scores))
    _chunk_kernel[(T * groups, NC, D // dv)](kv, indices, s, bmax, part, psum, pmax, sink, out, count, H, K, NB, NC,
                                             init, **chunk_config(D, dv, chunk, fused, bh, warps, NB))
    if not fused:
        _combine_kernel[(T * groups, D // dv)](part, psum, pmax, sink, out, H, NC, **combine_config(D, dv, bh))
    return out
