"""A process an exec port leaves running after it has ended (a grandchild in its process group, or
one in a session of its own) is named, ended, and makes the exit status at least 1, as a process a
Python target leaves does, on every route of the command (issue 42)."""
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOME = Path(__file__).resolve().parent.parent
ENV = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(HOME), "OMP_NUM_THREADS": "1"}
FAKE = "exec:" + shlex.join([sys.executable, str(HOME / "tests" / "exec_fake_port.py")])
ROUTES = {"command": (), "isolate": ("--isolate",), "jobs": ("--jobs", "2")}


def _verify(tmp_path, fault, route):
    return subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--max-examples", "1",
                           "--target", FAKE, "--rules", "FMT.E2M1.VALUES", "--json", "r.json", *ROUTES[route]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**ENV, "FAKE_FAULT": fault, "FAKE_PIDS": str(tmp_path / "pids")})


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fault", ["leaves_child", "leaves_session"])
def test_a_process_a_port_leaves_is_named_ended_and_fails_the_run(tmp_path, fault, route):
    run = _verify(tmp_path, fault, route)
    (pid,) = map(int, (tmp_path / "pids").read_text().split())
    ended = _gone(pid)
    if not ended:
        os.kill(pid, 9)
    report = json.loads((tmp_path / "r.json").read_text())
    assert ended, "the port's process outlived the run"
    assert [r["status"] for r in report["results"]] == ["PASS"], report["results"]
    assert run.returncode == 1, run.stdout + run.stderr
    said = "the target left 1 process(es) running in "
    assert said in run.stderr and f"pid {pid}: " in run.stderr, run.stderr
    assert any(said in f and f"pid {pid}: " in f for f in report["header"]["findings"]), report["header"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_port_that_ends_what_it_starts_passes(tmp_path, route):
    run = _verify(tmp_path, "", route)
    assert run.returncode == 0 and "left" not in run.stderr, run.stdout + run.stderr
