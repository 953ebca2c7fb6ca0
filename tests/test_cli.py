"""The command line: help, errors without tracebacks, the exit status contract."""
import json
import subprocess
import sys

import pytest

from dsv4spec.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "dsv4spec", *args], capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})


def test_help_lists_every_command():
    out = run("--help").stdout
    for command in ("rules", "ops", "verify", "spec", "budget", "claims", "golden"):
        assert command in out


def test_rules_json_is_the_registry(capsys):
    from dsv4spec.spec import RULES
    assert main(["rules", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in records} == set(RULES)


@pytest.mark.parametrize("args, needle", [
    (["verify", "--target", "nosuchtarget"], "unknown target"),
    (["verify", "--target", "impl", "--rules", "NOPE"], "no rule matches prefix"),
    (["verify", "--target", "nosuch.module:x"], "cannot import target module"),
    (["verify", "--target", "impl", "--profile", "fast"], "unknown profile"),
    (["rules", "--rules", "XYZ"], "no rule matches prefix"),
])
def test_usage_errors_exit_2_without_traceback(args, needle):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_verify_exit_status_follows_claimed_conformance(tmp_path):
    """A mutant claiming conformance makes verify exit 1; the same mutant not claiming it exits 0."""
    module = tmp_path / "badtarget.py"
    module.write_text(
        "from dsv4spec.impl import *\n"
        "import torch\n"
        "CLAIMS_CONFORMANCE = True\n"
        "def e2m1_encode(x):\n"
        "    return torch.zeros(x.shape, dtype=torch.uint8)\n")
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "badtarget",
           "--rules", "FMT.E2M1", "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
           "--markdown", str(tmp_path / "r.md")]
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema_version"] == 1
    assert any(r["status"] == "FAIL" for r in report["results"])
    assert "<testsuites" in (tmp_path / "r.xml").read_text()
    assert "| rule |" in (tmp_path / "r.md").read_text()
    module.write_text(module.read_text().replace("CLAIMS_CONFORMANCE = True", "CLAIMS_CONFORMANCE = False"))
    relaxed = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr


def test_ops_lists_each_operation_with_the_rules_that_check_it(capsys):
    assert main(["ops", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    pool = {entry["op"]: entry["rules"] for entry in table["pool"]}
    assert "POOL.PIN_NEWEST" in pool["candidate_blocks"] and pool["reindex_topk"] == ["POOL.REINDEX"]
    assert main(["ops", "--family", "nope"]) == 2
