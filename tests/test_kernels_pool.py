"""The pool-family Triton kernels against impl (the oracle): candidate masks structurally valid and,
since both take the lowest block index among equal maxima, equal to impl; the re-index top-k
tie-aware valid inside the pool and scoring only the gathered pool positions; input validation;
determinism; and every POOL.* rule on the kernels target.  No timing."""
import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import indexer as KI
from dsv4spec.kernels import pool as K
from dsv4spec.properties.indexer import expected_scores, make_score_case
from dsv4spec.properties.pool import make_pool, wide_case
from dsv4spec.properties.ranking import assert_pool, assert_topk
from dsv4spec.properties.target import load_target
from dsv4spec.spec import indexer as S


def pool_of(case, fn=K.candidate_blocks):
    return fn(torch.from_numpy(case.scores).float(), torch.from_numpy(case.compress_lens),
              case.topk_blocks, case.block_size)


def check_pool(case):
    got = pool_of(case)
    assert_pool(got, case.scores, case.compress_lens, case.topk_blocks, case.block_size,
                what=f"candidate_blocks [{case!r}]")   # every clause, lowest_index included
    assert torch.equal(got, pool_of(case, impl.candidate_blocks)), f"differs from impl [{case!r}]"


KINDS = ["normal", "equal", "few_values", "weak_newest", "prefill", "minus_inf_blocks"]


@pytest.mark.parametrize("W,topk_blocks", [(61, 3), (40, 2048), (203, 5), (400, 17)])
@pytest.mark.parametrize("kind", KINDS)
def test_candidate_blocks_match_impl(kind, W, topk_blocks):
    check_pool(make_pool(kind, 3, 4, W, topk_blocks))


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_other_block_sizes(block_size):
    case = make_pool("few_values", 4, 3, 100, 4)
    case.block_size = block_size
    check_pool(case)


@pytest.mark.parametrize("n", [16383, 16384, 16385, 16393])
def test_full_size_rows_around_16384(n):
    """2048 blocks of 8: all reachable positions kept iff n <= 16384 (≤, not <)."""
    case = wide_case(n)
    check_pool(case)
    assert bool(pool_of(case)[0, :n].all()) == (n <= 16384)


def test_block_select_across_many_chunks():
    """The top-k engine on block scores with several chunks per row and a tight candidate cap."""
    case = make_pool("few_values", 9, 3, 8 * 600, 37)
    bs = torch.from_numpy(case.scores).float().view(3, 600, 8).amax(-1)
    lens = torch.from_numpy(case.compress_lens)
    newest = torch.div(lens - 1, 8, rounding_mode="floor")
    bs[torch.arange(3), newest.clamp(min=0)] = torch.where(lens > 0, float("inf"), bs[torch.arange(3), newest.clamp(min=0)])
    dev = KI._device()
    out = torch.zeros((3, 8 * 600), dtype=torch.int8, device=dev)
    KI._topk_radix(bs.to(dev), torch.full((3,), 600, dtype=torch.int32, device=dev), 37,
                   drop_neg_inf=True, mask_out=out, mask_block=8, cap=64, blocks=(64, 128))
    assert torch.equal(out.cpu().view(torch.bool), pool_of(case, impl.candidate_blocks))


def reindex_case(kind, seed, T, H, S_, density, blocky):
    case = make_score_case(kind, seed, T, H, 16, S_)
    rng = np.random.default_rng(seed)
    if blocky:
        pool = np.repeat(rng.random((T, -(-S_ // 8))) < density, 8, axis=1)[:, :S_]
    else:
        pool = rng.random((T, S_)) < density
    return case, pool


@pytest.mark.parametrize("density,blocky", [(0.0, True), (0.3, False), (0.7, True), (1.0, False)])
@pytest.mark.parametrize("kind", ["normal", "relu_zero", "ties"])
def test_reindex_topk_valid_inside_pool(kind, density, blocky):
    case, pool = reindex_case(kind, 5, 4, 4, 300, density, blocky)
    topk = 24
    got = K.reindex_topk(*case.torch(), torch.from_numpy(pool), topk)
    ref, tol = expected_scores(load_target("impl"), case)
    eligible = pool & S.visibility_mask(case.visible, 300)
    assert_topk(got, np.where(eligible, ref, -np.inf), eligible, topk, "position", tol=tol,
                clauses=("shape", "range", "padding", "count", "unique", "order", "selection"),
                what=f"reindex_topk [{case!r}]")


def test_reindex_scores_only_the_pool(monkeypatch):
    """The score kernel is launched on the gathered [T, |pool ∩ visible|] row, never on [T, S]."""
    case, pool = reindex_case("normal", 6, 3, 4, 2000, 0.05, True)
    widths = []
    real = K._launch_scores

    def spy(*args, **kw):
        widths.append(args[8])          # S of the launch: the scored row width
        return real(*args, **kw)

    monkeypatch.setattr(K, "_launch_scores", spy)
    got = K.reindex_topk(*case.torch(), torch.from_numpy(pool), 16)
    reach = pool & S.visibility_mask(case.visible, 2000)
    assert widths == [KI._pow2(int(reach.sum(1).max()), 16)] and widths[0] < 2000 // 4
    assert np.all(reach[np.arange(3)[:, None], np.where(got.numpy() >= 0, got.numpy(), 0)] | (got.numpy() < 0))


def test_bad_input_is_rejected():
    case = make_pool("normal", 0, 2, 20, 3)
    sc, lens = torch.from_numpy(case.scores).float(), torch.from_numpy(case.compress_lens)
    with pytest.raises(ValueError, match="causal mask"):
        K.candidate_blocks(torch.zeros(2, 20), torch.tensor([3, 20]))
    with pytest.raises(ValueError, match=r"\[0, 20\]"):
        K.candidate_blocks(sc, lens + 21)
    with pytest.raises(ValueError, match="block_size"):
        K.candidate_blocks(sc, lens, 3, 0)
    with pytest.raises(TypeError, match="topk_blocks"):
        K.candidate_blocks(sc, lens, 2.0)
    with pytest.raises(ValueError, match="NaN"):
        K.candidate_blocks(sc * float("nan"), lens)
    sc_case, pool = reindex_case("normal", 0, 2, 4, 30, 0.5, False)
    args = sc_case.torch()
    with pytest.raises(ValueError, match="pool has shape"):
        K.reindex_topk(*args, torch.from_numpy(pool[:, :10]), 4)
    with pytest.raises(TypeError, match="bool"):
        K.reindex_topk(*args, torch.from_numpy(pool).int(), 4)
    with pytest.raises(ValueError, match=r"topk must be an int in \[0, 30\]"):
        K.reindex_topk(*args, torch.from_numpy(pool), 31)


def test_repeated_calls_are_bitwise_identical():
    case = make_pool("equal", 2, 4, 300, 7)
    first = pool_of(case)
    sc_case, pool = reindex_case("ties", 2, 3, 4, 200, 0.5, True)
    r1 = K.reindex_topk(*sc_case.torch(), torch.from_numpy(pool), 20)
    for _ in range(2):
        assert torch.equal(pool_of(case), first)
        assert torch.equal(K.reindex_topk(*sc_case.torch(), torch.from_numpy(pool), 20), r1)
