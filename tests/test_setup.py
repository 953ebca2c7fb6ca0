"""Installing: CPU torch where no GPU is present (an index URL), torch bounded to the releases tested,
Triton an extra that no rule outside the kernels needs, Hypothesis pinned to the range its private hook
is tested on, no hard dependency the package does not import, the MIT license; CI runs the README."""
import ast
import os
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import dsv4spec

HOME = Path(dsv4spec.__file__).resolve().parent.parent


def make_n(tmp_path, gpu="", **env):
    """The commands `make test` would run on a fresh machine (HAVE_GPU given, as nvidia-smi would say)."""
    result = subprocess.run(["make", "-n", "-C", str(HOME), "test", f"VENV={tmp_path}/venv", f"HAVE_GPU={gpu}"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_without_a_gpu_make_installs_the_cpu_torch_from_its_index(tmp_path):
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in make_n(tmp_path)
    assert "--index-url" not in make_n(tmp_path, PIP_FIND_LINKS="/opt/wheels")     # a local wheel directory
    assert "--index-url https://example.org/cu130 torch" in make_n(tmp_path, TORCH_INDEX="https://example.org/cu130")
    assert "--index-url" not in make_n(tmp_path, gpu="yes")          # a GPU machine: pip's default (CUDA) torch


PYPROJECT = tomllib.loads((HOME / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def make_pin(variable: str) -> str:
    """The requirement the Makefile installs for VARIABLE (`TORCH ?= torch==2.13.0`)."""
    line = next(line for line in (HOME / "Makefile").read_text().splitlines() if line.startswith(f"{variable} ?="))
    return line.split("?=", 1)[1].strip()


def test_triton_is_only_in_the_kernels_extra_pinned_to_makes_and_hypothesis_is_pinned():
    groups = {"dependencies": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    holding = {group: [r for r in reqs if Requirement(r).name == "triton"] for group, reqs in groups.items()}
    assert {group: reqs for group, reqs in holding.items() if reqs} == {"kernels": [make_pin("TRITON")]}, holding
    assert make_pin("TRITON").startswith("triton==")
    assert "hypothesis>=6.170,<7" in PROJECT["dependencies"]


def test_torch_is_bounded_above_and_admits_the_release_make_installs():
    torch = next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "torch")
    assert any(s.operator in ("<", "<=", "==", "~=") for s in torch.specifier), \
        f"expected an upper bound on torch (the releases tested), got {torch}"
    pinned = Requirement(make_pin("TORCH"))
    assert torch.specifier.contains(next(iter(pinned.specifier)).version), (str(torch), str(pinned))


def imported_distributions() -> set[str]:
    """The distributions that the package's own modules (pyproject's package-dir) import."""
    owners = packages_distributions()
    names = set()
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        for path in (HOME / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {canonical(d) for name in names for d in owners.get(name, [])}


def canonical(name: str) -> str:
    return name.lower().replace("-", "_")


def test_every_hard_dependency_is_imported_by_the_package():
    imported = imported_distributions()
    unused = [r for r in PROJECT["dependencies"] if canonical(Requirement(r).name) not in imported]
    assert not unused, f"hard dependencies no module of the package imports (an extra's, or none): {unused}"


def test_the_license_is_mit_and_the_metadata_says_so():
    text = (HOME / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the dsv4spec authors" in text
    assert PROJECT.get("license") == "MIT" and "LICENSE" in PROJECT.get("license-files", []), \
        'expected license = "MIT" and license-files = ["LICENSE"] in pyproject.toml'


def test_ci_runs_the_readmes_two_commands_and_sets_nothing():
    script = (HOME / ".ci" / "run").read_text().splitlines()
    commands = [line for line in script if line.strip() and not line.startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make verify", "make test"], commands


def test_every_rule_but_the_kernels_runs_without_triton(tmp_path):
    script = ("import sys\nsys.modules['triton'] = None\nfrom dsv4spec.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    (tmp_path / "notriton.py").write_text(script)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HOME), "TRITON_INTERPRET": "1"}
    run = lambda *a: subprocess.run([sys.executable, "notriton.py", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path, env=env)
    named = run("verify", "--target", "impl", "--target", "official", "--rules", "FMT.E2M1.RNE,PATH.QDQ,CMP.GATE",
                "--quiet", "--max-examples", "10")      # what runs without Triton, not how many examples
    assert named.returncode == 0, named.stdout + named.stderr
    default = run("verify", "--rules", "FMT.E2M1.RNE", "--quiet", "--max-examples", "10")
    assert default.returncode == 0, default.stdout + default.stderr
    assert "kernels left out: Triton is not installed" in default.stderr
    assert "conformance claimed by impl:" in default.stdout


def test_the_readmes_pytest_route_installs_the_cpu_torch_that_pyproject_admits():
    torch = next(r for r in PROJECT["dependencies"] if Requirement(r).name == "torch")
    line = f"pip install --index-url https://download.pytorch.org/whl/cpu '{torch}'"
    assert line in (HOME / "README.md").read_text(), f"expected README's pytest route to say: {line}"


@pytest.mark.parametrize("installed, kernels", [("3.7.1", False), ("3.6.0", True), ("3.6.1", True)])
def test_kernels_are_a_default_target_only_on_the_tested_triton(monkeypatch, capsys, installed, kernels):
    """A plain pip install may pair torch 2.13 with Triton 3.7.1: the kernels, tested on 3.6, are then
    left out of the defaults, saying so (`--target kernels` still runs them)."""
    from importlib import metadata
    from dsv4spec import cli
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: installed if name == "triton" else real(name))
    assert ("kernels" in cli._default_targets()) is kernels
    err = capsys.readouterr().err
    assert (f"kernels left out: Triton {installed} is installed; the kernels are tested on Triton 3.6" in err) \
        is not kernels, err


@pytest.mark.thorough       # about 15 s: the package is built from a copy of the working tree
def test_the_sdist_and_the_wheel_carry_what_a_porter_and_a_type_checker_need(tmp_path):
    import shutil
    import tarfile
    import zipfile
    source = tmp_path / "src"
    shutil.copytree(HOME, source, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build"))
    code = "from setuptools import build_meta as b; b.build_sdist('../dist'); b.build_wheel('../dist')"
    built = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert {"PROTOCOL.md", "examples/c_port/port.c", "examples/fp4_port/fp4_port.py"} <= names
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert "dsv4spec/py.typed" in z.namelist()
    assert "Classifier: Programming Language :: Python :: 3" in metadata
    assert "Project-URL" not in metadata and "Classifier: Typing :: Typed" in metadata     # no address unchecked


def test_the_makefile_installs_the_exact_versions_ci_used_and_pyproject_admits_them():
    """constraints.txt pins every package the Makefile installs (torch and Triton are its own pins)
    to one version, each admitted by pyproject.toml; the README's commands stay `make verify`, `make test`."""
    pins = {}
    for line in (HOME / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name.lower().replace("_", "-")] = spec.version
    makefile = (HOME / "Makefile").read_text()
    assert "CONSTRAINTS ?= constraints.txt" in makefile and makefile.count("$(PIN)") == 2
    for needed in ["numpy", "ml-dtypes", "hypothesis", "pytest", "pytest-xdist", "safetensors", "matplotlib",
                   "jsonschema"]:
        assert needed in pins, f"constraints.txt does not pin {needed}"
    for dependency in PROJECT["dependencies"]:
        requirement = Requirement(dependency)
        name = requirement.name.lower().replace("_", "-")
        if name in pins:
            assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is not {requirement}"
