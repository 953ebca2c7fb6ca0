"""The sparse-attention kernel against impl (run under TRITON_INTERPRET=1 without a GPU): inside
spec.attn's interval on the probes and at V4.1's decode shape, and in the interpreter bit for bit
with impl and with its own unsplit output channels; every ATTN rule it implements passing; an
sm_90 compile (no GPU needed) at the launch configurations."""
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


@pytest.mark.parametrize("rule_id", [r for r in sorted(RULES) if r.startswith("ATTN.")
                                     and r not in ("ATTN.HEADS", "ATTN.SCALE", "ATTN.Q_NORM", "ATTN.DEROTATE",
                                                   "ATTN.LAYER")])
def test_kernel_passes_the_rule(rule_id):
    assert run_rule(rule_id, Target(kernels, "kernels")).status == PASS


def test_bad_head_dim_is_named():
    with pytest.raises(ValueError, match="power of two"):
        kernels.sparse_attention(torch.zeros(1, 2, 24), torch.zeros(4, 24), torch.zeros(2), torch.tensor([[0]]), 0.1,
                                 model="v4-flash")


COMPILE_SM90 = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from dsv4spec.kernels import attn as K
    assert not K.INTERPRETED
    for D, dv in ((512, 512), (512, 128), (512, 64), (64, 64)):
        cfg = K.config(D, dv)
        warps = cfg.pop("num_warps")
        signature = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "sink_ptr": "*fp32", "idx_ptr": "*i32",
                     "out_ptr": "*bf16", "H": "i32", "K": "i32", "scale": "fp32", "init": "fp32",
                     **{name: "constexpr" for name in cfg}}
        src = triton.compiler.ASTSource(fn=K._sparse_attention_kernel, signature=signature, constexprs=cfg)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        shared = compiled.metadata.shared
        assert len(compiled.asm["cubin"]) > 0 and shared <= 232448, (D, dv, shared)
        print("compiled", D, dv, shared, compiled.n_spills if hasattr(compiled, "n_spills") else "")
""")


def test_kernel_compiles_for_sm90_at_its_launch_configurations():
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("compiled") == 4, done.stdout
