"""A target that cannot be loaded is answered the same on every route of the command (issue 42):
in its own process (the guard's child), with --isolate and with --jobs, the same one line on
standard error, the same exit status (3; 2 for a target providing no operation), and the same
reports written, each of its rules an ERROR naming why (docs/CLI.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HOME = str(Path(__file__).resolve().parent.parent)
ENV = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "OMP_NUM_THREADS": "1"}
ROUTES = {"command": (), "isolate": ("--isolate",), "jobs": ("--jobs", "2")}
RULES = "FMT.E2M1.ZERO_SIGN,FMT.E2M1.RNE"

UNLOADABLE = {   # spec, the files it needs, what its line says, the exit status
    "import error": ("broken", {"broken.py": "import no_such_module_anywhere\n"},
                     "target module 'broken' raised on import: ModuleNotFoundError", 3),
    "syntax error": ("broken", {"broken.py": "def e2m1_encode(x):\n    return (\n"},
                     "target module 'broken' raised on import: SyntaxError", 3),
    "missing exec file": ("exec:./no_such_port", {}, "no file ", 3),
    "exec command that breaks the handshake": ("exec:./port", {"port": "#!/bin/sh\nread hello\necho nonsense\n"},
                                               "target 'exec:./port': ", 3),
    "no operation": ("empty", {"empty.py": "NAME = 'empty'\n"}, "provides none of the contract's operations", 2),
}


def _verify(tmp_path: Path, spec: str, route: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--max-examples", "1",
                           "--target", spec, "--target", "impl", "--rules", RULES, *ROUTES[route],
                           "--json", f"{route}.json", "--junit", f"{route}.xml", "--markdown", f"{route}.md"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dsv4spec verify: error: ")]


@pytest.mark.parametrize("kind", UNLOADABLE)
def test_an_unloadable_target_is_answered_the_same_on_every_route(tmp_path, kind):
    spec, files, says, status = UNLOADABLE[kind]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        os.chmod(tmp_path / name, 0o755)
    lines = {}
    for route in ROUTES:
        run = _verify(tmp_path, spec, route)
        lines[route] = _errors(run.stderr)
        assert run.returncode == status, f"{route}: {run.stdout}{run.stderr}"
        assert len(lines[route]) == 1 and says in lines[route][0], f"{route}: {run.stderr}"
        assert f"on {spec}" not in run.stderr, f"{route}: its rows shown as progress: {run.stderr}"
        report = json.loads((tmp_path / f"{route}.json").read_text())
        target = report["header"]["targets"][0]
        assert target["load_error"] and says in target["load_error"], f"{route}: {target}"
        rows = {(r["rule"], r["target"]): r for r in report["results"]}
        assert {r["status"] for k, r in rows.items() if k[1] == spec} == {"ERROR"}, f"{route}: {rows}"
        assert {r["status"] for k, r in rows.items() if k[1] == "impl"} == {"PASS"}, f"{route}: {rows}"
        assert says in (tmp_path / f"{route}.xml").read_text() and (tmp_path / f"{route}.md").exists()
    assert lines["command"] == lines["isolate"] == lines["jobs"], lines


ENDS_AT_IMPORT = {"os._exit": ("import os\nos._exit(0)\n", "exit status 0"),
                  "a signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "signal SIGSEGV")}


@pytest.mark.parametrize("how", ENDS_AT_IMPORT)
def test_a_target_that_ends_the_process_as_it_loads_could_not_be_loaded_on_every_route(tmp_path, how):
    """The command's guard said the target "ended the process", exit status 1, where a worker said it
    could not be loaded, exit status 3."""
    code, ended = ENDS_AT_IMPORT[how]
    (tmp_path / "ender.py").write_text(code)
    says = f"target 'ender' could not be loaded: the target's process died ({ended}) in <loading the target>"
    for route in ROUTES:
        run = subprocess.run([sys.executable, "-m", "dsv4spec", "verify", "--quiet", "--target", "ender",
                              "--rules", RULES, *ROUTES[route], "--json", "r.json"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        assert run.returncode == 3 and _errors(run.stderr) == [f"dsv4spec verify: error: {says}"], \
            f"{route}: {run.stdout}{run.stderr}"
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["header"]["targets"][0]["load_error"] == says, f"{route}: {report['header']}"
        assert {(r["status"], r["detail"]) for r in report["results"]} == {("ERROR", says)}, f"{route}: {report}"
