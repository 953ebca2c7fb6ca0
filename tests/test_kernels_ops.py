"""The device API as torch custom operators (dsv4spec.kernels.ops, namespace dsv4spec): one per
device function; each passes torch.library.opcheck (schema, fake implementation against the real
outputs' metadata, autograd registration, AOT dispatch with dynamic shapes); a decode step calling
them compiles with torch.compile(fullgraph=True) and gives the direct calls' bits.  Under the
interpreter the operators run on CPU tensors (and compile with the aot_eager backend); on a GPU
the compiled step runs through inductor, without a host synchronization."""
import pytest
import torch
from torch.library import opcheck

from dsv4spec import impl
from dsv4spec.kernels import INTERPRET
from dsv4spec.kernels import device as D
from dsv4spec.kernels import ops  # noqa: F401 -- registers torch.ops.dsv4spec

DEV = torch.device("cpu" if INTERPRET else "cuda")
OPS = torch.ops.dsv4spec


def values(*shape, seed=0, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


def decode_inputs(T=2, H=4, S=300, seed=1):
    q = values(T, H, 128, seed=seed)
    k = values(S, 128, seed=seed + 1)
    w = values(T, H, seed=seed + 2, scale=0.1)
    qp, qs = (t.to(DEV) for t in impl.fp4_e8m0_quantize(q.float().cpu()))
    kp, ks = (t.to(DEV) for t in impl.fp4_e8m0_quantize(k.float().cpu()))
    visible = torch.tensor([S - 5, S], dtype=torch.int32, device=DEV)[:T]
    return dict(q=q, k=k, w=w, qp=qp, qs=qs, kp=kp, ks=ks, visible=visible)


def calls():
    """(operator name, its arguments) for every operator, on small inputs."""
    d = decode_inputs()
    x = values(3, 64, seed=4, scale=50.0)
    p4, s4 = D.fp4_e4m3_quantize(x)
    p8, s8 = D.fp4_e8m0_quantize(x)
    q, s = D.fp8_quantize(x, 32)
    scores = D.index_scores_fp4(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])
    blocks = D.candidate_list(scores, d["visible"], 16, 8)
    idx, count = D.pool_positions(blocks, d["visible"], 8)
    return [("fp4_e4m3_quantize", (x,)), ("fp4_e8m0_quantize", (x,)),
            ("fp4_e4m3_dequantize", (p4, s4, torch.bfloat16)), ("fp4_e8m0_dequantize", (p8, s8)),
            ("fp8_quantize", (x, 32)), ("fp8_dequantize", (q, s, 32)), ("fp8_qdq", (x, 64)),
            ("index_scores_fp4", (d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])),
            ("index_scores", (d["q"], d["k"], d["w"], d["visible"])),
            ("index_topk", (scores, d["visible"], 20, "score")),
            ("candidate_list", (scores, d["visible"], 16, 8)), ("pool_positions", (blocks, d["visible"], 8)),
            ("reindex_topk", (d["q"], d["k"], d["w"], idx, count, 24))]


def test_every_device_function_is_an_operator():
    public = {n for n in dir(D) if not n.startswith("_") and callable(getattr(D, n))
              and getattr(getattr(D, n), "__module__", "") == D.__name__}
    assert {name for name, _ in calls()} == public
    assert all(hasattr(OPS, name) for name in public)


@pytest.mark.parametrize("name, args", calls(), ids=[name for name, _ in calls()])
def test_operator_passes_opcheck_and_gives_the_direct_bits(name, args):
    op = getattr(OPS, name).default
    opcheck(op, args)
    direct = getattr(D, name)(*args) if name != "reindex_topk" else D.reindex_topk(*args[:3], args[3:5], args[5])
    got = op(*args)
    for a, b in zip(got if isinstance(got, (tuple, list)) else [got],
                    direct if isinstance(direct, tuple) else [direct]):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_opcheck_has_teeth():
    """A fake implementation that gives the wrong dtype fails opcheck: the test above can fail."""
    op = torch.library.custom_op("dsv4spec_teeth::qdq", lambda x, block: D.fp8_qdq(x, block), mutates_args=(),
                                 schema="(Tensor x, int block) -> Tensor")
    op.register_fake(lambda x, block: x.new_empty(x.shape, dtype=torch.bfloat16))
    with pytest.raises(Exception, match="dtype|mismatch"):
        opcheck(op, (values(2, 64), 32), test_utils=("test_faketensor",))


def decode_step(d, topk_blocks=16, topk=24):
    """Layer 20's FP4 scores and candidate list, the pool, two re-index layers; then the FP4 index
    K of the step's query requantized (a codec in the same graph)."""
    scores = OPS.index_scores_fp4(d["qp"], d["qs"], d["kp"], d["ks"], d["w"], d["visible"])
    blocks = OPS.candidate_list(scores, d["visible"], topk_blocks, 8)
    idx, count = OPS.pool_positions(blocks, d["visible"], 8)
    picks = [OPS.reindex_topk(q, d["k"], d["w"], idx, count, topk) for q in (d["q"], -d["q"])]
    packed, scales = OPS.fp4_e8m0_quantize(d["q"])
    return scores, blocks, idx, count, picks[0], picks[1], packed, scales


def test_a_decode_step_compiles_with_fullgraph_and_gives_the_eager_bits():
    """Traced whole (fullgraph) and run: the direct calls' bits; on a GPU through inductor, and a
    second call of the compiled step with torch's sync debug mode set to error (no host read-back)."""
    d = decode_inputs(S=300 if INTERPRET else 5000)
    eager = decode_step(d)
    torch._dynamo.reset()
    compiled = torch.compile(decode_step, fullgraph=True, backend="aot_eager" if INTERPRET else "inductor")
    got = compiled(d)
    assert len(got) == len(eager) and all(torch.equal(a, b) for a, b in zip(got, eager))
    if not INTERPRET:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            again = compiled(d)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(again, eager))
