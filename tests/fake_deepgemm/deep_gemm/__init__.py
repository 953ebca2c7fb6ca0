"""A CPU stand-in for DeepGEMM (tests only): fp8_gemm_nt with the library's signature
(csrc/apis/gemm.hpp, fp8_fp4_gemm_nt's arguments) on the SM90 recipe (fp32 scales, 1×128 blocks of
a, 128×128 of b), computed exactly in float64 and rounded once to BF16 into d."""
import torch

__version__ = "fake"
DSV4SPEC_CPU_STANDIN = True


def fp8_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False):
    (a, sfa), (b, sfb) = a, b
    assert a.dtype == b.dtype == torch.float8_e4m3fn and sfa.dtype == sfb.dtype == torch.float32
    assert d.dtype == torch.bfloat16 and c is None
    m, k = a.shape
    n = b.shape[0]
    a_blocks = a.double().reshape(m, k // 128, 128) * sfa.double()[..., None]
    b_rows = sfb.double().repeat_interleave(128, dim=0)[:n]
    b_blocks = b.double().reshape(n, k // 128, 128) * b_rows[..., None]
    d.copy_(torch.einsum("mkj,nkj->mn", a_blocks, b_blocks).float().to(torch.bfloat16))
