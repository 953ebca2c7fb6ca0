"""Judging a trace: every recorded stage by the judge `verify` uses for it (properties/path.py STAGES,
properties/attn.py ATTN_STAGES and REUSE_STAGES), teacher-forced on the trace's own tensors, one
layer-step at a time; then the judgements across steps and ranks (trace.steps).  No judgement is
written here: this module builds the judges' case from a layer-step and reports what they say."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..properties import attn as attn_checks
from ..properties import compressor as compressor_checks
from ..properties import path as path_checks
from ..properties import pool as pool_checks
from ..properties.path import LayerCase, layer_kind
from ..spec import compressor as spec_compressor
from ..spec.models import profile
from ..spec.pool import layer_role
from ..spec.rules import check_variants
from .format import Step, TraceError

PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"

# the tensors of a judge's stage, where they are not the stage's own name
STAGE_TENSORS = {"q_fp4": ("q_packed", "q_scales"), "k_fp4": ("k_packed", "k_scales"), "scored_k": ("scores",)}
# a stage whose rule depends on the layer's kind: the re-index layer's top-k is POOL.REINDEX's
RULE_OF_KIND = {("topk", "reindex"): "POOL.REINDEX"}
# the indexer's stages per head, which tensor parallelism splits over the ranks (V4 L388, L422-423)
INDEX_HEADS = {"q", "q_rot", "q_had", "q_fp4", "w_raw", "weights", "scored_k", "scores"}
# stages of a rank judged from every rank's (trace.steps): wo_b's all-reduce, the indexer's all-reduced scores
ACROSS_RANKS = {"out", "scores", "scored_k"}
# stages whose judge reads each token's rows alone, and the step's tensors it reads by token: judged
# CHUNK tokens at a time, each chunk a case of its own from its first token's position, so that the
# judges' float64 copies (and the attention output's bounds, every listed KV row per token) stay a chunk's
ROW_LOCAL = {"q_latent": ("x", "q_latent"), "q_norm": ("q_latent", "q_norm"), "q_attn": ("q_norm", "q_attn"),
             "q_rescale": ("q_attn", "q_rescale"), "q_attn_rot": ("q_rescale", "q_attn_rot"),
             "kv_proj": ("x", "kv_proj"), "kv_normed": ("kv_proj", "kv_normed"), "kv_rot": ("kv_normed", "kv_rot"),
             "kv_window": ("kv_rot", "kv_window"), "o": ("q_attn_rot", "indices", "o"), "o_derot": ("o", "o_derot"),
             "o_lora": ("o_derot", "o_lora"), "out": ("o_lora", "out")}
CHUNK = 256
# each stage's own input: the activations it is computed from (its weights aside; docs/TRACE.md's "from")
FROM = {"q": ("qr",), "q_rot": ("q",), "q_had": ("q_rot",), "q_fp4": ("q_had", "q_rot"), "k": ("latent",),
        "k_normed": ("k",), "k_rot": ("k_normed", "index_entry"), "k_had": ("k_rot",), "k_fp4": ("k_had", "k_rot"),
        "w_raw": ("x",), "weights": ("w_raw",), "scores": ("q_packed", "k_packed", "weights"),
        "scored_k": ("k_packed", "published_k_packed"), "candidates": ("scores",), "topk": ("scores",),
        "indices": ("window_idx", "topk", "compressed_idx", "source_topk"), "q_latent": ("x",), "q_norm": ("q_latent",),
        "qr": ("q_norm",), "q_attn": ("q_norm",), "kv_proj": ("x",), "kv_normed": ("kv_proj",), "q_rescale": ("q_attn",),
        "q_attn_rot": ("q_rescale",), "kv_rot": ("kv_normed",), "kv_window": ("kv_rot",), "cmp_rot": ("kv_entries",),
        "cmp": ("cmp_rot",), "kv": ("kv_window", "window_cache", "cmp", "kv_cache"), "o": ("q_attn_rot", "kv", "indices"),
        "o_derot": ("o",), "o_lora": ("o_derot",), "out": ("o_lora",), "out_partial": ("o_lora",),
        "cmp_pooled": ("x",), "cmp_normed": ("cmp_pooled",), "idx_cmp_pooled": ("x",),
        "idx_cmp_normed": ("idx_cmp_pooled",)}
LAYER_INPUT = "x"           # every chain's root: recorded or not, it does not make a trace start later
MISSING = re.compile(r"stage '(\w+)' missing")
# each stage's axes, to name a failure's place: t (token), h (head), c (channel), e (entry), s (slot)
AXES = {"scores": "te", "topk": "tk", "indices": "tk", "window_idx": "tk", "compressed_idx": "tk", "weights": "th",
        "w_raw": "th", "candidates": "te", "q": "thc", "q_rot": "thc", "q_had": "thc", "q_attn": "thc",
        "q_rescale": "thc", "q_attn_rot": "thc", "o": "thc", "o_derot": "thc", "o_lora": "tgc", "kv": "rc",
        "cmp": "ec", "cmp_rot": "ec", "cmp_pooled": "ec", "cmp_normed": "ec", "idx_cmp_pooled": "ec",
        "idx_cmp_normed": "ec", "k": "ec", "k_normed": "ec", "k_rot": "ec", "k_had": "ec"}
AXIS_NAMES = {"t": "position", "h": "head", "c": "channel", "e": "entry", "k": "list slot", "g": "head group",
              "r": "row", "s": "ring slot"}


@dataclass
class Verdict:
    """One stage of one layer-step: its rule, PASS, FAIL or ERROR, and why."""
    layer: int
    step: Step
    stage: str
    rule: str
    status: str
    detail: str = ""
    rank: int | None = None

    def place(self) -> str:
        rank = f", rank {self.rank}" if self.rank is not None else ""
        return f"layer {self.layer}, {self.step.label()}{rank}, stage {self.stage}"

    def as_json(self) -> dict:
        return {"layer": self.layer, "step": self.step.as_json(), "stage": self.stage, "rule": self.rule,
                "status": self.status, "detail": self.detail, **({"rank": self.rank} if self.rank is not None else {})}


class TraceTarget:
    """What the judges ask of a target, answered from the trace: its declared variants, and its RoPE
    table when recorded (rope_freqs; else the judges take the spec's fp32 table and its slack)."""

    name = "trace"
    contract = None
    provider = None

    def __init__(self, variants: dict):
        self.variants = check_variants(variants)
        self.table = None

    def variant(self, knob: str) -> str:
        return self.variants[knob]

    def has(self, *ops: str) -> bool:
        return ops == ("rope_freqs",) and self.table is not None

    def rope_freqs(self, model: str, layer: int, use: str):
        return self.table


@dataclass(frozen=True, repr=False)
class TraceCase(LayerCase):
    """A layer-step of a trace as the judges' LayerCase (its tokens from the step, not from x)."""
    tokens: int = 0

    @property
    def seqlen(self) -> int:
        return self.tokens


def case_of(model: str, layer: int, step: Step, tensors: dict) -> TraceCase:
    label = f"trace: {model} layer {layer}, {step.label()}"
    return TraceCase(label, model, layer, step.start_pos, tuple(tensors.items()), step.seqlen)


def stage_table(case) -> list[tuple[str, str, object, tuple]]:
    """(stage, rule, judge, its tensors) of the case's layer kind, in the order the layer computes them."""
    kind = layer_kind(case)
    table = [(s.name, RULE_OF_KIND.get((s.name, kind), s.rule_id), s.judge) for s in path_checks.STAGES
             if kind in s.kinds]
    if kind == "candidate_source":          # the pin first: the pool's clause a port misses past 2048 blocks
        at = [name for name, *_ in table].index("candidates")
        table.insert(at, ("candidates", "POOL.PIN_NEWEST", pool_checks.judge_pinned_newest))
    if kind == "csa":                       # the indexer's own compressor makes the index K it rotates
        at = [name for name, *_ in table].index("k_rot")
        table[at:at] = compressor_stages(case, compressor_checks.INDEX_COMPRESSOR)
    if kind == "reuse":
        table += list(attn_checks.REUSE_STAGES)
    table += compressor_stages(case, compressor_checks.KV_COMPRESSOR)
    keep = (attn_checks._projects, attn_checks._projects_output)     # in a trace: judged where recorded
    table += [(name, rule, judge) for name, rule, applies, judge in attn_checks.ATTN_STAGES
              if applies in keep or applies(case)]
    return [(name, rule, judge, STAGE_TENSORS.get(name, (name,))) for name, rule, judge in table]


def compressor_stages(case, prefix: str) -> list[tuple[str, str, object]]:
    """The stages of a compressor of a compressing layer (prefix: properties/compressor.py's names of the
    KV compressor's or the V4 CSA indexer's): its pooled vectors (a prefill's; ratio 1: every step's; a
    decode step's of a gated compressor are CMP.STATE's, trace.steps) and its RMSNorm."""
    ratio = profile(case.model).ratio(case.layer)
    if not ratio:
        return []
    pooled = [(prefix + "pooled", compressor_checks.pooled_rule(case.model, ratio),
               functools.partial(compressor_checks.judge_pooled, prefix=prefix))]
    normed = [(prefix + "normed", "CMP.NORM", functools.partial(compressor_checks.judge_normed, prefix=prefix))]
    return (pooled if case.start_pos == 0 or ratio == 1 else []) + normed


def judge_layer_step(target: TraceTarget, model: str, layer: int, step: Step, tensors: dict, wanted,
                     world_size: int = 1) -> list[Verdict]:
    """Every recorded stage of one layer-step judged (`wanted(rule)`: the rules selected)."""
    check_shapes(model, layer, step, tensors, world_size)
    case = case_of(model, layer, step, tensors)
    target.table = tensors.get("rope_freqs")
    verdicts = []
    for stage, rule, judge, names in stage_table(case):
        if world_size > 1 and stage in ACROSS_RANKS:
            continue                       # judged over every rank (trace.steps)
        if not wanted(rule) or not any(n in tensors for n in names) or starts_here(stage, tensors):
            continue                       # not recorded, or the trace's first stage: n/i
        verdict = Verdict(layer, step, stage, rule, PASS)
        verdicts.append(_run_by_rows(judge, target, case, tensors, verdict) if stage in ROW_LOCAL
                        else _run(judge, target, case, tensors, verdict))
    if world_size > 1 and "out_partial" in tensors and wanted("FP8.LINEAR"):
        judge = attn_checks._projection("out_partial", "attn_wo_b", "o_lora")
        verdicts.append(_run(judge, target, case, tensors, Verdict(layer, step, "out_partial", "FP8.LINEAR", PASS)))
    return verdicts


def upstream(stage: str) -> set[str]:
    """Every activation a stage is computed from, directly or through the stages before it."""
    names = set(FROM.get(stage, ()))
    for name in FROM.get(stage, ()):
        names |= upstream(name)
    return names


def starts_here(stage: str, tensors: dict) -> bool:
    """Whether the trace starts at this stage: nothing it is computed from is recorded (the layer's x
    aside), so it is an input of the stages after it, not a stage judged (n/i).  A stage recorded after
    some of what it is computed from, but without its own input, is judged: an ERROR naming that input."""
    return bool(FROM.get(stage)) and not (upstream(stage) - {LAYER_INPUT}) & set(tensors) \
        and not set(FROM[stage]) & set(tensors)


def _run_by_rows(judge, target, case, tensors, verdict: Verdict) -> Verdict:
    """A judge whose tokens are independent, run CHUNK tokens at a time: memory bounded on a long prefill."""
    names = [n for n in ROW_LOCAL[verdict.stage] if n in tensors]
    for start in range(0, case.tokens, CHUNK):
        rows = {**tensors, **{n: tensors[n][start:start + CHUNK] for n in names}}
        rows = reads_only(rows) if verdict.stage == "o" else rows
        _run(judge, target, chunk_case(case, rows, start), rows, verdict, start)
        if verdict.status != PASS:
            if verdict.status == FAIL and case.tokens > CHUNK:
                verdict.detail += chunk_said(case, start)
            break
    return verdict


def reads_only(rows: dict) -> dict:
    """A chunk's attention with only the KV rows its lists name, the lists renumbered into them: the same
    rows gathered, so the same values judged, without the whole step's KV converted and scanned per chunk
    (which made a prefill's judge grow with its tokens squared).  Lists naming a row the KV lacks, or no
    row at all (the judge reads row 0 for −1), are left as they are."""
    kv, indices = rows.get("kv"), rows.get("indices")
    if kv is None or indices is None:
        return rows
    named = indices != -1
    used = np.unique(indices[named])
    if not used.size or used[0] < 0 or used[-1] >= len(kv):
        return rows
    renumbered = np.where(named, np.searchsorted(used, indices), -1).astype(indices.dtype)
    return {**rows, "kv": kv[used], "indices": renumbered}


def chunk_said(case: TraceCase, start: int) -> str:
    """What a chunked FAIL's counts cover: the chunk judged last, not the whole step."""
    end = min(start + CHUNK, case.tokens)
    later = "; the step's later tokens were not judged" if end < case.tokens else ""
    return (f" [judged {CHUNK} tokens at a time: the counts are of positions {case.start_pos + start}"
            f"-{case.start_pos + end - 1}, the first chunk that departs{later}]")


def chunk_case(case: TraceCase, rows: dict, first_token: int) -> TraceCase:
    """The case of a chunk of a step's tokens: its rows, from its first token's position (its label the step's)."""
    return replace(case, start_pos=case.start_pos + first_token, inputs=tuple(rows.items()),
                               tokens=min(CHUNK, case.tokens - first_token))


def _run(judge, target, case, tensors, verdict: Verdict, first_token: int = 0) -> Verdict:
    try:
        judge(target, case, tensors)
    except KeyError as e:
        verdict.status, verdict.detail = ERROR, record_this(str(e).strip("'\""), verdict.stage)
    except AssertionError as e:
        missing = MISSING.search(str(e))
        if missing:
            verdict.status, verdict.detail = ERROR, record_this(missing.group(1), verdict.stage)
        else:
            verdict.status, verdict.detail = FAIL, locate(str(e), verdict, first_token)
    except (ValueError, IndexError, TypeError) as e:      # a recorded tensor the judge cannot read
        verdict.status, verdict.detail = ERROR, f"{type(e).__name__}: {e} (a tensor of another shape than the stage's?)"
    return verdict


def record_this(name: str, stage: str) -> str:
    return f"stage {stage} is judged from {name}, which the trace does not hold: record {name!r}"


AT = re.compile(r"at (?:\(([\d, ]+)\)|token (\d+) head (\d+) channel (\d+)|\(t=(\d+), s=(\d+)\))")


def locate(message: str, v: Verdict, first_token: int = 0) -> str:
    """The judge's message, led by the failure's place: position (start_pos + t), head, channel.  A
    chunk's message (first_token: the chunk's in the step) has its token index counted from the step's
    first token, as the whole step's judge would have it (its count of values off is the chunk's)."""
    m = AT.search(message)
    if not m:
        return message
    if first_token:
        message = shift_tokens(message, first_token)
        m = AT.search(message)
    if m.group(1):
        index = [int(i) for i in m.group(1).split(",")]
    else:
        index = [int(i) for i in (m.group(2, 3, 4) if m.group(2) else m.group(5, 6))]
    axes = AXES.get(v.stage, "t" + "hc"[3 - len(index):] if len(index) <= 3 else "")
    if m.group(2):
        axes = "thc"
    parts = []
    for axis, i in zip(axes, index):
        parts.append(f"{AXIS_NAMES[axis]} {v.step.start_pos + i if axis == 't' else i}")
    return (", ".join(parts) + ": " if parts else "") + message


def shift_tokens(message: str, first_token: int) -> str:
    """The message with the first index (the token's, in a chunk) of every place it names moved on by first_token."""
    def shifted(m: re.Match) -> str:
        group = next(g for g in (1, 2, 5) if m.group(g))
        at = m.start(group) - m.start()
        token = re.match(r"\d+", m.group(group)).group()
        return m.group()[:at] + str(int(token) + first_token) + m.group()[at + len(token):]
    return AT.sub(shifted, message)


# ------------------------------------------------------------------------------------------------
# shapes against the config
# ------------------------------------------------------------------------------------------------
def expected_shapes(model: str, layer: int, step: Step, config_heads: int | None = None) -> dict:
    """The shapes the config fixes for the stages a trace may hold (−1: any)."""
    m = profile(model)
    T = step.seqlen
    shapes = {"x": (T, m.dim), "qr": (T, m.q_lora_rank), "q": (T, m.index_n_heads, m.index_head_dim),
              "q_rot": (T, m.index_n_heads, m.index_head_dim), "weights": (T, m.index_n_heads),
              "w_raw": (T, m.index_n_heads), "kv_normed": (T, m.head_dim), "kv_proj": (T, m.head_dim),
              "kv_rot": (T, m.head_dim), "kv_window": (T, m.head_dim), "q_latent": (T, m.q_lora_rank),
              "q_norm": (T, m.q_lora_rank), "out": (T, m.dim), "out_partial": (T, m.dim),
              "window_cache": (m.window, m.head_dim), "rope_freqs": (m.rope_dim // 2,)}
    if m.ratio(layer):
        E = (step.start_pos + T) // m.ratio(layer)
        shapes.update(kv_entries=(E, m.head_dim), kv_cache=(E, m.head_dim), latent=(E, m.head_dim),
                      index_entry=(E, m.index_head_dim), scores=(T, E))
        width = spec_compressor.channel_factor(model, m.ratio(layer)) * m.head_dim
        shapes.update(cmp_wkv=(width, m.dim), cmp_wgate=(width, m.dim), cmp_ape=(m.ratio(layer), width),
                      cmp_norm=(m.head_dim,))
        if layer_role(m, layer).kind == "csa":          # the indexer's own compressor (V4-model L398)
            width = spec_compressor.channel_factor(model, m.ratio(layer)) * m.index_head_dim
            shapes.update(idx_cmp_wkv=(width, m.dim), idx_cmp_wgate=(width, m.dim),
                          idx_cmp_ape=(m.ratio(layer), width), idx_cmp_norm=(m.index_head_dim,))
    return shapes


RESHAPE = {"q": "index", "q_attn": "main"}       # stages an engine may record flat [T, H·D]


def check_shapes(model: str, layer: int, step: Step, tensors: dict, world_size: int = 1):
    """Flat q and q_attn made [T, H, D] in place; TraceError where a shape is not the config's."""
    m = profile(model)
    for name, head_dim in (("q", m.index_head_dim), ("q_attn", m.head_dim)):
        a = tensors.get(name)
        if a is not None and a.ndim == 2 and a.shape[-1] % head_dim == 0:
            tensors[name] = a.reshape(a.shape[0], -1, head_dim)
    lora, derot, wo_a = (tensors.get(n) for n in ("o_lora", "o_derot", "attn_wo_a"))
    if lora is not None and lora.ndim == 2 and derot is not None and wo_a is not None:
        tensors["o_lora"] = lora.reshape(lora.shape[0], derot[0].size // wo_a.shape[1], -1)
    for name, shape in expected_shapes(model, layer, step).items():
        a = tensors.get(name) if world_size == 1 or name not in INDEX_HEADS else None
        if a is not None and tuple(a.shape) != shape:
            raise TraceError(f"layer {layer}, {step.label()}: {name} has shape {tuple(a.shape)}, but {model}'s "
                             f"config gives {shape} (a trace of another model, layer or step?)")


@dataclass
class Judged:
    """All verdicts of a trace, in the order the forward computed them; the layer-steps read."""
    verdicts: list = field(default_factory=list)
    layer_steps: int = 0
