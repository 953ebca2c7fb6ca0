"""The sparse-attention kernel against impl (run under TRITON_INTERPRET=1 without a GPU): inside
spec.attn's interval on the probes and at V4.1's decode shape, and in the interpreter bit for bit
with impl, with its own unsplit output channels and across its launch paths (serial, wide,
split-K with the exact running max, its fused combine); every ATTN rule it implements passing on
every path; an sm_90 compile (no GPU needed) at the launch configurations."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
import dsv4spec.kernels as kernels
from dsv4spec.kernels import attn as kattn
from dsv4spec.properties import attn as checks
from dsv4spec.properties.suite import PASS, run_rule
from dsv4spec.properties.target import Target
from dsv4spec.spec import RULES
from dsv4spec.spec import attn as spec
from dsv4spec.spec.models import profile


@pytest.mark.parametrize("model, kw", [
    ("v4-flash", dict()), ("v4-flash", dict(max_at=100, duplicates=7)),
    ("v4.1-flash", dict(leading=64)), ("v4.1-flash", dict(invalid=0.5, sink="far_above")),
])
def test_kernel_equals_impl_on_the_probes(model, kw):
    case = checks.make_case(11, model, 3, 20, 32, 130, **kw)
    got = checks.run(kernels, case)
    if kattn.INTERPRETED:        # the same fp32 exp and division as impl: the same bits
        assert np.array_equal(got, checks.run(impl, case), equal_nan=True)
    assert spec.admitted(got, *case.bounds("blocks64")).all()


def v41_decode_case(seed=0, filled=40):
    """One decode token at V4.1's shape: 64 heads of 512, a window ring of 128 listed oldest first
    (−1 while it fills) then 512 compressed entries."""
    m = profile("v4.1-flash")
    rng = np.random.default_rng(seed)
    window = np.arange(filled + 1, filled + 1 + m.window) % m.window
    window = np.where(window > filled, -1, window)
    compressed = m.window + rng.permutation(2048)[:m.index_topk]
    indices = np.concatenate([window, compressed])[None]
    q = spec.round_bf16(rng.standard_normal((1, m.n_heads, m.head_dim)))
    kv = spec.round_bf16(rng.standard_normal((m.window + 2048, m.head_dim)))
    sink = rng.standard_normal(m.n_heads).astype(np.float32)
    return q, kv, sink, indices, spec.softmax_scale(m)


def test_v41_decode_shape_within_the_tolerance():
    q, kv, sink, indices, scale = v41_decode_case()
    args = (torch.tensor(q, dtype=torch.float32), torch.tensor(kv, dtype=torch.float32), torch.tensor(sink),
            torch.tensor(indices), scale)
    got = kernels.sparse_attention(*args, model="v4.1-flash").numpy()
    lo, hi = spec.bounds(q, kv, sink, indices, scale, spec.V41_INIT)
    assert spec.admitted(got, lo, hi).all()          # (random dots: not bit-equal to impl's order)
    assert spec.admitted(impl.sparse_attention(*args, model="v4.1-flash").numpy(), lo, hi).all()


def test_output_channel_split_equals_the_unsplit_kernel():
    q, kv, sink, indices, scale = v41_decode_case(1, filled=127)
    dev = [torch.tensor(x) for x in (q, kv)]
    args = tuple(x.to(kattn._device()) for x in (dev[0].bfloat16(), dev[1].bfloat16(), torch.tensor(sink),
                                                 torch.tensor(indices, dtype=torch.int32)))
    whole = kattn.launch(*args, scale, spec.V41_INIT)
    split = kattn.launch(*args, scale, spec.V41_INIT, block_dv=128)
    if kattn.INTERPRETED:
        assert torch.equal(whole, split)
    lo, hi = spec.bounds(q, kv, sink, indices, scale, spec.V41_INIT)
    assert spec.admitted(split.float().cpu().numpy(), lo, hi).all()


PATH_CASES = [("wide", dict()), ("wide", dict(block_h=64, block_dv=32)), ("split", dict()),
              ("split", dict(chunk=3, block_h=32, scores_block_h=64)), ("split_fused", dict()),
              ("split_fused", dict(chunk=2, block_dv=64))]


def _device_args(q, kv, sink, indices):
    return tuple(torch.tensor(x).to(kattn._device()) for x in (q, kv, sink)), torch.tensor(indices, dtype=torch.int32)


def _leading_invalid_case(seed):
    """V4.1's decode list at a small shape: 2 tokens, 20 heads, 70 leading −1 (a whole first block),
    the max of one token in a later block, the second token's tail −1, K = 200 (a partial last block);
    multiples of 1/8 below 1/2, so that every dot is exact in fp32 in any order or tile shape."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-4, 5, (2, 20, 64)) / 8.0
    kv = rng.integers(-4, 5, (300, 64)) / 8.0
    sink = rng.standard_normal(20).astype(np.float32)
    indices = rng.integers(0, 300, (2, 200))
    indices[:, :70] = -1
    indices[1, 150:] = -1
    q[0, :, :] *= 0.25
    kv[indices[0, 170]] *= 4.0                    # token 0's largest scores in block 2
    return q, kv, sink, indices


@pytest.mark.parametrize("path, kw", PATH_CASES)
def test_launch_paths_equal_the_serial_kernel(path, kw):
    """The official maxima on every path: bit for bit the serial kernel in the interpreter (the
    rescales of these lists are exact), inside the interval on the GPU; V4's leading −1 block
    NaN on every path, as the official kernel."""
    q, kv, sink, indices = _leading_invalid_case(3)
    (dq, dkv, dsink), didx = _device_args(q, kv, sink, indices)
    dq, dkv = dq.bfloat16(), dkv.bfloat16()
    for init in (spec.V41_INIT, float("-inf")):
        serial = kattn.launch(dq, dkv, dsink, didx.to(dq.device), 0.125, init, path="serial")
        got = kattn.launch(dq, dkv, dsink, didx.to(dq.device), 0.125, init, path=path, **kw)
        if kattn.INTERPRETED:
            assert torch.equal(got.isnan(), serial.isnan()) and torch.equal(got.nan_to_num(), serial.nan_to_num())
        if init == spec.V41_INIT:
            lo, hi = spec.bounds(q, kv, sink, indices, 0.125, init)
            assert spec.admitted(got.float().cpu().numpy(), lo, hi).all()
        else:
            assert got.isnan().all()
    if path == "split_fused":
        assert int(kattn._counters(1, dq.device).abs().sum()) == 0        # every counter reset


def test_outgrown_counters_stay_alive():
    """A call needing more arrival counters replaces the buffer; the old one is kept, since a CUDA
    graph captured before may still read it at replay (freed, it could be handed to another tensor)."""
    device = torch.device("cpu") if kattn.INTERPRETED else torch.device("cuda")
    small = kattn._counters(1, device)
    big = kattn._counters(small.numel() + 1, device)
    assert big.numel() > small.numel() and int(big.abs().sum()) == 0
    assert any(kept is small for kept in kattn._COUNTERS_OUTGROWN)
    assert kattn._counters(1, device) is big


def test_choose_path_and_bad_paths():
    assert kattn.choose_path(1, 64, 512, 640) == ("split_fused" if kattn.SPLIT_MAX_TOKENS >= 1 else "serial")
    assert kattn.choose_path(1024, 64, 512, 640) == "serial"
    q, kv = torch.zeros(1, 2, 64).bfloat16(), torch.zeros(4, 64).bfloat16()
    with pytest.raises(ValueError, match="path must be one of"):
        kattn.launch(q, kv, torch.zeros(2), torch.zeros(1, 1, dtype=torch.int32), 0.1, 0.0, path="other")
    with pytest.raises(ValueError, match="block_dv must be a power of two"):
        kattn.launch(q, kv, torch.zeros(2), torch.zeros(1, 1, dtype=torch.int32), 0.1, 0.0, block_dv=128)


ATTN_KERNEL_RULES = [r for r in sorted(RULES) if r.startswith("ATTN.")
                     and r not in ("ATTN.HEADS", "ATTN.SCALE", "ATTN.Q_NORM", "ATTN.DEROTATE", "ATTN.LAYER")]


@pytest.mark.parametrize("rule_id", ATTN_KERNEL_RULES)
def test_kernel_passes_the_rule(rule_id):
    assert run_rule(rule_id, Target(kernels, "kernels")).status == PASS


@pytest.mark.parametrize("path", ["serial", "wide", "split"])
@pytest.mark.parametrize("rule_id", ["ATTN.PROB.ORDER", "ATTN.INIT", "ATTN.RESCALE", "ATTN.GATHER"])
def test_every_path_passes_the_order_rules(rule_id, path, monkeypatch):
    """The default path (split_fused at the checks' few tokens) runs every rule above; the others
    the rules a wrong max or a lost block would break."""
    monkeypatch.setattr(kattn, "FORCE_PATH", path)
    result = run_rule(rule_id, Target(kernels, "kernels"))
    assert result.status == PASS, result.detail


def test_bad_head_dim_is_named():
    with pytest.raises(ValueError, match="power of two"):
        kernels.sparse_attention(torch.zeros(1, 2, 24), torch.zeros(4, 24), torch.zeros(2), torch.tensor([[0]]), 0.1,
                                 model="v4-flash")


COMPILE_SM90 = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from dsv4spec.kernels import attn as K
    assert not K.INTERPRETED
    common = {"kv_ptr": "*bf16", "idx_ptr": "*i32", "H": "i32", "K": "i32"}
    serial = {"q_ptr": "*bf16", "sink_ptr": "*fp32", "out_ptr": "*bf16", "scale": "fp32", "init": "fp32", **common}
    scores = {"q_ptr": "*bf16", "s_ptr": "*fp32", "bmax_ptr": "*fp32", "NB": "i32", "scale": "fp32", **common}
    partials = {"part_ptr": "*fp32", "psum_ptr": "*fp32", "pmax_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16"}
    chunk = {"s_ptr": "*fp32", "bmax_ptr": "*fp32", **partials, "count_ptr": "*i32", "NB": "i32", "NC": "i32",
             "init": "fp32", **common}
    combine = {**partials, "H": "i32", "NC": "i32"}
    builds = [(K._sparse_attention_kernel, serial, K.config(D, dv, bh))
              for D, dv, bh in ((512, 512, 16), (512, 128, 16), (512, 64, 16), (64, 64, 16), (512, 512, 32),
                                (512, 128, 64))]
    builds += [(K._attn_scores_kernel, scores, K.scores_config(512, bh)) for bh in (16, 64)]
    builds += [(K._chunk_kernel, chunk, K.chunk_config(512, dv, c, fused)) for dv, c, fused in
               ((128, 1, True), (256, 2, True), (256, 5, True), (128, 1, False))]
    builds += [(K._combine_kernel, combine, K.combine_config(512, 128))]
    for fn, sig, cfg in builds:
        cfg = dict(cfg)
        warps = cfg.pop("num_warps")
        signature = {name: sig[name] if name in sig else "constexpr" for name in fn.arg_names}
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=cfg)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        shared = compiled.metadata.shared
        assert len(compiled.asm["cubin"]) > 0 and shared <= 232448, (fn.__name__, cfg, shared)
        print("compiled", fn.__name__, cfg, shared)
""")
BUILDS = 13


def test_kernel_compiles_for_sm90_at_its_launch_configurations():
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("compiled") == BUILDS, done.stdout
