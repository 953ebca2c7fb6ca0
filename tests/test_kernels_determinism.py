"""Every public kernel op gives the same bits on the same input, run after run: 20 runs on a GPU
(sizes that spread each op over many programs: top-k rows of 1M, several chunks per row), 2 in the
interpreter (small sizes).  Bits are compared, not values (−0 vs +0 and NaN payloads count), and
every op exported by a kernels module must have a case here (and so do the device paths of
the decode step that are not public ops).  No timing."""
import importlib
import pkgutil

import numpy as np
import pytest
import torch

import dsv4spec.kernels as kernels
from dsv4spec.kernels import attn as KA
from dsv4spec.kernels import indexer as KI
from dsv4spec.kernels import path as KPATH
from dsv4spec.kernels import pool as KP
from dsv4spec.kernels import quant as KQ
from dsv4spec.spec import indexer as S

GPU = KI._device().type == "cuda"
RUNS = 20 if GPU else 2
HOST_SIDE = {"layer_role"}   # configuration tables, no device work
DEVICE_PATHS = {"decode_block_list"}   # device functions a decode step uses beyond the public ops


def bf16_values(rng, shape, scale=1.0):
    return torch.from_numpy(S.round_bf16(rng.standard_normal(shape) * scale)).float()


def quant_cases(rng):
    n = 1 << 16 if GPU else 256           # rows of 128
    x = bf16_values(rng, (n, 128), 3.0)
    x[0, :5] = torch.tensor([0.0, -0.0, 6.0, -448.0, 1e-30])
    codes = torch.from_numpy(rng.integers(0, 16, (n, 128), dtype=np.uint8))
    bytes_ = torch.from_numpy(rng.integers(0, 256, (n, 128), dtype=np.uint8))
    p43, s43 = KQ.fp4_e4m3_quantize(x)
    p80, s80 = KQ.fp4_e8m0_quantize(x)
    q8, s8 = KQ.fp8_quantize(x, 64)
    return {
        "e2m1_encode": (KQ.e2m1_encode, (x,)),
        "e2m1_decode": (KQ.e2m1_decode, (codes,)),
        "e4m3_encode": (KQ.e4m3_encode, (x,)),
        "e4m3_decode": (KQ.e4m3_decode, (bytes_,)),
        "e8m0_decode": (KQ.e8m0_decode, (bytes_,)),
        "bf16_round": (KQ.bf16_round, (torch.from_numpy(rng.standard_normal((n, 128)).astype(np.float32)),)),
        "fp4_pack": (KQ.fp4_pack, (codes,)),
        "fp4_unpack": (KQ.fp4_unpack, (bytes_,)),
        "fp4_e4m3_quantize": (KQ.fp4_e4m3_quantize, (x,)),
        "fp4_e4m3_dequantize": (KQ.fp4_e4m3_dequantize, (p43, s43)),
        "fp4_e8m0_quantize": (KQ.fp4_e8m0_quantize, (x,)),
        "fp4_e8m0_dequantize": (KQ.fp4_e8m0_dequantize, (p80, s80)),
        "fp8_quantize": (KQ.fp8_quantize, (x, 64)),
        "fp8_dequantize": (KQ.fp8_dequantize, (q8, s8, 64)),
        "fp8_qdq": (KQ.fp8_qdq, (x, 128)),
    }


def indexer_cases(rng):
    T, H, D, S_ = (64, 64, 128, 8192) if GPU else (3, 4, 32, 96)
    q, k = bf16_values(rng, (T, H, D)), bf16_values(rng, (S_, D))
    w = bf16_values(rng, (T, H), 0.05)
    vis = torch.from_numpy(rng.integers(0, S_ + 1, T))
    vis[0] = S_
    qp, qs = KQ.fp4_e8m0_quantize(q)
    kp, ks = KQ.fp4_e8m0_quantize(k)
    R, N, kk = (4, 1 << 20, 2048) if GPU else (3, 700, 40)
    # BF16-valued scores: many equal values around the k-th, so the tie rule decides
    scores = bf16_values(rng, (R, N))
    scores[1] = torch.round(scores[1])
    rvis = torch.from_numpy(rng.integers(kk, N + 1, R))
    rvis[0] = N
    # rows of 64K (GPU): position order through the select's bitmap, not its sort
    short = bf16_values(rng, (R, N // 16))
    x = bf16_values(rng, (T * 4, 128), 4.0)
    return {
        "index_scores": (KI.index_scores, (q, k, w, vis)),
        "index_scores_fp4": (KI.index_scores_fp4, (qp, qs, kp, ks, w, vis)),
        "index_topk": (lambda x_, v, k_, xs: (KI.index_topk(x_, v, k_, "position"),
                                              KI.index_topk(x_, v, k_, "score"),
                                              KI.index_topk(xs, torch.full((R,), xs.shape[1]), k_, "position")),
                       (scores, rvis, kk, short)),
        "hadamard": (KI.hadamard, (x,)),
        "index_rotate": (KI.index_rotate, (x, "v4-flash")),
        "index_weights": (KI.index_weights, (bf16_values(rng, (T, 64)), "v4-flash")),
        "index_weights_v32": (KI.index_weights_v32, (bf16_values(rng, (T * 4, 64)),
                                                     torch.from_numpy(rng.random((T * 4, 64)).astype(np.float32)))),
        "index_visible": (KI.index_visible, (torch.from_numpy(rng.integers(0, 1 << 40, 4096)), 4)),
    }


def pool_cases(rng):
    R, W, nb, T, H, S_ = (8, 1 << 18, 2048, 8, 16, 1 << 16) if GPU else (3, 400, 17, 3, 4, 300)
    scores = bf16_values(rng, (R, W))
    scores[1] = torch.round(scores[1] * 2)
    lens = torch.from_numpy(rng.integers(1, W + 1, R))
    lens[0] = W
    scores = scores.masked_fill(torch.arange(W)[None, :] >= lens[:, None], float("-inf"))
    q, k = bf16_values(rng, (T, H, 128 if GPU else 16)), bf16_values(rng, (S_, 128 if GPU else 16))
    w = bf16_values(rng, (T, H), 0.05)
    vis = torch.full((T,), S_)
    pool = torch.from_numpy(np.repeat(rng.random((T, -(-S_ // 8))) < (0.25 if GPU else 0.5), 8, axis=1)[:, :S_])
    dev = KI._device()

    def block_list(sc, ln):   # the decode path's pool: the chosen blocks' list, expanded
        blocks = KP._candidate_list(sc.to(dev), ln.int().to(dev), nb, 8)
        return (blocks, *KP._gather_blocks(blocks, ln.int().to(dev), 8))
    return {
        "candidate_blocks": (KP.candidate_blocks, (scores, lens, nb, 8)),
        "reindex_topk": (KP.reindex_topk, (q, k, w, vis, pool, 512 if GPU else 24)),
        "decode_block_list": (block_list, (scores, lens)),
    }


def path_cases(rng):
    T = 1 << 14 if GPU else 24
    x = bf16_values(rng, (T, 512), 3.0)
    positions = torch.from_numpy(rng.integers(0, 1 << 20, T))
    freqs = torch.from_numpy(rng.random(32).astype(np.float32))
    return {"rope_quantize": (lambda *a: tuple(t for fmt in ("fp4_e8m0", "fp4_e4m3", "fp8_e8m0_32")
                                                for t in KPATH.rope_quantize(*a, fmt)), (x, positions, freqs))}


def attn_cases(rng):
    # GPU: a prefill's tokens over many programs, 2048 entries (32 blocks of 64); interpreter: 3 blocks
    T, H, D, N, K = (256, 64, 512, 8192, 2048) if GPU else (2, 4, 64, 200, 130)
    q, kv = bf16_values(rng, (T, H, D)), bf16_values(rng, (N, D))
    sink = torch.from_numpy(rng.standard_normal(H).astype(np.float32))
    idx = torch.from_numpy(rng.integers(-1, N, (T, K)))   # −1 entries and repeated rows among them
    return {"sparse_attention": (lambda *a: KA.sparse_attention(*a, model="v4-flash"),
                                 (q, kv, sink, idx, D ** -0.5))}


def all_cases():
    rng = np.random.default_rng(2026)
    return {**quant_cases(rng), **indexer_cases(rng), **pool_cases(rng), **path_cases(rng), **attn_cases(rng)}


def exported_ops() -> set:
    names = set()
    for m in pkgutil.iter_modules(kernels.__path__):
        names |= set(getattr(importlib.import_module(f"{kernels.__name__}.{m.name}"), "__all__", ()))
    return names - HOST_SIDE


def bits(out) -> list:
    outs = out if isinstance(out, tuple) else (out,)
    views = {torch.float32: torch.int32, torch.bool: torch.uint8}
    return [o.view(views.get(o.dtype, o.dtype)).clone() for o in outs]


def test_every_exported_op_has_a_case():
    missing = exported_ops() - set(all_cases())
    assert not missing, f"kernel ops without a determinism case: {sorted(missing)}"


@pytest.fixture(scope="module")
def cases():
    return all_cases()


def assert_same_bits_every_run(name, fn, args, runs):
    first = bits(fn(*args))
    for run in range(1, runs):
        again = bits(fn(*args))
        for i, (a, b) in enumerate(zip(first, again)):
            diff = int((a != b).sum())
            assert diff == 0, f"{name}: output {i} differs in {diff} of {a.numel()} elements at run {run + 1}"


@pytest.mark.parametrize("name", sorted(exported_ops() | DEVICE_PATHS))
def test_same_bits_every_run(name, cases):
    fn, args = cases[name]
    assert_same_bits_every_run(name, fn, args, RUNS)


def test_a_changing_bit_is_caught():
    """The check sees one flipped sign of zero in the second output of the third run."""
    calls = []

    def flaky():
        calls.append(1)
        z = torch.zeros(8)
        z[5] = -0.0 if len(calls) == 3 else 0.0
        return torch.ones(3, dtype=torch.int64), z
    with pytest.raises(AssertionError, match="output 1 differs in 1 of 8 elements at run 3"):
        assert_same_bits_every_run("flaky", flaky, (), 4)
