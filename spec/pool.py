"""V4.1 hierarchical sparse indexer: the candidate pool (POOL.*) and the layer roles (LAYER.*).

The candidate-source layer (20) scores every reachable position, groups positions into blocks of
8, keeps the 2048 blocks with the highest maxima (the block of the newest reachable position
always among them) and hands the resulting per-query bool mask to the re-index layers, which take
their own top-512 inside it.

Sources: V41-model L488-610 (Indexer, select_candidate_blocks), L653-661 (roles); doc-000 (V4.1
hierarchical sparse indexer).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .indexer import index_topk, visibility_mask
from .models import Model
from .rules import V4, V41, knob, rule

SELECT = "V41-model L583-610 (select_candidate_blocks)"
TOPK_BLOCKS = 2048
BLOCK_SIZE = 8
POOL_CAPACITY = TOPK_BLOCKS * BLOCK_SIZE  # 16384 positions


# ------------------------------------------------------------------------------------------------
# POOL: select_candidate_blocks
# ------------------------------------------------------------------------------------------------
def newest_block(compress_len: int, block_size: int = BLOCK_SIZE) -> int:
    """The block of the newest reachable position; −1 (none) when nothing is reachable.

    Python's // floors, so compress_len = 0 gives (0 − 1) // 8 = −1, not block 0."""
    return (compress_len - 1) // block_size


def block_scores(row, compress_len: int, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """Block maxima of one row padded with −inf to a whole number of blocks, newest block +inf."""
    row = np.asarray(row, dtype=np.float64)
    n_blocks = -(-row.size // block_size)
    padded = np.full(n_blocks * block_size, -np.inf)
    padded[: row.size] = row
    scores = padded.reshape(n_blocks, block_size).max(axis=1)
    last = newest_block(compress_len, block_size)
    if last >= 0:
        scores[last] = np.inf
    return scores


def selected_blocks(scores: np.ndarray, topk_blocks: int = TOPK_BLOCKS) -> np.ndarray:
    """The top min(topk_blocks, n_blocks) blocks, minus those scoring −inf (ties: lowest index)."""
    order = np.lexsort((np.arange(scores.size), -scores))[: min(topk_blocks, scores.size)]
    keep = np.zeros(scores.size, dtype=bool)
    keep[order] = scores[order] > -np.inf
    return keep


def candidate_blocks(scores, compress_lens, topk_blocks: int = TOPK_BLOCKS,
                     block_size: int = BLOCK_SIZE) -> np.ndarray:
    """The per-query candidate mask [T, W]: whole kept blocks, cut at the row width W."""
    scores = np.asarray(scores, dtype=np.float64)
    width = scores.shape[1]
    pool = np.zeros(scores.shape, dtype=bool)
    for t, row in enumerate(scores):
        keep = selected_blocks(block_scores(row, int(compress_lens[t]), block_size), topk_blocks)
        pool[t] = np.repeat(keep, block_size)[:width]
    return pool


def reindex_topk(scores, visible, pool, k: int) -> np.ndarray:
    """A re-index layer's top-k: its scores outside the pool set to −inf, V4.1 order.

    Only pool positions are eligible; a row whose pool holds fewer than min(k, visible) visible
    positions is padded with −1 (never the case for a pool from candidate_blocks and k ≤ 16377)."""
    scores = np.asarray(scores, dtype=np.float64)
    eligible = np.asarray(pool, dtype=bool) & visibility_mask(visible, scores.shape[1])
    masked = np.where(eligible, scores, -np.inf)
    out = index_topk(masked, visible, k, "position")
    taken = np.take_along_axis(eligible, np.maximum(out, 0), axis=1)
    out = np.where((out >= 0) & taken, out, -1)
    return _valid_first(out)


def _valid_first(indices: np.ndarray) -> np.ndarray:
    """Move −1 entries to the tail, keeping the valid ones in their order."""
    out = np.full_like(indices, -1)
    for t, row in enumerate(indices):
        valid = row[row >= 0]
        out[t, : valid.size] = valid
    return out


knob("pool_pin_empty", "none",
     {"block0": "truncating division: (0 − 1) / 8 → 0 pins block 0 when nothing is reachable"},
     """What is pinned when compress_lens = 0.  Canonical: nothing ((0 − 1) // 8 = −1 with floor
     division, an out-of-range block).""")

rule("POOL.BLOCK_SCORE", "Block score = max of its 8 positions, padded with −inf",
     """The row of W scores is padded with −inf to ceil(W/8) blocks of 8; a block's score is the
     maximum of its 8 entries.  The multiset of block scores of the kept blocks (the newest block
     counted as +inf) equals the reference one.""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-model L598-599 (pad with −inf, amax over blocks of block_size)", "doc-000 Q&A 1 L13"))

rule("POOL.PIN_NEWEST", "The newest reachable block is always in the pool",
     """When compress_lens > 0 the block (compress_lens − 1) // 8 of the newest reachable
     position gets score +inf, so it is in the pool even when older full blocks outscore it.""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-model L604-605 (last = (compress_lens − 1) // block_size gets +inf)", "doc-000 Q&A 2 L15",
              "doc-000 details L10"))

rule("POOL.PIN_EMPTY", "Nothing is pinned when compress_lens = 0",
     """With compress_lens = 0, (0 − 1) // 8 = −1 under floor division: no block is pinned, and
     since no position is reachable (all −inf) the pool is empty.""",
     applies_to=V41, policy="structural", knob="pool_pin_empty",
     sources=(SELECT, "V41-model L604-605 (Python floor division: (0 − 1) // 8 = −1 matches no block)"))

rule("POOL.PIN_COUNTS", "The pinned block is one of the 2048",
     """The pinned block takes one of the min(2048, n_blocks) top-k slots; it is not an extra
     block, so a pool never holds more than 2048 blocks.""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-model L604-607 (the pin is a score; topk takes min(topk_blocks, num_blocks))"))

rule("POOL.TOPK_BLOCKS", "The pool is the top min(2048, n_blocks) blocks by block score",
     """The kept blocks are the min(2048, n_blocks) blocks with the largest block scores (ties
     among equal maxima are implementation-defined, topk_ties), minus those scoring −inf.""",
     applies_to=V41, policy="structural", knob="topk_ties",
     sources=(SELECT, "V41-model L607 (scores.topk(min(topk_blocks, num_blocks)))", "doc-000 Q&A 1 L13"))

rule("POOL.DROP_INF", "Blocks without a reachable finite score are dropped",
     """A selected block whose score is −inf (no reachable position) is not in the pool: every
     pool block holds at least one reachable position, and positions at or past compress_lens
     appear only inside the newest block.""",
     applies_to=V41, policy="structural",
     sources=("V41-model L583-610 (select_candidate_blocks)",
              "V41-model L609 (keep = scatter(top.indices, top.values > −inf))"))

rule("POOL.MASK", "The pool is a per-query bool mask of whole blocks",
     """candidate_blocks returns a bool mask with the shape of the scores [T, W]: the union of the
     kept blocks' 8 positions, cut at W (repeat_interleave(8)[..., :W]).""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-model L610 (repeat_interleave(block_size)[..., :width])", "doc-000 Q&A 2 L15 (a bool table per query)"))

rule("POOL.SIZE", "At most 16384 positions",
     """A pool holds at most 2048 · 8 = 16384 positions; with N > 16384 reachable positions it
     holds at least 2047 · 8 + 1 = 16377 reachable ones (≥ 512), so the re-index top-512 is never
     short of candidates.  It holds fewer only when fewer than 2047 older blocks hold a finite
     score, since blocks whose scores are all −inf are dropped (POOL.DROP_INF) — never at the
     candidate source, whose reachable scores are finite.""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-config (candidate_topk_blocks 2048, candidate_block_size 8)", "doc-000 summary L3 (at most 16384 candidates)",
              "doc-000 Q&A 1 L13"))

rule("POOL.ALL_REACHABLE", "All reachable positions are candidates iff N ≤ 16384",
     """With finite scores at the N = compress_lens reachable positions, every one of them is in
     the pool if and only if ceil(N/8) ≤ 2048, i.e. N ≤ 16384; at N = 16385 some reachable block
     is pruned.  Document 000 states the same boundary: the pool prunes nothing below 16384
     tokens, and pruning starts only once the context exceeds 16384 (Q&A 2).""",
     applies_to=V41, policy="structural",
     sources=(SELECT, "V41-config (candidate_topk_blocks 2048, candidate_block_size 8)", "doc-000 details L10",
              "doc-000 Q&A 2 L15"))

rule("POOL.REINDEX", "Re-index layers take top-k inside the pool",
     """A re-index layer sets its own scores outside the pool to −inf and takes top-512 with the
     V4.1 order (ascending positions, −1 at the tail): row t holds min(k, |pool ∩ visible|) valid
     indices, every one a visible pool position, and their scores are a top-k of the
     pool-restricted scores (tie-aware; which of equal scores are taken is implementation-defined,
     topk_ties).  No position outside the pool is ever selected.  The pool is one made by candidate
     selection, so it never holds fewer than min(k, visible) visible positions.""",
     applies_to=V41, policy="tie-aware",
     sources=("V41-model L555-557, L575 (masked_fill(~candidates, −inf))",
              "V41-model L578-580 (topk, sorted by position, −1 past compress_lens)", "doc-000 Q&A 1 L13", "doc-000 Q&A 2 L15"))


# ------------------------------------------------------------------------------------------------
# LAYER: roles
# ------------------------------------------------------------------------------------------------
class Role(NamedTuple):
    """What one layer does in sparse attention.

    kind: window | dsa | csa | hca | index_source | candidate_source | reindex | reuse
    kv_source: the layer whose compressed KV it reads (−1: none)
    topk_source: the layer whose top-k indices it attends to (−1: none or all visible entries)
    pool_source: the layer whose candidate pool masks its scores (−1: unrestricted)"""

    kind: str
    kv_source: int = -1
    topk_source: int = -1
    pool_source: int = -1


ROLE_KINDS = ("window", "dsa", "csa", "hca", "index_source", "candidate_source", "reindex", "reuse")


def layer_role(model: Model, layer: int) -> Role:
    if not 0 <= layer < len(model.compress_ratios):
        raise ValueError(f"layer_role: {model.name} has layers 0..{len(model.compress_ratios) - 1}, got {layer}")
    ratio = model.ratio(layer)
    if ratio == 0:
        return Role("window")
    if model.candidate_source_layer >= 0:
        return _v41_role(model, layer)
    if model.window == 0:                     # V3.2 (no window): every layer indexes its own tokens
        return Role("dsa", layer, layer)
    if ratio == 4:                            # V4 CSA: own compressor and indexer
        return Role("csa", layer, layer)
    return Role("hca", layer)                 # V4 HCA: all visible compressed entries, no indexer


def _v41_role(model: Model, layer: int) -> Role:
    kv = max(s for s in model.kv_source_layers if s <= layer)
    index = max(s for s in model.index_source_layers if s <= layer)
    cand = model.candidate_source_layer
    pool = cand if (layer == index and 0 <= cand < layer) else -1
    if layer == cand:
        return Role("candidate_source", kv, index)
    if layer != index:
        return Role("reuse", kv, index)
    return Role("reindex" if pool >= 0 else "index_source", kv, index, pool)


def layer_roles(model: Model) -> tuple[Role, ...]:
    return tuple(layer_role(model, layer) for layer in range(len(model.compress_ratios)))


def has_indexer(role: Role) -> bool:
    return role.kind in ("dsa", "csa", "index_source", "candidate_source", "reindex")


rule("LAYER.V4", "V4 layer roles: indexer only in ratio-4 layers",
     """In V4-Flash and V4-Pro (MTP layer included) a ratio-4 (CSA) layer has its own compressor
     and lightning indexer; a ratio-128 (HCA) layer has no indexer and attends to every visible
     compressed entry; a ratio-0 layer attends to its window only.""",
     applies_to=V4, policy="exact",
     sources=("V4-model L466-471, L268-276 (HCA)", "V4-model L453 (compress_ratio = compress_ratios[layer_id])",
              "V4-model L508-514 (the indexer's top-k, or every compressed entry)", "doc-003 §2.1 L31"))

rule("LAYER.V41", "V4.1 layer roles: sources, candidate source, re-index, reuse",
     """V4.1-Flash: layers 0, 1 and 40–42 are window-only; 2, 8, 14 (ratio 2) own their KV and
     index K and take their own top-512 (of scores against layer 20's index K at even decode
     positions: PATH.K.PUBLISHED); 20 (ratio 1) does the same and is the candidate source
     (its own top-512 unrestricted); 24, 28, 32, 36 read layer 20's KV and index K, mask their
     own scores to layer 20's pool and take top-512; every other layer reuses the KV of the
     preceding KV source and the top-k of the preceding index source.""",
     applies_to=V41, policy="exact",
     sources=("V41-config (compress_ratios, kv_source_layers, index_source_layers, candidate_source_layer)",
              "V41-model L653-661 (Attention.__init__: is_kv_source, is_index_source, backbone layers only)",
              "V41-model L500-503 (Indexer.__init__: owns_k, is_candidate_source, uses_candidates)",
              "V41-model L569-575 (the candidate source publishes the pool; later indexers mask to it)",
              "V41-model L725-726, L763 (other layers reuse the published top-k and compressed KV)",
              "doc-000 Q&A 1 L13", "doc-000 Q&A 5 L21"))
