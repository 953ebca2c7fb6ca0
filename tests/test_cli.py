"""The command line: help, errors without tracebacks, the exit status contract."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsv4spec
from dsv4spec.cli import main

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)     # where dsv4spec is importable from
ENV = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": HOME}


# The command's contract, not the examples: 10 a check keep every verdict these runs read (each
# failure shows on an explicit example) at a tenth of the examples' cost.
FEW = ("--max-examples", "10")


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dsv4spec", *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd)


def test_help_lists_every_command():
    out = run("--help").stdout
    for command in ("rules", "ops", "verify", "spec", "budget", "claims", "golden"):
        assert command in out


def test_rules_json_is_the_registry(capsys):
    from dsv4spec.spec import RULES
    assert main(["rules", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in records} == set(RULES)


TARGETS = {
    "mytarget.py": "from dsv4spec.impl import e2m1_encode\nNAME = 'mine'\ndef helper():\n    return 1\n",
    "raising.py": "raise RuntimeError('no GPU here')\n",
    "badknob.py": "VARIANTS = {'e2m1_ties': 'sideways'}\n",
}


@pytest.mark.parametrize("args, needle, status", [
    (["verify", "--target", "nosuchtarget"], "unknown target", 2),
    (["verify", "--target", "impl", "--rules", "NOPE"], "no rule matches prefix", 2),
    (["verify", "--target", "nosuch.module:x"], "cannot import target module", 2),
    (["verify", "--target", "impl", "--profile", "fast"], "unknown profile", 2),
    (["verify", "--target", "mytarget:helper", "--rules", "FMT.E2M1.RNE"], "write mytarget:helper()", 2),
    (["verify", "--target", "mytarget.py"], "write --target mytarget;", 2),
    (["verify", "--target", "./mytarget.py"], "for the file ./mytarget.py, write --target mytarget;", 2),
    (["verify", "--target", "/elsewhere/port.py"], "outside the working directory: put its folder on the path "
                                                   "(PYTHONPATH=/elsewhere) and write --target port;", 2),
    (["verify", "--target", "impl", "--timeout", "0"], "--timeout must be a positive", 2),
    (["verify", "--target", "impl", "--jobs", "0"], "--jobs must be at least 1", 2),
    (["verify", "--target", "impl", "--seed", "abc"], "invalid int value: 'abc'", 2),
    (["verify", "--target", "impl", "--json", "no/such/dir/r.json"], "does not exist", 2),
    (["verify", "--target", "impl", "--junit", "."], "is a directory", 2),
    (["verify", "--nosuchflag"], "unrecognized arguments", 2),
    (["rules", "--rules", "XYZ"], "no rule matches prefix", 2),
    (["verify", "--target", "raising", "--rules", "FMT.E2M1.RNE"], "raised on import: RuntimeError: no GPU here", 3),
    (["verify", "--target", "raising", "--rules", "FMT.E2M1.RNE", "--isolate"], "raised on import: RuntimeError: no GPU here", 3),
    pytest.param(["verify", "--target", "raising", "--rules", "FMT.E2M1", "--jobs", "2"],
                 "raised on import: RuntimeError: no GPU here", 3, marks=pytest.mark.thorough),
    (["verify", "--target", "json", "--rules", "FMT.E2M1.RNE", "--isolate"], "target 'json' provides none of the", 2),
    (["verify", "--target", "badknob", "--rules", "FMT.E2M1.RNE"], "has no value 'sideways'", 3),
])
def test_bad_input_is_one_line_with_its_exit_status(tmp_path, monkeypatch, capsys, request, args, needle, status):
    for name, text in TARGETS.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("mytarget", "raising", "badknob"):
        sys.modules.pop(name, None)
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in ("mytarget", "raising", "badknob")])
    if "--isolate" in args or "--jobs" in args:     # the target is loaded in a worker process: the same one line
        result = run(*args, "--quiet", cwd=tmp_path)
        out, err, code = result.stdout, result.stderr, result.returncode
    else:
        try:
            code = main(args)
        except SystemExit as e:                 # argparse's own errors
            code = e.code
        out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1, err
    assert not out                              # no matrix of a target that was never loaded
    assert code == status, out + err
    assert needle in err and "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "raising.py").write_text(TARGETS["raising.py"])
    result = run("--debug", "verify", "--target", "raising", cwd=tmp_path)
    assert "Traceback" in result.stderr and "no GPU here" in result.stderr


def test_a_target_in_the_working_directory_and_its_reproduce_line_from_elsewhere(tmp_path):
    """`--target mytarget` finds mytarget.py beside the user; the printed reproduce line reruns the
    failure as printed, from another directory, with the same verdict."""
    (tmp_path / "mytarget.py").write_text(
        "import torch\nfrom dsv4spec.impl import e2m1_encode as _e\nNAME = 'mine'\nCLAIMS_CONFORMANCE = True\n"
        "def e2m1_encode(x):\n    return _e(x) & 0x7                     # loses the sign\n")
    result = run("verify", "--target", "mytarget", "--rules", "FMT.E2M1", "--profile", "dev", "--seed", "7", *FEW,
                 cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL FMT.E2M1.RNE on mine" in result.stdout
    line = next(l for l in result.stdout.splitlines() if "reproduce:" in l).split("reproduce: ", 1)[1]
    assert "--seed 7" in line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=elsewhere,
                           env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert again.returncode == 1, again.stdout + again.stderr
    first = result.stdout.split("FAIL FMT.E2M1.RNE on mine")[1].split("reproduce:")[0]
    assert first in again.stdout


def test_reports_are_atomic_and_carry_the_header(tmp_path):
    out = tmp_path / "r.json"
    result = run("verify", "--target", "impl", "--rules", "FMT.E8M0", "--profile", "dev", "--seed", "3",
                 "--json", str(out), "--markdown", str(tmp_path / "r.md"), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    header = report["header"]
    assert report["schema_version"] == 4 and header["seed"] == 3 and header["profile"] == "dev"
    assert header["tool"]["version"] == dsv4spec.__version__ and header["spec"]["rules"] > 0
    assert header["targets"][0]["spec"] == "impl" and header["torch"] and header["date"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dsv4spec-")]   # no temporary left
    assert "## Counts" in (tmp_path / "r.md").read_text()


def test_progress_when_piped_is_compact(capsys):
    """Piped: a counts line once EVERY_S has passed and at the end, a FAIL as it happens (a fake
    clock: the line count must not depend on how fast this machine runs)."""
    from dsv4spec.cli import Progress
    from dsv4spec.properties.suite import Row
    now = [0.0]
    progress = Progress(total=6, quiet=False, tty=False)
    progress.clock, progress.last = (lambda: now[0]), 0.0
    for t, status in ((1.0, "PASS"), (2.0, "PASS"), (11.5, "PASS"), (12.0, "FAIL"), (13.0, "PASS"), (14.0, "PASS")):
        now[0] = t
        progress(Row(f"FMT.T{int(t)}", "impl", status, ""))
    assert capsys.readouterr().err.splitlines() == ["[3/6] 3 PASS", "[4/6] FAIL FMT.T12 on impl", "[6/6] 1 FAIL, 5 PASS"]
    result = run("verify", "--target", "impl", "--rules", "FMT.E2M1.VALUES")
    assert result.returncode == 0 and result.stderr.strip().splitlines()[-1] == "[1/1] 1 PASS", result.stderr


def test_verify_exit_status_follows_claimed_conformance(tmp_path):
    """A mutant claiming conformance makes verify exit 1; the same mutant not claiming it exits 0."""
    module = tmp_path / "badtarget.py"
    module.write_text(
        "from dsv4spec.impl import *\n"
        "import torch\n"
        "CLAIMS_CONFORMANCE = True\n"
        "def e2m1_encode(x):\n"
        "    return torch.zeros(x.shape, dtype=torch.uint8)\n")
    env = {**ENV, "PYTHONPATH": f"{HOME}{os.pathsep}{tmp_path}"}
    cmd = [sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "badtarget",
           "--rules", "FMT.E2M1", "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
           "--markdown", str(tmp_path / "r.md"), *FEW]
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema_version"] == 4
    failed = [r for r in report["results"] if r["status"] == "FAIL"]
    assert failed and all("--target badtarget --rules" in r["reproduce"] for r in failed)
    junit = (tmp_path / "r.xml").read_text()
    assert "<testsuites" in junit and "reproduce: " in junit
    markdown = (tmp_path / "r.md").read_text()
    assert "| rule |" in markdown and "### FAIL `FMT.E2M1" in markdown and "Reproduce:" in markdown
    module.write_text(module.read_text().replace("CLAIMS_CONFORMANCE = True", "CLAIMS_CONFORMANCE = False"))
    relaxed = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr


def test_ops_lists_each_operation_with_the_rules_that_check_it(capsys):
    assert main(["ops", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    pool = {entry["op"]: entry["rules"] for entry in table["pool"]}
    assert "POOL.PIN_NEWEST" in pool["candidate_blocks"] and pool["reindex_topk"] == ["POOL.REINDEX"]
    assert main(["ops", "--family", "nope"]) == 2


@pytest.mark.parametrize("isolate", [False, True])
def test_ctrl_c_prints_and_writes_what_finished(tmp_path, isolate):
    """The first rule fails at once, the second hangs; Ctrl-C then ends the run with the first row,
    and every report says it was interrupted and which rules did not run."""
    import signal
    (tmp_path / "slow.py").write_text(
        "import time, torch\nNAME = 'slow'\nCLAIMS_CONFORMANCE = True\n"
        "def e2m1_encode(x):\n    return torch.zeros(x.shape, dtype=torch.uint8)\n"
        "def e4m3_encode(x):\n    open('started', 'w').close()\n    time.sleep(300)\n")
    process = subprocess.Popen([sys.executable, "-m", "dsv4spec", "verify", "--target", "slow", "--rules",
                                "FMT.E2M1.RNE,FMT.E4M3.RNE", "--json", "r.json", "--junit", "r.xml",
                                "--markdown", "r.md", *["--isolate"] * isolate], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # a process started with SIGINT ignored (an inherited disposition) never
                               # installs Python's KeyboardInterrupt handler: give it the default, as a shell does
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "FAIL FMT.E2M1.RNE on slow" in process.stderr.readline()
    deadline = time.monotonic() + 120          # the signal lands inside the hanging call, however loaded the machine
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=900)     # ends a hang (the failure looked for), far above a loaded run
    assert process.returncode == 130 and "INTERRUPTED (Ctrl-C): 1 of 2 results finished; not run:" in err, err
    assert "  slow: FMT.E4M3.RNE" in err
    assert "FMT.E2M1.RNE  FAIL" in out and "FMT.E4M3.RNE" not in out.split("\n\n")[0]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["not_run"] == [{"rule": "FMT.E4M3.RNE", "target": "slow"}]
    markdown = (tmp_path / "r.md").read_text()
    assert "**INTERRUPTED (Ctrl-C): 1 of 2 results finished; not run:**" in markdown
    assert "- slow: FMT.E4M3.RNE" in markdown
    junit = (tmp_path / "r.xml").read_text()
    assert '<property name="interrupted" value="true" />' in junit
    assert '<testcase classname="slow.FMT" name="FMT.E4M3.RNE" time="0"><skipped message="not run (interrupted)"' in junit
    assert report["interrupted"] and [r["rule"] for r in report["results"]] == ["FMT.E2M1.RNE"]


LOSES_SIGN = ("import torch\nfrom dsv4spec.impl import e2m1_encode as _e\nNAME = 'mine'\n{claim}"
              "def e2m1_encode(x):\n    return _e(x) & 0x7\n")


@pytest.mark.parametrize("isolate", [False, True])
def test_a_named_target_claims_conformance_unless_it_says_otherwise(tmp_path, isolate):
    """No CLAIMS_CONFORMANCE: its FAIL exits 1; CLAIMS_CONFORMANCE = False: exit 0, and the last line
    names the FAIL rather than reading 'no FAIL'."""
    (tmp_path / "mytarget.py").write_text(LOSES_SIGN.format(claim=""))
    args = ["verify", "--target", "mytarget", "--rules", "FMT.E2M1.RNE", "--quiet"] + ["--isolate"] * isolate
    silent = run(*args, cwd=tmp_path)
    assert silent.returncode == 1, silent.stdout + silent.stderr
    assert silent.stdout.strip().splitlines()[-1].startswith("conformance claimed by mine: 1 FAIL (exit 1)")
    (tmp_path / "mytarget.py").write_text(LOSES_SIGN.format(claim="CLAIMS_CONFORMANCE = False\n"))
    relaxed = run(*args, cwd=tmp_path)
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr
    last = relaxed.stdout.strip().splitlines()[-1]
    assert "no FAIL" not in last and "not claimed by mine (CLAIMS_CONFORMANCE = False): 1 FAIL" in last, last


@pytest.mark.parametrize("isolate", [False, True])
def test_a_target_that_implements_nothing_is_a_usage_error(isolate):
    result = run("verify", "--target", "json", "--rules", "FMT.E2M1.RNE", *["--isolate"] * isolate)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "target 'json' provides none of the contract's operations" in result.stderr


DEEP = ("import torch\nNAME = 'deep'\n"
        "def _third(x):\n    raise RuntimeError('shape mismatch in my kernel')\n"
        "def _second(x):\n    return _third(x)\n"
        "def _first(x):\n    return _second(x)\n"
        "def fp8_quantize(x, block=128, fmt='e4m3', scale='e8m0'):\n    return _first(x)\n")


@pytest.mark.parametrize("isolate", [False, True])
def test_an_error_in_the_target_names_its_file_and_line_and_the_inputs(tmp_path, isolate):
    """Not `rng=default_rng(0)`: the frames of the target's own code and the tensors it was called with,
    in the terminal and the JSON; --debug lists every frame."""
    (tmp_path / "deep.py").write_text(DEEP)
    base = ["verify", "--target", "deep", "--rules", "FP8.BLOCKS", "--quiet", "--json", "r.json"]
    result = run(*base, *["--isolate"] * isolate, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    detail = json.loads((tmp_path / "r.json").read_text())["results"][0]["detail"]
    path = str(tmp_path / "deep.py")
    assert f"raised in the target:\n  {path}:10 in fp8_quantize: return _first(x)\n  …\n" in detail, detail
    assert f"  {path}:4 in _third: raise RuntimeError('shape mismatch in my kernel')" in detail
    assert "the target received: fp8_quantize(tensor(float32, shape [" in detail
    assert f"{path}:4 in _third" in result.stdout
    debug = run("--debug", *base, cwd=tmp_path)
    detail = json.loads((tmp_path / "r.json").read_text())["results"][0]["detail"]
    assert "(every frame, --debug)" in detail and f"{path}:8 in _first" in detail and "…" not in detail


def test_ops_of_the_formats_family_are_the_element_codecs(capsys):
    assert main(["ops", "--family", "formats"]) == 0
    out = capsys.readouterr().out
    assert "e2m1_encode(" in out and "FMT.E2M1.RNE" in out


def test_the_cli_takes_skip_and_xfail_files_the_target_variable_and_max_examples(tmp_path):
    """--skip: SKIP with the reason, not run; --xfail: the FAIL shown with its reason, exit 0; a stale
    entry warned; $DSV4SPEC_TARGET names the target; --max-examples in the reproduce line; --seed
    under the derandomized ci said ignored."""
    (tmp_path / "mytarget.py").write_text(LOSES_SIGN.format(claim=""))
    (tmp_path / "skip.txt").write_text("FMT.E2M1.SATURATE  not ours\n")
    (tmp_path / "xfail.txt").write_text("# known\nFMT.E2M1.RNE  signs dropped (ticket 1)\nFMT.E2M1.ZERO_SIGN same\nNOPE.X stale\n")
    result = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--rules", "FMT.E2M1", "--skip", "skip.txt",
                             "--xfail", "xfail.txt", "--max-examples", "3", "--seed", "4", "--json", "r.json"],
                            capture_output=True, text=True, cwd=tmp_path, env={**ENV, "DSV4SPEC_TARGET": "mytarget"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["rule"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert rows["FMT.E2M1.SATURATE"]["status"] == "SKIP" and "not ours" in rows["FMT.E2M1.SATURATE"]["detail"]
    assert rows["FMT.E2M1.RNE"]["status"] == "FAIL"
    assert rows["FMT.E2M1.RNE"]["detail"].startswith("expected to fail (--xfail line 2: signs dropped (ticket 1))")
    assert "--max-examples 3" in rows["FMT.E2M1.RNE"]["reproduce"]
    assert "--xfail line 4: 'NOPE.X' matches none of the selected rules" in result.stderr
    assert "--seed 4 is ignored: profile ci is derandomized" in result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith("(2 FAIL expected by --xfail)")


OVERFLOW_PROBE = """
import sys
from triton.runtime import interpreter as I
import dsv4spec.kernels, dsv4spec.properties.plugin
on = lambda: I.interpreter_builder.options.sanitize_overflow
seen = [on()]
from dsv4spec import cli
cli.main(["rules"])
seen.append(on())
cli.main(sys.argv[1:])
seen.append(on())
print("sanitizer", *seen)
"""


def test_the_interpreters_dead_overflow_checks_are_skipped_in_our_processes_only():
    """A user's process that imports the kernels or the pytest plugin keeps Triton's setting; the
    commands that run targets (our process) switch the dead sanitizer work off."""
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-c", OVERFLOW_PROBE, "verify", "--target", "impl", "--rules",
                           "FMT.CEIL_LOG2", "--quiet"], capture_output=True, text=True, env=ENV)
    assert "FMT.CEIL_LOG2" in done.stdout and done.stdout.strip().splitlines()[-1] == "sanitizer True True False", \
        done.stdout + done.stderr[-2000:]
