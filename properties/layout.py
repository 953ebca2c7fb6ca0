"""Checks of the KV entry layouts (LAYOUT.*).

The operations a target provides:

    entry_pack(kind, x) -> data
        x float32 [..., dims] -> uint8 [..., nbytes]: quantize one cached vector per row and lay
        its fields out as bytes.
    entry_unpack(kind, data) -> values
        uint8 [..., nbytes] -> float32 [..., dims]: the dequantized vector; raises ValueError or
        TypeError on a malformed buffer.

kind is one of spec.layout.KINDS (v4_main_kv, fp4_index_k, v41_main_kv, v41_swa_kv,
v32_index_k, v32_mla_kv).  The expected bytes are spec.layout.pack under every knob the target declares
(entry_field_order, v41_main_rope and the codec knobs of the quant family), so a declared variant
passes as VARIANT and an undeclared one is named.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import formats as F
from ..spec import layout as spec
from ..spec import RULES
from ..spec.rules import KNOBS
from .compare import as_numpy, assert_bytes_equal, assert_equal
from .formats import fit
from .checking import check, forall

OPS = {
    "entry_pack": "entry_pack(kind, x f32 [..., dims]) -> uint8 [..., nbytes]",
    "entry_unpack": "entry_unpack(kind, data uint8 [..., nbytes]) -> f32 [..., dims]; ValueError/TypeError if malformed",
}

RULE_OF_KIND = {"v4_main_kv": "LAYOUT.V4.MAIN", "fp4_index_k": "LAYOUT.INDEX_K",
                "v41_main_kv": "LAYOUT.V41.MAIN", "v41_swa_kv": "LAYOUT.V41.SWA",
                "v32_index_k": "LAYOUT.V32.INDEX_K", "v32_mla_kv": "LAYOUT.V32.MLA"}


def variants_of(target) -> dict:
    return {k: target.variant(k) for k in KNOBS}


def layout_of(target, kind: str) -> spec.Layout:
    """The kind's layout, asked only of a target serving one of its models (its rule's applies_to)."""
    target.asked_for(*RULES[RULE_OF_KIND[kind]].applies_to)
    return spec.layout(kind, target.variant("v41_main_rope"))


# --- inputs ---------------------------------------------------------------------------------------

# Blocks that sit on codec edges: E2M1 ties at scale 1 (amax 6),
# the floating-log2 edge 96.00000762939453, a small E4M3/16 block, division vs reciprocal, an E4M3
# scale that saturates (amax 2785), an all-zero block, a single nonzero element.
EDGE_BLOCKS = [
    [6.0, 0.75, 1.75, 3.5, 0.25, 1.25, 2.5, 5.0],
    [96.00000762939453, 10.0],
    [0.05, 0.01],
    [0.17578125, 0.03662109375],
    [0.08203125, 0.02392577938735485],
    [2785.0, -1000.0, 3.0],
    [],
    [-0.0, 1e-30],
]


def edge_entry(kind: str, first_block: list, rest_seed: int = 0) -> np.ndarray:
    """One entry whose first 16 values are `first_block` (zero-filled), the rest random."""
    dims = spec.LAYOUTS[kind].dims
    x = np.random.default_rng(rest_seed).standard_normal(dims).astype(np.float32)
    x[:16] = 0
    x[:len(first_block)] = np.asarray(first_block, np.float32)
    return x[None]


def quiet_entry(kind: str) -> np.ndarray:
    """An entry every block of which has amax < 448·1e-4 (where the V3.2 MLA scale floors differ)."""
    return edge_entry(kind, [], 9) * np.float32(2.0 ** -10)


@st.composite
def entries(draw, kind: str) -> np.ndarray:
    """A batch of entries: random normal values with a per-block scale spanning many binades."""
    dims = spec.LAYOUTS[kind].dims
    rows = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo, hi = sorted((draw(st.integers(-30, 20)), draw(st.integers(-30, 20))))
    blocks = dims // 16
    scale = 2.0 ** rng.integers(lo, hi + 1, size=(rows, blocks, 1))
    x = rng.standard_normal((rows, blocks, 16)) * scale
    if draw(st.booleans()):
        x[:, rng.integers(0, blocks)] = 0.0              # an all-zero block
    return x.reshape(rows, dims).astype(np.float32)


def tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def field_at(lay: spec.Layout, order: str):
    """A context function: which field (and which element of it) byte index idx belongs to."""
    bounds, start = [], 0
    for name in spec.FIELD_ORDERS[order]:
        n = lay.fields[name].nbytes
        bounds.append((name, start, start + n))
        start += n

    def context(idx):
        b = idx[-1]
        for name, lo, hi in bounds:
            if lo <= b < hi:
                return f"byte {b} is {name}[{b - lo}] of a {lay.nbytes}-byte {lay.kind} entry (order {order})"
        return f"byte {b} is past the {lay.nbytes}-byte entry"
    return context


# --- one rule per entry kind: size and the round trip ----------------------------------------------

def _kind_checks(kind: str):
    rule_id = RULE_OF_KIND[kind]
    examples = [dict(x=edge_entry(kind, b, i)) for i, b in enumerate(EDGE_BLOCKS)]
    examples.append(dict(x=quiet_entry(kind)))

    @check(rule_id, ops=("entry_pack",))
    @forall(dict(x=edge_entry(kind, [])), x=entries(kind))
    def size(target, x):
        x = fit(target, "entry_pack", x)
        lay = layout_of(target, kind)
        out = target.entry_pack(kind, tensor(x))
        fields = ", ".join(f"{f.count} {f.format.name} ({f.nbytes} B)" for f in lay.fields.values() if f.nbytes)
        assert out.dtype == torch.uint8, f"{rule_id}: entry_pack({kind}) returned {out.dtype}, expected uint8"
        assert tuple(out.shape) == (*x.shape[:-1], lay.nbytes), (
            f"{rule_id}: entry_pack({kind}) gave shape {tuple(out.shape)}, expected "
            f"{(*x.shape[:-1], lay.nbytes)}: {fields} = {lay.nbytes} bytes")

    @check(rule_id, ops=("entry_pack", "entry_unpack"))
    @forall(*examples, x=entries(kind))
    def round_trip(target, x):
        x = fit(target, "entry_pack", x)
        variants = variants_of(target)
        got = target.entry_unpack(kind, target.entry_pack(kind, tensor(x)))
        assert_equal(got, spec.qdq(kind, x, variants),
                     what=f"{rule_id}: entry_unpack(entry_pack({kind}, x)) vs the codec's dequantization",
                     context=lambda idx: f"input x{list(idx)} = {x[idx]!r}")

    size.__name__, round_trip.__name__ = f"{kind}_size", f"{kind}_round_trip"


for _kind in spec.KINDS:
    _kind_checks(_kind)


# --- LAYOUT.ORDER ---------------------------------------------------------------------------------

kind_and_entries = st.sampled_from(spec.KINDS).flatmap(lambda k: entries(k).map(lambda x: (k, x)))


@check("LAYOUT.ORDER", ops=("entry_pack",))
@forall(*[dict(case=(k, edge_entry(k, [5.0, -1.5, 0.25], 3))) for k in spec.KINDS],
        dict(case=("v32_mla_kv", quiet_entry("v32_mla_kv"))), case=kind_and_entries)
def fields_in_declared_order(target, case):
    kind, x = case
    x = fit(target, "entry_pack", x)
    variants = variants_of(target)
    lay = layout_of(target, kind)
    want = spec.pack(kind, x, variants)
    got = as_numpy(target.entry_pack(kind, tensor(x)))
    assert_bytes_equal(got, want, what=f"LAYOUT.ORDER: entry_pack({kind}) bytes",
                       context=field_at(lay, variants["entry_field_order"]))


# --- LAYOUT.UNPACK --------------------------------------------------------------------------------

def random_entries(kind: str, lay: spec.Layout, order: str, rng, rows: int) -> np.ndarray:
    """Uniformly random bytes, scales redrawn until none is NaN (FP32 scales: finite, positive)."""
    data = rng.integers(0, 256, size=(rows, lay.nbytes), dtype=np.uint8)
    fields = spec.split(lay, data, {"entry_field_order": order})
    scales = fields["scales"]
    if lay.scale is spec.FP32:
        exponents = rng.integers(-40, 40, size=scales.shape[:-1] + (scales.shape[-1] // 4,))
        scales[...] = spec.le_bytes(np.ldexp(1.0, exponents).astype("<f4"))
    else:
        while True:
            bad = spec.nan_scales(lay, scales)
            if not bad.any():
                break
            scales[bad] = rng.integers(0, 256, size=int(bad.sum()), dtype=np.uint8)
    return data


@check("LAYOUT.UNPACK", ops=("entry_unpack",))
@forall(kind=st.sampled_from(spec.KINDS), seed=st.integers(0, 2**32 - 1))
def unpack_dequantizes_any_valid_entry(target, kind, seed):
    variants = variants_of(target)
    lay = layout_of(target, kind)
    data = random_entries(kind, lay, variants["entry_field_order"], np.random.default_rng(seed), 3)
    got = target.entry_unpack(kind, tensor(data))
    assert_equal(got, spec.unpack(kind, data, variants),
                 what=f"LAYOUT.UNPACK: entry_unpack({kind}) of random valid bytes (seed {seed})")


# --- LAYOUT.REJECT --------------------------------------------------------------------------------

def assert_rejects(target, kind: str, data: np.ndarray, why: str):
    try:
        target.entry_unpack(kind, torch.from_numpy(data))
    except (ValueError, TypeError) as e:
        assert str(e), f"LAYOUT.REJECT: entry_unpack({kind}) raised {type(e).__name__} with no message ({why})"
        return
    raise AssertionError(f"LAYOUT.REJECT: entry_unpack({kind}) accepted {why} instead of raising "
                         f"ValueError/TypeError")


NAN_SCALE_BYTES = {"E8M0": [F.E8M0_NAN_CODE], "E4M3": [F.E4M3_NAN_CODE, 0x80 | F.E4M3_NAN_CODE]}


@check("LAYOUT.REJECT", ops=("entry_unpack",))
@forall(*[dict(kind=k, seed=0, which=w) for k in spec.KINDS for w in (0, 1, 2)],   # each NaN code of each kind
        kind=st.sampled_from(spec.KINDS), seed=st.integers(0, 2**32 - 1), which=st.integers(0, 10**6))
def malformed_entries_raise(target, kind, seed, which):
    variants = variants_of(target)
    lay = layout_of(target, kind)
    order = variants["entry_field_order"]
    rng = np.random.default_rng(seed)
    good = random_entries(kind, lay, order, rng, 2)
    assert_rejects(target, kind, np.ascontiguousarray(good[:, :-1]), f"entries of {lay.nbytes - 1} bytes")
    assert_rejects(target, kind, np.concatenate([good, good[:, :1]], axis=1), f"entries of {lay.nbytes + 1} bytes")
    assert_rejects(target, kind, good.view(np.int8), "int8 data")
    bad = good.copy()
    scales = spec.split(lay, bad, {"entry_field_order": order})["scales"]   # a view into bad
    row = which % scales.shape[0]
    if lay.scale is spec.FP32:
        at = 4 * ((which // 2) % (scales.shape[1] // 4))
        scales[row, at:at + 4] = spec.le_bytes(np.array([np.nan if which % 3 else np.inf], "<f4"))
        label = "an FP32 NaN/Inf scale"
    else:
        code = NAN_SCALE_BYTES[lay.scale.name][which % len(NAN_SCALE_BYTES[lay.scale.name])]
        scales[row, (which // 2) % scales.shape[1]] = code
        label = f"the NaN {lay.scale.name} scale byte 0x{code:02x}"
    assert_rejects(target, kind, bad, label)


# --- LAYOUT.V4.MAIN, LAYOUT.V32.MLA: attention over a packed cache --------------------------------

def cache_form_of(target, kind: str) -> str:
    """The form of `kind` that sparse_attention_cache of `target` takes (its CACHE_FORMS; the entries
    themselves when it declares none of that kind)."""
    return next(iter(target.cache_forms_of(kind)), kind)


def one_entry_lists(seed: int, kind: str, target):
    """A cache of 2 pages of entries as the layout writes them (tile magnitudes 2^-20..2^10, so every
    dequantized value is a normal BF16), each token's list with one valid entry among −1s, q = 0 and a
    sink 300 below: each probability is exactly 1, so the output is the entry's values, exactly."""
    rng = np.random.default_rng(seed)
    lay = spec.layout(kind)
    n, T = 2 * spec.PAGE, 3
    H = target.fit_size("sparse_attention_cache", "H", 16)
    K = target.fit_size("sparse_attention_cache", "K", 8)
    x = rng.standard_normal((n, lay.dims)).astype(np.float32)
    tiles = x[:, :lay.quantized_dims].reshape(n, -1, lay.block)
    tiles *= 2.0 ** rng.integers(-20, 11, tiles.shape[:2])[..., None]
    entries = spec.pack(kind, x)
    indices = np.full((T, K), -1)
    chosen = rng.integers(0, n, T)
    indices[np.arange(T), rng.integers(0, K, T)] = chosen
    q = np.zeros((T, H, lay.dims), np.float32)
    return entries, indices, chosen, q, np.full(H, -300.0, np.float32)


def _cache_check(rule_id: str, kind: str):
    @check(rule_id, ops=("sparse_attention_cache",))
    @forall(seed=st.integers(0, 2**32 - 1))
    def attention_reads_each_entry_as_the_layout_says(target, seed):
        form = cache_form_of(target, kind)
        entries, indices, chosen, q, sink = one_entry_lists(seed, kind, target)
        cache = spec.as_cache(form, entries)
        got = target.sparse_attention_cache(tensor(q), tensor(cache), form, tensor(sink),
                                            torch.from_numpy(indices.astype(np.int32)), 512 ** -0.5,
                                            model="v4-flash")
        want = spec.cache_values(kind, entries)[chosen, None, :spec.CACHE_VALUE_DIMS]
        # + 0.0: a sum of products holds no −0 (an E4M3 −0 is read as 0)
        assert_equal(as_numpy(got) + 0.0, np.broadcast_to(want, q.shape[:2] + (spec.CACHE_VALUE_DIMS,)) + 0.0,
                     what=f"{rule_id}: sparse_attention_cache over a {form} cache, one entry a list "
                          "(its probability 1): the output is the entry dequantized by the layout, in BF16",
                     context=lambda idx: f"token {idx[0]} reads entry {chosen[idx[0]]}, whose bytes are "
                                         f"{entries[chosen[idx[0]]].tolist()[:8]}…")
    attention_reads_each_entry_as_the_layout_says.__name__ = f"{kind}_attention_reads_each_entry"


_cache_check("LAYOUT.V4.MAIN", "v4_main_kv")
_cache_check("LAYOUT.V32.MLA", "v32_mla_kv")
