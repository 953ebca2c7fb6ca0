"""The command's guard (dsv4spec/guard.py), on a target that ends the process after its last row and
before the verdict: every row had reached the guard, so no rule is charged, yet the run did not
conclude: the guard writes the reports with the finding that the target ended the process before
its verdict, and the exit status is 1 at least (issue 42)."""
import json
import subprocess
import sys
from pathlib import Path

HOME = str(Path(__file__).resolve().parent.parent)
ENV = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "OMP_NUM_THREADS": "1"}

ENDS_AT_THE_VERDICT = '''
import os
import sys
from dsv4spec.impl import e2m1_decode


class EndsTheProcess:
    """Standard output that ends the process at its first write: the verdict's, after every row."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        os._exit(0)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stdout = EndsTheProcess(sys.stdout)
'''


def test_a_child_that_ends_after_its_rows_is_a_finding_and_exit_status_1(tmp_path):
    (tmp_path / "ender.py").write_text(ENDS_AT_THE_VERDICT)
    run = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--max-examples", "1",
                          "--target", "ender", "--rules", "FMT.E2M1.VALUES", "--json", "r.json"],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["status"] for r in report["results"]] == ["PASS"], report["results"]
    finding = "the target ended the process running the suite before its verdict (exit status 1 at least)"
    assert report["header"]["findings"] == [finding], report["header"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert finding in run.stderr and "the target ended the process (exit status 0)" in run.stderr, run.stderr
