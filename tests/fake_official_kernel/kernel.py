"""A stand-in for the official V4 inference/kernel.py with the same four function signatures, in CPU
torch (no TileLang), for testing the official-kernels target's wiring.  It mimics the initial V4
revision: the in-place act_quant casts clamp(x/s) through BF16, not FP8."""
import torch

from dsv4spec.official import quant as Q


def _scales(bytes_, scale_dtype):
    return bytes_.view(torch.float8_e8m0fnu) if scale_dtype == torch.float8_e8m0fnu else Q.e8m0_decode(bytes_)


def act_quant(x, block_size=128, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
    assert x.dtype == torch.bfloat16 and scale_fmt == "ue8m0"
    q, s = Q.fp8_quantize(x.contiguous(), block_size)
    if inplace:
        scale = Q.e8m0_decode(s).repeat_interleave(block_size, dim=-1)
        ratio = torch.clamp(x.float() / scale, -448.0, 448.0)
        x.copy_((ratio.to(torch.bfloat16).float() * scale).to(torch.bfloat16))
        return x
    return q.view(torch.float8_e4m3fn), _scales(s, scale_dtype)


def fp4_act_quant(x, block_size=32, inplace=False):
    assert x.dtype == torch.bfloat16 and block_size == 32 and not inplace
    packed, s = Q.fp4_e8m0_quantize(x.contiguous())
    return packed.view(torch.float4_e2m1fn_x2), s.view(torch.float8_e8m0fnu)


def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
    """Per 128-column block of K: the fp32 product of the E4M3 values times the two scales, summed."""
    def scales(t):
        return t.float()                        # float8_e8m0fnu widens exactly, as fp32 does
    sa, sb = scales(a_s), scales(b_s)
    af, bf = a.float(), b.float()
    c = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    for k in range(0, a.shape[1], 128):
        part = af[:, k:k + 128] @ bf[:, k:k + 128].T
        c += part * sa[:, k // 128, None] * sb[:, k // 128].repeat_interleave(128)[None, :b.shape[0]]
    return c.to(torch.get_default_dtype())


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """fp32: softmax over the gathered rows (−1 skipped) with the sink in the denominator."""
    b, s, h, d = q.shape
    idx = topk_idxs.long()
    rows = kv.float()[torch.arange(b)[:, None, None], idx.clamp(min=0)]            # [b, s, k, d]
    scores = torch.einsum("bshd,bskd->bshk", q.float(), rows) * softmax_scale
    scores = scores.masked_fill((idx < 0)[:, :, None, :], float("-inf"))
    top = torch.maximum(scores.amax(-1, keepdim=True), attn_sink[None, None, :, None])
    p = torch.exp(scores - top)
    p = p / (p.sum(-1, keepdim=True) + torch.exp(attn_sink[None, None, :, None] - top))
    return torch.einsum("bshk,bskd->bshd", p, rows).to(q.dtype)
