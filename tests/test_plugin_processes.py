"""The pytest route without --dsv4spec-isolate (properties/pytest_guard.py) checks what a target
leaves running as `dsv4spec verify` does: a helper process it forks or starts is named, ended, and
makes the session's exit status at least 1 (issue 42)."""
import os
import signal

import pytest

from test_plugin import _pytest
from test_signals import _helper_target


@pytest.mark.parametrize("how", ["fork", "Popen"])
def test_a_process_the_target_leaves_running_is_named_ended_and_fails_the_session(tmp_path, how):
    (tmp_path / "helps.py").write_text(_helper_target(how))
    try:
        code, out, err = _pytest(tmp_path, "--dsv4spec-target", "helps", "--dsv4spec-rules",
                                 "FMT.E2M1.ZERO_SIGN,FMT.E2M1.RNE", "--dsv4spec-max-examples", "1")
        helper = int((tmp_path / "helper").read_text())
        assert code == 1, out + err
        assert "2 passed" in out, out
        assert "dsv4spec: the targets left 1 process(es) running: " in out and f"pid {helper}: " in out, out
    finally:
        if (tmp_path / "helper").exists():
            try:
                os.kill(int((tmp_path / "helper").read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_target_that_starts_nothing_leaves_the_session_green(tmp_path):
    code, out, err = _pytest(tmp_path, "--dsv4spec-target", "impl", "--dsv4spec-rules", "FMT.E2M1.ZERO_SIGN")
    assert code == 0 and "1 passed" in out and "left" not in out, out + err


@pytest.mark.parametrize("isolate", [pytest.param([], id="in-process"), pytest.param(["--dsv4spec-isolate"], id="isolate")])
def test_a_process_an_exec_port_leaves_after_it_ends_fails_the_session(tmp_path, isolate):
    from test_port_survivors import FAKE, _gone
    code, out, err = _pytest(tmp_path, "--dsv4spec-target", FAKE, "--dsv4spec-rules", "FMT.E2M1.VALUES",
                             "--dsv4spec-max-examples", "1", *isolate,
                             env={"FAKE_FAULT": "leaves_child", "FAKE_PIDS": str(tmp_path / "pids")})
    (pid,) = map(int, (tmp_path / "pids").read_text().split())
    assert _gone(pid), "the port's process outlived the session"
    assert code == 1 and "1 passed" in out, out + err
    assert "process(es) from " in out and f"pid {pid}: " in out, out
