"""An example third-party target: a NumPy port of the FP4 codecs, adapted to the dsv4spec contract.

`MyFp4` is the "library": it knows nothing of dsv4spec, works on [rows, n] arrays and returns its
scales as fp32 powers of two of shape [blocks, 1], as real quantization code often does.  `Fp4Port`
is the adapter, a few lines of dsv4spec.adapters.  The port is deliberately imperfect:

- it packs the first element of each pair into the HIGH nibble, and declares it
  (VARIANTS): FP4.PACK.NIBBLE reports VARIANT;
- it takes ceil(log2 v) through a float32 log2, and does not declare it: FP4.IDX.SCALE and
  FMT.CEIL_LOG2 report FAIL, "matches e8m0_rounding=float_log2_ceil", with a reproduce line.

    pip install -e examples/fp4_port
    dsv4spec verify --target fp4-port --rules FMT,FP4
    pytest --dsv4spec-target fp4-port --dsv4spec-rules FMT,FP4
"""
import numpy as np
import torch

import dsv4spec.adapters as A

FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


class MyFp4:
    """The library being verified."""

    @staticmethod
    def encode(v: np.ndarray) -> np.ndarray:
        """Nearest E2M1 code of each value, ties to the even code, saturating at ±6."""
        magnitude = np.minimum(np.abs(v), 6)
        distance = np.abs(magnitude[..., None] - FP4_VALUES)
        nearest = distance == distance.min(axis=-1, keepdims=True)
        even = np.where(nearest & (np.arange(8) % 2 == 0), np.arange(8), 99).min(axis=-1)
        code = np.where(even < 99, even, np.where(nearest, np.arange(8), 99).min(axis=-1))
        return (code | (np.signbit(v) << 3)).astype(np.uint8)

    @staticmethod
    def pack(codes: np.ndarray) -> np.ndarray:
        return (codes[..., 0::2] << 4 | codes[..., 1::2]).astype(np.uint8)

    @staticmethod
    def unpack(packed: np.ndarray) -> np.ndarray:
        out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
        out[..., 0::2], out[..., 1::2] = packed >> 4, packed & 0xF
        return out

    @classmethod
    def quantize(cls, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x [rows, 32k] -> (packed [rows, 16k], fp32 power-of-two scales [rows·k, 1])."""
        blocks = x.reshape(-1, 32)
        amax = np.maximum(np.abs(blocks).max(axis=-1, keepdims=True), np.float32(6 * 2.0 ** -126))
        v = amax * (np.float32(1) / np.float32(6))
        scale = np.exp2(np.ceil(np.log2(v))).astype(np.float32)      # the bug: a float log2
        codes = cls.encode(blocks / scale).reshape(x.shape)
        return cls.pack(codes), scale


class Fp4Port:
    """The adapter: operation names and encodings of the contract (`dsv4spec ops --family quant`)."""
    NAME = "fp4-port"
    CLAIMS_CONFORMANCE = True
    VARIANTS = {"nibble_order": "high_first"}       # declared: VARIANT, not FAIL

    def e2m1_encode(self, x):
        return torch.from_numpy(MyFp4.encode(x.float().numpy()))

    def fp4_pack(self, codes):
        return torch.from_numpy(MyFp4.pack(codes.numpy()))

    def fp4_unpack(self, packed):
        return torch.from_numpy(MyFp4.unpack(packed.numpy()))

    @staticmethod
    @A.rows
    def fp4_e8m0_quantize(x):
        packed, scales = MyFp4.quantize(x.float().numpy())
        blocks = (x.shape[0], x.shape[1] // 32)
        return torch.from_numpy(packed), A.reshape_like(A.e8m0_from_pow2(torch.from_numpy(scales)), blocks)
