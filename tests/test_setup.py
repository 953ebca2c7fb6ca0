"""Installing: CPU torch where no GPU is present (an index URL), Triton an extra that no rule
outside the kernels needs, Hypothesis pinned to the range its private hook is tested on."""
import os
import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_triton_is_an_extra_and_hypothesis_is_pinned():
    project = tomllib.loads((HOME / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("triton")]
    assert project["optional-dependencies"]["kernels"] == ["triton==3.6.0"]
    assert "hypothesis>=6.170,<7" in project["dependencies"]


def test_every_rule_but_the_kernels_runs_without_triton(tmp_path):
    script = ("import sys\nsys.modules['triton'] = None\nfrom dsv4spec.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    (tmp_path / "notriton.py").write_text(script)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HOME), "TRITON_INTERPRET": "1"}
    run = lambda *a: subprocess.run([sys.executable, "notriton.py", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path, env=env)
    named = run("verify", "--target", "impl", "--target", "official", "--rules", "FMT.E2M1.RNE,PATH.QDQ,CMP.GATE",
                "--quiet")
    assert named.returncode == 0, named.stdout + named.stderr
    default = run("verify", "--rules", "FMT.E2M1.RNE", "--quiet")
    assert default.returncode == 0, default.stdout + default.stderr
    assert "kernels left out: Triton is not installed" in default.stderr
    assert "conformance claimed by impl:" in default.stdout
