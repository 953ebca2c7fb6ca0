"""The coverage boundaries of ROPE: pairs, rounding, slices, positions."""

from __future__ import annotations

import numpy as np

from .boundary import arg, Boundary, seen
from .path import layer_call_boundaries


def rope_boundaries() -> dict[str, list[Boundary]]:
    def positions(c):
        return np.asarray(arg(c, 1, "positions"))

    def width(c):
        return np.asarray(arg(c, 0, "x")).shape[-1], 2 * np.asarray(arg(c, 2, "freqs")).size
    rotate = [seen("rope_rotate", "position 0 (the identity)", "range", lambda c: np.any(positions(c) == 0)),
              seen("rope_rotate", "a position ≥ 2^16 (a large angle)", "range", lambda c: np.any(positions(c) >= 2 ** 16)),
              seen("rope_rotate", "several positions at once", "layout", lambda c: np.unique(positions(c)).size >= 2)]

    def pair(which):                # a unit vector on channel 2i or 2i+1 of the rotated slice
        def pred(c):
            x, rd = np.asarray(arg(c, 0, "x")), 2 * np.asarray(arg(c, 2, "freqs")).size
            nz = np.nonzero(x[..., -rd:].reshape(-1, rd))[1]
            return nz.size and which(nz)
        return pred
    pairs = [seen("rope_rotate", "the first pair (channels 0, 1 of the slice)", "element", pair(lambda j: np.any(j // 2 == 0))),
             seen("rope_rotate", "the last pair (channels 62, 63 of the slice)", "element", pair(lambda j: np.any(j // 2 == 31))),
             seen("rope_rotate", "an odd channel (the imaginary part)", "element", pair(lambda j: np.any(j % 2 == 1))),
             seen("rope_rotate", "a channel of the second half (i + 32 under half-split pairing)", "element",
                  pair(lambda j: np.any(j >= 32)))]
    slice_ = [seen("rope_rotate", "channels before the rotated ones", "layout", lambda c: width(c)[0] > width(c)[1])]
    from ...spec import rope as spec_rope
    from ...spec.models import profile

    def compressed(c):              # YaRN is on exactly the layers with a compress ratio
        return bool(spec_rope.layer_rope(profile(arg(c, 0, "model")), int(arg(c, 1, "layer")))[1])
    uses = {"ROPE.THETA": [seen("rope_freqs", f"a {kind} layer", "range", lambda c, r=r: compressed(c) == r)
                           for kind, r in (("compressed", True), ("window-only", False))],
            "ROPE.YARN": [seen("rope_freqs", f"rope_freqs of {m}", "range", lambda c, m=m: arg(c, 0, "model") == m)
                          for m in ("v4-flash", "v4.1-flash")],
            "ROPE.SHARED": [seen("rope_freqs", "a use other than the main q", "layout", lambda c: arg(c, 2, "use")
                                 not in (None, "q"))]}
    layer = [seen("index_layer", "a layer from position 0 (prefill)", "range", lambda c: int(arg(c, 99, "start_pos") or 0) == 0),
             seen("index_layer", "a layer at a later start position (decode)", "range",
                  lambda c: int(arg(c, 99, "start_pos") or 0) > 0)] + layer_call_boundaries()[2:3]
    return {"ROPE.PAIRS": pairs + rotate[1:2], "ROPE.ROUNDING": rotate[1:2] + rotate[2:], "ROPE.SLICE": slice_,
            "ROPE.POSITIONS": layer, **uses}
