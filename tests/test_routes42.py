"""Issue 42's items on the routes where the issue found them: a signal handled inside Hypothesis's
gc callback on `verify --rules FMT --target exec:<the C example port>`, an exec port's reply of too
many records through `verify`, a version-withheld format named in a verify row, a target's own
SIGTERM handler, a standard output without a reader."""
import json
import resource
import signal
import subprocess
import sys

import pytest

from test_c_port import built  # noqa: F401 -- the fixture: the C example port, built by its Makefile
from test_faults import ENV, HOSTILE, REPORTS, _finished, _group_ended, _verify

# Imported by the command before its main: in the process running the rules (the guard's forked
# child), the first collection after Hypothesis has put its gc callback in place sends the signal to
# the command, as its user would, and waits inside the callback for the command to pass it on, so
# that the suite's handler runs there; then it writes whether either signal is left ignored.
SIGNAL_IN_HYPOTHESIS_GC = """
import gc, os, signal, time
COMMAND, SENT = os.getpid(), []

def _hypothesis_collects():
    return any(getattr(c, "__module__", "").startswith("hypothesis.") for c in gc.callbacks)

def _collecting(phase, info):
    if phase != "start" or SENT or os.getpid() == COMMAND or not _hypothesis_collects():
        return
    from dsv4spec.command import SIGNALLED
    SENT.append(COMMAND)
    try:
        os.kill(COMMAND, signal.{name})
        deadline = time.monotonic() + 30
        while not SIGNALLED.get("signal") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        ignored = [s.name for s in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(s) == signal.SIG_IGN]
        open("handled", "w").write(f"{{SIGNALLED.get('signal')}} ignored: {{ignored}}")

gc.callbacks.append(_collecting)
"""
COMMAND = ("import collector, runpy, sys; sys.argv[0] = 'dsv4spec'; "
           "runpy.run_module('dsv4spec', run_name='__main__')")

@pytest.mark.parametrize("name, status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_in_hypothesis_gc_callback_stops_verify_of_the_c_port(tmp_path, built, name, status):  # noqa: F811
    """The handler raised there (Python discards it) after ignoring both signals: the run went on to
    exit 0, its reports not marked interrupted (7 of 11 SIGTERM trials on this route)."""
    (tmp_path / "collector.py").write_text(SIGNAL_IN_HYPOTHESIS_GC.format(name=name))
    run = subprocess.Popen([sys.executable, "-c", COMMAND, "verify", "--quiet", "--max-examples", "1", "--rules",
                            "FMT", "--target", f"exec:{built}", *REPORTS], cwd=tmp_path, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = _finished(run, 300)
    assert (tmp_path / "handled").read_text() == f"{int(getattr(signal, name))} ignored: []", err
    assert run.returncode == status, out + err
    assert "did not stop within" not in err, err        # the run's own process acted on it, not the guard's kill
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"]
    assert report["header"]["interrupted_by"] == ("SIGTERM" if name == "SIGTERM" else "Ctrl-C")
    assert report["not_run"] and all(r["target"] == "c-port" for r in report["not_run"]), report["not_run"]
    assert '<property name="interrupted" value="true" />' in (tmp_path / "r.xml").read_text()
    assert _group_ended(run.pid) == []

DATA_LIMIT = 2 << 30        # bytes of private memory: the run fits in 1 GiB on the CPU; 10^8 strings took 5.4 GB

def _with_bounded_heap():
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))

def test_a_port_replying_with_too_many_records_is_an_error_row_of_verify_in_bounded_memory(tmp_path):
    """The reply was bounded in bytes only: 10^8 small strings were read to a MemoryError."""
    run = subprocess.Popen([sys.executable, "-m", "dsv4spec", "verify", "--max-examples", "1", "--rules",
                            "FMT.E2M1.VALUES", "--target", HOSTILE, "--json", "r.json", "--timeout", "30"],
                           cwd=tmp_path, env={**ENV, "HOSTILE": "many_strings"}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_with_bounded_heap)
    out, err = _finished(run, 300)
    assert run.returncode == 1, out + err
    (row,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["status"] == "ERROR", row
    assert f"100000000 more value records are beyond the {2 ** 16} a reply to e2m1_decode may hold" in row["detail"]
    assert "Traceback" not in out + err and "MemoryError" not in out + err + row["detail"], out + err
    assert _group_ended(run.pid) == []

CONTRACT1 = """
import dsv4spec.impl as lib
NAME, CONTRACT = "frozen-at-1", 1

def kv_qdq(x, fmt):
    if fmt not in ("fp4_e4m3", "fp8_e8m0_32"):
        raise ValueError(f"unknown fmt {fmt!r}")
    return lib.kv_qdq(x, fmt)
"""

def test_a_format_a_contract_version_withheld_is_named_in_the_verify_row(tmp_path, monkeypatch):
    """The row read "n/i: missing kv_qdq_fp4_e8m0", as if the adapter lacked an operation."""
    from dsv4spec.cli import main
    (tmp_path / "frozen_at_1.py").write_text(CONTRACT1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["verify", "--target", "frozen_at_1", "--rules", "PATH.K.CACHE", "--quiet", "--json", "r.json"]) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["status"] == "n/i", row
    assert row["detail"].endswith(": contract 1 withholds kv_qdq(x, 'fp4_e8m0') (the format came in contract 2)"), row
    assert "missing" not in row["detail"], row


OWN_HANDLER = """
import os, signal, time
from dsv4spec.impl import e2m1_encode as _encode
signal.signal(signal.SIGTERM, lambda *_: None)      # at import: the suite's handler is never called again

def e2m1_encode(x):
    if not os.path.exists("entered"):
        open("entered", "w").write(str(os.getpid()))
        time.sleep(1)
    return _encode(x)
"""


def test_a_targets_own_sigterm_handler_does_not_swallow_the_commands(tmp_path):
    """A run that ended within the guard's grace after the signal exited 0, its SIGTERM unsaid."""
    from test_signals import _entered
    (tmp_path / "own.py").write_text(OWN_HANDLER)
    run = _verify(tmp_path, "--target", "own", "--rules", "FMT.E2M1.RNE,FMT.E2M1.SATURATE", "--json", "r.json")
    _entered(tmp_path, run)
    run.send_signal(signal.SIGTERM)
    out, err = _finished(run, 300)
    assert run.returncode == 143, out + err
    assert "finished without acting on the SIGTERM the command received (a target's own handler took it" in err, err
    assert [r["status"] for r in json.loads((tmp_path / "r.json").read_text())["results"]] == ["PASS", "PASS"]
    assert _group_ended(run.pid) == []


def test_a_standard_output_without_a_reader_keeps_the_file_reports_in_process(tmp_path, monkeypatch, capsys):
    """The cheap sibling of test_signals' `| true` case (a command of its own, thorough): the same
    writing of the verdict, to a pipe whose reader has gone."""
    import contextlib
    import os
    from dsv4spec.cli import main
    read, write = os.pipe()
    os.close(read)
    monkeypatch.chdir(tmp_path)
    with os.fdopen(write, "w") as readerless, contextlib.redirect_stdout(readerless):
        status = main(["verify", "--target", "impl", "--rules", "FMT.E2M1.ZERO_SIGN", "--json", "r.json",
                       "--markdown", "r.md"])
    assert status == 4
    assert "standard output is closed or has no reader: the matrix and the verdict line were not written" in \
        capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["status"] == "PASS"
    assert "| `FMT.E2M1.ZERO_SIGN` |" in (tmp_path / "r.md").read_text()


def test_a_targets_own_sigterm_handler_does_not_swallow_pytests(tmp_path):
    """The pytest route without --dsv4spec-isolate: the session finished with status 0."""
    from test_signals import _entered
    (tmp_path / "own.py").write_text(OWN_HANDLER)
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--dsv4spec-target", "own",
                            "--dsv4spec-rules", "FMT.E2M1.RNE,FMT.E2M1.SATURATE", "--dsv4spec-max-examples", "1"],
                           cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    _entered(tmp_path, run)
    run.send_signal(signal.SIGTERM)
    out, err = _finished(run, 300)
    assert run.returncode == 143, out + err
    assert "2 passed" in out and "finished without acting on the SIGTERM pytest received" in out, out + err
    assert _group_ended(run.pid) == []
