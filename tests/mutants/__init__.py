"""Deliberately wrong targets: one realistic mistake each.  Every family module lists its mutants in
`catalogue()`; tests/test_mutants.py asserts that each is reported FAIL on the rule it breaks."""
import importlib
from types import SimpleNamespace

import dsv4spec.impl as impl


def mutant(name: str, base=impl, variants=None, **overrides) -> SimpleNamespace:
    """A target provider equal to `base` except for the operations in `overrides`."""
    ops = {k: getattr(base, k) for k in dir(base) if not k.startswith("_") and callable(getattr(base, k))}
    ops.update(overrides)
    return SimpleNamespace(NAME=f"mutant:{name}", CLAIMS_CONFORMANCE=True, VARIANTS=variants or {},
                           EXTENSIONS=getattr(base, "EXTENSIONS", ()), **ops)


FAMILIES = ("quant", "indexer", "pool", "compressor", "layout", "budget", "rope", "path", "attn", "declared")


def catalogue() -> list[tuple]:
    """Every mutant of every family: (name, the rule it must fail, the target provider)."""
    return [entry for family in FAMILIES
            for entry in importlib.import_module(f"{__name__}.{family}").catalogue()]
