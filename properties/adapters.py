"""Converters for adapting real code to the target contract (import as `dsv4spec.adapters`).

The suite checks every result strictly (properties/target.py, RESULTS): codes and scale bytes are
uint8 tensors, values float32 (or bfloat16), indices int64 (or int32), on the inputs' device, in
the shapes of `dsv4spec ops`.  Libraries return other encodings; these functions convert them
exactly -- by reinterpreting bits or by exact integer arithmetic, never through a rounding cast --
and refuse (ValueError) what they cannot convert exactly.

    import dsv4spec.adapters as A

    @A.rows                                   # your kernel takes [rows, n]; the suite passes [..., n]
    def fp4_e8m0_quantize(x):
        packed, scales = mylib.quantize_fp4(x)            # float4_e2m1fn_x2, fp32 powers of two [rows, 1]
        return A.as_bytes(packed), A.e8m0_from_pow2(scales.squeeze(-1))

    def index_topk(scores, visible, k, order):
        return A.as_index(mylib.topk(scores, A.as_column(visible), k))   # int32 -> int64

| what your code returns                      | converter                     |
|---------------------------------------------|-------------------------------|
| torch float8_e4m3fn / float8_e5m2 / float8_e8m0fnu / float4_e2m1fn_x2 / int8 | as_bytes |
| fp32 scales that are powers of two          | e8m0_from_pow2                |
| fp32 scales that are E4M3 values            | e4m3_from_values              |
| int32 / int16 indices                       | as_index                      |
| scales [..., blocks, 1], lens [T, 1]        | reshape_like, as_column / as_flat |
| a function of [rows, n] only                | rows (decorator)              |
| E2M1 values (qdq libraries), ±0 kept        | e2m1_codes                    |
| int32 words of four E8M0 scales             | e8m0_from_words               |
| one [payload | scales] byte row             | split_row / join_row          |
| rows of 128 (a paged cache) and back        | as_blocks / from_blocks       |
| selected block ids, −1 padded               | pool_mask                     |
| kv_qdq for one format only                  | name it kv_qdq_fp4_e4m3 or kv_qdq_fp8_e8m0_32 |
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["as_bytes", "e8m0_from_pow2", "e4m3_from_values", "as_index", "reshape_like", "as_column",
           "as_flat", "rows", "e2m1_codes", "e8m0_from_words", "split_row", "join_row", "as_blocks",
           "from_blocks", "pool_mask"]

_BYTE_DTYPES = ("uint8", "int8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn_x2")


def _name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def as_bytes(t):
    """The raw bytes of a one-byte tensor as uint8, same shape: float8 (e4m3fn, e5m2, e8m0fnu),
    float4_e2m1fn_x2 (two E2M1 codes per byte, element 2i in the low nibble as the contract wants)
    and int8 payloads are reinterpreted, never converted by value."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"as_bytes: expected a torch tensor, got {type(t).__name__}")
    if _name(t) not in _BYTE_DTYPES:
        raise ValueError(f"as_bytes: dtype {_name(t)} is not a one-byte encoding; expected one of "
                         f"{', '.join(_BYTE_DTYPES)} (fp32 scales: e8m0_from_pow2 or e4m3_from_values)")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def e8m0_from_pow2(scales):
    """E8M0 bytes (uint8, 2^(b − 127)) of fp32 scales that are exact powers of two in
    [2^-127, 2^127]; taken from the exponent bits, so a scale that is not a power of two is an
    error, not a rounding."""
    import torch
    s = _float32(scales, "e8m0_from_pow2")
    bits = s.view(torch.int32).to(torch.int64)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    normal = (bits >= 0) & (mantissa == 0) & (exponent > 0) & (exponent < 255)
    subnormal_min = bits == 0x400000                           # 2^-127 is the one subnormal E8M0 value
    if not bool((normal | subnormal_min).all()):
        bad = s.reshape(-1)[~(normal | subnormal_min).reshape(-1)][0].item()
        raise ValueError(f"e8m0_from_pow2: scale {bad!r} is not a power of two in [2^-127, 2^127]")
    return torch.where(subnormal_min, 0, exponent).to(torch.uint8)


def e4m3_from_values(scales):
    """E4M3 bytes (uint8) of fp32 scales whose values are exactly representable as
    float8_e4m3fn; any other value is an error (the rounding belongs to the code under test)."""
    import torch
    from ..spec import formats as F
    s = _float32(scales, "e4m3_from_values")
    values = s.detach().cpu().numpy()
    codes = F.e4m3_encode(values)
    exact = (F.e4m3_decode(codes) == values) | (np.isnan(values) & np.isnan(F.e4m3_decode(codes)))
    if not exact.all():
        raise ValueError(f"e4m3_from_values: scale {values[~exact][0]!r} is not an E4M3 value")
    return torch.from_numpy(codes.astype(np.uint8)).to(s.device)


def as_index(t):
    """Integer indices widened to int64 (exact); −1 stays −1."""
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"as_index: expected an integer tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    return t.to(torch.int64)


def reshape_like(t, shape):
    """t with the contract's shape when only size-1 dimensions or a flattening differ, e.g. scales
    [blocks, 1] -> [..., blocks]; any other difference is an error naming both shapes."""
    shape = tuple(shape)
    if t.numel() != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"reshape_like: {tuple(t.shape)} holds {t.numel()} elements; expected shape {shape}")
    return t.reshape(shape)


def as_column(t):
    """[T] -> [T, 1] (for code that takes compress_lens or visible counts as a column)."""
    return t if t.dim() == 2 and t.shape[-1] == 1 else t.reshape(-1, 1)


def as_flat(t):
    """[T, 1] -> [T] (for code that returns a column where the contract has a vector)."""
    if t.dim() == 2 and t.shape[-1] == 1:
        return t.reshape(-1)
    if t.dim() != 1:
        raise ValueError(f"as_flat: expected [T] or [T, 1], got {tuple(t.shape)}")
    return t


def rows(fn):
    """Decorate an operation written for x [rows, n]: the suite's x [..., n] is flattened to
    [rows, n] and every tensor result [rows, ...] is given back the leading dimensions."""
    import torch

    @functools.wraps(fn)
    def call(x, *args, **kwargs):
        lead = tuple(x.shape[:-1])
        result = fn(x.reshape(-1, x.shape[-1]), *args, **kwargs)
        restore = lambda r: r.reshape(lead + tuple(r.shape[1:])) if isinstance(r, torch.Tensor) else r  # noqa: E731
        return tuple(map(restore, result)) if isinstance(result, tuple) else restore(result)
    return call


def e2m1_codes(values):
    """E2M1 codes (uint8 0..15, the sign in bit 3) of values that are E2M1 values, ±{0, 0.5, 1,
    1.5, 2, 3, 4, 6} in any float dtype, with the sign of zero kept (−0.0 is code 8); any other
    value is an error (the rounding belongs to the code under test)."""
    import torch
    from ..spec import formats as F
    if not isinstance(values, torch.Tensor) or not values.dtype.is_floating_point:
        raise ValueError(f"e2m1_codes: expected a float tensor, got {getattr(values, 'dtype', type(values).__name__)}")
    v = values.detach().to(torch.float32).cpu().numpy()       # exact: every E2M1 value is a float32
    codes = F.e2m1_encode(v)
    exact = (F.e2m1_decode(codes) == v) & (np.signbit(F.e2m1_decode(codes)) == np.signbit(v))
    if not exact.all():
        raise ValueError(f"e2m1_codes: {float(v[~exact][0])!r} is not an E2M1 value (±0, 0.5, 1, 1.5, 2, 3, 4, 6)")
    return torch.from_numpy(codes.astype(np.uint8)).to(values.device)


def e8m0_from_words(words):
    """The E8M0 bytes (uint8 [..., 4n]) of int32 words [..., n] that pack four scales each, the
    first in the lowest byte (scale 4j + i in bits 8i..8i+7), by shifts: the same on any machine."""
    import torch
    if not isinstance(words, torch.Tensor) or words.dtype not in (torch.int32, torch.uint32):
        raise ValueError(f"e8m0_from_words: expected an int32 tensor, got {getattr(words, 'dtype', type(words).__name__)}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    parts = torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return parts.reshape(*words.shape[:-1], 4 * words.shape[-1]).to(torch.uint8)


def split_row(row, payload_bytes: int):
    """(payload, scales) of uint8 rows laid out [payload | scales]: the first payload_bytes bytes
    of the last dimension and the rest."""
    _bytes(row, "split_row")
    if not 0 < payload_bytes < row.shape[-1]:
        raise ValueError(f"split_row: payload_bytes {payload_bytes} must lie inside a row of {row.shape[-1]} bytes")
    return row[..., :payload_bytes], row[..., payload_bytes:]


def join_row(payload, scales):
    """One uint8 row [payload | scales] of the two (the same leading dimensions)."""
    import torch
    _bytes(payload, "join_row"), _bytes(scales, "join_row")
    if payload.shape[:-1] != scales.shape[:-1]:
        raise ValueError(f"join_row: payload {tuple(payload.shape)} and scales {tuple(scales.shape)} differ "
                         "before the last dimension")
    return torch.cat([payload, scales], dim=-1)


def as_blocks(x, block: int = 128):
    """Rows [..., n, d] as blocks [..., n / block, block, d] (a paged cache's view); n must be a
    multiple of block."""
    if x.dim() < 2 or x.shape[-2] % block:
        raise ValueError(f"as_blocks: {tuple(x.shape)} has no row count that is a multiple of {block}")
    return x.reshape(*x.shape[:-2], x.shape[-2] // block, block, x.shape[-1])


def from_blocks(x):
    """Blocks [..., b, block, d] as rows [..., b * block, d]."""
    if x.dim() < 3:
        raise ValueError(f"from_blocks: expected [..., blocks, block, d], got {tuple(x.shape)}")
    return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])


def pool_mask(block_ids, width: int, block_size: int = 8):
    """The pool mask (bool [T, width]) of the blocks each row selected: block_ids [T, n] of block
    numbers, −1 for none; position p is in the pool when p // block_size was selected."""
    import torch
    ids = as_index(block_ids)
    blocks = -(-width // block_size)
    if ids.dim() != 2 or bool(((ids < -1) | (ids >= blocks)).any()):
        raise ValueError(f"pool_mask: expected block ids [T, n] in [-1, {blocks}) for width {width} and "
                         f"block size {block_size}, got shape {tuple(ids.shape)}")
    chosen = torch.zeros(ids.shape[0], blocks + 1, dtype=torch.bool, device=ids.device)
    chosen.scatter_(1, torch.where(ids < 0, blocks, ids), True)
    return chosen[:, :blocks].repeat_interleave(block_size, dim=1)[:, :width]


def _bytes(t, what):
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise ValueError(f"{what}: expected a uint8 tensor, got {getattr(t, 'dtype', type(t).__name__)}")


def _float32(t, what):
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise ValueError(f"{what}: expected a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    return t.contiguous()
