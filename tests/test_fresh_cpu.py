"""What a user runs on a fresh machine: the installed `dsv4spec` command, in an environment with
nothing of ours in it (no TRITON_INTERPRET, no PYTHONPATH), outside the checkout.  Without a GPU the
kernels run in Triton's interpreter, which the command must choose before anything imports Triton."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4spec.cli import main

COMMAND = Path(sys.executable).with_name("dsv4spec")     # the entry point installed beside this Python


def scrubbed(home: Path) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "OMP_NUM_THREADS": "1"}


def dsv4spec(tmp_path, *args) -> subprocess.CompletedProcess:
    assert COMMAND.is_file(), f"expected the installed dsv4spec command at {COMMAND} (pip install -e .)"
    return subprocess.run([str(COMMAND), *args], capture_output=True, text=True, cwd=tmp_path,
                          env=scrubbed(tmp_path))


def passes(done: subprocess.CompletedProcess, rules: int) -> bool:
    lines = done.stdout.strip().splitlines()
    return (done.returncode == 0 and f"kernels: {rules} PASS" in lines
            and lines[-1] == "conformance claimed by kernels: no FAIL, ERROR or TIMEOUT")


def test_the_installed_command_verifies_the_kernels_with_nothing_set(tmp_path):
    pytest.importorskip("triton")
    done = dsv4spec(tmp_path, "verify", "--target", "kernels", "--rules", "FP4.KV.SCALE", "--max-examples", "3",
                    "--quiet")
    assert passes(done, 1), done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.thorough
@pytest.mark.parametrize("spread", [["--isolate"], ["--jobs", "2"]], ids=["isolate", "jobs"])
def test_the_kernels_in_worker_processes_with_nothing_set(tmp_path, spread):
    pytest.importorskip("triton")
    done = dsv4spec(tmp_path, "verify", "--target", "kernels", "--rules", "FP4.KV.SCALE,FP4.KV.SATURATE",
                    "--max-examples", "3", "--quiet", *spread)
    assert passes(done, 2), done.stdout[-3000:] + done.stderr[-2000:]


IMPORTS_TRITON_FIRST = """
import sys
import triton
from dsv4spec.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_triton_imported_for_a_gpu_on_a_cpu_machine_is_an_error_that_says_what_to_do(tmp_path):
    """A user's process that imported Triton before TRITON_INTERPRET was set: its library is decorated
    for a GPU, which interpreted kernels cannot call.  The kernels refuse to load, saying so."""
    pytest.importorskip("triton")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the kernels compiled, as the Triton imported expects")
    done = subprocess.run([sys.executable, "-c", IMPORTS_TRITON_FIRST, "verify", "--target", "kernels",
                           "--rules", "FP4.KV.SCALE", "--max-examples", "1", "--quiet"],
                          capture_output=True, text=True, cwd=tmp_path,     # the GPUs this process sees, no more
                          env={**scrubbed(tmp_path), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")})
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-2000:]
    assert "TritonModeMismatch: Triton was imported for a GPU" in done.stderr, done.stderr
    assert "Set TRITON_INTERPRET=1 in the environment before Python starts" in done.stderr, done.stderr


def test_triton_imported_for_the_interpreter_refuses_compiled_kernels(monkeypatch):
    pytest.importorskip("triton")
    from dsv4spec.triton_mode import TritonModeMismatch, require_triton_in_mode, triton_imported_for_interpreter
    import dsv4spec.kernels  # noqa: F401 -- Triton imported, in the mode this test process chose
    interpreting = triton_imported_for_interpreter()
    require_triton_in_mode(interpreting)
    with pytest.raises(TritonModeMismatch, match="Keep one TRITON_INTERPRET setting" if interpreting
                       else "Set TRITON_INTERPRET=1 in the environment"):
        require_triton_in_mode(not interpreting)


def test_an_exec_port_that_cannot_be_started_is_a_target_not_loaded(tmp_path):
    """Exit status 3, as README and PROTOCOL.md say."""
    missing = dsv4spec(tmp_path, "verify", "--target", "exec:/nonexistent/port", "--rules", "FMT.E2M1.RNE")
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert "target 'exec:/nonexistent/port': no file /nonexistent/port" in missing.stderr


@pytest.mark.parametrize("spec,status", [("exec:no-such-port-anywhere", 3), ("exec:'unclosed", 2), ("exec:", 2)])
def test_only_a_malformed_exec_spec_is_a_usage_error(capsys, spec, status):
    assert main(["verify", "--target", spec, "--rules", "FMT.E2M1.RNE"]) == status
    assert capsys.readouterr().err.startswith(f"dsv4spec verify: error: target {spec!r}: ")


# Every way torch has of asking for CUDA, wrapped to note the asking process.  torch.cuda.is_available
# initializes the CUDA driver (cudaGetDeviceCount) and poisons fork: the command's forked verify
# (dsv4spec/guard.py) then died at its first CUDA call on a GPU machine ("Cannot re-initialize CUDA in
# forked subprocess", H100, this suite's flashmla and deepgemm targets).  A CPU machine shows where the
# question is asked; the command's own process, which forks, must never ask it.
ASKS = """
import os, torch, torch.cuda
def noted(name, fn):
    def asked(*a, **k):
        with open(os.environ["DSV4SPEC_TEST_ASKED"], "a") as f:
            f.write(f"{os.getpid()} {name}\\n")
        return fn(*a, **k)
    return asked
torch.cuda.is_available = noted("is_available", torch.cuda.is_available)
torch.cuda.device_count = noted("device_count", torch.cuda.device_count)
torch.cuda.init = noted("init", torch.cuda.init)
torch.cuda._lazy_init = noted("_lazy_init", torch.cuda._lazy_init)
"""


def test_the_command_that_forks_never_asks_for_cuda_before_its_child_does(tmp_path):
    site, asked = tmp_path / "site", tmp_path / "asked.txt"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ASKS)
    env = {**scrubbed(tmp_path), "PYTHONPATH": str(site), "DSV4SPEC_TEST_ASKED": str(asked)}
    done = subprocess.Popen([str(COMMAND), "verify", "--target", "impl", "--rules", "FMT.E2M1.RNE", "--quiet"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = done.communicate()
    assert done.returncode == 0, out + err
    askers = [line.split() for line in asked.read_text().splitlines()] if asked.exists() else []
    assert askers, "the child decides the Triton mode, so someone asks (or the wrapping saw nothing)"
    assert [a for a in askers if int(a[0]) == done.pid] == [], f"the forking process asked: {askers}"
