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

The mapping is dsv4spec.adapters.from_official_kernels's (OFFICIAL_KERNEL_OPERATIONS), the one
any module with the official signatures is adapted by; this module only finds, imports and names
the file.

Conversions are exact: inputs become contiguous BF16 tensors on the GPU (the official domain: the
kernels take BF16), outputs are reinterpreted as bytes (dsv4spec.adapters.as_bytes) or widened
from BF16, and come back on the inputs' device.  The quantizers are per block (one program per
block of columns), so an input's blocks are padded with zero blocks to a power-of-two count before
the call and the padding is dropped after: no real block changes, and TileLang compiles one kernel
per bucket instead of one per width.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys

import torch

from dsv4spec.adapters import OFFICIAL_KERNEL_OPERATIONS as OPERATIONS  # noqa: F401 -- the one mapping
from dsv4spec.adapters import OfficialKernelSignatures

ENV = "DSV4SPEC_OFFICIAL_KERNEL"
NAME = "official-kernels"


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


class OfficialKernels(OfficialKernelSignatures):
    """The target over one imported kernel.py: dsv4spec.adapters.from_official_kernels's mapping
    (OFFICIAL_KERNEL_OPERATIONS), on the GPU for a TileLang file, named for the file it loaded."""

    def __init__(self, module, path: str, digest: str):
        # a TileLang file runs on the GPU; a stand-in without TileLang (the tests') where its inputs are
        gpu = hasattr(module, "tilelang") and torch.cuda.is_available()
        super().__init__(module, name=NAME, device=torch.device("cuda") if gpu else None)
        self.path = path
        self.__version__ = f"kernel.py sha256 {digest[:12]}"

    def __repr__(self):
        return f"OfficialKernels({self.path!r}: {', '.join(self.served) or 'nothing'})"
