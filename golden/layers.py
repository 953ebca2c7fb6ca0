"""Golden cases of the indexer path (PATH.*): the index lists, what main attention reads, and one
`index_layer` case per layer kind at the profiles' real widths (heads × 128, q_lora_rank, dim).

Every stored stage is determined: any conforming target gives it bit for bit, so `golden check`
compares bytes and names the first stage that differs.  That takes two kinds of care:

- exact by construction: the activations and projection weights are coarse BF16 values
  ±(1 + m/4)·2^e, so every BF16 Linear (k, raw head weights) sums exactly in fp32 in any order
  (asserted: K·max|x|·max|w| stays below 2^24 of the products' finest quantum); the FP8 q
  projection's wq_b is one binade ±(1 + m/4)·2^-5, stored as E4M3 bytes under E8M0 block scales that
  differ from block to block, and qr is ±{1, 1.5}, which act_quant keeps exactly; each K block's sum
  stays below 2^13 of its quantum, so an FP8 MMA of 13 fraction bits sums it exactly too (asserted);
- determined by choice: the stages with an irrational factor (RoPE's cos and sin, the Hadamard's
  128^-0.5, V4's head-weight factor 2^-6.5, k_norm's rsqrt) and the score sums are rounded to BF16
  from a value known only within an error bound: the bound of the stage's rule, plus for RoPE a
  frequency table anywhere within ROPE.THETA's 2^-20 of the exact one.  Where the BF16 rounding of
  that interval is not one value (or, in V4's score order, two visible scores tie), the generator
  redraws the input row that feeds the element (its own splitmix64 stream) until none is left.

The values are integer-built like every golden input; only the search's decisions use float64
math (cos, sin, powers, platform functions within an ulp of float64).  A decision is an interval's
BF16 rounding, so it could differ between machines only if an interval end lay within ~2^-50 of a
BF16 midpoint, and the intervals are wide (2^-24 and more); tests/test_golden.py regenerates every
file on every numpy dispatch level.

The projection weights (up to 8192 × 1024) are too large to store: a case file keeps their recipe
(`Weight`: seed, shape, exponent range, redrawn rows, sha256 of the values) and load_case rebuilds
them; `golden export` writes them out in full for a port.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ..spec import indexer as SI
from ..spec import path as SP
from ..spec import pool as spec_pool
from ..spec import quant as Q
from ..spec import rope as R
from ..spec.models import profile
from .cases import E2M1_TIES, E4M3_MIDPOINT_TIES, Case, edge_rows, mixed_magnitudes, splitmix64

U32 = 2.0 ** -24


# ------------------------------------------------------------------------------------------------
# coarse BF16 inputs, row by row
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Weight:
    """BF16 values ±(1 + m/2^bits)·2^e, e uniform in [e_lo, e_hi], one splitmix64 word each (sign
    bit 63, mantissa the next bits, exponent from the low word); a row listed in `redraw` as
    (row, attempt) comes from its own stream, seeded (seed << 32) | (row << 8) | attempt."""
    seed: int
    shape: tuple
    e_lo: int
    e_hi: int
    bits: int = 2
    positive: bool = False
    redraw: tuple = ()
    e4m3_block: int = 0         # > 0: the values as E4M3 bytes under E8M0 scales per block × block

    def scale_exponents(self) -> np.ndarray:
        """The E8M0 scale of each block: 2^(e_lo − (row block + 2·column block) mod 3), so the
        blocks' scales differ and every value ±(1 + m/2^bits)·2^e_lo is an E4M3 normal under it."""
        b = self.e4m3_block
        i, j = np.meshgrid(np.arange(-(-self.shape[0] // b)), np.arange(self.shape[1] // b), indexing="ij")
        return self.e_lo - (i + 2 * j) % 3

    def scale_bytes(self) -> np.ndarray:
        return (self.scale_exponents() + 127).astype(np.uint8)

    def encoded(self, values) -> np.ndarray:
        """The E4M3 bytes of values (one binade, e_lo = e_hi) under scale_bytes(): exact."""
        if self.e_lo != self.e_hi:
            raise ValueError("an E4M3-encoded recipe draws one binade (e_lo = e_hi)")
        b = self.e4m3_block
        s = np.exp2(np.repeat(np.repeat(self.scale_exponents(), b, 0)[:self.shape[0]], b, 1))
        codes = Q.e4m3_encode((values / s).astype(np.float32))
        if not np.array_equal(Q.e4m3_decode(codes) * s, values):
            raise AssertionError("the E4M3 encoding of the recipe is not exact")
        return codes

    def _values(self, words) -> np.ndarray:
        high = (words >> np.uint64(32)).astype(np.uint32)
        sign = np.uint32(0) if self.positive else high >> np.uint32(31)
        mantissa = (high >> np.uint32(31 - self.bits)) & np.uint32((1 << self.bits) - 1)
        span = np.uint32(self.e_hi - self.e_lo + 1)
        biased = (words.astype(np.uint32) % span) + np.uint32(self.e_lo + 127)
        bits = (sign << np.uint32(31)) | (biased << np.uint32(23)) | (mantissa << np.uint32(23 - self.bits))
        return bits.view(np.float32)

    def _width(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))

    def row(self, row: int) -> np.ndarray:
        """Row `row` as a redrawn row: its own stream at its current attempt."""
        attempt = dict(self.redraw)[row]
        if not 0 < attempt < 256:
            raise ValueError(f"redraw attempt {attempt} of row {row}: expected 1..255")
        words = splitmix64((self.seed << 32) | (row << 8) | attempt, self._width())
        return self._values(words).reshape(self.shape[1:])

    def array(self) -> np.ndarray:
        rows = self.shape[0]
        values = self._values(splitmix64(self.seed << 32, rows * self._width())).reshape(self.shape)
        for row, _ in self.redraw:
            values[row] = self.row(row)
        return values

    def stored(self) -> np.ndarray:
        """What a case stores and rebuilds: the values, or their E4M3 bytes."""
        return self.encoded(self.array()) if self.e4m3_block else self.array()

    def redrawn(self, rows) -> "Weight":
        """The same recipe with each of `rows` drawn once more."""
        attempts = dict(self.redraw)
        for row in sorted({int(r) for r in rows}):
            attempts[row] = attempts.get(row, 0) + 1
        return dataclasses.replace(self, redraw=tuple(sorted(attempts.items())))

    def about(self) -> dict:
        """The recipe as JSON, with the sha256 of the values it gives (checked when rebuilt)."""
        return {"seed": self.seed, "shape": list(self.shape), "e_lo": self.e_lo, "e_hi": self.e_hi,
                "bits": self.bits, "positive": self.positive, "redraw": [list(r) for r in self.redraw],
                **({"e4m3_block": self.e4m3_block} if self.e4m3_block else {}),
                "sha256": hashlib.sha256(self.stored().tobytes()).hexdigest()}


def rebuild(about: dict) -> np.ndarray:
    """The values of a stored recipe (read-only); refuses them when they are not the ones generated."""
    return _rebuilt(json.dumps(about, sort_keys=True))


@functools.lru_cache(maxsize=8)                 # a check reads the same few recipes again and again
def _rebuilt(about_json: str) -> np.ndarray:
    about = json.loads(about_json)
    w = Weight(about["seed"], tuple(about["shape"]), about["e_lo"], about["e_hi"], about["bits"],
               about["positive"], tuple(tuple(r) for r in about["redraw"]), about.get("e4m3_block", 0))
    values = w.stored()
    if hashlib.sha256(values.tobytes()).hexdigest() != about["sha256"]:
        raise ValueError(f"the recipe {about} no longer gives the values it was generated with "
                         f"(Weight changed?); regenerate the goldens")
    values.flags.writeable = False
    return values


# ------------------------------------------------------------------------------------------------
# determined values
# ------------------------------------------------------------------------------------------------
def settled(exact, err) -> np.ndarray:
    """True where every value within err of exact rounds to the same BF16 value."""
    return SI.round_bf16(np.asarray(exact) - err) == SI.round_bf16(np.asarray(exact) + err)


def exact_matmul(x, w, what: str) -> np.ndarray:
    """bf16(x · wᵀ), asserting the fp32 sum is exact in any order: every product is a multiple of
    the finest quantum q, and Σ|products| ≤ K·max|x|·max|w| < 2^24·q."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    quantum = _finest_quantum(x) * _finest_quantum(w)
    if not x.shape[-1] * float(np.abs(x).max()) * float(np.abs(w).max()) < 2.0 ** 24 * quantum:
        raise AssertionError(f"{what}: the fp32 sum may round; coarser inputs are needed")
    return SI.round_bf16(_product(x, w))


def exact_fp8_linear(x, codes, scales, block: int, what: str) -> np.ndarray:
    """FP8.LINEAR's value, asserting every conforming order gives it: with q the finest quantum of
    the act_quant-ed x times that of the weight, each K block's Σ|x̂·ŵ| stays below 2^13·q (an MMA
    accumulator of 13 fraction bits sums it exactly in any order) and the whole sum below 2^24·q."""
    x_hat = Q.fp8_dequantize(*Q.fp8_quantize(x, block), block)
    w_hat = Q.e4m3_decode(codes) * np.repeat(np.repeat(Q.e8m0_decode(scales), block, 0)[:codes.shape[0]], block, 1)
    quantum = _finest_quantum(x_hat) * _finest_quantum(w_hat)
    _, mags, scale = Q.fp8_linear_blocks(x, codes, scales, block)
    per_block = mags * scale
    if not (per_block.max() < 2.0 ** 13 * quantum and per_block.sum(axis=-1).max() < 2.0 ** 24 * quantum):
        raise AssertionError(f"{what}: an FP8 MMA may round the block sums; coarser inputs are needed")
    return Q.fp8_linear(x, codes, scales, block)


def _product(x, w) -> np.ndarray:
    """x · wᵀ of fp32 values whose sums are exact in fp32 (any order gives the exact value), with
    einsum's own loops: OpenBLAS threads make small products slow on a busy machine."""
    return np.einsum("...k,nk->...n", np.asarray(x, np.float32), np.asarray(w, np.float32)).astype(np.float64)


def _finest_quantum(a) -> float:
    """The largest power of two dividing every value of a (fp32 values; zeros ignored): 2^(e − 150)
    times the lowest set bit of the significand, at its smallest."""
    bits = np.asarray(a, np.float32).reshape(-1).view(np.uint32)
    bits = bits[(bits & np.uint32(0x7FFFFFFF)) != 0]
    exponent = (bits >> np.uint32(23)) & np.uint32(0xFF)
    significand = (bits & np.uint32(0x7FFFFF)) | np.where(exponent > 0, np.uint32(0x800000), np.uint32(0))
    low = significand & (np.uint32(0) - significand)                # lowest set bit, a power of two
    trailing = (low.astype(np.float32).view(np.uint32) >> np.uint32(23)).astype(np.int64) - 127
    return float(2.0 ** (np.maximum(exponent.astype(np.int64), 1) - 150 + trailing).min())


def rotation_error(x, positions, freqs) -> np.ndarray:
    """ROPE.ROUNDING's δ, plus another table: two tables within 2^-20 of the exact one put the angle
    p·f_i up to 2·2^-20·p·f_i apart, turning the pair by that much; twice that is allowed (the fl32
    roundings of the angles ride on it)."""
    x = np.asarray(x, np.float64)
    pair = np.abs(x[..., -64::2]) + np.abs(x[..., -63::2])
    angle = np.abs(R._broadcast(x, R.angles(positions, freqs)))        # a de-rotation turns by −p·f
    table = np.zeros_like(x)
    table[..., -64:] = np.repeat(pair * angle * 4 * R.FREQ_RTOL, 2, axis=-1)
    return R.rotate_error(x, freqs) + table


# ------------------------------------------------------------------------------------------------
# one layer by spec/'s definitions, with where it is not determined
# ------------------------------------------------------------------------------------------------
STAGE_RULES = {
    "window_idx": "PATH.WINDOW", "compressed_idx": "PATH.HCA", "q": "PATH.Q.PROJ", "q_rot": "ROPE.POSITIONS",
    "q_had": "PATH.HADAMARD", "q_packed": "PATH.ORDER", "q_scales": "PATH.ORDER", "k": "PATH.K.PROJ",
    "k_normed": "PATH.K.NORM", "k_rot": "ROPE.POSITIONS", "k_had": "PATH.HADAMARD", "k_packed": "PATH.ORDER",
    "k_scales": "PATH.ORDER", "w_raw": "PATH.W.PROJ", "weights": "IDX.WEIGHT.SCALE", "scores": "IDX.SCORE.FP4",
    "candidates": "POOL.TOPK_BLOCKS", "topk": "IDX.TOPK.SELECTION", "indices": "PATH.CONCAT",
}


def spec_index_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    """Every stage of the layer (the stage list of properties.path), by spec/'s definitions."""
    return _layer(inputs, model, layer, start_pos)[0]


def _layer(a: dict, model: str, layer: int, start_pos: int) -> tuple[dict, dict]:
    """(stages, loose): loose[stage] marks the elements a conforming target may round otherwise."""
    m = profile(model)
    kind, ratio = spec_pool.layer_role(m, layer).kind, m.ratio(layer)
    T = a["x"].shape[0]
    out, loose = {"window_idx": SP.window_index(T, start_pos)}, {}
    if kind == "window":
        out["indices"] = out["window_idx"]
        return out, loose
    if kind == "hca":
        out["compressed_idx"] = SP.compressed_index(T, start_pos, ratio)
        out["indices"] = np.concatenate([out["window_idx"], out["compressed_idx"]], axis=-1)
        return out, loose
    H, D, E = m.index_n_heads, m.index_head_dim, (start_pos + T) // ratio
    freqs, positions = R.frequencies(m, layer), SP.token_positions(T, start_pos)
    out["q"] = exact_fp8_linear(a["qr"], a["wq_b"], a["wq_b_scale"], Q.FP8_LINEAR_BLOCK[model], "q").reshape(T, H, D)
    _rotate_and_quantize(out, loose, "q", out["q"], positions, freqs, m.hadamard)
    k_positions = R.compressed_positions(E, ratio)
    if kind == "csa":
        _rotate_and_quantize(out, loose, "k", a["index_entry"], k_positions, freqs, True)
    elif kind == "reindex":
        out["k_packed"], out["k_scales"] = a["k_packed"], a["k_scales"]
    else:
        out["k"] = exact_matmul(a["latent"], a["wk"], "k")
        out["k_normed"], loose["k_normed"] = _rms_norm(out["k"], a["k_norm"], m.norm_eps)
        _rotate_and_quantize(out, loose, "k", out["k_normed"], k_positions, freqs, False)
    out["w_raw"] = exact_matmul(a["x"], a["weights_proj"], "w_raw")
    out["weights"], loose["weights"] = _weights(out["w_raw"], m)
    _scores(out, loose, kind, m, a, positions, ratio, E)
    return out, loose


def _rotation(x, positions, freqs, hadamard: bool) -> tuple[dict, dict]:
    """RoPE (and the V4 Hadamard) of x [T, ..., 128]: values and loose elements by stage suffix."""
    exact = R.rotate_exact(x, positions, freqs)
    out = {"rot": SI.round_bf16(exact)}
    loose = {"rot": ~settled(exact, rotation_error(x, positions, freqs))}
    if hadamard:
        exact = out["rot"] @ SI.sylvester_hadamard(x.shape[-1]).T * SI.HADAMARD_SCALE
        out["had"] = SI.round_bf16(exact)
        l1 = np.abs(out["rot"]).sum(axis=-1, keepdims=True) * SI.HADAMARD_SCALE
        loose["had"] = ~settled(exact, 2.0 ** -20 * l1)                   # HAD.ROUNDING's bound
    return out, loose


def _rotate_and_quantize(out, loose, which, x, positions, freqs, hadamard: bool):
    values, where = _rotation(x, positions, freqs, hadamard)
    for suffix in values:
        out[f"{which}_{suffix}"], loose[f"{which}_{suffix}"] = values[suffix], where[suffix]
    source = values.get("had", values["rot"])
    out[f"{which}_packed"], out[f"{which}_scales"] = Q.fp4_e8m0_quantize(source.astype(np.float32))


def _rms_norm(k, weight, eps) -> tuple[np.ndarray, np.ndarray]:
    exact = SP._rms_exact(k, weight, eps)
    return SI.round_bf16(exact), ~settled(exact, np.abs(exact) * (k.shape[-1] + 8) * U32)   # PATH.K.NORM's bound


def _weights(w_raw, m) -> tuple[np.ndarray, np.ndarray]:
    product = w_raw * m.index_weight_scale
    return SI.index_weights(w_raw, m), ~settled(product, np.abs(product) * 2.0 ** -22)    # fl32(c), the product


def _scores(out, loose, kind, m, a, positions, ratio, E):
    q = Q.fp4_e8m0_dequantize(out["q_packed"], out["q_scales"]).astype(np.float64)
    k = Q.fp4_e8m0_dequantize(out["k_packed"], out["k_scales"]).astype(np.float64)
    visible = SI.index_visible(positions, ratio)
    eligible = SI.visibility_mask(visible, E)
    p = SI._head_terms(q, k, out["weights"])
    loose["scores"] = eligible & (~_dots_exact(q, k) .all(axis=1) | ~_sum_settled(p))
    out["scores"] = SI.index_scores(q, k, out["weights"], visible)
    if kind == "candidate_source":
        out["candidates"] = spec_pool.candidate_blocks(out["scores"], visible, m.candidate_topk_blocks,
                                                       m.candidate_block_size)
    scores = out["scores"]
    if kind == "reindex":
        eligible = eligible & a["candidates"]
        scores = np.where(eligible, scores, -np.inf)
    order = "score" if m.hadamard else "position"
    if order == "score":                     # a tie would let a conforming top-k order them either way
        loose["topk"] = _tied(scores, eligible)
    out["topk"] = SI.index_topk(scores, visible, min(m.index_topk, E), order)
    out["indices"] = SP.attention_index(out["window_idx"], out["topk"], positions.size, int(positions[0]))


def _dots_exact(q, k) -> np.ndarray:
    """[T, H, S]: the per-head dot of FP4 values is exact in fp32 in any order (products are
    multiples of 2^(e_q + e_k − 2) for the blocks' smallest scale exponents)."""
    def lowest(x):
        return np.floor(np.log2(np.where(x != 0, np.abs(x), np.inf))).min(axis=-1)
    l1 = np.einsum("thd,sd->ths", np.abs(q), np.abs(k))
    quantum = 2.0 ** (lowest(q)[:, :, None] + lowest(k)[None, None, :] - 2)
    return l1 < 2.0 ** 24 * quantum


def _sum_settled(p) -> np.ndarray:
    """[T, S]: the fp32 head sum of the BF16 terms p [T, H, S], in any order, rounds to one BF16 value."""
    return settled(p.sum(axis=1), p.shape[1] * U32 * np.abs(p).sum(axis=1))


def _tied(scores, eligible) -> np.ndarray:
    """Eligible scores equal to another eligible score of their row."""
    out = np.zeros(eligible.shape, dtype=bool)
    for t, row in enumerate(scores):
        values = row[eligible[t]]
        out[t, eligible[t]] = (values[:, None] == values[None, :]).sum(axis=1) > 1
    return out


# ------------------------------------------------------------------------------------------------
# the layer cases: inputs redrawn row by row until every stage is determined
# ------------------------------------------------------------------------------------------------
def layer_recipes(m, kind: str, T: int, E: int, seed: int) -> dict[str, Weight]:
    """The recipe of each input (coarse grids at unit RMS; weights at fan-in^-0.5)."""
    H, D = m.index_n_heads, m.index_head_dim
    recipes = {"x": Weight(seed, (T, m.dim), -1, 0)}
    if kind in ("window", "hca"):
        return recipes
    recipes.update(qr=Weight(seed + 1, (T, m.q_lora_rank), 0, 0, bits=1),       # act_quant keeps it exactly
                   wq_b=Weight(seed + 2, (H * D, m.q_lora_rank), -5, -5,
                               e4m3_block=Q.FP8_LINEAR_BLOCK[m.name]),
                   weights_proj=Weight(seed + 3, (H, m.dim), -7, -6))
    if kind == "csa":
        recipes["index_entry"] = Weight(seed + 4, (E, D), -2, 1, bits=7)
    elif kind == "reindex":
        recipes["k_source"] = Weight(seed + 4, (E, D), -2, 1, bits=7)       # layer 20's index K, before FP4
    else:
        recipes.update(latent=Weight(seed + 4, (E, m.head_dim), -1, 0), wk=Weight(seed + 5, (D, m.head_dim), -5, -4),
                       k_norm=Weight(seed + 6, (D,), -1, 0, bits=4, positive=True))
    return recipes


GENERATED = ("wq_b", "weights_proj", "wk")        # kept as recipes, not tensors


class _Search:
    """The inputs of one case and their recipes; `redraw` draws rows again until `loose` names none."""

    def __init__(self, recipes: dict):
        self.recipes = recipes
        self.values = {name: r.array() for name, r in recipes.items()}

    def draw_again(self, name: str, rows) -> None:
        self.recipes[name] = self.recipes[name].redrawn(rows)
        for row in rows:
            self.values[name][row] = self.recipes[name].row(row)

    def redraw(self, name: str, units, loose) -> None:
        """For each unit, redraw the rows of `name` that loose(unit) lists until it lists none."""
        for unit in units:
            for _ in range(255):
                rows = loose(unit)
                if not rows:
                    break
                self.draw_again(name, rows)
            else:
                raise RuntimeError(f"{name}: unit {unit} still not determined after 255 draws")


def _settle_rows(search: _Search, m, kind: str, positions, k_positions, freqs) -> None:
    """Redraw the rows feeding each loose element of the stages before the scores."""
    v, D = search.values, m.index_head_dim

    def q_head(h):                              # a loose rotated dim: its row; a loose Hadamard: row 0
        q = SI.round_bf16(_product(v["qr"], v["wq_b"][h * D:(h + 1) * D]))    # exact: _layer asserts it
        _, where = _rotation(q, positions, freqs, m.hadamard)
        if where["rot"].any():
            return sorted({h * D + int(d) for d in np.argwhere(where["rot"])[:, -1]})
        return [h * D] if m.hadamard and where["had"].any() else []
    search.redraw("wq_b", range(m.index_n_heads), q_head)

    def weights_head(h):
        return [h] if _weights(SI.round_bf16(_product(v["x"], v["weights_proj"][h:h + 1])), m)[1].any() else []
    search.redraw("weights_proj", range(m.index_n_heads), weights_head)

    def entry(j):
        if kind == "csa":
            x = v["index_entry"][j:j + 1]
        else:
            normed, where = _rms_norm(SI.round_bf16(_product(v["latent"][j:j + 1], v["wk"])), v["k_norm"], m.norm_eps)
            if where.any():
                return [j]
            x = normed
        return [j] if any(w.any() for w in _rotation(x, k_positions[j:j + 1], freqs, m.hadamard)[1].values()) else []
    if kind != "reindex":
        search.redraw(K_SOURCE.get(kind, "latent"), range(len(k_positions)), entry)


K_SOURCE = {"csa": "index_entry", "reindex": "k_source"}


def _layer_inputs(values: dict, m, kind: str, T: int, start_pos: int, ratio: int, recipes: dict) -> dict:
    a = {name: v.copy() for name, v in values.items()}
    if "wq_b" in a:                                   # as the checkpoint stores it: E4M3 bytes, E8M0 scales
        a["wq_b"], a["wq_b_scale"] = recipes["wq_b"].encoded(a["wq_b"]), recipes["wq_b"].scale_bytes()
    if kind == "reindex":
        E = a["k_source"].shape[0]
        a["k_packed"], a["k_scales"] = Q.fp4_e8m0_quantize(a.pop("k_source"))
        visible = SI.index_visible(SP.token_positions(T, start_pos), ratio)
        order = np.arange(T * E, dtype=np.float64).reshape(T, E) + 1     # layer 20's scores, distinct
        source = np.where(SI.visibility_mask(visible, E), order, -np.inf)
        a["candidates"] = spec_pool.candidate_blocks(source, visible, m.candidate_topk_blocks, m.candidate_block_size)
    return a


def layer_stages(model: str, layer: int) -> tuple[str, ...]:
    """The stages a layer case stores, in path order (a re-index layer's K is its input)."""
    m = profile(model)
    kind = spec_pool.layer_role(m, layer).kind
    if kind in ("window", "hca"):
        present = {"window_idx", "indices"} | ({"compressed_idx"} if kind == "hca" else set())
    else:
        present = {"window_idx", "q", "q_rot", "q_packed", "q_scales", "w_raw", "weights", "scores", "topk", "indices"}
        present |= {"q_had", "k_had"} if m.hadamard else set()
        present |= {"k", "k_normed"} if kind in ("index_source", "candidate_source") else set()
        present |= {"k_rot", "k_packed", "k_scales"} if kind != "reindex" else set()
        present |= {"candidates"} if kind == "candidate_source" else set()
    return tuple(s for s in STAGE_RULES if s in present)


def layer_case(name: str, model: str, layer: int, seqlen: int, start_pos: int, seed: int) -> Case:
    """One index_layer case, described; `build` searches its inputs (needed to generate only)."""
    kind = spec_pool.layer_role(profile(model), layer).kind
    outputs = layer_stages(model, layer)
    rules = {s: ("POOL.REINDEX" if s == "topk" and kind == "reindex" else STAGE_RULES[s]) for s in outputs}
    window = SP.window_index(seqlen, start_pos).shape[1]
    return Case(name, "PATH.LAYER", "index_layer", {}, {"model": model, "layer": layer, "start_pos": start_pos},
                outputs, call="mapping", output_rules=rules, unordered={"window_idx": window, "indices": window},
                build=functools.partial(_searched, name, model, layer, seqlen, start_pos, seed))


@functools.lru_cache(maxsize=None)
def _searched(name: str, model: str, layer: int, seqlen: int, start_pos: int, seed: int) -> Case:
    """The case with inputs redrawn row by row until every stage is determined."""
    m = profile(model)
    kind, ratio = spec_pool.layer_role(m, layer).kind, m.ratio(layer)
    E = (start_pos + seqlen) // ratio if ratio else 0
    search = _Search(layer_recipes(m, kind, seqlen, E, seed))
    for _ in range(20):
        if kind not in ("window", "hca"):
            _settle_rows(search, m, kind, SP.token_positions(seqlen, start_pos), R.compressed_positions(E, ratio),
                         R.frequencies(m, layer))
        inputs = _layer_inputs(search.values, m, kind, seqlen, start_pos, ratio, search.recipes)
        stages, loose = _layer(inputs, model, layer, start_pos)
        left = [s for s in stages if s in loose and loose[s].any()]
        if not left:
            break
        if left[0] not in ("scores", "topk"):
            raise AssertionError(f"{name}: {left[0]} not settled by its rows")
        search.draw_again(K_SOURCE.get(kind, "latent"), sorted({int(s) for s in np.argwhere(loose[left[0]])[:, 1]}))
    else:
        raise RuntimeError(f"{name}: scores still not determined after 20 rounds")
    described = layer_case(name, model, layer, seqlen, start_pos, seed)
    if not set(described.outputs) <= set(stages):
        raise AssertionError(f"{name}: layer_stages lists {set(described.outputs) - set(stages)}, not computed")
    return dataclasses.replace(described, inputs=inputs, build=None,
                               generated={k: search.recipes[k] for k in GENERATED if k in search.recipes})


LAYER_CASES = (
    # name,                   model,        layer, seqlen, start_pos, seed
    ("index_layer_v4_csa",    "v4-flash",   2,     1,      27,        101),   # decode, 7 entries at j·4
    ("index_layer_v4_hca",    "v4-flash",   3,     1,      300,       111),   # decode, ring wrapped
    ("index_layer_v4_window", "v4-flash",   0,     1,      100,       121),   # decode, 27 slots unfilled
    ("index_layer_v41_l2",    "v4.1-flash", 2,     1,      9,         131),   # ratio-2 source, decode
    ("index_layer_v41_l20",   "v4.1-flash", 20,    4,      0,         141),   # candidate source, prefill
    ("index_layer_v41_l24",   "v4.1-flash", 24,    1,      20,        151),   # re-index, decode, partial block
)


# ------------------------------------------------------------------------------------------------
# the index lists and what attention reads
# ------------------------------------------------------------------------------------------------
def list_cases() -> list[Case]:
    window_prefill, window_decode = SP.window_index(20, 0), SP.window_index(1, 300)
    topk_prefill = np.where(np.arange(8)[None, :] < (np.arange(1, 21) // 4)[:, None],
                            (np.arange(20)[:, None] * 3 + np.arange(8)[None, :]) % 5, -1)
    topk_decode = np.array([[4, 0, 73, 2, -1, -1, 1, 74]], dtype=np.int64)
    every, counts = {"out": None}, ("seqlen", "start_pos")        # the contract's positional ints
    return [
        Case("window_index_prefill", "PATH.WINDOW", "window_index", {}, {"seqlen": 130, "start_pos": 0},
             unordered=every, positional=counts),
        Case("window_index_decode_unfilled", "PATH.WINDOW", "window_index", {}, {"seqlen": 1, "start_pos": 100},
             unordered=every, positional=counts),
        Case("window_index_decode_wrapped", "PATH.WINDOW", "window_index", {}, {"seqlen": 1, "start_pos": 1000},
             unordered=every, positional=counts),
        Case("compressed_index_prefill", "PATH.HCA", "compressed_index", {},
             {"seqlen": 300, "start_pos": 0, "model": "v4-flash", "layer": 3}, positional=counts),
        Case("compressed_index_decode", "PATH.HCA", "compressed_index", {},
             {"seqlen": 1, "start_pos": 383, "model": "v4-pro", "layer": 0}, positional=counts),
        Case("attention_index_prefill", "PATH.CONCAT", "attention_index",
             {"window_rows": window_prefill, "compressed_rows": topk_prefill}, {"seqlen": 20, "start_pos": 0},
             positional=counts),
        Case("attention_index_decode", "PATH.CONCAT", "attention_index",
             {"window_rows": window_decode, "compressed_rows": topk_decode}, {"seqlen": 1, "start_pos": 300},
             positional=counts),
    ]


def qdq_cases() -> list[Case]:
    fp4 = np.concatenate([mixed_magnitudes(161, (8, 512)), edge_rows(512, 16, 6.0, E2M1_TIES[:-1].tolist())])
    fp8 = np.concatenate([mixed_magnitudes(162, (8, 512)), edge_rows(512, 32, 448.0, list(E4M3_MIDPOINT_TIES))])
    return [Case("kv_qdq_fp4_e4m3", "PATH.QDQ", "kv_qdq", {"x": fp4}, {"fmt": "fp4_e4m3"}, positional=("fmt",)),
            Case("kv_qdq_fp8_e8m0_32", "PATH.QDQ", "kv_qdq", {"x": fp8}, {"fmt": "fp8_e8m0_32"}, positional=("fmt",))]


def path_cases() -> list[Case]:
    return list_cases() + qdq_cases() + [layer_case(*row) for row in LAYER_CASES]


def _spec_compressed_index(seqlen, start_pos, *, model, layer):
    return SP.compressed_index(seqlen, start_pos, profile(model).ratio(layer))


def _spec_kv_qdq(x, fmt):
    if fmt == "fp4_e4m3":
        return SP.kv_qdq(x)
    return Q.fp8_dequantize(*Q.fp8_quantize(x, 32), 32).astype(np.float64)


PATH_SPEC = {
    "window_index": SP.window_index,
    "compressed_index": _spec_compressed_index,
    "attention_index": SP.attention_index,
    "kv_qdq": _spec_kv_qdq,
    "index_layer": spec_index_layer,
}
