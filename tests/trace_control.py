"""The control model of the trace route: a module tree shaped like the official model.py
(`layers.{i}.attn` with wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink and an `indexer`
with wq_b, weights_proj, wk, k_norm), random weights at the profile's widths (16 attention heads,
o_lora_rank 64, as the ATTN.LAYER cases), whose forward computes every stage with dsv4spec.official
(official.attn.attention_layer and its codecs) and keeps the decode state the official Attention keeps:
the window ring, the compressed KV cache, the index-K cache layer 20 publishes and its candidate pool.

Each compressing layer runs the official compressor (`layers.{i}.attn.compressor`, dsv4spec.official
.compressor) on its x; its pre-RoPE entries (V4.1: the latent, which the indexer's wk also reads) are
what the attention reads, entry j complete once position j·ratio + ratio − 1 has been fed.  The V4 CSA
indexer runs its own compressor (`layers.{i}.attn.indexer.compressor`, head_dim 128, V4-model L398) on
the same x: its pre-RoPE entries are the index entries its K is rotated, Hadamard-transformed and
FP4-quantized from.

`plant` (a dict) plants one deviation: {"layer": i, "start_pos": p, "stage": name, "fn": f} replaces the
official function named by `patch` (a (module, name) pair) by f while that layer-step runs, so every stage
after it is computed from the deviating one, as in a real port.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch
from torch import nn

from dsv4spec.official import attn as official_attn
from dsv4spec.official import compressor as official_compressor
from dsv4spec.official import path as official_path
from dsv4spec.official import quant as official_quant
from dsv4spec.official.quant import fp8_linear
from dsv4spec.official.rope import apply_rotary_emb, freqs_cis, rope_freqs
from dsv4spec.properties.attn import LAYER_HEADS, OUTPUT_RANK, output_weights, projection_weights
from dsv4spec.properties.path import normal_bf16
from dsv4spec.properties.quant import fp8_weight
from dsv4spec.spec import compressor as spec_compressor
from dsv4spec.spec import path as spec_path
from dsv4spec.spec.models import profile
from dsv4spec.spec.pool import layer_role
from dsv4spec.spec.quant import FP8_LINEAR_BLOCK

BF16 = torch.bfloat16
_E4M3_DECODE = official_quant.e4m3_decode
MAX_ENTRIES = 2 ** 15


def _t(a) -> torch.Tensor:
    a = np.asarray(a)
    return torch.from_numpy(a.copy() if a.dtype.kind in "iub" else a.astype(np.float32))


class FP8Linear(nn.Module):
    """Linear of a float8_e4m3fn weight (its bytes) with E8M0 block scales: act_quant, then fp8_gemm."""

    def __init__(self, weight, scale, block: int):
        super().__init__()
        self.register_buffer("weight", _t(weight))
        self.register_buffer("scale", _t(scale))
        self.block = block

    def forward(self, x):
        return fp8_linear(x.to(BF16), self.weight, self.scale, self.block).to(BF16)


class BF16Linear(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(_t(weight), requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x.to(BF16), self.weight.to(BF16))


class RMSNorm(nn.Module):
    def __init__(self, weight, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(_t(weight), requires_grad=False), eps

    def forward(self, x):
        return official_path._rms_norm(x, self.weight, self.eps)


class CompressorNorm(RMSNorm):
    """The compressor's RMSNorm (its input the pooled vector, its output the entry; V4-model L362)."""

    def forward(self, x):
        return official_compressor.rms_norm(x, self.weight, self.eps)


class Compressor(nn.Module):
    """official.compressor's Compressor with random weights, returning its pre-RoPE entries (the
    attention rotates them, as official.attn does): {"cmp_pooled", "cmp_normed"} of the groups a step
    completes, else {}; the indexer's (head_dim 128): the same under the prefix idx_cmp_."""

    def __init__(self, m, ratio: int, rng, head_dim: int | None = None, prefix: str = "cmp_"):
        super().__init__()
        head_dim, self.prefix = head_dim or m.head_dim, prefix
        width = spec_compressor.channel_factor(m.name, ratio) * head_dim
        self.wkv, self.wgate = nn.Module(), nn.Module()
        self.wkv.weight = nn.Parameter(_t(normal_bf16(rng, (width, m.dim), m.dim ** -0.5)), requires_grad=False)
        params = {"wkv": self.wkv.weight, "norm": torch.ones(head_dim), "rope_freqs": torch.zeros(m.rope_dim // 2)}
        if spec_compressor.has_gate(ratio):
            self.wgate.weight = nn.Parameter(_t(normal_bf16(rng, (width, m.dim), m.dim ** -0.5)), requires_grad=False)
            params["wgate"] = self.wgate.weight
            if spec_compressor.has_ape(m.name):
                self.register_buffer("ape", _t(rng.standard_normal((ratio, width)).astype(np.float32)))
                params["ape"] = self.ape
        self.norm = CompressorNorm(normal_bf16(rng, (head_dim,), 0.1, 1.0), m.norm_eps)
        self.state = official_compressor.Compressor(params, m.name, ratio, 1)
        self.state._finish = self._finish
        self.stages: dict = {}

    def _finish(self, pooled, positions):
        self.stages = {self.prefix + "pooled": pooled[0].float(), self.prefix + "normed": self.norm(pooled)[0].float()}
        return self.stages[self.prefix + "normed"][None]

    def forward(self, x, start_pos: int) -> dict:
        self.stages = {}
        official_compressor.Compressor.forward(self.state, x, start_pos)
        return self.stages


class Indexer(nn.Module):
    """wq_b and weights_proj ColumnParallel (V4-model L393-394): rank r of W holds index heads
    r·H/W … (r+1)·H/W − 1; `shards` keeps every rank's, for the simulated all-reduce of the scores."""

    def __init__(self, m, kind: str, rng, world_size: int = 1, rank: int = 0):
        super().__init__()
        H, D, b = m.index_n_heads, m.index_head_dim, FP8_LINEAR_BLOCK[m.name]
        wq_b, scale = fp8_weight(rng, H * D, m.q_lora_rank, b, exponents=(-14, -12))
        weights_proj = normal_bf16(rng, (H, m.dim), m.dim ** -0.5)
        rows = H * D // world_size
        self.shards = [{"wq_b": _t(wq_b[r * rows:(r + 1) * rows]), "wq_b_scale": _t(scale[r * rows // b:(r + 1) * rows // b]),
                        "weights_proj": _t(weights_proj[r * H // world_size:(r + 1) * H // world_size])}
                       for r in range(world_size)]
        self.rank = rank
        self.wq_b = FP8Linear(self.shards[rank]["wq_b"], self.shards[rank]["wq_b_scale"], b)
        self.weights_proj = BF16Linear(self.shards[rank]["weights_proj"])
        if kind in ("index_source", "candidate_source"):
            self.wk = BF16Linear(normal_bf16(rng, (D, m.head_dim), m.head_dim ** -0.5))
            self.k_norm = RMSNorm(normal_bf16(rng, (D,), 0.1, 1.0), m.norm_eps)


class Attention(nn.Module):
    def __init__(self, model: "ControlModel", layer: int, rng, heads: slice):
        super().__init__()
        m = self.m = profile(model.name)
        self.layer, self.role, self.ratio, self.owner = layer, layer_role(m, layer), m.ratio(layer), model
        b = FP8_LINEAR_BLOCK[m.name]
        w, o = _weights(m.name, model.seed, layer)
        rows = slice(heads.start * m.head_dim, heads.stop * m.head_dim)
        block_rows = slice(rows.start // b, rows.stop // b)
        self.wq_a = FP8Linear(w["attn_wq_a"], w["attn_wq_a_scale"], b)
        self.q_norm = RMSNorm(w["attn_q_norm"], m.norm_eps)
        self.wq_b = FP8Linear(w["attn_wq_b"][rows], w["attn_wq_b_scale"][block_rows], b)
        self.wkv = FP8Linear(w["attn_wkv"], w["attn_wkv_scale"], b)
        self.kv_norm = RMSNorm(w["attn_kv_norm"], m.norm_eps)
        groups = LAYER_HEADS * m.o_groups // m.n_heads
        per_group, local = LAYER_HEADS // groups, (heads.stop - heads.start)
        g = slice(heads.start // per_group, heads.stop // per_group)
        rank = o["attn_wo_a"].shape[0] // groups
        self.wo_a = BF16Linear(o["attn_wo_a"][g.start * rank:g.stop * rank])
        cols = slice(g.start * rank, g.stop * rank)
        self.wo_b = FP8Linear(o["attn_wo_b"][:, cols], o["attn_wo_b_scale"][:, cols.start // b:cols.stop // b], b)
        self.local_heads = local
        self.attn_sink = nn.Parameter(torch.from_numpy(
            np.random.default_rng((model.seed, layer, 4)).standard_normal(LAYER_HEADS).astype(np.float32)[heads]),
            requires_grad=False)
        self.register_buffer("rope_freqs", rope_freqs(m.name, layer))
        if self.role.kind not in ("window", "hca", "reuse"):
            self.indexer = Indexer(m, self.role.kind, np.random.default_rng((model.seed, layer, 5)), model.world_size,
                                   model.rank)
        table = np.random.default_rng((model.seed, layer, 6))
        if self.ratio:
            self.entries = normal_bf16(table, (model.max_entries(self.ratio), m.head_dim))
            if self.role.kind == "csa":
                self.index_entries = normal_bf16(table, (model.max_entries(self.ratio), m.index_head_dim))
                self.indexer.compressor = Compressor(m, self.ratio, np.random.default_rng((model.seed, layer, 9)),
                                                     m.index_head_dim, "idx_cmp_")
        self.ring = torch.zeros(m.window, m.head_dim, dtype=BF16)
        self.cache = torch.zeros(0, m.head_dim)
        if self.ratio and (m.name not in ("v4.1-flash",) or layer in m.kv_source_layers):
            self.compressor = Compressor(m, self.ratio, np.random.default_rng((model.seed, layer, 8)))

    def forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor:
        with self.owner.planting(self.layer, start_pos):
            return self._forward(x, start_pos)

    def _forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor:
        x, T = x.to(BF16), x.shape[1]
        q_latent = self.wq_a(x)                      # the modules see [B, S, ...] as official model.py's do
        qr = self.q_norm(q_latent)
        kv_proj = self.wkv(x)
        projected = {"q_latent": q_latent[0].float(), "q_norm": qr[0].float(), "kv_proj": kv_proj[0].float()}
        inputs = {"x": x[0].float(), "q_attn": self.wq_b(qr)[0].unflatten(-1, (self.local_heads, -1)).float(),
                  "kv_normed": self.kv_norm(kv_proj)[0].float(), "sink": self.attn_sink.float()}
        compressed = self._compress(x, start_pos, T)
        inputs.update(self._index_inputs(x, qr, start_pos, T))
        if start_pos:
            inputs["window_cache"] = self.ring.float()
        if self.ratio:
            E = (start_pos + T) // self.ratio
            if start_pos and self._owns_cache() and (start_pos + 1) % self.ratio == 0:
                self._write_entry(E - 1)          # the compressor's entry of this step, before attention reads it
            if self._compresses(start_pos):
                inputs["kv_entries"] = _t(self.entries[:E])
            else:
                inputs["kv_cache"] = self._kv_cache(start_pos, E)
        with patched(official_path, "all_reduce", self._all_reduce(inputs, start_pos)):
            stages = official_attn.attention_layer(inputs, model=self.m.name, layer=self.layer, start_pos=start_pos)
        stages.update(self._out(stages["o_derot"]), **projected, **compressed)
        self._keep(stages, start_pos, T)
        self.owner.seen(self, inputs, stages, start_pos)
        return stages["out_partial"].to(BF16)[None]

    def _all_reduce(self, inputs: dict, start_pos: int):
        """dist.all_reduce of the index scores (V4-model L422-423): every rank's BF16 partial over its heads,
        summed in rank order and rounded to BF16; the other ranks' partials computed here from their shards."""
        shards = getattr(getattr(self, "indexer", None), "shards", [None])
        if len(shards) == 1:
            return official_path.all_reduce

        def all_reduce(score):
            with patched(official_path, "all_reduce", lambda s: s):
                partials = [score if r == self.indexer.rank else official_path.index_layer(
                    {**inputs, **shard}, model=self.m.name, layer=self.layer, start_pos=start_pos)["scores"]
                    for r, shard in enumerate(shards)]
            return sum_partials(partials, self.indexer.rank)
        return all_reduce

    def _compress(self, x, start_pos: int, T: int) -> dict:
        """The compressors' step (the indexer's first: V4-model L511 runs it, L417, before L525, L532): the entries
        each completes become the table's rows the attention (the indexer) reads."""
        stages = {}
        for owner, table in ((getattr(self, "indexer", None), "index_entries"), (self, "entries")):
            if hasattr(owner, "compressor"):
                stages.update(self._compress_into(owner.compressor, getattr(self, table), x, start_pos, T))
        return stages

    def _compress_into(self, compressor, entries, x, start_pos: int, T: int) -> dict:
        stages = compressor(x, start_pos)
        if stages:
            normed = stages[compressor.prefix + "normed"]
            first = 0 if start_pos == 0 else (start_pos + T) // self.ratio - normed.shape[0]
            entries[first:first + normed.shape[0]] = normed.numpy()
        return stages

    def _compresses(self, start_pos: int) -> bool:
        return start_pos == 0 and (self.m.name not in ("v4.1-flash",) or self.layer in self.m.kv_source_layers)

    def _index_inputs(self, x, qr, start_pos: int, T: int) -> dict:
        kind = self.role.kind
        if kind == "reuse":
            return {"source_topk": self.owner.shared[self.role.topk_source, "topk"]}
        if kind in ("window", "hca"):
            return {}
        E = (start_pos + T) // self.ratio
        ix = self.indexer
        ix.wq_b(qr)                      # the calls official model.py makes (their hooks see q and w_raw)
        ix.weights_proj(x)
        out = {"qr": qr[0].float(), "wq_b": ix.wq_b.weight, "wq_b_scale": ix.wq_b.scale,
               "weights_proj": ix.weights_proj.weight.float()}
        if kind == "csa":
            out["index_entry"] = _t(self.index_entries[:E])
        elif kind == "reindex":
            source = self.role.pool_source
            out.update(k_packed=self.owner.shared[source, "k_packed"], k_scales=self.owner.shared[source, "k_scales"],
                       candidates=pool_of(self.owner, source))
        else:
            latent = _t(self.entries[:E])
            ix.k_norm(ix.wk(latent[None]))
            out.update(latent=latent, wk=ix.wk.weight.float(), k_norm=ix.k_norm.weight.float())
        if spec_path.reads_published_k(self.m, self.layer, T, start_pos):
            P = spec_path.published_k_rows(self.m, start_pos)
            out.update(published_k_packed=self.owner.published["k_packed"][:P],
                       published_k_scales=self.owner.published["k_scales"][:P])
        return out

    def _kv_cache(self, start_pos: int, E: int) -> torch.Tensor:
        source = self if self._owns_cache() else self.owner.attn(self.role.kv_source)
        return source.cache[:E].float()

    def _out(self, o_derot: torch.Tensor) -> dict:
        """wo_a per head group (BF16 einsum), then wo_b, a RowParallelLinear: this rank's partial."""
        lora = official_attn._output_projections(
            o_derot, {"attn_wo_a": self.wo_a.weight, "attn_wo_b": self.wo_b.weight,
                      "attn_wo_b_scale": self.wo_b.scale}, self.m.name)["o_lora"]
        return {"o_lora": lora, "out_partial": self.wo_b(lora.flatten(1)[None])[0].float()}

    def _keep(self, stages: dict, start_pos: int, T: int):
        """The decode state: the ring (prefill: its last 128 rows; decode: slot start_pos mod 128) and,
        after a prefill, the compressed cache (its entries as attention read them)."""
        win = self.m.window
        kv = stages["kv_window"].to(BF16)
        for t in range(max(0, T - win), T):
            self.ring[ring_slot(start_pos + t, win)] = kv[t]
        if self._compresses(start_pos) and self.ratio:
            self.cache = stages["cmp"].clone() if "cmp" in stages else torch.zeros(0, self.m.head_dim)

    def _write_entry(self, j: int):
        """Entry j completed at decode: rotated at its group's first position j·ratio and quantized as
        the prefill's were (V4-model L366-372, V41-model L756-760)."""
        row = _t(self.entries[j:j + 1]).to(BF16)
        apply_rotary_emb(row[..., -64:], freqs_cis(torch.tensor([j * self.ratio]), self.rope_freqs))
        self.cache = torch.cat([self.cache, official_attn._qdq(row, self.m.name, True).float()])

    def _owns_cache(self) -> bool:
        return self.role.kv_source in (-1, self.layer)


def pool_of(owner: "ControlModel", source: int) -> torch.Tensor:
    """The candidate pool a re-index layer masks with: its pool source's of this step (LAYER.V41)."""
    return owner.shared[source, "candidates"]


def ring_slot(position: int, window: int) -> int:
    """The ring slot the window KV of `position` is written to (V4-model L518-533)."""
    return position % window


@functools.lru_cache(maxsize=16)
def _weights(name: str, seed: int, layer: int):
    """The attention's projection and output weights of a layer (built once a process: seconds each)."""
    m = profile(name)
    return (projection_weights(m, np.random.default_rng((seed, layer, 2))),
            output_weights(m, np.random.default_rng((seed, layer, 3)), O_LORA_RANK[name]))


# o_lora_rank: ATTN.LAYER's 64, or one FP8 block of wo_b's columns (V4: 128), so that each tensor-parallel
# rank's group of wo_b's columns (a RowParallelLinear) holds whole scale blocks
O_LORA_RANK = {name: max(OUTPUT_RANK, block) for name, block in FP8_LINEAR_BLOCK.items()}


CMP_WEIGHTS = tuple(prefix + name for prefix in ("cmp_", "idx_cmp_") for name in ("wkv", "wgate", "ape", "norm"))


def compressor_weights(attn: Attention) -> dict:
    """The weights of the layer's compressors: its own and, V4 CSA, its indexer's."""
    weights = {}
    for c in (getattr(attn, "compressor", None), getattr(getattr(attn, "indexer", None), "compressor", None)):
        if c is not None:
            named = {"wkv": c.wkv.weight, "norm": c.norm.weight, "wgate": getattr(c.wgate, "weight", None),
                     "ape": getattr(c, "ape", None)}
            weights |= {c.prefix + name: value for name, value in named.items() if value is not None}
    return weights


class Block(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn


class ControlModel(nn.Module):
    """`layers.{i}.attn` for the chosen layers of `name`; world_size > 1: rank `rank`'s heads (of 16)."""

    def __init__(self, name: str, layers, *, seed: int = 0, world_size: int = 1, rank: int = 0, max_pos: int = 4096):
        super().__init__()
        self.name, self.seed, self.max_pos, self.layer_ids = name, seed, max_pos, tuple(sorted(layers))
        self.world_size, self.rank, self._weights_recorded = world_size, rank, set()
        self._weight_ptrs, self._decoded = set(), {}
        per = LAYER_HEADS // world_size
        heads = slice(rank * per, (rank + 1) * per)
        self.layers = nn.ModuleDict({str(i): Block(Attention(self, i, np.random.default_rng((seed, i)), heads))
                                     for i in self.layer_ids})
        self.shared: dict = {}           # (layer, stage) -> tensor of this step: top-k, index K, pool
        self.published: dict = {}        # the index-K cache published last (PATH.K.PUBLISHED)
        self.recorder, self.record_steps, self.plant = None, None, None

    def max_entries(self, ratio: int) -> int:
        return min(MAX_ENTRIES, self.max_pos // ratio + 1)

    def attn(self, layer: int) -> Attention:
        return self.layers[str(layer)].attn

    def inputs(self, start_pos: int, T: int) -> torch.Tensor:
        """x of the step: [1, T, dim] BF16, fixed by (seed, position) so every rank sees the same."""
        m = profile(self.name)
        rng = np.random.default_rng((self.seed, 7, start_pos, T))
        return _t(normal_bf16(rng, (1, T, m.dim))).to(BF16)

    def forward(self, start_pos: int, T: int) -> dict:
        """One step of every layer (a layer reads x of its own; no residual stream): {layer: out partial}."""
        x = self.inputs(start_pos, T)
        with patched(official_quant, "e4m3_decode", self._decode):
            return {i: self.attn(i)(x, start_pos) for i in self.layer_ids}

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        """official.quant.e4m3_decode, its result kept for the model's own weight buffers (alive as long
        as the model, so their storage is theirs): the CPU's float8 cast costs 0.1 s a weight a call."""
        if not self._weight_ptrs:
            self._weight_ptrs = {b.data_ptr() for b in self.buffers() if b.dtype == torch.uint8}
        key = (codes.data_ptr(), tuple(codes.shape))
        if key[0] not in self._weight_ptrs:
            return _E4M3_DECODE(codes)
        if key not in self._decoded:
            self._decoded[key] = _E4M3_DECODE(codes)
        return self._decoded[key]

    def seen(self, attn: Attention, inputs: dict, stages: dict, start_pos: int):
        layer = attn.layer
        for name in ("topk", "k_packed", "k_scales", "candidates"):
            if name in stages:
                self.shared[layer, name] = stages[name]
        if layer in attn.m.kv_source_layers and "k_packed" in stages and attn.role.kind != "reindex":
            if attn.m.kv_source_layers and spec_path.last_publisher(attn.m) == layer:
                self.published = {"k_packed": stages["k_packed"], "k_scales": stages["k_scales"]}
        rec = self.recorder
        if rec is not None and (self.record_steps is None or start_pos in self.record_steps):
            step = (start_pos, inputs["x"].shape[0])
            for name, value in {**inputs, **stages, **compressor_weights(attn)}.items():
                if name == "out_partial" and self.world_size == 1:
                    name = "out"          # RowParallelLinear at world size 1: no all-reduce (V4 L175)
                if name in ("wq_b", "wq_b_scale", "weights_proj", "wk", "k_norm", "sink", *CMP_WEIGHTS):
                    if (layer, name) not in self._weights_recorded:
                        rec.record(name, value, layer=layer)
                        self._weights_recorded.add((layer, name))
                else:
                    rec.record(name, value, layer=layer, step=step)
            if (layer, "rope_freqs") not in self._weights_recorded:
                rec.record("rope_freqs", attn.rope_freqs, layer=layer)
                for name in ("attn_wq_a", "attn_wq_b", "attn_wkv", "attn_wo_b"):
                    module = getattr(attn, name.removeprefix("attn_"))
                    rec.record(name, module.weight, layer=layer)
                    rec.record(name + "_scale", module.scale, layer=layer)
                rec.record("attn_q_norm", attn.q_norm.weight, layer=layer)
                rec.record("attn_kv_norm", attn.kv_norm.weight, layer=layer)
                rec.record("attn_wo_a", attn.wo_a.weight, layer=layer)
                self._weights_recorded.add((layer, "rope_freqs"))

    @contextlib.contextmanager
    def planting(self, layer: int, start_pos: int):
        """The planted deviation, while its layer-step runs: plant = (layer, start_pos, module, name, fn)."""
        if self.plant is None or self.plant[:2] != (layer, start_pos):
            yield
            return
        with patched(*self.plant[2:]):
            yield


@contextlib.contextmanager
def patched(module, name: str, fn):
    old = getattr(module, name)
    setattr(module, name, fn)
    try:
        yield
    finally:
        setattr(module, name, old)


def record_control(path, name: str, layers, prefill: int, decode: int = 0, *, seed: int = 0, world_size: int = 1,
                   record=None, plant=None, variants=None, max_pos: int = 4096, reduce=None) -> list[str]:
    """Run the control model (a prefill of `prefill` tokens, then `decode` one-token steps) and write
    its trace (world size 1: `path`; else one directory per rank, path/rank{r}); `record`: the
    start positions recorded (None: all).  Returns the trace directories."""
    from dsv4spec.trace import Recorder
    ranks = [ControlModel(name, layers, seed=seed, world_size=world_size, rank=r, max_pos=max_pos)
             for r in range(world_size)]
    dirs = [str(path) if world_size == 1 else f"{path}/rank{r}" for r in range(world_size)]
    config = {"n_heads": LAYER_HEADS, "o_lora_rank": O_LORA_RANK[name]}
    with contextlib.ExitStack() as stack:
        for r, model in enumerate(ranks):
            model.recorder = stack.enter_context(Recorder(dirs[r], model=name, config=config, variants=variants,
                                                          world_size=world_size, rank=r))
            model.record_steps, model.plant = (None if record is None else set(record)), plant
        for start_pos, T in [(0, prefill)] + [(p, 1) for p in range(prefill, prefill + decode)]:
            partials = [model(start_pos, T) for model in ranks]
            if world_size > 1 and (record is None or start_pos in record):
                for layer in ranks[0].layer_ids:
                    out = (reduce or all_reduce)([p[layer] for p in partials])
                    for model in ranks:
                        model.recorder.record("out", out[0], layer=layer, step=(start_pos, T))
    return dirs


def sum_partials(partials, rank: int) -> torch.Tensor:
    """The index scores' all-reduce on rank `rank` (V4-model L422-423): as wo_b's, BF16 partials in rank order."""
    return all_reduce(partials)


def all_reduce(partials) -> torch.Tensor:
    """RowParallelLinear's end (V4 L173-180): each rank's BF16 partial as fp32, summed over the ranks
    (rank order here; NCCL's is its own), then type_as(x): BF16."""
    total = partials[0].float()
    for p in partials[1:]:
        total = total + p.float()
    return total.to(BF16)
