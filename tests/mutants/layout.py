"""Layout mutants: entry packers with one realistic mistake each (rule caught on, in MUTANTS).

They are built on the spec's own packer with a different layout, field order or byte order, so
each differs from a correct packer in exactly one respect.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

import dsv4spec.impl.layout as il
from dsv4spec.spec import formats as F
from dsv4spec.spec import layout as spec

from . import mutant


def _packer(layouts=None, variants=None, tail_big_endian=False, check_nan=True, e8m0_bias=127):
    """entry_pack / entry_unpack over spec.layout with some kinds' layouts replaced."""
    layouts, variants = layouts or {}, variants or {}

    def lay(kind):
        return layouts.get(kind) or spec.layout(kind)

    def pack(kind, x):
        fields = spec.encode_fields(lay(kind), x.numpy(), variants)
        if tail_big_endian:
            fields["tail"] = fields["tail"].reshape(*fields["tail"].shape[:-1], -1, 2)[..., ::-1].reshape(fields["tail"].shape)
        return torch.from_numpy(np.ascontiguousarray(spec.join(lay(kind), fields, variants)))

    def unpack(kind, data):
        data = data.numpy()
        if data.dtype != np.uint8 or data.shape[-1] != lay(kind).nbytes:
            raise ValueError(f"{kind}: bad entry buffer")
        fields = spec.split(lay(kind), data, variants)
        if tail_big_endian:
            t = fields["tail"]
            fields["tail"] = np.ascontiguousarray(t.reshape(*t.shape[:-1], -1, 2)[..., ::-1].reshape(t.shape))
        if not check_nan:     # NaN scales pass through as garbage values
            fields["scales"] = np.where(spec.nan_scales(lay(kind), fields["scales"]), 0, fields["scales"]).astype(np.uint8)
        if e8m0_bias != 127 and lay(kind).scale is spec.E8M0:
            fields["scales"] = np.clip(fields["scales"].astype(np.int64) + (127 - e8m0_bias), 0, 254).astype(np.uint8)
        canonical = {**variants, "entry_field_order": "payload_first"}
        return torch.from_numpy(spec.unpack(lay(kind), spec.join(lay(kind), fields, canonical), canonical))

    return dict(entry_pack=pack, entry_unpack=unpack)


MUTANTS = {
    "layout-bf16-tail-big-endian": ("LAYOUT.ORDER", _packer(tail_big_endian=True)),
    "layout-v4-pad-byte-missing": ("LAYOUT.V4.MAIN", _packer(layouts={"v4_main_kv": replace(spec.V4_MAIN_KV, scale_align=1)})),
    # the V4 habit kept while declaring the official V4.1 layout
    "layout-v41-rope-bf16-declared-fp4": ("LAYOUT.V41.MAIN", dict(variants={"v41_main_rope": "fp4"}, **_packer(
        layouts={"v41_main_kv": spec.V41_MAIN_KV_BF16_ROPE}))),
    "layout-index-k-scales-padded-to-8": ("LAYOUT.INDEX_K", _packer(layouts={"fp4_index_k": replace(spec.FP4_INDEX_K, scale_align=8)})),
    "layout-swa-rope-kept-bf16": ("LAYOUT.V41.SWA", _packer(layouts={"v41_swa_kv": replace(spec.V41_SWA_KV, quantized_dims=448, tail_dims=64)})),
    "layout-v32-scale-as-e8m0-byte": ("LAYOUT.V32.INDEX_K", _packer(layouts={"v32_index_k": replace(spec.V32_INDEX_K, scale=spec.E8M0)})),
    "layout-unpack-accepts-nan-scales": ("LAYOUT.REJECT", dict(entry_pack=il.entry_pack, **{"entry_unpack": _packer(check_nan=False)["entry_unpack"]})),
    "layout-unpack-e8m0-bias-126": ("LAYOUT.UNPACK", dict(entry_pack=il.entry_pack, **{"entry_unpack": _packer(e8m0_bias=126)["entry_unpack"]})),
    # V4's habit (RoPE dims kept in BF16) in a V4.1 packer that declares nothing: a deviation from
    # the official content (normative LAYOUT.V41.MAIN), named in the failure, not an allowed choice
    "layout-v41-rope-bf16-undeclared": ("LAYOUT.V41.MAIN", _packer(layouts={"v41_main_kv": spec.V41_MAIN_KV_BF16_ROPE})),
}


# Every clause reachable (issue 22): one mutant per statement clause no mutant above changes alone.
def _edited(edit, read=None):
    """entry_pack with the canonical fields passed through edit(layout, fields) before they are joined;
    `read` (its own bytes -> canonical bytes) gives the matching entry_unpack."""
    def pack(kind, x):
        lay = spec.layout(kind)
        fields = edit(lay, spec.encode_fields(lay, x.numpy()))
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(
            [fields[name] for name in spec.FIELD_ORDERS["payload_first"]], axis=-1)))
    ops = dict(entry_pack=pack)
    if read:
        ops["entry_unpack"] = lambda kind, data: il.entry_unpack(kind, torch.from_numpy(np.ascontiguousarray(
            read(spec.layout(kind), data.numpy()))))
    return ops


def _pad_ff(lay, fields):
    return {**fields, "pad": np.full_like(fields["pad"], 0xFF)}


def _nibbles_swapped(lay, fields):
    p = fields["payload"]
    return {**fields, "payload": (p >> 4) | (p << 4)} if lay.payload is spec.E2M1 else fields


def _fp32_big_endian(lay, fields):
    s = fields["scales"]
    return {**fields, "scales": s.reshape(*s.shape[:-1], -1, 4)[..., ::-1].reshape(s.shape)} if lay.scale is spec.FP32 else fields


def _global_scale(lay, fields):
    """NVFP4's habit: a per-entry FP32 global scale (1.0) appended."""
    one = np.broadcast_to(spec.le_bytes(np.array([1.0], "<f4")), (*fields["tail"].shape[:-1], 4))
    return {**fields, "tail": np.concatenate([fields["tail"], one], axis=-1)}


def _byte_per_code(lay, fields):
    p = fields["payload"]
    return {**fields, "payload": np.stack([p & 0xF, p >> 4], axis=-1).reshape(*p.shape[:-1], -1)}


def _codes_repacked(lay, data):
    codes = data[..., :lay.quantized_dims]
    return np.concatenate([codes[..., 0::2] | (codes[..., 1::2] << 4), data[..., lay.quantized_dims:]], axis=-1)


def _mla_tiles_reversed(lay, fields):
    """The four FP32 tile scales written last tile first."""
    if lay.kind != "v32_mla_kv":
        return fields
    s = fields["scales"]
    return {**fields, "scales": s.reshape(*s.shape[:-1], -1, 4)[..., ::-1, :].reshape(s.shape)}


def _mla_scales_as_bf16(lay, fields):
    """The tile scales stored as BF16 (2 B each): exact for a power of two, but 8 bytes, not 16."""
    if lay.kind != "v32_mla_kv":
        return fields
    s = fields["scales"]
    return {**fields, "scales": np.ascontiguousarray(s.reshape(*s.shape[:-1], -1, 4)[..., 2:]).reshape(
        *s.shape[:-1], -1)}


def _mla_scales_from_bf16(lay, data):
    """The reader matching _mla_scales_as_bf16: BF16 scales widened back to FP32 bytes."""
    if lay.kind != "v32_mla_kv":
        return data
    values, bf16, tail = data[..., :512], data[..., 512:520], data[..., 520:]
    pairs = bf16.reshape(*bf16.shape[:-1], 4, 2)
    fp32 = np.concatenate([np.zeros_like(pairs), pairs], axis=-1).reshape(*bf16.shape[:-1], 16)
    return np.concatenate([values, fp32, tail], axis=-1)


def _mla_rope_first(lay, fields):
    """The BF16 RoPE dims before the E4M3 values."""
    if lay.kind != "v32_mla_kv":
        return fields
    moved = np.concatenate([fields["tail"], fields["payload"]], axis=-1)
    return {**fields, "payload": moved, "tail": fields["tail"][..., :0]}


def _as_written(lay, data):
    return data


def _unpacker(*, int8=False, longer=False, e4m3_nan=(0x7F, 0xFF), fp32_inf=False, tail_fp16=False, tail_shift=0,
              read=None):
    """entry_unpack over the spec's fields, with one of its checks or readings changed (`read`:
    (layout, fields) -> the fields as the mistaken reader takes them)."""
    def unpack(kind, data):
        lay, d = spec.layout(kind), data.numpy()
        if int8 and d.dtype == np.int8:
            d = d.view(np.uint8)
        if longer and d.ndim and d.shape[-1] > lay.nbytes:
            d = np.ascontiguousarray(d[..., :lay.nbytes])
        f = spec.split(lay, d)
        f = read(lay, dict(f)) if read else f
        scales = f["scales"]
        if lay.scale is spec.E4M3:
            bad = np.isin(scales, e4m3_nan)
        elif lay.scale is spec.FP32:
            v = spec.from_le_bytes(scales, "<f4")
            bad = np.isnan(v) if fp32_inf else ~np.isfinite(v)
        else:
            bad = scales == 0xFF
        if bad.any():
            raise ValueError(f"{kind}: NaN scale")
        n = lay.fields["tail"].nbytes
        tail = d[..., lay.nbytes - n + tail_shift:lay.nbytes + tail_shift] if n else f["tail"]
        tail = tail.view("<f2").astype(np.float32) if tail_fp16 else spec.bf16_tail_values(tail)
        values = spec._dequantize(lay, f["payload"], scales, {})
        return torch.from_numpy(np.concatenate([values, tail], axis=-1).astype(np.float32))
    return unpack


def _e8m0_bias_126(lay, fields):
    s = fields["scales"]
    return {**fields, "scales": np.clip(s.astype(np.int64) + 1, 0, 254).astype(np.uint8)} if lay.scale is spec.E8M0 else fields


def _round_trip(read):
    return dict(entry_pack=il.entry_pack, entry_unpack=_unpacker(read=read))


MUTANTS.update({
    "layout-v4-rope-quantized": ("LAYOUT.V4.MAIN", _packer(layouts={"v4_main_kv": replace(
        spec.V4_MAIN_KV, quantized_dims=512, tail_dims=0)})),
    "layout-v4-scales-per-32": ("LAYOUT.V4.MAIN", _packer(layouts={"v4_main_kv": replace(spec.V4_MAIN_KV, block=32)})),
    "layout-v4-unpack-tail-as-fp16": ("LAYOUT.V4.MAIN", dict(entry_pack=il.entry_pack,
                                                             entry_unpack=_unpacker(tail_fp16=True))),
    "layout-index-k-byte-per-code": ("LAYOUT.INDEX_K", _edited(_byte_per_code, _codes_repacked)),
    "layout-v41-main-e8m0-per-32": ("LAYOUT.V41.MAIN", _packer(layouts={"v41_main_kv": replace(
        spec.V41_MAIN_KV, scale=spec.E8M0, block=32)})),
    "layout-v41-main-global-scale": ("LAYOUT.V41.MAIN", _edited(_global_scale, lambda lay, data: data[..., :lay.nbytes])),
    "layout-swa-scales-per-64": ("LAYOUT.V41.SWA", _packer(layouts={"v41_swa_kv": replace(spec.V41_SWA_KV, block=64)})),
    "layout-pad-bytes-ff": ("LAYOUT.ORDER", _edited(_pad_ff)),
    "layout-fp4-nibbles-swapped": ("LAYOUT.ORDER", _edited(_nibbles_swapped)),
    "layout-v32-scale-big-endian": ("LAYOUT.ORDER", _edited(_fp32_big_endian)),
    "layout-scales-first-declared-payload-first": ("LAYOUT.ORDER", dict(
        variants={"entry_field_order": "payload_first"}, **_packer(variants={"entry_field_order": "scales_first"}))),
    "layout-unpack-pad-not-skipped": ("LAYOUT.UNPACK", dict(entry_pack=il.entry_pack,
                                                            entry_unpack=_unpacker(tail_shift=-1))),
    "layout-unpack-tail-as-fp16": ("LAYOUT.UNPACK", dict(entry_pack=il.entry_pack, entry_unpack=_unpacker(tail_fp16=True))),
    "layout-unpack-accepts-int8": ("LAYOUT.REJECT", dict(entry_pack=il.entry_pack, entry_unpack=_unpacker(int8=True))),
    "layout-unpack-accepts-longer-entries": ("LAYOUT.REJECT", dict(entry_pack=il.entry_pack,
                                                                   entry_unpack=_unpacker(longer=True))),
    "layout-unpack-accepts-e4m3-0xff": ("LAYOUT.REJECT", dict(entry_pack=il.entry_pack,
                                                              entry_unpack=_unpacker(e4m3_nan=(0x7F,)))),
    "layout-unpack-accepts-fp32-inf": ("LAYOUT.REJECT", dict(entry_pack=il.entry_pack,
                                                             entry_unpack=_unpacker(fp32_inf=True))),
    # V4's FP4 index K carried over to V3.2's FP8 one
    "layout-v32-index-k-as-v4-fp4": ("LAYOUT.V32.INDEX_K", _packer(layouts={"v32_index_k": replace(
        spec.V32_INDEX_K, payload=spec.E2M1, scale=spec.E8M0, block=32)})),
    # the unpacking clause of each kind: a reader with one mistake against the right packer
    "layout-index-k-unpack-nibbles-swapped": ("LAYOUT.INDEX_K", _round_trip(_nibbles_swapped)),
    "layout-v41-main-unpack-nibbles-swapped": ("LAYOUT.V41.MAIN", _round_trip(_nibbles_swapped)),
    "layout-swa-unpack-e8m0-bias-126": ("LAYOUT.V41.SWA", _round_trip(_e8m0_bias_126)),
    "layout-v4-unpack-e8m0-bias-126": ("LAYOUT.V4.MAIN", _round_trip(_e8m0_bias_126)),
    "layout-v32-unpack-scale-big-endian": ("LAYOUT.V32.INDEX_K", _round_trip(_fp32_big_endian)),
    # FlashMLA's 656-byte V3.2 entry written with one mistake, read by a correct reader
    "layout-v32-mla-tiles-swapped": ("LAYOUT.V32.MLA", _edited(_mla_tiles_reversed, _as_written)),
    "layout-v32-mla-scale-as-bf16": ("LAYOUT.V32.MLA", _edited(_mla_scales_as_bf16, _mla_scales_from_bf16)),
    "layout-v32-mla-rope-first": ("LAYOUT.V32.MLA", _edited(_mla_rope_first, _as_written)),
    "layout-v32-mla-act-quant-floor-declared-scale": ("LAYOUT.V32.MLA", dict(
        variants={"v32_mla_scale_floor": "scale"}, **_packer(variants={"v32_mla_scale_floor": "amax"}))),
    "layout-v32-mla-unpack-scale-big-endian": ("LAYOUT.V32.MLA", _round_trip(_fp32_big_endian)),
})


# Attention over a packed cache (sparse_attention_cache) reading the entries one wrong way each
def _cache_attention(read):
    """impl's sparse_attention_cache with the entries taken from the cache by `read(kind, cache)`."""
    from dsv4spec.impl.attn import sparse_attention
    from dsv4spec.impl.indexer import _bf16

    def sparse_attention_cache(q, cache, form, sink, indices, scale, *, model):
        kind, _ = spec.cache_form(form)
        kv = _bf16(torch.from_numpy(read(kind, cache.numpy())))
        return sparse_attention(q, kv, sink, indices, scale, model=model)[..., :spec.CACHE_VALUE_DIMS]
    return sparse_attention_cache


def _scale_groups_of_seven(kind, pages):
    """MODEL1 pages read as if each entry's scale group were its 7 scales, packed (583-byte thinking):
    from the second entry on, a group takes in an earlier entry's pad byte."""
    entries = spec.from_pages(kind, pages)
    groups = pages[:, spec.PAGE * 576:spec.PAGE * 584].reshape(-1, spec.PAGE * 8)[:, :spec.PAGE * 7].reshape(-1, 7)
    nope = F.e4m3_decode(entries[:, :448]).reshape(-1, 7, 64) * F.e8m0_decode(groups)[..., None]
    nope = np.nan_to_num(nope, nan=0.0)                 # the pad byte's 0xFF (NaN) taken as 0
    return np.concatenate([nope.reshape(-1, 448), spec.unpack(kind, entries)[:, 448:]], -1).astype(np.float32)


def _one_scale_an_entry(kind, entries):
    """V3.2 entries read with tile 0's FP32 scale for all four tiles."""
    entries = np.array(entries)
    entries[:, 516:528] = np.tile(entries[:, 512:516], 3)
    return spec.unpack(kind, entries)


MUTANTS.update({
    "cache-attention-model1-scale-groups-of-7": ("LAYOUT.V4.MAIN", dict(
        CACHE_FORMS=("v4_main_kv/flashmla_paged", "v32_mla_kv/flashmla_paged"),
        sparse_attention_cache=_cache_attention(_scale_groups_of_seven))),
    "cache-attention-v32-one-scale-an-entry": ("LAYOUT.V32.MLA", dict(
        sparse_attention_cache=_cache_attention(_one_scale_an_entry))),
})


# Not mistakes: other allowed choices of implementation-defined layouts, made without declaring
# them.  The suite names them VARIANT ("detected: knob=value"), never FAIL.
CHOICES = {
    "layout-scales-first-undeclared": ("LAYOUT.ORDER", "entry_field_order", "scales_first",
                                       _packer(variants={"entry_field_order": "scales_first"})),
    "layout-v32-mla-act-quant-floor-undeclared": ("LAYOUT.V32.MLA", "v32_mla_scale_floor", "amax",
                                                  _packer(variants={"v32_mla_scale_floor": "amax"})),
}


# A mistake beside such a choice: still FAIL on its own rule (tests/test_mutants_layout.py).
BESIDE_CHOICES = {
    "layout-v32-mla-act-quant-floor-tail-big-endian": ("LAYOUT.ORDER", _packer(
        variants={"v32_mla_scale_floor": "amax"}, tail_big_endian=True)),
}


def build_choice(name: str):
    """(rule, knob, value, provider) of an undeclared implementation-defined choice."""
    rule_id, knob, value, overrides = CHOICES[name]
    return rule_id, knob, value, mutant(name, **overrides)


def build(name: str):
    rule_id, overrides = MUTANTS[name] if name in MUTANTS else BESIDE_CHOICES[name]
    return rule_id, mutant(name, **overrides)


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, *build(name)) for name in MUTANTS]
