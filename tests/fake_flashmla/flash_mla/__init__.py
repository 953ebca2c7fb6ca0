"""A CPU stand-in for FlashMLA's Python interface (tests only): flash_mla_sparse_fwd with the
library's signature (FlashMLA-api, flash_mla_sparse_fwd) and the checks its csrc/api/sparse_fwd.h
makes, computing with dsv4spec.impl.attn.sparse_attention."""
import torch

from dsv4spec.impl.attn import sparse_attention

__version__ = "fake"
DSV4SPEC_CPU_STANDIN = True


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    s_q, h_q, d_qk = q.shape
    assert q.dtype == kv.dtype == torch.bfloat16 and indices.dtype == torch.int32, "dtypes"
    assert d_qk in (512, 576) and d_v == 512 and h_q in (64, 128), (d_qk, d_v, h_q)
    assert kv.shape[1] == 1 and indices.shape[:2] == (s_q, 1), (kv.shape, indices.shape)
    assert topk_length is None
    sink = attn_sink if attn_sink is not None else torch.full((h_q,), -torch.inf)
    out = sparse_attention(q.float(), kv[:, 0].float(), sink, indices[:, 0].long(), sm_scale, model="v4-flash")
    lse = torch.zeros(s_q, h_q)
    return out[..., :d_v].to(torch.bfloat16), lse, lse


def get_mla_metadata(*args, **kwargs):
    return object(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                           indices=None, attn_sink=None, *rest):
    """The sparse FP8 decode (FlashMLA-api, flash_mla_with_kvcache): the pages read back from the strided
    k_cache view by the suite's own inverse of FlashMLA's page layout, then impl's attention."""
    from dsv4spec.impl.attn import sparse_attention_cache
    from dsv4spec.spec import layout
    b, s_q, h_q, d_qk = q.shape
    assert is_fp8_kvcache and indices is not None and not causal and head_dim_v == 512 and s_q == 1
    assert q.dtype == torch.bfloat16 and k_cache.dtype == torch.float8_e4m3fn and h_q in (64, 128)
    assert indices.dtype == torch.int32 and indices.shape[:2] == (b, 1) and indices.shape[-1] % 64 == 0
    kind = {512: "v4_main_kv", 576: "v32_mla_kv"}[d_qk]
    pages, page, _, entry = k_cache.shape
    assert page == layout.PAGE and entry == layout.layout(kind).nbytes, (k_cache.shape, kind)
    raw = k_cache.view(torch.uint8)
    whole = torch.as_strided(raw, (pages, layout.page_bytes(kind)), (raw.stride(0), 1)).clone()
    sink = attn_sink if attn_sink is not None else torch.full((h_q,), -torch.inf)
    out = sparse_attention_cache(q[:, 0].float(), whole, f"{kind}/flashmla_paged", sink, indices[:, 0].long(),
                                 softmax_scale, model="v4-flash")
    return out[:, None].to(torch.bfloat16), torch.zeros(b, h_q, 1)
