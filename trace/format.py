"""The trace format (docs/TRACE.md): safetensors files and a JSON manifest, written by `Recorder` and
read one layer-step at a time by `Trace`.  Every fault of a trace on disk is a `TraceError` of one line."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..spec.models import PROFILES, profile
from ..spec.rules import KNOBS

FORMAT = "dsv4spec-trace"
VERSION = 1
MANIFEST = "manifest.json"
FILE_BYTES = 256 * 2 ** 20          # a safetensors file is closed past this many bytes and the next begun

# One vocabulary: the names the PATH, IDX, POOL and ATTN.LAYER stage judges read and write
# (properties/path.py STAGES and the operation contract of index_layer, properties/attn.py ATTN_STAGES).
WEIGHTS = ("rope_freqs", "wq_b", "wq_b_scale", "weights_proj", "wk", "k_norm", "sink", "attn_wq_a", "attn_wq_a_scale",
           "attn_q_norm", "attn_wq_b", "attn_wq_b_scale", "attn_wkv", "attn_wkv_scale", "attn_kv_norm", "attn_wo_a",
           "attn_wo_b", "attn_wo_b_scale", "cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm", "idx_cmp_wkv",
           "idx_cmp_wgate", "idx_cmp_ape", "idx_cmp_norm")
STEP_INPUTS = ("x", "qr", "index_entry", "latent", "published_k_packed", "published_k_scales", "source_topk",
               "window_cache", "kv_entries", "kv_cache")
STAGES = ("window_idx", "compressed_idx", "q", "q_rot", "q_had", "q_packed", "q_scales", "k", "k_normed",
          "idx_cmp_pooled", "idx_cmp_normed", "k_rot", "k_had", "k_packed", "k_scales", "w_raw", "weights", "scores",
          "candidates", "topk", "indices", "q_latent", "q_norm", "cmp_pooled", "cmp_normed", "q_attn", "q_rescale",
          "q_attn_rot", "kv_proj", "kv_normed", "kv_rot", "kv_window", "cmp_rot", "cmp", "kv", "o", "o_derot", "o_lora",
          "out_partial", "out")
VOCABULARY = WEIGHTS + STEP_INPUTS + STAGES
# family prefixes a writer may put before a name (the "idx.scores"): read as the bare name (a
# step's stage first, unless family_name is a step's stage too; for a weight, family_name first: "attn.q_norm"
# of a step is q_norm, of no step attn_q_norm; "idx.cmp_pooled" is the indexer's compressor's, idx_cmp_pooled)
FAMILIES = ("idx", "path", "pool", "cmp", "attn", "rope")
INTEGER = {"window_idx", "compressed_idx", "topk", "indices", "source_topk"}
BYTES = {"wq_b", "wq_b_scale", "attn_wq_a", "attn_wq_a_scale", "attn_wq_b", "attn_wq_b_scale", "attn_wkv",
         "attn_wkv_scale", "attn_wo_b", "attn_wo_b_scale", "q_packed", "q_scales", "k_packed", "k_scales",
         "published_k_packed", "published_k_scales"}
BOOLEAN = {"candidates"}
STEP_KINDS = ("prefill", "decode")
JUDGED_MODELS = ("v4-flash", "v4-pro", "v4.1-flash")     # V3.2's layer (dsa) has no stage judges here
CONFIG_KEYS = ("dim", "head_dim", "rope_dim", "window", "index_n_heads", "index_head_dim", "index_topk",
               "compress_ratios", "norm_eps", "q_lora_rank", "candidate_topk_blocks", "candidate_block_size")


def canonical(name: str, weight: bool) -> str:
    """The vocabulary's name for `name`, a bare name or a family-prefixed one ("idx.scores" -> "scores")."""
    family, dot, rest = name.partition(".")
    if name in VOCABULARY or not dot or family not in FAMILIES:
        return name
    prefixed = f"{family}_{rest}"
    tries = (prefixed, rest) if weight or prefixed in STAGES else (rest, prefixed)
    return next((n for n in tries if n in VOCABULARY), name)


class TraceError(Exception):
    """A trace that cannot be judged: corrupt, truncated, mislabelled or mismatched (one line)."""


@dataclass(frozen=True, order=True)
class Step:
    """One forward call of a layer: a prefill from start_pos 0 or a decode step, one batch row."""
    start_pos: int
    seqlen: int
    row: int = 0

    @property
    def kind(self) -> str:
        return "prefill" if self.start_pos == 0 else "decode"

    def label(self) -> str:
        where = f"prefill of {self.seqlen}" if self.kind == "prefill" else f"decode at {self.start_pos}"
        return where + (f", row {self.row}" if self.row else "")

    def as_json(self) -> dict:
        return {"kind": self.kind, "start_pos": self.start_pos, "seqlen": self.seqlen, "row": self.row}


def step_of(value) -> Step | None:
    """A Step from a Step, a manifest dict, or (start_pos, seqlen[, row]); None for a weight."""
    if value is None or isinstance(value, Step):
        return value
    if isinstance(value, dict):
        step = Step(int(value["start_pos"]), int(value["seqlen"]), int(value.get("row", 0)))
        if value.get("kind", step.kind) != step.kind:
            raise TraceError(f"mislabelled step {value}: start_pos {step.start_pos} is a {step.kind}")
        return step
    return Step(*(int(v) for v in value))


def model_config(model: str, **extra) -> dict:
    """The config a trace of `model` declares: the profile's constants the judges read, and `extra`
    (the attention heads recorded, n_heads; o_lora_rank)."""
    m = profile(model)
    config = {key: getattr(m, key) for key in CONFIG_KEYS}
    config["compress_ratios"] = list(m.compress_ratios)
    return {**config, **extra}


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or str(t.dtype) == "torch.float8_e8m0fnu":
        return t.view(torch.uint8)
    return t


class Recorder:
    """Writes a trace: `with Recorder(path, model=...) as rec: rec.record("scores", t, layer=i, step=s)`.
    A tensor recorded twice (a weight at every step, a cache read again) is stored once and referenced."""

    def __init__(self, path, *, model: str, config: dict | None = None, variants: dict | None = None,
                 world_size: int = 1, rank: int = 0):
        if model not in PROFILES:
            raise ValueError(f"unknown model {model!r}; expected one of {', '.join(PROFILES)}")
        self.path, self.model = str(path), model
        self.config = model_config(model, **(config or {}))
        self.variants, self.tp = dict(variants or {}), {"world_size": world_size, "rank": rank}
        self.records: list[dict] = []
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes, self._files, self._stored = 0, [], {}
        os.makedirs(self.path, exist_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def record(self, stage: str, tensor, *, layer: int, step=None, rows: tuple | None = None) -> str:
        """Record `tensor` as `stage` of `layer` at `step` (None: a weight, read at every step of the
        layer); `rows` (a, b): the record is rows a..b−1 of the tensor.  Returns its key."""
        stage = canonical(stage, step is None)
        if stage not in VOCABULARY:
            raise ValueError(f"unknown stage {stage!r}; the stage names are those of docs/TRACE.md: "
                             f"{', '.join(VOCABULARY)}")
        t = torch.as_tensor(tensor).detach().cpu().clone(memory_format=torch.contiguous_format)   # the caller may
        # write it in place later (the official V4 compressor rotates its normed entry in place)
        key = self._store(_bytes_view(t))
        self.refer(stage, key, layer=layer, step=step, rows=rows)
        return key

    def refer(self, stage: str, key: str, *, layer: int, step=None, rows: tuple | None = None):
        """A record of a tensor stored already (record()'s key), or of its rows a..b−1."""
        if key not in self._stored:
            raise KeyError(f"no tensor stored under {key!r}")
        step = step_of(step)
        entry = {"layer": int(layer), "step": step.as_json() if step else None, "stage": stage,
                 "file": self._stored[key], "key": key}
        if rows is not None:
            entry["rows"] = [int(rows[0]), int(rows[1])]
        self.records.append(entry)

    def _store(self, t: torch.Tensor) -> str:
        digest = hashlib.sha1(str((t.dtype, tuple(t.shape))).encode() + t.view(-1).view(torch.uint8).numpy()
                              .tobytes()).hexdigest()[:20] if t.numel() else f"empty-{t.dtype}-{tuple(t.shape)}"
        key = f"t{digest}".replace(" ", "").replace(",", "_").replace("(", "").replace(")", "").replace(".", "_")
        if key not in self._stored:
            self._pending[key] = t
            self._pending_bytes += t.numel() * t.element_size()
            self._stored[key] = self._file_name(len(self._files))
            if self._pending_bytes >= FILE_BYTES:
                self._flush()
        return key

    @staticmethod
    def _file_name(i: int) -> str:
        return f"tensors-{i:05d}.safetensors"

    def _flush(self):
        if not self._pending:
            return
        from safetensors.torch import save_file
        name = self._file_name(len(self._files))
        save_file(self._pending, os.path.join(self.path, name))
        self._files.append(name)
        self._pending, self._pending_bytes = {}, 0

    def close(self):
        """Write the last tensors and the manifest (last, by rename: no manifest, no trace)."""
        self._flush()
        manifest = {"format": FORMAT, "version": VERSION, "model": self.model, "config": self.config,
                    "tp": self.tp, "variants": self.variants, "files": self._files, "records": self.records}
        tmp = os.path.join(self.path, MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, os.path.join(self.path, MANIFEST))


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def _need(manifest: dict, key: str, kind, where: str):
    if key not in manifest:
        raise TraceError(f"{where}: the manifest has no {key!r}")
    if not isinstance(manifest[key], kind):
        raise TraceError(f"{where}: {key!r} is a {type(manifest[key]).__name__}, expected {kind.__name__}")
    return manifest[key]


def read_manifest(path: str) -> dict:
    file = os.path.join(path, MANIFEST)
    if not os.path.isfile(file):
        raise TraceError(f"{path}: no {MANIFEST} (not a trace, or one whose writing never finished)")
    try:
        with open(file) as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{file}: not JSON ({e}): a corrupt or truncated manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TraceError(f"{file}: not a {FORMAT} manifest (format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    if manifest.get("version") != VERSION:
        raise TraceError(f"{file}: trace format version {manifest.get('version')!r}; this dsv4spec reads version {VERSION}")
    return manifest


class Trace:
    """A trace directory, checked against its model's profile on opening; `load(layer, step)` reads
    one layer-step's tensors (the layer's weights and the step's records), nothing more."""

    def __init__(self, path: str):
        self.path = str(path)
        m = read_manifest(self.path)
        where = os.path.join(self.path, MANIFEST)
        self.model = _need(m, "model", str, where)
        if self.model not in PROFILES or self.model not in JUDGED_MODELS:
            raise TraceError(f"{where}: model {self.model!r}: check-trace judges {', '.join(JUDGED_MODELS)}")
        self.config = _need(m, "config", dict, where)
        self._check_config(where)
        tp = _need(m, "tp", dict, where)
        self.world_size, self.rank = int(tp.get("world_size", 1)), int(tp.get("rank", 0))
        if not 0 <= self.rank < self.world_size:
            raise TraceError(f"{where}: tp rank {self.rank} outside world size {self.world_size}")
        self.variants = _need(m, "variants", dict, where)
        for knob, value in self.variants.items():
            if knob not in KNOBS or value not in KNOBS[knob].values:
                raise TraceError(f"{where}: variant {knob}={value!r} is no declared knob value "
                                 f"(dsv4spec rules lists the knobs)")
        self.files = _need(m, "files", list, where)
        self._records: dict = {}
        for i, r in enumerate(_need(m, "records", list, where)):
            self._add(i, r, where)
        self._open: dict = {}

    def _check_config(self, where):
        m = profile(self.model)
        for key in CONFIG_KEYS:
            want = list(m.compress_ratios) if key == "compress_ratios" else getattr(m, key)
            if key in self.config and self.config[key] != want:
                raise TraceError(f"{where}: config {key} = {self.config[key]!r}, but {self.model} has {want!r} "
                                 f"(a trace mislabelled with another model?)")

    def _add(self, i: int, r, where: str):
        if not isinstance(r, dict) or not {"layer", "step", "stage", "file", "key"} <= set(r):
            raise TraceError(f"{where}: record {i} lacks layer, step, stage, file or key")
        r = {**r, "stage": canonical(str(r["stage"]), r["step"] is None)}
        if r["stage"] not in VOCABULARY:
            raise TraceError(f"{where}: record {i}: unknown stage {r['stage']!r} (docs/TRACE.md lists the names)")
        if r["file"] not in self.files:
            raise TraceError(f"{where}: record {i} ({r['stage']}) names file {r['file']!r}, not one of the trace's files")
        layers = len(profile(self.model).compress_ratios)
        if not isinstance(r["layer"], int) or not 0 <= r["layer"] < layers:
            raise TraceError(f"{where}: record {i} ({r['stage']}): layer {r['layer']!r}, {self.model} has 0..{layers - 1}")
        try:
            step = step_of(r["step"])
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{where}: record {i} ({r['stage']}): step {r['step']!r} is not a step ({e})") from None
        except TraceError as e:
            raise TraceError(f"{where}: record {i} ({r['stage']}): {e}") from None
        slot = self._records.setdefault((r["layer"], step), {})
        if r["stage"] in slot:
            raise TraceError(f"{where}: record {i}: stage {r['stage']} of layer {r['layer']} "
                             f"{step.label() if step else '(weight)'} recorded twice")
        slot[r["stage"]] = (r["file"], r["key"], r.get("rows"))

    def layer_steps(self) -> list[tuple[int, Step]]:
        """Every recorded (layer, step), in the order a forward runs them: steps by position, then layers."""
        return sorted(((layer, step) for layer, step in self._records if step is not None),
                      key=lambda ls: (ls[1].start_pos, ls[1].row, ls[0]))

    def stages(self, layer: int, step: Step) -> list[str]:
        return sorted(set(self._records.get((layer, step), {})) | set(self._records.get((layer, None), {})))

    def load(self, layer: int, step: Step) -> dict:
        """name -> ndarray of one layer-step: floats as float32 (BF16 exactly), FP8 as its bytes."""
        out = {}
        for slot in (self._records.get((layer, None), {}), self._records[layer, step]):
            for stage, (file, key, rows) in slot.items():
                out[stage] = self._tensor(file, key, rows, stage, layer, step)
        return out

    def _tensor(self, file: str, key: str, rows, stage: str, layer: int, step: Step) -> np.ndarray:
        where = f"{self.path}: layer {layer} {step.label()} stage {stage}"
        handle = self._handle(file)
        try:
            t = handle.get_tensor(key)
        except Exception as e:      # safetensors' own errors: a key it lacks, bytes it cannot read
            raise TraceError(f"{where}: tensor {key!r} unreadable in {file} ({type(e).__name__}: {e})") from None
        t = _bytes_view(t)
        if rows is not None:
            if len(rows) != 2 or not 0 <= rows[0] <= rows[1] <= t.shape[0]:
                raise TraceError(f"{where}: rows {rows} outside the tensor's {t.shape[0]}")
            t = t[rows[0]:rows[1]]
        a = (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
        _check_dtype(a, stage, where)
        return a

    def _handle(self, file: str):
        if file not in self._open:
            from safetensors import safe_open
            full = os.path.join(self.path, file)
            if not os.path.isfile(full):
                raise TraceError(f"{self.path}: tensor file {file} is missing")
            try:
                self._open[file] = safe_open(full, framework="pt")
            except Exception as e:
                raise TraceError(f"{full}: not a readable safetensors file, corrupt or truncated "
                                 f"({type(e).__name__}: {e})") from None
            while len(self._open) > 4:
                self._open.pop(next(iter(self._open)))
        return self._open[file]


def _check_dtype(a: np.ndarray, stage: str, where: str):
    kind = a.dtype.kind
    want = ("b" if stage in BOOLEAN else "iu" if stage in INTEGER else "u" if stage in BYTES else "f")
    if stage == "candidates" and kind in "iu":      # a re-index layer's pool given as 0/1
        return
    if kind not in want:
        raise TraceError(f"{where}: dtype {a.dtype}, a stage that cannot have it (expected "
                         f"{dict(b='bool', iu='integers', u='bytes (uint8 or float8)', f='floating point')[want]})")
