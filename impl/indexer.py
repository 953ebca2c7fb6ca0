"""Lightning indexer, readable reference in torch (CPU): rotation, weights, scores, visibility, top-k.

Each function mirrors one equation of spec/indexer.py; the BF16 steps round with torch's
float32 → bfloat16 conversion, which is IEEE round-to-nearest-even (cross-checked against the
exact spec rounding in tests/test_indexer.py).
"""
from __future__ import annotations

import torch

from ..spec import indexer as spec
from ..spec.models import profile
from .quant import e4m3_decode, fp4_e8m0_dequantize
from .topk import _topk_from

__all__ = ["hadamard", "index_rotate", "index_weights", "index_weights_v32", "index_scores", "index_scores_fp4",
           "index_scores_fp8", "index_scores_fp8_cache",
           "index_visible", "index_topk"]


# ------------------------------------------------------------------------------------------------
# input checks (shared with impl/pool.py)
# ------------------------------------------------------------------------------------------------
def _tensor(op: str, name: str, x, ndim: int | None = None, *, floating=False, integer=False,
            boolean=False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{op}: {name} must be float32 or bfloat16, got {x.dtype}")
    if integer and (x.is_floating_point() or x.dtype == torch.bool):
        raise TypeError(f"{op}: {name} must be an integer tensor, got {x.dtype}")
    if boolean and x.dtype != torch.bool:
        raise TypeError(f"{op}: {name} must be a bool tensor, got {x.dtype}")
    if floating and torch.isnan(x).any():
        raise ValueError(f"{op}: {name} contains NaN")
    return x


def _bf16_values(op: str, name: str, x: torch.Tensor) -> torch.Tensor:
    """x as float32, required to hold BF16-representable values."""
    x = x.float()
    finite = torch.isfinite(x)
    if not torch.equal(x[finite], x[finite].to(torch.bfloat16).float()):
        raise ValueError(f"{op}: {name} must hold BF16-representable values (round them first)")
    return x


def _visible(op: str, visible, rows: int, width: int, name: str = "visible") -> torch.Tensor:
    """Per-query counts of reachable positions: int [rows], each in [0, width]."""
    visible = _tensor(op, name, visible, 1, integer=True).to(torch.int64)
    if visible.shape[0] != rows:
        raise ValueError(f"{op}: {name} has {visible.shape[0]} entries, expected one per query ({rows})")
    if rows and (visible.min() < 0 or visible.max() > width):
        raise ValueError(f"{op}: {name} must lie in [0, {width}] (the row width), "
                         f"got [{int(visible.min())}, {int(visible.max())}]")
    return visible


def _visibility_mask(visible: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < visible[:, None]


def _scores_inputs(op: str, q, k, w, visible, bf16: bool):
    q = _tensor(op, "q", q, 3, floating=True)
    k = _tensor(op, "k", k, 2, floating=True)
    w = _tensor(op, "w", w, 2, floating=True)
    T, H, D = q.shape
    if k.shape[1] != D:
        raise ValueError(f"{op}: k has head dim {k.shape[1]}, expected q's {D} (k [S, D])")
    if tuple(w.shape) != (T, H):
        raise ValueError(f"{op}: w has shape {tuple(w.shape)}, expected [T, H] = [{T}, {H}]")
    visible = _visible(op, visible, T, k.shape[0])
    if bf16:
        q, k, w = (_bf16_values(op, n, x) for n, x in (("q", q), ("k", k), ("w", w)))
    return q.float(), k.float(), w.float(), visible


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


# ------------------------------------------------------------------------------------------------
# HAD
# ------------------------------------------------------------------------------------------------
def hadamard(x: torch.Tensor) -> torch.Tensor:
    """bf16(H·x/√d) over the last dimension by the fp32 butterfly (as fast_hadamard_transform)."""
    x = _bf16_values("hadamard", "x", _tensor("hadamard", "x", x, floating=True))
    if x.dim() == 0 or x.shape[-1] != spec.HADAMARD_DIM:
        raise ValueError(f"hadamard: last dimension must be {spec.HADAMARD_DIM}, got shape {tuple(x.shape)}")
    d = spec.HADAMARD_DIM
    y = x.reshape(-1, d).clone()
    h = 1
    while h < d:                               # H_2h = [[H_h, H_h], [H_h, −H_h]]
        y = y.view(-1, d // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    scale = torch.tensor(spec.HADAMARD_SCALE, dtype=torch.float32)
    return _bf16(y.reshape(x.shape) * scale)


def index_rotate(x: torch.Tensor, model: str) -> torch.Tensor:
    """The rotation a model applies to indexer q and k: Hadamard in V3.2/V4, none in V4.1."""
    m = profile(model)
    if spec.rotates_index_qk(m):
        return hadamard(x)
    return _bf16_values("index_rotate", "x", _tensor("index_rotate", "x", x, floating=True)).clone()


# ------------------------------------------------------------------------------------------------
# IDX: weights and scores
# ------------------------------------------------------------------------------------------------
def index_weights(raw_w: torch.Tensor, model: str) -> torch.Tensor:
    """weights_proj(x) · (index_head_dim^-0.5 · index_n_heads^-0.5), a BF16 tensor times a scalar."""
    m = profile(model)
    if m.score_dtype != "bf16":
        raise ValueError(f"index_weights: {model} folds the per-token q scale into the weights; "
                         f"expected a V4 or V4.1 model")
    raw_w = _bf16_values("index_weights", "raw_w", _tensor("index_weights", "raw_w", raw_w, 2, floating=True))
    if raw_w.shape[1] != m.index_n_heads:
        raise ValueError(f"index_weights: raw_w has {raw_w.shape[1]} heads, expected {model}'s "
                         f"index_n_heads = {m.index_n_heads} (the factor uses the global head count)")
    return _bf16(raw_w * torch.tensor(m.index_weight_scale, dtype=torch.float32))


def index_weights_v32(raw_w: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    """V3.2: bf16(raw · 64^-0.5), then · q_scale · 128^-0.5 in fp32 (exact before each rounding)."""
    m = profile("v3.2")
    raw_w = _bf16_values("index_weights_v32", "raw_w", _tensor("index_weights_v32", "raw_w", raw_w, 2, floating=True))
    q_scale = _tensor("index_weights_v32", "q_scale", q_scale, 2, floating=True)
    if raw_w.shape != q_scale.shape or raw_w.shape[1] != m.index_n_heads:
        raise ValueError(f"index_weights_v32: raw_w {tuple(raw_w.shape)} and q_scale {tuple(q_scale.shape)} must "
                         f"both be [T, {m.index_n_heads}] (one FP8 scale per token and head)")
    heads = _bf16(raw_w * torch.tensor(m.index_n_heads ** -0.5, dtype=torch.float32))
    return (heads.double() * q_scale.double()).float() * torch.tensor(m.index_head_dim ** -0.5, dtype=torch.float32)


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor,
                 score_dtype: str = "bf16") -> torch.Tensor:
    """I[t, s] = Σ_h w[t,h]·ReLU(q[t,h]·k[s]), −inf where s ≥ visible[t]; float32 [T, S]."""
    if score_dtype not in spec.SCORE_DTYPES:
        raise ValueError(f"index_scores: score_dtype must be one of {spec.SCORE_DTYPES}, got {score_dtype!r}")
    bf16 = score_dtype == "bf16"
    q, k, w, visible = _scores_inputs("index_scores", q, k, w, visible, bf16)
    dots = torch.einsum("thd,sd->ths", q, k)                   # fp32 accumulation
    if bf16:
        weighted = _bf16(torch.relu(_bf16(dots)) * w[:, :, None])
        scores = _bf16(weighted.sum(dim=1))
    else:
        scores = (torch.relu(dots) * w[:, :, None]).sum(dim=1)
    return scores.masked_fill(~_visibility_mask(visible, k.shape[0]), float("-inf"))


def index_scores_fp4(q_packed: torch.Tensor, q_scales: torch.Tensor, k_packed: torch.Tensor,
                     k_scales: torch.Tensor, w: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """The BF16 score of the dequantized FP4 (E2M1, E8M0 per 32) q and k."""
    op = "index_scores_fp4"
    _tensor(op, "q_packed", q_packed, 3)
    _tensor(op, "k_packed", k_packed, 2)
    if q_packed.shape[-1] != k_packed.shape[-1]:
        raise ValueError(f"{op}: q_packed holds {2 * q_packed.shape[-1]}-dim heads but k_packed "
                         f"{2 * k_packed.shape[-1]}-dim keys; expected the same head dim")
    q = fp4_e8m0_dequantize(q_packed, q_scales)
    k = fp4_e8m0_dequantize(k_packed, k_scales)
    return index_scores(q, k, w, visible, "bf16")


def index_scores_fp8_cache(q_codes: torch.Tensor, cache: torch.Tensor, form: str, w: torch.Tensor,
                           visible: torch.Tensor) -> torch.Tensor:
    """index_scores_fp8 over a V3.2 indexer K cache: its entries unpacked by LAYOUT.V32.INDEX_K."""
    from ..spec import layout as spec_layout
    from .layout import entry_unpack
    kind, _ = spec_layout.cache_form(form)
    entries = torch.from_numpy(spec_layout.cache_entries(form, cache.numpy()))
    return index_scores(e4m3_decode(q_codes), entry_unpack(kind, entries), w, visible, "fp32")


def index_scores_fp8(q_codes: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
    """V3.2's fp32 score of E4M3 q and k (k times its per-entry fp32 scale; q's scale is in w)."""
    op = "index_scores_fp8"
    _tensor(op, "q_codes", q_codes, 3)
    _tensor(op, "k_codes", k_codes, 2)
    k = e4m3_decode(k_codes) * k_scale.float()[:, None]
    return index_scores(e4m3_decode(q_codes), k, w, visible, "fp32")


# ------------------------------------------------------------------------------------------------
# IDX: visibility and top-k
# ------------------------------------------------------------------------------------------------
def index_visible(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """(p + 1) // ratio compressed entries are visible to the query at absolute position p."""
    positions = _tensor("index_visible", "positions", positions, integer=True).to(torch.int64)
    if not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"index_visible: ratio must be a positive int, got {ratio!r}")
    if (positions < 0).any():
        raise ValueError("index_visible: positions must be ≥ 0")
    # (p + 1) // r written so that p + 1 is never formed (p = 2^63 − 1 would wrap).
    return positions // ratio + (positions % ratio == ratio - 1).to(torch.int64)


def _topk_inputs(op: str, scores, visible, k, order):
    scores = _tensor(op, "scores", scores, 2, floating=True).float()
    visible = _visible(op, visible, scores.shape[0], scores.shape[1])
    if not isinstance(k, int) or k < 0 or k > scores.shape[1]:
        raise ValueError(f"{op}: k must be an int in [0, {scores.shape[1]}] (the row width), got {k!r}")
    if order not in spec.TOPK_ORDERS:
        raise ValueError(f"{op}: order must be one of {spec.TOPK_ORDERS}, got {order!r}")
    return scores, visible


def index_topk(scores: torch.Tensor, visible: torch.Tensor, k: int, order: str) -> torch.Tensor:
    """The k best visible entries per row; order 'score' (V4) or 'position' (V4.1); −1 at the tail."""
    scores, visible = _topk_inputs("index_topk", scores, visible, k, order)
    return _topk_from(scores, _visibility_mask(visible, scores.shape[1]), k, order)
