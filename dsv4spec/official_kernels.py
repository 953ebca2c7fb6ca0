"""The `official-kernels` target: your own copy of the official V4 `inference/kernel.py`, run as it is.

    dsv4spec verify --target official-kernels:/path/to/kernel.py --rules FP8,FP4
    DSV4SPEC_OFFICIAL_KERNEL=/path/to/kernel.py dsv4spec verify --target official-kernels

The file is DeepSeek's (MIT) and is never part of this project: the target loads the copy you name.
It imports TileLang and its kernels compile and run on a CUDA GPU (bench/official_kernels.sh sets
up TileLang on the H200 and runs everything below).  Without TileLang, or without CUDA, loading it
fails with one line saying which (exit status 3).

What it serves, under the suite's operation names (OPERATIONS; every other operation is n/i):

    fp8_quantize(x, block)      act_quant(x, block, "ue8m0", float8_e8m0fnu): the bytes of the
                                float8_e4m3fn values and of the float8_e8m0fnu scales
    fp8_qdq(x, block)           act_quant(x, block, "ue8m0", float8_e8m0fnu, inplace=True): the BF16
                                written back, widened.  The initial V4 revision casts clamp(x/s)
                                to BF16 there, not to FP8 (its L55); the suite reports that as
                                VARIANT v4_fp8_inplace=bf16 on FP8.V4_INPLACE
    fp4_e8m0_quantize(x)        fp4_act_quant(x, 32): float4_e2m1fn_x2 and float8_e8m0fnu bytes
    fp4_e4m3_quantize(x)        fp4_act_quant(x, 16, scale_dtype=float8_e4m3fn), where the file's
                                fp4_act_quant takes a scale_dtype (V4.1's kernel.py; V4's does not)
    fp8_linear(x, w, w_scale, block)
                                the official linear() of an FP8 weight: act_quant(x, block, "ue8m0",
                                float8_e8m0fnu), then fp8_gemm with the weight's E4M3 bytes and its
                                block scales (E8M0 bytes, or fp32 powers of two), under
                                torch.set_default_dtype(bfloat16) as the model sets it (fp8_gemm
                                allocates its output with the default dtype); V4's kernel has
                                128×128 blocks only
    sparse_attention(q, kv, sink, indices, softmax_scale)
                                sparse_attn(q, kv, sink, indices, softmax_scale) on BF16 q [b, s, h, d]
                                and kv [b, n, d], fp32 sink [h], int32 indices [b, s, k], at the
                                sizes SHAPES declares (head dim 512, heads in 16s, lists in 64s):
                                the ATTN checks draw their examples there

The last two are the operation names of the FP8-linear and sparse-attention rules; if those
rules name them otherwise, rename the keys of OPERATIONS.

Conversions are exact: inputs become contiguous BF16 tensors on the GPU (the official domain: the
kernels take BF16), outputs are reinterpreted as bytes (dsv4spec.adapters.as_bytes) or widened
from BF16, and come back on the inputs' device.  The quantizers are per block (one program per
block of columns), so an input's blocks are padded with zero blocks to a power-of-two count before
the call and the padding is dropped after: no real block changes, and TileLang compiles one kernel
per bucket instead of one per width.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import math
import os
import sys

import torch

from dsv4spec.adapters import as_bytes
from dsv4spec.spec.rules import V4, V41

ENV = "DSV4SPEC_OFFICIAL_KERNEL"
NAME = "official-kernels"
BF16 = torch.bfloat16
E8M0 = torch.float8_e8m0fnu
V4_GEMM_BLOCK = 128           # V4 kernel.py fp8_gemm_kernel: group_size = block_N = block_K = 128


class KernelUnavailable(Exception):
    """The kernel file cannot serve here (missing, TileLang absent, no CUDA); the message is one line."""


def kernel_file(spec: str) -> str:
    """The kernel.py that `official-kernels[:PATH]` names: PATH, else $DSV4SPEC_OFFICIAL_KERNEL."""
    _, _, path = spec.partition(":")
    path = path or os.environ.get(ENV, "")
    if not path:
        raise KernelUnavailable(f"{NAME}: no kernel.py given: write --target {NAME}:PATH/TO/kernel.py "
                                f"or set {ENV}=PATH/TO/kernel.py (your copy of the official V4 inference/kernel.py)")
    if not os.path.isfile(path):
        raise KernelUnavailable(f"{NAME}: {path} is not a file (expected the official V4 inference/kernel.py)")
    return path


def is_spec(spec: str) -> bool:
    return spec == NAME or spec.startswith(NAME + ":")


def load(path: str) -> "OfficialKernels":
    """Import the kernel file (as a module of its own, never on sys.path) and wrap what it has."""
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    name = f"_dsv4spec_official_kernel_{digest[:16]}"
    if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except ModuleNotFoundError as e:
            what = "TileLang" if e.name and e.name.split(".")[0] == "tilelang" else repr(e.name)
            raise KernelUnavailable(f"{NAME}: {path} imports {what}, which is not installed here (No module named "
                                    f"{e.name!r}); the official kernels need TileLang and a CUDA GPU "
                                    f"(bench/official_kernels.sh sets both up)") from None
        except Exception as e:  # noqa: BLE001 -- whatever the file raises, one line
            raise KernelUnavailable(f"{NAME}: importing {path} raised {type(e).__name__}: {e}") from None
        sys.modules[name] = module
    module = sys.modules[name]
    if hasattr(module, "tilelang") and not torch.cuda.is_available():
        raise KernelUnavailable(f"{NAME}: {path} is a TileLang kernel file and this machine has no CUDA device "
                                f"(torch.cuda.is_available() is False)")
    return OfficialKernels(module, path, digest)


def target(spec: str = NAME) -> "OfficialKernels":
    return load(kernel_file(spec))


# ------------------------------------------------------------------------------------------------
# the adapters: suite operation -> kernel.py function
# ------------------------------------------------------------------------------------------------
def _fp8_quantize(k, x, block):
    z, n = k.blocks_in(x, block)
    y, s = k.kernel.act_quant(z, block, "ue8m0", E8M0)
    return k.out(as_bytes(y)[:, :n], x), k.out(as_bytes(s)[:, :n // block], x, n // block)


def _fp8_qdq(k, x, block):
    z, n = k.blocks_in(x, block)
    k.kernel.act_quant(z, block, "ue8m0", E8M0, True)          # written back into z
    return k.out(z[:, :n].float(), x)


def _fp4_e8m0_quantize(k, x):
    z, n = k.blocks_in(x, 32)
    y, s = k.kernel.fp4_act_quant(z, 32)
    return k.out(as_bytes(y)[:, :n // 2], x, n // 2), k.out(as_bytes(s)[:, :n // 32], x, n // 32)


def _fp4_e4m3_quantize(k, x):
    z, n = k.blocks_in(x, 16)
    y, s = k.kernel.fp4_act_quant(z, 16, scale_dtype=torch.float8_e4m3fn)
    return k.out(as_bytes(y)[:, :n // 2], x, n // 2), k.out(as_bytes(s)[:, :n // 16], x, n // 16)


def _fp8_linear(k, x, w, w_scale, block):
    if block != V4_GEMM_BLOCK:
        raise ValueError(f"{NAME}: this kernel.py's fp8_gemm uses {V4_GEMM_BLOCK}×{V4_GEMM_BLOCK} blocks; got "
                         f"block {block} (V4.1's 32×32 needs the V4.1 kernel.py)")
    kdim, n = x.shape[-1], w.shape[0]
    a, a_s = k.kernel.act_quant(k.bf16(x).reshape(-1, kdim), block, "ue8m0", E8M0)
    b = w.to(k.device).contiguous().view(torch.float8_e4m3fn)
    if w_scale.dtype == torch.uint8:
        b_s, scale_dtype = w_scale.to(k.device).contiguous().view(E8M0), E8M0
    else:
        b_s, scale_dtype = w_scale.to(k.device, torch.float32).contiguous(), torch.float32
    with default_dtype(BF16):
        c = k.kernel.fp8_gemm(a, a_s, b, b_s, scale_dtype)
    return c.float().reshape(*x.shape[:-1], n).to(x.device)


def _sparse_attention(k, q, kv, sink, indices, softmax_scale, *, model=None):
    """The suite's q [T,H,D], kv [N,D], indices [T,K] as the kernel's batch of one ([1,T,H,D],
    [1,N,D], [1,T,K]); model is the suite's (MODELS keeps the other model's examples away)."""
    batch = q.dim() == 3
    q, kv, indices = (q[None], kv[None], indices[None]) if batch else (q, kv, indices)
    o = k.kernel.sparse_attn(k.bf16(q), k.bf16(kv), sink.to(k.device, torch.float32).contiguous(),
                             indices.to(k.device, torch.int32).contiguous(), softmax_scale)
    return (o[0] if batch else o).float().to(q.device)


# suite operation -> (the kernel.py function it calls, the adapter[, the parameter the function
# must have]).  Rename a key here if a rule names its operation otherwise.
OPERATIONS = {
    "fp8_quantize": ("act_quant", _fp8_quantize),
    "fp8_qdq": ("act_quant", _fp8_qdq),
    "fp4_e8m0_quantize": ("fp4_act_quant", _fp4_e8m0_quantize),
    "fp4_e4m3_quantize": ("fp4_act_quant", _fp4_e4m3_quantize, "scale_dtype"),    # V4.1's kernel.py
    "fp8_linear": ("fp8_gemm", _fp8_linear),
    "sparse_attention": ("sparse_attn", _sparse_attention),
}


def _serves(fn, needs: str | None) -> bool:
    if not callable(fn):
        return False
    if needs is None:
        return True
    try:
        return needs in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def bucket(n_blocks: int) -> int:
    """The padded block count: the next power of two."""
    return 1 << max(n_blocks - 1, 0).bit_length()


class OfficialKernels:
    """A target provider over one imported kernel.py; it has exactly the operations whose kernel
    function the file defines."""

    NAME = NAME
    CLAIMS_CONFORMANCE = True
    VARIANTS: dict = {}
    INPUT_DTYPE = "bfloat16"        # the kernels take BF16 activations
    # sparse_attn_kernel (V4-kernel L276-352) compiles for head dim 512 (the model's; at 16 TileLang
    # finds "No valid warp partition" for its GEMMs on the H200), heads in 16s (its launcher pads
    # fewer than 16, L358-363) and, as run here, lists in whole blocks of 64
    SHAPES = {"sparse_attention": {"D": (512,), "H": 16, "K": 64}}

    def __init__(self, module, path: str, digest: str):
        self.kernel, self.path = module, path
        self.__version__ = f"kernel.py sha256 {digest[:12]}"
        # a TileLang file runs on the GPU; a stand-in without TileLang (the tests') where its inputs are
        self.device = torch.device("cuda" if hasattr(module, "tilelang") and torch.cuda.is_available() else "cpu")
        self.DEVICE = self.device.type
        self.served = {}
        for op, (function, adapter, *needs) in OPERATIONS.items():
            if _serves(getattr(module, function, None), needs[0] if needs else None):
                setattr(self, op, _bound(adapter, self, op))
                self.served[op] = function
        # V4's fp4_act_quant has no scale_dtype (E8M0 only): the file's model is the one its kernels
        # are, and only that model's examples reach it (the running max of sparse_attn, fp8_gemm's block)
        self.MODELS = V41 if "fp4_e4m3_quantize" in self.served else V4

    def __repr__(self):
        return f"OfficialKernels({self.path!r}: {', '.join(self.served) or 'nothing'})"

    def bf16(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device, BF16).contiguous()

    def blocks_in(self, x: torch.Tensor, block: int):
        """x as contiguous BF16 rows [M, N'] on the device, its blocks padded to a power-of-two
        count with zero blocks; and the real width n."""
        n = x.shape[-1]
        if n % block:
            raise ValueError(f"{NAME}: the last dimension {n} is not a multiple of the block {block}")
        rows = self.bf16(x).reshape(-1, n)
        if rows.shape[0] == 0:              # no launch of zero rows: one zero row, dropped by out()
            rows = rows.new_zeros(1, n)
        width = bucket(n // block) * block
        if width != n:
            rows = torch.cat([rows, rows.new_zeros(rows.shape[0], width - n)], dim=1).contiguous()
        return rows, n

    @staticmethod
    def out(t: torch.Tensor, like: torch.Tensor, last: int | None = None) -> torch.Tensor:
        """A result [M, last] back in the input's leading shape and on its device."""
        t = t[:math.prod(like.shape[:-1])]
        return t.contiguous().reshape(*like.shape[:-1], like.shape[-1] if last is None else last).to(like.device)


def _bound(adapter, k: OfficialKernels, op: str):
    def call(*args, **kwargs):
        return adapter(k, *args, **kwargs)
    call.__name__ = call.__qualname__ = op
    call.__doc__ = adapter.__doc__
    return call
