"""The package's imports run one way (docs/HOUSE.md): no cycle among its modules, and no layer
imports a layer above it.

Every `import` and `from ... import` of a module counts, at module level AND inside functions: a
function-level import still couples the two modules (the importing code cannot run, be read or be
moved without the imported one), and hiding an import inside a function is how cycles were kept
alive.  Imports by name at run time (importlib.import_module of a target or a family module) are
not counted: they load what a user names or what a table lists, as the suite loads a user's target.
Relative imports are resolved against the importing module; the folders are mapped to their
package names as pyproject.toml's [tool.setuptools.package-dir] maps them (spec/ is dsv4spec.spec).
"""
from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The layers, lowest first: a module may import its own layer and the layers below it, never one
# above.  impl and official share a rank but are independent readings of the spec: neither imports
# the other.  "base" is the few modules of dsv4spec/ that import nothing above themselves and that
# every layer may use; the rest of dsv4spec/ is the command line, on top.
LAYERS = (("base",), ("spec",), ("impl", "official"), ("kernels",), ("properties",), ("runner",), ("trace",), ("golden",),
          ("cli",))
BASE = {"dsv4spec", "dsv4spec.triton_mode", "dsv4spec.interpreter", "dsv4spec.parent_death", "dsv4spec.processes"}
RANK = {layer: rank for rank, layers in enumerate(LAYERS) for layer in layers}


def package_dirs(root: Path) -> dict[str, Path]:
    """{package name: its folder} for every package pyproject.toml lists: a mapped one's folder from
    package-dir, a subpackage's (dsv4spec.kernels.topk) inside its parent's."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: root / folder for name, folder in setuptools["package-dir"].items()}
    for name in sorted(setuptools["packages"], key=len):
        if name not in folders:
            parent, _, last = name.rpartition(".")
            folders[name] = folders[parent] / last
    return folders


def package_modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (its file, whether it is a package's __init__)} for every module."""
    modules = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.glob("*.py")):
            is_package = path.stem == "__init__"
            modules[package if is_package else f"{package}.{path.stem}"] = (path, is_package)
    return modules


def from_module(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module a `from ... import` of module `name` imports from."""
    if not node.level:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, known) -> set[str]:
    """The package modules an import statement of module `name` imports."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = from_module(name, is_package, node)
        candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for candidate in candidates:
        while candidate and candidate not in known:       # `import a.b.c` of a non-module c
            candidate = candidate.rpartition(".")[0]
        if candidate and candidate != name:
            found.add(candidate)
    return found


@functools.lru_cache(maxsize=1)
def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package modules it imports}, module-level and function-level imports alike."""
    modules = package_modules(root)
    graph = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = set().union(*(imported(name, is_package, node, modules) for node in ast.walk(tree)
                                    if isinstance(node, (ast.Import, ast.ImportFrom))))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) through each strongly connected group of modules."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while not group or v not in group:
                group.add(stack.pop())
            on_stack.difference_update(group)
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set[str], graph) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & group):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no cycle in {sorted(group)}")


def layer_of(module: str) -> str:
    if module in BASE:
        return "base"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else "cli"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer, and each import between impl and official."""
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = layer_of(module), layer_of(target)
            if RANK[theirs] > RANK[mine] or (mine != theirs and RANK[mine] == RANK[theirs]):
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    return wrong


def test_no_import_cycle():
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles (move the shared piece down a module):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_no_layer_imports_a_higher_one():
    wrong = layer_violations(import_graph(ROOT))
    assert not wrong, ("imports against the layers (lowest first: " + " < ".join("/".join(l) for l in LAYERS)
                       + ", docs/HOUSE.md):\n" + "\n".join(wrong))


def test_the_graph_sees_every_package_and_both_kinds_of_import():
    """The checker reads what it must: each package folder, relative and absolute imports, imports
    inside functions."""
    graph = import_graph(ROOT)
    assert {layer_of(m) for m in graph} == set(RANK), "a package folder the layers do not name"
    assert "dsv4spec.spec.rules" in graph["dsv4spec.runner.suite"]                # from ..spec.rules import
    assert "dsv4spec.runner.target" in graph["dsv4spec.command"]                  # inside handled()
    assert "dsv4spec.triton_mode" in graph["dsv4spec.interpreter"]                # from dsv4spec.x import
    assert "dsv4spec.kernels.topk.radix" in graph["dsv4spec.kernels.topk.filter"]   # a subpackage's modules


def test_the_checker_reports_a_cycle_and_an_upward_import():
    graph = {"dsv4spec.spec.a": {"dsv4spec.properties.b"}, "dsv4spec.properties.b": {"dsv4spec.spec.a"},
             "dsv4spec.impl.c": {"dsv4spec.official.d"}, "dsv4spec.official.d": set()}
    assert cycles(graph) == [["dsv4spec.properties.b", "dsv4spec.spec.a", "dsv4spec.properties.b"]]
    assert layer_violations(graph) == [
        "dsv4spec.impl.c (impl) imports dsv4spec.official.d (official)",
        "dsv4spec.spec.a (spec) imports dsv4spec.properties.b (properties)"]


def test_house_md_states_the_layers_this_test_enforces():
    """docs/HOUSE.md's layer table lists the same layers, in the same order, as LAYERS."""
    text = (ROOT / "docs" / "HOUSE.md").read_text()
    rows = re.findall(r"^\| (\d) \| ([a-z, ]+) \|", text, re.M)
    assert [(int(rank), tuple(n.strip() for n in names.split(","))) for rank, names in rows] == \
        list(enumerate(LAYERS)), "docs/HOUSE.md's table '| rank | layer | ...' differs from LAYERS"
    for module in sorted(BASE - {"dsv4spec"}):
        assert module.rpartition(".")[2] in text, f"docs/HOUSE.md does not name the base module {module}"



def old_names() -> list[str]:
    """The runner's modules' names from before issue 41 moved them out of properties/."""
    from dsv4spec.properties import MOVED
    return [f"dsv4spec.properties.{name}" for name in MOVED] + ["dsv4spec.properties.coverage.engine"]


def test_every_old_name_of_the_runner_imports_as_its_module():
    """`import dsv4spec.properties.target` and the rest keep working, as the very module of the new
    name (one module object: its state, its classes and a patch of it are shared)."""
    import importlib
    for old in old_names():
        new = old.replace("dsv4spec.properties.", "dsv4spec.runner.")
        assert importlib.import_module(old) is importlib.import_module(new), old
    from dsv4spec.properties.suite import check, run_rule, verify  # noqa: F401
    from dsv4spec.properties.target import Target, load_target  # noqa: F401
    from dsv4spec.properties import plugin, adapters  # noqa: F401
    assert not (ROOT / "properties" / "suite.py").exists()        # a finder, not a file at the old path


def test_the_pytest_plugin_entry_point_names_a_module_that_imports():
    import importlib
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]["dsv4spec"]
    assert hasattr(importlib.import_module(entry), "pytest_addoption"), entry


def test_no_module_imports_an_old_name():
    """The package imports the runner by its own name; the old names are for users only."""
    old = old_names()
    found = []
    for name, (path, is_package) in package_modules(ROOT).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = from_module(name, is_package, node)
                named = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            found += [f"{name} imports {n}" for n in named if n in old or n.startswith(tuple(f"{o}." for o in old))]
    assert not found, "\n".join(found)


MODULE_LINES = 900
LAYER_FOLDERS = ("spec", "impl", "properties", "runner", "kernels", "golden", "trace")


def long_modules(root: Path) -> dict[str, int]:
    """{path: lines} of the layers' modules over MODULE_LINES lines, subpackages included."""
    found = {}
    for folder in LAYER_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MODULE_LINES:
                found[path.relative_to(root).as_posix()] = lines
    return found


def long_modules_explained(house_md: str) -> dict[str, str]:
    """{path: why it is one thing} from docs/HOUSE.md's list of long modules ("- `path`: why")."""
    section = house_md.partition("## Modules over 900 lines")[2].partition("\n## ")[0]
    return dict(re.findall(r"^- `([\w/.]+\.py)`: (\S.*)$", section, re.M))


def test_no_long_module_without_a_reason():
    """One engine, one module: a module of spec/, impl/, properties/, kernels/ or golden/ over 900
    lines is either cut where its structure says or named in docs/HOUSE.md with why it is one thing."""
    explained = long_modules_explained((ROOT / "docs" / "HOUSE.md").read_text())
    unexplained = {path: n for path, n in long_modules(ROOT).items() if path not in explained}
    assert not unexplained, (f"modules over {MODULE_LINES} lines (split them, or add '- `path`: why it is one "
                             f"thing' under docs/HOUSE.md's '## Modules over 900 lines'): {unexplained}")


def test_the_long_module_check_reads_the_list_it_enforces():
    house = ("# x\n\n## Modules over 900 lines\n\n- `properties/path.py`: the PATH checks.\n\n"
             "## Next\n\n- `a/b.py`: not in the section\n")
    assert long_modules_explained(house) == {"properties/path.py": "the PATH checks."}


def test_bench_holds_scripts_only():
    """Run records live under docs/records/ (dated, as measured); bench/ holds what measures."""
    others = sorted(p.name for p in (ROOT / "bench").iterdir()
                    if p.name != "__pycache__" and not (p.is_file() and p.suffix in {".py", ".sh"}))
    assert not others, f"bench/ should hold only .py and .sh scripts; move these under docs/records/: {others}"


MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(page: Path) -> list[str]:
    """The relative links of a Markdown page whose file or folder does not exist."""
    broken = []
    for target in MARKDOWN_LINK.findall(page.read_text()):
        path = target.split("#")[0]
        if path and "://" not in path and not path.startswith("mailto:") and not (page.parent / path).exists():
            broken.append(f"{page.relative_to(ROOT)}: {target}")
    return broken


def test_every_relative_link_of_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "PROTOCOL.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_is_short_and_links_every_page():
    """README.md is read in five minutes; every other page is one link away from it."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250, f"README.md has {len(readme.splitlines())} lines; move detail into docs/"
    linked = set(MARKDOWN_LINK.findall(readme))
    pages = ["PROTOCOL.md", "SPEC.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
    unlinked = [p for p in pages if not any(link.split("#")[0] == p for link in linked)]
    assert not unlinked, f"pages README.md does not link: {unlinked}"


def paragraphs(markdown: str, longer_than: int = 100) -> list[str]:
    return [p.strip() for p in markdown.split("\n\n") if len(p.strip()) > longer_than]


def test_spec_md_states_each_paragraph_once():
    """A shared tolerance or policy is stated once (its section) and named by each rule; the rule
    book repeats no paragraph (the rendered one: another test holds SPEC.md equal to it)."""
    from dsv4spec.spec.document import render
    seen, repeated = set(), set()
    for p in paragraphs(render()):
        (repeated if p in seen else seen).add(p)
    assert not repeated, "SPEC.md repeats:\n" + "\n".join(p[:120] for p in repeated)


def test_every_family_heading_of_spec_md_has_a_title():
    from dsv4spec.spec.document import render
    headings = re.findall(r"^## ([A-Z]+) — (.+)$", render(), re.M)
    assert headings and all(title != family for family, title in headings), \
        f"family headings without a title (give it one in spec/document.py FAMILY_TITLES): {headings}"


def test_dsv4spec_ops_lists_each_operation_once(capsys):
    """Each operation under the family that declares it (formats' checks call quant's codecs)."""
    import json
    from dsv4spec.cli import main
    assert main(["ops"]) == 0
    listed = [line.split("(")[0].strip() for line in capsys.readouterr().out.splitlines()
              if line.startswith("  ") and not line.lstrip().startswith("checked by")]
    assert main(["ops", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    in_json = [entry["op"] for family, entries in table.items() if family != "contract" for entry in entries]
    for ops in (listed, in_json):
        assert ops and len(ops) == len(set(ops)), f"listed more than once: {sorted({o for o in ops if ops.count(o) > 1})}"
