"""Converters for adapting real code to the target contract (import as `dsv4spec.adapters`).

The suite checks every result strictly (runner/target.py, RESULTS): codes and scale bytes are
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
| takes a complex RoPE table / cos and sin    | with_freqs_cis / with_cos_sin (tables: freqs_cis, cos_sin) |
| the official kernel.py signatures           | from_official_kernels(module) (a whole target) |
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math

import numpy as np

__all__ = ["as_bytes", "e8m0_from_pow2", "e4m3_from_values", "as_index", "reshape_like", "as_column",
           "as_flat", "rows", "e2m1_codes", "e8m0_from_words", "split_row", "join_row", "as_blocks",
           "from_blocks", "pool_mask", "from_official_kernels", "OfficialKernelSignatures",
           "OFFICIAL_KERNEL_OPERATIONS", "default_dtype", "freqs_cis", "cos_sin", "with_freqs_cis", "with_cos_sin"]

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


# ------------------------------------------------------------------------------------------------
# A module with the official kernel.py's signatures (act_quant, fp4_act_quant, fp8_gemm, sparse_attn)
# ------------------------------------------------------------------------------------------------
def _fp8_quantize(k, x, block):
    z, n = k.blocks_in(x, block)
    y, s = k.kernel.act_quant(z, block, "ue8m0", _e8m0())
    return k.out(as_bytes(y)[:, :n], x), k.out(as_bytes(s)[:, :n // block], x, n // block)


def _fp8_qdq(k, x, block):
    z, n = k.blocks_in(x, block)
    k.kernel.act_quant(z, block, "ue8m0", _e8m0(), True)          # written back into z
    return k.out(z[:, :n].float(), x)


def _fp4_e8m0_quantize(k, x):
    z, n = k.blocks_in(x, 32)
    y, s = k.kernel.fp4_act_quant(z, 32)
    return k.out(as_bytes(y)[:, :n // 2], x, n // 2), k.out(as_bytes(s)[:, :n // 32], x, n // 32)


def _fp4_e4m3_quantize(k, x):
    import torch
    z, n = k.blocks_in(x, 16)
    y, s = k.kernel.fp4_act_quant(z, 16, scale_dtype=torch.float8_e4m3fn)
    return k.out(as_bytes(y)[:, :n // 2], x, n // 2), k.out(as_bytes(s)[:, :n // 16], x, n // 16)


def _fp8_linear(k, x, w, w_scale, block):
    """The official linear() of an FP8 weight: act_quant, then fp8_gemm under the default dtype BF16."""
    import torch
    if block != k.GEMM_BLOCK:
        raise ValueError(f"{k.NAME}: this kernel's fp8_gemm uses {k.GEMM_BLOCK}×{k.GEMM_BLOCK} blocks; got "
                         f"block {block} (V4.1's 32×32 needs the V4.1 kernel.py)")
    kdim, n = x.shape[-1], w.shape[0]
    a, a_s = k.kernel.act_quant(k.bf16(x).reshape(-1, kdim), block, "ue8m0", _e8m0())
    b = k.on_device(w).contiguous().view(torch.float8_e4m3fn)
    if w_scale.dtype == torch.uint8:
        b_s, scale_dtype = k.on_device(w_scale).contiguous().view(_e8m0()), _e8m0()
    else:
        b_s, scale_dtype = k.on_device(w_scale).to(torch.float32).contiguous(), torch.float32
    with default_dtype(torch.bfloat16):
        c = k.kernel.fp8_gemm(a, a_s, b, b_s, scale_dtype)
    return c.float().reshape(*x.shape[:-1], n).to(x.device)


def _sparse_attention(k, q, kv, sink, indices, softmax_scale, *, model=None):
    """The suite's q [T,H,D], kv [N,D], indices [T,K] as the kernel's batch of one ([1,T,H,D],
    [1,N,D], [1,T,K]), indices int32 as the official model passes them; model is the suite's
    (MODELS keeps the other model's examples away)."""
    import torch
    batch = q.dim() == 3
    q_, kv_, idx = (q[None], kv[None], indices[None]) if batch else (q, kv, indices)
    o = k.kernel.sparse_attn(k.bf16(q_), k.bf16(kv_), k.on_device(sink).to(torch.float32).contiguous(),
                             k.on_device(idx).to(torch.int32).contiguous(), softmax_scale)
    return (o[0] if batch else o).float().to(q.device)


# suite operation -> (the kernel function it calls, the adapter[, a parameter the function must
# have]): the one mapping of every target over the official signatures (official-kernels too).
OFFICIAL_KERNEL_OPERATIONS = {
    "fp8_quantize": ("act_quant", _fp8_quantize),
    "fp8_qdq": ("act_quant", _fp8_qdq),
    "fp4_e8m0_quantize": ("fp4_act_quant", _fp4_e8m0_quantize),
    "fp4_e4m3_quantize": ("fp4_act_quant", _fp4_e4m3_quantize, "scale_dtype"),    # V4.1's kernel.py
    "fp8_linear": ("fp8_gemm", _fp8_linear),
    "sparse_attention": ("sparse_attn", _sparse_attention),
}


def _e8m0():
    import torch
    return torch.float8_e8m0fnu


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype set to `dtype` inside the block and restored after, also on an exception."""
    import torch
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def bucket(n_blocks: int) -> int:
    """The padded block count: the next power of two."""
    return 1 << max(n_blocks - 1, 0).bit_length()


def _serves(fn, needs: str | None) -> bool:
    if not callable(fn):
        return False
    if needs is None:
        return True
    try:
        return needs in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class OfficialKernelSignatures:
    """A target over a module with the official kernel.py's signatures: it has exactly the
    operations whose kernel function the module defines (OFFICIAL_KERNEL_OPERATIONS)."""

    CLAIMS_CONFORMANCE = True
    VARIANTS: dict = {}
    INPUT_DTYPE = "bfloat16"        # the kernels take BF16 activations
    GEMM_BLOCK = 128                # V4 kernel.py fp8_gemm_kernel: group_size = block_N = block_K = 128
    # sparse_attn_kernel (V4-kernel L276-352) compiles for head dim 512 (the model's; at 16 TileLang
    # finds "No valid warp partition" for its GEMMs on the H200), heads in 16s (its launcher pads
    # fewer than 16, L358-363) and, as run here, lists in whole blocks of 64
    SHAPES = {"sparse_attention": {"D": (512,), "H": 16, "K": 64}}

    def __init__(self, module, *, name: str | None = None, device=None, shapes: dict | None = None):
        self.kernel = module
        self.NAME = name or getattr(module, "NAME", None) or getattr(module, "__name__", type(module).__name__)
        self.device = device            # None: where the inputs are
        self.DEVICE = getattr(device, "type", device) or "cpu"
        if shapes is not None:
            self.SHAPES = shapes
        self.served = {}
        for op, (function, adapter, *needs) in OFFICIAL_KERNEL_OPERATIONS.items():
            if _serves(getattr(module, function, None), needs[0] if needs else None):
                setattr(self, op, _bound(adapter, self, op))
                self.served[op] = function
        # V4's fp4_act_quant has no scale_dtype (E8M0 only): the file's model is the one its kernels
        # are, and only that model's examples reach it (the running max of sparse_attn, fp8_gemm's block)
        from ..spec.rules import V4, V41
        self.MODELS = V41 if "fp4_e4m3_quantize" in self.served else V4

    def __repr__(self):
        return f"{type(self).__name__}({self.NAME!r}: {', '.join(self.served) or 'nothing'})"

    def on_device(self, x):
        return x if self.device is None else x.to(self.device)

    def bf16(self, x):
        import torch
        return self.on_device(x).to(torch.bfloat16).contiguous()

    def blocks_in(self, x, block: int):
        """x as contiguous BF16 rows [M, N'] on the device, its blocks padded with zero blocks to a
        power-of-two count (one compiled kernel per bucket, not per width); and the real width n."""
        import torch
        n = x.shape[-1]
        if n % block:
            raise ValueError(f"{self.NAME}: the last dimension {n} is not a multiple of the block {block}")
        rows = self.bf16(x).reshape(-1, n)
        if rows.shape[0] == 0:              # no launch of zero rows: one zero row, dropped by out()
            rows = rows.new_zeros(1, n)
        width = bucket(n // block) * block
        if width != n:
            rows = torch.cat([rows, rows.new_zeros(rows.shape[0], width - n)], dim=1).contiguous()
        return rows, n

    @staticmethod
    def out(t, like, last: int | None = None):
        """A result [M, last] back in the input's leading shape and on its device."""
        t = t[:math.prod(like.shape[:-1])]
        return t.contiguous().reshape(*like.shape[:-1], like.shape[-1] if last is None else last).to(like.device)


def _bound(adapter, k: OfficialKernelSignatures, op: str):
    def call(*args, **kwargs):
        return adapter(k, *args, **kwargs)
    call.__name__ = call.__qualname__ = op
    call.__doc__ = adapter.__doc__
    return call


def from_official_kernels(module, *, name: str | None = None, device=None,
                          shapes: dict | None = None) -> OfficialKernelSignatures:
    """The target of a module (or object) with the official kernel.py's signatures: act_quant,
    fp4_act_quant, fp8_gemm and sparse_attn serve the suite's fp8_quantize, fp8_qdq,
    fp4_e8m0_quantize, fp4_e4m3_quantize (a fp4_act_quant taking scale_dtype), fp8_linear and
    sparse_attention, with the glue the official model has around them (BF16 and int32 inputs, the
    batch dimension, linear() as act_quant then fp8_gemm under the default dtype BF16, restored
    after).  device: where the kernels run (None: where the suite's inputs are); shapes: the sizes
    sparse_attn takes (default: the official kernel's, head dim 512, heads in 16s, lists in 64s)."""
    return OfficialKernelSignatures(module, name=name, device=device, shapes=shapes)


# ------------------------------------------------------------------------------------------------
# RoPE tables: the suite passes (positions int64 [T], freqs f32 [d/2]) to rope_rotate,
# rope_quantize and attention_output; libraries take the complex table or cos/sin
# ------------------------------------------------------------------------------------------------
def freqs_cis(positions, freqs):
    """The complex64 table [T, d/2] the official model indexes at these positions: the angles
    outer(positions, freqs) in fp32 (int64 positions times fp32 frequencies, exact for positions
    below 2^24), then polar(1, angle) (V4-model L226-228, precompute_freqs_cis).  No other rounding."""
    import torch
    angle = torch.outer(positions, freqs.to(torch.float32))
    return torch.polar(torch.ones_like(angle), angle)


def cos_sin(positions, freqs, *, repeat: bool = False):
    """(cos, sin) fp32 [T, d/2]: the real and imaginary parts of freqs_cis(positions, freqs), the
    same values; repeat=True gives each twice, [T, d], for code that multiplies the consecutive
    pairs (x[2i], x[2i+1]) element by element."""
    table = freqs_cis(positions, freqs)
    cos, sin = table.real.contiguous(), table.imag.contiguous()
    return (cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)) if repeat else (cos, sin)


def with_freqs_cis(fn, *, inverse: bool = False):
    """fn(x, table, *rest) called as the suite calls rope_rotate / attention_output / rope_quantize:
    (x, positions, freqs, *rest).  inverse=True passes the conjugate table (attention_output's
    de-rotation, V4-model L237)."""
    @functools.wraps(fn)
    def call(x, positions, freqs, *args, **kwargs):
        table = freqs_cis(positions, freqs)
        return fn(x, table.conj() if inverse else table, *args, **kwargs)
    return call


def with_cos_sin(fn, *, inverse: bool = False, repeat: bool = False):
    """fn(x, cos, sin, *rest) called as (x, positions, freqs, *rest); inverse=True negates sin
    (exact: the conjugate table); repeat as in cos_sin."""
    @functools.wraps(fn)
    def call(x, positions, freqs, *args, **kwargs):
        cos, sin = cos_sin(positions, freqs, repeat=repeat)
        return fn(x, cos, -sin if inverse else sin, *args, **kwargs)
    return call
