"""The target contract: the Target that wraps a provider's operations, the errors a call can end
in, and the results' checks (dtype, device, shape) made where each result comes back.

runner/target.py finds and loads targets; exec_target.py wraps a port over PROTOCOL.md; both build
on this module, which imports neither.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import math
import re
import signal
import sys
import threading
import time
import types
from importlib import metadata

from ..spec.rules import EXTENSIONS, KNOBS, MODELS, check_variants
from ..properties.families import FAMILY_MODULES

DEFAULT_TIMEOUT_S = 60.0       # one operation call; `verify --timeout` changes it


MAX_TIMEOUT_S = 86400.0     # a day: the system's timers refuse far larger ones (1e10 s failed every call)


def timeout_seconds(text) -> float:
    """A --timeout value: a positive, finite number of seconds, at most a day (nan, inf or 1e10 would
    blame every call on the target)."""
    seconds = float(text)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ValueError(f"must be a positive, finite number of seconds, at most {MAX_TIMEOUT_S:g} (a day), "
                         f"got {seconds:g}")
    return seconds


# The version of this contract (the operations, their arguments and results, the metadata a target
# declares), and when each version came and what it changed (docs/ADAPTERS.md, "Contract versions").
CONTRACT_VERSION = 8
CONTRACT_CHANGES = {
    1: ("2026-11-30", "operations by canonical name; NAME, DEVICE, VARIANTS, EXTENSIONS, INPUT_DTYPES; results "
        "checked strictly; kv_qdq(x, fmt) for fp4_e4m3 and fp8_e8m0_32"),
    2: ("2026-12-01", "kv_qdq(x, fmt) also takes fp4_e8m0 (PATH.K.CACHE); window_ring, index_weights_v32; "
        "exec:CMD ports (PROTOCOL.md, protocol 1)"),
    3: ("2026-12-01", "kv_qdq split into kv_qdq_fp4_e4m3, kv_qdq_fp8_e8m0_32 and kv_qdq_fp4_e8m0 (kv_qdq(x, fmt) "
        "still provides them); index_scores_raw; MODELS; INPUT_DTYPE reaches every operation; a named target "
        "claims conformance unless CLAIMS_CONFORMANCE = False"),
    4: ("2026-12-02", "SHAPES; fp8_linear, sparse_attention, attention_q, attention_output, attention_layer"),
    5: ("2026-12-05", "CONTRACT, the version a target was written against; a format kv_qdq(x, fmt) took only "
        "from a later version is asked of an undeclared target only when it answers it"),
    6: ("2026-12-05", "attention_layer starts from the attention input x (inputs attn_wq_a, attn_q_norm, attn_wq_b, attn_wkv, attn_kv_norm; "
        "stages q_latent, q_norm, q_attn, kv_proj, kv_normed) on cases of up to 32 tokens; a target declaring an "
        "earlier version, or undeclared and not answering such a case, is given q_attn and kv_normed as before"),
    7: ("2026-12-05", "attention_layer ends with the output projections on the cases from x (inputs attn_wo_a, a BF16 "
        "[groups·o_lora_rank, H·D/groups], attn_wo_b and attn_wo_b_scale, an FP8 linear; stages o_lora, out); a "
        "target declaring an earlier version, or none and not answering a case with them by o_lora, is never given them "
        "nor judged on o_lora and out"),
    8: ("2026-12-07", "sparse_attention_cache (attention over a packed cache: LAYOUT.V4.MAIN, LAYOUT.V32.MLA or "
        "FlashMLA's paged form of either; CACHE_FORMS) and, from it, sparse_attention where a target has none; "
        "index_scores_fp8 and index_scores_fp8_cache (V3.2's logits from E4M3 q and k, k as given or as a "
        "LAYOUT.V32.INDEX_K cache, DeepGEMM's pages too); SHAPES of index_topk (k); row_parallel_reduce "
        "(ATTN.TP.REDUCE)"),
}


class NotImplementedOp(AttributeError):
    """The target does not provide an operation a check needs (an AttributeError, so that tools
    probing attributes, such as Hypothesis on a @given argument, see a plain missing attribute)."""


class TargetNotFound(ValueError):
    """The target spec names nothing that exists (a usage error: exit status 2)."""


class NothingImplemented(TargetNotFound):
    """The target provides none of the contract's operations (a usage error: exit status 2)."""


class TargetLoadError(Exception):
    """The target exists but could not be loaded: its import or constructor raised (exit status 3)."""


class ContractError(TypeError):
    """An operation returned something the contract does not allow (reported ERROR)."""


class OperationTimeout(BaseException):
    """An operation did not return within the per-operation time limit (reported TIMEOUT).  Not an
    Exception, so that Hypothesis stops at once instead of shrinking by calling it again."""


# ------------------------------------------------------------------------------------------------
# What each operation returns: dtypes per output (None: not checked); shapes where fixed
# ------------------------------------------------------------------------------------------------

U8, BOOL = ("uint8",), ("bool",)
VALUES = ("float32", "bfloat16")        # bf16 widens exactly; no other float is accepted
INDEX = ("int64", "int32")              # the official top-k returns int32

RESULTS = {
    "e2m1_encode": (U8,), "e2m1_decode": (VALUES,), "e4m3_encode": (U8,), "e4m3_decode": (VALUES,),
    "e8m0_decode": (VALUES,), "bf16_round": (VALUES,), "fp4_pack": (U8,), "fp4_unpack": (U8,),
    "fp4_e4m3_quantize": (U8, U8), "fp4_e4m3_dequantize": (VALUES,),
    "fp4_e8m0_quantize": (U8, U8), "fp4_e8m0_dequantize": (VALUES,),
    "fp8_quantize": (U8, U8), "fp8_dequantize": (VALUES,), "fp8_qdq": (VALUES,), "fp8_linear": (VALUES,),
    "hadamard": (VALUES,), "index_rotate": (VALUES,), "index_weights": (VALUES,),
    "index_weights_v32": (VALUES,),
    "index_scores": (VALUES,), "index_scores_fp4": (VALUES,), "index_scores_raw": (VALUES,), "index_visible": (INDEX,),
    "index_topk": (INDEX,), "candidate_blocks": (BOOL,), "reindex_topk": (INDEX,),
    "compress": (VALUES,), "compressor_feed": (None, VALUES),
    "entry_pack": (U8,), "entry_unpack": (VALUES,),
    "rope_freqs": (VALUES,), "rope_rotate": (VALUES,), "rope_quantize": (U8, U8), "kv_qdq": (VALUES,),
    "kv_qdq_fp4_e4m3": (VALUES,), "kv_qdq_fp8_e8m0_32": (VALUES,), "kv_qdq_fp4_e8m0": (VALUES,),
    "window_index": (INDEX,), "compressed_index": (INDEX,), "attention_index": (INDEX,),
    "window_ring": (INDEX,),
    "pool_scan_topk": (INDEX,),
    "sparse_attention": (VALUES,), "attention_q": (VALUES,), "attention_output": (VALUES,),
    "sparse_attention_cache": (VALUES,), "index_scores_fp8": (("float32",),), "index_scores_fp8_cache": (("float32",),),
    "row_parallel_reduce": (VALUES,),
}
# Per-format operations a bundled one also provides: kv_qdq(x, fmt) is kv_qdq_<fmt>(x).
SPLIT = {"kv_qdq_fp4_e4m3": ("kv_qdq", "fp4_e4m3"), "kv_qdq_fp8_e8m0_32": ("kv_qdq", "fp8_e8m0_32"),
         "kv_qdq_fp4_e8m0": ("kv_qdq", "fp4_e8m0")}
# The contract version from which the bundled form took a format (absent: from version 1): an
# adapter written before it never had to.
BUNDLED_SINCE = {"kv_qdq_fp4_e8m0": 2}
# Operations whose result is not a tensor (a record, an opaque state, a number, a dict of stages).
NO_TENSOR_RESULT = {"layer_role", "compressor_state", "kv_bytes_per_token", "window_bytes_per_layer",
                    "indexer_macs_per_token", "core_attention_macs", "index_layer",
                    "attention_scale", "attention_layer"}
# Converters to name when a result misses its contract (dsv4spec.adapters).
HINTS = {
    "uint8": "dsv4spec.adapters.as_bytes (float8/float4/e8m0/int8 views), e8m0_from_pow2 (fp32 scales)",
    "int64": "dsv4spec.adapters.as_index",
}
_SAME = lambda a, *_: tuple(a[0].shape)                                      # noqa: E731


def _lead(x, last):
    return tuple(x.shape[:-1]) + (last,)


def _blocks(block):
    return lambda a, *_: (_lead(a[0], a[0].shape[-1] // 2), _lead(a[0], a[0].shape[-1] // block))


SHAPES = {
    "e2m1_encode": _SAME, "e2m1_decode": _SAME, "e4m3_encode": _SAME, "e4m3_decode": _SAME,
    "e8m0_decode": _SAME, "bf16_round": _SAME, "hadamard": _SAME, "index_rotate": _SAME,
    "fp8_qdq": _SAME, "index_visible": _SAME, "index_weights_v32": _SAME,
    "sparse_attention": _SAME, "attention_q": _SAME, "attention_output": _SAME,
    "fp8_linear": lambda a, *_: _lead(a[0], a[1].shape[0]),
    "sparse_attention_cache": lambda a, *_: _lead(a[0], 512),
    "index_scores_fp8": lambda a, *_: (a[0].shape[0], a[1].shape[0]),
    "row_parallel_reduce": lambda a, *_: tuple(a[0].shape[1:]),
    "fp4_pack": lambda a, *_: _lead(a[0], a[0].shape[-1] // 2),
    "fp4_unpack": lambda a, *_: _lead(a[0], a[0].shape[-1] * 2),
    "fp4_e4m3_quantize": _blocks(16), "fp4_e8m0_quantize": _blocks(32),
    "fp8_quantize": lambda a, kw: (tuple(a[0].shape),
                                   _lead(a[0], a[0].shape[-1] // (a[1] if len(a) > 1 else kw["block"]))),
}


def check_result(op: str, result, args: tuple, kwargs: dict):
    """Raise ContractError unless `result` is what `op` must return for these inputs."""
    contract = RESULTS.get(op)
    if contract is None:
        return
    import torch
    outputs = result if isinstance(result, tuple) else (result,)
    if len(contract) > 1 and (not isinstance(result, tuple) or len(result) != len(contract)):
        raise ContractError(f"{op} returned {_kind(result)}; the contract is a tuple of {len(contract)} tensors")
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    try:
        shapes = SHAPES[op](args, kwargs) if op in SHAPES else None
    except Exception:       # noqa: BLE001 -- inputs the check chose to be malformed
        shapes = None
    shapes = (shapes,) if shapes is not None and len(contract) == 1 else shapes
    for i, (out, dtypes) in enumerate(zip(outputs, contract)):
        if dtypes is None:
            continue
        what = f"{op} output {i}" if len(contract) > 1 else f"{op} result"
        if not isinstance(out, torch.Tensor):
            raise ContractError(f"{what} is {_kind(out)}; expected a torch tensor of {' or '.join(dtypes)} "
                                "(torch.from_numpy converts an array)")
        dtype = str(out.dtype).removeprefix("torch.")
        if dtype not in dtypes:
            hint = HINTS.get(dtypes[0])
            raise ContractError(f"{what} has dtype {dtype}; expected {' or '.join(dtypes)}"
                                + (f" (converters: {hint})" if hint else ""))
        if devices and out.device.type not in devices:
            raise ContractError(f"{what} is on {out.device}; expected the inputs' device ({', '.join(devices)})")
        # Only a layout difference (size-1 or flattened dimensions) is the contract's business; a
        # wrong number of elements (a wrong block count) is left to the rule that fixes it.
        if shapes is not None and tuple(out.shape) != tuple(shapes[i]) and out.numel() == _numel(shapes[i]):
            raise ContractError(f"{what} has shape {tuple(out.shape)}; expected {tuple(shapes[i])} for input "
                                f"shape {tuple(args[0].shape)} (dsv4spec.adapters.reshape_like fixes "
                                "extra size-1 or flattened dimensions)")


def _owned(result):
    """The result with every tensor in it copied, so that the suite owns what it compares (a
    CUDA-graph-style target returns the same static buffers from every call)."""
    import torch
    if isinstance(result, torch.Tensor):
        return result.clone()
    if isinstance(result, (tuple, list)):
        items = [_owned(r) for r in result]
        if all(a is b for a, b in zip(items, result)):
            return result                   # nothing to copy (a record such as layer_role's)
        return type(result)(*items) if hasattr(result, "_fields") else type(result)(items)
    if isinstance(result, dict):
        return {k: _owned(v) for k, v in result.items()}
    return result


def _tensor_copies(args: tuple, kwargs: dict) -> dict:
    """{argument position or keyword: a copy} of every tensor argument."""
    import torch
    given = {**dict(enumerate(args)), **kwargs}
    return {k: v.detach().clone() for k, v in given.items() if isinstance(v, torch.Tensor)}


def _with_copies(args: tuple, kwargs: dict, copies: dict) -> tuple[tuple, dict]:
    """args and kwargs with each tensor replaced by its copy (`_tensor_copies`)."""
    return (tuple(copies.get(i, a) for i, a in enumerate(args)),
            {k: copies.get(k, v) for k, v in kwargs.items()})


def _check_inputs_kept(op: str, before: dict, args: tuple, kwargs: dict, fn):
    """Raise ContractError when the call changed a tensor argument (bit for bit, NaNs included)."""
    given = {**dict(enumerate(args)), **kwargs}
    for key, copy in before.items():
        if not _same_bits(copy, given[key]):
            raise ContractError(f"{op} modified its input {_argument_name(fn, key)} in place; expected the "
                                "inputs to be left as they were given (copy before writing)")


def _same_bits(a, b) -> bool:
    import torch
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    # contiguous first: a strided view (a column of a wider tensor) cannot be viewed as bytes
    flat = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)  # noqa: E731
    return torch.equal(flat(a).cpu(), flat(b).cpu())


def _argument_name(fn, key) -> str:
    if isinstance(key, str):
        return repr(key)
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return repr(params[key].name)
    except (TypeError, ValueError, IndexError):
        return f"argument {key}"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _kind(x) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    return f"a {type(x).__module__}.{type(x).__name__}"


# ------------------------------------------------------------------------------------------------
# The per-operation time limit and the watch a supervising process reads
# ------------------------------------------------------------------------------------------------

class Watch:
    """Where a target process is: the operation now running (None between calls).  A supervisor
    (workers.py, dsv4spec/guard.py) replaces `report` to see a call that never returns, even in C
    code, and `port` to end the process groups of the ports left behind by a process it ends."""

    def __init__(self):
        self.report = lambda op: None
        self.port = lambda pgid: None       # the process group of a port the target started (exec_target)
        self.safe_point = lambda: None      # the command's: a SIGTERM or SIGINT it recorded ends the run here


WATCH = Watch()


class _deadline:
    """SIGALRM after `seconds` in the main thread (Python code only; C code that never returns is
    caught by --isolate's supervisor)."""

    def __init__(self, seconds: float, op: str):
        self.seconds, self.op = seconds, op
        self.armed = bool(seconds) and threading.current_thread() is threading.main_thread() \
            and hasattr(signal, "setitimer")

    def __enter__(self):
        WATCH.safe_point()
        WATCH.report(self.op)
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            self.left = signal.setitimer(signal.ITIMER_REAL, self.seconds)[0]     # another timer's (pytest-timeout's)
            self.start = time.monotonic()

    def _fire(self, *_):
        raise OperationTimeout(f"{self.op} did not return within {self.seconds:g} s")

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            if self.left:                   # give the other timer back what it had left
                signal.setitimer(signal.ITIMER_REAL, max(self.left - (time.monotonic() - self.start), 1e-3))
        WATCH.report(None)
        WATCH.safe_point()
        return False


# ------------------------------------------------------------------------------------------------
# Targets
# ------------------------------------------------------------------------------------------------

def _scores_from_raw(raw_scores):
    """index_scores(q, k, w, visible, 'bf16') through index_scores_raw(q, k, raw_w, visible, model):
    V4.1's factor is 2^-6 exactly (IDX.WEIGHT.SCALE), so raw_w = 64·w gives back w exactly and the
    target's own factorisation is judged by the same score rules.  The 'fp32' scores (V3.2) have no
    such exact preimage: those examples are not asked for (or, outside Hypothesis, n/i)."""
    import torch

    def index_scores(q, k, w, visible, score_dtype="bf16"):
        if score_dtype != "bf16":
            _not_asked(f"index_scores with score_dtype {score_dtype!r} through index_scores_raw (V4.1's factor only)")
        raw = w * 64.0
        if not bool(torch.isfinite(raw.to(torch.bfloat16)).all()):
            _not_asked("index_scores through index_scores_raw: 64·w beyond BF16")
        return raw_scores(q, k, raw, visible, "v4.1-flash")
    return index_scores


def _attention_from_cache(cache_attention, form: str):
    """sparse_attention(q, kv, sink, indices, scale, *, model) through sparse_attention_cache: kv packed
    as `form` holds it, widened by zero dims to the entry's (q too: the same scores, the output cut back),
    the bytes no entry writes 0xFF; asked only where the layout holds kv exactly (else not asked)."""
    import numpy as np
    import torch
    from ..spec import layout as spec_layout
    lay = spec_layout.layout(spec_layout.cache_form(form)[0])

    def sparse_attention(q, kv, sink, indices, scale, *, model=None):
        values = kv.float().cpu().numpy()
        n, d = values.shape
        rows = np.zeros((-(-n // spec_layout.PAGE) * spec_layout.PAGE, lay.dims), np.float32)
        rows[:n, :d] = values
        entries = spec_layout.pack(lay, rows)
        if d > spec_layout.CACHE_VALUE_DIMS or not np.array_equal(spec_layout.cache_values(lay.kind, entries)[:n, :d], values):
            _not_asked(f"sparse_attention through sparse_attention_cache: kv not held exactly by {lay.kind}")
        wide = torch.cat([q, q.new_zeros(*q.shape[:-1], lay.dims - d)], -1) if lay.dims > d else q
        cache = torch.from_numpy(spec_layout.as_cache(form, entries)).to(q.device)
        return cache_attention(wide, cache, form, sink, indices, scale, model=model)[..., :d]
    return sparse_attention


def _not_asked(why: str):
    """Leave out an example the target cannot be asked (Hypothesis's reject), else NOT_IMPLEMENTED."""
    from hypothesis import reject
    from hypothesis.control import currently_in_test_context
    if currently_in_test_context():
        reject()
    raise NotImplementedOp(why)


def _as_bfloat16(values: tuple) -> tuple:
    """Float32 tensors whose every value BF16 holds exactly, as BF16 tensors (the same values: an
    operation declared "bfloat16" receives BF16 whatever check calls it); others stay as they are
    (fp32 values beyond BF16, such as scales, that a check passes on purpose)."""
    import torch

    def exact(t):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return t
        b = t.to(torch.bfloat16)
        same = (b.float() == t) | (torch.isnan(t) & torch.isnan(b.float()))
        return b if bool(same.all()) else t
    return tuple(exact(v) for v in values)


class Received:
    """The operation a target was last called with and its arguments, so that an exception raised
    in the target is shown with the tensors it received (a check's own draw, such as a generator
    seed, says nothing to the port's author)."""

    def __init__(self):
        self.call = None
        self.unserved = ""      # an example left out because it asked for a model the target does not serve

    @staticmethod
    def tag(e: BaseException, call: tuple):
        """Mark `e` with the call it was raised in (the innermost, when calls nest): Hypothesis replays
        several failing examples before it reports the first, so the last call is not always its."""
        if not hasattr(e, "dsv4spec_call"):
            with contextlib.suppress(AttributeError, TypeError):
                e.dsv4spec_call = call

    def describe(self, e: BaseException | None = None) -> str:
        """The call `e` was raised in (where tagged), else the last call."""
        call = getattr(e, "dsv4spec_call", None) or self.call
        if call is None:
            return ""
        name, args, kwargs = call
        shown = [_value(a) for a in args] + [f"{k}={_value(v)}" for k, v in kwargs.items()]
        return f"the target received: {name}(" + ", ".join(shown) + ")"


def _value(x) -> str:
    import numpy as np
    import torch
    if isinstance(x, torch.Tensor):
        values = x.detach().cpu()
        values = values.float() if values.is_floating_point() else values
        text = np.array2string(values.numpy(), threshold=16, edgeitems=2, max_line_width=100, separator=", ")
        return f"tensor({str(x.dtype).removeprefix('torch.')}, shape {list(x.shape)}, {x.device}: {text})"
    return repr(x) if len(repr(x)) < 200 else repr(x)[:200] + " …"


# What a terminal or a Markdown table would obey rather than show: control characters (ESC starts
# a colour, NUL, a carriage return; C1's CSI) and the lone surrogates no UTF-8 stream can encode.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with every character above written as \\xNN or \\uNNNN (line feeds and tabs kept):
    what a target says is shown, in every report, never obeyed and never fatal to the writing."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                            else f"\\u{ord(m.group()):04x}", text)


class Target:
    def __init__(self, provider, spec: str, name: str | None = None):
        self.provider = provider
        self.spec = spec
        self.name = printable(str(name or getattr(provider, "NAME", spec))).replace("\n", "\\n")
        self.device = getattr(provider, "DEVICE", "cpu")
        self.claims_conformance = bool(getattr(provider, "CLAIMS_CONFORMANCE", True))
        self.declared = dict(getattr(provider, "VARIANTS", {}) or {})
        self.variants = check_variants(self.declared)
        self.extensions = frozenset(getattr(provider, "EXTENSIONS", ()) or ())
        unknown = self.extensions - set(EXTENSIONS)
        if unknown:
            raise ValueError(f"target {self.name}: unknown extensions {sorted(unknown)}; known: {sorted(EXTENSIONS)}")
        self.timeout = DEFAULT_TIMEOUT_S
        self.module = _module(provider)
        self.version = _version(provider)
        self.hung: dict[str, str] = {}      # operations that timed out once are not called again
        self.received = Received()          # the last call's inputs (shared by the views of this target)
        self.input_dtypes = _input_dtypes(provider)
        self.shapes = _shapes(provider)
        self.cache_forms = _cache_forms(provider)
        self.contract = _contract(provider)
        self.answers: dict = {}             # a later format of a bundled operation: whether the target answers it
        self.models = tuple(getattr(provider, "MODELS", None) or MODELS)
        if isinstance(getattr(provider, "MODELS", None), str) or set(self.models) - set(MODELS):
            raise ValueError(f"target {self.name}: MODELS must be a tuple of {', '.join(MODELS)}; "
                             f"got {getattr(provider, 'MODELS')!r}")

    def has(self, *ops: str) -> bool:
        return all(callable(self._provided(op)) for op in ops)

    def _provided(self, name: str):
        """The provider's function for `name`; a per-format operation also from the bundled one,
        and index_scores from the official factorisation (index_scores_raw)."""
        fn = getattr(self.provider, name, None)
        if fn is None and name == "index_scores" and callable(getattr(self.provider, "index_scores_raw", None)):
            return _scores_from_raw(self.provider.index_scores_raw)
        if fn is None and name == "sparse_attention" and callable(getattr(self.provider, "sparse_attention_cache", None)):
            return _attention_from_cache(self.provider.sparse_attention_cache, self.cache_forms[0])
        if fn is None and name in SPLIT:
            bundled, fmt = SPLIT[name]
            whole = getattr(self.provider, bundled, None)
            fn = (lambda x, *rest, **kw: whole(x, fmt, *rest, **kw)) if callable(whole) else None
            if fn is not None and not self._takes_format(name, fn):
                return None
        return fn

    def _takes_format(self, name: str, fn) -> bool:
        """Whether the bundled form is asked for the format of `name`: always for a format it took
        from version 1; for a later one, when the target declares a CONTRACT from that version on
        (its exceptions are then judged), or, undeclared, when it answers one call (a row of 128
        ones): an adapter written before the format existed may reject it, and is not judged on it."""
        since = BUNDLED_SINCE.get(name, 1)
        if since == 1:
            return True
        if self.contract is not None:
            return self.contract >= since
        if name not in self.answers:
            self.answers[name] = self._answers(name, fn)
        return self.answers[name]

    def withheld(self, op: str) -> str | None:
        """Why a missing `op` is not asked of this target when a contract version withheld it (a
        format the bundled kv_qdq took only from a later version); None when it is just missing."""
        bundled, fmt = SPLIT.get(op, (None, None))
        if bundled is None or self._provided(op) is not None or not callable(getattr(self.provider, bundled, None)):
            return None
        since = BUNDLED_SINCE.get(op, 1)
        declared = f"contract {self.contract} withholds" if self.contract is not None else \
            "no CONTRACT declared and not answered:"
        return f"{declared} {bundled}(x, {fmt!r}) (the format came in contract {since})"

    def _answers(self, name: str, fn) -> bool:
        import torch
        dtype = torch.bfloat16 if self.input_dtype(name) == "bfloat16" else torch.float32
        try:
            with _deadline(self.timeout, name):
                fn(torch.ones((1, 128), dtype=dtype))
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 -- a rejection of the format, whatever the adapter raises
            return False
        return True

    def op(self, name: str):
        """The operation `name`, with its results checked against the contract and its time limited."""
        fn = self._provided(name)
        if not callable(fn):
            raise NotImplementedOp(name)

        def call(*args, **kwargs):
            if name in self.hung:
                raise OperationTimeout(self.hung[name])
            unserved = [v for v in (*args, *kwargs.values()) if isinstance(v, str) and v in MODELS
                        and v not in self.models]
            if unserved:
                self.received.unserved = f"{name} for {unserved[0]} (MODELS: {', '.join(self.models)})"
                _not_asked(self.received.unserved)
            if self.input_dtype(name) == "bfloat16":
                args, kwargs = _as_bfloat16(args), dict(zip(kwargs, _as_bfloat16(tuple(kwargs.values()))))
            before = _tensor_copies(args, kwargs)
            sent = (name, *_with_copies(args, kwargs, before))   # as sent, whatever the target writes on them
            self.received.call = sent
            try:
                try:
                    with _deadline(self.timeout, name):
                        result = fn(*args, **kwargs)
                except OperationTimeout as e:
                    self.hung[name] = str(e)
                    raise
                result = _owned(result)     # a buffer the target reuses on its next call must not change it
                _check_inputs_kept(name, before, args, kwargs, fn)
                check_result(name, result, args, kwargs)
                return result
            except BaseException as e:
                Received.tag(e, sent)
                raise
        call.__name__ = name
        return call

    def __getattr__(self, name):  # target.fp4_e8m0_quantize(x) reads like a call on the library
        if name.startswith("_") or name in ("provider",):
            raise AttributeError(name)
        return self.op(name)

    def asked_for(self, *models: str):
        """Leave out an example for models none of which the target serves (its MODELS), where the
        model decides an argument (a block size, a score dtype, an entry kind) rather than being passed."""
        if not self.serves(*models):
            self.received.unserved = f"{', '.join(models)} (MODELS: {', '.join(self.models)})"
            _not_asked(self.received.unserved)

    def serves(self, *models: str) -> bool:
        """Whether the target serves any of `models` (its MODELS; all by default)."""
        return any(m in self.models for m in models)

    def input_dtype(self, op: str) -> str:
        """The dtype of the values operation `op` receives: "float32" or "bfloat16"."""
        return self.input_dtypes.get(op, self.input_dtypes[None])

    def shape_limits(self, op: str) -> dict:
        """{dimension: tuple of sizes, or the int each size is a multiple of} that `op` declares."""
        return self.shapes.get(op, {})

    def cache_forms_of(self, kind: str) -> tuple:
        """The cache forms of entry kind `kind` the target declares (CACHE_FORMS), in its order."""
        from ..spec.layout import cache_form
        return tuple(f for f in self.cache_forms if cache_form(f)[0] == kind)

    def fit_size(self, op: str, dim: str, n: int) -> int:
        """n as dimension `dim` of `op` takes it (its SHAPES): a size it lists as is, else the next
        listed one (the largest, past them all); a multiple it asks for by rounding up."""
        sizes = self.shape_limits(op).get(dim)
        if isinstance(sizes, int):
            return -(-n // sizes) * sizes
        return min((s for s in sizes if s >= n), default=max(sizes)) if sizes and n not in sizes else n

    def variant(self, knob: str) -> str:
        """The value of a knob the checks must expect from this target."""
        if knob not in KNOBS:
            raise KeyError(f"unknown knob {knob!r}")
        return self.variants[knob]

    def expecting(self, knob: str, value: str) -> "Target":
        """A view of this target whose checks expect `knob = value` (used to name a variant)."""
        view = Target.__new__(Target)
        view.__dict__.update(self.__dict__)
        view.variants = {**self.variants, knob: value}
        return view

    def __repr__(self):
        return f"Target({self.name!r})"


def _module(provider) -> str:
    """The name of the module that defines the provider."""
    return provider.__name__ if isinstance(provider, types.ModuleType) else getattr(type(provider), "__module__", "")


def _version(provider) -> str:
    """The provider's __version__, else its distribution's version, else ''."""
    module = provider if isinstance(provider, types.ModuleType) else sys.modules.get(_module(provider))
    version = getattr(provider, "__version__", None) or getattr(module, "__version__", None)
    if version:
        return str(version)
    top = (getattr(module, "__name__", "") or "").split(".")[0]
    try:
        dists = _distributions(tuple(sys.path)).get(top, [])
        return metadata.version(dists[0]) if dists else ""
    except Exception:       # noqa: BLE001 -- metadata of a broken install is not worth a failure
        return ""


@functools.lru_cache(maxsize=8)
def _distributions(path: tuple) -> dict:
    """{top-level module: its distributions} of the installs on `path` (scanning them all takes
    about 60 ms: once per sys.path, not once per target)."""
    return metadata.packages_distributions()


def known_ops() -> set[str]:
    """Every canonical operation name (the OPS of each family module, and the bundled names that
    provide several: kv_qdq)."""
    return {op for family in FAMILY_MODULES
            for op in getattr(importlib.import_module(f"dsv4spec.properties.{family}"), "OPS", {})} \
        | {bundled for bundled, _ in SPLIT.values()}


INPUT_DTYPES = ("float32", "bfloat16")


def _contract(provider) -> int | None:
    """The CONTRACT version a provider declares (None: undeclared), validated."""
    declared = getattr(provider, "CONTRACT", None)
    if declared is None:
        return None
    if isinstance(declared, bool) or not isinstance(declared, int) or not 1 <= declared <= CONTRACT_VERSION:
        raise ValueError(f"CONTRACT must be an int from 1 to {CONTRACT_VERSION} (the contract version the target "
                         f"was written against; `dsv4spec ops --json` states this suite's), got {declared!r}")
    return declared


def _input_dtypes(provider) -> dict:
    """{op: dtype, None: the default} from a provider's INPUT_DTYPE / INPUT_DTYPES, validated."""
    declared = {None: getattr(provider, "INPUT_DTYPE", "float32"),
                **dict(getattr(provider, "INPUT_DTYPES", {}) or {})}
    for op, dtype in declared.items():
        if dtype not in INPUT_DTYPES:
            where = f"INPUT_DTYPES[{op!r}]" if op else "INPUT_DTYPE"
            raise ValueError(f"{where} must be one of {INPUT_DTYPES} (a string), got {dtype!r}")
    return declared


def _cache_forms(provider) -> tuple:
    """The cache forms sparse_attention_cache of a provider takes (CACHE_FORMS; default: the entries
    of LAYOUT.V4.MAIN, then LAYOUT.V32.MLA), validated."""
    from ..spec.layout import CACHE_FORMS, INDEX_CACHE_FORMS
    forms = CACHE_FORMS + INDEX_CACHE_FORMS
    declared = tuple(getattr(provider, "CACHE_FORMS", None) or CACHE_FORMS[:2])
    if isinstance(getattr(provider, "CACHE_FORMS", None), str) or set(declared) - set(forms):
        raise ValueError(f"CACHE_FORMS must be a tuple among {', '.join(forms)}; got {declared!r}")
    return declared


def _shapes(provider) -> dict:
    """{op: {dimension: sizes}} from a provider's SHAPES, validated."""
    declared = getattr(provider, "SHAPES", None) or {}
    for op, dims in (declared.items() if isinstance(declared, dict) else [(None, None)]):
        for dim, sizes in (dims.items() if isinstance(dims, dict) else [(None, None)]):
            ok = (isinstance(sizes, int) and sizes > 0) or (
                isinstance(sizes, tuple) and sizes and all(isinstance(n, int) and n > 0 for n in sizes))
            if not ok:
                raise ValueError(f"SHAPES must map each operation to {{dimension: a tuple of sizes, or the int "
                                 f"each size is a multiple of}}; got {op!r}: {dims!r}")
    return {op: dict(dims) for op, dims in declared.items()}
