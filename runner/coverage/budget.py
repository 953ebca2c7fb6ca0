"""The coverage boundaries of BUDGET: each model's bytes and work per token."""

from __future__ import annotations

from ...spec.rules import V4_ALL
from .boundary import arg, Boundary, seen


def budget_boundaries() -> dict[str, list[Boundary]]:
    from ...spec.pool import POOL_CAPACITY
    models = V4_ALL                 # the budget rules apply to V4 and V4.1

    def each_model(op, rule_models=models):
        return [seen(op, f"{op} of {m}", "range", lambda c, m=m: arg(c, 0, "model") == m) for m in rule_models]

    def context(op, i=1):
        return [seen(op, f"context ≤ {POOL_CAPACITY} (every position a candidate)", "range",
                     lambda c: 0 < int(arg(c, i, "context")) <= POOL_CAPACITY),
                seen(op, f"context > {POOL_CAPACITY} (the pool caps the work)", "range",
                     lambda c: int(arg(c, i, "context")) > POOL_CAPACITY)]
    return {"BUDGET.KV_BYTES": each_model("kv_bytes_per_token"),
            "BUDGET.WINDOW": each_model("window_bytes_per_layer"),
            "BUDGET.INDEX_WORK": each_model("indexer_macs_per_token") + context("indexer_macs_per_token"),
            "BUDGET.ATTN_WORK": each_model("core_attention_macs") + context("core_attention_macs", 2)}
