"""An example third-party target: a NumPy port of the V4.1 main-KV FP4 codec.

Point the suite at it with

    dsv4spec verify --target examples.fp4_port:PORT --rules FP4,FMT.E2M1

(run from the repository root, or put this folder on PYTHONPATH).  It implements two operations of
the contract (properties/quant.py), declares one implementation choice that differs from the
official code, and leaves every other operation out: those rows read n/i, never FAIL.
"""
import numpy as np
import torch

FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


class Fp4Port:
    NAME = "fp4-port"
    DEVICE = "cpu"
    CLAIMS_CONFORMANCE = True
    # This port packs the first element of each pair into the HIGH nibble.  Declared, the rule that
    # fixes the order reports VARIANT instead of FAIL.
    VARIANTS = {"nibble_order": "high_first"}

    def e2m1_encode(self, x: torch.Tensor) -> torch.Tensor:
        v = np.clip(x.float().numpy(), -6, 6)
        magnitude = np.abs(v)
        distance = np.abs(magnitude[..., None] - FP4_VALUES)
        nearest = distance.min(axis=-1, keepdims=True)
        # Ties go to the even code: among equally near candidates take the one with a zero low bit.
        candidates = np.where(distance == nearest, np.arange(8), 99)
        even = np.where(candidates % 2 == 0, candidates, 99).min(axis=-1)
        code = np.where(even < 99, even, candidates.min(axis=-1))
        return torch.from_numpy((code | (np.signbit(v) << 3)).astype(np.uint8))

    def fp4_pack(self, codes: torch.Tensor) -> torch.Tensor:
        c = codes.numpy()
        return torch.from_numpy((c[..., 0::2] << 4 | c[..., 1::2]).astype(np.uint8))

    def fp4_unpack(self, packed: torch.Tensor) -> torch.Tensor:
        p = packed.numpy()
        out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
        out[..., 0::2], out[..., 1::2] = p >> 4, p & 0xF
        return torch.from_numpy(out)


PORT = Fp4Port()
