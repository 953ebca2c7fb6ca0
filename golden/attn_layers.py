"""Golden cases of the attention layer (ATTN.LAYER): one `attention_layer` case per layer kind, from
the index lists to the de-rotated output, every stored stage determined.

The attention output o = bf16(N / L) of ordinary inputs is not determined: N and L are fp32 sums of
exp's, and about 1% of the outputs lie within ATTN's tolerance of a BF16 midpoint, too many to
redraw.  These inputs make o exact instead:

- the main q [T, 4, 512] reads two channels only, 2t and 2t+1 for token t (q_attn 8 or 2 there, so
  V4's rescale is by exactly 2 or 8 and q_rescale is 16 in both; V4.1 passes q_attn = 16), and its RoPE
  tail is 0: every product q·k is exact and so is every partial sum (ATTN.SCORE's error is 0);
- the token's own new KV row (kv_normed[t], 256 in channels 2t and 2t+1) is its "star": its score
  s* = fl32(8192·scale) ≈ 362 is at least 120 above every other listed row's, so every other
  weight exp(s − M) is 0 in fp32 and the star's probability is exp(0) = 1, in any block order;
- the sink is s* on heads 2, 3 (exp(sink − M) = 1: L = 2) and far below on heads 0, 1 (L = 1).

So o = kv[star] / L, a BF16 value, and its admitted interval under spec.attn.bounds (any blocking,
sharpened dot error) rounds to that one value (asserted); the list order is free as well (one entry
holds all the weight), so the window columns of the lists compare as sets.  The KV rows are full
BF16 values that QDQ changes, their RoPE tails nonzero, and each row is redrawn until its rotation,
and the de-rotation of o, are determined (ROPE.ROUNDING's bound and another fp32 table, as
golden/layers.py does).  What these cases do not exercise: the main q's RoPE (its tail is 0) and
the softmax's rounding clauses (one weight); ATTN's own checks and the sparse_attention goldens
cover those.

The index-path kinds reuse the inputs of the index_layer case of the same layer (golden/layers.py);
their index stages are gated there, so an attention case stores only the lists of that path.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..spec import attn as SA
from ..spec import path as SP
from ..spec import pool as spec_pool
from ..spec import quant as Q
from ..spec import rope as R
from ..spec.indexer import round_bf16
from ..spec.models import profile
from ..spec.rules import V41
from .cases import Case, splitmix64
from .layers import LAYER_CASES, STAGE_RULES, Weight, _rotation, _searched, settled, spec_index_layer

HEADS = 4                       # heads 0, 1: sink far below (L = 1); 2, 3: sink at the row max (L = 2)
STAR = 256.0                    # the star row's two score channels
MARGIN = 120.0                  # s* − every other score: exp underflows to 0 in fp32 (below −103.3)
SINK_BELOW = -256.0

ATTN_STAGE_RULES = {
    "q_rescale": "ATTN.Q_NORM", "q_attn_rot": "ROPE.POSITIONS", "kv_rot": "ROPE.POSITIONS", "kv_window": "PATH.QDQ",
    "cmp_rot": "ROPE.POSITIONS", "cmp": "PATH.QDQ", "kv": "ATTN.GATHER", "o": "ATTN.PROB.ORDER",
    "o_derot": "ATTN.DEROTATE",
}
LIST_STAGES = ("window_idx", "compressed_idx", "topk", "indices")

NOTES = {
    "o": "determined: one listed row (the token's own, 'star') scores >= 120 above the others, so o = "
         "kv[star] / L with L = 1 (heads 0, 1, sink far below) or 2 (heads 2, 3, sink = the star's score); "
         "spec.attn.bounds (any blocking) admits that one BF16 value; the list order is free",
    "q_attn_rot": "the main q's RoPE tail is 0 (it keeps the dot products exact): this stage equals q_rescale, "
                  "its zeros compared without their sign (a rotated 0 is +0 or -0 by the formula's signs)",
    "index stages": "q .. scores of the index path are gated by the index_layer case of the same layer and inputs; "
                    "only the lists are stored here",
}


def _compresses(m, layer: int, start_pos: int) -> bool:
    return start_pos == 0 and m.ratio(layer) > 0 and (m.name not in V41 or layer in m.kv_source_layers)


# ------------------------------------------------------------------------------------------------
# one layer by spec/'s definitions, with where it is not determined
# ------------------------------------------------------------------------------------------------
def _qdq(x, model: str, compressed: bool) -> np.ndarray:
    """PATH.QDQ: V4 FP8 E8M0/64 on the NoPE channels, V4.1 FP8/32 (window) or FP4 E4M3/16 (compressed)."""
    if model not in V41:
        return np.concatenate([Q.fp8_qdq(x[..., :-64], 64), x[..., -64:]], -1)
    return SP.kv_qdq(x) if compressed else Q.fp8_qdq(x, 32)


def _lists(a: dict, model: str, layer: int, start_pos: int) -> dict:
    if spec_pool.layer_role(profile(model), layer).kind != "reuse":
        return spec_index_layer(a, model=model, layer=layer, start_pos=start_pos)
    T = a["kv_normed"].shape[0]
    window = SP.window_index(T, start_pos)
    return {"window_idx": window, "indices": SP.attention_index(window, a["source_topk"], T, start_pos)}


def spec_attention_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    """Every stage of the layer's attention (properties.attn's stage list), by spec/'s definitions."""
    return _layer(inputs, model, layer, start_pos)[0]


def _layer(a: dict, model: str, layer: int, start_pos: int) -> tuple[dict, dict]:
    """(stages, loose): loose[stage] marks the elements a conforming target may round otherwise."""
    m = profile(model)
    out, loose = _lists(a, model, layer, start_pos), {}
    T = out["window_idx"].shape[0]
    positions, freqs = SP.token_positions(T, start_pos), R.frequencies(m, layer)
    q = np.asarray(a["q_attn"], np.float64)
    out["q_rescale"], loose["q_rescale"] = SA.q_rescale(q, m), _q_rescale_loose(q, m)
    rot, where = _rotation(out["q_rescale"], positions, freqs, False)
    out["q_attn_rot"], loose["q_attn_rot"] = rot["rot"], where["rot"]
    rot, where = _rotation(np.asarray(a["kv_normed"], np.float64), positions, freqs, False)
    out["kv_rot"], loose["kv_rot"] = rot["rot"], where["rot"]
    out["kv_window"] = _qdq(out["kv_rot"], model, False)
    rows = out["kv_window"]
    if start_pos:
        rows = np.asarray(a["window_cache"], np.float64).copy()
        rows[start_pos % m.window] = out["kv_window"][0]
    ratio = m.ratio(layer)
    if ratio:
        if _compresses(m, layer, start_pos):
            entries = np.asarray(a["kv_entries"], np.float64)
            rot, where = _rotation(entries, R.compressed_positions(entries.shape[0], ratio), freqs, False)
            out["cmp_rot"], loose["cmp_rot"] = rot["rot"], where["rot"]
            out["cmp"] = _qdq(out["cmp_rot"], model, True)
            cmp = out["cmp"]
        else:
            cmp = np.asarray(a["kv_cache"], np.float64)
        rows = np.concatenate([rows, cmp])
    out["kv"] = rows
    sink, scale = np.asarray(a["sink"], np.float64), SA.softmax_scale(m)
    indices = np.asarray(out["indices"], np.int64)
    out["o"] = SA.sparse_attention(out["q_attn_rot"], rows, sink, indices, scale, m)
    lo, hi = SA.bounds(out["q_attn_rot"], rows, sink, indices, scale, SA.running_max_init(m), "any")
    loose["o"] = round_bf16(lo) != round_bf16(hi)
    rot, where = _rotation(out["o"], -positions, freqs, False)         # the conjugate: the rotation at −p
    out["o_derot"], loose["o_derot"] = rot["rot"], where["rot"]
    loose["star"] = _margin_short(out["q_attn_rot"], rows, indices, scale)
    return out, loose


def _q_rescale_loose(q, m) -> np.ndarray:
    """V4: where the rescale is not one BF16 value for every rsqrt within 2^-16 of the exact one
    (the squares and their mean are exact on these inputs: asserted); V4.1: nowhere (identity)."""
    if m.name in V41:
        return np.zeros(q.shape, dtype=bool)
    squares = round_bf16(q * q)
    if not (np.array_equal(squares, q * q) and np.array_equal(round_bf16(squares.mean(-1)), squares.mean(-1))):
        raise AssertionError("q_attn: its squares or their mean are not exact BF16 values")
    r = 1.0 / np.sqrt(squares.mean(-1, keepdims=True) + m.norm_eps)
    r_bf16 = round_bf16(r)
    return ~settled(r, r * 2.0 ** -16) | ~settled(q * r_bf16, np.abs(q * r_bf16) * 2.0 ** -16)


def _margin_short(q, rows, indices, scale) -> np.ndarray:
    """[T, H]: the star (the first-scoring entry) is not at least MARGIN above every other listed score."""
    s = np.sort(SA.scores(q, rows, indices, scale), axis=-1)
    return ~(s[..., -1] - s[..., -2] >= MARGIN) if s.shape[-1] > 1 else np.zeros(s.shape[:2], dtype=bool)


# ------------------------------------------------------------------------------------------------
# the inputs, redrawn row by row until every stage is determined
# ------------------------------------------------------------------------------------------------
def _q_attn(model: str, T: int) -> np.ndarray:
    """Channels 2t, 2t+1 of token t: V4 8 on even heads (mean of squares 1/4: rescaled by 2) and 2 on
    odd ones (mean 1/64: by 8), V4.1 16; every other channel 0."""
    q = np.zeros((T, HEADS, 512), dtype=np.float32)
    value = np.where(np.arange(HEADS) % 2 == 0, 8.0, 2.0) if model not in V41 else np.full(HEADS, 16.0)
    for t in range(T):
        q[t, :, 2 * t:2 * t + 2] = value[:, None]
    return q


def _sink(model: str) -> np.ndarray:
    """The star's fp32 score fl32(fl32(q·k)·scale) on heads 2, 3, far below it on 0, 1."""
    scale = np.float32(SA.softmax_scale(profile(model)))
    star = np.float32(np.float32(2 * 16 * STAR) * scale)
    return np.where(np.arange(HEADS) >= HEADS // 2, star, np.float32(SINK_BELOW)).astype(np.float32)


def _with_stars(values: np.ndarray) -> np.ndarray:
    """kv_normed with row t's channels 2t, 2t+1 set to STAR."""
    x = values.copy()
    for t in range(x.shape[0]):
        x[t, 2 * t:2 * t + 2] = STAR
    return x


def _with_pairs(values: np.ndarray, pairs: dict, seed: int) -> np.ndarray:
    """values with each RoPE pair (t, i) in `pairs` drawn anew, at its attempt, from its own stream
    (the pairs turn independently: one undetermined pair is redrawn alone)."""
    x = values.copy()
    for (t, i), attempt in sorted(pairs.items()):
        if not 0 < attempt < 256:
            raise ValueError(f"redraw attempt {attempt} of pair {(t, i)}: expected 1..255")
        stream = Weight(((seed * 1024 + t) * 32 + i) * 256 + attempt, (2, 1), -2, 0, bits=7)
        x[t, 448 + 2 * i:450 + 2 * i] = stream.array()[:, 0]
    return x


def _kv_recipe(seed: int, rows: int) -> Weight:
    """Full-mantissa BF16 values of magnitude 1/4 .. 2: QDQ changes them, RoPE tails nonzero."""
    return Weight(seed, (rows, 512), -2, 0, bits=7)


def _recipes(model: str, layer: int, T: int, start_pos: int, seed: int) -> dict[str, Weight]:
    m = profile(model)
    recipes = {"kv_normed": _kv_recipe(seed + 10, T)}
    if start_pos:
        recipes["window_cache"] = _kv_recipe(seed + 11, m.window)
    if m.ratio(layer):
        E = (start_pos + T) // m.ratio(layer)
        recipes["kv_entries" if _compresses(m, layer, start_pos) else "kv_cache"] = _kv_recipe(seed + 12, E)
    return recipes


def _source_topk(model: str, layer: int, T: int, start_pos: int, seed: int) -> np.ndarray:
    """A reuse layer's published top-k: distinct visible entries, ascending, −1 at the tail."""
    m = profile(model)
    ratio = m.ratio(layer)
    k = min(m.index_topk, (start_pos + T) // ratio)
    topk = np.full((T, k), -1, dtype=np.int64)
    for t, visible in enumerate((SP.token_positions(T, start_pos) + 1) // ratio):
        keys = splitmix64(seed * 1000 + t, int(visible))
        chosen = np.sort(np.argsort(keys, kind="stable")[:k])
        topk[t, :chosen.size] = chosen
    return topk


def _index_case(model: str, layer: int, T: int, start_pos: int):
    """(the index_layer case with these coordinates, with its searched inputs; its seed), or None."""
    for row in LAYER_CASES:
        if row[1:5] == (model, layer, T, start_pos):
            return _searched(*row), row[5]
    return None


def attention_stages(model: str, layer: int, start_pos: int) -> tuple[str, ...]:
    """The stages an attention case stores, in path order."""
    m = profile(model)
    kind = spec_pool.layer_role(m, layer).kind
    lists = {"window_idx", "indices"}
    lists |= {"compressed_idx"} if kind == "hca" else set()
    lists |= {"topk"} if kind in ("csa", "index_source", "candidate_source", "reindex") else set()
    attn = [s for s in ATTN_STAGE_RULES if s not in ("cmp_rot", "cmp") or _compresses(m, layer, start_pos)]
    return tuple(s for s in LIST_STAGES if s in lists) + tuple(attn)


def attention_layer_case(name: str, model: str, layer: int, seqlen: int, start_pos: int, seed: int) -> Case:
    """One attention_layer case, described; `build` searches its inputs (needed to generate only)."""
    kind = spec_pool.layer_role(profile(model), layer).kind
    outputs = attention_stages(model, layer, start_pos)
    rules = {s: ("POOL.REINDEX" if s == "topk" and kind == "reindex" else
                 "PATH.CONCAT" if s == "indices" and kind == "reuse" else
                 STAGE_RULES.get(s) or ATTN_STAGE_RULES[s]) for s in outputs}
    window = SP.window_index(seqlen, start_pos).shape[1]
    notes = {k: v for k, v in NOTES.items() if k != "index stages" or "topk" in outputs}
    return Case(name, "ATTN.LAYER", "attention_layer", {}, {"model": model, "layer": layer, "start_pos": start_pos},
                outputs, call="mapping", output_rules=rules, unordered={"window_idx": window, "indices": window},
                notes=notes, zero_sign_free=("q_attn_rot",),
                build=functools.partial(_built, name, model, layer, seqlen, start_pos, seed))


@functools.lru_cache(maxsize=None)
def _built(name: str, model: str, layer: int, seqlen: int, start_pos: int, seed: int) -> Case:
    m = profile(model)
    kind = spec_pool.layer_role(m, layer).kind
    base, generated = {}, {}
    if kind == "reuse":
        base["source_topk"] = _source_topk(model, layer, seqlen, start_pos, seed)
    elif kind in ("window", "hca"):
        generated["x"] = Weight(seed, (seqlen, m.dim), -1, 0)
        base["x"] = generated["x"].array()
    else:
        index = _index_case(model, layer, seqlen, start_pos)
        if index is None:
            raise ValueError(f"{name}: no index_layer case of {model} layer {layer}, seqlen {seqlen}, "
                             f"start_pos {start_pos} to take the index inputs from")
        index, index_seed = index
        base.update(index.inputs)
        generated.update(index.generated, x=Weight(index_seed, (seqlen, m.dim), -1, 0))     # layer_recipes' x
        if not np.array_equal(generated["x"].array(), base["x"]):
            raise AssertionError(f"{name}: the index case's x is not layer_recipes' (redrawn?)")
    recipes, pairs = _recipes(model, layer, seqlen, start_pos, seed), {}
    for _ in range(255):
        values = {k: r.array() for k, r in recipes.items()}
        values["kv_normed"] = _with_stars(_with_pairs(values["kv_normed"], pairs, seed))
        inputs = {**base, **values, "q_attn": _q_attn(model, seqlen), "sink": _sink(model)}
        stages, loose = _layer(inputs, model, layer, start_pos)
        if loose["q_rescale"].any() or loose["q_attn_rot"].any() or loose["star"].any():
            raise AssertionError(f"{name}: the main q's stages are not determined by construction")
        rows, redraw = set(), {"kv_entries": {int(j) for j in np.argwhere(loose["cmp_rot"])[:, 0]}
                               if "cmp_rot" in loose else set()}
        for stage in ("kv_rot", "o", "o_derot"):          # a token's own row makes all three
            for where in np.argwhere(loose[stage]):
                t, c = int(where[0]), int(where[-1])
                (rows.add((t, (c - 448) // 2)) if c >= 448 else redraw.setdefault("kv_normed", set()).add(t))
        for t_pair in rows:                               # a RoPE pair: its two values drawn again
            pairs[t_pair] = pairs.get(t_pair, 0) + 1
        for which, chosen in redraw.items():
            if chosen:
                recipes[which] = recipes[which].redrawn(chosen)
        if not rows and not any(redraw.values()):
            break
    else:
        raise RuntimeError(f"{name}: stages still not determined after 255 rounds")
    kept = {k: v for k, v in generated.items() if k in inputs}
    kept.update({k: recipes[k] for k in ("window_cache", "kv_cache", "kv_entries") if k in recipes})
    described = attention_layer_case(name, model, layer, seqlen, start_pos, seed)
    return dataclasses.replace(described, inputs=inputs, build=None, generated=kept)


ATTENTION_LAYER_CASES = (
    # name,                        model,        layer, seqlen, start_pos, seed
    ("attention_layer_v4_window",  "v4-flash",   0,     3,      0,         301),   # window only, prefill
    ("attention_layer_v4_csa",     "v4-flash",   2,     1,      27,        101),   # ratio 4, decode (index inputs)
    ("attention_layer_v4_hca",     "v4-flash",   3,     1,      127,       321),   # ratio 128, decode, ring full
    ("attention_layer_v41_window", "v4.1-flash", 0,     3,      0,         331),   # window only, prefill
    ("attention_layer_v41_l20",    "v4.1-flash", 20,    4,      0,         141),   # candidate source, prefill
    ("attention_layer_v41_l24",    "v4.1-flash", 24,    1,      20,        151),   # re-index, decode, ring filling
    ("attention_layer_v41_l21",    "v4.1-flash", 21,    4,      0,         361),   # reuse of layer 20, prefill
)


def attention_layer_cases() -> list[Case]:
    return [attention_layer_case(*row) for row in ATTENTION_LAYER_CASES]


ATTN_SPEC = {"attention_layer": spec_attention_layer}
