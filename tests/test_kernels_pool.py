"""The pool-family Triton kernels against impl (the oracle): candidate masks structurally valid and,
since both take the lowest block index among equal maxima, equal to impl; the re-index top-k
tie-aware valid inside the pool and scoring only the gathered pool positions; input validation;
determinism; and every POOL.* rule on the kernels target.  No timing."""
import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import indexer as KI
from dsv4spec.kernels import topk as KT
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


def list_and_mask(case):
    dev = KI._device()
    x = torch.from_numpy(case.scores).float().to(dev)
    lens = torch.from_numpy(case.compress_lens).int().to(dev)
    args = (x, lens, case.topk_blocks, case.block_size)
    return K._candidate_list(*args), K._candidate_blocks(*args), lens


@pytest.mark.parametrize("W,topk_blocks", [(61, 3), (40, 2048), (203, 5), (400, 17)])
@pytest.mark.parametrize("kind", KINDS)
def test_candidate_list_is_the_mask_as_blocks(kind, W, topk_blocks):
    """The decode path's block list (ascending, -1 after the last) holds exactly the blocks the
    mask marks, and its expansion is the mask's gathered pool, bit for bit."""
    case = make_pool(kind, 3, 4, W, topk_blocks)
    blocks, mask, lens = list_and_mask(case)
    bs = case.block_size
    nb = blocks.shape[1]
    assert nb == min(topk_blocks, -(-W // bs))
    for r in range(blocks.shape[0]):
        marked = torch.unique(torch.nonzero(mask[r].cpu()).flatten() // bs)
        assert blocks[r].cpu().tolist() == marked.tolist() + [-1] * (nb - len(marked)), f"row {r} [{case!r}]"
    got = K._gather_blocks(blocks, lens, bs)
    want = K._gather_pool(mask.view(torch.uint8), lens, nb * bs)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), f"expanded list != gathered mask [{case!r}]"


@pytest.mark.parametrize("vis_cut", [0, 3, 8])
def test_gather_blocks_cuts_at_visible(vis_cut):
    """Blocks are expanded to their positions below visible only: the newest block may be cut."""
    dev = KI._device()
    blocks = torch.tensor([[0, 5, 9, -1, -1], [2, 3, -1, -1, -1]], dtype=torch.int64, device=dev)
    vis = torch.tensor([72 + vis_cut, 0], dtype=torch.int32, device=dev)
    idx, count = K._gather_blocks(blocks, vis, 8)
    want = [*range(0, 8), *range(40, 48), *range(72, 72 + vis_cut)]
    assert idx[0].cpu().tolist() == want + [-1] * (40 - len(want)) and int(count[0]) == len(want)
    assert (idx[1] == -1).all() and int(count[1]) == 0


def test_block_select_across_many_chunks():
    """The top-k engine on block scores with several chunks per row and a tight candidate cap."""
    case = make_pool("few_values", 9, 3, 8 * 600, 37)
    bs = torch.from_numpy(case.scores).float().view(3, 600, 8).amax(-1)
    lens = torch.from_numpy(case.compress_lens)
    newest = torch.div(lens - 1, 8, rounding_mode="floor")
    bs[torch.arange(3), newest.clamp(min=0)] = torch.where(lens > 0, float("inf"), bs[torch.arange(3), newest.clamp(min=0)])
    dev = KI._device()
    out = torch.zeros((3, 8 * 600), dtype=torch.int8, device=dev)
    KT._topk_radix(bs.to(dev), torch.full((3,), 600, dtype=torch.int32, device=dev), 37,
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


@pytest.mark.parametrize("S_", [1000, 1003])
@pytest.mark.parametrize("block", [16, 64, 1024])
def test_gather_pool_by_chunks(block, S_):
    """The pool gathered by chunk counts and their prefix (1 to 63 chunks of a row), the mask read
    as 64-bit words: per row the positions whose byte is nonzero below visible, ascending, -1
    padded, and their count.  Rows of whole 8-blocks, of single positions with any nonzero byte,
    every position; visible cuts a word; 1003 positions (not whole words) pads the row."""
    rng = np.random.default_rng(4)
    T, width = 5, 1024
    pool = np.repeat(rng.random((T, S_ // 8 + 1)) < 0.4, 8, axis=1)[:, :S_].astype(np.uint8)
    pool[2] = 1                          # every position, cut by visible only
    pool[4] = rng.choice([0, 0, 1, 2, 0x7F, 0x80, 0xFF], S_)   # single positions, any nonzero byte
    vis = np.array([S_, 517, S_ - 1, 0, 700])
    dev = KI._device()
    idx, count = K._gather_pool(torch.from_numpy(pool).to(dev), torch.from_numpy(vis).int().to(dev),
                                width, block)
    for r in range(T):
        want = np.flatnonzero(pool[r, :vis[r]])
        assert int(count[r]) == len(want), f"row {r}: count {int(count[r])}, expected {len(want)}"
        assert idx[r].cpu().tolist() == want.tolist() + [-1] * (width - len(want)), f"row {r} (block {block})"


@pytest.mark.parametrize("layout", ["odd offset", "row stride"])
def test_gather_pool_of_a_view(layout):
    """A mask that is a view (at an odd byte offset, or rows of a wider tensor) is gathered like
    its contiguous copy."""
    dev = KI._device()
    big = torch.from_numpy(np.random.default_rng(5).random((3, 209)) < 0.3).to(torch.uint8).to(dev)
    pool = big.view(-1)[1:601].view(3, 200) if layout == "odd offset" else big[:, :200]
    vis = torch.tensor([200, 100, 9], dtype=torch.int32, device=dev)
    got = K._gather_pool(pool, vis, 256, 16)
    want = K._gather_pool(pool.contiguous(), vis, 256, 16)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert int(got[1][0]) == int(pool[0].sum())


def test_reindex_layers_share_one_gather():
    """Four re-index layers on one gathered pool, each sync-free: what reindex_topk gives per layer."""
    case, pool = reindex_case("ties", 8, 3, 4, 300, 0.4, True)
    q, k, w, vis = case.torch()
    dev = KI._device()
    gathered = K._gather_pool(torch.from_numpy(pool).to(torch.uint8).to(dev), vis.int().to(dev), 512, 64)
    for layer in range(4):
        ql, kl = torch.roll(q, layer, 1), torch.roll(k, layer, 0)      # another layer's q and K
        want = K.reindex_topk(ql, kl, w, vis, torch.from_numpy(pool), 24)
        bf = [x.to(torch.bfloat16).to(dev) for x in (ql, kl, w)]   # as reindex_topk passes them
        got = K._reindex_topk(*bf, gathered, 24, sync=False)
        assert torch.equal(got.cpu(), want), f"layer {layer}: shared gather differs"


@pytest.mark.skipif(KI._device().type != "cuda", reason="a CUDA graph needs a GPU")
def test_decode_path_is_captured_by_a_cuda_graph():
    """Sync-free, the V4.1 decode paths (candidate blocks as a mask or as a list, one gather,
    re-index top-k) read nothing back to the host, so a CUDA graph captures them (a
    synchronization would fail the capture), and a replay gives the read-back path's bits, rows of
    the radix fallback included (row 1: every block score equal, every re-index score 0)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    T, W, H, D = 2, 1 << 16, 32, 128
    scores = torch.randn(T, W, device=dev, generator=g).bfloat16().float()
    scores[1] = 1.0
    lens = torch.full((T,), W, dtype=torch.int32, device=dev)
    q = torch.randn(T, H, D, device=dev, generator=g).bfloat16()
    q[1] = 0
    k = torch.randn(W, D, device=dev, generator=g).bfloat16()
    w = (torch.randn(T, H, device=dev, generator=g) * 0.02).bfloat16()

    def step(sync):
        pool = K._candidate_blocks(scores, lens, 2048, 8, sync=sync)
        blocks = K._candidate_list(scores, lens, 2048, 8, sync=sync)
        by_list = K._reindex_topk(q, k, w, K._gather_blocks(blocks, lens, 8), 512, sync=sync)
        return pool, K._reindex_topk(q, k, w, K._gather_pool(pool, lens, 16384), 512, sync=sync), blocks, by_list

    want = step(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(False)                      # compiles the sync-free variants outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step(False)
    graph.replay()
    torch.cuda.synchronize()
    assert int(want[0][1].sum()) == 16384 and bool((want[1] >= 0).all())
    assert torch.equal(want[3], want[1]), "re-index top-k: the list path differs from the mask path"
    for name, a, b in zip(("candidate blocks", "re-index top-k", "candidate list", "re-index (list)"), got, want):
        assert torch.equal(a, b), f"{name}: graph replay differs from the read-back path"


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


def fp4_keys(T, S, H, D, seed, zero_row=None):
    """FP4 q and K (random codes, E8M0 scales near 1) and BF16 head weights on the compute device."""
    g = torch.Generator().manual_seed(seed)
    qp = torch.randint(0, 256, (T, H, D // 2), dtype=torch.uint8, generator=g)
    qs = torch.randint(122, 131, (T, H, D // 32), dtype=torch.uint8, generator=g)
    kp = torch.randint(0, 256, (S, D // 2), dtype=torch.uint8, generator=g)
    ks = torch.randint(122, 131, (S, D // 32), dtype=torch.uint8, generator=g)
    w = (torch.randn(T, H, generator=g) * 0.05).bfloat16()
    if zero_row is not None:
        w[zero_row] = 0   # every score 0 (or -0): every block maximum ties
    dev = KI._device()
    return [x.to(dev) for x in (qp, qs, kp, ks, w)]


@pytest.mark.parametrize("block_size", [8, 4, 64])
@pytest.mark.parametrize("S,vis", [(1000, [1000, 0, 1, 519]), (136, [9, 136, 64, 65])])
def test_scores_with_block_max_are_the_block_scores(S, vis, block_size):
    """The score kernel writing block maxima (the decode path: no [T, S] scores in memory) gives
    _block_scores of its scores: every maximum, −inf past visible, the newest block +inf; and
    the candidate list taken from them is _candidate_list's."""
    T, H, D = len(vis), 4, 64
    qp, qs, kp, ks, w = fp4_keys(T, S, H, D, seed=S + block_size, zero_row=2)
    vis32 = torch.tensor(vis, dtype=torch.int32, device=qp.device)
    scores = torch.empty((T, S), dtype=torch.float32, device=qp.device)
    KI._launch_scores(qp, qs, kp, ks, w, vis32, None, T, S, H, D, scores, fp4=True, bf16=True)
    fused = torch.full((T, -(-S // block_size)), float("nan"), device=qp.device)   # poisoned
    KI._launch_scores(qp, qs, kp, ks, w, vis32, None, T, S, H, D, fused, fp4=True, bf16=True,
                      block_max=block_size)
    assert torch.equal(fused, K._block_scores(scores, vis32, block_size))
    topk_blocks = 5
    got = K._candidate_list_of_keys(qp, qs, kp, ks, w, vis32, topk_blocks, block_size)
    assert torch.equal(got, K._candidate_list(scores, vis32, topk_blocks, block_size))


def test_block_max_of_bf16_scores_and_bad_block():
    """block_max on the BF16 score path too; a block that is no power of two is refused."""
    T, S, H, D = 2, 300, 3, 32
    g = torch.Generator().manual_seed(9)
    dev = KI._device()
    q, k = torch.randn(T, H, D, generator=g).to(dev), torch.randn(S, D, generator=g).bfloat16().float().to(dev)
    q = q.bfloat16().float()
    w = (torch.randn(T, H, generator=g) * 0.1).bfloat16().float().to(dev)
    vis32 = torch.tensor([300, 17], dtype=torch.int32, device=dev)
    scores = torch.empty((T, S), dtype=torch.float32, device=dev)
    KI._launch_scores(q, None, k, None, w, vis32, None, T, S, H, D, scores, fp4=False, bf16=True)
    got = K._candidate_list_of_keys(q, None, k, None, w, vis32, 7, 8, fp4=False)
    assert torch.equal(got, K._candidate_list(scores, vis32, 7, 8))
    with pytest.raises(ValueError, match="power of two"):
        KI._launch_scores(q, None, k, None, w, vis32, None, T, S, H, D, scores, fp4=False, bf16=True,
                          block_max=6)


def short_rows(values: str, drop: bool):
    """Six rows of 700 (values: distinct, few, equal or signed_zeros) with −inf tails and holes,
    counts [N, N, 650, 0, 37, 699] and a remap table: (x, n_valid, remap, R, N, device)."""
    dev = KI._device()
    g = torch.Generator().manual_seed(len(values) + drop)
    R, N = 6, 700
    x = {"distinct": torch.randn(R, N, generator=g),
         "few": torch.randint(-2, 3, (R, N), generator=g).float(),
         "equal": torch.full((R, N), 0.5),
         "signed_zeros": torch.randint(0, 2, (R, N), generator=g).float() * -0.0}[values]
    x[1, 100:] = float("-inf")
    x[2, ::3] = float("-inf")
    n_valid = torch.tensor([N, N, 650, 0, 37, 699], dtype=torch.int32, device=dev)
    remap = (torch.arange(N, device=dev) * 3 + 1).int().expand(R, N).contiguous()
    return x.to(dev), n_valid, remap, R, N, dev


@pytest.mark.parametrize("values", ["distinct", "few", "equal", "signed_zeros"])
@pytest.mark.parametrize("drop", [False, True])
def test_row_topk_is_the_engine(values, drop):
    """The one-program top-k of short rows gives the top-k engine's picks bit for bit (position
    order, equal keys to the lowest positions, −inf dropped or kept, fewer valid than k, remapped)."""
    x, n_valid, remap, R, N, dev = short_rows(values, drop)
    everything = torch.full((R,), N, dtype=torch.int32, device=dev)
    for k in (1, 40, 300, N):
        want = KT._topk_engine(x, n_valid, k, drop_neg_inf=drop, remap=remap)
        for chunk in (None, 128, 512):   # one chunk, several (the 32768 block row on the GPU: 2 of 16384)
            got = K._row_topk(x, n_valid, k, drop_neg_inf=drop, remap=remap, chunk=chunk)
            assert torch.equal(got, want), f"k {k}, chunks of {chunk or N}: row top-k differs from the engine"
        want = KT._topk_engine(x, everything, k, drop_neg_inf=drop)
        assert torch.equal(K._row_topk(x, None, k, drop_neg_inf=drop), want), f"k {k} (no counts) differs"


@pytest.mark.parametrize("values, drop, k", [("distinct", False, 40), ("few", True, 1), ("equal", True, 700),
                                             ("signed_zeros", False, 40)])
def test_few_row_passes_are_the_engine(values, drop, k):
    """The top-k engine's few-row passes (forced on; chunks of 128, 6 programs a row) give its bits
    with them off on the rows of test_row_topk_is_the_engine (−inf dropped or kept, fewer valid than
    k, visible 0, remapped), and as the candidate blocks' mask; each kind of values with one of the
    −inf modes and one k of 1, 40 and every key (the kinds × modes × k grid: test_kernels_indexer's
    few-row tests)."""
    x, n_valid, remap, R, N, dev = short_rows(values, drop)
    outs = []
    for mode in ("off", "on"):
        mask = torch.zeros((R, N * 4), dtype=torch.int8, device=dev)
        with KT.few_rows(mode):
            outs.append((KT._topk_engine(x, n_valid, k, drop_neg_inf=drop, remap=remap, blocks=(64, 128)),
                         KT._topk_engine(x, n_valid, k, drop_neg_inf=drop, mask_out=mask, mask_block=4,
                                         blocks=(64, 128)), mask))
    assert torch.equal(outs[1][0], outs[0][0]), f"k {k}: few-row passes differ from the engine"
    assert torch.equal(outs[1][2], outs[0][2]), f"k {k}: few-row block mask differs from the engine's"


def test_row_topk_switch(monkeypatch):
    """The re-index rows go to the one-program top-k eagerly (the eager step's cost is its
    launches) and to the top-k engine inside a CUDA graph capture (faster on the H200's device
    time); DSV4SPEC_ROW_TOPK=0 / 1 / 2 fixes the choice; both give the same picks."""
    case, pool = reindex_case("ties", 8, 3, 4, 300, 0.4, True)
    q, k, w, vis = case.torch()
    x = torch.zeros(1)
    monkeypatch.delenv("DSV4SPEC_ROW_TOPK", raising=False)
    assert K._row_topk_fits(x, 300) and not K._row_topk_fits(x, 32768)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert K._row_topk_fits(x, 300), "a CPU tensor is never captured"
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not K._row_topk_fits(x, 300), "inside a capture the engine serves the row"
    monkeypatch.undo()
    monkeypatch.setenv("DSV4SPEC_ROW_TOPK", "1")
    new = K.reindex_topk(q, k, w, vis, torch.from_numpy(pool), 24)
    assert K._row_topk_fits(x, 300) and not K._row_topk_fits(x, 32768)
    monkeypatch.setenv("DSV4SPEC_ROW_TOPK", "2")
    assert K._row_topk_fits(x, 32768) and not K._row_topk_fits(x, 65537)
    monkeypatch.setenv("DSV4SPEC_ROW_TOPK", "0")
    assert not K._row_topk_fits(x, 300)
    assert torch.equal(K.reindex_topk(q, k, w, vis, torch.from_numpy(pool), 24), new)
