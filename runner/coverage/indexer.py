"""The coverage boundaries of IDX and HAD: visibility, masks, scores, chunks, weights, top-k."""

from __future__ import annotations

import numpy as np

from ...spec import formats as F
from ...spec import indexer as spec_indexer
from ...spec.rules import V4_ALL
from .boundary import arg, Boundary, F32, of, _rows, seen


# ---------------------------------------------------------------------------------------------
# Indexer
# ---------------------------------------------------------------------------------------------

def visible_boundaries() -> list[Boundary]:
    def hit(ratio, offset, decode=False):
        def pred(calls):
            for c in of(calls, "index_visible"):
                p, r = np.asarray(c.args[0]), int(c.args[1])
                if r == ratio and (not decode or p.size == 1) and np.any((p + 1) % r == offset % r):
                    return True
            return False
        return pred
    out = []
    for r in (2, 4, 128):
        out += [Boundary(f"ratio {r}: p + 1 a multiple of {r} (a new entry becomes visible)", "element", hit(r, 0)),
                Boundary(f"ratio {r}: one position before", "element", hit(r, -1)),
                Boundary(f"ratio {r}: one position after", "element", hit(r, 1)),
                Boundary(f"ratio {r}: decode (one position) on the multiple", "layout", hit(r, 0, True))]
    return out + [Boundary("ratio 1", "element", lambda calls: any(int(c.args[1]) == 1 for c in of(calls, "index_visible"))),
                  Boundary("position 0", "range", lambda calls: any(np.any(np.asarray(c.args[0]) == 0)
                                                                   for c in of(calls, "index_visible")))]


def _score_calls(calls, dtype=None):
    out = []
    for c in of(calls, "index_scores"):
        d = c.args[4] if len(c.args) > 4 else c.kwargs.get("score_dtype", "bf16")
        if dtype is None or d == dtype:
            out.append((c, d))
    return out


def _visible_rows(pred):
    def reached(calls):
        for c, _ in _score_calls(calls):
            visible, S = np.asarray(c.args[3]), np.asarray(c.args[1]).shape[0]
            if np.any(pred(visible, S, np.arange(visible.size))):
                return True
        return False
    return reached


def mask_boundaries() -> list[Boundary]:
    def all_negative(calls):
        for c, _ in _score_calls(calls):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            s = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32")
            rows = visible > 0
            if np.any(rows & np.all(np.where(np.isfinite(s), s < 0, True), axis=1)):
                return True
        return False
    return [Boundary("a row with visible = 0", "range", _visible_rows(lambda v, S, t: v == 0)),
            Boundary("a row with visible = S", "range", _visible_rows(lambda v, S, t: v == S)),
            Boundary("a row ≥ 1 with 0 < visible < S", "layout", _visible_rows(lambda v, S, t: (v > 0) & (v < S) & (t >= 1))),
            Boundary("a row whose visible scores are all negative (a masked 0 would win)", "element", all_negative)]


def _scores_differ(a_dtype, b_kind):
    """Some score where two roundings differ: the BF16 steps vs fp32 then one cast, or vs fp32."""
    def reached(calls):
        for c, d in _score_calls(calls, a_dtype):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            steps = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "bf16")
            exact = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32")
            other = spec_indexer.round_bf16(exact) if b_kind == "one_cast" else exact
            if np.any(np.isfinite(steps) & (steps != other)):
                return True
        return False
    return reached


def score_formula() -> list[Boundary]:
    def dots(pred):
        def reached(calls):
            for c, _ in _score_calls(calls):
                q, k, w = (np.asarray(a, dtype=np.float64) for a in c.args[:3])
                d = np.einsum("thd,sd->ths", q, k)
                if np.any(pred(d, w[:, :, None])):
                    return True
            return False
        return reached
    return [Boundary("a negative dot with a positive weight (ReLU zeroes it)", "element", dots(lambda d, w: (d < 0) & (w > 0))),
            Boundary("a negative dot with a negative weight (ReLU after the weight would keep it)", "element",
                     dots(lambda d, w: (d < 0) & (w < 0))),
            Boundary("a positive dot with a negative weight", "element", dots(lambda d, w: (d > 0) & (w < 0))),
            *(Boundary(f"score dtype {dtype}", "layout", lambda calls, dtype=dtype: bool(_score_calls(calls, dtype)))
              for dtype in ("bf16", "fp32"))]


def score_rounding() -> list[Boundary]:
    def dot_on_bf16_tie(calls):
        for c, _ in _score_calls(calls, "bf16"):
            q, k = (np.asarray(a, dtype=np.float64) for a in c.args[:2])
            d = np.einsum("thd,sd->ths", q, k).astype(F32)
            if np.any((F.f32_bits(d) & 0xFFFF) == 0x8000):
                return True
        return False
    def absorbed(calls):
        for c, _ in _score_calls(calls, "bf16"):
            q, k, w = (np.asarray(a, dtype=np.float64) for a in c.args[:3])
            dots = spec_indexer.round_bf16(np.einsum("thd,sd->ths", q, k))
            p = spec_indexer.round_bf16(np.maximum(dots, 0) * w[:, :, None])
            running = np.zeros_like(p[:, 0])
            for h in range(p.shape[1]):
                running = spec_indexer.round_bf16(running + p[:, h])
            if np.any(np.abs(running - spec_indexer.round_bf16(p.sum(1))) > 2 * spec_indexer.bf16_quantum(
                    np.maximum(np.abs(running), np.abs(p).max(1)))):
                return True
        return False
    def many_heads(calls):
        return any(np.asarray(c.args[0]).shape[0] >= 2 and np.asarray(c.args[0]).shape[1] >= 32
                   for c, _ in _score_calls(calls, "bf16"))
    return [Boundary("BF16 steps and fp32-then-one-cast differ", "element", _scores_differ("bf16", "one_cast")),
            Boundary("a BF16 running head sum drifts beyond the tolerance (small heads absorbed)", "element", absorbed),
            Boundary("a head's dot exactly on a BF16 tie", "element", dot_on_bf16_tie),
            Boundary("32 heads, several rows", "layout", many_heads)]


def v32_scores() -> list[Boundary]:
    def not_bf16(calls):
        for c, _ in _score_calls(calls, "fp32"):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            s = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32").astype(F32)
            if np.any(np.isfinite(s) & (F.bf16_round(s) != s)):
                return True
        return False
    return [Boundary("fp32 scores differ from the BF16-step scores", "element", _scores_differ("fp32", "steps")),
            Boundary("an fp32 score BF16 cannot hold", "element", not_bf16)]


def fp4_scores() -> list[Boundary]:
    def packed(index, pred):
        return lambda calls: any(pred(np.asarray(c.args[index])) for c in of(calls, "index_scores_fp4"))
    every = lambda p: np.unique(p & 0xF).size == 16 and np.unique(p >> 4).size == 16  # noqa: E731
    return [Boundary("every E2M1 code in both nibbles of q", "element", packed(0, every)),
            Boundary("every E2M1 code in both nibbles of k", "element", packed(2, every)),
            Boundary("k scales differing inside a row", "scale", packed(3, lambda s: np.any(s.min(-1) != s.max(-1)))),
            Boundary("32 heads, several rows and keys", "layout", packed(0, lambda p: p.shape[0] >= 2 and p.shape[1] >= 32))]


def tp_boundaries() -> list[Boundary]:
    def shards(calls):              # two calls of ≥ 2 heads each over the same keys: shards of one score
        parts = [c for c, _ in _score_calls(calls, "bf16") if np.asarray(c.args[0]).shape[1] >= 2]
        return any(np.array_equal(a.args[1], b.args[1]) and np.array_equal(a.args[3], b.args[3])
                   for i, a in enumerate(parts) for b in parts[i + 1:])
    return [Boundary("heads split into shards of ≥ 2 heads", "layout", shards),
            Boundary("a negative weight inside a shard", "element", lambda calls: any(
                np.any(np.asarray(c.args[2]) < 0) for c, _ in _score_calls(calls, "bf16")))]


def chunk_boundaries() -> list[Boundary]:
    def slices(pred):
        def reached(calls):
            cs = [c for c, _ in _score_calls(calls, "bf16")]
            for small in cs:
                qs = np.asarray(small.args[0])
                for big in cs:
                    qb = np.asarray(big.args[0])
                    if qb.shape[0] <= qs.shape[0] or qb.shape[1:] != qs.shape[1:]:
                        continue
                    for a in range(qb.shape[0] - qs.shape[0] + 1):
                        if np.array_equal(qb[a:a + qs.shape[0]], qs) and pred(a, small, big):
                            return True
            return False
        return reached
    def rows(call):
        return np.asarray(call.args[0]).shape[0]

    def keys(call):
        return np.asarray(call.args[1]).shape[0]
    decode = lambda a, s, b: rows(s) == 1 and keys(s) < keys(b)  # noqa: E731
    return [Boundary("a chunk starting at row ≥ 1", "layout", slices(lambda a, s, b: a >= 1 and rows(s) >= 2)),
            Boundary("decode of a row with fewer entries than the prefill", "layout", slices(decode))]


def weight_boundaries() -> list[Boundary]:
    return [Boundary(f"model {m}", "layout", lambda calls, m=m: any(c.args[1] == m for c in of(calls, "index_weights")))
            for m in V4_ALL]


def weight_v32_boundaries() -> list[Boundary]:
    """The one fp32 rounding of bf16(raw·2^-3)·q_scale·fl32(128^-0.5), either way, over scales."""
    c = float(np.float32(128 ** -0.5))

    def products(calls):
        for call in of(calls, "index_weights_v32"):
            exact = np.asarray(call.args[0], np.float64) * 0.125 * np.asarray(call.args[1], np.float64) * c
            yield exact, exact.astype(np.float32).astype(np.float64), np.asarray(call.args[1], np.float64)
    return [Boundary("a weight rounded up", "element", lambda calls: any((r > e).any() for e, r, _ in products(calls))),
            Boundary("a weight rounded down", "element", lambda calls: any((r < e).any() for e, r, _ in products(calls))),
            Boundary("q_scale 1", "scale", lambda calls: any((q == 1).any() for _, _, q in products(calls))),
            Boundary("q_scale ≤ 2^-30", "range", lambda calls: any((q <= 2.0 ** -30).any() for _, _, q in products(calls)))]


def _topk_rows(calls):
    for c in of(calls, "index_topk"):
        scores, visible = np.asarray(c.args[0], dtype=np.float64), np.asarray(c.args[1])
        k, order = int(c.args[2]), c.args[3]
        for t in range(scores.shape[0]):
            yield t, scores[t], int(visible[t]), k, order


def _kth_tie(row, n, k):
    vis = np.sort(row[:n])[::-1]
    return 0 < k < n and vis[k - 1] == vis[k]


def topk_boundaries() -> list[Boundary]:
    def rows(pred):
        return lambda calls: any(pred(t, row, n, k, o) for t, row, n, k, o in _topk_rows(calls))
    return [Boundary("k = 0", "range", rows(lambda t, r, n, k, o: k == 0)),
            Boundary("k = S (every column)", "range", rows(lambda t, r, n, k, o: k == r.size and k > 0)),
            Boundary("a row ≥ 1 with fewer visible entries than k (padding)", "layout", rows(lambda t, r, n, k, o: t >= 1 and 0 < n < k)),
            Boundary("visible = 0 with k > 0", "range", rows(lambda t, r, n, k, o: n == 0 and k > 0)),
            Boundary("a tie at the k-th score", "element", rows(lambda t, r, n, k, o: _kth_tie(r, n, k))),
            Boundary("finite scores past the visible range", "range", rows(lambda t, r, n, k, o: np.any(np.isfinite(r[n:])))),
            Boundary("visible scores beyond fp16's range (|s| > 65504)", "range",
                     rows(lambda t, r, n, k, o: 0 < k < n and np.any(np.isfinite(r[:n]) & (np.abs(r[:n]) > 65504)))),
            Boundary("visible nonzero scores below half fp16's smallest subnormal", "range",
                     rows(lambda t, r, n, k, o: 0 < k < n and np.any((r[:n] != 0) & (np.abs(r[:n]) <= 2.0 ** -25)))),
            Boundary("order 'score'", "layout", rows(lambda t, r, n, k, o: o == "score" and 1 < k < n)),
            Boundary("order 'position'", "layout", rows(lambda t, r, n, k, o: o == "position" and 1 < k < n))]


def idx_boundaries() -> dict[str, list[Boundary]]:
    topk = topk_boundaries()
    return {
        "IDX.VISIBLE": visible_boundaries(),
        "IDX.MASK": mask_boundaries(),
        "IDX.SCORE.FORMULA": score_formula(),
        "IDX.SCORE.ROUNDING": score_rounding(),
        "IDX.SCORE.V32_FP32": v32_scores(),
        "IDX.SCORE.FP4": fp4_scores(),
        "IDX.SCORE.TP": tp_boundaries(),
        "IDX.CHUNK": chunk_boundaries(),
        "IDX.WEIGHT.SCALE": weight_boundaries(),
        "IDX.WEIGHT.V32": weight_v32_boundaries(),
        "IDX.TOPK.COUNT": topk, "IDX.TOPK.PAD": topk, "IDX.TOPK.ORDER": [b for b in topk if b.level == "layout"],
        "IDX.TOPK.SELECTION": topk, "IDX.TOPK.TIES": [b for b in topk if "tie" in b.name or b.level == "layout"],
    }


def _sylvester(n: int) -> np.ndarray:
    return np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=np.float64)


def had_boundaries() -> dict[str, list[Boundary]]:
    def not_bf16(c):                # an exact H·x/√128 that BF16 cannot hold: the rounding decides
        x = np.asarray(arg(c, 0, "x"), dtype=np.float64)
        y = F32((x @ _sylvester(x.shape[-1]).T) / np.sqrt(x.shape[-1]))
        return np.any(F.bf16_round(y) != y)

    def spread(c):                  # nonzero inputs 2^20 apart: the tolerance's ‖x‖₁ term is not all
        a = np.abs(np.asarray(arg(c, 0, "x"), dtype=np.float64))
        return np.any(a.max(-1) >= 2.0 ** 20 * np.where(a > 0, a, np.inf).min(-1))
    rows = seen("hadamard", "several rows at once", "layout", lambda c: _rows(c) >= 2)
    return {"HAD.MATRIX": [seen("hadamard", "a basis vector (one column of H)", "element", lambda c: np.any(
                               (np.abs(np.asarray(c.args[0])) > 0).sum(-1) == 1)), rows,
                           *[seen("index_rotate", f"index_rotate for {m}", "range", lambda c, m=m: arg(c, 1, "model") == m)
                             for m in ("v3.2", "v4-flash")]],
            "HAD.ROUNDING": [seen("hadamard", "an fp32 result BF16 cannot hold", "element", not_bf16),
                             seen("hadamard", "inputs of exponents 2^20 apart in one row", "range", spread), rows],
            "HAD.ABSENT_V41": [seen("index_rotate", "index_rotate for v4.1-flash", "range",
                                    lambda c: arg(c, 1, "model") == "v4.1-flash")]}
