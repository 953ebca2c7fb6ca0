"""A port that attacks the suite through its replies (tests/hostile_port.py): every attack is an
ERROR naming what the port did, on the rule whose call it answered, in bounded time and memory, and
nothing the port started survives it (issue 42)."""
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dsv4spec.properties.exec_target import ProtocolError
from dsv4spec.properties.target import load_target

HOSTILE = "exec:" + shlex.join([sys.executable, str(Path(__file__).with_name("hostile_port.py"))])
CODES = torch.arange(16, dtype=torch.uint8)


@pytest.fixture
def hostile(monkeypatch, tmp_path):
    """The hostile port's target, its attack chosen; closed after the test."""
    loaded = []

    def load(attack):
        monkeypatch.setenv("HOSTILE", attack)
        monkeypatch.setenv("HOSTILE_PIDS", str(tmp_path / "pids"))
        loaded.append(load_target(HOSTILE))
        loaded[-1].timeout = 60
        return loaded[-1]
    yield load
    for target in loaded:
        target.provider.close()


def test_a_reply_of_a_hundred_million_strings_is_refused_by_count_at_once(hostile):
    target = hostile("many_strings")
    start, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ProtocolError, match=f"100000000 more value records are beyond the {2 ** 16}"):
        target.e2m1_decode(CODES)
    assert time.monotonic() - start < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000     # KiB: no gigabytes read


def test_records_are_counted_across_nested_lists_each_within_bounds(hostile):
    with pytest.raises(ProtocolError, match=f"beyond the {2 ** 16} a reply to e2m1_decode may hold"):
        hostile("nested_strings").e2m1_decode(CODES)


@pytest.mark.parametrize("attack, says", [
    ("int_overflow", "e2m1_decode result: int value=99999999999999999999 is beyond a 64-bit signed integer"),
    ("shape_overflow", "e2m1_decode result: a dimension of shape=99999999999999999999 is beyond a 64-bit signed"),
    ("missized", "e2m1_decode result holds 3 elements (shape [3]); this request's inputs make it [16], 16 elements"),
])
def test_a_header_past_int64_or_a_missized_reply_is_one_clear_protocol_error(hostile, attack, says):
    with pytest.raises(ProtocolError) as e:
        hostile(attack).e2m1_decode(CODES)
    assert says in str(e.value), str(e.value)


def test_a_missized_reply_is_an_error_row_not_a_numpy_broadcast_error(hostile):
    from dsv4spec.properties.suite import ERROR, run_rule
    row = run_rule("FMT.E2M1.VALUES", hostile("missized"))
    assert row.status == ERROR and "a reply to another request, or a wrong size" in row.detail, row.detail
    assert "broadcast" not in row.detail


def test_an_ansi_message_from_a_port_is_shown_not_obeyed(hostile):
    from dsv4spec.properties.suite import ERROR, run_rule
    row = run_rule("FMT.E2M1.VALUES", hostile("ansi_message"))
    assert row.status == ERROR and "bad \\x1b[2J\\x1b]0;owned\\x07\\x00 end" in row.detail, row.detail
    assert not any(c in row.detail for c in "\x1b\x00\x07")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_grandchild_in_a_session_of_its_own_is_ended_with_the_port_and_named(tmp_path):
    """The port's process group is not enough: a descendant that called setsid left it.  It carries
    the port's marker in its environment; closing the port ends it and names it."""
    code = (f"import torch\nfrom dsv4spec.properties.target import load_target\n"
            f"t = load_target({HOSTILE!r})\nt.e2m1_decode(torch.arange(16, dtype=torch.uint8))\nt.provider.close()\n")
    pids = tmp_path / "pids"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOSTILE": "setsid_child", "HOSTILE_PIDS": str(pids)})
    port, grandchild = map(int, pids.read_text().split())
    survived = _alive(grandchild)
    if survived:
        os.kill(grandchild, 9)
    assert run.returncode == 0 and not survived, run.stderr
    assert f"left process {grandchild} (" in run.stderr and "outside its process group; it was killed" in run.stderr
