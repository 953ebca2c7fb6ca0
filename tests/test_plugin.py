"""The pytest route: one item per (rule, target), FAIL with its reproduce line, skip and xfail files
with reasons, a warning for an entry that matches nothing."""
import subprocess
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
                        "--dsv4spec-seed", "5")
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
                        "--dsv4spec-profile", "dev")
    header = re.search(r"profile dev \(seed (\d+)\)", result.stdout).group(1)
    assert set(re.findall(r"--seed (\d+)", result.stdout)) == {header}, result.stdout
