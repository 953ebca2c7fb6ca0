"""Checks of the budgets (BUDGET.*).

Budget operations are plain functions of a model name (and a context length), not tensor ops:

    kv_bytes_per_token(model) -> float                      BUDGET.KV_BYTES
    window_bytes_per_layer(model) -> int                    BUDGET.WINDOW
    indexer_macs_per_token(model, context, pool=True) -> int   BUDGET.INDEX_WORK
    core_attention_macs(model, layer, context) -> int       BUDGET.ATTN_WORK

A serving engine's memory planner or cost model exposes them to be checked against the layer
lists.  BUDGET.CLAIMS is informative: the claims ledger is a property of the spec, not of a target,
so `dsv4spec claims` and tests/test_claims.py hold it, not a check.
"""
from __future__ import annotations

from hypothesis import strategies as st

from ..spec import budget as spec
from ..spec.models import profile
from ..spec.rules import V4_ALL
from .checking import check, forall

OPS = {
    "kv_bytes_per_token": "kv_bytes_per_token(model: str) -> float",
    "window_bytes_per_layer": "window_bytes_per_layer(model: str) -> int",
    "indexer_macs_per_token": "indexer_macs_per_token(model: str, context: int, pool: bool = True) -> int",
    "core_attention_macs": "core_attention_macs(model: str, layer: int, context: int) -> int",
}

# Contexts around the boundaries: ratio multiples, the pool capacity 16384 (and ±1), 2^20 = "1M"; and
# long ones with every low bit drawn (an HCA layer's window + context/128 entries then has more
# significant bits than BF16 holds: a count computed in floats is caught).
CONTEXTS = st.one_of(st.sampled_from([0, 1, 3, 4, 127, 128, 129, 4096, 16383, 16384, 16385, 32768, 2**20]),
                     st.integers(0, 2**21), st.integers(2**15, 2**21))


@check("BUDGET.KV_BYTES", ops=("kv_bytes_per_token",))
def kv_bytes_from_the_layer_list(target):
    for model in V4_ALL:
        want = spec.kv_bytes_per_token(model)
        got = target.kv_bytes_per_token(model)
        assert got == want, (f"BUDGET.KV_BYTES: {model} gives {got} B/token, expected {float(want)} = main "
                             f"{spec.main_kv_bytes_per_token(model)} + index K {spec.index_k_bytes_per_token(model)}")


@check("BUDGET.WINDOW", ops=("window_bytes_per_layer",))
def window_is_a_constant_per_layer(target):
    for model in V4_ALL:
        want = spec.window_bytes_per_layer(model)
        lay = spec.entry_layouts(model)["window"]
        got = target.window_bytes_per_layer(model)
        assert got == want, (f"BUDGET.WINDOW: {model} gives {got} B, expected {profile(model).window} × "
                             f"{lay.nbytes} B ({lay.kind}) = {want}")


@check("BUDGET.INDEX_WORK", ops=("indexer_macs_per_token",))
@forall(*[dict(model="v4.1-flash", context=n, pool=True) for n in (2**20, 16384, 16385, 0)],
        model=st.sampled_from(V4_ALL), context=CONTEXTS, pool=st.booleans())
def indexer_work_per_layer_list(target, model, context, pool):
    want = spec.indexer_macs_per_token(model, context, pool)
    got = target.indexer_macs_per_token(model, context, pool=pool)
    if got != want:
        layers = {b.layer: b.indexer_macs for b in spec.layer_budgets(model, context, pool) if b.indexer_macs}
        raise AssertionError(f"BUDGET.INDEX_WORK: {model} at context {context} (pool={pool}) gives {got} "
                             f"multiply-adds, expected {want}; per layer {layers}")


@check("BUDGET.ATTN_WORK", ops=("core_attention_macs",))
@forall(dict(model="v4-pro", layer_fraction=0.04, context=2**20),      # layer 2, CSA: the 151 M figure
        model=st.sampled_from(V4_ALL), layer_fraction=st.floats(0, 1), context=CONTEXTS)
def core_attention_per_layer(target, model, layer_fraction, context):
    m = profile(model)
    layer = min(int(layer_fraction * m.n_layers), m.n_layers - 1)
    want = spec.core_attention_macs(model, layer, context)
    got = target.core_attention_macs(model, layer, context)
    assert got == want, (f"BUDGET.ATTN_WORK: {model} layer {layer} (ratio {m.ratio(layer)}) at context {context} "
                         f"gives {got}, expected 2·{m.n_heads}·{m.head_dim}·"
                         f"{spec.attended_entries(model, layer, context)} = {want}")
