"""The coverage boundaries of LAYOUT: each layout kind."""

from __future__ import annotations

import numpy as np

from .boundary import arg, Boundary, _rows, seen


def layout_boundaries() -> dict[str, list[Boundary]]:
    from ...spec import layout as L

    def kind_of(kind, op="entry_pack"):
        return seen(op, f"{op} of {kind}", "layout", lambda c: arg(c, 0, "kind") == kind)

    def rows(kind):
        return seen("entry_pack", f"several {kind} entries at once", "layout",
                    lambda c: arg(c, 0, "kind") == kind and _rows(c, 1) >= 2)
    rule_kind = {"LAYOUT.V4.MAIN": "v4_main_kv", "LAYOUT.INDEX_K": "fp4_index_k", "LAYOUT.V41.MAIN": "v41_main_kv",
                 "LAYOUT.V41.SWA": "v41_swa_kv", "LAYOUT.V32.INDEX_K": "v32_index_k",
                 "LAYOUT.V32.MLA": "v32_mla_kv"}
    out = {rule: [kind_of(k), kind_of(k, "entry_unpack"), rows(k)] for rule, k in rule_kind.items() if k in L.KINDS}
    out["LAYOUT.ORDER"] = [kind_of(k) for k in L.KINDS]
    out["LAYOUT.UNPACK"] = [kind_of(k, "entry_unpack") for k in L.KINDS]
    out["LAYOUT.REJECT"] = [seen("entry_unpack", "an entry of the wrong byte count", "range", lambda c: np.asarray(
        arg(c, 1, "data")).shape[-1] != L.LAYOUTS[arg(c, 0, "kind")].nbytes if arg(c, 0, "kind") in L.LAYOUTS else True)]
    return out
