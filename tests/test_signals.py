"""Signals and processes on the command's routes (issue 42): a signal is never lost (not even when
Python handles it inside a gc callback, where an exception is discarded), a target hung in C or
holding the signal for itself cannot keep the command from ending, the command's child dies with
it, and a process a target forks or starts is named and ended, never left holding the command."""
import json
import os
import signal
import time

import pytest

from test_faults import REPORTS, _finished, _gone, _group_ended, _verify

SIGNAL_IN_THE_COLLECTOR = """
import gc, os, signal
from dsv4spec.impl import e2m1_encode as _encode
SENT = []
def _collecting(phase, info):       # as Hypothesis's gc callback: the signal is handled in here
    if phase == "start" and not SENT:
        SENT.append(os.getpid())
        os.kill(os.getpid(), signal.{name})
def e2m1_encode(x):
    if not SENT:
        gc.callbacks.append(_collecting)
        gc.collect()
    return _encode(x)
"""


@pytest.mark.parametrize("name, status", [("SIGTERM", 143), pytest.param("SIGINT", 130, marks=pytest.mark.thorough)])
def test_a_signal_handled_inside_a_gc_callback_still_interrupts_the_run(tmp_path, name, status):
    """The handler used to raise there (Python discards it) after ignoring every later signal: the
    run went on to exit 0 with its reports not marked interrupted."""
    (tmp_path / "collected.py").write_text(SIGNAL_IN_THE_COLLECTOR.format(name=name))
    run = _verify(tmp_path, "--target", "collected", "--rules", "FMT.E2M1", *REPORTS)
    out, err = _finished(run, 300)
    assert run.returncode == status, out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] and report["header"]["interrupted_by"] == ("SIGTERM" if name == "SIGTERM" else "Ctrl-C")
    assert report["not_run"], report["not_run"]
    assert '<property name="interrupted" value="true" />' in (tmp_path / "r.xml").read_text()
    assert _group_ended(run.pid) == []


HUNG = {
    # in C with the signals blocked: no handler of Python's ever runs (as a C loop that never returns)
    "in C": "import ctypes, os, signal\n"
            "def e2m1_encode(x):\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGALRM})\n"
            "    open('entered', 'w').write(str(os.getpid()))\n"
            "    ctypes.CDLL(None).pause()\n",
    # a Python loop whose own SIGTERM handler takes the suite's signal
    "own handler": "import os, signal\n"
                   "def e2m1_encode(x):\n"
                   "    signal.signal(signal.SIGTERM, lambda *_: None)\n"
                   "    open('entered', 'w').write(str(os.getpid()))\n"
                   "    while True:\n"
                   "        pass\n",
}


def _entered(tmp_path, run) -> int:
    """The pid of the process running the hung operation, once it is in it (a generous bound)."""
    marker, deadline = tmp_path / "entered", time.monotonic() + 300
    while not (marker.exists() and marker.read_text()) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists() and marker.read_text(), f"the operation was never entered (status {run.poll()})"
    return int(marker.read_text())


@pytest.mark.parametrize("how", ["in C", pytest.param("own handler", marks=pytest.mark.thorough)])
def test_sigterm_ends_a_run_whose_target_never_returns_to_python(tmp_path, how):
    """Without --isolate the signal was forwarded and waited on forever; now the child's group is
    killed a few seconds on, and the parent writes the reports of what finished, interrupted."""
    (tmp_path / "hung.py").write_text(HUNG[how])
    run = _verify(tmp_path, "--target", "hung", "--rules", "FMT.E2M1.RNE,FMT.E2M1.SATURATE", "--timeout", "600",
                  *REPORTS)
    child = _entered(tmp_path, run)
    try:
        run.send_signal(signal.SIGTERM)
        out, err = _finished(run, 120)
        assert run.returncode == 143, out + err
        assert "did not stop within 5 s of the signal and was killed" in err, err
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["interrupted"] and report["header"]["interrupted_by"] == "SIGTERM"
        assert {r["rule"] for r in report["not_run"]} == {"FMT.E2M1.RNE", "FMT.E2M1.SATURATE"}
        assert "**INTERRUPTED (SIGTERM)" in (tmp_path / "r.md").read_text()
        assert _gone([child])
    finally:
        _kill(child)
    assert _group_ended(run.pid) == []


def test_the_commands_child_dies_with_the_command_even_hung_in_c(tmp_path):
    """SIGKILL of `dsv4spec verify` used to leave its child running the target with PPID 1."""
    (tmp_path / "hung.py").write_text(HUNG["in C"])
    run = _verify(tmp_path, "--target", "hung", "--rules", "FMT.E2M1.RNE", "--timeout", "600")
    child = _entered(tmp_path, run)
    try:
        run.kill()
        _finished(run, 120)
        assert _gone([child]), "the command's child outlived it"
    finally:
        _kill(child)
    assert _group_ended(run.pid) == []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


HELPER = {      # started once (the first call to create the file), left sleeping
    "fork": "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        time.sleep(3600)\n"
            "        os._exit(0)\n",
    "Popen": "    pid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']).pid\n",
}


def _helper_target(how: str) -> str:
    return ("import os, subprocess, sys, time\nfrom dsv4spec.impl import e2m1_encode as _encode\n"
            "def _helper():\n" + HELPER[how] + "    return pid\n"
            "def e2m1_encode(x):\n"
            "    try:\n"
            "        fd = os.open('helper', os.O_CREAT | os.O_EXCL | os.O_WRONLY)\n"
            "    except FileExistsError:\n"
            "        return _encode(x)\n"
            "    os.write(fd, str(_helper()).encode())\n"
            "    os.close(fd)\n"
            "    return _encode(x)\n")


@pytest.mark.parametrize("how, route", [
    ("fork", []), ("Popen", ["--isolate"]),
    pytest.param("Popen", [], marks=pytest.mark.thorough), pytest.param("fork", ["--jobs", "2"], marks=pytest.mark.thorough)])
def test_a_process_the_target_leaves_running_is_named_and_ended(tmp_path, how, route):
    """A forked helper held the guard's pipe, so `verify` never exited after its reports; under
    --isolate, or started with Popen, it was orphaned unreported and the exit status was 0."""
    (tmp_path / "helps.py").write_text(_helper_target(how))
    run = _verify(tmp_path, "--target", "helps", "--rules", "FMT.E2M1.ZERO_SIGN,FMT.E2M1.RNE", "--json", "r.json",
                  *route)
    try:
        out, err = _finished(run, 300)
        helper = int((tmp_path / "helper").read_text())
        assert run.returncode == 1, out + err
        assert "the target left 1 process(es) running" in err and f"pid {helper}: " in err, err
        assert [r["status"] for r in json.loads((tmp_path / "r.json").read_text())["results"]] == ["PASS", "PASS"]
        assert _gone([helper]), "the helper outlived the run"
    finally:
        if (tmp_path / "helper").exists():
            _kill(int((tmp_path / "helper").read_text()))
    assert _group_ended(run.pid) == []


@pytest.mark.parametrize("lost", ["closed", pytest.param("no reader", marks=pytest.mark.thorough)])
def test_a_lost_standard_output_keeps_the_reports_and_says_so(tmp_path, lost):
    """Standard output closed (`>&-`) used to end verify with a traceback and no report; one whose
    reader has gone (`| true`), with exit status 0 and no report."""
    import subprocess
    import sys
    from test_faults import ENV
    command = [sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "impl", "--rules",
               "FMT.E2M1.ZERO_SIGN", "--json", "r.json", "--markdown", "r.md"]
    if lost == "closed":
        run = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, preexec_fn=lambda: os.close(1))
    else:
        run = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        run.stdout.close()
    err = run.stderr.read()
    assert run.wait(300) == 4, err
    assert "standard output is closed or has no reader: the matrix and the verdict line were not written" in err
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["status"] == "PASS"
    assert "| `FMT.E2M1.ZERO_SIGN` |" in (tmp_path / "r.md").read_text()
    assert _group_ended(run.pid) == []
