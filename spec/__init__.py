"""dsv4spec.spec: the rules of DeepSeek-V3.2/V4/V4.1 sparse-attention numerics, one module per family.

Importing this package declares every rule; `RULES` and `KNOBS` then hold the whole registry.
"""
from . import rules, models
from .rules import RULES, KNOBS, Rule, Knob, select
from . import formats, quant, indexer, pool, compressor, layout, budget, rope, path, attn  # noqa: F401  (declare rules)

FAMILIES = ("FMT", "FP4", "FP8", "HAD", "IDX", "POOL", "LAYER", "CMP", "LAYOUT", "BUDGET", "ROPE", "PATH", "ATTN")

__all__ = ["rules", "models", "RULES", "KNOBS", "Rule", "Knob", "select", "FAMILIES"]
