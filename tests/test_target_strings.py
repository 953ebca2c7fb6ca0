"""Whatever string a target produces (a lone surrogate, ANSI escapes, a NUL, a NAME with `|` or a
line feed) every report is written and shows it as text, never obeys it; what "the target
received" is what was sent, not what the target wrote over it (issue 42)."""
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from dsv4spec.properties.suite import ERROR, RUN, run_rule
from dsv4spec.properties.target import Target

HOSTILE_TARGET = '''
NAME = "evil|name\\nsecond line \\x1b[31mred"

def e2m1_encode(x):
    raise ValueError("bad \\ud800 surrogate \\x1b[2J\\x00 end")
'''


@pytest.mark.parametrize("route", [[], ["--isolate"], ["--jobs", "2"]], ids=["in-process", "isolate", "jobs"])
def test_every_report_is_written_for_any_string_a_target_produces(tmp_path, route):
    (tmp_path / "stringy.py").write_text(HOSTILE_TARGET)
    run = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "stringy", "--rules",
                          "FMT.E2M1.RNE", "--max-examples", "2", "--json", "r.json", "--junit", "r.xml",
                          "--markdown", "r.md", *route],
                         cwd=tmp_path, capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    out, err = run.stdout.decode("utf-8"), run.stderr.decode("utf-8", "backslashreplace")
    assert run.returncode == 1, out + err
    assert "bad \\ud800 surrogate \\x1b[2J\\x00 end" in out and not re.search("[\x00\x1b]", out), out
    assert "evil|name\\nsecond line \\x1b[31mred" in out
    (row,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["status"] == "ERROR" and "\\ud800" in row["detail"] and "\x1b" not in row["detail"]
    assert ET.parse(tmp_path / "r.xml").getroot().find("testsuite/testcase/error") is not None
    markdown = (tmp_path / "r.md").read_text()
    assert not re.search("[\x00\x1b]", markdown)
    matrix = next(line for line in markdown.splitlines() if line.startswith("| rule | title |"))
    assert len(re.split(r"(?<!\\)\|", matrix)) == 5, matrix      # three cells: rule, title, the one target
    assert "evil\\|name\\nsecond line" in matrix


def test_an_in_place_write_shows_the_values_sent_as_what_the_target_received():
    from dsv4spec.impl import e2m1_encode

    def scribbling(x):
        codes = e2m1_encode(x)
        x.fill_(12345.0)
        return codes
    saved, RUN.max_examples = RUN.max_examples, 3
    try:
        row = run_rule("FMT.E2M1.RNE", Target(SimpleNamespace(NAME="scribbler", e2m1_encode=scribbling), "s"))
    finally:
        RUN.max_examples = saved
    assert row.status == ERROR and "modified its input 'x' in place" in row.detail, row.detail
    received = row.detail[row.detail.index("the target received:"):]
    assert "12345" not in received and "e2m1_encode(tensor(float32" in received, received


def test_a_load_error_a_target_raises_is_shown_not_obeyed(tmp_path):
    (tmp_path / "loud.py").write_text('raise RuntimeError("\\x1b[2J\\x1b[31mcleared \\x00")\n')
    run = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "loud", "--rules",
                          "FMT.E2M1.RNE"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 3 and "\\x1b[2J\\x1b[31mcleared \\x00" in run.stderr, run.stderr
    assert not re.search("[\x00\x1b]", run.stderr + run.stdout)
