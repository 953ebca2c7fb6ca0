"""record_official: a trace of code shaped like the official model.py, by forward hooks.

The official Attention is `layers.{i}.attn`, called as attn(x [B, S, dim], start_pos); its linears and
norms are modules whose outputs are stages (OFFICIAL_NAMES), its weights their parameters.  What is
computed by plain functions inside a forward (RoPE, the codecs, the scores, sparse_attn) no hook can
see: record it with Recorder.record where it is computed, or leave it n/i.
"""
from __future__ import annotations

from .format import Recorder, Step

# module under layers.{i} -> (the stages its output is, {attribute: the weight it is recorded as}[,
# the stages its input is])
OFFICIAL_NAMES = {
    "attn.wq_a": (("q_latent",), {"weight": "attn_wq_a", "scale": "attn_wq_a_scale"}),
    "attn.q_norm": (("q_norm", "qr"), {"weight": "attn_q_norm"}),
    "attn.wq_b": (("q_attn",), {"weight": "attn_wq_b", "scale": "attn_wq_b_scale"}),
    "attn.wkv": (("kv_proj",), {"weight": "attn_wkv", "scale": "attn_wkv_scale"}),
    "attn.kv_norm": (("kv_normed",), {"weight": "attn_kv_norm"}),
    "attn.wo_a": ((), {"weight": "attn_wo_a"}),
    "attn.wo_b": (("out",), {"weight": "attn_wo_b", "scale": "attn_wo_b_scale"}, ("o_lora",)),
    "attn.indexer.wq_b": (("q",), {"weight": "wq_b", "scale": "wq_b_scale"}),
    "attn.indexer.weights_proj": (("w_raw",), {"weight": "weights_proj"}),
    "attn.indexer.wk": (("k",), {"weight": "wk"}, ("latent",)),
    "attn.indexer.k_norm": (("k_normed",), {"weight": "k_norm"}),
    "attn.compressor.wkv": ((), {"weight": "cmp_wkv"}),
    "attn.compressor.wgate": ((), {"weight": "cmp_wgate"}),
    "attn.compressor.norm": (("cmp_normed",), {"weight": "cmp_norm"}, ("cmp_pooled",)),
    "attn.indexer.compressor.wkv": ((), {"weight": "idx_cmp_wkv"}),          # V4 CSA: the indexer's own (L398)
    "attn.indexer.compressor.wgate": ((), {"weight": "idx_cmp_wgate"}),
    "attn.indexer.compressor.norm": (("idx_cmp_normed",), {"weight": "idx_cmp_norm"}, ("idx_cmp_pooled",)),
}
# parameters and buffers of layers.{i} recorded once: the sink, the RoPE table (fp32 frequencies)
OFFICIAL_TENSORS = {"attn.attn_sink": "sink", "attn.rope_freqs": "rope_freqs", "attn.compressor.ape": "cmp_ape",
                    "attn.indexer.compressor.ape": "idx_cmp_ape"}
STEP_MODULE = "attn"        # forward(x, start_pos): the step and its input x


def _selected(steps, start_pos: int) -> bool:
    if steps is None:
        return True
    if steps in ("prefill", "decode"):
        return (start_pos == 0) == (steps == "prefill")
    return start_pos in steps


def _weight(module, attribute: str):
    value = getattr(module, attribute, None)
    if value is None and attribute == "scale":            # official Linear: weight.scale
        value = getattr(getattr(module, "weight", None), "scale", None)
    return value


class _Hooks:
    def __init__(self, model, rec: Recorder, layers, steps, rows, names, tensors, step_module):
        self.rec, self.steps, self.rows = rec, steps, tuple(rows)
        self.handles, self.now = [], {}
        modules = dict(model.named_modules())
        found = sorted({int(n.split(".")[1]) for n in modules if n.startswith("layers.") and n.count(".") >= 1
                        and n.split(".")[1].isdigit()})
        self.layers = [i for i in found if layers is None or i in layers]
        if not self.layers:
            raise ValueError(f"record_official: no module layers.{{i}} of {sorted(layers or found)} in the model")
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        for i in self.layers:
            base = f"layers.{i}."
            if base + step_module not in modules:
                raise ValueError(f"record_official: the model has no {base + step_module} (pass names= for yours)")
            self.handles.append(modules[base + step_module].register_forward_pre_hook(self._step(i), with_kwargs=True))
            for name, (stages, weights, *inputs) in names.items():
                module = modules.get(base + name)
                if module is None:
                    continue
                for attribute, stage in weights.items():
                    value = _weight(module, attribute)
                    if value is not None:
                        rec.record(stage, value, layer=i)
                if stages or inputs:
                    self.handles.append(module.register_forward_hook(self._output(i, stages, *inputs)))
            for name, stage in tensors.items():
                if base + name in state:
                    rec.record(stage, state[base + name], layer=i)

    def _step(self, layer: int):
        def pre_hook(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            start_pos = int(args[1] if len(args) > 1 else kwargs.get("start_pos", 0))
            self.now[layer] = (start_pos, x.shape[1]) if _selected(self.steps, start_pos) else None
            self._record(layer, ("x",), x)
        return pre_hook

    def _output(self, layer: int, stages, inputs=()):
        def hook(module, args, output):
            self._record(layer, inputs, args[0])
            self._record(layer, stages, output)
        return hook

    def _record(self, layer: int, stages, value):
        now = self.now.get(layer)
        if now is None:
            return
        for row in self.rows:
            if row < value.shape[0]:
                for stage in stages:
                    self.rec.record(stage, value[row], layer=layer, step=Step(now[0], now[1], row))

    def remove(self):
        for h in self.handles:
            h.remove()


class _Recording:
    def __init__(self, rec: Recorder, hooks: _Hooks):
        self.recorder, self.hooks = rec, hooks

    def __enter__(self):
        return self.recorder

    def __exit__(self, *exc):
        self.hooks.remove()
        self.recorder.close()
        return False


def record_official(model, path, *, model_name: str, layers=None, steps=None, rows=(0,), names=None,
                    tensors=None, step_module: str = STEP_MODULE, config=None, variants=None,
                    world_size: int = 1, rank: int = 0) -> _Recording:
    """`with record_official(model, "trace/", model_name="v4-flash", layers=[2, 3], steps=[0, 130]) as rec:
    model(...)`: hooks on `layers.{i}.<name>` (OFFICIAL_NAMES, or `names` of the same shape for your
    model's module names) record the chosen layers' stages at the chosen steps (start positions, or
    "prefill"/"decode"; None: all) for the chosen batch rows; the weights once, on entering."""
    rec = Recorder(path, model=model_name, config=config, variants=variants, world_size=world_size, rank=rank)
    return _Recording(rec, _Hooks(model, rec, layers, steps, rows, OFFICIAL_NAMES if names is None else names,
                                  OFFICIAL_TENSORS if tensors is None else tensors, step_module))
