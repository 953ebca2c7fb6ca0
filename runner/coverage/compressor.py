"""The coverage boundaries of CMP: the compressor's state, groups and causality."""

from __future__ import annotations

import numpy as np

from ...spec.rules import V4
from .boundary import arg, Boundary, seen


def cmp_boundaries() -> dict[str, list[Boundary]]:
    def S(c):
        return np.asarray(arg(c, 0, "x")).shape[1]

    def ratio(c):
        return int(arg(c, 99, "ratio"))
    groups = [seen("compress", "S a multiple of the ratio", "layout", lambda c: S(c) % ratio(c) == 0 and S(c) > 0),
              seen("compress", "S not a multiple of the ratio (an incomplete last group)", "layout",
                   lambda c: S(c) % ratio(c) != 0 and S(c) > ratio(c)),
              seen("compress", "S below the ratio (no complete group)", "range", lambda c: 0 < S(c) < ratio(c)),
              seen("compress", "batch ≥ 2", "layout", lambda c: np.asarray(arg(c, 0, "x")).shape[0] >= 2)]
    by_ratio = {r: seen("compress", f"ratio {r}", "range", lambda c, r=r: ratio(c) == r) for r in (1, 2, 4, 128)}
    feed = [seen("compressor_feed", "a feed of one token (decode)", "layout",
                 lambda c: np.asarray(arg(c, 1, "x")).shape[1] == 1),
            seen("compressor_feed", "a feed of several tokens (a chunk)", "layout",
                 lambda c: np.asarray(arg(c, 1, "x")).shape[1] > 1)]
    def feeds(calls):               # (ratio, model, [tokens of each feed]) per compressor_state
        out = []
        for c in calls:
            if c.op == "compressor_state":
                out.append((int(c.kwargs.get("ratio", 0)), c.kwargs.get("model"), []))
            elif c.op == "compressor_feed" and out:
                out[-1][2].append(np.asarray(arg(c, 1, "x")).shape[1])
        return out

    def fed(name, level, pred):
        return Boundary(name, level, lambda calls: any(sizes and pred(m, model, sizes) for m, model, sizes in feeds(calls)))
    state = [fed("decode from before group 0 completes (a prefill shorter than the ratio)", "range",
                 lambda m, model, n: n[0] < m and len(n) > m - n[0]),
             fed("a prefill ending inside a group, the group completed in decode", "layout",
                 lambda m, model, n: n[0] > m and n[0] % m != 0 and sum(n) - n[0] >= m - n[0] % m),
             fed("a prefill ending on a group boundary, then decode", "layout",
                 lambda m, model, n: n[0] >= m and n[0] % m == 0 and len(n) > 1),
             fed("V4 ratio 4: two groups completed in decode (the window half shifted)", "layout",
                 lambda m, model, n: m == 4 and model in V4 and sum(n) - n[0] >= 8),
             *(fed(f"a state of ratio {r}", "range", lambda m, model, n, r=r: m == r) for r in (2, 4, 128))]
    return {"CMP.STATE": state, "CMP.GROUPS": groups + feed[:1], "CMP.CAUSAL": groups[:2] + [by_ratio[4]],
            "CMP.OVERLAP": [by_ratio[4], groups[0]], "CMP.APE": [by_ratio[4], by_ratio[128]],
            "CMP.GATE": [by_ratio[2], by_ratio[128], groups[3]], "CMP.RATIO1": [by_ratio[1]],
            "CMP.NORM": [by_ratio[4], by_ratio[128]], "CMP.ROPE": [by_ratio[4], by_ratio[128], groups[0]],
            "CMP.STREAM": feed + [by_ratio[4], by_ratio[128]]}
