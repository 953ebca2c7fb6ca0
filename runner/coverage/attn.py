"""The coverage boundaries of ATTN: gathers, duplicates, sinks and the layer's entries."""

from __future__ import annotations

import numpy as np

from ...spec.rules import V4, V41
from .boundary import arg, Boundary, seen
from .path import _layer_call


def attn_boundaries() -> dict[str, list[Boundary]]:
    """Where the sparse-attention clauses decide (spec/attn.py): −1 anywhere in a list, a row listed
    twice, V4.1's first block all −1, the row max in a later block of 64, the sink against the row
    max M (above the fp32 exp overflow, near M, far below), and each model."""
    from ...spec import attn as spec_attn
    from ...spec import rope as spec_rope
    from ...spec.models import profile

    def kernel(name, level, pred):
        return seen("sparse_attention", name, level, lambda c: pred(np.asarray(c.args[3]), c))

    def model(c):
        return arg(c, 5, "model")

    def row_max_at(c):                  # per (token, head): the list position of the row max
        s = spec_attn.scores(*(np.asarray(c.args[i], np.float64) for i in (0, 1, 3)), float(c.args[4]))
        return np.argmax(np.where(np.isfinite(s), s, -np.inf), axis=-1), s

    def sink_offset(c):                 # sink − M per (token, head)
        _, s = row_max_at(c)
        M = np.max(np.where(np.isfinite(s), s, -np.inf), axis=-1)
        with np.errstate(invalid="ignore"):
            return np.asarray(c.args[2], np.float64)[None, :] - M
    models = [kernel(f"sparse_attention of {m}", "range", lambda i, c, m=m: model(c) == m) for m in ("v4-flash", "v4.1-flash")]
    blocks = [kernel("a list of several blocks of 64", "layout", lambda i, c: i.shape[1] > spec_attn.BLOCK),
              kernel("a list whose last block is partial (K not a multiple of 64)", "layout",
                     lambda i, c: i.shape[1] % spec_attn.BLOCK != 0)]

    def leading(i):                     # −1 entries before the first valid one, per row
        valid = i != -1
        return np.where(valid.any(1), valid.argmax(1), i.shape[1])
    gather = [kernel("a −1 entry after a valid one", "element", lambda i, c: np.any(
                  (i == -1) & (np.arange(i.shape[1]) > leading(i)[:, None]))),
              kernel("a −1 entry in a later block of 64", "layout", lambda i, c: np.any(i[:, spec_attn.BLOCK:] == -1)),
              kernel("a list without −1", "element", lambda i, c: np.any((i != -1).all(1)))]

    def twice(i):
        return any(np.unique(r[r >= 0]).size < (r >= 0).sum() for r in i)
    init = [kernel("V4.1: a first block of 64 entries all −1", "range",
                   lambda i, c: model(c) in V41 and np.any(leading(i) >= spec_attn.BLOCK)),
            kernel("V4.1: fewer than 64 leading −1 entries", "range",
                   lambda i, c: model(c) in V41 and np.any((leading(i) > 0) & (leading(i) < spec_attn.BLOCK))),
            kernel("V4.1: a row without a valid entry", "range",
                   lambda i, c: model(c) in V41 and np.any((i == -1).all(1))),
            kernel("V4: a list that starts valid", "range", lambda i, c: model(c) in V4 and np.any(i[:, 0] >= 0))]
    later = [kernel("the row max in a later block of 64 than the first", "element",
                    lambda i, c: np.any(row_max_at(c)[0] >= spec_attn.BLOCK)),
             kernel("the row max on the first entry of a later block", "element",
                    lambda i, c: np.any((row_max_at(c)[0] >= spec_attn.BLOCK) & (row_max_at(c)[0] % spec_attn.BLOCK == 0)))]
    fl_scale = float(np.float32(512 ** -0.5))
    score = [kernel("the scale 512^-0.5", "scale", lambda i, c: float(c.args[4]) == fl_scale),
             kernel("a scale other than 512^-0.5 (the argument, not a constant)", "scale",
                    lambda i, c: float(c.args[4]) != fl_scale)]
    over = spec_attn.EXP_OVERFLOW
    sink = [kernel(f"sink − M > {over:.2f} (exp overflows: the output is 0)", "range",
                   lambda i, c: np.any(sink_offset(c) > over + spec_attn.EXP_UNDETERMINED)),
            kernel("0 < sink − M ≤ 88 (the sink outweighs the scores)", "range",
                   lambda i, c: np.any((sink_offset(c) > 0) & (sink_offset(c) <= 88))),
            kernel("|sink − M| ≤ 1 (the sink a term like the scores)", "element", lambda i, c: np.any(np.abs(sink_offset(c)) <= 1)),
            kernel("sink − M < −30 (a sink far below every score)", "range", lambda i, c: np.any(sink_offset(c) < -30))]
    shape = [kernel("several tokens and heads", "layout", lambda i, c: np.asarray(c.args[0]).shape[0] >= 2
                    and np.asarray(c.args[0]).shape[1] >= 2)]

    def scale_layers(compressed):
        return seen("attention_scale", f"attention_scale of a {'compressed' if compressed else 'window-only'} layer",
                    "range", lambda c: bool(profile(arg(c, 0, "model")).ratio(int(arg(c, 1, "layer")))) == compressed)

    def q_model(m):
        return seen("attention_q", f"attention_q of {m}", "range", lambda c: arg(c, 1, "model") == m)

    def heads_of_unequal_rms(c):
        q = np.asarray(arg(c, 0, "q"), np.float64)
        rms = np.sqrt((q * q).mean(-1))
        return np.any(rms.max(-1) >= 4 * np.maximum(rms.min(-1), 1e-30))

    def derot(name, level, pred):
        return seen("attention_output", name, level, lambda c: pred(np.asarray(arg(c, 1, "positions")),
                                                                    np.asarray(arg(c, 2, "freqs"))))
    window_table = spec_rope.frequencies_fp32(profile("v4-flash"), 0)
    derotate = [derot("a position ≥ 2^16 (a large angle)", "range", lambda p, f: np.any(p >= 2 ** 16)),
                derot("several positions at once", "layout", lambda p, f: np.unique(p).size >= 2),
                derot("a window-only layer's table", "range", lambda p, f: np.array_equal(f, window_table)),
                derot("a compressed layer's table (YaRN)", "range", lambda p, f: not np.array_equal(f, window_table))]
    layer = [seen("attention_layer", f"attention_layer of {m}", "range", lambda c, m=m: arg(c, 1, "model") == m)
             for m in ("v4-flash", "v4.1-flash")]
    layer += [seen("attention_layer", "attention_layer in prefill (start_pos 0)", "range",
                   lambda c: int(arg(c, 3, "start_pos") or 0) == 0),
              seen("attention_layer", "attention_layer in decode (start_pos > 0)", "range",
                   lambda c: int(arg(c, 3, "start_pos") or 0) > 0),
              seen("attention_layer", "a prefill with no compressed entry yet (seqlen < ratio)", "range",
                   _no_entry_yet)]
    return {"ATTN.GATHER": gather + blocks[:1] + models, "ATTN.DUPLICATES": [
                kernel("a row listed twice", "element", lambda i, c: twice(i)),
                kernel("a row listed twice, in different blocks of 64", "layout", lambda i, c: i.shape[1] > spec_attn.BLOCK
                       and twice(i) and any(np.intersect1d(r[:spec_attn.BLOCK][r[:spec_attn.BLOCK] >= 0],
                                                           r[spec_attn.BLOCK:]).size for r in i))] + models,
            "ATTN.INIT": init, "ATTN.SCORE": score + models, "ATTN.PROB.BF16": blocks + models,
            "ATTN.PROB.ORDER": later + models, "ATTN.RESCALE": later[:1] + blocks[:1] + models,
            "ATTN.SINK": sink + models, "ATTN.OUTPUT": shape + blocks[1:] + models,
            "ATTN.SCALE": [scale_layers(True), scale_layers(False)],
            "ATTN.Q_NORM": [q_model("v4-flash"), q_model("v4.1-flash"),
                            seen("attention_q", "heads of unequal RMS (4× apart)", "scale", heads_of_unequal_rms)],
            "ATTN.DEROTATE": derotate, "ATTN.LAYER": layer, "ATTN.TP.REDUCE": _reduce_boundaries()}


def _reduce_boundaries() -> list:
    def ranks(c):
        return np.asarray(arg(c, 0, "partials")).shape[0]

    def rounds_in_fp32(c):
        """Some fp32 sum of the partials rounds (their exact sum is not an fp32 value)."""
        p = np.asarray(arg(c, 0, "partials"), np.float64)
        return bool(np.any(p.sum(0) != p.sum(0).astype(np.float32)))
    return [seen("row_parallel_reduce", "two ranks", "range", lambda c: ranks(c) == 2),
            seen("row_parallel_reduce", "eight ranks", "range", lambda c: ranks(c) == 8),
            seen("row_parallel_reduce", "partials whose fp32 sum rounds", "scale", rounds_in_fp32)]


def _no_entry_yet(c) -> bool:
    """A prefill of a compressed layer shorter than its ratio: the official compressor returns None."""
    _, ratio, seqlen, start_pos = _layer_call(c)
    return start_pos == 0 and 0 < seqlen < ratio
