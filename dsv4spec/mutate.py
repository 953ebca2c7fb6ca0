"""Machine-made mutants: every small change to impl/ (or official/) that the suite must catch.

Each mutant is one AST edit of one module of the reference (impl/quant.py, official/pool.py, …):

    const    a numeric constant ×2, ÷2, +1, −1, and (floats) the next fp32 up and down
    compare  < ↔ ≤, > ↔ ≥
    minmax   min ↔ max (min/max, minimum/maximum, amin/amax, fmin/fmax, clamp(min=) ↔ clamp(max=))
    cast     a rounding or cast removed (.float(), .bfloat16(), .to(float dtype), bf16_round, round,
             floor, ceil) or added (BF16, E4M3) on the result of a multiplication or a division
    where    where(c, a, b) → where(c, b, a)
    axis     a reduction's dim/axis moved (−1 → −2, otherwise d → d − 1)

A mutant is loaded as a target in memory: the mutated copy of the module and fresh copies of the
modules of its package that import it (directly or through others: impl/topk.py reaches index_topk,
reindex_topk and index_layer through impl.indexer, impl.pool and impl.path), over the unchanged rest;
the originals are untouched.  It runs, at the ci profile, the rules whose checks call an operation
whose code reaches the edited definition, across modules, nearest first (an operation of the mutated
module, then of a module importing it, ...), stopping at the first one it does not pass (killed).  The
survivors are listed with file:line and operator.  A mutant that cannot change any result (an
equivalent mutant) is marked once, by hand, with a reason, in tests/mutants/EQUIVALENT.toml, keyed
by its id: module:function:operator:the edited source#occurrence, independent of line numbers.

    dsv4spec mutate --modules impl.quant --rules FMT,FP4 --jobs 16 --markdown mutate.md
"""
from __future__ import annotations

import ast
import builtins
import copy
import functools
import importlib
import json
import math
import os
import signal
import struct
import sys
import time
import types
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODULES = ("impl.quant", "impl.indexer", "impl.pool", "impl.compressor", "impl.layout",
           "impl.budget", "impl.rope", "impl.path", "impl.attn", "impl.topk", "official.quant", "official.indexer",
           "official.pool", "official.compressor", "official.rope", "official.path", "official.attn")
OPERATORS = ("const", "compare", "minmax", "cast", "where", "axis")
EQUIVALENT_FILE = Path(__file__).resolve().parents[1] / "tests" / "mutants" / "EQUIVALENT.toml"
KILLED = ("FAIL", "ERROR", "TIMEOUT")

_SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_SWAP_MINMAX = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "amin": "amax",
                "amax": "amin", "fmin": "fmax", "fmax": "fmin"}
_REDUCTIONS = {"sum", "amax", "amin", "max", "min", "mean", "prod", "any", "all", "argmax", "argmin",
               "cumsum", "softmax", "log_softmax", "logsumexp", "argsort", "sort", "topk", "count_nonzero",
               "norm", "var", "std"}
_CASTS_REMOVED = {"float", "bfloat16", "half", "double", "bf16_round", "round", "floor", "ceil", "trunc"}
_FLOAT_DTYPES = {"float32", "bfloat16", "float16", "float64", "float", "half", "double"}


@dataclass(frozen=True)
class Mutant:
    id: str            # stable: module:function:operator:source#occurrence
    module: str        # e.g. impl.quant
    path: str          # file path relative to the repository
    line: int
    function: str      # the enclosing top-level definition
    operator: str
    change: str        # "a < b -> a <= b"


# ---------------------------------------------------------------------------------------------
# Finding the mutation sites
# ---------------------------------------------------------------------------------------------

def _next_f32(v: float, up: bool) -> float:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    if v == 0:
        return struct.unpack("<f", struct.pack("<I", 1))[0] * (1 if up else -1)
    step = 1 if (v > 0) == up else -1
    return struct.unpack("<f", struct.pack("<I", bits + step))[0]


def _const_variants(v) -> list[tuple[str, object]]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return []
    out = [("×2", v * 2), ("÷2", v / 2 if isinstance(v, float) else v // 2), ("+1", v + 1), ("−1", v - 1)]
    if isinstance(v, float) and math.isfinite(v) and abs(v) < 3.4e38:
        out += [("next fp32 up", _next_f32(v, True)), ("next fp32 down", _next_f32(v, False))]
    return [(name, w) for name, w in out if w != v]


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _assigned(stmt) -> list[str]:
    """The names a top-level assignment binds (tuple targets too)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    out = []
    for t in targets:
        out += [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
    return out


def _is_input_check(node: ast.If) -> bool:
    return all(isinstance(s, ast.Raise) for s in node.body) and not node.orelse


class _Sites(ast.NodeVisitor):
    """Every (node path, operator, label, replacement builder) in a module, with its enclosing
    top-level definition; nothing inside a raise, an input check's condition, __all__, a docstring
    or an annotation."""

    def __init__(self):
        self.sites = []          # (top-level name, node, operator, label, make(node) -> new node)
        self.top = "<module>"

    def visit_Module(self, node):
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                self.top = stmt.name
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                names = _assigned(stmt)
                if "__all__" in names:
                    continue
                self.top = ",".join(names) if names else "<module>"
            elif isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Expr)):
                continue
            else:
                self.top = "<module>"
            self.visit(stmt)

    def visit_FunctionDef(self, node):
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)
        for stmt in body:
            self.visit(stmt)
        for dec in node.decorator_list:
            self.visit(dec)

    def visit_Raise(self, node):
        return

    def visit_If(self, node):
        if _is_input_check(node):
            return
        self.generic_visit(node)

    def visit_JoinedStr(self, node):
        return

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)

    def _add(self, node, operator, label, make):
        self.sites.append((self.top, node, operator, label, make))

    def visit_Constant(self, node):
        for name, w in _const_variants(node.value):
            self._add(node, "const", f"{node.value!r} -> {w!r} ({name})",
                      lambda n, w=w: ast.copy_location(ast.Constant(w), n))

    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            v = node.operand.value
            for name, w in _const_variants(-v if isinstance(v, (int, float)) and not isinstance(v, bool) else None):
                self._add(node, "const", f"{-v!r} -> {w!r} ({name})",
                          lambda n, w=w: ast.copy_location(ast.Constant(w), n))
            return
        self.generic_visit(node)

    def visit_Compare(self, node):
        for i, op in enumerate(node.ops):
            if type(op) in _SWAP_CMP:
                def make(n, i=i):
                    n = copy.deepcopy(n)
                    n.ops[i] = _SWAP_CMP[type(n.ops[i])]()
                    return n
                self._add(node, "compare", f"{ast.unparse(node)} -> {ast.unparse(make(node))}", make)
        self.generic_visit(node)

    def visit_BinOp(self, node):
        nodes = list(ast.walk(node))
        computed = any(isinstance(n, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)) for n in nodes)
        sizes = any(isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim") or isinstance(n, ast.Call)
                    and _call_name(n) in ("len", "int", "numel", "size") for n in nodes)
        if isinstance(node.op, (ast.Mult, ast.Div)) and computed and not sizes:   # values, not sizes
            for fmt in ("bf16", "e4m3"):
                self._add(node, "cast", f"{ast.unparse(node)} -> {fmt}({ast.unparse(node)}) (added)",
                          lambda n, fmt=fmt: ast.copy_location(ast.Call(
                              ast.Name(f"__mutate_{fmt}", ast.Load()), [n], []), n))
        self.generic_visit(node)

    def visit_Call(self, node):
        name = _call_name(node)
        text = ast.unparse(node)
        if name in _SWAP_MINMAX:
            def make(n):
                n = copy.deepcopy(n)
                if isinstance(n.func, ast.Attribute):
                    n.func.attr = _SWAP_MINMAX[n.func.attr]
                else:
                    n.func.id = _SWAP_MINMAX[n.func.id]
                return n
            self._add(node, "minmax", f"{text} -> {ast.unparse(make(node))}", make)
        if name in ("clamp", "clip", "clamp_"):
            kws = [k.arg for k in node.keywords]
            if len({"min", "max"} & set(kws)) == 1:
                def make(n):
                    n = copy.deepcopy(n)
                    for k in n.keywords:
                        if k.arg in ("min", "max"):
                            k.arg = "max" if k.arg == "min" else "min"
                    return n
                self._add(node, "minmax", f"{text} -> {ast.unparse(make(node))}", make)
        if name == "where" and len(node.args) == 3:
            def make(n):
                n = copy.deepcopy(n)
                n.args[1], n.args[2] = n.args[2], n.args[1]
                return n
            self._add(node, "where", f"{text} -> {ast.unparse(make(node))}", make)
        builtin = isinstance(node.func, ast.Name) and node.func.id in ("float", "round", "int") \
            and all(isinstance(a, ast.Constant) for a in node.args)
        removable = not builtin and name in _CASTS_REMOVED or (name == "to" and node.args and any(
            isinstance(a, ast.Attribute) and a.attr in _FLOAT_DTYPES for a in node.args))
        if removable:
            inner = node.func.value if isinstance(node.func, ast.Attribute) and not node.args or name == "to" \
                else (node.args[0] if node.args else None)
            if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in ("torch", "np", "math", "F") and node.args:
                inner = node.args[0]
            if inner is not None and not (isinstance(inner, ast.Name) and inner.id in ("torch", "np", "math")):
                self._add(node, "cast", f"{text} -> {ast.unparse(inner)} (removed)",
                          lambda n, inner=inner: ast.copy_location(copy.deepcopy(inner), n))
        if name in _REDUCTIONS:
            for k in node.keywords:
                if k.arg in ("dim", "axis") and isinstance(k.value, (ast.Constant, ast.UnaryOp)):
                    d = ast.literal_eval(k.value)
                    if isinstance(d, int):
                        w = -2 if d == -1 else d - 1
                        def make(n, w=w, arg=k.arg):
                            n = copy.deepcopy(n)
                            for kk in n.keywords:
                                if kk.arg == arg:
                                    kk.value = ast.Constant(w)
                            return n
                        self._add(node, "axis", f"{text} -> {ast.unparse(make(node))}", make)
        self.generic_visit(node)


def _path_of(module: str) -> Path:
    return Path(importlib.import_module(f"dsv4spec.{module}").__file__)


def _repo_relative(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _sites(module: str):
    tree = ast.parse(_path_of(module).read_text())
    finder = _Sites()
    finder.visit(tree)
    return tree, finder.sites


def _identified(module: str):
    """(the parsed module, [(Mutant, the node, make(node) -> its replacement)]) in source order."""
    tree, sites = _sites(module)
    path = _repo_relative(_path_of(module))
    seen: Counter = Counter()
    out = []
    for top, node, operator, label, make in sites:
        key = f"{module}:{top}:{operator}:{label}"
        seen[key] += 1
        out.append((Mutant(f"{key}#{seen[key]}", module, path, node.lineno, top, operator, label), node, make))
    return tree, out


def mutants_of(module: str, operators=OPERATORS) -> list[Mutant]:
    """Every mutant of one module, in source order, each with its stable id."""
    return [m for m, _, _ in _identified(module)[1] if m.operator in operators]


def all_mutants(modules=MODULES, operators=OPERATORS) -> list[Mutant]:
    return [m for module in modules for m in mutants_of(module, operators)]


# ---------------------------------------------------------------------------------------------
# Loading a mutant as a target
# ---------------------------------------------------------------------------------------------

def _rounded(t, to, limit=None):
    """t (a Python number or a tensor, integer or floating) rounded to the format `to`, in its own
    type: an integer computed through BF16 loses its low bits as a float does."""
    import torch
    if isinstance(t, bool) or not isinstance(t, (int, float, torch.Tensor)) or \
            isinstance(t, torch.Tensor) and t.dtype == torch.bool:
        return t
    x = torch.tensor(float(t)) if isinstance(t, (int, float)) else t.float()
    x = (x.clamp(-limit, limit) if limit else x).to(to).float()
    if isinstance(t, (int, float)):
        return type(t)(x.item())
    return x.to(t.dtype)


def _round_bf16(t):
    import torch
    return _rounded(t, torch.bfloat16)


def _round_e4m3(t):
    import torch
    return _rounded(t, torch.float8_e4m3fn, 448)


def _mutated_tree(mutant: Mutant) -> ast.Module:
    tree, found = _identified(mutant.module)
    chosen = [(node, make) for m, node, make in found if m.id == mutant.id]
    if not chosen:
        raise KeyError(f"no mutant {mutant.id!r} in {mutant.module} (the source changed?)")
    node, make = chosen[0]

    class Replace(ast.NodeTransformer):
        def generic_visit(self, n):
            if n is node:
                return make(n)
            return super().generic_visit(n)
    return ast.fix_missing_locations(Replace().visit(tree))


@functools.lru_cache(maxsize=None)
def _original_code(module: str):
    path = _path_of(module)
    return compile(path.read_text(), str(path), "exec")


class _Copies:
    """Fresh copies of the mutated module and of every module of its package that imports it,
    directly or through another (impl.indexer and impl.pool over a mutated impl.topk): each copy is
    run from its source with the package's relative imports of a copied module resolved to the
    copy, at import time and inside functions alike.  sys.modules and the originals are untouched,
    so nothing outside the target (the checks' oracles, spec/) sees the mutant."""

    def __init__(self, mutant: Mutant):
        self.mutant = mutant
        self.package = mutant.module.split(".")[0]
        self.copied = importers(mutant.module)
        self.copies: dict[str, types.ModuleType] = {}
        self.builtins = {**vars(builtins), "__import__": self._import}

    def get(self, module: str) -> types.ModuleType:
        if module not in self.copied:
            return importlib.import_module(f"dsv4spec.{module}")
        if module not in self.copies:
            code = compile(_mutated_tree(self.mutant), str(_path_of(module)), "exec") \
                if module == self.mutant.module else _original_code(module)
            original = importlib.import_module(f"dsv4spec.{module}")
            copy_ = types.ModuleType(original.__name__, original.__doc__)
            copy_.__dict__.update(__file__=original.__file__, __package__=original.__package__,
                                  __builtins__=self.builtins, __mutate_bf16=_round_bf16, __mutate_e4m3=_round_e4m3)
            exec(code, copy_.__dict__)   # noqa: S102 -- our own source
            self.copies[module] = copy_
        return self.copies[module]

    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 1 and (globals or {}).get("__package__") == f"dsv4spec.{self.package}":
            if name and f"{self.package}.{name}" in self.copied:            # from .topk import …
                return self.get(f"{self.package}.{name}")
            if not name and any(f"{self.package}.{n}" in self.copied for n in fromlist):   # from . import quant
                package = importlib.import_module(f"dsv4spec.{self.package}")
                return types.SimpleNamespace(**{n: self.get(f"{self.package}.{n}") if f"{self.package}.{n}"
                                                in self.copied else getattr(package, n) for n in fromlist})
        return builtins.__import__(name, globals, locals, fromlist, level)


def mutated_module(mutant: Mutant) -> types.ModuleType:
    """The mutated copy of the module, loaded in memory (its relative imports resolved as the
    original's); the original stays untouched in sys.modules."""
    return _Copies(mutant).get(mutant.module)


def _exports(module) -> list[str]:
    """The names `from module import *` binds."""
    return list(getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")])


def _public(module) -> dict:
    return {n: getattr(module, n) for n in _exports(module) if callable(getattr(module, n, None))}


def mutant_target(mutant: Mutant):
    """The package of the mutated module (impl or official), its operations taken from the copies
    (the mutated module and its importers), as the package's __init__ binds them."""
    from dsv4spec.runner.target import Target
    copies = _Copies(mutant)
    package = importlib.import_module(f"dsv4spec.{copies.package}")
    provider = types.SimpleNamespace(**{k: getattr(package, k) for k in dir(package) if not k.startswith("_")})
    for module in package_modules(copies.package, exported=True):
        if module in copies.copied:
            source = copies.get(module)
            for name in _exports(source):
                setattr(provider, name, getattr(source, name))
    provider.NAME = f"mutant:{mutant.id}"
    return Target(provider, provider.NAME)


# ---------------------------------------------------------------------------------------------
# Which rules a mutant runs
# ---------------------------------------------------------------------------------------------

def package_modules(package: str, exported: bool = False) -> list[str]:
    """The package's modules: those its __init__ star-imports, in that order (the operations it
    provides), then, unless `exported`, the others (impl.topk: helpers of several modules)."""
    init = Path(importlib.import_module(f"dsv4spec.{package}").__file__)
    starred = [f"{package}.{s.module}" for s in ast.parse(init.read_text()).body if isinstance(s, ast.ImportFrom)
               and s.level == 1 and s.module and any(a.name == "*" for a in s.names)]
    if exported:
        return starred
    rest = sorted(f"{package}.{p.stem}" for p in init.parent.glob("*.py") if p.stem != "__init__")
    return starred + [m for m in rest if m not in starred]


def _bindings(node, package: str) -> dict[str, tuple[str, str | None]]:
    """{local name: (module, its name there; None: the module itself)} of the relative imports of
    the package within `node` (at any depth)."""
    out = {}
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and n.level == 1:
            for a in n.names:
                if n.module:
                    out[a.asname or a.name] = (f"{package}.{n.module}", a.name)
                else:
                    out[a.asname or a.name] = (f"{package}.{a.name}", None)
    return out


def _tops(tree) -> dict[str, ast.AST]:
    tops = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            tops[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            names = _assigned(stmt)
            for name in names:
                tops[name] = stmt
            if len(names) > 1:
                tops[",".join(names)] = stmt
    return tops


@functools.lru_cache(maxsize=None)
def _graph(package: str) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """{(module, top-level name): the (module, name)s its code names}, across the package's modules:
    an imported name leads to its definition, `quant.fp8_qdq` to quant's, a bare module to all of it."""
    trees = {m: ast.parse(_path_of(m).read_text()) for m in package_modules(package)}
    tops = {m: _tops(t) for m, t in trees.items()}
    edges: dict = defaultdict(set)
    for module, tree in trees.items():
        imported = _bindings(ast.Module([s for s in tree.body if isinstance(s, ast.ImportFrom)], []), package)
        for local, (source, name) in imported.items():
            if name is not None and source in tops:
                edges[(module, local)].add((source, name))
        for top, stmt in tops[module].items():
            bound = {**imported, **_bindings(stmt, package)}
            attributes = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Attribute)
                          and isinstance(n.value, ast.Name) and bound.get(n.value.id, ("", ""))[1] is None}
            for n in ast.walk(stmt):
                if isinstance(n, ast.Attribute) and id(n.value) in attributes:
                    edges[(module, top)].add((bound[n.value.id][0], n.attr))
                elif isinstance(n, ast.Name) and id(n) not in attributes and n.id != top:
                    if n.id in tops[module]:
                        edges[(module, top)].add((module, n.id))
                    elif n.id in imported and imported[n.id][1] is not None:
                        edges[(module, top)].add((module, n.id))
                    elif n.id in bound and bound[n.id][0] in tops:
                        source, name = bound[n.id]
                        edges[(module, top)] |= {(source, name)} if name else {(source, t) for t in tops[source]}
    return edges


@functools.lru_cache(maxsize=None)
def _imports(package: str) -> dict[str, frozenset[str]]:
    """{module: the modules of its package it imports}."""
    return {m: frozenset(source for source, _ in _bindings(ast.parse(_path_of(m).read_text()), package).values())
            for m in package_modules(package)}


@functools.lru_cache(maxsize=None)
def importers(module: str) -> dict[str, int]:
    """{the module and every module of its package that imports it, directly or through others:
    the fewest imports between them} (impl.topk 0, impl.indexer 1, impl.path 2, …)."""
    imports = _imports(module.split(".")[0])
    out = {module: 0}
    while grown := {m for m, sources in imports.items() if sources & set(out)} - set(out):
        out.update({m: 1 + min(out[s] for s in imports[m] if s in out) for m in grown})
    return out


def _operations(package: str) -> dict[str, tuple[str, str]]:
    """{operation: (the module, the name) the package binds it to}."""
    out = {}
    for module in package_modules(package, exported=True):
        out.update({name: (module, name) for name in _public(importlib.import_module(f"dsv4spec.{module}"))})
    return out


@functools.lru_cache(maxsize=None)
def _reaching(package: str) -> dict[tuple[str, str], set[str]]:
    """{(module, top-level name): the operations of the package whose code reaches it}."""
    edges = _graph(package)
    reach = defaultdict(set)
    for op, start in _operations(package).items():
        stack, seen = [start], set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            reach[node].add(op)
            stack += edges.get(node, ())
    return reach


def reaching_ops(mutant: Mutant) -> set[str]:
    """The operations whose code reaches the mutated definition (module-level code: all that reach
    any definition of the module), and the per-format names a reached bundled one provides."""
    from dsv4spec.runner.target import SPLIT
    reach = _reaching(mutant.module.split(".")[0])
    names = [mutant.function, *mutant.function.split(",")]
    if any((mutant.module, n) in reach for n in names):
        ops = set().union(*(reach.get((mutant.module, n), set()) for n in names))
    else:
        ops = set().union(*(v for (module, _), v in reach.items() if module == mutant.module))
    return ops | {split for split, (bundled, _) in SPLIT.items() if bundled in ops}


def rules_for(mutant: Mutant, prefixes=None) -> list[str]:
    """The rules (within the prefixes) with a check calling an operation that reaches the mutated
    definition, nearest first (a check calling an operation of the mutated module itself, then of a
    module importing it, …: the cheapest to fail), each distance in registry order."""
    from dsv4spec.runner.suite import load_checks
    from dsv4spec.runner.target import SPLIT
    from dsv4spec.spec.rules import select
    ops = reaching_ops(mutant)
    hops = importers(mutant.module)
    far = len(hops)
    distance = {op: hops.get(module, far) for op, (module, _) in _operations(mutant.module.split(".")[0]).items()}
    distance.update({split: distance.get(bundled, far) for split, (bundled, _) in SPLIT.items()})
    nearest: dict[str, int] = {}
    for c in load_checks():
        for op in set(c.ops) & ops:
            nearest[c.rule_id] = min(nearest.get(c.rule_id, far), distance.get(op, far))
    ids = [r.id for r in select(prefixes) if r.id in nearest]
    return sorted(ids, key=lambda r: nearest[r])      # stable: registry order within a distance


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

@dataclass
class Result:
    mutant: Mutant
    status: str                 # killed, survived, equivalent, no rule (no check reaches it), error
    rule: str = ""              # the rule that killed it
    verdict: str = ""           # FAIL, ERROR or TIMEOUT on that rule
    ran: list = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""            # the equivalence reason


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def verdict(rule_id: str, target, profile: str = "ci") -> str:
    """The rule's status on the target, fast: its checks without shrinking, stopping at the first
    one not passed; a failure that an undeclared implementation-defined choice might explain (a
    knob of suite.CHOICES was read) is confirmed by the full run_rule (which names VARIANTs)."""
    from dsv4spec.runner.suite import CHOICES, _reading, checks_for, run_check, run_rule
    read: set = set()
    probe = _reading(target, read)
    for chk in checks_for(rule_id):
        status = run_check(chk, probe, profile, shrink=False).status
        if status in KILLED:
            return run_rule(rule_id, target, profile).status if read & CHOICES else status
    return "PASS"


RULE_LIMIT_S = 600          # wall seconds one rule may take on one mutant (a hang is TIMEOUT, killed)
QUICK_EXAMPLES = 20         # first pass: most mutants fail on the first examples of the first rule


def run_mutant(mutant: Mutant, prefixes=None, profile: str = "ci", limit_s: int = RULE_LIMIT_S) -> Result:
    """Killed at the first rule not passed: every rule first with QUICK_EXAMPLES examples a check (a
    failure there is a failure on a valid draw of the same checks), then, for what survived that,
    every rule at the profile's own size.  A survivor ran both passes."""
    from dsv4spec.runner.suite import RUN
    start = time.perf_counter()
    rules = rules_for(mutant, prefixes)
    if not rules:
        return Result(mutant, "no rule", seconds=0.0)
    try:
        target = mutant_target(mutant)
    except Exception as e:   # noqa: BLE001 -- a mutant that does not even load is caught at once
        return Result(mutant, "killed", "", f"load error: {type(e).__name__}: {e}", [], time.perf_counter() - start)
    ran = []
    old = signal.signal(signal.SIGALRM, _alarm) if hasattr(signal, "SIGALRM") else None
    own_size = RUN.max_examples
    try:
        for size in (QUICK_EXAMPLES, own_size):
            RUN.max_examples = size
            for rule_id in rules:
                if rule_id not in ran:
                    ran.append(rule_id)
                if old is not None:
                    signal.alarm(limit_s)
                try:
                    status = verdict(rule_id, target, profile)
                except _Timeout:
                    return Result(mutant, "killed", rule_id, "TIMEOUT", ran, time.perf_counter() - start)
                finally:
                    if old is not None:
                        signal.alarm(0)
                if status in KILLED:
                    return Result(mutant, "killed", rule_id, status, ran, time.perf_counter() - start)
    finally:
        RUN.max_examples = own_size
        if old is not None:
            signal.signal(signal.SIGALRM, old)
    return Result(mutant, "survived", "", "", ran, time.perf_counter() - start)


def load_equivalent(path: Path | None = None) -> dict[str, str]:
    """{mutant id: the reason it cannot change any result}, from the committed TOML file (a
    checkout's: FileNotFoundError where it is missing, as in an installed wheel)."""
    path = EQUIVALENT_FILE if path is None else path
    if not path.exists():
        raise FileNotFoundError(f"no {path}: the equivalent mutants are marked in the repository's tests, which "
                                f"an installed wheel does not ship; run mutate in a checkout (git clone, then "
                                f"pip install -e .)")
    import tomllib
    data = tomllib.loads(path.read_text())
    return {k: v["reason"] for k, v in data.get("mutant", {}).items()}


def _worker(args):
    mutant, prefixes, profile = args
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return run_mutant(mutant, prefixes, profile)


def run(mutants: list[Mutant], prefixes=None, profile: str = "ci", jobs: int = 1, progress=None,
        equivalent: dict | None = None) -> list[Result]:
    """Every mutant (the equivalent ones marked, not run), in parallel workers when jobs > 1."""
    equivalent = load_equivalent() if equivalent is None else equivalent
    results, todo = [], []
    for m in mutants:
        if m.id in equivalent:
            results.append(Result(m, "equivalent", reason=equivalent[m.id]))
        else:
            todo.append(m)
    if jobs <= 1:
        for i, m in enumerate(todo):
            results.append(run_mutant(m, prefixes, profile))
            if progress:
                progress(i + 1, len(todo), results[-1])
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(_worker, (m, prefixes, profile)) for m in todo]
            for i, f in enumerate(as_completed(futures)):
                results.append(f.result())
                if progress:
                    progress(i + 1, len(todo), results[-1])
    order = {m.id: i for i, m in enumerate(mutants)}
    return sorted(results, key=lambda r: order[r.mutant.id])


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

def family(rule_id: str) -> str:
    return rule_id.split(".")[0]


def scores(results: list[Result]) -> dict:
    """Killed / (killed + survived) per module, per family (of the killing rule, or of every rule a
    survivor ran), per operator, and per rule."""
    def tally(key_of):
        t = defaultdict(Counter)
        for r in results:
            for key in key_of(r):
                t[key][r.status] += 1
        return {k: dict(v) for k, v in sorted(t.items())}
    per_rule = tally(lambda r: [r.rule] if r.status == "killed" and r.rule else r.ran if r.status == "survived" else [])
    return {
        "module": tally(lambda r: [r.mutant.module]),
        "family": tally(lambda r: sorted({family(x) for x in ([r.rule] if r.status == "killed" and r.rule
                                                                   else r.ran)}) or ["(none)"]),
        "operator": tally(lambda r: [r.mutant.operator]),
        "rule": per_rule,
    }


def _score_text(c: dict) -> str:
    killed, survived = c.get("killed", 0), c.get("survived", 0)
    total = killed + survived
    score = f"{killed / total:.1%}" if total else "—"
    return f"{killed:>4} killed {survived:>4} survived {c.get('equivalent', 0):>3} equivalent  score {score}"


def render(results: list[Result]) -> str:
    s = scores(results)
    lines = [f"{len(results)} mutants: " + ", ".join(f"{v} {k}" for k, v in Counter(r.status for r in results).items())]
    for what in ("module", "operator", "family"):
        lines.append(f"\nby {what}:")
        lines += [f"  {k:<22} {_score_text(c)}" for k, c in s[what].items()]
    survivors = [r for r in results if r.status == "survived"]
    lines.append(f"\nsurvivors ({len(survivors)}):" if survivors else "\nno survivor")
    lines += [f"  {r.mutant.path}:{r.mutant.line}  [{r.mutant.operator}] {r.mutant.change}  (in {r.mutant.function}; "
              f"ran {', '.join(r.ran)})\n      id {r.mutant.id}" for r in survivors]
    return "\n".join(lines)


def markdown(results: list[Result], command: str = "") -> str:
    s = scores(results)
    out = ["# Mutation report", "", f"`{command}`" if command else "", "",
           "Machine-made mutants of impl/ and official/ (dsv4spec/mutate.py), each run at the ci profile "
           "on the rules whose checks reach the edited code, stopping at the first rule it does not pass.  "
           "Score = killed / (killed + survived); equivalent mutants (tests/mutants/EQUIVALENT.toml) are "
           "not counted.", ""]
    for what in ("family", "module", "operator"):
        out += [f"## By {what}", "", f"| {what} | killed | survived | equivalent | no rule | score |", "|---|---|---|---|---|---|"]
        for k, c in s[what].items():
            killed, survived = c.get("killed", 0), c.get("survived", 0)
            score = f"{killed / (killed + survived):.1%}" if killed + survived else "—"
            out.append(f"| {k} | {killed} | {survived} | {c.get('equivalent', 0)} | {c.get('no rule', 0)} | {score} |")
        out.append("")
    out += ["## By rule (killed: the first rule the mutant failed; survived: every rule it ran)", "",
            "| rule | killed | survived |", "|---|---|---|"]
    out += [f"| {k} | {c.get('killed', 0)} | {c.get('survived', 0)} |" for k, c in s["rule"].items()]
    survivors = [r for r in results if r.status == "survived"]
    out += ["", f"## Survivors ({len(survivors)})", ""]
    out += [f"- `{r.mutant.path}:{r.mutant.line}` [{r.mutant.operator}] `{r.mutant.change}` in `{r.mutant.function}` "
            f"— id `{r.mutant.id}`" for r in survivors] or ["none"]
    return "\n".join(out) + "\n"


def to_json(results: list[Result]) -> str:
    return json.dumps({"schema": 1, "results": [asdict(r) for r in results], "scores": scores(results)},
                      indent=1, ensure_ascii=False)


def from_json(texts) -> list[Result]:
    """The results of earlier runs (their --json files, e.g. one per shard), the equivalence file
    applied again (a mutant marked since counts as equivalent), each mutant once (the last wins)."""
    equivalent = load_equivalent()
    out: dict[str, Result] = {}
    for text in texts:
        for r in json.loads(text)["results"]:
            result = Result(**{**r, "mutant": Mutant(**r["mutant"])})
            if result.mutant.id in equivalent:
                result.status, result.reason = "equivalent", equivalent[result.mutant.id]
            out[result.mutant.id] = result
    return list(out.values())


def select_mutants(modules=MODULES, operators=OPERATORS, shard: tuple[int, int] | None = None,
                   ids=None) -> list[Mutant]:
    mutants = all_mutants(modules, operators)
    if ids:
        mutants = [m for m in mutants if m.id in set(ids)]
    if shard:
        k, n = shard
        mutants = mutants[k - 1::n]
    return mutants


if __name__ == "__main__":     # pragma: no cover
    print(render(run(select_mutants(sys.argv[1:] or MODULES))))
