import torch
from dsv4spec import impl
from dsv4spec.spec import attn as spec
from dsv4spec.spec.models import profile
NAME = "flashmla-decode-emulation"
from dsv4spec.production import V4
MODELS = V4 + ("v3.2",)
SHAPES = {"sparse_attention": {"D": (512,), "H": (64, 128), "K": 64}}
def _flashmla_decode_splits(q, kv, sink, indices, scale, *, model):
    """FlashMLA's SM90 sparse FP8 decode order as the H100 record shows it (csrc/sm90/decode/sparse_fp8/
    splitkv_mla.cuh at 9241ae3e): each block of 64 of a token's list in a split of its own (num_sm_parts,
    L770), its probabilities rounded to BF16 against that split's running max (scale_softmax L55-80), the
    splits' fp32 partial sums and outputs then combined against the largest max."""
    q, kv, sink, indices, scale = impl.attn.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    T, H, D = q.shape
    init = spec.running_max_init(profile(model))
    parts = []
    for start in range(0, indices.shape[1], 64):
        blk = indices[:, start:start + 64]
        valid = blk != -1
        rows = kv[blk.clamp_min(0)] * valid[..., None]
        s = (torch.einsum("thd,tbd->thb", q, rows) * scale).masked_fill(~valid[:, None, :], float("-inf"))
        m = torch.maximum(torch.full((T, H), init), s.amax(-1))
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        parts.append((torch.einsum("thb,tbd->thd", p.bfloat16().float(), rows), p.sum(-1), m))
    top = torch.stack([m for *_, m in parts]).amax(0)
    weight = [torch.exp(m - top).nan_to_num(0.0) for *_, m in parts]
    acc = sum(o * w[..., None] for (o, _, _), w in zip(parts, weight))
    total = sum(t * w for (_, t, _), w in zip(parts, weight)) + torch.exp(sink[None, :] - top)
    return (acc / total[..., None]).bfloat16().float()



sparse_attention = _flashmla_decode_splits
