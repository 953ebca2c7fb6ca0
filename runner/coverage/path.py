"""The coverage boundaries of PATH and LAYER: the layer calls, rings, caches and published keys."""

from __future__ import annotations

import numpy as np

from .boundary import arg, Boundary, _rows, seen
from .pool import reindex_boundaries


def layer_boundaries() -> dict[str, list[Boundary]]:
    def layers(models):
        return [seen("layer_role", f"layer 0 of {m}", "layout", lambda c, m=m: arg(c, 0, "model") == m and
                     int(arg(c, 1, "layer")) == 0) for m in models] + [
                seen("layer_role", f"layers 1 … 3 of {m} (the first pattern)", "layout", lambda c, m=m: arg(
                    c, 0, "model") == m and 1 <= int(arg(c, 1, "layer")) <= 3) for m in models] + [
                seen("layer_role", f"a layer ≥ 40 of {m}", "layout", lambda c, m=m: arg(c, 0, "model") == m
                     and int(arg(c, 1, "layer")) >= 40) for m in models]
    return {"LAYER.V4": layers(("v4-flash", "v4-pro")), "LAYER.V41": layers(("v4.1-flash",))}


def _blocks_apart(c) -> bool:
    x = np.abs(np.asarray(arg(c, 0, "x"), np.float64)).reshape(-1, 512)
    amax = x.reshape(x.shape[0], -1, 16).max(-1)
    return bool(np.any(amax.max(-1) >= 2.0 ** 12 * np.where(amax > 0, amax, np.inf).min(-1)))


def _layer_call(c):
    """(model profile, ratio, seqlen, start_pos) of an index_layer call."""
    from ...spec.models import profile
    m = profile(arg(c, 99, "model"))
    return m, m.ratio(int(arg(c, 99, "layer"))), int(np.shape(arg(c, 0, "inputs")["x"])[0]), int(arg(c, 99, "start_pos") or 0)


def layer_call_boundaries() -> list[Boundary]:
    """Where a layer's stages decide, as the drawn layer cases reach them (path.layer_keys)."""
    def entries(c):
        m, r, T, p = _layer_call(c)
        return (p + T) // r if r else 0

    def decode(pred):
        return lambda c: _layer_call(c)[3] > 0 and pred(*_layer_call(c))

    def prefill(pred):
        return lambda c: _layer_call(c)[3] == 0 and pred(*_layer_call(c))
    return [seen("index_layer", "decode after the ring wrapped (start ≥ 128)", "range", decode(lambda m, r, T, p: p >= m.window)),
            seen("index_layer", "decode while the ring fills (start < 128)", "range", decode(lambda m, r, T, p: p < m.window)),
            seen("index_layer", "decode completing an entry at ratio > 1 (start mod ratio = ratio − 1)", "range",
                 decode(lambda m, r, T, p: r > 1 and (p + 1) % r == 0)),
            seen("index_layer", "prefill at a multiple of the ratio > 1", "range", prefill(lambda m, r, T, p: r > 1 and T % r == 0)),
            seen("index_layer", "more compressed entries than the top-k", "range", lambda c: entries(c) > _layer_call(c)[0].index_topk),
            seen("index_layer", "V4.1 entries beyond the pool (16384)", "range", lambda c: _layer_call(c)[1] > 0 and entries(c) >
                 _layer_call(c)[0].candidate_topk_blocks * _layer_call(c)[0].candidate_block_size > 0)]


def published_k_boundaries() -> list[Boundary]:
    """Where PATH.K.PUBLISHED decides: a V4.1 source's decode step that publishes nothing, and there
    more entries than the top-k (the selection then follows the scored cache)."""
    from ...spec.path import reads_published_k

    def published(c):
        m, r, T, p = _layer_call(c)
        return reads_published_k(m, int(arg(c, 99, "layer")), T, p)
    return [seen("index_layer", "a V4.1 source decoding a step that completes no group", "range", published),
            seen("index_layer", "there more compressed entries than the top-k", "range",
                 lambda c: published(c) and (_layer_call(c)[3] + 1) // _layer_call(c)[1] > _layer_call(c)[0].index_topk)]


def path_boundaries() -> dict[str, list[Boundary]]:
    def start(c):
        return int(arg(c, 1, "start_pos"))

    def seqlen(c):
        return int(arg(c, 0, "seqlen"))
    window = [seen("window_index", "prefill longer than the window (128)", "range", lambda c: start(c) == 0 and seqlen(c) > 128),
              seen("window_index", "prefill within the window", "range", lambda c: start(c) == 0 and 0 < seqlen(c) <= 128),
              seen("window_index", "decode before the ring fills (start < 128)", "range", lambda c: 0 < start(c) < 128),
              seen("window_index", "decode after the ring wrapped (start ≥ 128)", "range", lambda c: start(c) >= 128)]
    hca = [seen("compressed_index", "decode at a start position not a multiple of the ratio", "range",
                lambda c: start(c) > 0 and start(c) % 128 != 0),
           seen("compressed_index", "prefill from 0", "range", lambda c: start(c) == 0)]
    layer = [seen("index_layer", f"an index_layer of {m}", "range", lambda c, m=m: arg(c, 99, "model") == m)
             for m in ("v4-flash", "v4-pro", "v4.1-flash")]
    drawn = layer_call_boundaries()
    def ring(name, pred):
        return seen("window_ring", name, "range", lambda c: pred(int(arg(c, 0, "prefill")), int(arg(c, 1, "decoded"))))
    rings = [ring("a prefill of at most 128 (no slot overwritten)", lambda p, d: p <= 128),
             ring("a prefill longer than 128 (the ring wrapped in the prefill)", lambda p, d: p > 128),
             ring("a prefill within 2 of 128", lambda p, d: abs(p - 128) <= 2),
             ring("decode that wraps the ring (p + d crosses a multiple of 128)", lambda p, d: d > 0 and (p - 1) // 128
                  != (p + d - 1) // 128),
             ring("no decode step", lambda p, d: d == 0)]

    def k_rows(name, level, pred):
        return seen("kv_qdq_fp4_e8m0", name, level, lambda c: pred(np.abs(np.asarray(arg(c, 0, "x"), np.float64))))

    def amaxes(a):
        return a.reshape(a.shape[0] if a.ndim > 1 else 1, -1, 32).max(-1)
    k_cache = [k_rows("several keys", "layout", lambda a: a.ndim > 1 and a.shape[0] >= 2),
               k_rows("blocks of 32 whose amax is 2^12 apart in one key", "scale",
                      lambda a: np.any(amaxes(a).max(-1) >= 2.0 ** 12 * np.where(amaxes(a) > 0, amaxes(a), np.inf).min(-1))),
               k_rows("a block with amax below 2^-30", "range", lambda a: np.any((amaxes(a) > 0) & (amaxes(a) < 2.0 ** -30)))]
    return {"PATH.WINDOW.RING": rings, "PATH.K.CACHE": k_cache, "PATH.POOL_SCAN": [b for b in reindex_boundaries("pool_scan_topk") if b.name != "an empty pool row"],
            "PATH.WINDOW": window, "PATH.HCA": hca,
            "PATH.CONCAT": [seen("attention_index", "decode (one row)", "layout", lambda c: int(arg(c, 2, "seqlen")) == 1),
                            seen("attention_index", "prefill (several rows)", "layout", lambda c: int(arg(c, 2, "seqlen")) > 1)],
            "PATH.QDQ": [seen(f"kv_qdq_{fmt}", f"kv_qdq_{fmt} of several rows", "layout", lambda c: _rows(c) >= 2)
                         for fmt in ("fp4_e4m3", "fp8_e8m0_32")] + [
                seen(f"kv_qdq_{fmt}", f"kv_qdq_{fmt} of blocks 2^12 apart in one row", "scale", _blocks_apart)
                for fmt in ("fp4_e4m3", "fp8_e8m0_32")],
            **{rule: layer + drawn for rule in ("PATH.Q.PROJ", "PATH.HADAMARD", "PATH.W.PROJ", "PATH.LAYER")},
            **{rule: layer[2:] + drawn for rule in ("PATH.K.PROJ", "PATH.K.NORM")},    # V4.1's index K
            "PATH.K.PUBLISHED": published_k_boundaries(),
            "PATH.ORDER": layer + drawn + [seen("rope_quantize", "rope_quantize at a position > 0", "range",
                                        lambda c: np.any(np.asarray(arg(c, 1, "positions")) > 0))]}
