"""The indexer-family Triton kernels against impl (the oracle): BF16 scores within 1 BF16 ulp with
the −inf positions exact, FP4 scores likewise, top-k tie-aware valid and (both break ties by the
lowest position) equal to impl; the radix-select paths forced with small chunks and candidate
caps; the Hadamard rotation, head weights and visible counts bit for bit equal to impl on every
BF16 pattern and the edge rows; input validation (impl's errors, word for word, for the latter);
determinism; an sm_90 compile of every kernel of kernels.indexer and kernels.pool; and every HAD.*
and IDX.* rule on the kernels target.  No timing."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import indexer as K
from dsv4spec.kernels import topk as KT
from dsv4spec.properties.indexer import OPS, make_rows, make_score_case
from dsv4spec.properties.ranking import assert_topk
from dsv4spec.spec import indexer as S
from dsv4spec.spec.models import PROFILES
from dsv4spec.spec.rules import V4_ALL

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]  # ±inf rows

SCORE_SHAPES = [(5, 4, 16, 150), (3, 32, 128, 20), (2, 1, 16, 70)]  # (T, H, D, S): >1 key block


def assert_scores_close(got, ref, what):
    """−inf (and +inf) exactly where the reference has them; finite within 1 BF16 ulp of |ref|."""
    g, r = got.double().numpy(), ref.double().numpy()
    assert g.shape == r.shape, f"{what}: shape {g.shape}, expected {r.shape}"
    inf = ~np.isfinite(r)
    bad_inf = np.argwhere(inf & (g != r) | ~inf & ~np.isfinite(g))
    assert bad_inf.size == 0, f"{what}: ±inf positions differ, first at {tuple(bad_inf[0])}"
    with np.errstate(invalid="ignore"):
        err = np.abs(g - r)
    tol = S.bf16_quantum(np.where(inf, 0.0, r))
    bad = np.argwhere(~inf & (err > tol))
    assert bad.size == 0, (f"{what}: {len(bad)} scores beyond 1 BF16 ulp; at {tuple(bad[0])}: "
                           f"got {g[tuple(bad[0])]!r}, impl {r[tuple(bad[0])]!r}")


# The score kernel's A/B switches (kernels.indexer._SCORE_*, read at each launch; named settings in
# SCORE_AB): each is another way to compute the same bits.  In the interpreter the roundings fall
# back to the integer code (no inline PTX there) and the FP4 decodes run their placement and join
# order with fp32 multiplies in place of the PTX's BF16 ones; on CUDA every variant runs as it
# would ship, and a wrong one fails the score tests below.
RUN_VARIANTS = ["shipped", "int_fp32", "fp4_fp32"] if K.INTERPRET else list(K.SCORE_AB)


def set_variant(monkeypatch, name):
    for switch, value in K.SCORE_AB[name].items():
        assert hasattr(K, switch), switch
        monkeypatch.setattr(K, switch, value)


@pytest.fixture(params=RUN_VARIANTS)
def score_variant(request, monkeypatch):
    set_variant(monkeypatch, request.param)
    return request.param


def programs_a_row(monkeypatch, n_s):
    """The score kernel's key blocks split over n_s programs a row (the interpreter's config has 1)."""
    shipped = K._score_config

    def config(T, S_, H_PAD, D_PAD, gather):
        tq, block_s, _, warps, stages = shipped(T, S_, H_PAD, D_PAD, gather)
        return tq, block_s, n_s, warps, stages
    monkeypatch.setattr(K, "_score_config", config)


@pytest.mark.parametrize("shape", SCORE_SHAPES, ids=lambda s: "T%d_H%d_D%d_S%d" % s)
@pytest.mark.parametrize("kind", ["normal", "relu_zero", "ties", "cancel", "wide_exponents"])
def test_bf16_scores_match_impl(kind, shape, score_variant):
    case = make_score_case(kind, 7, *shape)
    args = case.torch()
    assert_scores_close(K.index_scores(*args), impl.index_scores(*args), f"index_scores {case!r}")
    # bfloat16 tensors are taken as they are
    bf = [a.to(torch.bfloat16) if a.is_floating_point() else a for a in args]
    assert_scores_close(K.index_scores(*bf), impl.index_scores(*args), f"index_scores bf16 {case!r}")


@pytest.mark.parametrize("kind", ["normal", "cancel", "wide_exponents"])
def test_fp32_scores_match_impl(kind):
    case = make_score_case(kind, 3, 4, 8, 16, 90, fp32=True)
    got = K.index_scores(*case.torch(), "fp32").double().numpy()
    ref = impl.index_scores(*case.torch(), "fp32").double().numpy()
    tol = S.index_score_tolerance(case.q, case.k, case.w, "fp32")
    fin = np.isfinite(ref)
    assert np.array_equal(~fin, ~np.isfinite(got)) and np.all(got[~fin] == ref[~fin])
    assert np.all(np.abs(got[fin] - ref[fin]) <= 2 * tol[fin]), f"fp32 scores off [{case!r}]"


def fp4_inputs(seed, T, H, D, S_, random_bytes):
    rng = np.random.default_rng(seed)
    if random_bytes:  # every nibble, scale bytes around 2^0 plus the extremes 0 (2^-127) and 1
        qp = torch.from_numpy(rng.integers(0, 256, (T, H, D // 2), dtype=np.uint8))
        kp = torch.from_numpy(rng.integers(0, 256, (S_, D // 2), dtype=np.uint8))
        qs = torch.from_numpy(rng.integers(118, 131, (T, H, D // 32), dtype=np.uint8))
        ks = torch.from_numpy(rng.integers(118, 131, (S_, D // 32), dtype=np.uint8))
        ks[0] = 0
        qs[0, 0] = 1
    else:  # the codec's output for normal BF16 data
        qp, qs = impl.fp4_e8m0_quantize(torch.from_numpy(S.round_bf16(rng.standard_normal((T, H, D)))).float())
        kp, ks = impl.fp4_e8m0_quantize(torch.from_numpy(S.round_bf16(rng.standard_normal((S_, D)))).float())
    w = torch.from_numpy(S.round_bf16(rng.standard_normal((T, H)) * 0.05)).float()
    vis = torch.from_numpy(rng.integers(0, S_ + 1, T))
    vis[0] = S_
    return qp, qs, kp, ks, w, vis


@pytest.mark.parametrize("random_bytes", [True, False], ids=["bytes", "codec"])
@pytest.mark.parametrize("shape", [(3, 4, 32, 80), (2, 32, 128, 24)], ids=lambda s: "T%d_H%d_D%d_S%d" % s)
def test_fp4_scores_match_impl(shape, random_bytes, score_variant):
    args = fp4_inputs(11, *shape, random_bytes)
    assert_scores_close(K.index_scores_fp4(*args), impl.index_scores_fp4(*args), f"index_scores_fp4 {shape}")


def fp4_extreme_inputs(seed, T, H, D, S_):
    """fp4_inputs' random bytes with every scale byte of K (0-255, 255 the NaN scale) and q's
    from 0 to 254: codes times 2^-127 .. 2^127 (BF16 subnormals and overflow to inf)."""
    qp, qs, kp, ks, w, vis = fp4_inputs(seed, T, H, D, S_, True)
    ks = torch.arange(S_ * (D // 32)).reshape(S_, D // 32).remainder(256).to(torch.uint8)
    qs = torch.arange(T * H * (D // 32)).reshape(T, H, D // 32).remainder(255).to(torch.uint8)
    return qp, qs, kp, ks, w, vis


@pytest.mark.parametrize("n_s", [1, 2, 3])
@pytest.mark.parametrize("variant", [v for v in RUN_VARIANTS if v != "shipped"])
def test_score_variants_give_the_shipped_bits(variant, n_s, monkeypatch):
    """Every A/B switch of the score kernel gives the shipped path's bits (float32 patterns, NaN
    and -0 included): BF16 scores (wide exponents, zeros, BF16 subnormals at every step), FP4
    scores with every scale byte, FP4 block maxima; the key blocks split over 1-3 programs a
    row, causal rows of every length."""
    programs_a_row(monkeypatch, n_s)
    bf = make_score_case("wide_exponents", 5, 5, 4, 16, 150).torch()
    zero = make_score_case("relu_zero", 6, 3, 32, 128, 70).torch()
    q, k, w_, visible = make_score_case("normal", 7, 3, 32, 128, 70).torch()
    tiny = (q * 2.0 ** -66, k * 2.0 ** -66, w_, visible)   # dots near 2^-132: BF16 subnormal s_h, p_h and I
    T, H, D, S_ = 4, 4, 64, 200
    qp, qs, kp, ks, w, vis = fp4_extreme_inputs(13, T, H, D, S_)
    vis = torch.tensor([S_, 0, 65, 129])
    dev = K._device()
    fp4 = [x.contiguous().to(dev) for x in (qp, qs, kp, ks, w.to(torch.bfloat16))]

    def block_maxima():
        out = torch.full((T, S_ // 8), float("nan"), device=dev)
        K._launch_scores(*fp4, vis.to(torch.int32).to(dev), None, T, S_, H, D, out, fp4=True, bf16=True,
                         block_max=8)
        return out.cpu()

    def outputs():
        return [K.index_scores(*bf), K.index_scores(*zero), K.index_scores(*tiny),
                K.index_scores_fp4(qp, qs, kp, ks, w, vis), block_maxima()]
    want = outputs()
    fin = want[2][torch.isfinite(want[2])].abs()
    assert int(((fin > 0) & (fin < 2.0 ** -126)).sum()) > 50   # the subnormal case is one
    set_variant(monkeypatch, variant)
    for what, got, ref in zip(("bf16 wide", "bf16 relu_zero", "bf16 subnormal", "fp4", "fp4 block maxima"),
                              outputs(), want):
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), f"{variant}, {n_s} programs: {what}"


ROW_KINDS = ["normal", "relu_zero", "equal", "few_values", "minus_inf", "unmasked"]


def check_topk(got, case, order, what):
    elig = S.visibility_mask(case.visible, case.scores.shape[1])
    assert_topk(got, case.scores, elig, case.k, order, what=f"{what} [{case!r}]")  # all clauses
    ref = impl.index_topk(torch.from_numpy(case.scores).float(), torch.from_numpy(case.visible), case.k, order)
    assert torch.equal(got, ref), f"{what}: differs from impl (both take the lowest position on ties) [{case!r}]"


@pytest.mark.parametrize("order", ["position", "score"])
@pytest.mark.parametrize("kind", ROW_KINDS)
def test_topk_matches_impl(kind, order):
    case = make_rows(kind, 5, 4, 300, 40)
    check_topk(K.index_topk(torch.from_numpy(case.scores).float(), torch.from_numpy(case.visible),
                            case.k, order), case, order, "index_topk")


def engine(case, order, cap, blocks=(64, 128)):
    dev = K._device()
    out = KT._topk_radix(torch.from_numpy(case.scores).float().to(dev),
                         torch.from_numpy(case.visible).int().to(dev),
                         case.k, by_score=order == "score", cap=cap, blocks=blocks)
    return out.cpu()


def low_bit_rows(T=3, S_=500, seed=0):
    """Scores that agree in their top 24 key bits: the select must refine through all 3 passes."""
    rng = np.random.default_rng(seed)
    x = np.float32(1.0) + rng.integers(0, 200, (T, S_)).astype(np.float32) * np.float32(2.0 ** -23)
    return x.astype(np.float64)


@pytest.mark.parametrize("order", ["position", "score"])
@pytest.mark.parametrize("rows", ["equal", "few_values", "normal", "low_bits", "minus_inf"])
def test_topk_refinement_and_chunking(rows, order):
    """Many chunks per row (CH = 128) and a candidate cap of k: overfull boundary bins force the
    2nd/3rd radix passes, and all-equal keys the lowest-position truncation."""
    if rows == "low_bits":
        base = make_rows("normal", 1, 3, 500, 64)
        case = type(base)("low_bits", low_bit_rows(), base.visible, 64)
        case.scores = np.where(S.visibility_mask(case.visible, 500), case.scores, -np.inf)
    else:
        case = make_rows(rows, 2, 3, 500, 64)
    for cap in (None, 64):
        check_topk(engine(case, order, cap), case, order, f"engine cap={cap}")


def filtered(case, order, group, cap=None, remap=None):
    """The threshold filter alone (no fallback): (int64 [T,k] with -1 rows where flagged, flags)."""
    dev = K._device()
    T = case.scores.shape[0]
    out = torch.full((T, case.k), -1, dtype=torch.int64, device=dev)
    flag = KT._topk_filter(torch.from_numpy(case.scores).float().to(dev),
                          torch.from_numpy(case.visible).int().to(dev), case.k, out,
                          by_score=order == "score", drop_neg_inf=False, remap=remap, mask=False,
                          mask_block=0, group=group, cap=cap, blocks=(64, 128))
    return out.cpu(), flag.cpu()


@pytest.mark.parametrize("order", ["position", "score"])
@pytest.mark.parametrize("group", [1, 4, 16])
@pytest.mark.parametrize("rows", ["normal", "relu_zero", "minus_inf", "unmasked"])
def test_topk_threshold_filter_serves_every_row(rows, group, order):
    """Groups of 1, 4 and 16 positions, 4 chunks per row: every row is served by the filter (no
    fallback) and equals impl, ties (relu_zero's zeros, −inf) to the lowest positions whatever
    order the candidates arrived in."""
    case = make_rows(rows, 7, 4, 500, 24)
    case.visible[:2] = 500
    case.scores[:2] = S.round_bf16(np.random.default_rng(8).standard_normal((2, 500)))  # full rows
    got, flag = filtered(case, order, group)
    assert flag.tolist() == [0] * 4, f"rows redone by the radix engine: {flag.tolist()}"
    check_topk(got, case, order, f"threshold filter G={group}")


def boundary_tie_rows(T=3, S_=1000, k=60, seed=3):
    """Rows of 0s and 1s, ~30 % ones spread over every tile: the k-th key is a 1 tied across the
    whole row (the lowest-position ones must win), plus a row of BF16 normal values."""
    rng = np.random.default_rng(seed)
    x = (rng.random((T, S_)) < 0.3).astype(np.float64)
    x[-1] = S.round_bf16(rng.standard_normal(S_))
    base = make_rows("normal", 1, T, S_, k)
    base.visible[:] = [S_, S_ - 37, 513]
    case = type(base)("boundary ties", np.where(S.visibility_mask(base.visible, S_), x, -np.inf),
                      base.visible, k)
    return case


@pytest.mark.parametrize("order", ["position", "score"])
@pytest.mark.parametrize("run,prefetch", [(1, True), (1, False), (8, True), (64, False)])
def test_topk_filter_reservations_across_many_tiles(run, prefetch, order):
    """Slots reserved per candidate (run 1), per run of 8, per whole 64-position tile; with and
    without the next tile in flight; 16 tiles per row in 8 chunks: ties at the boundary spread
    over every tile still resolve to the lowest positions, and every row is served."""
    case = boundary_tie_rows()
    with KT.filter_tuning(run=run, prefetch=prefetch):
        got, flag = filtered(case, order, 1, cap=1024)
    assert flag.tolist() == [0, 0, 0], f"rows redone by the radix engine: {flag.tolist()}"
    check_topk(got, case, order, f"filter run={run} prefetch={prefetch}")


@pytest.mark.parametrize("order", ["position", "score"])
def test_topk_filter_select_resolves_the_low_bits(order):
    """Keys that agree in their top 24 bits (not BF16): the select's digit passes go down to bit
    0, candidates read 256 at a time."""
    base = make_rows("normal", 1, 3, 500, 64)
    case = type(base)("low_bits", np.where(S.visibility_mask(base.visible, 500), low_bit_rows(), -np.inf),
                      base.visible, 64)
    got, flag = filtered(case, order, 1, cap=1024)
    assert flag.tolist() == [0, 0, 0]
    check_topk(got, case, order, "filter, low bits")


def test_topk_filter_position_sort_for_large_k():
    """k > 256 in position order: the select sorts the chosen positions (int32) instead of
    counting ranks."""
    case = boundary_tie_rows(S_=1200, k=300)
    got, flag = filtered(case, "position", 1, cap=1024)
    assert flag.tolist() == [0, 0, 0]
    check_topk(got, case, "position", "filter position sort")


def test_filter_tuning_rejects_what_cannot_tile():
    with pytest.raises(TypeError, match="unknown fields"):
        with KT.filter_tuning(chunk=4):
            pass
    case = boundary_tie_rows()
    with KT.filter_tuning(run=48), pytest.raises(ValueError, match="block of run"):
        filtered(case, "position", 1)
    assert KT._FILTER_OVERRIDE == {}, "filter_tuning restores the defaults"


@pytest.mark.parametrize("order", ["position", "position-bitmap", "score"])
@pytest.mark.parametrize("rows", ["few_values", "equal", "relu_zero"])
def test_topk_select_ignores_candidate_order(rows, order):
    """The select kernel gets its candidates in whatever order the atomics gave them: fed every
    visible key in three shuffled orders, read 64 at a time, it returns impl's top-k (ties to the
    lowest positions)."""
    case = make_rows(rows, 4, 3, 200, 30)
    dev = K._device()
    cap = 256
    key = torch.from_numpy(case.scores).float()
    key = key.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(key == 0x80000000, 0, key)                             # −0 is +0
    key = torch.where(key >= 0x80000000, key ^ 0xFFFFFFFF, key | 0x80000000)  # order keys
    for seed in range(3):
        cand_key = torch.zeros((3, cap), dtype=torch.int32)
        cand_pos = torch.zeros((3, cap), dtype=torch.int32)
        for r in range(3):
            perm = torch.from_numpy(np.random.default_rng(seed).permutation(int(case.visible[r])))
            cand_key[r, :len(perm)] = key[r, perm].to(torch.int32)   # wraps to the same bits
            cand_pos[r, :len(perm)] = perm.to(torch.int32)
        count = torch.stack([torch.from_numpy(case.visible).int(), torch.zeros(3, dtype=torch.int32)], 1).to(dev)
        out = torch.empty((3, case.k), dtype=torch.int64, device=dev)
        nw = -(-200 // 32)   # bitmap words (2 * nw fit the scratch row of 32)
        scratch = torch.empty((3, 32), dtype=torch.int64 if order == "score" else torch.int32, device=dev)
        # every key >= thr: the lowest key's top 16 bits (few_values, equal: within the relative
        # histogram's span; relu_zero's +0 to the largest score: beyond it, the 8-bit digits)
        low16 = torch.where(cand_key != 0, cand_key.to(torch.int64) & 0xFFFFFFFF, 1 << 32)
        thr = (low16.amin(1) & 0xFFFF0000).to(torch.int32)      # wraps to the same bits
        KT._select_kernel[(3,)](cand_key.to(dev), cand_pos.to(dev), count, thr.to(dev), cand_pos.to(dev),
                               scratch, out, case.k, out.stride(0), 0, 0, 0, nw, CAP=cap, K_PAD=32,
                               SUB=64, BINS=KT._DIGIT, BY_SCORE=order == "score", REMAP=False,
                               MASK_BLOCK=0, POS_24=seed != 0,   # (both tie-digit paths)
                               BITMAP=order == "position-bitmap")
        assert count[:, 1].cpu().tolist() == [0, 0, 0]
        check_topk(out.cpu(), case, order.split("-")[0], f"select ({order}), shuffle {seed}")


@pytest.mark.parametrize("k, emit", [(200, "bitmap"), (30, "sort")])
def test_topk_position_order_by_bitmap_and_by_sort(k, emit):
    """Position order comes from a bitmap of the chosen positions and a scan of its words'
    popcounts where the row has at most 4 words a pick (20000 positions are 625 words, scanned 256
    at a time: the count carried across steps), else from a sort of the picks.  Chosen positions
    share words (a run of the largest keys), sit in the last word, tie at the k-th key across the
    row (the lowest k of ~400 ones win), and one row stops mid-word."""
    T, S_ = 4, 20000
    words_per_pick = -(-S_ // 32) / K._pow2(k)
    assert (words_per_pick <= KT._BITMAP_WORDS_PER_PICK) == (emit == "bitmap")
    rng = np.random.default_rng(21)
    case = make_rows("normal", 21, T, S_, k)
    x = rng.standard_normal((T, S_))
    x[1, 9000:9050] += 10.0
    x[1, S_ - 3:] = 20.0
    x[2] = rng.random(S_) < 0.02
    case.scores = S.round_bf16(x)
    case.visible[:] = [S_, S_, S_, 12345]
    got, flag = filtered(case, "position", None, cap=1024)   # room for the ~400 tied ones
    assert flag.tolist() == [0] * T, f"rows redone by the radix engine: {flag.tolist()}"
    check_topk(got, case, "position", f"{emit} emit")


def test_topk_threshold_filter_flags_what_it_cannot_hold():
    """All-equal rows put every visible key at the threshold: rows with more than the cap flag and
    stay unwritten, the others are served; the engine redoes the flagged ones by radix select."""
    case = make_rows("equal", 3, 4, 300, 20)
    case.visible[:] = [300, 10, 0, 64]
    case.scores = np.where(S.visibility_mask(case.visible, 300), case.scores[0, 0], -np.inf)
    got, flag = filtered(case, "position", 4, cap=64)
    assert flag.tolist() == [1, 0, 0, 0]
    assert got[0].tolist() == [-1] * 20
    check_topk(got[1:], type(case)("rows 1-3", case.scores[1:], case.visible[1:], 20), "position", "filter")
    dev = K._device()
    full = KT._topk_engine(torch.from_numpy(case.scores).float().to(dev), torch.from_numpy(case.visible).int().to(dev),
                          20, group=4, cap=64, blocks=(64, 128)).cpu()
    check_topk(full, case, "position", "engine with fallback")


# (rows, G, cap) where the filter serves some rows and flags others (heavy ties over a small cap)
MIXED_FLAGS = [("equal", 4, 64), ("few_values", 1, 32), ("normal", 4, 32), ("relu_zero", 4, 64),
               ("minus_inf", 1, 32)]


def mixed_case(rows, group, cap):
    case = make_rows(rows, 12, 4, 300, 20)
    flag = filtered(case, "position", group, cap)[1]
    assert 0 < int(flag.sum()) < 4, f"{rows} G={group} cap={cap}: flags {flag.tolist()}, expected a mix"
    return case


@pytest.mark.parametrize("remap", [False, True])
@pytest.mark.parametrize("order", ["position", "score"])
@pytest.mark.parametrize("rows,group,cap", MIXED_FLAGS)
def test_topk_sync_free_fallback_gives_the_read_back_bits(rows, group, cap, order, remap):
    """The radix fallback launched without a read-back (sync=False) serves exactly the rows the
    filter flagged and leaves the filter's rows as they are: the same bits as the read-back path,
    and impl's selection (through the remap table when given)."""
    case = mixed_case(rows, group, cap)
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    table = (torch.arange(300, dtype=torch.int32) * 3 + 7).repeat(4, 1).to(dev) if remap else None
    got = [KT._topk_engine(x, nv, case.k, by_score=order == "score", remap=table, group=group, cap=cap,
                          blocks=(64, 128), sync=sync).cpu() for sync in (True, False)]
    assert torch.equal(got[0], got[1]), f"sync-free fallback differs from the read-back path [{case!r}]"
    if remap:
        ref = impl.index_topk(torch.from_numpy(case.scores).float(), torch.from_numpy(case.visible), case.k, order)
        assert torch.equal(got[1], torch.where(ref >= 0, ref * 3 + 7, -1)), f"remapped selection [{case!r}]"
    else:
        check_topk(got[1], case, order, "engine, sync-free fallback")


@pytest.mark.parametrize("rows,group,cap", MIXED_FLAGS)
def test_topk_sync_free_block_mask(rows, group, cap):
    """The same in block-mask mode (candidate selection: −inf dropped, blocks of 8 marked)."""
    case = mixed_case(rows, group, cap)
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    masks = []
    for sync in (True, False):
        masks.append(torch.zeros((4, 300 * 8), dtype=torch.int8, device=dev))
        KT._topk_engine(x, nv, case.k, drop_neg_inf=True, mask_out=masks[-1], mask_block=8, group=group,
                       cap=cap, blocks=(64, 128), sync=sync)
    assert torch.equal(masks[0], masks[1]), f"sync-free block mask differs from the read-back path [{case!r}]"
    # the top-min(k, #finite) finite keys: impl's top-k without its −inf picks
    scores = torch.from_numpy(case.scores).float()
    ref = impl.index_topk(scores, torch.from_numpy(case.visible), case.k, "position")
    want = torch.zeros((4, 300 + 1), dtype=torch.int8)
    keep = (ref >= 0) & (scores.gather(1, ref.clamp(min=0)) > float("-inf"))
    want.scatter_(1, torch.where(keep, ref, 300), 1)
    assert torch.equal(masks[1].cpu().view(4, 300, 8), want[:, :300, None].expand(4, 300, 8)), \
        f"block mask [{case!r}]"


def fused_workspace(R, N, k, order="position", *, remap=False, mask=False, mask_block=0, group=None,
                    cap=None, blocks=None, drop_neg_inf=False):
    """The fused path's plan for these arguments and the one workspace it holds (after a call)."""
    plan = KT._fused_plan(R, N, k, order == "score", drop_neg_inf, remap, mask, mask_block, group, cap,
                          blocks, ())
    (ws,) = plan.workspaces.values()
    return plan, ws


def assert_counters_reset(ws, flag, what):
    """The fused count's flags are the filter's (the rows the radix engine redid in the launch), and
    the call left both arrival counters at zero for the next."""
    assert ws[2][:, 1].cpu().tolist() == flag.tolist(), f"{what}: fused flags {ws[2][:, 1].tolist()}, filter's {flag.tolist()}"
    assert not bool(ws[6].any()) and not bool(ws[7].any()), f"{what}: arrival counters left {ws[6].tolist()} {ws[7].tolist()}"


LAUNCHES = pytest.mark.parametrize("blocks", [None, (64, 128)], ids=["one_launch", "two_launches"])


@LAUNCHES
@pytest.mark.parametrize("order,remap", [("position", False), ("score", False), ("position", True)])
@pytest.mark.parametrize("rows,group,cap", MIXED_FLAGS)
def test_topk_fused_path_gives_the_launches_bits(rows, group, cap, order, remap, blocks):
    """The fused path (rows of 300: one program a row, one launch; or chunks of 128, two launches
    whose last program a row takes the serial stage) gives the launches path's bits, the rows the
    filter flags redone by the radix engine inside the launch, twice in a row on its cached
    workspace."""
    case = mixed_case(rows, group, cap)
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    table = (torch.arange(300, dtype=torch.int32) * 3 + 7).repeat(4, 1).to(dev) if remap else None
    kw = dict(by_score=order == "score", remap=table, group=group, cap=cap, blocks=blocks)
    KT.clear_workspaces()
    with KT.topk_path("launches"):
        want = KT._topk_engine(x, nv, case.k, **kw).cpu()
    for call in range(2):
        got = KT._topk_engine(x, nv, case.k, **kw).cpu()
        assert torch.equal(got, want), f"fused path, call {call + 1}, differs from the launches path [{case!r}]"
    plan, ws = fused_workspace(4, 300, case.k, order, remap=remap, group=group, cap=cap, blocks=blocks)
    assert len(plan.grid) == (1 if blocks is None else 2), plan.grid
    assert_counters_reset(ws, filtered(case, order, group, cap)[1], repr(case))


@LAUNCHES
@pytest.mark.parametrize("rows,group,cap", MIXED_FLAGS)
def test_topk_fused_path_block_mask(rows, group, cap, blocks):
    """The same in block-mask mode (−inf dropped, blocks of 8 marked)."""
    case = mixed_case(rows, group, cap)
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    masks = []
    KT.clear_workspaces()
    for path in ("launches", "fused", "fused"):
        masks.append(torch.zeros((4, 300 * 8), dtype=torch.int8, device=dev))
        with KT.topk_path(path):
            KT._topk_engine(x, nv, case.k, drop_neg_inf=True, mask_out=masks[-1], mask_block=8, group=group,
                            cap=cap, blocks=blocks)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2]), \
        f"fused block mask differs from the launches path [{case!r}]"
    _, ws = fused_workspace(4, 300, case.k, mask=True, mask_block=8, group=group, cap=cap, blocks=blocks,
                            drop_neg_inf=True)
    assert not bool(ws[6].any()) and not bool(ws[7].any()), "arrival counters"


# ------------------------------------------------------------------------------------------------
# The few-row passes (kernels.topk._topk_few_rows): forced on, they give the engine's bits (the
# filter and its radix fallback, forced off) on every edge row, in every order and mode
# ------------------------------------------------------------------------------------------------
def few_case(kind):
    if kind == "low_bits":
        base = make_rows("normal", 1, 4, 500, 64)
        case = type(base)("low_bits", low_bit_rows(4), base.visible, 64)
        case.scores = np.where(S.visibility_mask(case.visible, 500), case.scores, -np.inf)
        return case
    if kind == "boundary_ties":
        return boundary_tie_rows(S_=600, k=64)
    case = make_rows("normal" if kind == "signed_zeros" else kind, 9, 4, 500, 64)
    if kind == "signed_zeros":   # ±0 are one key: the lowest positions win, whatever the sign
        sign = np.random.default_rng(9).random((4, 500)) < 0.5
        case.scores = np.where(np.isfinite(case.scores), np.where(sign, -0.0, 0.0), case.scores)
        case.scores[0, ::7] = 1.0
    return case


def few_and_engine(case, k, *, digits=(8, 8, 8, 8), blocks=(64, 128), **kw):
    """(the few-row passes' output, twice on one workspace; the engine's with them off; the plan)."""
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    mask = kw.pop("mask_block", 0)

    def run():
        if not mask:
            return KT._topk_engine(x, nv, k, blocks=blocks, **kw).cpu()
        out = torch.zeros((x.shape[0], x.shape[1] * mask), dtype=torch.int8, device=dev)
        KT._topk_engine(x, nv, k, mask_out=out, mask_block=mask, blocks=blocks, **kw)
        return out.cpu()

    with KT.few_rows("off"):
        want = run()
    KT.clear_workspaces()
    with KT.few_rows("on", digits):
        got = [run(), run()]
    plan = KT._few_plan(*x.shape, k, kw.get("by_score", False), kw.get("drop_neg_inf", False),
                        kw.get("remap") is not None, bool(mask), mask, blocks, digits)
    return got, want, plan


def assert_few_rows(case, k, what, **kw):
    got, want, plan = few_and_engine(case, k, **kw)
    for call, g in enumerate(got):
        assert torch.equal(g, want), f"{what}, call {call + 1}: few-row passes differ from the engine [{case!r}]"
    (ws,) = plan.workspaces.values()
    assert not bool(ws[0].any()), f"{what}: row histograms / arrival counters left {ws[0].nonzero().tolist()[:4]}"
    return got[0]


def few_rows_of(picks, S_=500):
    """One case of the rows picked from each kind's few_case ((kind, rows) pairs), its first S_ keys
    (visible at most S_): a launch serves every kind's edge rows (the interpreter's cost is a row's)."""
    cases = [(few_case(kind), rows) for kind, rows in picks]
    scores = np.concatenate([case.scores[list(rows), :S_] for case, rows in cases])
    visible = np.minimum(np.concatenate([case.visible[list(rows)] for case, rows in cases]), S_)
    label = "+".join(f"{kind}{list(rows)}" for kind, rows in picks)
    return type(cases[0][0])(label, scores, visible, cases[0][0].k)


# every kind's edge rows: full, visible 0 (low_bits 2), fewer valid than k (relu_zero 2, minus_inf 0 and 2),
# −inf inside (minus_inf), garbage past visible (unmasked 1), keys equal in 24 bits (low_bits 3), ties
# across chunks (equal, few_values, relu_zero 1, boundary_ties 0 and 1: a 1 tied over the row), ±0
FEW_EDGE_ROWS = (("normal", (0,)), ("relu_zero", (1, 2)), ("equal", (0,)), ("few_values", (3,)),
                 ("minus_inf", (0, 2)), ("unmasked", (1,)), ("wide_range", (3,)), ("low_bits", (2, 3)),
                 ("boundary_ties", (0, 1)), ("signed_zeros", (0, 1)))


@pytest.mark.parametrize("order", ["position", "score"])
def test_topk_few_rows_give_the_engine_bits(order):
    """Chunks of 128 (4 programs a row): every digit pass spread over them, rows done early (a
    boundary bin taken whole, visible 0, fewer valid than k) and late (keys equal in 24 bits, ties
    across chunks to the lowest positions), the same bits as the engine and impl's selection."""
    case = few_rows_of(FEW_EDGE_ROWS)
    got = assert_few_rows(case, case.k, order, by_score=order == "score")
    check_topk(got, case, order, "few-row passes")


@pytest.mark.parametrize("digits,blocks", [((11, 11, 10), (64, 128)), ((8, 8, 8, 8), (64, 512))],
                         ids=["11-11-10", "one_chunk"])
def test_topk_few_rows_other_digits_and_chunks(digits, blocks):
    """Other digit widths (three passes of 11, 11, 10 bits) and one chunk a row: the same
    bits, in both orders, with k past the valid count of some rows and k = 1."""
    case = few_rows_of((("few_values", (3,)), ("low_bits", (3,)), ("boundary_ties", (0,)), ("minus_inf", (2,))))
    for k, order in ((case.k, "position"), (200, "score"), (1, "position")):
        assert_few_rows(case, k, f"{digits} k={k} {order}", by_score=order == "score",
                        digits=digits, blocks=blocks)


def test_topk_few_rows_remap_drop_and_block_mask():
    """Through a remap table (both orders), with −inf dropped, and as a block mask (blocks of 8)."""
    case = few_rows_of((("normal", (0,)), ("few_values", (3,)), ("minus_inf", (2,)), ("boundary_ties", (0,))))
    dev = K._device()
    T, S_ = case.scores.shape
    table = (torch.arange(S_, dtype=torch.int32) * 3 + 7).repeat(T, 1).to(dev)
    for order in ("position", "score"):
        assert_few_rows(case, case.k, f"remap {order}", by_score=order == "score", remap=table)
    assert_few_rows(case, case.k, "drop −inf", drop_neg_inf=True)
    assert_few_rows(case, case.k, "block mask", drop_neg_inf=True, mask_block=8)


def test_topk_few_rows_switch(monkeypatch):
    """DSV4SPEC_FEW_ROWS / few_rows: "auto" serves one long row with a large k inside a CUDA graph
    capture (the shapes the H200 A/B measured faster), "always" eagerly too, "on" every shape, "off" none."""
    with pytest.raises(ValueError, match="expected one of"):
        with KT.few_rows("fast"):
            pass
    with pytest.raises(ValueError, match="summing to 32"):
        with KT.few_rows("on", (8, 8, 8)):
            pass
    assert KT._FEW_ROWS[0] == "auto" and KT._FEW_DIGITS[0] == (8, 8, 8, 8)
    big, k = KT._FEW_ROWS_MIN_N, KT._FEW_ROWS_MIN_K

    def serves(R, N, k=k):
        return KT._few_rows_serve(torch.empty((R, N), dtype=torch.uint8), k)

    with KT.few_rows("always"):
        assert serves(1, big) and serves(KT._FEW_ROWS_MAX, big)
        assert not serves(KT._FEW_ROWS_MAX + 1, big) and not serves(1, big - 1) and not serves(1, big, k - 1)
    assert not serves(1, big), "eagerly the fused path serves"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not serves(1, big), "a CPU tensor is never captured"
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert serves(1, big) and not serves(KT._FEW_ROWS_MAX + 1, big), "inside a capture"
    assert not serves(1, 1 << 20, 512), "k 512 on a 1M row: the shipped path measured faster"
    with KT.few_rows("off"):
        assert not serves(1, big)
    monkeypatch.undo()
    with KT.few_rows("on"):
        assert serves(1000, 10, 1)


def test_topk_path_names_are_checked():
    with pytest.raises(ValueError, match="expected one of"):
        with KT.topk_path("fast"):
            pass
    assert KT._TOPK_PATH[0] == "auto"


def test_auto_takes_the_fused_path_eagerly_up_to_its_measured_size():
    """"auto": the fused path on calls of up to 2^24 scores, the launches path on more (the H200
    A/B of 12-03); "fused" and "launches" take theirs at every size."""
    small, large = (torch.empty(shape, device="meta") for shape in ((64, 1 << 18), (1024, 1 << 16)))
    assert KT._fused_serves(small) and not KT._fused_serves(large)
    with KT.topk_path("fused"):
        assert KT._fused_serves(large)
    with KT.topk_path("launches"):
        assert not KT._fused_serves(small)


@pytest.mark.parametrize("rows", ["few_values", "equal", "low_bits", "minus_inf"])
def test_topk_one_program_radix_serves_only_flagged_rows(rows):
    """_topk_radix_rows (one program a row, tiles of 64) with a flag column of stride 2, as the
    filter's count[:, 1], and a cap of k: flagged rows equal impl through all three passes (the -1
    tail written too), the others keep their bytes; in block-mask mode too."""
    if rows == "low_bits":
        base = make_rows("normal", 1, 4, 500, 64)
        case = type(base)("low_bits", low_bit_rows(4), base.visible, 64)
        case.scores = np.where(S.visibility_mask(case.visible, 500), case.scores, -np.inf)
    else:
        case = make_rows(rows, 5, 4, 500, 64)
    dev = K._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    nv = torch.from_numpy(case.visible).int().to(dev)
    count = torch.tensor([[0, 1], [0, 0], [0, 1], [0, 0]], dtype=torch.int32, device=dev)
    served = type(case)("rows 0, 2", case.scores[[0, 2]], case.visible[[0, 2]], case.k)
    for order in ("position", "score"):
        out = torch.full((4, case.k), 12345, dtype=torch.int64, device=dev)
        KT._topk_radix_rows(x, nv, case.k, count[:, 1], out, by_score=order == "score", cap=64, block=64)
        out = out.cpu()
        assert bool((out[[1, 3]] == 12345).all()), "rows not flagged were written"
        check_topk(out[[0, 2]], served, order, "one-program radix, flagged rows")
    mask = torch.zeros((4, 500 * 8), dtype=torch.int8, device=dev)
    KT._topk_radix_rows(x, nv, case.k, count[:, 1], mask, drop_neg_inf=True, mask=True, mask_block=8,
                       cap=64, block=64)
    want = torch.zeros((4, 500 * 8), dtype=torch.int8, device=dev)
    KT._topk_radix(x, nv, case.k, drop_neg_inf=True, mask_out=want, mask_block=8, cap=64, blocks=(64, 128))
    assert torch.equal(mask[[0, 2]], want[[0, 2]]) and not bool(mask[[1, 3]].any()), "block mask"


def test_topk_sort_path_for_large_k():
    """k > 256 orders by tl.sort instead of counting ranks."""
    case = make_rows("few_values", 3, 2, 700, 300)
    check_topk(K.index_topk(torch.from_numpy(case.scores).float(), torch.from_numpy(case.visible),
                            case.k, "score"), case, "score", "index_topk sort path")


def test_topk_edges():
    x = torch.tensor([[-0.0, 0.0, -0.0, 1.0, -np.inf, 0.0]])
    # −0 and +0 are equal scores: lowest positions first
    assert K.index_topk(x, torch.tensor([6]), 3, "score").tolist() == [[3, 0, 1]]
    assert K.index_topk(x, torch.tensor([6]), 6, "position").tolist() == [[0, 1, 2, 3, 4, 5]]
    assert K.index_topk(x, torch.tensor([0]), 2, "score").tolist() == [[-1, -1]]
    assert K.index_topk(x, torch.tensor([2]), 0, "score").shape == (1, 0)
    inf = torch.tensor([[np.inf, 1.0, np.inf, -np.inf]])
    assert K.index_topk(inf, torch.tensor([4]), 2, "position").tolist() == [[0, 2]]


def test_bad_input_is_rejected():
    case = make_score_case("normal", 0, 2, 4, 16, 8)
    q, k, w, vis = case.torch()
    with pytest.raises(ValueError, match="score_dtype"):
        K.index_scores(q, k, w, vis, "fp16")
    with pytest.raises(ValueError, match="BF16"):
        K.index_scores(q + 1e-3, k, w, vis)
    with pytest.raises(ValueError, match="NaN"):
        K.index_scores(q, k * float("nan"), w, vis)
    with pytest.raises(ValueError, match="head dim"):
        K.index_scores(q, k[:, :8], w, vis)
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        K.index_scores(q, k, w[:, :2], vis)
    with pytest.raises(ValueError, match=r"\[0, 8\]"):
        K.index_scores(q, k, w, vis + 9)
    with pytest.raises(TypeError, match="integer"):
        K.index_scores(q, k, w, vis.float())
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        K.index_scores(q.int(), k, w, vis)
    scores = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="NaN"):
        K.index_topk(scores.masked_fill(scores == 0, float("nan")), vis, 2, "score")
    with pytest.raises(ValueError, match=r"k must be an int in \[0, 8\]"):
        K.index_topk(scores, vis, -1, "score")
    with pytest.raises(ValueError, match=r"\[0, 8\]"):
        K.index_topk(scores, vis, 9, "score")
    with pytest.raises(ValueError, match="order"):
        K.index_topk(scores, vis, 2, "ascending")
    with pytest.raises(ValueError, match="one per query"):
        K.index_topk(scores, vis[:1], 2, "score")
    qp, qs, kp, ks, w4, vis4 = fp4_inputs(0, 2, 4, 32, 8, True)
    with pytest.raises(ValueError, match="multiple of the scale block"):
        K.index_scores_fp4(qp[..., :8], qs, kp[:, :8], ks, w4, vis4)
    with pytest.raises(TypeError, match="uint8"):
        K.index_scores_fp4(qp.int(), qs, kp, ks, w4, vis4)
    with pytest.raises(ValueError, match="k_scales"):
        K.index_scores_fp4(qp, qs, kp, ks[:, :0], w4, vis4)


def test_repeated_calls_are_bitwise_identical():
    case = make_score_case("ties", 1, 4, 8, 16, 100)
    first = K.index_scores(*case.torch())
    rows = make_rows("few_values", 1, 4, 400, 50)
    sc, vis = torch.from_numpy(rows.scores).float(), torch.from_numpy(rows.visible)
    top = [K.index_topk(sc, vis, rows.k, "score") for _ in range(2)]
    fp4 = fp4_inputs(2, 2, 4, 32, 40, True)
    for _ in range(2):
        assert torch.equal(K.index_scores(*case.torch()).view(torch.int32), first.view(torch.int32))
        assert torch.equal(K.index_scores_fp4(*fp4).view(torch.int32), K.index_scores_fp4(*fp4).view(torch.int32))
    assert torch.equal(top[0], top[1])


# ------------------------------------------------------------------------------------------------
# Hadamard, index_rotate, index_weights, index_visible: bit for bit equal to impl (the kernels run
# impl's fp32 operations in impl's order, and the BF16 rounding by bits is torch's RNE cast)
# ------------------------------------------------------------------------------------------------
def assert_same_bits(got, ref, what):
    """Equal float32 bit patterns (signed zeros included), NaN exactly where impl has NaN."""
    assert got.dtype == ref.dtype == torch.float32, f"{what}: dtype {got.dtype}, impl {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, impl {tuple(ref.shape)}"
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaN positions differ"
    bad = (got.view(torch.int32) != ref.view(torch.int32)) & ~nan
    if bad.any():
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} of {ref.numel()} differ; at {i}: got "
                             f"{got[i].item()!r} ({got[i].view(torch.int32).item():#010x}), impl "
                             f"{ref[i].item()!r} ({ref[i].view(torch.int32).item():#010x})")


def bf16_patterns(seed=None, width=128) -> torch.Tensor:
    """Every non-NaN BF16 value (±0, subnormals, normals, ±max, ±inf) once, as float32 rows of
    `width`, zero-padded; sorted by pattern (rows of like magnitude) or shuffled by `seed`."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    keep = ~(((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0))
    values = (bits[keep] << 16).view(np.float32)
    if seed is not None:
        values = np.random.default_rng(seed).permutation(values)
    values = np.concatenate([values, np.zeros(-len(values) % width, np.float32)])
    return torch.from_numpy(values.reshape(-1, width))


def hadamard_tie_rows() -> torch.Tensor:
    """Rows whose first output, fl32(fl32(n) · fl32(128^-0.5)), lies exactly halfway between two
    BF16 numbers (low 16 bits 0x8000): n = a + b + c, three BF16 pieces of a 20-bit integer, at
    x[0], x[1], x[2] (the butterfly sums them exactly).  Ties to the even neighbour: both parities."""
    scale = np.float32(S.HADAMARD_SCALE)
    n = np.arange(1 << 19, 1 << 20, dtype=np.int64)
    z = (n.astype(np.float32) * scale).view(np.uint32)
    tie = n[(z & 0xFFFF) == 0x8000]
    parity = ((tie.astype(np.float32) * scale).view(np.uint32) >> 16) & 1
    assert {0, 1} <= set(parity.tolist()), "search found ties of one parity only"
    rows = np.zeros((len(tie), 128), np.float32)
    rows[:, 0], rows[:, 1], rows[:, 2] = tie & ~0xFFF, tie & 0xFF0, tie & 0xF
    rows = np.concatenate([rows, -rows])
    assert np.array_equal(S.round_bf16(rows), rows)
    return torch.from_numpy(rows)


def hadamard_edge_rows() -> dict:
    big = float.fromhex("0x1.fep127")                     # the largest BF16 number
    tiny = 2.0 ** -133                                    # the smallest BF16 subnormal
    e = torch.eye(128)
    alt = torch.tensor([1.0, -1.0]).repeat(64)
    return {
        "zeros": torch.zeros(2, 128),
        "minus_zeros": torch.full((2, 128), -0.0),
        "basis_vectors": e,
        "minus_basis_x2^-40": -e * 2.0 ** -40,
        "subnormal_basis": e[:8] * tiny,
        "subnormal_mix": (torch.arange(128).reshape(1, 128) % 7 - 3.0) * tiny,
        "max_overflows_fp32": torch.full((2, 128), big),
        "max_alternating": alt[None, :] * big,
        "inf": torch.zeros(3, 128).index_fill_(1, torch.tensor([5]), float("inf")),
        "inf_minus_inf": torch.stack([alt * float("inf"), -alt * float("inf")]),
        "ties_to_even": hadamard_tie_rows(),
    }


@pytest.mark.parametrize("rows", list(hadamard_edge_rows()) + ["patterns_sorted", "patterns_shuffled"])
def test_hadamard_matches_impl_bit_for_bit(rows):
    x = {"patterns_sorted": lambda: bf16_patterns(), "patterns_shuffled": lambda: bf16_patterns(3)}.get(
        rows, lambda: hadamard_edge_rows()[rows])()
    assert_same_bits(K.hadamard(x), impl.hadamard(x), f"hadamard [{rows}]")


def test_bf16_rounding_keeps_every_nan():
    """The GPU's NaN (of inf - inf in the butterfly) is 0x7FFFFFFF; its RNE carry must not run into
    the sign bit (it gave -0 on the H200, where impl has NaN).  Fed as data, so the interpreter
    sees the same patterns as the GPU: NaN with every sign, payload and quiet bit, and the edges."""
    nan_bits = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F80FFFF, 0x7FBFFFFF, 0x7FFF8000]
    edge_bits = [0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000, 0x3F808000, 0x00008000, 0x80000000]
    x = torch.tensor(nan_bits + edge_bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    dev = K._device()
    out = torch.empty(x.shape, dtype=torch.float32, device=dev)
    K._weights_kernel[(1,)](x.to(dev), out, x.numel(), K._fl32_bits(1.0), BLOCK=16)
    out = out.cpu()
    n = len(nan_bits)
    assert bool(torch.isnan(out[:n]).all()), f"NaN rounded to {out[:n].tolist()}"
    ref = x[n:].to(torch.bfloat16).float()   # torch's RNE: overflow to inf, ties to even
    assert torch.equal(out[n:].view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("shape", [(128,), (3, 5, 128), (1, 128), (0, 128), (2, 0, 128)], ids=str)
def test_hadamard_shapes_dtypes_and_strides(shape):
    x = torch.from_numpy(S.round_bf16(np.random.default_rng(1).standard_normal(shape))).float()
    ref = impl.hadamard(x)
    assert_same_bits(K.hadamard(x), ref, f"hadamard {shape}")
    assert_same_bits(K.hadamard(x.to(torch.bfloat16)), ref, f"hadamard bf16 {shape}")
    assert_same_bits(K.hadamard(x.double()), ref, f"hadamard f64 {shape}")
    strided = torch.stack([x, x], dim=-2)[..., 1, :]        # last dim 128 contiguous, rows strided
    transposed = x.reshape(-1, 128).t().contiguous().t()    # last dim strided
    assert_same_bits(K.hadamard(strided), ref, f"hadamard strided {shape}")
    assert_same_bits(K.hadamard(transposed), ref.reshape(-1, 128), f"hadamard transposed {shape}")


def test_hadamard_against_the_exact_definition():
    """HAD.ROUNDING directly: BF16 output within one BF16 ulp + the fp32 order bound of the
    exact H·x/√128 (spec), on wide-exponent rows; and exact on the basis vectors (HAD.MATRIX)."""
    rng = np.random.default_rng(5)
    x = S.round_bf16(rng.standard_normal((64, 128)) * 2.0 ** rng.integers(-30, 31, (64, 128)))
    got = K.hadamard(torch.from_numpy(x).float()).double().numpy()
    assert S.is_bf16(got).all()
    exact = (x @ S.sylvester_hadamard().T) * S.HADAMARD_SCALE
    assert np.all(np.abs(got - exact) <= S.hadamard_tolerance(x))
    for k in (-20, 0, 20):
        basis = np.eye(128) * 2.0 ** k
        np.testing.assert_array_equal(K.hadamard(torch.from_numpy(basis).float()).double().numpy(),
                                      S.hadamard(basis))


@pytest.mark.parametrize("model", sorted(PROFILES))
def test_index_rotate_matches_impl(model):
    x = hadamard_edge_rows()["subnormal_mix"]
    rows = torch.cat([bf16_patterns(7)[:40], x, torch.full((1, 128), -0.0)])
    got, ref = K.index_rotate(rows, model), impl.index_rotate(rows, model)
    assert_same_bits(got, ref, f"index_rotate {model}")
    if PROFILES[model].hadamard:
        assert_same_bits(got, K.hadamard(rows), f"index_rotate {model} is hadamard")
    else:  # V4.1: a copy, any shape, bfloat16 taken as it is
        assert_same_bits(got, rows, "index_rotate v4.1 is the identity")
        odd = rows.reshape(-1)[:21].reshape(3, 7)
        assert_same_bits(K.index_rotate(odd.to(torch.bfloat16), model), impl.index_rotate(odd, model),
                         "index_rotate v4.1 [3, 7] bf16")
        assert K.index_rotate(torch.zeros(0, 4), model).shape == (0, 4)


@pytest.mark.parametrize("model", V4_ALL)
def test_index_weights_match_impl_and_spec(model):
    H = PROFILES[model].index_n_heads
    raw = torch.cat([bf16_patterns(width=H), bf16_patterns(11, width=H)])   # every BF16 value
    got = K.index_weights(raw, model)
    assert_same_bits(got, impl.index_weights(raw, model), f"index_weights {model}")
    # the definition bf16(fl32(raw · fl32(c))), written exactly in spec
    np.testing.assert_array_equal(got.double().numpy(), S.index_weights(raw.double().numpy(), PROFILES[model]))
    assert_same_bits(K.index_weights(raw[:5].to(torch.bfloat16), model), got[:5], "bf16 input")
    assert K.index_weights(raw[:0], model).shape == (0, H)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 7, 128, 2 ** 40])
def test_index_visible_matches_impl(ratio):
    p = torch.cat([torch.arange(0, 600), torch.tensor([2 ** 31 - 2, 2 ** 31 - 1, 2 ** 31, 2 ** 40 + 5,
                                                       2 ** 62, 2 ** 63 - 2])])
    assert torch.equal(K.index_visible(p, ratio), impl.index_visible(p, ratio))
    assert K.index_visible(p, ratio).dtype == torch.int64
    small = torch.arange(0, 120)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(K.index_visible(small.to(dtype), ratio), impl.index_visible(small, ratio))
    grid = small.reshape(4, 30)                                  # any shape, kept
    assert torch.equal(K.index_visible(grid, ratio), impl.index_visible(grid, ratio))
    assert K.index_visible(torch.zeros(0, dtype=torch.int64), ratio).shape == (0,)


def test_index_visible_at_the_int64_maximum():
    """p = 2^63 − 1: the kernel never forms p + 1, so (p + 1) // ratio is exact for ratio ≥ 2
    (2^62 for ratio 2, by hand); impl's p + 1 wraps to −2^63 there."""
    p = torch.tensor([2 ** 63 - 1])
    for ratio in (2, 3, 4, 128):
        assert K.index_visible(p, ratio).item() == 2 ** 63 // ratio


def _bad_inputs():
    x = torch.from_numpy(S.round_bf16(np.random.default_rng(0).standard_normal((2, 128)))).float()
    w = x[:, :64].clone()
    p = torch.arange(6)
    nan, off = x.clone(), x.clone()
    nan[1, 3], off[0, 0] = float("nan"), 1 + 2.0 ** -12
    return [
        ("hadamard", (x.numpy(),)), ("hadamard", (x[:, :64],)), ("hadamard", (x.int(),)),
        ("hadamard", (nan,)), ("hadamard", (off,)), ("hadamard", (torch.zeros(3, 129),)),
        ("index_rotate", (x, "v5")), ("index_rotate", (nan, "v4.1-flash")),
        ("index_rotate", (off, "v4.1-flash")), ("index_rotate", (x.long(), "v4.1-flash")),
        ("index_rotate", (x[:, :100], "v4-pro")), ("index_rotate", (off, "v3.2")),
        ("index_weights", (w, "v3.2")), ("index_weights", (w, "nope")),
        ("index_weights", (w[:, :32], "v4-flash")), ("index_weights", (w, "v4.1-flash")),
        ("index_weights", (w.reshape(-1), "v4-flash")), ("index_weights", (w.int(), "v4-flash")),
        ("index_weights", (nan[:, :64], "v4-flash")), ("index_weights", (off[:, :64], "v4-pro")),
        ("index_weights", (w.tolist(), "v4-flash")),
        ("index_visible", (p.float(), 4)), ("index_visible", (p.bool(), 4)),
        ("index_visible", (p, 0)), ("index_visible", (p, -4)), ("index_visible", (p, 1.5)),
        ("index_visible", (p, "4")), ("index_visible", (p - 3, 4)), ("index_visible", ([1, 2], 4)),
    ]


@pytest.mark.parametrize("op, args", _bad_inputs(), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_raises_impls_error(op, args):
    with pytest.raises((TypeError, ValueError)) as ref:
        getattr(impl, op)(*args)
    with pytest.raises(ref.type) as got:
        getattr(K, op)(*args)
    assert str(got.value) == str(ref.value)


def test_hadamard_of_a_scalar_is_rejected():
    with pytest.raises(ValueError, match="last dimension must be 128"):
        K.hadamard(torch.tensor(1.0))


# ------------------------------------------------------------------------------------------------
# Every kernel of kernels.indexer and kernels.pool compiles for sm_90 (Hopper) without a GPU, in
# the GPU configuration the launchers pick (fresh processes where the kernels are @triton.jit
# functions; Triton's CUDA toolchain ships with the wheel).  Two groups, so that xdist runs them
# side by side.  The top-k engine is compiled with a 1024-candidate cap: the same code as the
# 8192 cap of k = 2048, which compiles too (about 40 s per variant, measured) but is not repeated
# here.  The threshold filter's streaming pass is also checked free of barriers (its speed rests on
# it: docs/records/h200/SESSIONS.md, "Threshold filter reworked").
# ------------------------------------------------------------------------------------------------
COMPILE_SM90 = textwrap.dedent("""
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from dsv4spec.kernels import indexer as K
    from dsv4spec.kernels import topk as KT
    from dsv4spec.kernels import pool as P
    assert not K.INTERPRET
    built = set()
    def build(kernel, signature, num_warps=8, divisible=(), **constexprs):
        signature = dict(signature, **{name: "constexpr" for name in constexprs})
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
        src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
        assert len(compiled.asm["cubin"]) > 0
        built.add(kernel.fn.__name__)
        print("compiled", kernel.fn.__name__, constexprs, flush=True)
        return compiled
    def ints(*names):
        return {n: "i32" for n in names}
    if sys.argv[1] == "topk":
        BLOCK, _ = KT._topk_config(8, 65536)
        hist = {"x_ptr": "*fp32", "len_ptr": "*i32", "state_ptr": "*i64", "hist_row_ptr": "*i32",
                "hist_chunk_ptr": "*i32", **ints("R", "N", "x_stride", "NC", "CH")}
        bound = {"hist_row_ptr": "*i32", "hist_chunk_ptr": "*i32", "state_ptr": "*i64",
                 "gt_ptr": "*i32", "eq_ptr": "*i32", **ints("R", "N", "NC", "k", "CAP")}
        for p, (shift, width) in enumerate(KT._PASSES):
            build(KT._hist_kernel, hist, PASS=p, SHIFT=shift, WIDTH=width, BINS=KT._BINS, BLOCK=BLOCK,
                  DROP_NEG_INF=p == 1)
            build(KT._boundary_kernel, bound, PASS=p, SHIFT=shift, WIDTH=width,
                  LAST=p == len(KT._PASSES) - 1, BINS=KT._BINS)
        build(KT._compact_kernel, {"x_ptr": "*fp32", "len_ptr": "*i32", "state_ptr": "*i64",
                                  "gt_ptr": "*i32", "eq_ptr": "*i32", "cand_key_ptr": "*i32",
                                  "cand_pos_ptr": "*i32",
                                  **ints("R", "N", "x_stride", "NC", "CH", "CAP", "FINAL")},
              NC_PAD=16, BLOCK=BLOCK, DROP_NEG_INF=True)
        outs = {"remap_ptr": "*i32", "scratch_ptr": "*i64", "out_ptr": "*i64",
                **ints("k", "out_stride", "remap_stride", "W", "block")}
        final = {"cand_key_ptr": "*i32", "cand_pos_ptr": "*i32", "state_ptr": "*i64", **outs,
                 **ints("R", "FINAL")}
        # one program a row (the sync-free fallback) on the decode step's rows: 512 of a 16384 pool,
        # 2048 blocks of 32768 (block mask)
        rows = {"x_ptr": "*fp32", "len_ptr": "*i32", "flag_ptr": "*i32", "cand_key_ptr": "*i32",
                "cand_pos_ptr": "*i32", **outs, **ints("N", "x_stride", "flag_stride")}
        # rank by counting (K_PAD <= 256), tl.sort (larger), position order with remap, block mask
        for k_pad, by_score, remap in ((128, True, False), (512, True, False), (512, False, True)):
            build(KT._final_kernel, final, CAP=1024, K_PAD=k_pad, BINS=KT._BINS, BY_SCORE=by_score,
                  REMAP=remap, MASK_BLOCK=0)
            build(KT._radix_rows_kernel, rows, CAP=KT._radix_cap(k_pad, None), K_PAD=k_pad, BINS=KT._BINS,
                  BLOCK=BLOCK, DROP_NEG_INF=False, BY_SCORE=by_score, REMAP=remap, MASK_BLOCK=0)
        build(KT._final_kernel, dict(final, scratch_ptr="*i32", out_ptr="*i8"), CAP=1024, K_PAD=512,
              BINS=KT._BINS, BY_SCORE=False, REMAP=False, MASK_BLOCK=8)
        build(KT._radix_rows_kernel, dict(rows, out_ptr="*i8"), CAP=KT._radix_cap(2048, None), K_PAD=2048,
              BINS=KT._BINS, BLOCK=BLOCK, DROP_NEG_INF=True, BY_SCORE=False, REMAP=False, MASK_BLOCK=8)
    elif sys.argv[1] == "filter":   # the threshold filter at top-k 2048 of 1M (G = 128, cap 4096)
        tune = KT._filter_config(64, 1 << 20, 2048)
        G, CAP = KT._filter_plan(1 << 20, 2048, tune.block, None, None)
        rows = {"x_ptr": "*fp32", "len_ptr": "*i32"}
        build(KT._group_max_kernel, dict(rows, gmax_ptr="*i32", **ints("N", "x_stride", "M", "CH")),
              G=G, BLOCK=tune.block, PREFETCH=tune.prefetch, DROP_NEG_INF=False)
        short = KT._filter_config(1024, 1 << 16, 2048)   # many short rows: small steps
        for t in (tune, short):
            build(KT._threshold_kernel, {"gmax_ptr": "*i32", "len_ptr": "*i32", "thr_ptr": "*i32",
                                        "count_ptr": "*i32", **ints("N", "M", "k", "G")},
                  num_warps=t.threshold_warps, SUB=t.sub, BINS=KT._DIGIT)
        for run, prefetch in ((tune.run, tune.prefetch), (32, False)):  # per candidate, per warp run
            c = build(KT._filter_kernel, dict(rows, thr_ptr="*i32", cand_key_ptr="*i32", cand_pos_ptr="*i32",
                                             count_ptr="*i32", **ints("N", "x_stride", "CH", "CAP")),
                      BLOCK=tune.block, RUN=run, PREFETCH=prefetch, DROP_NEG_INF=True,
                      divisible=("x_ptr", "cand_key_ptr", "cand_pos_ptr", "N", "x_stride", "CH", "CAP"))
            # as launched on 16-aligned rows, the tile keeps one layout: no conversion through
            # shared memory, no barrier (vector loads would bring both back)
            assert "bar.sync" not in c.asm["ptx"] and "convert_layout" not in c.asm["ttgir"], run
        select = {"cand_key_ptr": "*i32", "cand_pos_ptr": "*i32", "count_ptr": "*i32", "thr_ptr": "*i32",
                  "remap_ptr": "*i32",
                  **ints("k", "out_stride", "remap_stride", "W", "block", "NW")}
        # 1M: sorted position order, score order; 64K rows: position order by bitmap, block mask
        for t, by_score, scratch, out, mask, bitmap in (
                (tune, False, "*i32", "*i64", 0, False), (tune, True, "*i64", "*i64", 0, False),
                (short, False, "*i32", "*i64", 0, True), (short, False, "*i32", "*i8", 8, False)):
            build(KT._select_kernel, dict(select, scratch_ptr=scratch, out_ptr=out), num_warps=t.select_warps,
                  CAP=CAP, K_PAD=2048, SUB=t.sub, BINS=KT._DIGIT, BY_SCORE=by_score, REMAP=False,
                  MASK_BLOCK=mask, POS_24=not by_score, BITMAP=bitmap)
    elif sys.argv[1] == "fused":   # the fused path at the plans of the headline shapes
        import torch
        ptrs = lambda *names: {n: "*i32" for n in names}   # noqa: E731
        rows = {"x_ptr": "*fp32", "len_ptr": "*i32"}
        outs = dict(ptrs("remap_ptr"), **ints("x_stride", "out_stride", "remap_stride", "W"))
        def scratch(plan):
            return "*i64" if plan.scratch[1] == torch.int64 else "*i32"
        # (R, N, k, order, mask): one launch (bitmap; many rows), two (sort; score; block mask)
        for R, N, k, by_score, mask in ((1, 1 << 16, 2048, False, False), (1024, 1 << 16, 2048, False, False),
                                        (1, 1 << 20, 512, False, False), (64, 1 << 20, 2048, True, False),
                                        (64, 1 << 15, 2048, False, True)):
            plan = KT._fused_plan(R, N, k, by_score, mask, False, mask, 8 if mask else 0, None, None, None, ())
            out = "*i8" if mask else "*i64"
            if len(plan.grid) == 1:
                build(KT._row_topk_kernel, dict(rows, **ptrs("gmax_ptr", "thr_ptr", "count_ptr", "cand_key_ptr",
                                                             "cand_pos_ptr"), **outs, scratch_ptr=scratch(plan),
                                                out_ptr=out, **ints("N", "M", "k", "CH", "block", "NW")),
                      num_warps=plan.warps[0], **plan.consts)
                continue
            build(KT._max_threshold_kernel, dict(rows, **ptrs("gmax_ptr", "thr_ptr", "count_ptr", "arrive_ptr"),
                                                 **ints("x_stride", "N", "M", "k", "CH", "NC")),
                  num_warps=plan.warps[1], **plan.max_consts)
            build(KT._filter_finish_kernel, dict(rows, **ptrs("thr_ptr", "count_ptr", "arrive_ptr", "cand_key_ptr",
                                                              "cand_pos_ptr"), **outs, scratch_ptr=scratch(plan),
                                                 out_ptr=out, **ints("N", "k", "CH", "NC", "block", "NW")),
                  num_warps=plan.warps[0], **plan.consts)
    elif sys.argv[1] == "few":   # the few-row passes at the plans of the A/B's shapes
        ints_ = ints("N", "x_stride", "k", "CH", "NC")
        ptrs = {"x_ptr": "*fp32", "len_ptr": "*i32", "zeroed_ptr": "*i32", "state_ptr": "*i64"}
        # (R, N, k, order, mask, digits): position order (remapped), score order, block mask, 3 digits
        for R, N, k, by_score, mask, digits in ((1, 1 << 16, 2048, False, False, (8, 8, 8, 8)),
                                                (1, 1 << 20, 512, False, False, (11, 11, 10)),
                                                (8, 1 << 20, 2048, True, False, (8, 8, 8, 8)),
                                                (8, 1 << 15, 2048, False, True, (8, 8, 8, 8))):
            plan = KT._few_plan(R, N, k, by_score, mask, not mask, mask, 8 if mask else 0, None, digits)
            for p, shift, width, last in plan.passes:
                build(KT._few_pass_kernel, dict(ptrs, ge_ptr="*i32", chunk_ptr="*i32", **ints_), num_warps=plan.warps,
                      PASS=p, SHIFT=shift, WIDTH=width, LAST=last, **plan.consts)
            build(KT._few_emit_kernel, dict(ptrs, chunk_ptr="*i32", remap_ptr="*i32", scratch_ptr="*i64",
                                            out_ptr="*i8" if mask else "*i64",
                                            **ints_, **ints("out_stride", "remap_stride", "W", "block")),
                  num_warps=plan.warps, **plan.consts, **plan.emit_consts)
    else:
        # scores as the launchers pick them on a GPU: BF16 operands (MMA), fp32 (IEEE), FP4, gather
        for fp4, bf16, gather, dt in ((False, True, False, "bf16"), (False, False, False, "fp32"),
                                      (True, True, False, "u8"), (False, True, True, "bf16")):
            tq, block_s, _, warps, stages = K._score_config(4096, 65536, 64, 128, gather)
            build(K._scores_kernel, {"q_ptr": "*" + dt, "qs_ptr": "*" + dt, "k_ptr": "*" + dt,
                                     "ks_ptr": "*" + dt, "w_ptr": "*bf16" if bf16 else "*fp32",
                                     "vis_ptr": "*i32", "idx_ptr": "*i32", "out_ptr": "*fp32",
                                     **ints("T", "S", "H", "out_stride", "idx_stride", "n_s_progs")},
                  num_warps=warps, D=128, D_PAD=128, H_PAD=64, TQ=tq, BLOCK_S=block_s, FP4=fp4,
                  BF16_SCORE=bf16, GATHER=gather, IEEE=not bf16, GPU_OPS=K._SCORE_GPU_OPS, STAGES=stages,
                  BLOCK_MAX=8 if fp4 else 0,   # FP4: the decode step's candidate layer, block maxima out
                  HEAD_ROUND=0, FINAL_ROUND=0, FP4_X2=0)
        # the A/B variants at T = 1 (bench/ab_logits.py): the inline PTX assembles
        for head, final, x2, block_s in ((1, 1, 0, 64), (2, 2, 1, 64), (2, 2, 1, 128)):
            build(K._scores_kernel, {"q_ptr": "*u8", "qs_ptr": "*u8", "k_ptr": "*u8", "ks_ptr": "*u8",
                                     "w_ptr": "*bf16", "vis_ptr": "*i32", "idx_ptr": "*i32", "out_ptr": "*fp32",
                                     **ints("T", "S", "H", "out_stride", "idx_stride", "n_s_progs")},
                  num_warps=4, divisible=("k_ptr", "ks_ptr", "S", "n_s_progs"), D=128, D_PAD=128, H_PAD=64,
                  TQ=1, BLOCK_S=block_s, FP4=True, BF16_SCORE=True, GATHER=False, IEEE=False,
                  GPU_OPS=True, STAGES=3, BLOCK_MAX=8, HEAD_ROUND=head, FINAL_ROUND=final, FP4_X2=x2)
        build(K._hadamard_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", **ints("n_rows", "scale_bits")},
              num_warps=4, ROWS=K._HADAMARD_ROWS, D=128)
        E = K._ELEMENTWISE_BLOCK
        build(K._copy_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, num_warps=4, BLOCK=E)
        build(K._weights_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", **ints("n", "factor_bits")},
              num_warps=4, BLOCK=E)
        build(K._weights_v32_kernel, {"x_ptr": "*fp32", "s_ptr": "*fp32", "out_ptr": "*fp32",
                                      **ints("n", "head_bits", "c_bits")}, num_warps=4, BLOCK=E)
        build(K._visible_kernel, {"p_ptr": "*i64", "out_ptr": "*i64", "n": "i32", "ratio": "i64"},
              num_warps=4, BLOCK=E)
        build(P._block_max_kernel, {"x_ptr": "*fp32", "lens_ptr": "*i32", "out_ptr": "*fp32",
                                    **ints("W", "NB", "block", "x_stride")}, BLOCK_B=512, BS_PAD=8)
        build(P._finite_blocks_mask_kernel, {"bs_ptr": "*fp32", "out_ptr": "*i8",
                                             **ints("W", "NB", "block")}, BLOCK_W=4096)
        words = P._GATHER_BLOCK // 8   # as _gather_pool launches them
        build(P._pool_count_kernel, {"words_ptr": "*i64", "vis_ptr": "*i32", "counts_ptr": "*i32",
                                     **ints("S", "row_words", "NC")}, num_warps=P._GATHER_WARPS, WORDS=words)
        build(P._gather_kernel, {"words_ptr": "*i64", "vis_ptr": "*i32", "counts_ptr": "*i32",
                                 "idx_ptr": "*i32", "count_ptr": "*i32", **ints("S", "row_words", "NC", "width")},
              num_warps=P._GATHER_WARPS, NC_PAD=64, WORDS=words)
        for n_pad, k_pad, has_n in ((16384, 512, True), (4096, 2048, False)):   # re-index pool; short rows
            build(P._row_topk_kernel, {"x_ptr": "*fp32", "n_ptr": "*i32", "remap_ptr": "*i32", "out_ptr": "*i64",
                                       **ints("N", "x_stride", "k", "out_stride", "remap_stride")},
                  num_warps=max(4, min(16, n_pad // 1024)), N_PAD=n_pad, K_PAD=k_pad, HAS_N=has_n,
                  DROP_NEG_INF=not has_n, REMAP=has_n)
        build(P._row_topk_chunked_kernel, {"x_ptr": "*fp32", "n_ptr": "*fp32", "remap_ptr": "*fp32", "out_ptr": "*i64",
                                           **ints("N", "x_stride", "k", "out_stride", "remap_stride")},
              num_warps=16, CHUNK=P._ROW_TOPK_MAX, K_PAD=2048, HAS_N=False, DROP_NEG_INF=True, REMAP=False)
        build(P._gather_blocks_kernel, {"blocks_ptr": "*i64", "vis_ptr": "*i32", "idx_ptr": "*i32",
                                        "count_ptr": "*i32", "NB": "i32"}, num_warps=4, BLOCK_SIZE=8, BS_PAD=8,
              CHUNK=256)
    print("built", " ".join(sorted(built)))
""")

COMPILE_GROUPS = {
    "topk": {"_hist_kernel", "_boundary_kernel", "_compact_kernel", "_final_kernel", "_radix_rows_kernel"},
    "filter": {"_group_max_kernel", "_threshold_kernel", "_filter_kernel", "_select_kernel"},
    "fused": {"_row_topk_kernel", "_max_threshold_kernel", "_filter_finish_kernel"},
    "few": {"_few_pass_kernel", "_few_emit_kernel"},
    "rest": {"_scores_kernel", "_hadamard_kernel", "_copy_kernel", "_weights_kernel", "_weights_v32_kernel",
             "_visible_kernel", "_block_max_kernel", "_finite_blocks_mask_kernel", "_pool_count_kernel",
             "_gather_kernel", "_gather_blocks_kernel", "_row_topk_kernel",
             "_row_topk_chunked_kernel"},
    # kernels/attn.py's kernels: compiled once, at their launch configurations (head dims, value
    # splits, paths), by tests/test_kernels_attn.py::test_kernel_compiles_for_sm90_at_its_launch_configurations
    "attn": {"_sparse_attention_kernel", "_attn_scores_kernel", "_chunk_kernel", "_combine_kernel"},
    # kernels/path.py's fused RoPE + FP8 kernel: by tests/test_kernels_path.py::test_fused_kernel_compiles_for_sm90_without_fma
    "path": {"_rope_quantize_kernel"},
}
COMPILED_ELSEWHERE = {"attn", "path"}   # groups another test file compiles (one compile each)


def test_compile_groups_cover_every_kernel():
    from triton.runtime import KernelInterface
    from dsv4spec.kernels import attn as A
    from dsv4spec.kernels import path as KP
    from dsv4spec.kernels import pool as P
    kernels = {name for mod in (K, KT, P, KP, A) for name, v in vars(mod).items()
               if isinstance(v, KernelInterface) and name.endswith("_kernel")}
    assert kernels == set().union(*COMPILE_GROUPS.values())


@pytest.mark.parametrize("group", sorted(set(COMPILE_GROUPS) - COMPILED_ELSEWHERE))
def test_every_kernel_compiles_for_sm90(group):
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90, group], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    built = done.stdout.strip().splitlines()[-1].split()[1:]
    assert set(built) == COMPILE_GROUPS[group], done.stdout[-2000:]


def test_kernels_provide_every_indexer_operation():
    assert not set(K.__all__) & set(K.NOT_PROVIDED)
    assert set(K.__all__) | set(K.NOT_PROVIDED) == set(OPS), \
        "kernels.indexer provides exactly the indexer operations it does not list in NOT_PROVIDED"
