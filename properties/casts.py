"""Framework casts as targets: the element formats of ml_dtypes and of torch.

They provide ONLY the element operations (e2m1_encode/decode, e4m3_encode/decode, e8m0_decode,
bf16_round), each one framework cast.  They do not claim conformance: where they deviate from the
exact rules of spec/formats.py, that is a finding about the framework (tests/test_formats.py
records exactly which encodings each one disagrees on), never a reason to change a rule.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

__all__ = ["MLDTYPES", "TORCH"]


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _codes(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8).copy())


class _MlDtypes:
    NAME = "ml_dtypes"
    DEVICE = "cpu"
    CLAIMS_CONFORMANCE = False
    VARIANTS: dict = {}

    @staticmethod
    def e2m1_encode(x):
        return _codes(_np(x.float()).astype(ml_dtypes.float4_e2m1fn))

    @staticmethod
    def e2m1_decode(codes):
        return torch.from_numpy(_np(codes).view(ml_dtypes.float4_e2m1fn).astype(np.float32))

    @staticmethod
    def e4m3_encode(x):
        return _codes(_np(x.float()).astype(ml_dtypes.float8_e4m3fn))

    @staticmethod
    def e4m3_decode(codes):
        return torch.from_numpy(_np(codes).view(ml_dtypes.float8_e4m3fn).astype(np.float32))

    @staticmethod
    def e8m0_decode(codes):
        return torch.from_numpy(_np(codes).view(ml_dtypes.float8_e8m0fnu).astype(np.float32))

    @staticmethod
    def bf16_round(x):
        return torch.from_numpy(_np(x.float()).astype(ml_dtypes.bfloat16).astype(np.float32))


class _Torch:
    """torch has no element float4 dtype (only the packed float4_e2m1fn_x2), so no E2M1 casts."""

    NAME = "torch"
    DEVICE = "cpu"
    CLAIMS_CONFORMANCE = False
    VARIANTS: dict = {}

    @staticmethod
    def e4m3_encode(x):
        return x.float().to(torch.float8_e4m3fn).view(torch.uint8)

    @staticmethod
    def e4m3_decode(codes):
        return codes.view(torch.float8_e4m3fn).float()

    @staticmethod
    def e8m0_decode(codes):
        return codes.view(torch.float8_e8m0fnu).float()

    @staticmethod
    def bf16_round(x):
        return x.float().to(torch.bfloat16).float()


MLDTYPES = _MlDtypes()
TORCH = _Torch()
