"""Checks of the indexer path (PATH.*) and of RoPE positions (ROPE.POSITIONS) on a layer's stages.

Operation contract (torch CPU tensors; a target provides any subset):

    window_index(seqlen, start_pos) -> int [T, W]
        prefill (start_pos 0): W = min(s, 128); decode (seqlen 1): W = 128 ring slots, −1 unfilled.
    compressed_index(seqlen, start_pos, *, model, layer) -> int [T, C]
        a V4 HCA layer's list: visible entries ascending + offset, −1 not yet visible (prefill).
    attention_index(window_rows [T, W], compressed_rows [T, C], seqlen, start_pos) -> int [T, W + C]
        [window | compressed + offset], −1 kept.
    rope_quantize(x [T, D], positions int64 [T], freqs f32 [d/2], fmt) -> (payload u8, scales u8)
        RoPE then the codec: fmt 'fp4_e8m0' (index K), 'fp4_e4m3' (V4.1 main KV), 'fp8_e8m0_32'
        (V4.1 window: E4M3 bytes and E8M0 scale bytes per 32).
    kv_qdq_fp4_e4m3(x [..., D]) -> f32 [..., D]              one operation per format; a target's
    kv_qdq_fp8_e8m0_32(x [..., D]) -> f32 [..., D]           kv_qdq(x, fmt) (the name before the
    kv_qdq_fp4_e8m0(x [..., D]) -> f32 [..., D]              split) still provides each
        the in-place QDQ's BF16 values: what main attention reads (fp4_e4m3, fp8_e8m0_32) and what
        the index-K cache holds (fp4_e8m0).
    window_ring(prefill, decoded) -> int [128]
        after a prefill of `prefill` tokens from 0 and `decoded` one-token steps, the position whose
        window KV each ring slot holds, −1 where none.
    pool_scan_topk(q [T,H,D], k [S,D], w [T,H], visible [T], pool bool [T,S], topk) -> int [T, topk]
        a re-index that scores only pool positions; V4.1 order, −1 at the tail.
    index_layer(inputs: dict, *, model, layer, start_pos=0) -> dict of stages
        inputs (BF16 values as f32 tensors unless said): x [T, dim] always; indexer layers
        qr [T, q_lora_rank], wq_b and wq_b_scale as the checkpoint stores indexer.wq_b — wq_b the
        E4M3 bytes [H·128, q_lora_rank] (uint8; the bytes of its float8_e4m3fn weight) and
        wq_b_scale its E8M0 bytes [H·128/b, q_lora_rank/b] per b×b block (uint8; the bytes of its
        float8_e8m0fnu scale), b = 128 in V4 and 32 in V4.1 (spec.quant.FP8_LINEAR_BLOCK), the
        weight itself 2^(wq_b_scale − 127) · e4m3(wq_b) — weights_proj [H, dim]; V4 CSA
        index_entry [E, 128] (the
        indexer compressor's normed pre-RoPE entries); V4.1 KV sources latent [E, 512], wk [128, 512],
        k_norm [128]; re-index layers k_packed [E, 64] u8, k_scales [E, 4] u8, candidates bool [T, E];
        E = (start_pos + T) // ratio; a V4.1 ratio-2 source decoding a step that completes no group
        (even start_pos) also published_k_packed [P, 64] u8, published_k_scales [P, 4] u8, the
        index-K cache published last (layer 20's, P = start_pos rows), whose first E rows it
        scores (PATH.K.PUBLISHED; index_k_read=own ignores them).  Stages returned: window_idx, indices; HCA compressed_idx;
        indexer layers q, q_rot, q_had (V4), q_packed, q_scales, k, k_normed (V4.1 sources),
        k_rot, k_had (V4), k_packed, k_scales, w_raw, weights, scores, topk (compressed indices
        without offset), candidates (layer 20).

Each stage is judged by its rule on the target's own output of the stage before (teacher forcing).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from ..spec import indexer as spec_indexer
from ..spec import path as spec
from ..spec import pool as spec_pool
from ..spec import quant as spec_quant
from ..spec import rope as spec_rope
from ..spec.models import profile
from .compare import as_numpy, assert_bytes_equal, assert_equal, assert_within
from .indexer import assert_sharded_scores, assert_weights, expected_scores, make_score_case, ScoreCase, scores_under
from .quant import assert_linear, fp8_linear_bounds, fp8_weight
from .pool import reindex_cases, wide_reindex_case
from .stages import Kept, first_broken, judge_every_stage, report as report_stages
from .ranking import assert_pool, assert_topk
from .checking import check, declared_choice, forall

OPS = {
    "window_index": "window_index(seqlen, start_pos) -> int [T, W]: i−127..i in prefill, 128 ring slots in decode",
    "compressed_index": "compressed_index(seqlen, start_pos, *, model, layer) -> int [T, C]: V4 HCA list",
    "attention_index": "attention_index(window_rows, compressed_rows, seqlen, start_pos) -> int [T, W + C]",
    "rope_quantize": "rope_quantize(x [T,D], positions [T], freqs [d/2], fmt) -> (payload u8, scales u8)",
    "kv_qdq_fp4_e4m3": "kv_qdq_fp4_e4m3(x [...,D]) -> f32: what main attention reads of an FP4 entry (BF16 values)",
    "kv_qdq_fp8_e8m0_32": "kv_qdq_fp8_e8m0_32(x [...,D]) -> f32: what main attention reads of an FP8 entry",
    "kv_qdq_fp4_e8m0": "kv_qdq_fp4_e8m0(x [...,D]) -> f32: what the index-K cache holds (BF16 values)",
    "window_ring": "window_ring(prefill, decoded) -> int [128]: the position in each ring slot, −1 unwritten",
    "pool_scan_topk": "pool_scan_topk(q, k, w, visible, pool, topk) -> int [T, topk]: scores only the pool",
    "index_layer": "index_layer(inputs, *, model, layer, start_pos=0) -> dict of named stages",
}


def _t(x, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=dtype)


def _ints(x) -> np.ndarray:
    return as_numpy(x).astype(np.int64)


def assert_same_rows_as_sets(got, want, what: str):
    """Each row holds the same multiset of entries (−1 included): the order inside a row is free."""
    got, want = _ints(got), np.asarray(want, dtype=np.int64)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.shape}")
    bad = np.flatnonzero((np.sort(got, axis=1) != np.sort(want, axis=1)).any(axis=1))
    if bad.size:
        t = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} row(s) differ; row {t}: got {np.sort(got[t]).tolist()[:12]}…, "
                             f"expected {np.sort(want[t]).tolist()[:12]}… (sorted; "
                             f"{int((want[t] >= 0).sum())} valid, {int((want[t] < 0).sum())} × −1)")


# ------------------------------------------------------------------------------------------------
# index lists
# ------------------------------------------------------------------------------------------------
LIST_EXAMPLES = (dict(seqlen=1, start_pos=0), dict(seqlen=130, start_pos=0), dict(seqlen=1, start_pos=5),
                 dict(seqlen=1, start_pos=127), dict(seqlen=1, start_pos=128), dict(seqlen=1, start_pos=1000))


@st.composite
def list_shapes(draw):
    """A prefill of 1..300 tokens, or a decode at 1..600; half the decodes within two of a multiple of
    128 (the window, the HCA ratio): an entry completes at 128·k − 1, the ring wraps at 128·k."""
    if draw(st.booleans()):
        return dict(seqlen=draw(st.integers(1, 300)), start_pos=0)
    if draw(st.booleans()):
        return dict(seqlen=1, start_pos=128 * draw(st.integers(1, 4)) + draw(st.sampled_from((-2, -1, 0, 1))))
    return dict(seqlen=1, start_pos=draw(st.integers(1, 600)))


@check("PATH.WINDOW", ops=("window_index",))
@forall(*(dict(shape=s) for s in LIST_EXAMPLES), shape=list_shapes())
def window_rows_are_the_last_128_positions(target, shape):
    s, p = shape["seqlen"], shape["start_pos"]
    layout = target.variant("window_layout")
    assert_same_rows_as_sets(target.window_index(s, p), spec.window_index(s, p, layout=layout),
                             f"PATH.WINDOW (seqlen {s}, start_pos {p}, window_layout={layout}): i−127…i clipped at 0 "
                             f"in prefill, the filled ring slots and −1 for the rest in decode")


HCA = (("v4-flash", 3), ("v4-pro", 0))


@check("PATH.HCA", ops=("compressed_index",))
@forall(dict(shape=dict(seqlen=300, start_pos=0), which=0), dict(shape=dict(seqlen=1, start_pos=383), which=1),
        shape=list_shapes(), which=st.integers(0, 1))
def hca_lists_every_visible_entry_after_the_window(target, shape, which):
    model, layer = HCA[which]
    s, p = shape["seqlen"], shape["start_pos"]
    layout = target.variant("window_layout")
    assert_equal(_ints(target.compressed_index(s, p, model=model, layer=layer)),
                 spec.compressed_index(s, p, profile(model).ratio(layer), layout=layout),
                 what=f"PATH.HCA ({model} layer {layer}, seqlen {s}, start_pos {p}): ascending j + offset "
                      f"{spec.kv_offset(s, p, layout=layout)}, −1 while not visible")


@check("PATH.CONCAT", ops=("attention_index",))
@forall(*(dict(shape=s, seed=0) for s in LIST_EXAMPLES[:3]), shape=list_shapes(), seed=st.integers(0, 2 ** 32 - 1))
def window_then_compressed_plus_offset(target, shape, seed):
    s, p = shape["seqlen"], shape["start_pos"]
    rng = np.random.default_rng(seed)
    layout = target.variant("window_layout")
    window = spec.window_index(s, p, layout=layout)
    topk = rng.integers(-1, 40, (window.shape[0], 6))
    got = target.attention_index(_t(window, torch.int64), _t(topk, torch.int64), s, p)
    assert_equal(_ints(got), spec.attention_index(window, topk, s, p, layout=layout),
                 what=f"PATH.CONCAT (seqlen {s}, start_pos {p}, window_layout={layout}): "
                      f"[window | top-k + {spec.kv_offset(s, p, layout=layout)}], −1 kept")


# ------------------------------------------------------------------------------------------------
# RoPE then quantize; what attention reads
# ------------------------------------------------------------------------------------------------
FORMATS = {"fp4_e8m0": (128, spec_quant.fp4_e8m0_quantize), "fp4_e4m3": (512, spec_quant.fp4_e4m3_quantize),
           "fp8_e8m0_32": (512, lambda x: spec_quant.fp8_quantize(x, 32))}


def determined_inputs(seed: int, tokens: int, dim: int, spread: int, freqs, far: bool, table: str = "fp32"):
    """BF16 rows whose rotation every conforming target rounds alike (undetermined pairs zeroed;
    table: the precision of its RoPE table, rope_table)."""
    rng = np.random.default_rng(seed)
    x = spec_indexer.round_bf16(rng.standard_normal((tokens, dim)) * 2.0 ** rng.integers(-spread, spread + 1, (tokens, dim)))
    positions = rng.integers(0, 2 ** 20 if far else 8192, tokens)
    ok = spec_rope.determined(x, positions, freqs, table)
    pair_ok = np.repeat(ok[:, -64::2] & ok[:, -63::2], 2, axis=-1)
    x[:, -64:] = np.where(pair_ok, x[:, -64:], 0.0)
    return x, positions


@check("PATH.ORDER", ops=("rope_quantize",))
@forall(dict(fmt="fp4_e4m3", seed=0, spread=0, far=False), dict(fmt="fp8_e8m0_32", seed=1, spread=4, far=True),
        dict(fmt="fp4_e8m0", seed=2, spread=0, far=False),
        fmt=st.sampled_from(tuple(FORMATS)), seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from((0, 4, 12)),
        far=st.booleans())
def rotated_first_then_quantized(target, fmt, seed, spread, far):
    dim, quantize = FORMATS[fmt]
    freqs = spec_rope.frequencies_fp32(profile("v4.1-flash"), 20)
    x, positions = determined_inputs(seed, 4, dim, spread, freqs, far, declared_choice(target, "rope_table"))
    payload, scales = target.rope_quantize(_t(x), _t(positions, torch.int64), _t(freqs), fmt)
    want_payload, want_scales = quantize(spec_rope.rotate(x, positions, freqs))
    what = f"PATH.ORDER ({fmt}): the bytes of the rotated values"
    assert_bytes_equal(scales, want_scales, what=what + " (scales)")
    assert_bytes_equal(payload, want_payload, what=what + " (payload)")


QDQ_DIMS = {"fp4_e4m3": 512, "fp8_e8m0_32": 512}


def _qdq_check(fmt: str):
    """PATH.QDQ for one format: its own operation (kv_qdq_<fmt>), so a library with one format offers it."""
    def attention_reads_the_exact_dequantized_values(target, seed, spread):
        rng = np.random.default_rng(seed)
        rows = spec_indexer.round_bf16(rng.standard_normal((4, 512)) * 2.0 ** rng.integers(-spread, spread + 1, (4, 32)).repeat(16, 1))
        got = as_numpy(target.op(f"kv_qdq_{fmt}")(_t(rows))).astype(np.float64)
        if fmt == "fp4_e4m3":
            second = target.variant("kv_second_scale")
            want = spec.kv_qdq_per_tensor(rows) if second == "per_tensor" else spec.kv_qdq(rows)
        else:
            want = spec_quant.fp8_dequantize(*spec_quant.fp8_quantize(rows, 32), 32).astype(np.float64)
        if not spec_indexer.is_bf16(got).all():
            raise AssertionError(f"PATH.QDQ ({fmt}): the values attention reads must be BF16 (the in-place QDQ writes BF16)")
        assert_equal(got, want, what=f"PATH.QDQ ({fmt}, kv_second_scale={target.variant('kv_second_scale')}): "
                                      f"x̂ = code · scale, exactly")
    attention_reads_the_exact_dequantized_values.__name__ = f"attention_reads_the_exact_{fmt}_values"
    check("PATH.QDQ", ops=(f"kv_qdq_{fmt}",))(forall(
        dict(seed=int(fmt == "fp8_e8m0_32"), spread=12), seed=st.integers(0, 2 ** 32 - 1),
        spread=st.sampled_from((0, 6, 12)))(attention_reads_the_exact_dequantized_values))


for _fmt in QDQ_DIMS:
    _qdq_check(_fmt)


@check("PATH.K.CACHE", ops=("kv_qdq_fp4_e8m0",))
@forall(dict(seed=0, spread=12), dict(seed=1, spread=0), seed=st.integers(0, 2 ** 32 - 1),
        spread=st.sampled_from((0, 6, 12, 40)))
def index_k_cache_holds_the_exact_dequantized_keys(target, seed, spread):
    target.asked_for(*spec.V4_ALL)      # the FP4 index-K cache; V3.2's is FP8 (LAYOUT.V32.INDEX_K)
    rng = np.random.default_rng(seed)
    rows = spec_indexer.round_bf16(rng.standard_normal((4, 128)) * 2.0 ** rng.integers(-spread, spread + 1, (4, 4)).repeat(32, 1))
    got = as_numpy(target.op("kv_qdq_fp4_e8m0")(_t(rows))).astype(np.float64)
    if not spec_indexer.is_bf16(got).all():
        raise AssertionError("PATH.K.CACHE: the index-K cache holds BF16 values (the in-place QDQ writes BF16)")
    assert_equal(got, spec.index_k_cache(rows), what="PATH.K.CACHE: k̂ = E2M1 · 2^e per 32, exactly",
                 context=lambda i: f"k {rows[i]!r}")


@check("PATH.WINDOW.RING", ops=("window_ring",))
@forall(dict(prefill=130, decoded=0), dict(prefill=128, decoded=1), dict(prefill=5, decoded=200),
        dict(prefill=300, decoded=7), prefill=st.one_of(st.integers(1, 400), st.integers(126, 130)),
        decoded=st.integers(0, 300))
def the_ring_holds_the_last_128_positions(target, prefill, decoded):
    got = _ints(target.window_ring(prefill, decoded))
    assert_equal(got, spec.window_ring(prefill, decoded),
                 what=f"PATH.WINDOW.RING (prefill {prefill}, then {decoded} decode steps): slot q holds the newest "
                      f"position ≡ q mod 128, −1 if none")


# ------------------------------------------------------------------------------------------------
# a re-index kernel that scores only the pool
# ------------------------------------------------------------------------------------------------
def partial_newest_block_case() -> tuple[ScoreCase, np.ndarray, int]:
    """21 reachable positions: the pinned newest block (16..20) is partial and holds the best scores."""
    case = make_score_case("normal", 7, 1, 2, 16, 21)
    case.visible[:] = 21
    case.k[16:] = np.abs(case.k[16:]) * 4
    case.q[:] = np.abs(case.q)
    case.w[:] = np.abs(case.w)
    return case, np.ones((1, 21), dtype=bool), 8


@check("PATH.POOL_SCAN", ops=("pool_scan_topk",))
@forall(dict(case=wide_reindex_case()), case=reindex_cases(wide=True))
def pool_only_scan_selects_a_masked_topk(target, case):
    _judge_pool_scan(target, case.scores, case.pool, case.topk)


@check("PATH.POOL_SCAN", ops=("pool_scan_topk",))
def pinned_partial_block_is_scanned(target):
    _judge_pool_scan(target, *partial_newest_block_case())


def _judge_pool_scan(target, sc: ScoreCase, pool, topk: int):
    got = target.pool_scan_topk(*sc.torch(), torch.from_numpy(pool), topk)
    ref, tol = expected_scores(target, sc)
    eligible = pool & spec_indexer.visibility_mask(sc.visible, sc.k.shape[0])
    assert_topk(got, np.where(eligible, ref, -np.inf), eligible, topk, "position", tol=tol,
                what=f"PATH.POOL_SCAN [{sc!r}, pool {int(pool.sum())} positions]")


# ------------------------------------------------------------------------------------------------
# one layer, stage by stage
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerCase:
    label: str
    model: str
    layer: int
    start_pos: int
    inputs: tuple          # (name, ndarray) pairs

    def __repr__(self):
        return f"LayerCase({self.label!r})"

    def arrays(self) -> dict:
        return dict(self.inputs)

    def torch_inputs(self) -> dict:
        out = {}
        for name, a in self.inputs:
            keep = a.dtype == np.bool_ or a.dtype.kind in "iu"            # masks, bytes, index lists
            out[name] = torch.from_numpy(a.copy() if keep else a.astype(np.float32))
        return out

    @property
    def seqlen(self) -> int:
        return dict(self.inputs)["x"].shape[0]

    @property
    def positions(self) -> np.ndarray:
        return spec.token_positions(self.seqlen, self.start_pos)


def normal_bf16(rng, shape, scale=1.0, shift=0.0):
    """Normal inputs made BF16 by rounding their fp32 bits (inputs only: no rule reads this rounding)."""
    bits = (rng.standard_normal(shape) * scale + shift).astype(np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def make_layer_case(model: str, layer: int, seqlen: int, start_pos: int = 0, seed: int = 0) -> LayerCase:
    """Random inputs at the profile's real shapes, weights scaled so activations have unit RMS."""
    m = profile(model)
    rng = np.random.default_rng(seed)
    role = spec_pool.layer_role(m, layer)
    ratio = m.ratio(layer)
    H, D = m.index_n_heads, m.index_head_dim
    inputs = {"x": normal_bf16(rng, (seqlen, m.dim))}
    if role.kind not in ("window", "hca"):
        E = (start_pos + seqlen) // ratio
        b = spec_quant.FP8_LINEAR_BLOCK[model]
        wq_b, wq_b_scale = fp8_weight(rng, H * D, m.q_lora_rank, b, exponents=(-14, -12))
        inputs.update(qr=normal_bf16(rng, (seqlen, m.q_lora_rank)), wq_b=wq_b, wq_b_scale=wq_b_scale,
                      weights_proj=normal_bf16(rng, (H, m.dim), m.dim ** -0.5))
        if role.kind == "csa":
            inputs["index_entry"] = normal_bf16(rng, (E, D))
        elif role.kind == "reindex":
            k_packed, k_scales = spec_quant.fp4_e8m0_quantize(normal_bf16(rng, (E, D)))
            visible = spec_indexer.index_visible(spec.token_positions(seqlen, start_pos), ratio)
            source = np.where(spec_indexer.visibility_mask(visible, E), rng.permutation(seqlen * E).reshape(seqlen, E) + 1.0, -np.inf)
            inputs.update(k_packed=k_packed, k_scales=k_scales,
                          candidates=spec_pool.candidate_blocks(source, visible, m.candidate_topk_blocks, m.candidate_block_size))
        else:
            inputs.update(latent=normal_bf16(rng, (E, m.head_dim)), wk=normal_bf16(rng, (D, m.head_dim), m.head_dim ** -0.5),
                          k_norm=normal_bf16(rng, (D,), 0.1, 1.0))
        if spec.reads_published_k(m, layer, seqlen, start_pos):
            packed, scales = spec_quant.fp4_e8m0_quantize(normal_bf16(rng, (spec.published_k_rows(m, start_pos), D)))
            inputs.update(published_k_packed=packed, published_k_scales=scales)
    label = f"{model} layer {layer} ({role.kind}, ratio {ratio}), seqlen {seqlen}, start_pos {start_pos}, seed {seed}"
    return LayerCase(label, model, layer, start_pos, tuple(inputs.items()))


# (model, layer, seqlen, start_pos, seed): one case per layer kind at small realistic shapes, V4 decode
# on both sides of a full window ring, decode while the ring fills completing an entry at ratio > 1
# (V4-Pro, V4.1's index source), and V4.1 decode above 16384 entries; every layer check runs these,
# then draws from the run's seed.  Together they reach every boundary coverage lists for the layer
# checks (coverage/path.py layer_call_boundaries, each model; tests/test_coverage.py keeps it so).
FIXED_LAYERS = (
    ("v4-flash", 2, 20, 0, 1),             # CSA
    ("v4-flash", 3, 260, 0, 2),            # HCA (2 entries of 128)
    ("v4-flash", 0, 130, 0, 3),            # window only
    ("v4.1-flash", 20, 12, 0, 4),          # candidate source, prefill
    ("v4.1-flash", 24, 12, 0, 5),          # re-index, prefill
    ("v4.1-flash", 2, 10, 0, 6),           # ratio-2 index source
    ("v4-flash", 0, 1, 126, 9),            # V4 decode, the ring one short of full (official V4 pads its list)
    ("v4-flash", 3, 1, 300, 10),           # V4 decode, the ring wrapped (HCA)
    ("v4.1-flash", 20, 1, 16400, 7),       # candidate source, decode, N = 16401
    ("v4.1-flash", 24, 1, 16400, 8),       # re-index, decode, N = 16401
    ("v4-pro", 2, 1, 27, 20),              # V4-Pro CSA, decode while the ring fills, entry 6 completes (E = 7)
    ("v4.1-flash", 2, 1, 9, 16),           # ratio-2 index source, decode while the ring fills, entry 4 completes
)
LAYER_MODELS = ("v4-flash", "v4-pro", "v4.1-flash")


@functools.lru_cache(maxsize=32)
def layer_case(key: tuple) -> LayerCase:
    """The case of a key (model, layer, seqlen, start_pos, seed), built once a process: the layer
    rules and ATTN.LAYER at ci use 23 keys (12 fixed, 6 of KIND_CASES, 5 drawn; 12 kept made every
    mutant of `dsv4spec mutate` rebuild them)."""
    return make_layer_case(*key)


def layer_cases() -> tuple[LayerCase, ...]:
    return tuple(layer_case(key) for key in FIXED_LAYERS)


def key_kind(key: tuple) -> str:
    return spec_pool.layer_role(profile(key[0]), key[1]).kind


def _layers_by_kind(kinds) -> dict:
    """(model, kind) -> that model's layers of that kind (index_layer runs each kind but reuse)."""
    groups: dict = {}
    for model in LAYER_MODELS:
        m = profile(model)
        for layer in range(len(m.compress_ratios)):
            if spec_pool.layer_role(m, layer).kind in kinds:
                groups.setdefault((model, spec_pool.layer_role(m, layer).kind), []).append(layer)
    return groups


@st.composite
def prefill_lengths(draw, step: int, shortest: int, longest: int):
    """Any length from `shortest` to `longest`, or one at a multiple of `step` (the ratio: the
    compress lengths' boundaries; the window; V4.1's pool blocks), one below or one above."""
    if draw(st.booleans()):
        return draw(st.integers(shortest, longest))
    k = draw(st.integers(1, max(1, longest // step)))
    return min(longest, max(shortest, k * step + draw(st.sampled_from((-1, 0, 1)))))


# Hypothesis draws the first of these in about 4 decode steps of 10 (the others in 1 of 10 or
# fewer): it is the rarest regime, the pool's capacity (coverage.strategy_rates measures each).
DECODE_WHERE = ("capacity", "filling", "wrap", "boundary", "topk", "any")
DECODE_FARTHEST = 2 ** 15


@st.composite
def decode_positions(draw, model: str, ratio: int):
    """A decode start position: where the entries reach the last selection's capacity (V4.1's pool,
    E = 16385, 16386 or 16384; V4's top-k, E = index_topk + 1, + 0 or − 1); while the ring fills (1..127);
    at a ring wrap (128·k − 1, 128·k, 128·k + 1); at a compression boundary (p mod ratio = ratio − 1,
    an entry completes this step, or 0); where the entries reach the top-k (E = index_topk ± 1); or
    anywhere up to 2^15."""
    m, r = profile(model), max(ratio, 1)
    where = draw(st.sampled_from(DECODE_WHERE))
    if where == "filling":
        return draw(st.integers(1, m.window - 1))
    if where == "wrap":
        return m.window * draw(st.integers(1, 64)) + draw(st.sampled_from((-1, 0, 1)))
    if where == "boundary":
        return max(1, r * draw(st.integers(1, DECODE_FARTHEST // r)) - draw(st.sampled_from((1, 0))))
    pool = m.candidate_topk_blocks * m.candidate_block_size
    if ratio and where == "capacity":
        return (pool + draw(st.sampled_from((1, 2, 0))) if pool else m.index_topk + draw(st.sampled_from((1, 0, -1)))) * ratio - 1
    if ratio and where == "topk":
        return (m.index_topk + draw(st.sampled_from((-1, 0, 1)))) * ratio - 1
    return draw(st.integers(1, DECODE_FARTHEST))


@st.composite
def layer_keys(draw, kinds: tuple):
    """A layer case drawn from the seed, as its key: a layer of one of `kinds` of V4-Flash, V4-Pro or
    V4.1-Flash, a prefill from 0 of one token or more, so some with no compressed entry yet (up to
    300 tokens on window and HCA layers, 40 on indexer layers) or, about 2 draws in 3,
    a one-token decode (decode_positions), and the inputs' seed."""
    groups = _layers_by_kind(kinds)
    model, kind = draw(st.sampled_from(sorted(groups)))
    layer = draw(st.sampled_from(groups[model, kind]))
    m = profile(model)
    ratio = m.ratio(layer)
    if draw(st.integers(0, 2)):         # decode about 2 draws in 3: more of its regimes are rare
        seqlen, start_pos = 1, draw(decode_positions(model, ratio))
    else:
        step = ratio if ratio > 1 else m.candidate_block_size if ratio == 1 else m.window
        cheap = kind in ("window", "hca")
        seqlen, start_pos = draw(prefill_lengths(step, 1, 300 if cheap else 40)), 0
    return model, layer, seqlen, start_pos, draw(st.integers(0, 2 ** 32 - 1))


LAYER_CHECK_KINDS: dict[str, tuple] = {}     # rule -> the kinds its layer check draws (coverage.strategy_rates)


def layer_check(kinds: tuple, rule_id: str):
    """forall over the fixed layer cases of `kinds` (as explicit examples), then layer_keys(kinds),
    for a check of `rule_id`."""
    LAYER_CHECK_KINDS[rule_id] = kinds
    return forall(*(dict(key=key) for key in FIXED_LAYERS if key_kind(key) in kinds), key=layer_keys(kinds))


RUNS_BYTES = 512 * 2 ** 20      # the layer results a process keeps (one case's: up to about 90 MB)
_RUNS: dict = {}                # (op, id(provider), case label) -> (provider, outputs, bytes), oldest use first


def cached_run(target, op: str, case: LayerCase) -> dict:
    """The target's outputs of the layer operation `op` on a case, computed once per provider and
    case while kept (RUNS_BYTES, the least recently used dropped first), so the layer checks of
    every rule and test of a process share them.  Keyed by the provider object, held while kept (its
    id is not reused): a mutant, the coverage recorder or any other provider computes its own."""
    key = (op, id(target.provider), case.label)
    kept = _RUNS.pop(key, None)
    if kept is None or kept[0] is not target.provider:
        out = getattr(target, op)(case.torch_inputs(), model=case.model, layer=case.layer, start_pos=case.start_pos)
        out = {k: as_numpy(v) for k, v in out.items()}
        kept = (target.provider, out, sum(v.nbytes for v in out.values()))
    _RUNS[key] = kept
    while len(_RUNS) > 1 and sum(k[2] for k in _RUNS.values()) > RUNS_BYTES:
        _RUNS.pop(next(iter(_RUNS)))
    return kept[1]


def run_layer(target, case: LayerCase) -> dict:
    """The target's index_layer stages for a case (cached_run)."""
    return cached_run(target, "index_layer", case)


INDEXER = ("csa", "index_source", "candidate_source", "reindex")
OWN_K = ("csa", "index_source", "candidate_source")
V41_K = ("index_source", "candidate_source")
ALL_KINDS = ("window", "hca") + INDEXER


class Stage:
    """One stage: its name, the rule judging it, the layer kinds that have it, and the judge
    (target, case, out) -> None."""

    def __init__(self, name: str, rule_id: str, kinds: tuple, judge):
        self.name, self.rule_id, self.kinds, self.judge = name, rule_id, kinds, judge


def _need(out: dict, name: str, case: LayerCase) -> np.ndarray:
    if name not in out:
        raise AssertionError(f"stage {name!r} missing from the layer's outputs [{case!r}]")
    return np.asarray(out[name], dtype=np.float64) if out[name].dtype.kind == "f" else out[name]


def _close(got, ref, tol, what: str, case: LayerCase, bf16: bool = True):
    assert_within(got, ref, tol, what=what, bf16=bf16, note=f" [{case!r}]")


def layer_kind(case) -> str:
    return spec_pool.layer_role(profile(case.model), case.layer).kind


_Q_BOUNDS = Kept(64 * 2 ** 20)      # FP8.LINEAR's bounds on q of a run's 13 cases: about 22 MB


def _q_bounds(case, b: int):
    """The spec's bounds on a case's q (two exact block GEMMs at the real width, about a second),
    computed once for the case's qr and wq_b while kept: every target's run of the case, and its
    attention case (the same arrays), is judged on them."""
    a = case.arrays()
    return _Q_BOUNDS.get(lambda: fp8_linear_bounds(a["qr"], a["wq_b"], a["wq_b_scale"], b),
                         a["qr"], a["wq_b"], a["wq_b_scale"], b)


def _judge_q(target, case, out):
    a, m = case.arrays(), profile(case.model)
    b = spec_quant.FP8_LINEAR_BLOCK[case.model]
    bf16 = target.variant("fp8_linears") == "bf16"
    return assert_linear(target, _need(out, "q", case), a["qr"], a["wq_b"], a["wq_b_scale"], b,
                         f"PATH.Q.PROJ: q = FP8.LINEAR(qr, wq_b), act_quant per {b} [{case!r}]",
                         shape=(case.seqlen, a["wq_b"].shape[0] // m.index_head_dim, m.index_head_dim),  # a rank's heads
                         bounds=None if bf16 else _q_bounds(case, b))


def _table(target, case: LayerCase, use: str):
    """The target's own table when it reports one; else the spec's fp32 table (and its slack)."""
    if target.has("rope_freqs"):
        return as_numpy(target.rope_freqs(case.model, case.layer, use)).astype(np.float64), False
    return spec_rope.frequencies_fp32(profile(case.model), case.layer).astype(np.float64), True


def judge_rotation(target, case, x, got, positions, use: str, what: str):
    """The rotation of x at `positions` by the target's table; "rope_table=bf16" when judged so."""
    freqs, slack = _table(target, case, use)
    table = declared_choice(target, "rope_table")
    tol = spec_rope.rotate_tolerance(x, positions, freqs, table)
    if slack:   # a table one fp32 rounding away turns pair i by up to |p·f_i|·2^-20 more (p < 0 de-rotates)
        pair = np.abs(x[..., -64::2]) + np.abs(x[..., -63::2])
        angle = np.abs(spec_rope._broadcast(x, spec_rope.angles(positions, freqs)))
        extra = pair * angle * 2 * spec_rope.FREQ_RTOL
        tol[..., -64:] += np.repeat(extra, 2, axis=-1)
    _close(got, spec_rope.rotate_exact(x, positions, freqs), tol, what, case)
    return None if table == "fp32" else f"rope_table={table}"


def _judge_q_rot(target, case, out):
    return judge_rotation(target, case, _need(out, "q", case), _need(out, "q_rot", case), case.positions, "index_q",
                           "ROPE.POSITIONS: index q rotated at its token positions")


def _k_input(case, out):
    """The stage RoPE rotates for the index K: V4 the given entry, V4.1 sources k_normed."""
    return case.arrays()["index_entry"] if layer_kind(case) == "csa" else _need(out, "k_normed", case)


def _entries(case) -> int:
    return (case.start_pos + case.seqlen) // profile(case.model).ratio(case.layer)


def _judge_k_rot(target, case, out):
    positions = spec_rope.compressed_positions(_entries(case), profile(case.model).ratio(case.layer))
    return judge_rotation(target, case, _k_input(case, out), _need(out, "k_rot", case), positions, "index_k",
                           "ROPE.POSITIONS: index K entry j rotated at j·ratio")


def _judge_k(target, case, out):
    a = case.arrays()
    _close(_need(out, "k", case), spec.matmul(a["latent"], a["wk"]), spec.matmul_tolerance(a["latent"], a["wk"]),
           "PATH.K.PROJ: k = bf16(wk · latent)", case)


def _judge_k_normed(target, case, out):
    k, w, eps = _need(out, "k", case), case.arrays()["k_norm"], profile(case.model).norm_eps
    _close(_need(out, "k_normed", case), spec.rms_norm(k, w, eps), spec.rms_norm_tolerance(k, w, eps),
           "PATH.K.NORM: k_norm(k), eps = norm_eps", case)


def _judge_hadamard(which: str):
    def judge(target, case, out):
        rot = _need(out, f"{which}_rot", case)
        if profile(case.model).hadamard and declared_choice(target, "index_hadamard") == "none":
            if f"{which}_had" in out:
                assert_equal(out[f"{which}_had"], rot.astype(np.float32),
                             what=f"PATH.HADAMARD: index_hadamard=none declared ({which}_had must be {which}_rot) "
                                  f"[{case!r}]")
            return "index_hadamard=none"
        if profile(case.model).hadamard:
            _close(_need(out, f"{which}_had", case), spec_indexer.hadamard(rot), spec_indexer.hadamard_tolerance(rot),
                   f"PATH.HADAMARD: {which}_had = Hadamard({which}_rot) (V4)", case)
        elif f"{which}_had" in out:
            assert_equal(out[f"{which}_had"], rot.astype(np.float32),
                         what=f"PATH.HADAMARD: V4.1 has no Hadamard ({which}_had must be {which}_rot) [{case!r}]")
    return judge


def _judge_fp4(which: str):
    def judge(target, case, out):
        if _without_qdq(target):
            return "index_qdq=none"        # declared: no FP4 stage; the scores read the BF16 operands
        source = out.get(f"{which}_had", out.get(f"{which}_rot"))
        if source is None:
            raise AssertionError(f"stage {which}_rot missing [{case!r}]")
        packed, scales = spec_quant.fp4_e8m0_quantize(np.asarray(source, np.float32))
        what = f"PATH.ORDER: {which} FP4 bytes are those of the rotated {which} [{case!r}]"
        assert_bytes_equal(_need(out, f"{which}_scales", case), scales, what=what + " (E8M0 scales)")
        assert_bytes_equal(_need(out, f"{which}_packed", case), packed, what=what + " (payload)")
    return judge


def _judge_w_raw(target, case, out):
    a = case.arrays()
    _close(_need(out, "w_raw", case), spec.matmul(a["x"], a["weights_proj"]),
           spec.matmul_tolerance(a["x"], a["weights_proj"]), "PATH.W.PROJ: w_raw = bf16(weights_proj · x)", case)


def _refactored(case, out, rounding: str) -> bool:
    """Whether the layer's weights carry n^-0.5 alone, 128^-0.5 left for the scores (IDX.WEIGHT.SCALE):
    the same product in fp32 scores; in BF16 steps another rounding (mutant scale_after_relu)."""
    if rounding == "bf16_steps":
        return False
    raw = np.asarray(_need(out, "w_raw", case), dtype=np.float64)
    got, m = np.asarray(_need(out, "weights", case), dtype=np.float64), profile(case.model)
    return (not spec_indexer.index_weights_accepted(got, raw, m, rounding).all()
            and bool(spec_indexer.refactored_weights_accepted(got, raw, m, rounding).all()))


def _judge_weights(target, case, out):
    rounding = target.variant("score_rounding")
    if _refactored(case, out, rounding):
        return
    raw = np.asarray(_need(out, "w_raw", case), dtype=np.float64)
    got = np.asarray(_need(out, "weights", case), dtype=np.float64)
    assert_weights(got, raw, profile(case.model), f"IDX.WEIGHT.SCALE: weights = w_raw · 128^-0.5 · H^-0.5 [{case!r}]",
                   rounding)


def _visible(case) -> np.ndarray:
    return spec_indexer.index_visible(case.positions, profile(case.model).ratio(case.layer))


def scores_published_k(case) -> bool:
    """Whether the case is a V4.1 source's decode step that scores the cache published last."""
    return spec.reads_published_k(profile(case.model), case.layer, case.seqlen, case.start_pos)


READINGS = {"published": "the cache published last (layer 20's)", "own": "the layer's own index-K cache"}


def _without_qdq(target) -> bool:
    """Whether the target declares the index q and k scored without their FP4 QDQ (index_qdq=none)."""
    return declared_choice(target, "index_qdq") == "none"


def _bf16_operand(out, which: str, case) -> np.ndarray:
    """The index q or k a port without the FP4 QDQ scores: after its Hadamard (V4), else after RoPE."""
    return _need(out, f"{which}_had", case) if f"{which}_had" in out else _need(out, f"{which}_rot", case)


def scored_keys(case, out, reading: str, qdq: bool = True) -> np.ndarray:
    """The dequantized keys the layer scores under index_k_read = `reading` (qdq False: a port
    without the index FP4 QDQ scores its own BF16 keys; the caches it is given stay FP4)."""
    a = case.arrays()
    if reading == "published" and scores_published_k(case):
        k = spec_quant.fp4_e8m0_dequantize(a["published_k_packed"], a["published_k_scales"])[:_entries(case)]
    elif qdq:
        k = spec_quant.fp4_e8m0_dequantize(_need(out, "k_packed", case), _need(out, "k_scales", case))
    elif layer_kind(case) == "reindex":
        k = spec_quant.fp4_e8m0_dequantize(a["k_packed"], a["k_scales"])
    else:
        k = _bf16_operand(out, "k", case)
    return np.asarray(k, np.float64)


def _scored(target, case, out, reading: str) -> tuple:
    """(q, k) the layer scores: FP4-dequantized, or the BF16 ones with index_qdq=none declared."""
    qdq = not _without_qdq(target)
    return None if qdq else _bf16_operand(out, "q", case), scored_keys(case, out, reading, qdq)


def _reading(target, case) -> str:
    return target.variant("index_k_read") if scores_published_k(case) else "own"


def score_mismatch(case, out, k, rounding: str = "bf16_steps", q=None) -> str | None:
    """Why the layer's scores are not IDX.SCORE.FP4's of its q (its FP4 q when None), weights and
    the keys k under score_rounding = `rounding` (None: they are).  Refactored weights (n^-0.5
    alone) are judged times fl32(128^-0.5), with that factor's rounding and its product's."""
    if q is None:
        q = spec_quant.fp4_e8m0_dequantize(_need(out, "q_packed", case), _need(out, "q_scales", case))
    q = np.asarray(q, np.float64)
    w = _need(out, "weights", case)
    refactored = _refactored(case, out, rounding)
    if refactored:
        w = w * float(np.float32(profile(case.model).index_head_dim ** -0.5))
    ref, tol = scores_under(rounding, ScoreCase(case.label, q, k, w, _visible(case)))
    if refactored:
        tol = tol + 2.0 ** -23 * spec_indexer.weighted_l1(q, k, w) + 2.0 ** -148
    got = _need(out, "scores", case)
    if got.shape != ref.shape:
        return f"scores shape {got.shape}, expected {ref.shape}"
    with np.errstate(invalid="ignore"):
        bad = np.argwhere(np.where(np.isfinite(ref), ~(np.abs(got - ref) <= tol), got != ref))
    if not bad.size:
        return None
    t, s = bad[0]
    return f"{len(bad)} scores off; at (t={t}, s={s}) got {got[t, s]!r}, expected {ref[t, s]!r} ± {tol[t, s]:.3g}"


def _judge_scores(target, case, out):
    q, k = _scored(target, case, out, _reading(target, case))
    why = score_mismatch(case, out, k, target.variant("score_rounding"), q)
    if why:
        raise AssertionError(f"IDX.SCORE.FP4: {why} [{case!r}]")


def judge_sharded_scores(target, case, ranks: list, rank: int, reading: str | None = None) -> None:
    """IDX.SCORE.TP on a recorded layer-step of every tensor-parallel rank (check-trace): rank `rank`'s
    scores (case: that rank's) are the BF16 all-reduce of the ranks' partial scores over their heads
    (their own q and weights) and its own keys, within IDX.SCORE.TP's bound of the full score of
    every rank's heads."""
    qs = [spec_quant.fp4_e8m0_dequantize(_need(o, "q_packed", case), _need(o, "q_scales", case)) for o in ranks]
    keys = scored_keys(case, ranks[rank], reading or _reading(target, case))
    full = ScoreCase(case.label, np.concatenate(qs, axis=1), keys,
                     np.concatenate([_need(o, "weights", case) for o in ranks], axis=1), _visible(case))
    ends = np.cumsum([0] + [q.shape[1] for q in qs])
    assert_sharded_scores(target, _need(ranks[rank], "scores", case), full,
                          [np.arange(a, b) for a, b in zip(ends[:-1], ends[1:])],
                          f"IDX.SCORE.TP: rank {rank}'s scores, the all-reduce of {len(ranks)} ranks' head shards")


def judge_sharded_scored_keys(target, case, ranks: list, rank: int) -> None:
    """PATH.K.PUBLISHED at world size > 1: the index-K cache is not sharded, so rank `rank` scores its
    own copy of the cache published last with its heads, and its all-reduced scores are those keys'
    (scores of the other reading's keys break it; off under both readings: IDX.SCORE.TP's to report)."""
    if not scores_published_k(case):
        return
    reading = target.variant("index_k_read")
    other = "own" if reading == "published" else "published"
    try:
        judge_sharded_scores(target, case, ranks, rank, reading)
    except AssertionError as why:
        try:
            judge_sharded_scores(target, case, ranks, rank, other)
        except AssertionError:
            return
        raise AssertionError(f"PATH.K.PUBLISHED (index_k_read={reading}): rank {rank}'s all-reduced scores are those "
                             f"of {READINGS[other]}, expected those of {READINGS[reading]}: {why}") from None


def _judge_scored_keys(target, case, out):
    """At a step where a V4.1 source publishes nothing: scores of the other reading's keys break
    PATH.K.PUBLISHED (scores off under both readings are IDX.SCORE.FP4's to report)."""
    if not scores_published_k(case):
        return
    reading = target.variant("index_k_read")
    other = "own" if reading == "published" else "published"
    rounding = target.variant("score_rounding")
    q, k = _scored(target, case, out, reading)
    why = score_mismatch(case, out, k, rounding, q)
    if why and score_mismatch(case, out, _scored(target, case, out, other)[1], rounding, q) is None:
        raise AssertionError(f"PATH.K.PUBLISHED (index_k_read={reading}): the scores are those of {READINGS[other]}, "
                             f"expected those of {READINGS[reading]}: {why} [{case!r}]")


def _judge_candidates(target, case, out):
    m = profile(case.model)
    assert_pool(_need(out, "candidates", case), _need(out, "scores", case), _visible(case),
                m.candidate_topk_blocks, m.candidate_block_size,
                clauses=("shape", "whole_blocks", "size", "newest", "reachable", "selection"),
                what=f"POOL.TOPK_BLOCKS: layer 20's pool of its own scores [{case!r}]")


def _judge_topk(target, case, out):
    m = profile(case.model)
    scores = _need(out, "scores", case)
    eligible = spec_indexer.visibility_mask(_visible(case), scores.shape[1])
    rule = "IDX.TOPK.SELECTION"
    if layer_kind(case) == "reindex":
        eligible = eligible & case.arrays()["candidates"]
        rule = "POOL.REINDEX"
    k = min(m.index_topk, _entries(case))
    order = "score" if case.model in spec.V4 else "position"
    assert_topk(_need(out, "topk", case), np.where(eligible, scores, -np.inf), eligible, k, order,
                clauses=("shape", "range", "padding", "count", "unique", "order", "selection"),
                what=f"{rule}: the layer's top-k of its own scores [{case!r}]")


def _judge_window(target, case, out):
    layout = target.variant("window_layout")
    assert_same_rows_as_sets(_need(out, "window_idx", case), spec.window_index(case.seqlen, case.start_pos, layout=layout),
                             f"PATH.WINDOW (window_layout={layout}) [{case!r}]")


def _judge_compressed(target, case, out):
    want = spec.compressed_index(case.seqlen, case.start_pos, profile(case.model).ratio(case.layer),
                                 layout=target.variant("window_layout"))
    assert_equal(_ints(_need(out, "compressed_idx", case)), want, what=f"PATH.HCA [{case!r}]")


def _judge_indices(target, case, out):
    window, layout = _ints(_need(out, "window_idx", case)), target.variant("window_layout")
    kind = layer_kind(case)
    if kind == "window":
        assert_equal(_ints(_need(out, "indices", case)), window, what=f"PATH.CONCAT: window only [{case!r}]")
        return
    if kind == "hca":
        want = np.concatenate([window, _ints(_need(out, "compressed_idx", case))], axis=-1)
    else:
        want = spec.attention_index(window, _ints(_need(out, "topk", case)), case.seqlen, case.start_pos, layout=layout)
    offset = spec.kv_offset(case.seqlen, case.start_pos, layout=layout)
    assert_equal(_ints(_need(out, "indices", case)), want,
                 what=f"PATH.CONCAT (window_layout={layout}): [window | compressed + {offset}] [{case!r}]")


STAGES = (
    Stage("window_idx", "PATH.WINDOW", ALL_KINDS, _judge_window),
    Stage("compressed_idx", "PATH.HCA", ("hca",), _judge_compressed),
    Stage("q", "PATH.Q.PROJ", INDEXER, _judge_q),
    Stage("q_rot", "ROPE.POSITIONS", INDEXER, _judge_q_rot),
    Stage("q_had", "PATH.HADAMARD", INDEXER, _judge_hadamard("q")),
    Stage("q_fp4", "PATH.ORDER", INDEXER, _judge_fp4("q")),
    Stage("k", "PATH.K.PROJ", V41_K, _judge_k),
    Stage("k_normed", "PATH.K.NORM", V41_K, _judge_k_normed),
    Stage("k_rot", "ROPE.POSITIONS", OWN_K, _judge_k_rot),
    Stage("k_had", "PATH.HADAMARD", OWN_K, _judge_hadamard("k")),
    Stage("k_fp4", "PATH.ORDER", OWN_K, _judge_fp4("k")),
    Stage("w_raw", "PATH.W.PROJ", INDEXER, _judge_w_raw),
    Stage("weights", "IDX.WEIGHT.SCALE", INDEXER, _judge_weights),
    Stage("scored_k", "PATH.K.PUBLISHED", V41_K, _judge_scored_keys),
    Stage("scores", "IDX.SCORE.FP4", INDEXER, _judge_scores),
    Stage("candidates", "POOL.TOPK_BLOCKS", ("candidate_source",), _judge_candidates),
    Stage("topk", "IDX.TOPK.SELECTION", INDEXER, _judge_topk),
    Stage("indices", "PATH.CONCAT", ALL_KINDS, _judge_indices),
)


def stage_verdicts(target, case: LayerCase) -> list[dict]:
    """Every stage of the case's layer kind judged on the target's own stage before: a verdict each."""
    stages = [(s.name, s.rule_id, s.judge) for s in STAGES if layer_kind(case) in s.kinds]
    return judge_every_stage(stages, target, case, run_layer(target, case))


def first_broken_stage(target, case: LayerCase):
    """(stage, rule, message) of the first stage that breaks its rule, or None."""
    return first_broken(stage_verdicts(target, case))


def _stage_check(rule_id: str):
    stages = [stage for stage in STAGES if stage.rule_id == rule_id]
    kinds = tuple(sorted({kind for stage in stages for kind in stage.kinds}))

    def layer_stages(target, key):
        case = layer_case(key)
        out = run_layer(target, case)
        for stage in stages:
            if layer_kind(case) in stage.kinds:
                stage.judge(target, case, out)
    layer_stages.__name__ = "layer_stages_" + rule_id.lower().replace(".", "_")
    return layer_check(kinds, rule_id)(layer_stages)


for _rule in ("PATH.Q.PROJ", "PATH.K.PROJ", "PATH.K.NORM", "PATH.HADAMARD", "PATH.W.PROJ", "ROPE.POSITIONS"):
    check(_rule, ops=("index_layer",))(_stage_check(_rule))


_ORDER_LAYERS = _stage_check("PATH.ORDER")


@check("PATH.ORDER", ops=("index_layer",))
def layer_quantizes_after_rope(target):
    _ORDER_LAYERS(target)


@check("PATH.LAYER", ops=("index_layer",))
@layer_check(ALL_KINDS, "PATH.LAYER")
def every_stage_on_the_stage_before(target, key):
    case = layer_case(key)
    report_stages("PATH.LAYER", case, stage_verdicts(target, case))


# ------------------------------------------------------------------------------------------------
# clauses the drawn layer cases cannot show (issue 22): one purpose-built case each
# ------------------------------------------------------------------------------------------------
def _recased(case: LayerCase, label: str, **arrays) -> LayerCase:
    return LayerCase(f"{case.label}, {label}", case.model, case.layer, case.start_pos,
                     tuple((name, arrays.get(name, a)) for name, a in case.inputs))


def _judge_stages(target, case: LayerCase, *judges) -> None:
    out = run_layer(target, case)
    for judge in judges:
        judge(target, case, out)


@functools.lru_cache(maxsize=1)
def act_quant_block_case() -> LayerCase:
    """V4.1 layer 2 with qr's runs of 32 scaled 2^-8 … 2^8 apart and wq_b's scales undoing it, so
    every K block weighs alike in q: act_quant per 128 instead of per b = 32 flushes the small runs
    to E4M3 subnormals or 0 and moves q far (on unit-normal qr the block size is invisible: with a
    power-of-two scale E4M3 rounds alike unless a value goes subnormal)."""
    case = make_layer_case("v4.1-flash", 2, 10, 0, 11)
    a, b = case.arrays(), spec_quant.FP8_LINEAR_BLOCK["v4.1-flash"]
    e = np.random.default_rng(11).integers(-8, 9, a["qr"].shape[1] // b)
    qr = (a["qr"] * np.repeat(2.0 ** e, b)).astype(np.float32)
    scales = (a["wq_b_scale"].astype(np.int64) - e[None, :]).astype(np.uint8)
    return _recased(case, "qr runs of 32 spread 2^±8, wq_b scales compensating", qr=qr, wq_b_scale=scales)


@check("PATH.Q.PROJ", ops=("index_layer",))
def act_quant_per_b_of_the_model(target):
    _judge_stages(target, act_quant_block_case(), _judge_q)


@functools.lru_cache(maxsize=1)
def small_keys_case() -> LayerCase:
    """V4.1 layer 2 with its latent scaled by 2^-16: mean(k²) ≈ 2^-32 ≈ 2e-10, where eps = 1e-20
    leaves k_norm alone and 1e-6 (V4's eps) shrinks it about 70-fold."""
    case = make_layer_case("v4.1-flash", 2, 10, 0, 12)
    return _recased(case, "latent × 2^-16", latent=(case.arrays()["latent"] * 2.0 ** -16).astype(np.float32))


@check("PATH.K.NORM", ops=("index_layer",))
def k_norm_eps_of_the_model(target):
    _judge_stages(target, small_keys_case(), _judge_k, _judge_k_normed)


@functools.lru_cache(maxsize=1)
def tiny_weights_case() -> LayerCase:
    """V4.1 layer 2 with half the heads' weights_proj rows 8 channels of about 2^-122, the rest 0:
    their w_raw lie near 2^-121, so w_raw · 2^-6 is a BF16 subnormal and often an exact tie, where
    a factor one fp32 ulp off 2^-6 rounds the other way (BF16 holds these; on unit-RMS weights no
    factor that close shows).  Each product stays an fp32 normal, whatever the matmul flushes."""
    case = make_layer_case("v4.1-flash", 2, 10, 0, 14)
    rng = np.random.default_rng(14)
    w = case.arrays()["weights_proj"].copy()
    H, dim = w.shape
    for h in range(0, H, 2):
        w[h] = 0.0
        w[h, rng.choice(dim, 8, replace=False)] = normal_bf16(rng, 8, 2.0 ** -122)
    return _recased(case, "half the heads' weights_proj 8 channels at 2^-122", weights_proj=w.astype(np.float32))


@check("IDX.WEIGHT.SCALE", ops=("index_layer",))
def layer_weights_carry_the_factor_at_subnormal_ties(target):
    _judge_stages(target, tiny_weights_case(), _judge_weights)


@functools.lru_cache(maxsize=1)
def completing_decode_case() -> LayerCase:
    """V4.1 layer 2 (ratio 2) decoding position 33: entry 16 completes this step and is rotated at
    its group's first token 32 = start_pos + 1 − ratio (the fixed decode cases are ratio 1, where
    the two agree)."""
    return make_layer_case("v4.1-flash", 2, 1, 33, 13)


@check("ROPE.POSITIONS", ops=("index_layer",))
def decode_entry_rotated_at_its_groups_first_token(target):
    _judge_stages(target, completing_decode_case(), _judge_q_rot, _judge_k_rot)


# ------------------------------------------------------------------------------------------------
# which index-K cache a V4.1 source scores where it publishes nothing (PATH.K.PUBLISHED)
# ------------------------------------------------------------------------------------------------
PUBLISHED_EXAMPLES = (("v4.1-flash", 2, 1, 40, 30),       # 20 entries: the scores differ, the selection not
                      ("v4.1-flash", 14, 1, 1026, 31))    # 513 entries: the selection differs too


@st.composite
def published_k_keys(draw):
    """A V4.1 ratio-2 source decoding an even position (it publishes nothing) with more entries
    than the top-k, where the selection follows the scored cache: half at the top-k's edge
    (E = index_topk + 1 or + 2), half any up to 2^12 tokens; and the inputs' seed.  (Fewer
    entries: every one is taken, the scores alone differ: PUBLISHED_EXAMPLES[0].)"""
    m = profile("v4.1-flash")
    layer = draw(st.sampled_from([s for s in m.kv_source_layers if m.ratio(s) > 1]))
    ratio = m.ratio(layer)
    if draw(st.booleans()):
        start_pos = (m.index_topk + draw(st.integers(1, 2))) * ratio
    else:
        start_pos = ratio * draw(st.integers(m.index_topk + 1, 2 ** 12 // ratio))
    return m.name, layer, 1, start_pos, draw(st.integers(0, 2 ** 32 - 1))


@check("PATH.K.PUBLISHED", ops=("index_layer",))
@forall(*(dict(key=key) for key in PUBLISHED_EXAMPLES), key=published_k_keys())
def sources_score_the_cache_published_last(target, key):
    case = layer_case(key)
    out = run_layer(target, case)
    reading, rounding = target.variant("index_k_read"), target.variant("score_rounding")
    q, k = _scored(target, case, out, reading)
    why = score_mismatch(case, out, k, rounding, q)
    if why:
        other = "own" if reading == "published" else "published"
        hint = "" if score_mismatch(case, out, _scored(target, case, out, other)[1], rounding, q) else \
            f" (they are those of {READINGS[other]})"
        raise AssertionError(f"PATH.K.PUBLISHED (index_k_read={reading}): scores of {READINGS[reading]} "
                             f"expected{hint}: {why} [{case!r}]")
    _judge_topk(target, case, out)
