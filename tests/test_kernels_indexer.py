"""The indexer-family Triton kernels against impl (the oracle): BF16 scores within 1 BF16 ulp with
the −inf positions exact, FP4 scores likewise, top-k tie-aware valid and (both break ties by the
lowest position) equal to impl; the radix-select paths forced with small chunks and candidate
caps; input validation; determinism; and every IDX.* rule on the kernels target.  No timing."""
import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import indexer as K
from dsv4spec.properties.indexer import make_rows, make_score_case
from dsv4spec.properties.ranking import assert_topk
from dsv4spec.spec import RULES
from dsv4spec.spec import indexer as S

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

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


@pytest.mark.parametrize("shape", SCORE_SHAPES, ids=lambda s: "T%d_H%d_D%d_S%d" % s)
@pytest.mark.parametrize("kind", ["normal", "relu_zero", "ties", "cancel", "wide_exponents"])
def test_bf16_scores_match_impl(kind, shape):
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
def test_fp4_scores_match_impl(shape, random_bytes):
    args = fp4_inputs(11, *shape, random_bytes)
    assert_scores_close(K.index_scores_fp4(*args), impl.index_scores_fp4(*args), f"index_scores_fp4 {shape}")


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
    out = K._topk_engine(torch.from_numpy(case.scores).float().to(dev),
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
# every IDX.* rule whose operations the kernels provide, run by the suite on the kernels target
# ------------------------------------------------------------------------------------------------
def _idx_rules():
    from dsv4spec.properties.suite import checks_for
    ops = set(K.__all__)
    rules = []
    for rid in sorted(RULES):
        if not rid.startswith("IDX."):
            continue
        chks = checks_for(rid)
        if chks and all(set(c.ops) <= ops for c in chks):
            rules.append(rid)
    return rules


@pytest.mark.parametrize("rule_id", _idx_rules())
def test_idx_rule_passes_on_kernels(rule_id):
    from dsv4spec.properties.suite import PASS, run_rule
    from dsv4spec.properties.target import load_target
    row = run_rule(rule_id, load_target("kernels"), "ci")
    assert row.status == PASS, f"{rule_id} on kernels: {row.status} {row.detail}"
