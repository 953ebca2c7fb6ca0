"""KV entries as bytes, readable torch, in the canonical field order (payload, scales, pad, tail).

    entry_pack(kind, x [..., dims] f32) -> uint8 [..., nbytes]
    entry_unpack(kind, data uint8 [..., nbytes]) -> f32 [..., dims]

kind is one of dsv4spec.spec.layout.KINDS: v4_main_kv (584 B), fp4_index_k (68 B), v41_main_kv
(288 B), v41_swa_kv (528 B), v32_index_k (132 B), v32_mla_kv (656 B).  The codecs are dsv4spec.impl.quant's.
"""
from __future__ import annotations

import torch

from ..spec import layout as spec
from . import quant

__all__ = ["entry_pack", "entry_unpack"]


def entry_pack(kind: str, x: torch.Tensor) -> torch.Tensor:
    lay = _layout(kind)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"entry_pack({kind}): x must be a float32 tensor")
    if x.dim() == 0 or x.shape[-1] != lay.dims:
        raise ValueError(f"entry_pack({kind}): an entry has {lay.dims} dims, got shape {tuple(x.shape)}")
    quantized, tail = x[..., :lay.quantized_dims], x[..., lay.quantized_dims:]
    if lay.payload is spec.E2M1:
        codec = quant.fp4_e4m3_quantize if lay.scale is spec.E4M3 else quant.fp4_e8m0_quantize
        payload, scales = codec(quantized.contiguous())
    elif lay.scale_rule == "scale_floor":
        payload, scales = _floored_scale_quantize(quantized.contiguous(), lay.block)
    else:
        payload, scales = quant.fp8_quantize(quantized.contiguous(), lay.block)
        if lay.scale is spec.FP32:
            scales = _le_bytes(quant.e8m0_decode(scales))
    pad = torch.zeros(*x.shape[:-1], lay.fields["pad"].nbytes, dtype=torch.uint8)
    return torch.cat([payload, scales, pad, _le_bytes(_bf16(tail))], dim=-1)


def entry_unpack(kind: str, data: torch.Tensor) -> torch.Tensor:
    lay = _layout(kind)
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise TypeError(f"entry_unpack({kind}): data must be a uint8 tensor")
    if data.dim() == 0 or data.shape[-1] != lay.nbytes:
        raise ValueError(f"entry_unpack({kind}): a packed entry is {lay.nbytes} bytes, "
                         f"got shape {tuple(data.shape)}")
    sizes = [lay.fields[name].nbytes for name in ("payload", "scales", "pad", "tail")]
    payload, scales, _, tail = torch.split(data, sizes, dim=-1)
    _reject_nan_scales(kind, lay, scales)
    if lay.payload is spec.E2M1:
        codec = quant.fp4_e4m3_dequantize if lay.scale is spec.E4M3 else quant.fp4_e8m0_dequantize
        values = codec(payload.contiguous(), scales.contiguous())
    elif lay.scale is spec.FP32:
        scale = scales.contiguous().view(torch.float32)
        values = (quant.e4m3_decode(payload.contiguous()).unflatten(-1, (-1, lay.block)) * scale[..., None]).flatten(-2)
    else:
        values = quant.fp8_dequantize(payload.contiguous(), scales.contiguous(), lay.block)
    tail_values = (tail.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)
    return torch.cat([values, tail_values], dim=-1)


def _floored_scale_quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 tiles with FP32 scales 2^ceil(log2 max(amax / 448, 1e-4)) (LAYOUT.V32.MLA)."""
    tiles = x.unflatten(-1, (-1, block))
    v = (tiles.abs().amax(dim=-1) / 448.0).clamp(min=spec.SCALE_FLOOR.item())
    s = quant._pow2(quant._ceil_log2(v))
    ratio = quant._div(tiles, s.unsqueeze(-1)).clamp(-448.0, 448.0)
    return quant.e4m3_encode(ratio.contiguous()).flatten(-2), _le_bytes(s)


def _layout(kind: str) -> spec.Layout:
    if kind not in spec.LAYOUTS:
        raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(spec.KINDS)}")
    return spec.LAYOUTS[kind]


def _reject_nan_scales(kind: str, lay: spec.Layout, scales: torch.Tensor):
    if lay.scale is spec.E8M0:
        bad = scales == 0xFF
    elif lay.scale is spec.E4M3:
        bad = (scales & 0x7F) == 0x7F
    else:
        bad = ~torch.isfinite(scales.contiguous().view(torch.float32))
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"entry_unpack({kind}): scale {where} is NaN; a {lay.scale.name} scale must be a number")


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """The BF16 bit patterns (int16) nearest to x: the spec's rounding, via impl.quant.bf16_round."""
    return (quant.bf16_round(x.contiguous()).view(torch.int32) >> 16).to(torch.int16)


def _le_bytes(t: torch.Tensor) -> torch.Tensor:
    """The little-endian bytes of the elements of t (this CPU is little-endian)."""
    return t.contiguous().view(torch.uint8)
