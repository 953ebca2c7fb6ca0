"""Budget mutants: cost models with one realistic mistake each (rule caught on, in MUTANTS)."""
from __future__ import annotations

import dsv4spec.impl as impl
import dsv4spec.impl.budget as ib
from dsv4spec.spec import layout
from dsv4spec.spec.models import profile

from . import mutant

BASE = impl      # impl re-exports the budget operations


def _kv_bytes(model, *, hca_ratio=None, index_on_hca=False, sharing=True):
    m = profile(model)
    main, index, _ = ib._entries(m)
    total = 0.0
    for layer in range(m.n_layers):
        ratio = m.compress_ratios[layer]
        if not ratio:
            continue
        if m.kv_source_layers and sharing:
            stores_main = stores_index = layer in m.kv_source_layers
        else:
            stores_main, stores_index = True, ratio in (1, 2, 4) or index_on_hca
        if ratio == 128 and hca_ratio:
            ratio = hca_ratio
        total += (main * stores_main + index * stores_index) / ratio
    return total


def _indexer_pool_from_source(model, context, pool=True):
    """The pool is applied at every layer from the candidate source on, layer 20 included."""
    m = profile(model)
    total = 0
    for layer in ib._indexing_layers(m):
        scored = context // m.compress_ratios[layer]
        if pool and 0 <= m.candidate_source_layer <= layer:
            scored = min(scored, m.candidate_topk_blocks * m.candidate_block_size)
        total += scored * m.index_n_heads * m.index_head_dim
    return total


def _window_v4_layout(model):
    return profile(model).window * layout.V4_MAIN_KV.nbytes


def _attention_qk_only(model, layer, context):
    return ib.core_attention_macs(model, layer, context) // 2


def _window_only_layers_counted(model):
    """The window-only (ratio 0) layers billed one main entry per token, as if their window were a cache."""
    m = profile(model)
    main, _, _ = ib._entries(m)
    return ib.kv_bytes_per_token(model) + main * sum(1 for r in m.compress_ratios if r == 0)


def _window_without_pad(model):
    """V4's window entry taken as its 583 content bytes (the pad byte dropped)."""
    m = profile(model)
    return m.window * (layout.V4_MAIN_KV.nbytes - 1) if m.candidate_source_layer < 0 else ib.window_bytes_per_layer(model)


def _indexer(model, context, pool=True, *, heads=None, scored_of=None, capacity=None, hca=False):
    m = profile(model)
    cap = capacity(m) if capacity else m.candidate_topk_blocks * m.candidate_block_size
    total = 0
    layers = list(ib._indexing_layers(m))
    for layer in layers + [l for l, r in enumerate(m.compress_ratios[:m.n_layers]) if hca and r == 128]:
        ratio = m.compress_ratios[layer]
        scored = scored_of(context, ratio) if scored_of else context // ratio
        if pool and 0 <= m.candidate_source_layer < layer:
            scored = min(scored, cap)
        total += scored * (heads(m) if heads else m.index_n_heads) * m.index_head_dim
    return total


def _attention(model, layer, context, *, cap_window=True, cap_topk=True, hca_topk=False):
    m = profile(model)
    ratio = m.compress_ratios[layer]
    entries = min(m.window, context) if cap_window else m.window
    if ratio:
        visible = context // ratio
        selected = min(m.index_topk, visible) if cap_topk else m.index_topk
        entries += selected if ratio != 128 or hca_topk else visible
    return 2 * m.n_heads * m.head_dim * entries


MUTANTS = {
    "budget-hca-counted-at-ratio-4": ("BUDGET.KV_BYTES", dict(kv_bytes_per_token=lambda m: _kv_bytes(m, hca_ratio=4))),
    "budget-index-k-on-hca-layers": ("BUDGET.KV_BYTES", dict(kv_bytes_per_token=lambda m: _kv_bytes(m, index_on_hca=True))),
    "budget-sharing-ignored": ("BUDGET.KV_BYTES", dict(kv_bytes_per_token=lambda m: _kv_bytes(m, sharing=False))),
    "budget-pool-at-layer-20": ("BUDGET.INDEX_WORK", dict(indexer_macs_per_token=_indexer_pool_from_source)),
    "budget-v41-window-in-v4-layout": ("BUDGET.WINDOW", dict(window_bytes_per_layer=_window_v4_layout)),
    "budget-attention-qk-only": ("BUDGET.ATTN_WORK", dict(core_attention_macs=_attention_qk_only)),
    # every clause reachable (issue 22)
    "budget-window-only-layers-counted": ("BUDGET.KV_BYTES", dict(kv_bytes_per_token=_window_only_layers_counted)),
    "budget-v4-window-without-pad": ("BUDGET.WINDOW", dict(window_bytes_per_layer=_window_without_pad)),
    "budget-indexer-attention-heads": ("BUDGET.INDEX_WORK", dict(indexer_macs_per_token=lambda m, n, pool=True: _indexer(
        m, n, pool, heads=lambda p: p.n_heads))),
    "budget-indexer-entries-rounded-up": ("BUDGET.INDEX_WORK", dict(indexer_macs_per_token=lambda m, n, pool=True: _indexer(
        m, n, pool, scored_of=lambda n, r: -(-n // r)))),
    "budget-indexer-on-hca-layers": ("BUDGET.INDEX_WORK", dict(indexer_macs_per_token=lambda m, n, pool=True: _indexer(
        m, n, pool, hca=True))),
    "budget-pool-counted-in-blocks": ("BUDGET.INDEX_WORK", dict(indexer_macs_per_token=lambda m, n, pool=True: _indexer(
        m, n, pool, capacity=lambda p: p.candidate_topk_blocks))),
    "budget-window-entries-not-capped": ("BUDGET.ATTN_WORK", dict(core_attention_macs=lambda m, l, n: _attention(
        m, l, n, cap_window=False))),
    "budget-topk-not-capped": ("BUDGET.ATTN_WORK", dict(core_attention_macs=lambda m, l, n: _attention(
        m, l, n, cap_topk=False))),
    "budget-hca-capped-at-topk": ("BUDGET.ATTN_WORK", dict(core_attention_macs=lambda m, l, n: _attention(
        m, l, n, hca_topk=True))),
}


def build(name: str):
    rule_id, overrides = MUTANTS[name]
    return rule_id, mutant(name, base=BASE, **overrides)


def catalogue() -> list[tuple]:
    """(name, the rule it must fail, the target provider)."""
    return [(name, *build(name)) for name in MUTANTS]
