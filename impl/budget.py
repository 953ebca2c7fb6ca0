"""Budgets as an engine's cache planner would compute them: walk the layers, allocate caches.

    kv_bytes_per_token(model) -> float          compressed-cache bytes per token (window excluded)
    window_bytes_per_layer(model) -> int        the constant sliding-window cache of one layer
    indexer_macs_per_token(model, context, pool=True) -> int
    core_attention_macs(model, layer, context) -> int

These are plain functions of a model name (no tensors); written independently of spec.budget
(from the profile's lists, not from the layer roles) so that the BUDGET checks compare two
derivations.
"""
from __future__ import annotations

from ..spec import layout
from ..spec.models import profile

__all__ = ["kv_bytes_per_token", "window_bytes_per_layer", "indexer_macs_per_token", "core_attention_macs"]


def _entries(m):
    if m.candidate_source_layer >= 0:           # V4.1: FP4 main KV, FP8 window
        return layout.V41_MAIN_KV.nbytes, layout.FP4_INDEX_K.nbytes, layout.V41_SWA_KV.nbytes
    return layout.V4_MAIN_KV.nbytes, layout.FP4_INDEX_K.nbytes, layout.V4_MAIN_KV.nbytes


def _cache_plan(m):
    """(layer, ratio, stores main KV, stores index K) for every backbone layer."""
    for layer in range(m.n_layers):
        ratio = m.compress_ratios[layer]
        if m.kv_source_layers:                  # V4.1: only the KV sources store, and own an index K
            owner = layer in m.kv_source_layers
            yield layer, ratio, owner, owner
        else:                                   # V4: every compressed layer stores; CSA adds index K
            yield layer, ratio, ratio > 0, ratio == 4


def kv_bytes_per_token(model: str) -> float:
    m = profile(model)
    main, index, _ = _entries(m)
    total = 0.0
    for _, ratio, stores_main, stores_index in _cache_plan(m):
        total += (main if stores_main else 0) / ratio if ratio else 0.0
        total += (index if stores_index else 0) / ratio if ratio else 0.0
    return total


def window_bytes_per_layer(model: str) -> int:
    m = profile(model)
    return m.window * _entries(m)[2]


def _indexing_layers(m):
    if m.index_source_layers:
        return m.index_source_layers
    return [layer for layer in range(m.n_layers) if m.compress_ratios[layer] == 4]


def indexer_macs_per_token(model: str, context: int, pool: bool = True) -> int:
    m = profile(model)
    capacity = m.candidate_topk_blocks * m.candidate_block_size
    total = 0
    for layer in _indexing_layers(m):
        scored = context // m.compress_ratios[layer]
        if pool and 0 <= m.candidate_source_layer < layer:
            scored = min(scored, capacity)
        total += scored * m.index_n_heads * m.index_head_dim
    return total


def core_attention_macs(model: str, layer: int, context: int) -> int:
    m = profile(model)
    ratio = m.compress_ratios[layer]
    entries = min(m.window, context)
    if ratio:
        visible = context // ratio
        entries += visible if ratio == 128 else min(m.index_topk, visible)
    return 2 * m.n_heads * m.head_dim * entries
