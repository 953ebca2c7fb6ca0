"""The exec protocol itself (PROTOCOL.md): a port that speaks it is a target like any other, and
every way a port can break it is a clear ERROR (or TIMEOUT) naming what was expected, after which
the run goes on with a fresh port.  The port is tests/exec_fake_port.py, steered by FAKE_FAULT."""
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dsv4spec.properties.exec_target import PortError, ProtocolError, encode_value
from dsv4spec.properties.suite import ERROR, FAIL, NOT_IMPLEMENTED, PASS, TIMEOUT, VARIANT, run_rule
from dsv4spec.properties.target import NothingImplemented, OperationTimeout, TargetLoadError, TargetNotFound, load_target

HOME = Path(__file__).resolve().parent.parent
FAKE = Path(__file__).resolve().parent / "exec_fake_port.py"
SPEC = "exec:" + shlex.join([sys.executable, str(FAKE)])


@pytest.fixture
def port(monkeypatch):
    """A loaded fake port with FAKE_FAULT (and FAKE_OP) set as asked, a 2 s operation limit."""
    def load(fault="", op="", hello=""):
        monkeypatch.setenv("FAKE_FAULT", fault)
        monkeypatch.setenv("FAKE_OP", op)
        monkeypatch.setenv("FAKE_HELLO", hello)
        target = load_target(SPEC)
        target.timeout = 2.0
        return target
    return load


def test_a_port_that_keeps_the_protocol_is_a_target_with_its_handshake_metadata(port):
    t = port()
    assert (t.name, t.claims_conformance, t.version, t.spec) == ("fake port", True, "0.1", SPEC)
    assert t.has("e8m0_decode", "fp4_pack") and not t.has("e2m1_encode")
    assert run_rule("FMT.E8M0.VALUES", t).status == PASS
    assert run_rule("FMT.E2M1.VALUES", t).status == PASS
    assert run_rule("FMT.E2M1.RNE", t).status == NOT_IMPLEMENTED      # not in its ops=


def test_the_request_is_the_worked_example_of_protocol_md():
    records = encode_value(torch.tensor([0.75, -6.5]), "x")
    assert b"call op=e2m1_encode args=1 kwargs=0\n" + b"".join(records) == bytes.fromhex(
        "63 61 6c 6c 20 6f 70 3d 65 32 6d 31 5f 65 6e 63 6f 64 65 20 61 72 67 73 3d 31 20 6b 77 61 72 67"
        "73 3d 30 0a 74 65 6e 73 6f 72 20 64 74 79 70 65 3d 66 6c 6f 61 74 33 32 20 73 68 61 70 65 3d 32"
        "20 6e 62 79 74 65 73 3d 38 0a 00 00 40 3f 00 00 d0 c0")
    assert "tensor dtype=float32 shape=2 nbytes=8" in (HOME / "PROTOCOL.md").read_text()


def test_every_kind_of_argument_has_a_record_and_others_are_refused():
    def wire(value, key=None):
        return b"".join(encode_value(value, "arg", key))
    assert wire(64) == b"int value=64\n" and wire(np.int64(-3)) == b"int value=-3\n"
    assert wire(1.5) == b"float value=0x1.8000000000000p+0\n" and wire(True) == b"bool value=1\n"
    assert wire("v4.1 flash", key="model") == b"str value=v4.1%20flash key=model\n"
    assert wire(None) == b"none\n" and wire((1, "a")) == b"list n=2\nint value=1\nstr value=a\n"
    assert wire({"w": torch.zeros(2, dtype=torch.bfloat16)}) == \
        b"dict n=1\ntensor dtype=bfloat16 shape=2 nbytes=4 key=w\n\x00\x00\x00\x00"
    assert wire(torch.tensor(3, dtype=torch.int64)) == b"tensor dtype=int64 shape= nbytes=8\n" + bytes([3] + [0] * 7)
    with pytest.raises(ProtocolError, match="arg is a builtins.object, which protocol 1 cannot send"):
        wire(object())
    with pytest.raises(ProtocolError, match="dtype complex64, which protocol 1 cannot send"):
        wire(torch.zeros(1, dtype=torch.complex64))


# Each way of breaking the protocol: (fault, words the ERROR must say).  FAKE_OP confines the
# fault to e8m0_decode, so the next rule (e2m1_decode) shows that the run goes on.
BROKEN = [
    ("crash", "e8m0_decode: the port was killed by signal SIGSEGV before a reply line 'ok n=N' or 'error"),
    ("junk", "expected a reply line 'ok n=N' or 'error kind=K message=...' to e8m0_decode, got "
             "b'Segmentation fault? no: just a debug print'"),
    ("junk_first", "to e8m0_decode, got b'debug: computing e8m0_decode'"),
    ("short", "e8m0_decode: the port exited with status 3 after 1021 of the 1024 bytes of e8m0_decode result"),
    ("nbytes", "e8m0_decode result: nbytes=11024, but dtype float32 and shape [256] take 1024 bytes"),
    ("dtype", "e8m0_decode result: unknown dtype 'float8'; expected one of bool, uint8"),
    ("float64", "ContractError: e8m0_decode result has dtype float64; expected float32 or bfloat16"),
    ("huge_line", "expected a reply line 'ok n=N' or 'error kind=K message=...', got 70000 bytes without a line "
                  "feed"),
    ("port_error", "PortError: e8m0_decode: the port reported OutOfMemory: device memory exhausted (needed 12 MiB)"),
]


@pytest.mark.parametrize("fault,says", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_reply_is_an_error_naming_what_was_expected_and_the_run_goes_on(port, fault, says):
    t = port(fault, op="e8m0_decode")
    row = run_rule("FMT.E8M0.VALUES", t)
    assert row.status == ERROR and says in row.detail, row.detail
    assert row.reproduce.split(" verify ", 1)[1] == \
        f"--target {shlex.quote(SPEC)} --rules FMT.E8M0.VALUES --profile ci --timeout 2"
    assert run_rule("FMT.E2M1.VALUES", t).status == PASS          # a fresh port, when it was ended
    assert run_rule("FMT.E8M0.VALUES", t).status == ERROR         # and the fault again, the same way


def test_every_kind_of_result_comes_back(port):
    t = port("values", op="e8m0_decode")
    mapping, flag, values = t.provider.e8m0_decode(torch.zeros(1, dtype=torch.uint8))   # past the result contract
    assert mapping == {"a": -5, "b": 3.0, "c": ["x y", None]} and flag is True
    assert values.dtype == torch.bfloat16 and values.tolist() == [1.0, -2.0]


RELAYED = ("BUDGET.KV_BYTES", "PATH.HCA", "LAYOUT.REJECT", "LAYOUT.V41.MAIN", "CMP.RATIO1")


def test_what_the_other_families_pass_and_return_travels_too():
    """A str argument and a float result (BUDGET), keyword arguments model= and layer= (PATH.HCA), a
    str and ValueError replies (LAYOUT.REJECT, LAYOUT.V41.MAIN), a dict of tensors as an argument
    (CMP): relayed to impl through tests/exec_relay_port.py.  (A dict as the result, as PATH.LAYER's
    index_layer returns, is test_every_kind_of_result_comes_back's.)"""
    relay = load_target("exec:" + shlex.join([sys.executable, str(FAKE.parent / "exec_relay_port.py")]))
    assert {r: run_rule(r, relay).status for r in RELAYED} == {r: PASS for r in RELAYED}


def test_bytes_after_a_reply_are_an_error_of_the_call_that_wrote_them(port):
    """The offender is the rule whose call the port answered with bytes to spare, not the next."""
    t = port("trailing", op="e8m0_decode")
    row = run_rule("FMT.E8M0.VALUES", t)
    assert row.status == ERROR and "e8m0_decode: after its reply, the port wrote 10 more bytes: b'left over\\n' " \
        "(expected nothing between a reply and the next request)" in row.detail, row.detail
    assert run_rule("FMT.E2M1.VALUES", t).status == PASS


def test_a_silent_port_is_a_timeout_that_ends_it_and_the_run_goes_on(port):
    t = port("hang", op="e8m0_decode")
    start = time.monotonic()
    row = run_rule("FMT.E8M0.VALUES", t)
    assert row.status == TIMEOUT and "e8m0_decode" in row.detail and time.monotonic() - start < 10
    assert run_rule("FMT.E2M1.VALUES", t).status == PASS
    start = time.monotonic()
    assert run_rule("FMT.E8M0.VALUES", t).status == TIMEOUT and time.monotonic() - start < 1   # not called again


def test_a_port_that_reads_no_request_is_a_timeout_too(port):
    t = port("deaf")
    with pytest.raises(OperationTimeout, match="e8m0_decode: the port did not answer within 2 s \\(waiting to read "
                                               "its request; the port was ended\\)"):
        t.provider.e8m0_decode(torch.zeros(1 << 20, dtype=torch.uint8))     # more than a pipe holds


def test_standard_error_chatter_changes_nothing_and_is_shown_when_the_port_fails(port):
    assert run_rule("FMT.E8M0.VALUES", port("chatter")).status == PASS
    row = run_rule("FMT.E8M0.VALUES", port("chatter_crash", op="e8m0_decode"))
    assert row.status == ERROR and "e8m0_decode: the port exited with status 7 before a reply line" in row.detail
    assert "the port's standard error ends with:\nchatter: e8m0_decode called\n" in row.detail
    row = run_rule("FMT.E8M0.VALUES", port("junk", op="e8m0_decode"))
    assert row.status == ERROR and "standard error" not in row.detail       # it wrote none


def test_an_error_reply_raises_as_a_python_target_would(port):
    t = port("value_error", op="e8m0_decode")
    with pytest.raises(ValueError, match="rejected: NaN in block 3"):
        t.e8m0_decode(torch.zeros(2, dtype=torch.uint8))
    pid = t.provider.proc.pid
    assert t.e2m1_decode(torch.zeros(2, dtype=torch.uint8)).tolist() == [0.0, 0.0]
    assert t.provider.proc.pid == pid               # an error reply is an answer: the same port goes on
    t = port("not_implemented")
    row = run_rule("FMT.E8M0.VALUES", t)
    assert row.status == NOT_IMPLEMENTED and "only rows of 32" in row.detail
    with pytest.raises(PortError):
        port("port_error").e8m0_decode(torch.zeros(2, dtype=torch.uint8))


def test_variants_are_named_and_declared_through_the_handshake(port):
    row = run_rule("FP4.PACK.NIBBLE", port("swap_nibbles"))
    assert row.status == FAIL and row.detail.startswith("matches nibble_order=high_first (undeclared)")
    row = run_rule("FP4.PACK.NIBBLE", port("swap_nibbles", hello="variants=nibble_order:high_first"))
    assert row.status == VARIANT and "declared nibble_order=high_first" in row.detail


HANDSHAKES = [
    ("no_hello", "the handshake: the port exited with status 0 before the line 'hello protocol=1 ops=...'"),
    ("bad_hello", "expected the line 'hello protocol=1 ops=...', got b'hi there'"),
    ("protocol_2", "the port speaks protocol '2'; this suite speaks protocol 1"),
    ("unknown_op", "the port declares operations the contract does not know: fp4_frobnicate"),
    ("silent", "the handshake: the port did not answer within 1 s"),
]


@pytest.mark.parametrize("fault,says", HANDSHAKES, ids=[h[0] for h in HANDSHAKES])
def test_a_broken_handshake_is_a_load_error(monkeypatch, fault, says):
    monkeypatch.setenv("FAKE_FAULT", fault)
    monkeypatch.setenv("DSV4SPEC_EXEC_START_S", "1")
    with pytest.raises(TargetLoadError, match="^target 'exec:") as e:
        load_target(SPEC)
    assert says in str(e.value)
    with pytest.raises(TargetLoadError, match="unknown knob|unknown value|knob"):
        monkeypatch.setenv("FAKE_FAULT", "")
        monkeypatch.setenv("FAKE_HELLO", "variants=nibble_order:sideways")
        load_target(SPEC)


def test_a_missing_program_is_a_target_not_loaded_and_a_malformed_spec_not_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TargetLoadError, match=r"no file .*/no_such_port \(a path is relative to the working"):
        load_target("exec:./no_such_port")
    with pytest.raises(TargetLoadError, match="no program 'no-such-port-anywhere' on PATH"):
        load_target("exec:no-such-port-anywhere --flag")
    with pytest.raises(TargetNotFound, match="no command after 'exec:'"):
        load_target("exec:")


def _cli(*args, env_extra, cwd):
    import os
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "dsv4spec", *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_the_cli_isolates_a_crashing_port_and_its_reproduce_line_reproduces(tmp_path):
    faults = {"FAKE_FAULT": "crash", "FAKE_OP": "e8m0_decode"}
    run = _cli("verify", "--target", SPEC, "--rules", "FMT.E8M0,FMT.E2M1.VALUES", "--isolate", "--quiet",
               env_extra=faults, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "PASS" in next(l for l in run.stdout.splitlines() if l.startswith("FMT.E2M1.VALUES"))
    assert "killed by signal SIGSEGV" in run.stdout
    line = next(l for l in run.stdout.splitlines() if "reproduce:" in l).split("reproduce: ", 1)[1]
    assert f"--target {shlex.quote(SPEC)} --rules FMT.E8M0.VALUES" in line
    again = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=HOME,
                           env={**__import__("os").environ, **faults})
    assert again.returncode == 1 and "ERROR FMT.E8M0.VALUES on fake port" in again.stdout


def test_the_pytest_plugin_takes_an_exec_target(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--dsv4spec-target", SPEC,
                          "--dsv4spec-rules", "FMT.E8M0,FMT.E2M1.VALUES,FMT.E2M1.RNE"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED dsv4spec::FMT.E8M0.VALUES[fake port]" in run.stdout
    assert "SKIPPED" in run.stdout and "n/i" in run.stdout


@pytest.mark.parametrize("route", [(), ("--isolate",), ("--jobs", "2")], ids=["command", "isolate", "jobs"])
def test_a_port_declaring_no_operation_is_a_usage_error_on_every_route(tmp_path, monkeypatch, route):
    """ops= empty declares nothing: exit 2 in one line, as a Python target providing no operation
    (never a green run of n/i rows)."""
    monkeypatch.setenv("FAKE_FAULT", "no_ops")
    with pytest.raises(NothingImplemented, match="declares no operation"):
        load_target(SPEC)
    run = _cli("verify", "--target", SPEC, "--rules", "FMT.E8M0", "--quiet", *route,
               env_extra={"FAKE_FAULT": "no_ops"}, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "declares no operation (ops= is empty)" in run.stderr and "Traceback" not in run.stderr


def test_the_pytest_plugin_refuses_a_port_declaring_no_operation(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--dsv4spec-target", SPEC,
                          "--dsv4spec-rules", "FMT.E8M0"], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "FAKE_FAULT": "no_ops"})
    assert run.returncode == 4, run.stdout + run.stderr        # pytest's usage error
    assert "declares no operation (ops= is empty)" in run.stdout + run.stderr
