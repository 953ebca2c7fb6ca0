"""Faults a target or its environment may bring, none of which may turn a verdict false (issue 34):
a target that ends the process, reuses its result buffers, writes into its inputs, leaves a thread
running, or a port that lies about sizes, prints control characters, or hangs with children."""
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dsv4spec.impl import quant as impl_quant
from dsv4spec.properties.suite import ERROR, FAIL, PASS, RUN, run_rule
from dsv4spec.properties.target import Target


@pytest.fixture
def few_examples():
    saved, RUN.max_examples = RUN.max_examples, 5
    yield
    RUN.max_examples = saved


def _static_buffers(quantize):
    """quantize, taking a NaN or an infinity as 0, returning its results in the same two tensors on
    every call (a CUDA graph's static outputs), and wrong: zero codes for an input with a NaN or an
    infinity, whose finite blocks must keep theirs."""
    buffers = []

    def static(x, *args, **kwargs):
        codes, scales = quantize(torch.where(torch.isfinite(x), x, 0), *args, **kwargs)
        if not bool(torch.isfinite(x).all()):
            codes = torch.zeros_like(codes)         # wrong: the finite blocks lose their codes
        if not buffers:
            buffers.extend([codes.clone(), scales.clone()])
        buffers[0].copy_(codes)
        buffers[1].copy_(scales)
        return buffers[0], buffers[1]
    return static


def test_a_target_reusing_its_result_buffers_is_judged_on_each_result(few_examples):
    target = Target(SimpleNamespace(NAME="graphed", fp4_e4m3_quantize=_static_buffers(impl_quant.fp4_e4m3_quantize)),
                    "graphed")
    row = run_rule("FP4.NONFINITE", target)
    assert row.status == FAIL, f"{row.status}: {row.detail}"


def _in_place(encode):
    def e2m1_encode(x):
        codes = encode(x)
        x.zero_()
        return codes
    return e2m1_encode


def test_a_target_writing_into_its_input_is_an_error_naming_the_argument(few_examples):
    from dsv4spec.impl import e2m1_encode
    row = run_rule("FMT.E2M1.RNE", Target(SimpleNamespace(NAME="scribbler", e2m1_encode=_in_place(e2m1_encode)), "s"))
    assert row.status == ERROR and "e2m1_encode modified its input 'x' in place" in row.detail, row.detail


def test_an_untouched_nan_input_is_not_taken_for_a_modified_one(few_examples):
    """Bitwise: a NaN compares unequal to itself, never to its own copy's bits."""
    def zeroing_nonfinite(x):
        return impl_quant.fp4_e4m3_quantize(torch.where(torch.isfinite(x), x, 0))
    row = run_rule("FP4.NONFINITE", Target(SimpleNamespace(NAME="z", fp4_e4m3_quantize=zeroing_nonfinite), "z"))
    assert row.status in (PASS, "VARIANT"), f"{row.status}: {row.detail}"


def test_a_check_gives_hypothesis_back_its_mining_of_local_literals(few_examples):
    """The suite turns off Hypothesis's mining of local modules' literals while its own checks run
    and nowhere else: before, importing the suite turned it off for the whole process."""
    from hypothesis.internal.conjecture import providers
    from dsv4spec.impl import e2m1_encode
    run_rule("FMT.E2M1.ZERO_SIGN", Target(SimpleNamespace(NAME="impl", e2m1_encode=e2m1_encode), "impl"))
    assert providers._get_local_constants.__module__ == providers.__name__, "the suite left Hypothesis patched"


USER_LIBRARY = "MAGIC = 918273645\n"      # a literal of a local module (not a test file)
USER_TEST = '''
from hypothesis.internal.conjecture import providers

from mylib import MAGIC


def test_hypothesis_still_mines_the_users_literals():
    assert MAGIC in providers._get_local_constants().integers
'''
SUITE_FIRST = '''
import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith("dsv4spec::"))     # the suite's items run first
'''


@pytest.mark.thorough
def test_the_plugin_leaves_a_users_hypothesis_tests_as_they_are(tmp_path):
    """Beside the suite's items, a user's test sees Hypothesis as it would alone: drawing from the
    literals of the user's own modules is how Hypothesis finds many bugs."""
    (tmp_path / "mylib.py").write_text(USER_LIBRARY)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    (tmp_path / "conftest.py").write_text(SUITE_FIRST)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--dsv4spec-target", "impl",
                           "--dsv4spec-rules", "FMT.E2M1.ZERO_SIGN"], cwd=tmp_path, capture_output=True, text=True)
    assert "2 passed" in done.stdout, done.stdout[-3000:]


def test_records_and_tensors_of_correct_results_pass_the_call_boundary_unchanged(few_examples):
    """The copy at the call boundary keeps a result's type: a named tuple (layer_role's Role) too."""
    import dsv4spec.impl as impl
    assert run_rule("LAYER.V4", Target(impl, "impl")).status == PASS


# ------------------------------------------------------------------------------------------------
# The command: a target that ends the process, leaves a thread, or a run ended by SIGTERM
# ------------------------------------------------------------------------------------------------

HOME = str(Path(__file__).resolve().parents[1])
ENV = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "OMP_NUM_THREADS": "1"}
HOSTILE = "exec:" + shlex.join([sys.executable, str(Path(__file__).with_name("hostile_port.py"))])
REPORTS = ("--json", "r.json", "--junit", "r.xml", "--markdown", "r.md")


def _verify(tmp_path, *args, env=None, **popen):
    return subprocess.Popen([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--max-examples", "1", *args],
                            cwd=tmp_path, env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


def _finished(run, timeout=900):
    """run.communicate(), its session killed if it outlives `timeout` (a hang is the failure
    these tests look for; the bound is far above what a run takes on a loaded machine, seconds)."""
    try:
        return run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in _group(run.pid):         # its session: the guard's child leads a group of its own
            os.kill(pid, signal.SIGKILL)
        raise


def _state(pid: int) -> str | None:
    """A process's state letter from /proc (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _group(sid: int) -> list[int]:
    """The live processes of session `sid` (the one a test started its verify in: its process
    groups, the guard's child's included)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(entry))
    return members


def _group_ended(sid: int, within_s=30.0) -> list[int]:
    """The processes of session `sid` still alive after up to `within_s` seconds (polled)."""
    deadline = time.monotonic() + within_s
    while _group(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{pid}: {open(f'/proc/{pid}/cmdline').read()}" for pid in _group(sid)]


def _gone(pids, within_s=30.0) -> bool:
    """Whether every pid has ended (polled: a killed process is reaped a moment later)."""
    deadline = time.monotonic() + within_s
    while any(_state(p) not in (None, "Z") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(_state(p) in (None, "Z") for p in pids)


ENDS_THE_PROCESS = {
    "os._exit": "import os\ndef end():\n    os._exit(0)\n",
    "C exit": "import ctypes\ndef end():\n    ctypes.CDLL(None).exit(0)\n",
    "sys.exit": "import sys\ndef end():\n    sys.exit(0)\n",
}


@pytest.mark.parametrize("how", [pytest.param(h, marks=[pytest.mark.thorough] if h != "os._exit" else [])
                                 for h in ENDS_THE_PROCESS])
def test_a_target_that_ends_the_process_is_an_error_in_every_report(tmp_path, how):
    (tmp_path / "ender.py").write_text(ENDS_THE_PROCESS[how] + "def e2m1_encode(x):\n    end()\n")
    run = _verify(tmp_path, "--target", "ender", "--rules", "FMT.E2M1.RNE,FMT.E2M1.SATURATE", *REPORTS)
    out, err = _finished(run)
    assert run.returncode == 1, out + err
    said = "SystemExit: 0" if how == "sys.exit" else "the target ended the process (exit status 0) during e2m1_encode"
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["status"] for r in report["results"]] == ["ERROR", "ERROR"]
    assert said in report["results"][0]["detail"]
    for name in ("r.xml", "r.md"):
        assert said in (tmp_path / name).read_text()
    assert said in out and "exit 1" in out.splitlines()[-1]
    assert _group_ended(run.pid) == []


@pytest.mark.parametrize("isolate", [[], ["--isolate"]], ids=["in-process", "isolate"])
def test_a_thread_the_target_leaves_running_does_not_keep_verify_from_ending(tmp_path, isolate):
    """Named on standard error, exit status 1, whether the target ran in the command's process or
    in a worker (where a killed worker used to hide it)."""
    (tmp_path / "spinner.py").write_text(
        "import threading, time\nfrom dsv4spec.impl import e2m1_encode as _e\n"
        "LEFT = threading.Thread(target=time.sleep, args=(3600,), name='left-behind')\n"
        "def e2m1_encode(x):\n"
        "    LEFT.is_alive() or LEFT.start()\n"
        "    return _e(x)\n")
    run = _verify(tmp_path, "--target", "spinner", "--rules", "FMT.E2M1.ZERO_SIGN", "--json", "r.json", *isolate)
    out, err = _finished(run)
    assert run.returncode == 1 and "the target left 1 non-daemon thread(s) running (left-behind)" in err, err
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["status"] == PASS
    assert _group_ended(run.pid) == []


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=pytest.mark.thorough)])
def test_sigterm_writes_every_report_marked_interrupted_and_ends_a_hung_port_and_its_children(tmp_path, isolate):
    pids = tmp_path / "pids"
    run = _verify(tmp_path, "--target", HOSTILE, "--rules", "FMT.E2M1.VALUES", *REPORTS, *["--isolate"] * isolate,
                  env={"HOSTILE": "hang_with_child", "HOSTILE_PIDS": str(pids)})
    deadline = time.monotonic() + 120           # the signal lands while the port hangs, however loaded the machine
    while not (pids.exists() and pids.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    port, grandchild = map(int, pids.read_text().split())
    run.send_signal(signal.SIGTERM)
    out, err = _finished(run, 60)
    assert run.returncode == 143, out + err
    assert "INTERRUPTED (SIGTERM): 0 of 1 results finished; not run:" in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] and report["header"]["interrupted_by"] == "SIGTERM"
    assert report["not_run"] == [{"rule": "FMT.E2M1.VALUES", "target": "hostile"}]
    assert '<property name="interrupted" value="true" />' in (tmp_path / "r.xml").read_text()
    assert "**INTERRUPTED (SIGTERM)" in (tmp_path / "r.md").read_text()
    assert _gone([port, grandchild]), "the port or its child outlived the run"
    assert _group_ended(run.pid) == []


# ------------------------------------------------------------------------------------------------
# Ports: sizes they declare, what they print
# ------------------------------------------------------------------------------------------------

def test_a_port_declaring_a_terabyte_is_an_error_naming_the_limit(tmp_path):
    """Run under a 4 GB address-space limit: the declared size is refused before any byte is read."""
    command = shlex.join([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", HOSTILE,
                          "--rules", "FMT.E2M1.VALUES", "--timeout", "30", "--json", "r.json"])
    done = subprocess.run(["bash", "-c", f"ulimit -v 4000000 && exec {command}"], cwd=tmp_path,
                          env={**ENV, "HOSTILE": "huge"}, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    detail = json.loads((tmp_path / "r.json").read_text())["results"][0]["detail"]
    assert "nbytes=1099511627776 is beyond the 128 bytes a reply to e2m1_decode may hold" in detail, detail


class _EndlessLine:
    """A standard error that never writes a line feed: 1 MiB chunks, 64 of them."""

    def __init__(self):
        self.left = 64

    def read1(self, n):
        assert 0 < n <= 1 << 16, f"read1({n}): an unbounded read"
        self.left -= 1
        return b"x" * n if self.left > 0 else b""

    def readline(self, size=-1):
        raise AssertionError("readline buffers a line without a line feed whole")

    def close(self):
        pass


def test_a_ports_standard_error_is_kept_as_a_bounded_tail():
    from collections import deque
    from dsv4spec.properties.exec_target import STDERR_TAIL, _drain
    tail = deque(maxlen=4)
    _drain(_EndlessLine(), tail)
    assert 0 < sum(map(len, tail)) <= 4 * STDERR_TAIL


def test_control_characters_and_fences_a_port_prints_leave_the_reports_well_formed(tmp_path):
    import xml.etree.ElementTree as ET
    run = _verify(tmp_path, "--target", HOSTILE, "--rules", "FMT.E2M1.VALUES", "--junit", "r.xml", "--markdown", "r.md",
                  env={"HOSTILE": "ansi"})
    out, err = _finished(run)
    assert run.returncode == 1 and "red alert" in out, out + err
    error = ET.parse(tmp_path / "r.xml").getroot().find("testsuite/testcase/error")
    assert "\\x1b[31mred alert\\x1b[0m \\x00 nul" in error.text, error.text
    markdown = (tmp_path / "r.md").read_text()
    block = markdown.split("````\n", 2)
    assert len(block) == 3 and "red alert" in block[1] and "``` fence" in block[1], markdown


# ------------------------------------------------------------------------------------------------
# Reports that cannot be written, and command-line conventions
# ------------------------------------------------------------------------------------------------

def test_a_lost_report_keeps_the_verdict_and_the_other_reports(tmp_path):
    """/dev/full fails the write (disk full); a FIFO no one reads is refused at once, never waited
    on nor replaced.  Exit status 4: a report was lost."""
    os.mkfifo(tmp_path / "fifo")
    run = _verify(tmp_path, "--target", "impl", "--rules", "FMT.E2M1.ZERO_SIGN", "--json", "fifo",
                  "--junit", "/dev/full", "--markdown", "r.md")
    out, err = _finished(run)
    assert run.returncode == 4, out + err
    assert out.strip().splitlines()[-1].startswith("conformance claimed by impl: no FAIL, ERROR or TIMEOUT"), out
    assert "cannot write report fifo: a FIFO with no reader" in err
    assert "cannot write report /dev/full: No space left on device" in err
    assert "| `FMT.E2M1.ZERO_SIGN` |" in (tmp_path / "r.md").read_text()
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "0", "1e10", "86400.5"])
def test_a_timeout_that_is_not_a_positive_finite_number_up_to_a_day_is_a_usage_error(seconds, capsys):
    """1e10 s used to turn every call into an ERROR (the timer's time_t overflowed)."""
    from dsv4spec.cli import main
    assert main(["verify", "--target", "impl", "--rules", "FMT.E2M1.ZERO_SIGN", f"--timeout={seconds}"]) == 2
    assert "--timeout must be a positive, finite number of seconds, at most 86400 (a day)" in capsys.readouterr().err


def test_a_report_to_standard_output_moves_the_matrix_to_standard_error(tmp_path):
    run = _verify(tmp_path, "--target", "impl", "--rules", "FMT.E2M1.ZERO_SIGN", "--json", "-")
    out, err = _finished(run)
    assert run.returncode == 0, out + err
    assert json.loads(out)["results"][0]["status"] == PASS
    assert "FMT.E2M1.ZERO_SIGN  PASS" in err and "conformance claimed by impl" in err


def test_two_reports_to_standard_output_are_a_usage_error(capsys):
    from dsv4spec.cli import main
    assert main(["verify", "--target", "impl", "--rules", "FMT.E2M1.ZERO_SIGN", "--json", "-", "--junit", "-"]) == 2
    assert "only one of --json, --junit and --markdown" in capsys.readouterr().err


class _Terminal:
    def isatty(self):
        return True


def test_no_color_turns_the_matrix_colours_off(monkeypatch):
    from dsv4spec.cli import colored
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colored(_Terminal())
    monkeypatch.setenv("NO_COLOR", "")          # set but empty: colours stay (no-color.org)
    assert colored(_Terminal())


def test_version(capsys):
    import dsv4spec
    from dsv4spec.cli import main
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"dsv4spec {dsv4spec.__version__}"


def test_a_port_that_exits_leaving_a_child_on_its_pipes_takes_the_child_along(tmp_path, monkeypatch):
    from dsv4spec.properties.exec_target import ProtocolError
    from dsv4spec.properties.target import load_target
    pids = tmp_path / "pids"
    monkeypatch.setenv("HOSTILE", "exit_with_child")
    monkeypatch.setenv("HOSTILE_PIDS", str(pids))
    target = load_target(HOSTILE)
    target.timeout = 60
    with pytest.raises(ProtocolError, match="exited with status 3"):
        target.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    port, grandchild = map(int, pids.read_text().split())
    assert _gone([port, grandchild]), "the port's child outlived it"
    target.provider.close()


def test_a_strided_input_is_compared_not_refused():
    """The in-place check compares bits: a column of a wider tensor (the compressor's decode token
    at dim 1, drawn at dev seed 3) must be compared as well as a contiguous one."""
    import torch
    from dsv4spec.properties.contract import _same_bits
    wide = torch.arange(16, dtype=torch.float32).reshape(2, 1, 8)
    column = wide[:, :, 3:4]
    assert column.reshape(-1).stride(-1) != 1
    assert _same_bits(column, column.clone())
    assert not _same_bits(column, column.clone() + 1)
