"""The fused RoPE-then-quantize kernel against impl, bit for bit (interpreter on CPU, the real thing
on a GPU): random rows over wide magnitudes and positions up to 2^20, the quant family's edge
blocks inside the rotated slice, every format, input validation, and an sm_90 compile with fp
fusion off (no GPU needed); determinism is in tests/test_kernels_determinism.py.  No timing here."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dsv4spec import impl
from dsv4spec.kernels import path as K
from dsv4spec.spec import indexer as spec_indexer

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

FORMATS = {"fp4_e8m0": 128, "fp4_e4m3": 512, "fp8_e8m0_32": 512}
TIES = [6, .75, 1.75, 3.5, .25, 1.25, 2.5, 5, -.75, -1.75, -3.5, -.25, -1.25, -2.5, -5, -0.0]


def rows(seed: int, tokens: int, dim: int) -> torch.Tensor:
    """BF16 rows over 2^-40..2^40, with E2M1 ties, zero blocks and ±0 planted in both slices."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, dim)) * 2.0 ** rng.integers(-40, 40, (tokens, dim // 16)).repeat(16, 1)
    x[0, -16:] = TIES
    x[1, -32:] = 0.0
    x[2, :16] = TIES
    x[3, -64:] = -0.0
    return torch.from_numpy(spec_indexer.round_bf16(x)).float()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("model, layer", [("v4.1-flash", 20), ("v4-flash", 0)])
def test_fused_kernel_matches_impl_bit_for_bit(fmt, model, layer):
    x = rows(7, 33, FORMATS[fmt])
    positions = torch.from_numpy(np.random.default_rng(8).integers(0, 2 ** 20, 33))
    positions[:3] = torch.tensor([0, 1, 65535])
    freqs = impl.rope_freqs(model, layer)
    got, want = K.rope_quantize(x, positions, freqs, fmt), impl.rope_quantize(x, positions, freqs, fmt)
    for name, a, b in zip(("payload", "scales"), got, want):
        assert a.dtype == torch.uint8 and torch.equal(a, b), f"{fmt} {name}: {(a != b).sum()} bytes differ"


@pytest.mark.parametrize("call, match", [
    (lambda: K.rope_quantize(torch.zeros(2, 128), torch.zeros(2, dtype=torch.int64), torch.zeros(32), "fp4"),
     "fmt must be one of"),
    (lambda: K.rope_quantize(torch.zeros(2, 128), torch.zeros(3, dtype=torch.int64), torch.zeros(32), "fp4_e8m0"),
     "one position per token"),
    (lambda: K.rope_quantize(torch.zeros(2, 120), torch.zeros(2, dtype=torch.int64), torch.zeros(32), "fp4_e8m0"),
     "a multiple of 32"),
    (lambda: K.rope_quantize(torch.zeros(2, 128), torch.tensor([0, -3]), torch.zeros(32), "fp4_e8m0"),
     "positions must be ≥ 0"),
    (lambda: K.rope_quantize(torch.full((2, 128), 0.1), torch.zeros(2, dtype=torch.int64), torch.zeros(32), "fp4_e8m0"),
     "BF16-representable"),
])
def test_bad_input_is_rejected_with_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


COMPILE_SM90 = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from dsv4spec.kernels import path as K
    assert not K.INTERPRETED
    for fmt, (code, block) in K._FORMATS.items():
        constexprs = dict(D=512, RD=64, FMT=code, BLOCK=block, ROWS=4096 // block)
        signature = {"x_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8",
                     "nblocks": "i32", **{name: "constexpr" for name in constexprs}}
        src = triton.compiler.ASTSource(fn=K._rope_quantize_kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4, "enable_fp_fusion": False})
        assert len(compiled.asm["cubin"]) > 0
        assert "fma.rn.f32" not in compiled.asm["ptx"], "a·cos − b·sin must not be fused"
        print("compiled", fmt)
""")


def test_fused_kernel_compiles_for_sm90_without_fma():
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("compiled") == 3
