"""examples/c_port, the C reference port over the exec protocol: its Makefile builds it, it
conforms, and each deviation it can plant (DSV4_PORT_DEVIATION) FAILs on its own rule, with the
variant named where the registry has one, while the neighbouring rule still passes."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4spec.properties.suite import FAIL, PASS, run_rule
from dsv4spec.properties.target import TargetLoadError, load_target

HOME = Path(__file__).resolve().parent.parent
SOURCE = HOME / "examples" / "c_port"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The port built by its own Makefile, in a copy of examples/c_port (the checkout stays clean)."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None or shutil.which("make") is None:
        pytest.skip(f"no C compiler ({compiler}) or no make on PATH: the C port cannot be built")
    work = tmp_path_factory.mktemp("c") / "c_port"
    shutil.copytree(SOURCE, work, ignore=shutil.ignore_patterns("port"))
    make = subprocess.run(["make", "-C", str(work)], capture_output=True, text=True)
    assert make.returncode == 0, make.stdout + make.stderr
    assert "warning" not in make.stderr, make.stderr            # -Wall -Wextra -pedantic, clean
    return work / "port"


def port(built, monkeypatch, deviation=""):
    monkeypatch.setenv("DSV4_PORT_DEVIATION", deviation)
    return load_target(f"exec:{built}")


def test_it_answers_the_worked_example_of_protocol_md_byte_for_byte(built):
    request = (b"hello protocol=1\ncall op=e2m1_encode args=1 kwargs=0\ntensor dtype=float32 shape=2 nbytes=8\n"
               + bytes.fromhex("0000403f0000d0c0"))
    out = subprocess.run([built], input=request, capture_output=True, check=True).stdout
    hello, _, reply = out.partition(b"\n")
    assert hello.startswith(b"hello protocol=1 name=c-port ") and b" claims_conformance=1 " in hello
    assert reply == b"ok n=1\ntensor dtype=uint8 shape=2 nbytes=2\n\x02\x0f"


# the rules the deviations break (their neighbours pass below), and one of each other quantizer
CLEAN = ("FMT.E2M1.RNE", "FP4.KV.FLOOR", "FP4.IDX.SCALE", "FP8.SCALE")


def test_the_clean_port_conforms(built, monkeypatch):
    target = port(built, monkeypatch)
    assert target.name == "c-port" and target.claims_conformance
    assert {r: run_rule(r, target).status for r in CLEAN} == {r: PASS for r in CLEAN}


# deviation, the rule it breaks, what the FAIL says, a neighbouring rule that still passes
DEVIATIONS = [
    ("ties_away", "FMT.E2M1.RNE", "matches e2m1_ties=away_from_zero (undeclared)", "FMT.E2M1.SATURATE"),
    ("ties_away", "FP4.E2M1.RNE", "matches e2m1_ties=away_from_zero (undeclared)", "FP4.KV.SCALE"),
    ("scale_reciprocal_six", "FP4.KV.SCALE", "FP4.KV.SCALE: fp4_e4m3_quantize scale bytes", "FP4.KV.DIVIDE"),
    ("payload_reciprocal", "FP4.KV.DIVIDE", "matches scale_apply=reciprocal (undeclared)", "FP4.KV.SCALE"),
    ("floor_6x2m6", "FP4.KV.FLOOR", "matches fp4_kv_scale_floor=6x2^-6 (undeclared)", "FP4.KV.DIVIDE"),
]


@pytest.mark.parametrize("deviation,rule,says,neighbour", DEVIATIONS, ids=[f"{d[0]}-{d[1]}" for d in DEVIATIONS])
def test_each_planted_deviation_fails_on_its_own_rule(built, monkeypatch, deviation, rule, says, neighbour):
    target = port(built, monkeypatch, deviation)
    assert target.name == f"c-port {deviation}"
    row = run_rule(rule, target)
    assert row.status == FAIL and says in row.detail, row.detail
    assert run_rule(neighbour, target).status == PASS


def test_an_unknown_deviation_is_refused_at_the_handshake(built, monkeypatch):
    with pytest.raises(TargetLoadError, match="refused the handshake: unknown DSV4_PORT_DEVIATION sideways"):
        port(built, monkeypatch, "sideways")


def _verify(built, rules, deviation=""):
    env = {**os.environ, "DSV4_PORT_DEVIATION": deviation}
    return subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--target", "exec:c_port/port",
                           "--rules", rules, "--quiet"], capture_output=True, text=True, env=env,
                          cwd=built.parent.parent)


def test_the_cli_verifies_it_by_a_relative_path_and_prints_the_exec_target_verbatim(built):
    clean = _verify(built, "FMT.E8M0,FMT.E2M1.VALUES,FP8.DEQUANT")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "conformance claimed by c-port: no FAIL, ERROR or TIMEOUT" in clean.stdout
    planted = _verify(built, "FP4.KV.FLOOR", "floor_6x2m6")
    assert planted.returncode == 1 and "matches fp4_kv_scale_floor=6x2^-6" in planted.stdout
    line = next(l for l in planted.stdout.splitlines() if "reproduce:" in l)
    assert line.endswith("verify --target exec:c_port/port --rules FP4.KV.FLOOR --profile ci")
