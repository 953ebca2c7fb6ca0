"""official.attn: sparse attention, the q rescale and the de-rotation as the official code computes them.

sparse_attn (V4-kernel L277-367; V4.1's kernel as ported, K41:296-403): V4's launcher pads fewer
than 16 heads with zero q and zero sink; per block of 64 list entries the gathered rows (−1 read as
0), fp32 scores of the BF16 operands times the fp32 scale (−inf at −1), the running max (−inf in V4,
−1e30 in V4.1), fp32 exp, the fp32 sum, the probabilities cast to BF16 for the second product,
both accumulators rescaled; then the sink in the denominator, the division and the BF16 output.
Attention.forward: V4 rescales q by rsqrt(q.square().mean(-1) + eps) in BF16 (L498); the output's
RoPE tail is de-rotated with freqs_cis.conj() (V4 L534, V4.1 L781).
"""
from __future__ import annotations

import torch

from ..spec import attn as spec
from ..spec.models import profile
from ..spec.pool import layer_role
from ..spec.quant import FP8_LINEAR_BLOCK
from .path import _rms_norm, index_layer, kv_qdq, window_index
from .quant import fp8_linear, fp8_qdq
from .rope import apply_rotary_emb, freqs_cis, rope_freqs

__all__ = ["sparse_attention", "attention_scale", "attention_q", "attention_output", "attention_layer",
           "row_parallel_reduce"]


def _sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale, init):
    """q [b, m, h, d] BF16, kv [b, n, d] BF16, attn_sink [h] fp32, topk_idxs [b, m, topk] int32."""
    b, m, h, d = q.shape
    topk = topk_idxs.shape[-1]
    scale = torch.tensor(softmax_scale, dtype=torch.float32)
    qf, kvf = q.float(), kv.float()
    acc_o = torch.zeros(b, m, h, d)
    sum_exp = torch.zeros(b, m, h)
    scores_max = torch.full((b, m, h), init, dtype=torch.float32)
    batch = torch.arange(b).view(b, 1, 1)
    for t in range(0, topk, spec.BLOCK):
        idxs = topk_idxs[:, :, t:t + spec.BLOCK].long()
        valid = idxs != -1
        kv_blk = kvf[batch, idxs.clamp_min(0)] * valid.unsqueeze(-1)
        acc_s = torch.einsum("bmhd,bmkd->bmhk", qf, kv_blk)
        acc_s = torch.where(valid.unsqueeze(2), acc_s, -torch.inf) * scale
        scores_max_prev = scores_max
        scores_max = torch.maximum(scores_max_prev, acc_s.amax(dim=-1))
        scores_scale = torch.exp(scores_max_prev - scores_max)
        acc_s = torch.exp(acc_s - scores_max.unsqueeze(-1))
        sum_exp = sum_exp * scores_scale + acc_s.sum(dim=-1)
        acc_s_cast = acc_s.to(torch.bfloat16)
        acc_o = acc_o * scores_scale.unsqueeze(-1) + torch.einsum("bmhk,bmkd->bmhd", acc_s_cast.float(), kv_blk)
    sum_exp = sum_exp + torch.exp(attn_sink.float() - scores_max)
    return (acc_o / sum_exp.unsqueeze(-1)).to(torch.bfloat16)


def sparse_attention(q, kv, sink, indices, scale, *, model: str) -> torch.Tensor:
    m = spec.model_of(model)
    q, kv = q.to(torch.bfloat16)[None], kv.to(torch.bfloat16)[None]
    sink, idx = sink.float(), indices.to(torch.int32)[None]
    h = q.shape[2]
    if model in spec.V4 and h < spec.PAD_HEADS:
        q = torch.cat([q, q.new_zeros(*q.shape[:2], spec.PAD_HEADS - h, q.shape[3])], dim=2)
        sink = torch.cat([sink, sink.new_zeros(spec.PAD_HEADS - h)])
    o = _sparse_attn(q, kv, sink, idx, scale, spec.running_max_init(m))
    return o[0, :, :h].float()


def attention_scale(model: str, layer: int) -> float:
    m = profile(model)
    if not 0 <= layer < len(m.compress_ratios):
        raise ValueError(f"attention_scale: {model} has layers 0..{len(m.compress_ratios) - 1}, got {layer}")
    return float(torch.tensor(m.head_dim ** -0.5, dtype=torch.float32))


def attention_q(q, *, model: str) -> torch.Tensor:
    m = spec.model_of(model)
    q = q.to(torch.bfloat16)
    if model in spec.V4:
        q *= torch.rsqrt(q.square().mean(-1, keepdim=True) + m.norm_eps)
    return q.float()


def attention_output(o, positions, freqs) -> torch.Tensor:
    rd = 2 * freqs.shape[0]
    y = o.to(torch.bfloat16)
    apply_rotary_emb(y[..., -rd:], freqs_cis(positions, freqs.float()).conj())
    return y.float()


def _qdq(x: torch.Tensor, model: str, compressed: bool) -> torch.Tensor:
    """V4: act_quant(kv[..., :-rd], 64) in place (window L506, compressor L372); V4.1: act_quant(kv, 32)
    for the window (L707), fp4_act_quant(latent, 16, E4M3) for compressed entries (L760)."""
    if model in spec.V4:
        x[..., :-64] = fp8_qdq(x[..., :-64].contiguous(), 64).to(torch.bfloat16)
        return x
    return (kv_qdq(x, "fp4_e4m3") if compressed else fp8_qdq(x, 32)).to(torch.bfloat16)


def _linear(x: torch.Tensor, inputs: dict, name: str, model: str) -> torch.Tensor:
    """linear() of a float8_e4m3fn weight: act_quant, then fp8_gemm (V4-model L116-118, V4.1 L196-205)."""
    return fp8_linear(x, inputs[name], inputs[f"{name}_scale"], FP8_LINEAR_BLOCK[model]).to(torch.bfloat16)


def _projections(inputs: dict, m, model: str) -> dict:
    """Attention.forward's q and window KV from x (V4-model L496-497, L502-503; V41-model L705, L770):
    wq_a, wq_b and wkv take the default dtype, float8_e4m3fn (V4-model L457-463, L777)."""
    x = inputs["x"].to(torch.bfloat16)
    out = {"q_latent": _linear(x, inputs, "attn_wq_a", model)}
    out["q_norm"] = _rms_norm(out["q_latent"], inputs["attn_q_norm"], m.norm_eps)
    out["q_attn"] = _linear(out["q_norm"], inputs, "attn_wq_b", model).unflatten(-1, (-1, m.head_dim))
    out["kv_proj"] = _linear(x, inputs, "attn_wkv", model)
    out["kv_normed"] = _rms_norm(out["kv_proj"], inputs["attn_kv_norm"], m.norm_eps)
    return {k: v.float() for k, v in out.items()}


def _output_projections(o: torch.Tensor, inputs: dict, model: str) -> dict:
    """Attention.forward's end (V4-model L537-542, V41-model L785-788): o's head groups times the BF16
    wo_a (L462, V41-model L645-649) by einsum, then wo_b of the default dtype, an FP8 linear (L463, L777;
    V41-model L650)."""
    wo_a = inputs["attn_wo_a"].to(torch.bfloat16)
    groups = o[0].numel() // wo_a.shape[1]
    o = o.to(torch.bfloat16).view(1, o.shape[0], groups, -1)
    o = torch.einsum("bsgd,grd->bsgr", o, wo_a.view(groups, -1, wo_a.shape[1]))[0]
    return {"o_lora": o.float(), "out": _linear(o.flatten(1), inputs, "attn_wo_b", model).float()}


def attention_layer(inputs: dict, *, model: str, layer: int, start_pos: int = 0) -> dict:
    m = spec.model_of(model)
    projected = _projections(inputs, m, model) if "attn_wq_a" in inputs else {}
    inputs = {**inputs, **projected}
    T = inputs["kv_normed"].shape[0]
    if layer_role(m, layer).kind == "reuse":     # V41-model L725-726: the index source's published lists
        window, topk = window_index(T, start_pos), inputs["source_topk"]
        offset = T if start_pos == 0 else m.window            # kv.size(1): the window rows before the entries
        out = {"window_idx": window,
               "indices": torch.cat([window.expand(T, -1), torch.where(topk >= 0, topk + offset, -1)], -1).int()}
    else:
        out = index_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    out.update(projected)
    table = freqs_cis(torch.arange(start_pos, start_pos + T), rope_freqs(model, layer))
    q = inputs["q_attn"].to(torch.bfloat16).clone()
    if model in spec.V4:
        q *= torch.rsqrt(q.square().mean(-1, keepdim=True) + m.norm_eps)
    out["q_rescale"] = q.float()
    apply_rotary_emb(q[..., -64:], table)
    out["q_attn_rot"] = q.float()
    kv = inputs["kv_normed"].to(torch.bfloat16).clone()
    apply_rotary_emb(kv[..., -64:], table)
    out["kv_rot"] = kv.float()
    kv = _qdq(kv, model, False)
    out["kv_window"] = kv.float()
    if start_pos:
        ring = inputs["window_cache"].to(torch.bfloat16).clone()
        ring[start_pos % m.window] = kv[0]
        kv = ring
    ratio = m.ratio(layer)
    if ratio:
        E = (start_pos + T) // ratio
        if start_pos == 0 and (model in spec.V4 or layer in m.kv_source_layers):
            latent = inputs["kv_entries"].to(torch.bfloat16).clone()
            apply_rotary_emb(latent[..., -64:], freqs_cis(torch.arange(E) * ratio, rope_freqs(model, layer)))
            out["cmp_rot"] = latent.float()
            # E = 0 (seqlen < ratio): the compressor returns None and attention goes on over the window
            # (V4-model L360-361, L527); the QDQ of no rows is no rows
            latent = _qdq(latent, model, True)
        else:
            latent = inputs["kv_cache"].to(torch.bfloat16)
        out["cmp"] = latent.float()
        kv = torch.cat([kv, latent])
    out["kv"] = kv.float()
    o = sparse_attention(q.float(), kv.float(), inputs["sink"].float(), out["indices"], attention_scale(model, layer),
                         model=model)
    out["o"] = o
    out["o_derot"] = attention_output(o, torch.arange(start_pos, start_pos + T), rope_freqs(model, layer))
    if "attn_wo_a" in inputs:
        out.update(_output_projections(out["o_derot"], inputs, model))
    return out


def row_parallel_reduce(partials: torch.Tensor) -> torch.Tensor:
    """RowParallelLinear.forward after linear() (V4-model L173-180, V41-model L271-278): y.float(),
    dist.all_reduce (fp32 sum; here rank by rank), y.type_as(x) (BF16)."""
    y = partials[0].to(torch.bfloat16).float()
    for rank in partials[1:]:
        y = y + rank.to(torch.bfloat16).float()
    return y.to(torch.bfloat16).float()
