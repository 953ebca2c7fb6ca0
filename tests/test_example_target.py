"""examples/fp4_port stays a working example: its declared variant is VARIANT, its undeclared
float-log2 scale is a FAIL naming the variant, what it lacks is n/i; installed in a fresh virtual
environment, it is verified through the CLI and through pytest, and the printed reproduce line
reproduces when pasted in another directory."""
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from dsv4spec.properties.suite import FAIL, NOT_IMPLEMENTED, PASS, VARIANT, run_rule
from dsv4spec.properties.target import load_target

HOME = Path(__file__).resolve().parent.parent
EXAMPLE = HOME / "examples" / "fp4_port"


@pytest.fixture
def port(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return load_target("fp4_port:Fp4Port")


def test_the_example_port_reports_as_documented(port):
    assert run_rule("FMT.E2M1.RNE", port).status == PASS
    assert run_rule("FP4.E2M1.RNE", port).status == PASS           # payloads judged against its own scales
    assert run_rule("FP4.PACK.NIBBLE", port).status == VARIANT
    assert run_rule("FP4.KV.SCALE", port).status == NOT_IMPLEMENTED
    row = run_rule("FP4.IDX.SCALE", port)
    assert row.status == FAIL and row.detail.startswith("matches e8m0_rounding=float_log2_ceil (undeclared)")
    assert "got 0x83 2^4, expected 0x84 2^5" in row.detail


def test_the_same_port_without_its_declaration_fails_and_is_named(port):
    port.variants = dict(port.variants, nibble_order="low_first")
    row = run_rule("FP4.PACK.NIBBLE", port)
    assert row.status == FAIL and "matches nibble_order=high_first" in row.detail


def test_installed_in_a_fresh_venv_it_is_verified_by_the_cli_and_by_pytest(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    # The fresh environment borrows this one's packages (torch, pytest, pip, setuptools) but not its
    # import path: dsv4spec and the example are installed into it.
    purelib = subprocess.run([env_dir / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    python = str(env_dir / "bin" / "python")
    for project in (HOME, EXAMPLE):
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "-e", str(project)], env=env, cwd=tmp_path, check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    cli = subprocess.run(["dsv4spec", "verify", "--target", "fp4-port", "--rules", "FP4.IDX,FP4.PACK", "--quiet"],
                         capture_output=True, text=True, env=env, cwd=work)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "matches e8m0_rounding=float_log2_ceil" in cli.stdout and "VARIANT FP4.PACK.NIBBLE" in cli.stdout
    line = next(l for l in cli.stdout.splitlines() if "reproduce:" in l).split("reproduce: ", 1)[1]
    assert line == "dsv4spec verify --target fp4-port --rules FP4.IDX.SCALE --profile ci"
    again = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 1 and "FAIL FP4.IDX.SCALE on fp4-port" in again.stdout
    pytest_run = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--dsv4spec-target", "fp4-port",
                                 "--dsv4spec-rules", "FP4.IDX.SCALE,FP4.PACK"], capture_output=True, text=True,
                                env=env, cwd=work)
    assert pytest_run.returncode == 1, pytest_run.stdout + pytest_run.stderr
    assert "FAILED dsv4spec::FP4.IDX.SCALE[fp4-port]" in pytest_run.stdout
    assert "PASSED dsv4spec::FP4.PACK.NIBBLE[fp4-port]" in pytest_run.stdout
    assert line in pytest_run.stdout
