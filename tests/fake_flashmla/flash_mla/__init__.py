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
