"""Budgets: cache bytes per token and multiply-adds per generated token, from each profile's layers.

Nothing here is typed in: every figure is a sum over the layer list of spec.models (backbone layers
only; the MTP / DSpark draft layers are left out), each layer's role from spec.pool.layer_role, the
entry sizes from spec.layout and the widths from the profile.  Results are exact (Fraction / int).

    compressed cache   sum over layers that own their compressed KV of
                       (main entry + index-K entry if the layer owns an indexer K) / ratio
    window             window · window-entry bytes, per layer, constant in the context
    indexer work       per generated token at context N: sum over indexing layers of
                       (entries scored) · index_n_heads · index_head_dim multiply-adds (q·k only)
    core attention     per layer: 2 · n_heads · head_dim · (window + compressed entries attended)
                       (q·k and p·v, K = V shared, MQA)

Sources: the layer lists of spec.models (V41-config; V4 ModelArgs, V4-model L34-80), the layer roles
(V4-model L466-471; V41-model L653-661, L500-503) and the entry layouts of spec.layout.
Profile fields this module derives rather than reads (spec.models has no such field): the pool
capacity topk_blocks · block_size = 16384 positions, and which layers own an index K (the layers
that own their KV and have an indexer).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import layout
from .models import Model, profile
from .pool import has_indexer, layer_role
from .rules import INFORMATIVE, V4, V4_ALL, rule

_SRC = "V4-model L466-474 (a compressing layer keeps a window plus max_seq_len // ratio compressed entries)"

rule("BUDGET.KV_BYTES", "compressed-cache bytes per token",
     """Bytes per token of the compressed caches = sum over the backbone layers that own their
     compressed KV of (main entry bytes + index-K entry bytes when the layer owns an indexer K) /
     compress ratio: V4-Flash 21·(584+68)/4 + 20·584/128 = 3514.25, V4-Pro 30·(584+68)/4 +
     31·584/128 = 5031.4375, V4.1-Flash 3·(288+68)/2 + (288+68)/1 = 890 (only the KV source layers
     2, 8, 14, 20 store KV).  HCA layers store no index K; the window is not included.""",
     applies_to=V4_ALL, policy="exact",
     sources=(_SRC, "V4-model L399 (the indexer's K cache: max_seq_len // ratio entries of index_head_dim)",
              "V41-model L669-679 (only KV source layers hold a compressed KV cache)",
              "V41-model L517-525 (only index-K owners hold a K cache)", "V41-config (compress_ratios, kv_source_layers)",
              "doc-000 summary L3", "doc-000 FP4 storage L8", "doc-000 Q&A 4 L19"))

rule("BUDGET.WINDOW", "sliding-window bytes, constant per layer",
     """Every backbone layer keeps a window of `window` = 128 tokens of uncompressed KV:
     128·584 = 74752 B per layer in V4 (the FP8 V4 main layout) and 128·528 = 67584 B in V4.1 (the
     SWA layout), independent of the context; it is reported apart from bytes per token.""",
     applies_to=V4_ALL, policy="exact",
     sources=("V4-model L64, L452, L473 (window_size 128: the first window rows of every layer's kv_cache)",
              "V41-config (window_size 128)", "V41-model L635, L663-668 (window_kv_cache of window_size rows, every layer)",
              "doc-003 §6.2 L199"))

rule("BUDGET.INDEX_WORK", "indexer multiply-adds per generated token",
     """At context N a decode step's indexer costs, per indexing layer, (entries scored) ·
     index_n_heads · index_head_dim multiply-adds: entries scored = N // ratio, linear in N.  In
     V4.1 re-index layers (24, 28, 32, 36; never the candidate source 20) a kernel that scores
     only the pool (PATH.POOL_SCAN) is bounded by topk_blocks · block_size = 16384; that is the
     model here.  The reference itself scores all N positions there and then masks those outside the pool, as
     document 000 also notes, so it saves nothing.  In that model, at N = 2^20 the four re-index
     layers go from 4·2^20·4096 ≈ 1.7e10 to 4·16384·4096 ≈ 2.7e8 (1/64) and the whole V4.1
     indexer to 0.394 of the no-pool cost.""",
     applies_to=V4_ALL, policy="exact",
     sources=("V41-model L555-557, L575 (scores, then masked_fill(~candidates, −inf))",
              "V41-config (candidate_topk_blocks 2048, candidate_block_size 8)", "doc-000 Q&A 1 L13", "doc-000 pool work L6",
              "doc-000 details L10", "doc-003 §1 L9", "doc-003 §8 L251"),
     differs="""Document 003 (§1, §8) says the indexer brings attention from O(n²) down to
     sub-linear cost.  Per generated token the indexer scores every visible compressed entry,
     (N // ratio) · H · D multiply-adds, which is linear in N (quadratic over a sequence); only
     the core attention after it is bounded (BUDGET.ATTN_WORK).""")

rule("BUDGET.ATTN_WORK", "core attention multiply-adds per token per layer",
     """A layer's core attention costs 2 · n_heads · head_dim multiply-adds (q·k and p·v over the
     shared 512-dim K = V) per attended entry; it attends min(window, N) window entries plus
     min(index_topk, N // ratio) selected entries (layers with their own or a shared top-k) or all
     N // ratio compressed entries (V4 HCA).  V4-Pro CSA: 2·128·512·(128 + 1024) = 150,994,944
     multiply-adds (302 MFLOP at two FLOPs each), independent of N once N ≥ 4096.""",
     applies_to=V4_ALL, policy="exact",
     sources=("V4-model L427-432, L268-276 (top-k, HCA)", "V4-model L528, L533 (one sparse_attn over window + selected rows)",
              "doc-002 Q&A 5 L23",
              "doc-002 design trade-offs L8"),
     differs="""Document 002 gives the core attention as about 151 MFLOP per token per layer (Q&A 5):
     150,994,944 is the count of multiply-adds, 302 MFLOP.  It also puts the indexer's 64 heads of
     128 dims at 1/8 of the compute of the 128-head, 512-dim attention (design trade-offs): that is
     the ratio of the q·k widths alone; counting p·v as well, per entry the indexer's 64·128
     multiply-adds are 1/16 of the attention's 2·128·512 (and it scores every entry, where the
     attention reads window + top-k).""")

rule("BUDGET.CLAIMS", "the claims ledger holds",
     """Every numeric claim of the source documents is recorded in spec.claims with the sections
     and lines it comes from, the value the spec computes and a verdict; a claim marked reproduced
     equals its computed value (within the rounding the claim states) and never rests on a rule
     whose `differs` disputes its document; a corrected one differs from it and names the rule
     whose `differs` says why; and a claim no numerics can check says so.""",
     applies_to=V4_ALL, policy="exact", status=INFORMATIVE,
     sources=("doc-000 whole L1-23", "doc-002 whole L1-29", "doc-003 whole L1-451",
              "V4-model L380-433 (the indexer the claims describe)"))


def _model(model) -> Model:
    m = profile(model) if isinstance(model, str) else model
    if m.name not in V4_ALL:
        raise ValueError(f"budgets cover {', '.join(V4_ALL)}; {m.name} has no compressed KV cache")
    return m


def entry_layouts(model) -> dict[str, layout.Layout]:
    """The layouts of a model's main, index-K and window entries."""
    m = _model(model)
    if m.name in V4:
        return {"main": layout.V4_MAIN_KV, "index": layout.FP4_INDEX_K, "window": layout.V4_MAIN_KV}
    return {"main": layout.V41_MAIN_KV, "index": layout.FP4_INDEX_K, "window": layout.V41_SWA_KV}


def pool_capacity(model) -> int:
    """Positions a V4.1 candidate pool holds at most: topk_blocks · block_size (0 without a pool)."""
    m = _model(model)
    return m.candidate_topk_blocks * m.candidate_block_size


@dataclass(frozen=True)
class LayerBudget:
    layer: int
    ratio: int
    kind: str                 # the role kind of spec.pool.layer_role
    main_bytes: Fraction      # per token
    index_bytes: Fraction     # per token
    window_bytes: int         # constant
    indexer_macs: int         # per generated token at the given context
    attention_macs: int       # per generated token at the given context


def owns_kv(model: Model, layer: int) -> bool:
    return model.ratio(layer) > 0 and layer_role(model, layer).kv_source == layer


def owns_index_k(model: Model, layer: int) -> bool:
    return owns_kv(model, layer) and has_indexer(layer_role(model, layer))


def scored_entries(model, layer: int, context: int, pool: bool = True) -> int:
    """Entries one decode step's indexer scores in this layer at context N (0 without an indexer)."""
    m = _model(model)
    role = layer_role(m, layer)
    if not has_indexer(role):
        return 0
    visible = context // m.ratio(layer)
    if pool and role.pool_source >= 0:
        return min(visible, pool_capacity(m))
    return visible


def indexer_layer_macs(model, layer: int, context: int, pool: bool = True) -> int:
    m = _model(model)
    return scored_entries(m, layer, context, pool) * m.index_n_heads * m.index_head_dim


def attended_entries(model, layer: int, context: int) -> int:
    m = _model(model)
    window = min(m.window, context)
    ratio = m.ratio(layer)
    if ratio == 0:
        return window
    visible = context // ratio
    selects = layer_role(m, layer).topk_source >= 0       # its own or a shared top-k; HCA: none
    return window + (min(m.index_topk, visible) if selects else visible)


def core_attention_macs(model, layer: int, context: int) -> int:
    m = _model(model)
    return 2 * m.n_heads * m.head_dim * attended_entries(m, layer, context)


def layer_budget(model, layer: int, context: int = 0, pool: bool = True, sharing: bool = True) -> LayerBudget:
    m = _model(model)
    lay = entry_layouts(m)
    ratio = m.ratio(layer)
    stores = owns_kv(m, layer) if sharing else ratio > 0
    main = Fraction(lay["main"].nbytes, ratio) if stores else Fraction(0)
    index = Fraction(lay["index"].nbytes, ratio) if owns_index_k(m, layer) else Fraction(0)
    return LayerBudget(layer, ratio, layer_role(m, layer).kind, main, index,
                       m.window * lay["window"].nbytes, indexer_layer_macs(m, layer, context, pool),
                       core_attention_macs(m, layer, context))


def layer_budgets(model, context: int = 0, pool: bool = True, sharing: bool = True) -> tuple[LayerBudget, ...]:
    m = _model(model)
    return tuple(layer_budget(m, layer, context, pool, sharing) for layer in m.backbone)


def main_kv_bytes_per_token(model, sharing: bool = True) -> Fraction:
    """Main compressed KV only; sharing=False: as if every compressed layer stored its own."""
    return sum((b.main_bytes for b in layer_budgets(model, sharing=sharing)), Fraction(0))


def index_k_bytes_per_token(model) -> Fraction:
    return sum((b.index_bytes for b in layer_budgets(model)), Fraction(0))


def kv_bytes_per_token(model) -> Fraction:
    return main_kv_bytes_per_token(model) + index_k_bytes_per_token(model)


def window_bytes_per_layer(model) -> int:
    m = _model(model)
    return m.window * entry_layouts(m)["window"].nbytes


def indexer_macs_per_token(model, context: int, pool: bool = True) -> int:
    return sum(b.indexer_macs for b in layer_budgets(model, context, pool))


def reindex_layers(model) -> tuple[int, ...]:
    m = _model(model)
    return tuple(layer for layer in m.backbone if layer_role(m, layer).pool_source >= 0)


def reindex_macs(model, context: int, pool: bool = True) -> int:
    return sum(indexer_layer_macs(model, layer, context, pool) for layer in reindex_layers(model))


def indexer_pool_saving(model, context: int) -> Fraction:
    """Whole-indexer work with the pool over without it (1 for models without a pool)."""
    without = indexer_macs_per_token(model, context, pool=False)
    return Fraction(indexer_macs_per_token(model, context, pool=True), without) if without else Fraction(1)


def summary(model, context: int) -> dict:
    """Per layer kind (role kind and ratio): layer count and sums; plus totals.  For the CLI."""
    m = _model(model)
    rows: dict[str, dict] = {}
    for b in layer_budgets(m, context):
        key = f"{b.kind} (ratio {b.ratio})"
        r = rows.setdefault(key, {"layers": 0, "main_bytes_per_token": Fraction(0), "index_k_bytes_per_token": Fraction(0),
                                  "window_bytes": 0, "indexer_macs": 0, "attention_macs": 0})
        r["layers"] += 1
        r["main_bytes_per_token"] += b.main_bytes
        r["index_k_bytes_per_token"] += b.index_bytes
        r["window_bytes"] += b.window_bytes
        r["indexer_macs"] += b.indexer_macs
        r["attention_macs"] += b.attention_macs
    totals = {"layers": len(m.backbone), "main_bytes_per_token": main_kv_bytes_per_token(m),
              "index_k_bytes_per_token": index_k_bytes_per_token(m), "window_bytes": sum(r["window_bytes"] for r in rows.values()),
              "indexer_macs": indexer_macs_per_token(m, context),
              "indexer_macs_without_pool": indexer_macs_per_token(m, context, pool=False),
              "attention_macs": sum(r["attention_macs"] for r in rows.values())}
    totals["kv_bytes_per_token"] = totals["main_bytes_per_token"] + totals["index_k_bytes_per_token"]
    totals["kv_bytes_at_context"] = totals["kv_bytes_per_token"] * context + totals["window_bytes"]
    return {"model": m.name, "context": context, "rows": rows, "totals": totals}
