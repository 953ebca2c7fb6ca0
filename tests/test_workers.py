"""Worker processes: `verify --isolate` contains a crash or a hang to the rule that was running;
`verify --jobs N` gives the report of a single-process run with the same seed."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsv4spec

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)

CRASHY = """
import ctypes, signal, time
from dsv4spec.impl import *
NAME = "crashy"
CLAIMS_CONFORMANCE = True
def e2m1_encode(x):
    ctypes.string_at(0)                                            # a segfault
def e4m3_encode(x):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})     # a hang no signal reaches, as in C code
    time.sleep(600)
"""

LOSSY = """
from dsv4spec.impl import *
from dsv4spec.impl import fp4_e8m0_quantize as _quantize
NAME = "lossy"
CLAIMS_CONFORMANCE = True
def fp4_e8m0_quantize(x):
    packed, scales = _quantize(x)
    return packed & 0x77, scales                                   # drops the signs
"""


def verify(tmp_path, *args):
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": HOME}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", *args], capture_output=True,
                            text=True, env=env, cwd=tmp_path)
    return result, time.monotonic() - start


def test_a_segfault_and_a_hang_cost_only_their_rules(tmp_path):
    (tmp_path / "crashy.py").write_text(CRASHY)
    result, seconds = verify(tmp_path, "--target", "crashy", "--target", "impl", "--rules", "FMT.E2M1,FMT.E4M3.RNE",
                             "--isolate", "--timeout", "2", "--json", "r.json", "--max-examples", "10")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {(r["target"], r["rule"]): r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    crashed = rows[("crashy", "FMT.E2M1.RNE")]
    assert crashed["status"] == "ERROR" and "died (signal SIGSEGV) in e2m1_encode" in crashed["detail"]
    hung = rows[("crashy", "FMT.E4M3.RNE")]
    assert hung["status"] == "TIMEOUT" and "e4m3_encode did not return within 2 s" in hung["detail"]
    assert "--timeout 2 --max-examples 10 --isolate" in hung["reproduce"]
    assert rows[("crashy", "FMT.E2M1.VALUES")]["status"] == "PASS"              # e2m1_decode is fine
    assert {r["status"] for (t, _), r in rows.items() if t == "impl"} == {"PASS"}
    assert seconds < 120


def test_jobs_2_reports_what_jobs_1_reports(tmp_path):
    (tmp_path / "lossy.py").write_text(LOSSY)
    # a randomized profile with its seed (30 examples a check: the workers must draw what one process draws)
    args = ["--target", "impl", "--target", "lossy", "--rules", "FP4.E2M1,FP4.IDX,FP4.PACK", "--profile", "dev",
            "--seed", "11", "--max-examples", "30"]
    one, _ = verify(tmp_path, *args, "--json", "one.json")
    two, _ = verify(tmp_path, *args, "--jobs", "2", "--json", "two.json")
    assert one.returncode == two.returncode == 1, one.stdout + two.stdout
    reports = [json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json")]
    for report in reports:
        for row in report["results"]:
            row.pop("seconds")
    for a, b in zip(*(r["results"] for r in reports)):
        assert a == b, f"{a['rule']} on {a['target']}:\n{a['detail']}\n--- with --jobs 2:\n{b['detail']}"
    assert any(r["status"] == "FAIL" for r in reports[0]["results"])
    assert reports[1]["header"]["workers"] == 2 and len(reports[1]["header"]["worker_devices"]) == 2
    assert one.stdout.split("\n", 1)[1] == two.stdout.split("\n", 1)[1]        # the same text but the header line


SUPERVISOR = """
import sys
from dsv4spec.runner import report, workers
devices, header = workers.devices_for(2), report.environment()
print('torch' in sys.modules, header['torch'], header['device'], devices)
"""


def test_the_supervisor_of_cpu_workers_never_imports_torch_and_names_its_version():
    """Where no GPU driver's device file exists, the command that only hands rules to workers
    (--isolate, --jobs) counts no GPU and reads torch's version without importing it (1-1.5 CPU s)."""
    import torch
    from dsv4spec.triton_mode import no_gpu_here
    if not no_gpu_here():
        pytest.skip("a GPU driver's device file is here: the supervisor asks torch")
    done = subprocess.run([sys.executable, "-c", SUPERVISOR], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME})
    assert done.stdout.split() == ["False", torch.__version__, "cpu", "[None,", "None]"], done.stdout + done.stderr


def test_a_gpu_drivers_device_file_sends_the_question_to_torch(monkeypatch):
    from dsv4spec import triton_mode
    for present in triton_mode.GPU_DEVICE_FILES:
        monkeypatch.setattr(triton_mode.os.path, "exists", lambda path: path == present)
        assert not triton_mode.no_gpu_here(), present
