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


def _dots(q, k):
    """The MMA: E4M3 q [..., H, D] · k [..., S, D] -> [..., H, S], exact (float64 of the codes)."""
    return q.double() @ k.double().transpose(-1, -2)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    """csrc/apis/attention.hpp fp8_mqa_logits: Σ_h weights·ReLU(q·k)·k_scale in fp32 over each query's keys
    [start, end), −inf elsewhere when clean_logits; computed in float64, rounded once to fp32."""
    k, k_scale = kv
    assert q.dtype == k.dtype == torch.float8_e4m3fn and k_scale.dtype == weights.dtype == torch.float32
    assert q.shape[-1] == k.shape[-1] == 128 and q.shape[1] in (32, 64) and clean_logits
    assert max_seqlen_k == 0, "Assertion error (csrc/apis/attention.hpp:177): not clean_logits"
    dots = _dots(q, k).clamp(min=0) * k_scale.double()
    logits = (dots * weights.double()[..., None]).sum(1).float()
    s = torch.arange(k.shape[0])
    inside = (s >= cu_seq_len_k_start[:, None]) & (s < cu_seq_len_k_end[:, None])
    return torch.where(inside, logits, -torch.inf)


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    assert context_lens.dim() == 2 and context_lens.dtype == torch.int32
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=False, indices=None):
    """csrc/apis/attention.hpp fp8_paged_mqa_logits on SM90 (next_n 1): each page of block_kv entries holds
    their E4M3 codes, then their fp32 scales (tests/test_attention.py kv_cache_cast_to_fp8)."""
    b, next_n, h, d = q.shape
    pages, block_kv, _, width = kv_cache.shape
    assert q.dtype == torch.float8_e4m3fn and kv_cache.dtype == torch.uint8 and width == d + 4 and next_n == 1
    assert context_lens.shape == (b, 1) and not clean_logits
    raw = kv_cache.reshape(pages, -1)
    codes = raw[:, :block_kv * d].contiguous().view(torch.float8_e4m3fn).view(pages, block_kv, d)
    scales = raw[:, block_kv * d:].contiguous().view(torch.float32).view(pages, block_kv)
    pages_of = block_table.long()
    dots = _dots(q[:, 0], codes[pages_of].reshape(b, -1, d)).clamp(min=0) * scales.double()[pages_of].reshape(b, 1, -1)
    logits = (dots * weights.double()[..., None]).sum(1).float()
    return torch.cat([logits, torch.full((b, max(0, max_context_len - logits.shape[1])), float("nan"))], 1)
