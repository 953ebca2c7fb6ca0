"""Graph-backed calls (dsv4spec.kernels.graph_backed, dsv4spec.kernels.device.graphed).

Without a GPU (CI): which arguments make a different key; the paths that call the function directly
(CPU tensors, the interpreter, DSV4SPEC_GRAPHED=0); the LRU, the replay counter, giving up after
captures that never replay and after a failed capture, two threads of one key, with a stand-in
capture (a Python function: the cache's logic, not torch's graph API).  On a GPU: every wrapped function gives the plain call's
bits; a second call replays; a changed shape or address captures again; outputs are not aliased
across calls; a caller's own capture is called through; the second call never synchronizes; the
LRU holds at most its entries."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dsv4spec.kernels import INTERPRET
from dsv4spec.kernels import device as D
from dsv4spec.kernels import graph_backed as G

GPU = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")


# ------------------------------------------------------------------------------------------------
# the key
# ------------------------------------------------------------------------------------------------
def key(*args, **kwargs):
    return G.key_of((args, kwargs))


def test_the_key_holds_each_tensors_address_and_layout():
    x = torch.zeros(4, 8)
    assert key(x, 3) == key(x, 3)
    assert key(x, 3) == key(torch.Tensor(x.untyped_storage()).view(4, 8), 3)     # same memory, same layout
    assert key(x, 3) != key(torch.zeros(4, 8), 3)                                # another address
    assert key(x, 3) != key(x.view(8, 4), 3)                                     # another shape
    assert key(x, 3) != key(x.t(), 3)                                            # another stride
    assert key(x, 3) != key(x[1:], 3) and key(x[:2], 3) != key(x[:3], 3)         # offset, shape
    assert key(x, 3) != key(x.view(torch.int32), 3)                              # another dtype


def test_the_key_holds_every_other_argument_by_type_and_value():
    x = torch.zeros(2)
    assert key(x, 1) != key(x, 2)
    assert key(x, 1) != key(x, True) and key(x, 1) != key(x, 1.0)               # equal, hashed alike
    assert key(x, "score") != key(x, "position")
    assert key(x, out_dtype=torch.float32) != key(x, out_dtype=torch.bfloat16)
    assert key(x, (x, 1)) != key(x, [x, 1]) and key(x, (x, 1)) == key(x, (x, 1))
    assert key(x, {"a": x}) != key(x, {"b": x})
    assert key(x, k=1) != key(x, 1)
    with pytest.raises(TypeError, match="a graph-backed call keys on its arguments; a set cannot be hashed"):
        key(x, [set()])


def test_outputs_are_cloned_through_tuples_lists_and_dicts():
    a, b = torch.arange(3), torch.ones(2, 4).t()
    out = G.cloned(([a, 7], {"b": b}))
    assert out[0][1] == 7 and torch.equal(out[0][0], a) and torch.equal(out[1]["b"], b)
    assert out[0][0].data_ptr() != a.data_ptr() and out[1]["b"].stride() == b.stride()


# ------------------------------------------------------------------------------------------------
# calling through
# ------------------------------------------------------------------------------------------------
def counted(fn):
    calls = []

    def run(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)
    return run, calls


def refusing_capture(fn, args, kwargs):
    raise AssertionError("no capture on this path")


class OnCuda:
    """A stand-in tensor that says it is on CUDA (graphs_wanted reads is_cuda only)."""
    is_cuda = True


def test_cpu_tensors_and_the_switch_call_the_function_directly(monkeypatch):
    fn, calls = counted(lambda x: x + 1)
    wrapped = G.GraphBacked(fn, capture=refusing_capture)
    x = torch.zeros(3)
    assert torch.equal(wrapped(x), x + 1) and torch.equal(wrapped((x, 2)[0]), x + 1)
    assert (wrapped.direct, wrapped.captures, len(calls), wrapped.held) == (2, 0, 2, 0)
    monkeypatch.setattr(G, "INTERPRET", False)
    assert not G.graphs_wanted([x]) and not G.graphs_wanted([OnCuda(), x])
    monkeypatch.setenv(G.ENV, "0")
    assert not G.graphs_wanted([OnCuda()])          # decided before anything asks the GPU


def test_the_device_functions_call_through_under_the_interpreter():
    if not INTERPRET:
        pytest.skip("the interpreter's path (on a GPU the tests below replay)")
    scores = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    visible = torch.tensor([4], dtype=torch.int32)
    got = D.graphed.index_topk(scores, visible, 2, "position")
    assert torch.equal(got, D.index_topk(scores, visible, 2, "position"))
    assert D.graphed.index_topk.direct >= 1 and D.graphed.index_topk.captures == 0
    assert D.graphed.index_topk.__name__ == "index_topk" and D.graphed.index_topk.__doc__ == D.index_topk.__doc__


# ------------------------------------------------------------------------------------------------
# the cache's logic, with a stand-in capture
# ------------------------------------------------------------------------------------------------
def stand_in_capture(log):
    """A capture that calls fn (the warm-up) and 'replays' by calling it again, logging each."""
    def capture(fn, args, kwargs):
        log.append("capture")

        def replay():
            log.append("replay")
            return fn(*args, **kwargs)
        return fn(*args, **kwargs), replay
    return capture


def test_a_second_call_replays_and_a_new_key_captures():
    log = []
    wrapped = G.GraphBacked(lambda x: x * 2, entries=4, capture=stand_in_capture(log))
    assert wrapped.through("a", (1,), {}) == 2 and wrapped.through("a", (1,), {}) == 2
    assert wrapped.through("b", (5,), {}) == 10
    assert log == ["capture", "replay", "capture"]
    assert (wrapped.captures, wrapped.replays, wrapped.misses_in_a_row) == (2, 1, 1)


def test_threads_of_one_key_capture_it_once():
    """Two threads miss the same key together: the lock lets one capture (a slow one here, while the
    other waits on the lock) and the other replay its graph."""
    log, barrier = [], threading.Barrier(2)

    def slow_capture(fn, args, kwargs):
        log.append("capture")
        time.sleep(0.2)                 # the other thread arrives while this one captures
        return fn(*args, **kwargs), lambda: log.append("replay") or fn(*args, **kwargs)
    wrapped = G.GraphBacked(lambda x: x * 3, capture=slow_capture)

    def call():
        barrier.wait()
        return wrapped.through("a", (2,), {})
    with ThreadPoolExecutor(2) as pool:
        assert [f.result() for f in [pool.submit(call) for _ in range(2)]] == [6, 6]
    assert sorted(log) == ["capture", "replay"] and (wrapped.captures, wrapped.replays) == (1, 1)


def test_the_lru_holds_its_entries_and_evicts_the_least_recent():
    log = []
    wrapped = G.GraphBacked(lambda x: x, entries=2, capture=stand_in_capture(log))
    for k in ("a", "b", "a", "c"):          # c evicts b, the least recently used
        wrapped.through(k, (k,), {})
    assert wrapped.held == 2 and wrapped.evictions == 1
    log.clear()
    wrapped.through("a", ("a",), {})
    wrapped.through("b", ("b",), {})
    assert log == ["replay", "capture"]


def test_it_gives_up_after_captures_that_never_replay():
    log = []
    wrapped = G.GraphBacked(lambda x: x, entries=3, capture=stand_in_capture(log))
    for i in range(3):
        wrapped.through(i, (i,), {})
    wrapped.through(0, (0,), {})             # a hit resets the run of misses
    for i in range(10, 13):
        wrapped.through(i, (i,), {})
    assert wrapped.gave_up is None and wrapped.captures == 6
    assert wrapped.through(99, (99,), {}) == 99
    assert wrapped.gave_up == "3 captures in a row without a replay" and wrapped.held == 0
    assert wrapped.captures == 6 and wrapped.direct == 1
    wrapped.reset()
    wrapped.through(7, (7,), {})
    assert wrapped.gave_up is None and wrapped.captures == 1


def test_a_failed_capture_keeps_the_calls_outputs_and_gives_up():
    def failing(fn, args, kwargs):
        raise G.CaptureFailed(fn(*args), RuntimeError("operation not permitted when stream is capturing"))
    wrapped = G.GraphBacked(lambda x: x + 1, capture=failing)
    with pytest.warns(UserWarning, match="a capture failed .*not permitted.*; calling it directly"):
        assert wrapped.through("a", (1,), {}) == 2
    assert wrapped.gave_up.startswith("a capture failed") and wrapped.captures == 0


# ------------------------------------------------------------------------------------------------
# on a GPU: torch's graphs behind the device functions
# ------------------------------------------------------------------------------------------------
def gpu_inputs(S=5000, T=2, H=16, D_=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, H, D_, device="cuda", generator=g).bfloat16()
    k = torch.randn(S, D_, device="cuda", generator=g).bfloat16()
    w = (torch.randn(T, H, device="cuda", generator=g) * 0.1).bfloat16()
    visible = torch.tensor([S - 5, S], dtype=torch.int32, device="cuda")[:T]
    qp, qs = D.fp4_e8m0_quantize(q)
    kp, ks = D.fp4_e8m0_quantize(k)
    scores = D.index_scores_fp4(qp, qs, kp, ks, w, visible)
    blocks = D.candidate_list(scores, visible, 64, 8)
    pool = D.pool_positions(blocks, visible, 8)
    return dict(q=q, k=k, w=w, visible=visible, qp=qp, qs=qs, kp=kp, ks=ks, scores=scores, blocks=blocks, pool=pool)


def calls_of(d):
    """(name, args) of every wrapped function on d's tensors."""
    return [("index_scores_fp4", (d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])),
            ("index_scores", (d["q"], d["k"], d["w"], d["visible"])),
            ("index_topk", (d["scores"], d["visible"], 512, "position")),
            ("index_topk", (d["scores"], d["visible"], 64, "score")),
            ("candidate_list", (d["scores"], d["visible"], 64, 8)),
            ("pool_positions", (d["blocks"], d["visible"], 8)),
            ("reindex_topk", (d["q"], d["k"], d["w"], d["pool"], 128))]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


@GPU
def test_every_wrapped_function_gives_the_plain_bits_and_replays():
    d = gpu_inputs()
    for name, args in calls_of(d):
        wrapped = G.GraphBacked(getattr(D, name))
        want = getattr(D, name)(*args)
        first, second = wrapped(*args), wrapped(*args)
        assert same(first, want) and same(second, want), name
        assert (wrapped.captures, wrapped.replays) == (1, 1), name
    assert {n for n, _ in calls_of(d)} == set(vars(D.graphed)) - {"wrap"}


@GPU
def test_a_changed_shape_or_address_captures_again():
    d = gpu_inputs()
    wrapped = G.GraphBacked(D.index_topk)
    scores, visible = d["scores"], d["visible"]
    wrapped(scores, visible, 64, "position")
    wrapped(scores, visible, 64, "position")
    moved = scores.clone()
    assert same(wrapped(moved, visible, 64, "position"), D.index_topk(moved, visible, 64, "position"))
    assert same(wrapped(scores[:1], visible[:1], 64, "position"), D.index_topk(scores[:1], visible[:1], 64, "position"))
    wrapped(scores, visible, 32, "position")
    assert (wrapped.captures, wrapped.replays) == (4, 1)


@GPU
def test_a_replay_reads_the_inputs_where_they_are_now():
    d = gpu_inputs()
    wrapped = G.GraphBacked(D.index_topk)
    scores = d["scores"].clone()
    wrapped(scores, d["visible"], 64, "position")
    scores.copy_(scores.flip(1))                       # new values, same address
    assert same(wrapped(scores, d["visible"], 64, "position"), D.index_topk(scores, d["visible"], 64, "position"))
    assert wrapped.replays == 1


@GPU
def test_outputs_are_not_aliased_across_calls():
    d = gpu_inputs()
    wrapped = G.GraphBacked(D.reindex_topk)
    args = (d["q"], d["k"], d["w"], d["pool"], 128)
    first, second = wrapped(*args), wrapped(*args)
    want = second.clone()
    second.fill_(-7)
    first.fill_(-9)
    third = wrapped(*args)
    assert same(third, want) and second.data_ptr() != third.data_ptr()
    assert bool((second == -7).all())


@GPU
def test_a_callers_capture_is_called_through():
    d = gpu_inputs()
    wrapped = G.GraphBacked(D.index_topk)
    args = (d["scores"], d["visible"], 64, "position")
    want = D.index_topk(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inside = wrapped(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert same(inside, want) and (wrapped.captures, wrapped.direct) == (0, 1)


@GPU
def test_the_second_call_never_synchronizes():
    d = gpu_inputs()
    for name, args in calls_of(d):
        wrapped = G.GraphBacked(getattr(D, name))
        wrapped(*args)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            wrapped(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert wrapped.replays == 1, name


@GPU
def test_a_whole_step_is_one_graph_and_the_lru_bound_holds():
    d = gpu_inputs()

    def step(scores, visible):
        blocks = D.candidate_list(scores, visible, 64, 8)
        pool = D.pool_positions(blocks, visible, 8)
        return [D.reindex_topk(q, d["k"], d["w"], pool, 128) for q in (d["q"], -d["q"])], blocks

    wrapped = D.graphed.wrap(step, entries=2, misses=8)
    rows = [d["scores"].clone() for _ in range(3)]
    for scores in rows + rows[:1]:                     # the fourth call's key was evicted by the third
        assert same(wrapped(scores, d["visible"]), step(scores, d["visible"]))
    assert (wrapped.captures, wrapped.replays, wrapped.evictions, wrapped.held) == (4, 0, 2, 2)
    assert same(wrapped(rows[0], d["visible"]), step(rows[0], d["visible"])) and wrapped.replays == 1
