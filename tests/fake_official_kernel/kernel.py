"""A stand-in for the official V4 inference/kernel.py with the same function signatures, in CPU
torch (no TileLang), for testing the official-kernels target's wiring.  It mimics the initial V4
revision: the in-place act_quant casts clamp(x/s) through BF16, not FP8."""
import torch

from dsv4spec.official import attn as official_attn
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
    """The official computation (dsv4spec.official.attn, V4: running max from −inf), refusing the
    sizes the TileLang kernel does not compile as it does: head dims other than 512 ("No valid warp
    partition"), heads not a multiple of 16 once the launcher has padded fewer than 16, lists not a
    multiple of 64."""
    b, s, h, d = q.shape
    if d != 512 or (h > 16 and h % 16) or topk_idxs.shape[-1] % 64:
        raise RuntimeError(f"No valid warp partition (stand-in): h={h} d={d} topk={topk_idxs.shape[-1]}")
    return torch.stack([official_attn.sparse_attention(q[i].float(), kv[i].float(), attn_sink, topk_idxs[i],
                                                       softmax_scale, model="v4-flash") for i in range(b)]).to(q.dtype)
