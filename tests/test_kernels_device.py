"""The device API (dsv4spec.kernels.device): the same bits as the kernels target's operations, on
the tensors' own device; metadata errors that name what was expected; and, on a GPU, no host
synchronization on any call (torch's sync debug mode set to error) and a decode step captured in
a CUDA graph whose replay gives the eager bits.  Under the interpreter the functions take CPU
tensors, so the bit comparisons run in CI too."""
import contextlib

import pytest
import torch

from dsv4spec import impl
from dsv4spec import kernels as K
from dsv4spec.kernels import INTERPRET
from dsv4spec.kernels import device as D

DEV = torch.device("cpu" if INTERPRET else "cuda")
GPU = pytest.mark.skipif(INTERPRET, reason="needs a CUDA GPU (sync and graph checks)")


def bf16_values(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).bfloat16().float()


def on(t):
    return t.to(DEV)


def decode_inputs(T=2, H=16, S=700, seed=1):
    """FP4 index q/k, BF16 re-index q/k and weights, visible counts below S."""
    q = bf16_values(T, H, 128, seed=seed)
    k = bf16_values(S, 128, seed=seed + 1)
    w = bf16_values(T, H, seed=seed + 2, scale=0.1)
    qp, qs = impl.fp4_e8m0_quantize(q)
    kp, ks = impl.fp4_e8m0_quantize(k)
    visible = torch.tensor([S - 5, S], dtype=torch.int32)[:T]
    return dict(q=q, k=k, w=w, qp=qp, qs=qs, kp=kp, ks=ks, visible=visible)


def decode_step(d, topk_blocks=16, block_size=8, topk=24):
    """Layer 20's FP4 scores and candidate list, the pool expanded once, two re-index layers."""
    scores = D.index_scores_fp4(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])
    blocks = D.candidate_list(scores, d["visible"], topk_blocks, block_size)
    pool = D.pool_positions(blocks, d["visible"], block_size)
    picks = [D.reindex_topk(q, d["k"], d["w"], pool, topk) for q in (d["q"], -d["q"])]
    return scores, blocks, pool, picks


def device_inputs(d):
    out = {name: on(t) for name, t in d.items()}
    for name in ("q", "k", "w"):
        out[name] = out[name].bfloat16()
    return out


# ------------------------------------------------------------------------------------------------
# the bits of the kernels target
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, block", [("fp4_e4m3", 16), ("fp4_e8m0", 32)])
def test_fp4_codecs_equal_the_operations(name, block):
    x = bf16_values(5, 256, seed=3, scale=7.0)
    packed, scales = getattr(D, f"{name}_quantize")(on(x.bfloat16()))
    want_p, want_s = getattr(K, f"{name}_quantize")(x)
    assert packed.device.type == DEV.type and torch.equal(packed.cpu(), want_p) and torch.equal(scales.cpu(), want_s)
    back = getattr(D, f"{name}_dequantize")(packed, scales)
    assert torch.equal(back.cpu(), getattr(K, f"{name}_dequantize")(want_p, want_s))


@pytest.mark.parametrize("block", [32, 128])
def test_fp8_codecs_equal_the_operations(block):
    x = bf16_values(3, 256, seed=4, scale=100.0)
    q, s = D.fp8_quantize(on(x.bfloat16()), block)
    want_q, want_s = K.fp8_quantize(x, block)
    assert torch.equal(q.cpu(), want_q) and torch.equal(s.cpu(), want_s)
    assert torch.equal(D.fp8_dequantize(q, s, block).cpu(), K.fp8_dequantize(want_q, want_s, block))
    assert torch.equal(D.fp8_qdq(on(x), block).cpu(), K.fp8_qdq(x, block))


def test_scores_and_topk_equal_the_operations():
    d = decode_inputs()
    dd = device_inputs(d)
    scores = D.index_scores_fp4(dd["qp"], dd["qs"], dd["kp"], dd["ks"], dd["w"], dd["visible"])
    want = K.index_scores_fp4(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])
    assert torch.equal(scores.cpu(), want)
    bf16 = D.index_scores(dd["q"], dd["k"], dd["w"], dd["visible"])
    assert torch.equal(bf16.cpu(), K.index_scores(d["q"], d["k"], d["w"], d["visible"]))
    for order in ("score", "position"):
        got = D.index_topk(scores, dd["visible"], 40, order)
        assert got.dtype == torch.int64 and torch.equal(got.cpu(), K.index_topk(want, d["visible"], 40, order))


def test_the_decode_step_equals_the_pool_operations():
    """The block list expanded and re-indexed gives what candidate_blocks + reindex_topk give."""
    d = decode_inputs()
    scores, blocks, pool, picks = decode_step(device_inputs(d))
    mask = K.candidate_blocks(scores.cpu(), d["visible"], 16, 8)   # whole blocks, the newest one too
    listed = torch.zeros_like(mask)
    for t, row in enumerate(blocks.cpu()):
        for b in row[row >= 0].tolist():
            listed[t, 8 * b:8 * b + 8] = True
    assert torch.equal(listed, mask)
    reachable = mask & (torch.arange(mask.shape[1]) < d["visible"][:, None])
    idx, count = pool
    assert torch.equal(count.cpu(), reachable.sum(1).int())
    for t in range(len(count)):
        assert torch.equal(idx[t, :count[t]].cpu().long(), reachable[t].nonzero().flatten())
        assert bool((idx[t, count[t]:] == -1).all())
    for q, got in zip((d["q"], -d["q"]), picks):
        assert torch.equal(got.cpu(), K.reindex_topk(q, d["k"], d["w"], d["visible"], mask, 24))


# ------------------------------------------------------------------------------------------------
# metadata errors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda: D.fp4_e8m0_quantize(on(torch.zeros(4, 48))), "not a multiple of the block \\(32\\)"),
    (lambda: D.fp4_e4m3_quantize(on(torch.zeros(4, 32, dtype=torch.float16))), "x must be float32 or bfloat16, got float16"),
    (lambda: D.fp8_quantize(on(torch.zeros(64, 4)).t(), 32), "must be contiguous"),
    (lambda: D.fp8_dequantize(on(torch.zeros(2, 64, dtype=torch.uint8)), on(torch.zeros(2, 3, dtype=torch.uint8)), 32),
     "scales must have shape \\(2, 2\\)"),
    (lambda: D.index_topk(on(torch.zeros(2, 8)), on(torch.zeros(2, dtype=torch.int64)), 2, "position"),
     "visible must be int32, got int64"),
    (lambda: D.index_topk(on(torch.zeros(2, 8)), on(torch.zeros(3, dtype=torch.int32)), 2, "position"),
     "visible must have shape \\(2,\\)"),
    (lambda: D.index_topk(on(torch.zeros(2, 8)), on(torch.zeros(2, dtype=torch.int32)), 9, "position"),
     "k must be an int in \\[0, 8\\]"),
    (lambda: D.index_topk(on(torch.zeros(2, 8)), on(torch.zeros(2, dtype=torch.int32)), 2, "ascending"),
     "order must be one of"),
    (lambda: D.index_scores(on(torch.zeros(2, 4, 128)), on(torch.zeros(5, 128)).bfloat16(),
                            on(torch.zeros(2, 4)).bfloat16(), on(torch.zeros(2, dtype=torch.int32))),
     "q must be bfloat16, got float32"),
    (lambda: D.reindex_topk(*(on(t).bfloat16() for t in (torch.zeros(1, 4, 128), torch.zeros(5, 128), torch.zeros(1, 4))),
                            on(torch.zeros(1, 8, dtype=torch.int32)), 4),
     "pool must be the \\(idx, count\\) pair"),
    (lambda: D.candidate_list(on(torch.zeros(2, 8)), on(torch.zeros(2, dtype=torch.int32)), 0), "topk_blocks must be a positive int"),
])
def test_metadata_errors_name_what_was_expected(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


@GPU
def test_host_tensors_are_refused_on_a_gpu():
    with pytest.raises(ValueError, match="is on cpu; the device API takes CUDA tensors"):
        D.fp8_qdq(torch.zeros(2, 32), 32)


# ------------------------------------------------------------------------------------------------
# no host synchronization; capture in a CUDA graph
# ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@GPU
def test_the_sync_check_has_teeth():
    """A read-back under the same setting raises: the tests below can fail."""
    x = torch.ones(3, device="cuda")
    with sync_is_an_error(), pytest.raises(RuntimeError, match="synchroniz"):
        bool(x.any())


@GPU
def test_no_call_synchronizes():
    d = device_inputs(decode_inputs(T=2, S=5000))
    x = bf16_values(64, 128, seed=9).bfloat16().cuda()
    calls = [lambda: decode_step(d), lambda: D.index_topk(decode_step(d)[0], d["visible"], 64, "score")]
    for name in ("fp4_e4m3", "fp4_e8m0"):
        calls.append(lambda name=name: getattr(D, f"{name}_dequantize")(*getattr(D, f"{name}_quantize")(x)))
    calls += [lambda: D.fp8_dequantize(*D.fp8_quantize(x, 128), 128), lambda: D.fp8_qdq(x, 32)]
    for call in calls:
        call()                       # compile outside the check
        torch.cuda.synchronize()
        with sync_is_an_error():
            call()
    torch.cuda.synchronize()


@GPU
def test_a_decode_step_replays_from_a_cuda_graph():
    d = device_inputs(decode_inputs(T=2, S=5000))
    eager = decode_step(d)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        decode_step(d)               # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_step(d)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    assert all(torch.equal(a, b) for a, b in zip(captured[2], eager[2]))
    assert all(torch.equal(a, b) for a, b in zip(captured[3], eager[3]))


@GPU
@pytest.mark.parametrize("R,N,k", [(1, 1 << 16, 2048), (3, 40000, 100), (8, 1 << 17, 512)])
def test_few_row_topk_has_no_sync_and_replays_from_a_cuda_graph(R, N, k):
    """The top-k engine's few-row passes (kernels.topk.few_rows) on the GPU: the engine's bits with
    them off in both orders (BF16 ties, a short row, a row of equal values), no host
    synchronization, and a CUDA graph of index_topk that replays the eager bits."""
    from dsv4spec.kernels import topk as KT
    x = bf16_values(R, N, seed=R).cuda()
    x[-1, : N // 2] = 0.25
    visible = torch.full((R,), N, dtype=torch.int32, device="cuda")
    visible[0] = N - 1000
    for order in ("position", "score"):
        with KT.few_rows("off"):
            want = D.index_topk(x, visible, k, order)
        with KT.few_rows("on"):
            eager = D.index_topk(x, visible, k, order)
            torch.cuda.synchronize()
            with sync_is_an_error():
                again = D.index_topk(x, visible, k, order)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                D.index_topk(x, visible, k, order)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = D.index_topk(x, visible, k, order)
            for _ in range(3):
                graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(eager, want) and torch.equal(again, want), f"{order}: eager few-row bits"
        assert torch.equal(captured, want), f"{order}: graph replay of the few-row passes"


def test_every_function_is_documented_with_its_shapes():
    public = [n for n in dir(D) if not n.startswith("_") and callable(getattr(D, n))
              and getattr(getattr(D, n), "__module__", "") == D.__name__]
    assert len(public) == 13
    for name in public:
        assert f"    {name}(" in D.__doc__, f"{name} is missing from the module's table of shapes"
