"""The pytest route: one item per (rule, target), FAIL with its reproduce line, skip and xfail files
with reasons, a warning for an entry that matches nothing."""
import subprocess

import pytest
import sys
from pathlib import Path

import dsv4spec

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)
LOSSY = """
from dsv4spec.impl import *
from dsv4spec.impl import fp4_e8m0_quantize as _quantize
NAME = "lossy"
def fp4_e8m0_quantize(x):
    packed, scales = _quantize(x)
    return packed & 0x77, scales                                   # drops the signs
"""


# The plugin's plumbing, not the examples: 10 a check keep every verdict these runs read (each
# failure shows on an explicit example) at a tenth of the examples' cost.
FEW = ("--dsv4spec-max-examples", "10")


def pytest_run(tmp_path, *args):
    # The plugin loads through its pytest11 entry point (the project is installed), as for a user.
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1"})


def test_rules_run_as_pytest_items_with_skip_and_xfail_files(tmp_path):
    (tmp_path / "lossy.py").write_text(LOSSY)
    (tmp_path / "xfail.txt").write_text("# known problems\nFP4.E2M1.RNE  signs dropped (ticket 1)\nNOPE.X stale\n")
    (tmp_path / "skip.txt").write_text("FP4.PACK  packing is not ours\n")
    result = pytest_run(tmp_path, "--dsv4spec-target", "lossy", "--dsv4spec-rules", "FP4.E2M1,FP4.PACK,FP4.IDX.SCALE",
                        "--dsv4spec-xfail", "xfail.txt", "--dsv4spec-skip", "skip.txt", "--dsv4spec-profile", "dev",
                        "--dsv4spec-seed", "5", *FEW)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "dsv4spec: profile dev (seed 5); targets lossy" in out
    assert "PASSED dsv4spec::FP4.IDX.SCALE[lossy]" in out
    assert "XFAIL dsv4spec::FP4.E2M1.RNE[lossy] - signs dropped (ticket 1)" in out
    assert "SKIPPED [1] dsv4spec: packing is not ours" in out
    assert "FAILED dsv4spec::FP4.E2M1.ZERO_SIGN[lossy]" in out
    assert "--rules FP4.E2M1.ZERO_SIGN --profile dev --seed 5" in out
    assert "xfail line 3: 'NOPE.X' matches none of the selected rules" in out


def test_without_a_target_the_plugin_adds_nothing_and_a_bad_target_is_a_usage_error(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_one():\n    pass\n")
    assert "1 passed" in pytest_run(tmp_path).stdout
    bad = pytest_run(tmp_path, "--dsv4spec-target", "nosuchtarget")
    assert bad.returncode == 4 and "dsv4spec: unknown target 'nosuchtarget'" in bad.stderr


def test_xdist_workers_share_one_printed_seed(tmp_path):
    import re
    (tmp_path / "lossy.py").write_text(LOSSY)
    result = pytest_run(tmp_path, "-n", "2", "--dsv4spec-target", "lossy", "--dsv4spec-rules", "FP4.E2M1",
                        "--dsv4spec-profile", "dev", *FEW)
    header = re.search(r"profile dev \(seed (\d+)\)", result.stdout).group(1)
    assert set(re.findall(r"--seed (\d+)", result.stdout)) == {header}, result.stdout


USER_TEST = """
from hypothesis import given, settings, strategies as st
SEEN = []
@given(st.integers())
def test_counted(x):
    SEEN.append(x)
def test_the_users_profile_is_untouched():
    print(f"USER EXAMPLES {len(SEEN)} PROFILE {settings.get_current_profile_name()} MAX {settings().max_examples}")
"""


def test_the_suite_changes_no_hypothesis_profile_of_the_users(tmp_path):
    """Under CI=true Hypothesis loads its built-in `ci` profile for the user's tests (100 examples);
    the suite beside them must neither re-register it nor load a profile of its own."""
    (tmp_path / "test_user.py").write_text(USER_TEST)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "test_user.py",
                             "--dsv4spec-target", "impl", "--dsv4spec-rules", "FMT.E2M1.RNE", *FEW],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1", "CI": "true"})
    assert "USER EXAMPLES 100 PROFILE ci MAX 100" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0


def test_importing_the_suite_registers_only_profiles_of_its_own():
    probe = ("from hypothesis import settings\n"
             "before = {k: repr(v) for k, v in settings._profiles.items()}; current = settings.get_current_profile_name()\n"
             "import dsv4spec.properties.suite\n"
             "after = {k: repr(v) for k, v in settings._profiles.items()}\n"
             "assert all(after[k] == v for k, v in before.items()), 'changed'\n"
             "assert all(k.startswith('dsv4spec-') for k in set(after) - set(before)), sorted(after)\n"
             "assert settings.get_current_profile_name() == current\n"
             "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "CI": "true"})
    assert result.stdout.strip() == "ok", result.stderr


def test_hypothesis_seed_is_honoured_in_dev_and_said_ignored_in_ci(tmp_path):
    (tmp_path / "lossy.py").write_text(LOSSY)
    dev = pytest_run(tmp_path, "--dsv4spec-target", "lossy", "--dsv4spec-rules", "FP4.E2M1.ZERO_SIGN",
                     "--dsv4spec-profile", "dev", "--hypothesis-seed", "7", *FEW)
    assert "profile dev (seed 7)" in dev.stdout and "--seed 7" in dev.stdout, dev.stdout
    ci = pytest_run(tmp_path, "--dsv4spec-target", "lossy", "--dsv4spec-rules", "FP4.E2M1.ZERO_SIGN",
                    "--hypothesis-seed", "7", *FEW)
    assert "--hypothesis-seed 7 ignored by dsv4spec: profile ci is derandomized" in ci.stdout, ci.stdout
    both = pytest_run(tmp_path, "--dsv4spec-target", "lossy", "--dsv4spec-profile", "dev", "--dsv4spec-seed", "3",
                      "--hypothesis-seed", "7")
    assert both.returncode == 4 and "disagree" in both.stderr and "INTERNALERROR" not in both.stdout + both.stderr


def test_hypothesis_profile_naming_a_suite_profile_is_refused_in_one_line(tmp_path):
    result = pytest_run(tmp_path, "--dsv4spec-target", "impl", "--hypothesis-profile", "dev")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "INTERNALERROR" not in result.stdout + result.stderr
    assert "--hypothesis-profile dev: Hypothesis has no profile 'dev'" in result.stderr
    assert "--dsv4spec-profile dev" in result.stderr


def test_pytest_agrees_with_the_cli_on_who_claims_conformance(tmp_path):
    (tmp_path / "lossy.py").write_text(LOSSY)
    args = ("--dsv4spec-target", "lossy", "--dsv4spec-rules", "FP4.E2M1.ZERO_SIGN", *FEW)
    assert pytest_run(tmp_path, *args).returncode == 1
    (tmp_path / "lossy.py").write_text(LOSSY + "CLAIMS_CONFORMANCE = False\n")
    relaxed = pytest_run(tmp_path, *args)
    assert relaxed.returncode == 0 and "XFAIL dsv4spec::FP4.E2M1.ZERO_SIGN[lossy]" in relaxed.stdout, relaxed.stdout
    nothing = pytest_run(tmp_path, "--dsv4spec-target", "json")
    assert nothing.returncode == 4 and "provides none of the contract's operations" in nothing.stderr


CRASHING = """
import ctypes, torch
from dsv4spec.impl import e2m1_encode, e4m3_encode
NAME = "crashing"
def e8m0_decode(codes):
    ctypes.string_at(0)                                            # a segfault in C
"""


def test_isolate_keeps_the_session_alive_when_the_target_segfaults(tmp_path):
    (tmp_path / "crashing.py").write_text(CRASHING)
    result = pytest_run(tmp_path, "--dsv4spec-target", "crashing", "--dsv4spec-isolate", "--junitxml", "r.xml",
                        "--dsv4spec-rules", "FMT.E2M1.RNE,FMT.E8M0.VALUES,FMT.E4M3.RNE")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "PASSED dsv4spec::FMT.E2M1.RNE[crashing]" in out and "PASSED dsv4spec::FMT.E4M3.RNE[crashing]" in out
    assert "FAILED dsv4spec::FMT.E8M0.VALUES[crashing]" in out
    assert "the target's process died (signal SIGSEGV) in e8m0_decode" in out
    assert "--rules FMT.E8M0.VALUES --profile ci --isolate" in out
    assert "2 passed" in out and (tmp_path / "r.xml").exists()


def test_the_target_variable_selects_the_target_for_pytest_too(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                             "--dsv4spec-rules", "FMT.E2M1.RNE", "--dsv4spec-max-examples", "3"],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1",
                                 "DSV4SPEC_TARGET": "impl"})
    assert "PASSED dsv4spec::FMT.E2M1.RNE[impl]" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("seconds", ["nan", "inf", "0"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_by_the_plugin(tmp_path, seconds):
    run = pytest_run(tmp_path, "--dsv4spec-target", "impl", f"--dsv4spec-timeout={seconds}")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "must be a positive, finite number of seconds" in run.stderr


# Without --dsv4spec-isolate the session forks (runner/pytest_guard.py): a target that ends the
# process, or leaves a thread, cannot end or hold the session (issue 42)
# ------------------------------------------------------------------------------------------------

ENDS = {"os._exit": "import os\ndef end():\n    os._exit(0)\n",
        "C exit": "import ctypes\ndef end():\n    ctypes.CDLL(None).exit(0)\n"}
LEAVES_A_THREAD = ("import threading, time\nfrom dsv4spec.impl import e2m1_encode as _e\n"
                   "LEFT = threading.Thread(target=time.sleep, args=(3600,), name='left-behind')\n"
                   "def e2m1_encode(x):\n"
                   "    LEFT.is_alive() or LEFT.start()\n"
                   "    return _e(x)\n")


def _pytest(tmp_path, *args, env=None):
    """pytest in a session of its own, ended with everything it started if it outlives a generous bound."""
    from test_faults import _finished, _group_ended
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           start_new_session=True,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1",
                                "OMP_NUM_THREADS": "1", **(env or {})})
    out, err = _finished(run, 300)
    assert _group_ended(run.pid) == []
    return run.returncode, out, err


@pytest.mark.parametrize("how", ["os._exit", pytest.param("C exit", marks=pytest.mark.thorough)])
def test_a_target_that_ends_pytests_process_is_an_error_with_a_summary_and_junitxml(tmp_path, how):
    """It used to end pytest with status 0, no summary and no --junitxml."""
    import xml.etree.ElementTree as ET
    (tmp_path / "ender.py").write_text(ENDS[how] + "from dsv4spec.impl import e2m1_encode\n"
                                       "def e4m3_encode(x):\n    end()\n")
    code, out, err = _pytest(tmp_path, "--dsv4spec-target", "ender", "--junitxml", "r.xml", "--dsv4spec-rules",
                             "FMT.E2M1.RNE,FMT.E4M3.RNE,FMT.E4M3.SATFINITE", "--dsv4spec-max-examples", "2")
    assert code == 1, out + err
    ended = "the target ended pytest's process (exit status 0) during e4m3_encode in dsv4spec::FMT.E4M3.RNE[ender]"
    assert ended in out and "1 error, 1 not run, 1 passed" in out, out
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert ended in cases["FMT.E4M3.RNE[ender]"].find("error").get("message")
    assert cases["FMT.E4M3.SATFINITE[ender]"].find("error").get("message").startswith("not run: ")
    assert list(cases["FMT.E2M1.RNE[ender]"]) == []         # passed


@pytest.mark.parametrize("isolate", [pytest.param([], id="in-process"),
                                     pytest.param(["--dsv4spec-isolate"], id="isolate")])
def test_a_thread_the_target_leaves_running_is_named_and_does_not_hold_pytest(tmp_path, isolate):
    """In pytest's process it kept pytest from ever exiting after "1 passed"; in the isolate worker it
    went unreported with status 0."""
    (tmp_path / "spinner.py").write_text(LEAVES_A_THREAD)
    code, out, err = _pytest(tmp_path, "--dsv4spec-target", "spinner", "--dsv4spec-rules", "FMT.E2M1.ZERO_SIGN",
                             "--dsv4spec-max-examples", "1", *isolate)
    assert code == 1, out + err
    assert "1 passed" in out and "non-daemon thread(s) in " in out and "running: left-behind" in out, out
