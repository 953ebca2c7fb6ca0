"""The target contract: what the suite checks.

A target provides some operations by canonical name (plain attributes: functions taking and
returning whole batched torch tensors on the CPU) and optional metadata:

    NAME = "mylib"                      # shown in reports
    DEVICE = "cuda"                     # informative
    VARIANTS = {"e2m1_ties": "even"}    # the implementation-defined choices it declares
    CLAIMS_CONFORMANCE = True           # its failures make `dsv4spec verify` exit non-zero
    EXTENSIONS = {"chunked_prefill"}    # the extensions beyond the official domain it implements

`--target pkg.module:attr` names a module, an object, or a zero-argument callable returning one;
`--target pkg.module` names a module.  Installed packages may also register targets in the
`dsv4spec.targets` entry-point group.  Operations a target lacks are NOT_IMPLEMENTED, never FAIL.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from importlib import metadata

from ..spec.rules import EXTENSIONS, KNOBS, check_variants

BUILTIN = {
    "impl": "dsv4spec.impl",
    "kernels": "dsv4spec.kernels",
    "official": "dsv4spec.official",
    "ml_dtypes": "dsv4spec.properties.casts:MLDTYPES",
    "torch": "dsv4spec.properties.casts:TORCH",
}
ENTRY_POINT_GROUP = "dsv4spec.targets"


class NotImplementedOp(AttributeError):
    """The target does not provide an operation a check needs (an AttributeError, so that tools
    probing attributes, such as Hypothesis on a @given argument, see a plain missing attribute)."""


class Target:
    def __init__(self, provider, spec: str, name: str | None = None):
        self.provider = provider
        self.spec = spec
        self.name = name or getattr(provider, "NAME", spec)
        self.device = getattr(provider, "DEVICE", "cpu")
        self.claims_conformance = bool(getattr(provider, "CLAIMS_CONFORMANCE", False))
        self.declared = dict(getattr(provider, "VARIANTS", {}) or {})
        self.variants = check_variants(self.declared)
        self.extensions = frozenset(getattr(provider, "EXTENSIONS", ()) or ())
        unknown = self.extensions - set(EXTENSIONS)
        if unknown:
            raise ValueError(f"target {self.name}: unknown extensions {sorted(unknown)}; known: {sorted(EXTENSIONS)}")

    def has(self, *ops: str) -> bool:
        return all(callable(getattr(self.provider, op, None)) for op in ops)

    def op(self, name: str):
        fn = getattr(self.provider, name, None)
        if not callable(fn):
            raise NotImplementedOp(name)
        return fn

    def __getattr__(self, name):  # target.fp4_e8m0_quantize(x) reads like a call on the library
        if name.startswith("_") or name in ("provider",):
            raise AttributeError(name)
        return self.op(name)

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


def _import(ref: str):
    module_name, _, attr = ref.partition(":")
    if os.getcwd() not in sys.path:      # a user's own module beside them, as `python -m` would find it
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import target module {module_name!r}: {e}") from None
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"target {ref!r}: {module_name} has no attribute {attr!r}") from None
    if attr and callable(obj) and not isinstance(obj, types.ModuleType):
        obj = obj()
    return obj


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_target(spec: str) -> Target:
    """A built-in name, an entry-point name, or `pkg.module[:attr]`."""
    known = {**_entry_points(), **BUILTIN}
    if spec in known:
        return Target(_import(known[spec]), spec, name=spec)
    if "." not in spec and ":" not in spec and importlib.util.find_spec(spec) is None:
        raise ValueError(f"unknown target {spec!r}; built-in targets are {', '.join(BUILTIN)}, "
                         f"or give pkg.module:attr")
    return Target(_import(spec), spec)
