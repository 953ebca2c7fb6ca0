"""Graph-backed calls: a CUDA graph behind an eager call, what serving engines and torch.compile's
"reduce-overhead" do for launch-bound steps.

    step = graph_backed(decode_step)     # any function of CUDA tensors that never synchronizes
    out = step(q, k_cache, w, lens)      # first call of these arguments: runs it, then captures it
    out = step(q, k_cache, w, lens)      # later calls: one graph replay and a clone of each output

A wrapper keeps, for its one function, an LRU of CUDA graphs (16 by default) keyed by everything a
replay depends on: each tensor argument's (data_ptr, shape, stride, dtype, device), every other
argument's type and value (tuples, lists and dicts walked), the current CUDA stream.  A graph reads
and writes memory where it was at capture, so a key that keeps its addresses (a serving engine's
persistent caches and buffers) replays; arguments the function reads without being passed them (a
closure's tensors) must stay where they were.

- The first call of a key runs the function itself on the current stream (its outputs are
  returned, its side effects happen once; Triton compiles, the top-k engine makes its workspaces),
  then captures it on a side stream (torch.cuda.graph): that call synchronizes the device.  Later
  calls replay the graph on the current stream and return clones of its outputs (a returned tensor
  never changes under the caller on the next call), never synchronizing: one graph launch and one
  copy launch an output tensor.  Non-tensor outputs are those of the capture.
- Memory held per key: the graph's private pool (the function's outputs and intermediates), until
  the key is evicted or reset() is called.
- It calls the function directly (no graph): inside a capture the caller runs, on CPU tensors or
  under the Triton interpreter, when DSV4SPEC_GRAPHED=0, and after giving up.  It gives up when
  `misses` captures in a row (default: `entries`) found no replay in between (the addresses change
  every call, or more keys cycle than the LRU holds), or when a capture fails (a warning says why);
  it then drops its graphs and calls directly until reset().
- Thread-safe: a wrapper's lookups, captures and replays take its lock, one thread at a time (two
  threads of one key capture it once; the other replays).
"""
from __future__ import annotations

import functools
import os
import threading
import warnings
from collections import OrderedDict

import torch

from .mode import INTERPRET

ENV = "DSV4SPEC_GRAPHED"
ENTRIES = 16


class CaptureFailed(Exception):
    """A capture that raised, after the warm-up call whose outputs it carries."""

    def __init__(self, outputs, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.outputs = outputs


def key_of(value):
    """What a replay depends on in one argument: a tensor's address and layout, anything else's type
    and value (a TypeError for what cannot be hashed)."""
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, value.data_ptr(), value.shape, value.stride(), value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(key_of(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, key_of(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"a graph-backed call keys on its arguments; a {type(value).__name__} cannot be "
                        f"hashed (pass tensors, numbers, strings, dtypes, or tuples, lists, dicts of them)") from None
    return (type(value), value)


def tensors_in(value):
    """The tensors of an argument, tuples, lists and dicts walked."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def cloned(outputs):
    """outputs with every tensor copied (same strides), tuples, lists and dicts rebuilt."""
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(cloned(v) for v in outputs)
    if isinstance(outputs, dict):
        return {k: cloned(v) for k, v in outputs.items()}
    return outputs


def graphs_wanted(tensors) -> bool:
    """False where a graph cannot or must not stand behind the call: DSV4SPEC_GRAPHED=0, the
    interpreter, a tensor off CUDA (or no GPU), a capture already running on this stream."""
    if os.environ.get(ENV, "1") == "0" or INTERPRET:
        return False
    if tensors:
        if not all(t.is_cuda for t in tensors):
            return False
    elif not torch.cuda.is_available():
        return False
    return not torch.cuda.is_current_stream_capturing()


def stream_of(tensors) -> tuple:
    """(device index, the current raw stream there): the first tensor's device, else the current one."""
    device = tensors[0].get_device() if tensors else torch.cuda.current_device()
    return device, torch._C._cuda_getCurrentRawStream(device)


def capture_cuda_graph(fn, args, kwargs):
    """(outputs of the call itself, a replay returning clones of the graph's outputs).  The call runs
    first on the current stream; the capture, on torch.cuda.graph's side stream, synchronizes."""
    outputs = fn(*args, **kwargs)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 -- the caller gives up on graphs and keeps the call's outputs
        raise CaptureFailed(outputs, e) from e

    def replay():
        graph.replay()
        return cloned(static)
    return outputs, replay


class GraphBacked:
    """fn called through an LRU of CUDA graphs (the module docstring says when it captures, replays
    and calls directly).  Counters: captures, replays, direct (calls made without a graph),
    evictions, misses_in_a_row, held (graphs in the LRU); gave_up holds the reason once it calls
    directly for good."""

    def __init__(self, fn, entries: int = ENTRIES, misses: int | None = None, capture=capture_cuda_graph):
        if entries < 1:
            raise ValueError(f"entries must be at least 1, got {entries}")
        functools.update_wrapper(self, fn)
        self.fn, self.entries, self.misses = fn, entries, entries if misses is None else misses
        self._capture = capture
        self._lock = threading.RLock()
        self.reset()

    def reset(self):
        """Drop the graphs and the counters; capture again."""
        self._graphs = OrderedDict()
        self.captures = self.replays = self.direct = self.evictions = self.misses_in_a_row = 0
        self.gave_up = None

    def __call__(self, *args, **kwargs):
        tensors = list(tensors_in((args, kwargs)))
        if self.gave_up or not graphs_wanted(tensors):
            self.direct += 1
            return self.fn(*args, **kwargs)
        return self.through((key_of((args, kwargs)), stream_of(tensors)), args, kwargs)

    def through(self, key, args, kwargs):
        """The graph of key replayed, or (a miss) the call made and captured under key."""
        with self._lock:
            return self._through(key, args, kwargs)

    def _through(self, key, args, kwargs):
        replay = self._graphs.get(key)
        if replay is not None:
            self._graphs.move_to_end(key)
            self.replays += 1
            self.misses_in_a_row = 0
            return replay()
        if self.misses_in_a_row >= self.misses:
            self.give_up(f"{self.misses} captures in a row without a replay")
            self.direct += 1
            return self.fn(*args, **kwargs)
        try:
            outputs, replay = self._capture(self.fn, args, kwargs)
        except CaptureFailed as e:
            self.give_up(f"a capture failed ({e})")
            warnings.warn(f"graph-backed {self.__name__}: {self.gave_up}; calling it directly", stacklevel=3)
            return e.outputs
        self.captures += 1
        self.misses_in_a_row += 1
        self._graphs[key] = replay
        if len(self._graphs) > self.entries:
            self._graphs.popitem(last=False)
            self.evictions += 1
        return outputs

    def give_up(self, reason: str):
        self._graphs.clear()
        self.gave_up = reason

    @property
    def held(self) -> int:
        """How many graphs the LRU holds now."""
        return len(self._graphs)

    def __repr__(self):
        state = f"gave up: {self.gave_up}" if self.gave_up else f"{self.held} of {self.entries} graphs"
        return (f"<graph-backed {self.__name__}: {state}; {self.captures} captures, {self.replays} replays, "
                f"{self.direct} direct calls>")


def graph_backed(fn=None, *, entries: int = ENTRIES, misses: int | None = None):
    """fn behind an LRU of CUDA graphs (GraphBacked); as a decorator too, with or without arguments."""
    if fn is None:
        return lambda f: GraphBacked(f, entries, misses)
    return GraphBacked(fn, entries, misses)
