"""Deliberately wrong targets: one realistic mistake each.  tests/test_mutants_*.py assert that each
is reported FAIL on the rule it breaks."""
from types import SimpleNamespace

import dsv4spec.impl as impl


def mutant(name: str, base=impl, variants=None, **overrides) -> SimpleNamespace:
    """A target provider equal to `base` except for the operations in `overrides`."""
    ops = {k: getattr(base, k) for k in dir(base) if not k.startswith("_") and callable(getattr(base, k))}
    ops.update(overrides)
    return SimpleNamespace(NAME=f"mutant:{name}", CLAIMS_CONFORMANCE=True, VARIANTS=variants or {}, **ops)
