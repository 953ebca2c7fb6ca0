"""The target contract: what the suite checks, how a target is found, and what it must return.

A target provides some operations by canonical name (`dsv4spec ops` lists them) and optional
metadata:

    NAME = "mylib"                      # shown in reports
    DEVICE = "cuda"                     # informative
    VARIANTS = {"e2m1_ties": "even"}    # the implementation-defined choices it declares
    CLAIMS_CONFORMANCE = False          # only to say it does not: its failures are findings, exit 0
    EXTENSIONS = {"chunked_prefill"}    # the extensions beyond the official domain it implements
    INPUT_DTYPE = "bfloat16"            # the dtype of the values every operation receives
    INPUT_DTYPES = {"fp8_quantize": "float32"}   # per operation, overriding INPUT_DTYPE
    MODELS = ("v4.1-flash",)            # the model profiles it serves (default: all)
    SHAPES = {"sparse_attention": {"D": (512,), "H": 16, "K": 64}}   # per operation, the sizes it takes
    CONTRACT = 5                        # the contract version it was written against (CONTRACT_VERSION)

Input dtypes are "float32" (the default) or "bfloat16".  The suite generates values representable
in the dtype an operation declares and passes it tensors of that dtype, so a BF16-only kernel is
checked as it is.  BF16 is the official domain of the quantizers (they receive BF16 activations);
fp32 inputs that BF16 cannot hold lie beyond it and reach only operations declared float32 (the
input dtype decides; no EXTENSIONS entry is needed).
Codes, bytes and scales are uint8 whatever the declaration.

A target that serves some models only (a V4.1 port) declares MODELS: an example that would call
one of its operations for another model (a `model` argument naming it) is not asked (a check left
with none is NOT_IMPLEMENTED), and index_topk is asked only for the orders its models use (V4
'score', V4.1 'position'), so it need not fake the other.

A kernel compiled for some sizes only declares SHAPES: per operation, per dimension of its contract
(`dsv4spec ops` names them), a tuple of the sizes it takes or an int that each size must be a
multiple of.  The checks then draw their examples at those sizes (a list widened with −1 entries,
which contribute nothing, heads and head dims as declared; index_topk's k, the rows redrawn over
k + 64·S entries), so a rule is judged where the kernel can run; a clause that needs a size the target
refuses is NOT_IMPLEMENTED.

A target written against an earlier version of this contract keeps its verdicts: kv_qdq(x, fmt)
provides the per-format operations, but a format the bundled form took only from a later version
(fp4_e8m0, from version 2) is asked of it only where it declares a CONTRACT from that version on
(an exception is then judged), or, declaring none, where it answers one call of that format: an
adapter that predates the format reads n/i there, not ERROR; one that answers is judged.

How `--target T` is resolved (the same rule for the CLI, the pytest plugin and `load_target`):

    impl, kernels, official, ml_dtypes, torch   the built-in targets
    flashmla, flashmla-decode, deepgemm, sgl-kernel  the production libraries you installed, run on a
                                                CUDA GPU (dsv4spec.production)
    official-kernels[:PATH]                     your own copy of the official V4 kernel.py (PATH,
                                                else $DSV4SPEC_OFFICIAL_KERNEL), run as it is on
                                                a CUDA GPU with TileLang (dsv4spec.official_kernels)
    NAME                                        an entry point NAME of group `dsv4spec.targets`
    pkg.module                                  a module (a file mytarget.py in the working
                                                directory is found as `mytarget`)
    pkg.module:attr                             attr as it is: a module or an object providing
                                                operations; a class is instantiated with no
                                                arguments; a function named like an operation
                                                (`mymod:e2m1_encode`) is a target of that one
                                                operation
    pkg.module:attr()                           a factory: attr is called with no arguments and
                                                returns the target
    exec:CMD                                    a port in any language, run as a child process
                                                and called over PROTOCOL.md (exec_target.py)

Any other function is refused with a message: it is never guessed to be a factory.  Operations a
target lacks are NOT_IMPLEMENTED, never FAIL; a target that provides none of them is a usage
error (TargetNotFound: `--target json` names a module, not a target).  A target the user names
claims conformance (its FAIL, ERROR or TIMEOUT make verify exit 1 and fail the pytest items)
unless it sets CLAIMS_CONFORMANCE = False, as the element-cast targets ml_dtypes and torch do.

Results are checked strictly where they come back from the target (`Target.op`): a torch tensor
of the contract's dtype (RESULTS), on the device the inputs were given on, and laid out in the
contract's shape where it fixes one (a wrong element count is left to the rule it breaks).  A deviation is a ContractError naming what was expected and the
converter of dsv4spec.adapters that fits; it is reported ERROR, never passed.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import types
from importlib import metadata

from .contract import (  # noqa: F401 -- the contract's names, re-exported where users have always imported them
    CONTRACT_CHANGES, CONTRACT_VERSION, DEFAULT_TIMEOUT_S, INPUT_DTYPES, NO_TENSOR_RESULT, RESULTS, SHAPES, SPLIT,
    WATCH, ContractError, NotImplementedOp, NothingImplemented, OperationTimeout, Target, TargetLoadError,
    TargetNotFound, check_result, known_ops, timeout_seconds)
from .exec_target import PREFIX as EXEC_PREFIX, command as exec_command, load as exec_load

BUILTIN = {
    "impl": "dsv4spec.impl",
    "kernels": "dsv4spec.kernels",
    "official": "dsv4spec.official",
    "ml_dtypes": "dsv4spec.properties.casts:MLDTYPES",
    "torch": "dsv4spec.properties.casts:TORCH",
}
ENTRY_POINT_GROUP = "dsv4spec.targets"
TARGET_VARIABLE = "DSV4SPEC_TARGET"     # the targets when none is named (comma-separated), CLI and pytest alike


def targets_from_environment() -> list[str]:
    """The target specs $DSV4SPEC_TARGET names (as array-api-tests' ARRAY_API_TESTS_MODULE)."""
    return [s.strip() for s in os.environ.get(TARGET_VARIABLE, "").split(",") if s.strip()]


def _import(ref: str):
    module_name, _, attr = ref.partition(":")
    factory = attr.endswith("()")
    attr = attr.removesuffix("()")
    if os.getcwd() not in sys.path:      # a user's own module beside them, as `python -m` would find it
        sys.path.append(os.getcwd())
    if _find(module_name) is None:
        raise TargetNotFound(f"cannot import target module {module_name!r}: no module of that name "
                             f"(searched the working directory and sys.path)")
    try:
        obj = importlib.import_module(module_name)
    except BaseException as e:  # noqa: BLE001 -- whatever a target's import raises, report it in one line
        if isinstance(e, KeyboardInterrupt):
            raise
        raise TargetLoadError(f"target module {module_name!r} raised on import: {type(e).__name__}: {e}") from e
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetNotFound(f"target {ref!r}: {module_name} has no attribute {attr!r}") from None
    if factory or inspect.isclass(obj):
        if not callable(obj):
            raise TargetNotFound(f"target {ref!r}: {attr} is not callable, so it cannot be a factory")
        try:
            return obj()
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            raise TargetLoadError(f"target {ref!r}: calling {attr}() raised {type(e).__name__}: {e}") from e
    if inspect.isroutine(obj):
        if attr.split(".")[-1] in known_ops():
            return types.SimpleNamespace(**{attr.split(".")[-1]: obj}, NAME=ref)
        raise TargetNotFound(f"target {ref!r}: {attr} is a function but not an operation of the contract; "
                             f"write {module_name}:{attr}() if it returns the target, or name the module "
                             f"({module_name}) or an object providing the operations")
    return obj


def _find(module_name: str):
    try:
        return importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    except Exception:   # noqa: BLE001 -- a parent package raised: it exists; the import reports it
        return True


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


OFFICIAL_KERNELS = "official-kernels"      # a user's own official kernel.py (dsv4spec.official_kernels)


def _official_kernels(spec: str):
    """dsv4spec.official_kernels when spec names that target, else None."""
    if spec == OFFICIAL_KERNELS or spec.startswith(OFFICIAL_KERNELS + ":"):
        return importlib.import_module("dsv4spec.official_kernels")
    return None


PRODUCTION = ("flashmla", "flashmla-decode", "deepgemm", "deepgemm-logits", "sgl-kernel")     # installed production libraries (dsv4spec.production)


def locate(spec: str) -> str:
    """The `pkg.module[:attr]` reference a target spec stands for, without importing the target;
    TargetNotFound when there is nothing of that name."""
    if spec.startswith(EXEC_PREFIX):        # a port in any language (runner/exec_target.py)
        exec_command(spec)
    ok = _official_kernels(spec)
    if ok:
        try:
            ok.kernel_file(spec)
        except ok.KernelUnavailable as e:
            raise TargetNotFound(str(e)) from None
        return spec
    if spec in PRODUCTION:
        return spec
    known = {**_entry_points(), **BUILTIN}
    if spec in known:
        return known[spec]
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module = spec.partition(":")[0]
    if ":" not in spec and _find(module) is None:
        hint = _file_hint(spec) if spec.endswith(".py") else ""
        raise TargetNotFound(f"unknown target {spec!r}{hint}; built-in targets are "
                             f"{', '.join((*BUILTIN, *PRODUCTION))}; "
                             f"otherwise give an entry point of group {ENTRY_POINT_GROUP}, a module "
                             f"(pkg.module, or a file in the working directory without .py) or pkg.module:attr")
    return spec


def _file_hint(path: str) -> str:
    """How to name a target file: as a module of the working directory, or from the folder it is in."""
    relative = os.path.relpath(os.path.abspath(path))
    if relative.startswith(os.pardir + os.sep):
        folder, name = os.path.split(os.path.abspath(path))
        return (f"; the file {path} is outside the working directory: put its folder on the path "
                f"(PYTHONPATH={folder}) and write --target {os.path.splitext(name)[0]}")
    return f"; for the file {path}, write --target {_module_of_file(path)}"


def _module_of_file(path: str) -> str:
    """The module name a file in or below the working directory is imported as: ./mytarget.py is
    mytarget, ports/fp4.py is ports.fp4."""
    return os.path.splitext(os.path.relpath(os.path.abspath(path)))[0].replace(os.sep, ".")


def load_target(spec: str) -> Target:
    """A built-in name, an entry-point name, `pkg.module`, `pkg.module:attr` or `pkg.module:attr()`.

    Raises TargetNotFound (nothing of that name) or TargetLoadError (it raised while loading)."""
    ref = locate(spec)
    if spec.startswith(EXEC_PREFIX):
        return exec_load(spec)
    ok = _official_kernels(spec)
    if ok:
        try:
            return Target(ok.target(spec), spec, name=OFFICIAL_KERNELS)
        except ok.KernelUnavailable as e:
            raise TargetLoadError(str(e)) from None
    if spec in PRODUCTION:
        production = importlib.import_module("dsv4spec.production")
        try:
            return Target(production.target(spec), spec, name=spec)
        except production.LibraryUnavailable as e:
            raise TargetLoadError(str(e)) from None
    if ref != spec:
        return _implementing(Target(_import(ref), spec, name=spec))
    provider = _import(spec)
    try:
        target = Target(provider, spec)
    except ValueError as e:     # VARIANTS naming an unknown knob or value
        raise TargetLoadError(f"target {spec!r}: {e}") from None
    return _implementing(target)


def _implementing(target: Target) -> Target:
    """The target, unless it provides none of the contract's operations."""
    if not any(target.has(op) for op in known_ops()):
        raise NothingImplemented(f"target {target.spec!r} provides none of the contract's operations "
                                 f"(`dsv4spec ops` lists them by name); is it the module you meant?")
    return target
