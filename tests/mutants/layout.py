"""Layout mutants: entry packers with one realistic mistake each (rule caught on, in MUTANTS).

They are built on the spec's own packer with a different layout, field order or byte order, so
each differs from a correct packer in exactly one respect.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

import dsv4spec.impl.layout as il
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


# Not mistakes: other allowed choices of implementation-defined layouts, made without declaring
# them.  The suite names them VARIANT ("detected: knob=value"), never FAIL.
CHOICES = {
    "layout-scales-first-undeclared": ("LAYOUT.ORDER", "entry_field_order", "scales_first",
                                       _packer(variants={"entry_field_order": "scales_first"})),
}


def build_choice(name: str):
    """(rule, knob, value, provider) of an undeclared implementation-defined choice."""
    rule_id, knob, value, overrides = CHOICES[name]
    return rule_id, knob, value, mutant(name, **overrides)


def build(name: str):
    rule_id, overrides = MUTANTS[name]
    return rule_id, mutant(name, **overrides)


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, *build(name)) for name in MUTANTS]
