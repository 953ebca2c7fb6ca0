"""verify --shard K/N and report merge: one run over N CI jobs, joined back into the whole run's report."""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4spec
from dsv4spec.cli import main
from dsv4spec.properties import suite
from dsv4spec.properties.shard import expected_cost, split
from dsv4spec.spec import select

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)
INSTALLED = Path(sys.executable).with_name("dsv4spec")
COMMAND = [str(INSTALLED)] if INSTALLED.exists() else [sys.executable, "-m", "dsv4spec"]
# cheap: two targets (ml_dtypes has FAIL and n/i rows), a few examples a check
RUN = ["--target", "impl", "--target", "ml_dtypes", "--rules", "FMT.E4M3,FP4.PACK", "--max-examples", "3", "--quiet"]


def installed(*args, env=None, cwd=None):
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": HOME, "TRITON_INTERPRET": "1", **(env or {})})


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The unsharded run's JSON report and its two shards', in this process, with its exit statuses."""
    folder = tmp_path_factory.mktemp("shards")
    saved = dict(vars(suite.RUN))
    try:
        statuses = {name: main(["verify", *RUN, *shard, "--json", str(folder / f"{name}.json")])
                    for name, shard in (("whole", []), ("1", ["--shard", "1/2"]), ("2", ["--shard", "2/2"]))}
    finally:
        vars(suite.RUN).update(saved)
    return folder, statuses


def load(folder, name):
    return json.loads((folder / f"{name}.json").read_text())


def results(report):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in report["results"]]


def write(path, report):
    path.write_text(json.dumps(report))
    return str(path)


@pytest.mark.parametrize("prefixes", [None, ["FMT"], ["PATH", "ROPE"]])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_shards_partition_the_selection_and_balance_its_cost(prefixes, n):
    selection = [r.id for r in select(prefixes)]
    shards = split(selection, n)
    assert len(shards) == n
    assert sorted(r for s in shards for r in s) == sorted(selection)        # every rule in exactly one shard
    assert all(s == [r for r in selection if r in s] for s in shards)       # each in the selection's order
    loads = [sum(expected_cost(r) for r in s) for s in shards]
    assert max(loads) - min(loads) <= max(expected_cost(r) for r in selection)
    assert all(shards) or len(selection) < n


def test_a_shard_is_the_same_in_another_process(tmp_path):
    selection = [r.id for r in select(["FMT"])]
    expected = split(selection, 3)[1]
    out = installed("verify", "--target", "impl", "--rules", "FMT", "--max-examples", "1", "--shard", "2/3",
                    "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"), "--quiet",
                    env={"PYTHONHASHSEED": "12345"})
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["header"]["shard"] == {"index": 2, "count": 3, "rules": expected}
    assert [r["rule"] for r in report["results"]] == expected
    assert " · shard 2/3" in out.stdout.splitlines()[0]
    assert " · shard 2/3" in (tmp_path / "r.md").read_text()


def test_merged_shards_are_the_unsharded_run(reports, tmp_path):
    folder, statuses = reports
    whole = load(folder, "whole")
    assert statuses == {"whole": 0, "1": 0, "2": 0}
    out = installed("report", "merge", str(folder / "2.json"), str(folder / "1.json"), "--json",
                    str(tmp_path / "m.json"), "--junit", str(tmp_path / "m.xml"), "--markdown", str(tmp_path / "m.md"))
    assert out.returncode == 0, out.stderr
    merged = json.loads((tmp_path / "m.json").read_text())
    assert results(merged) == results(whole)
    assert {r["status"] for r in whole["results"]} >= {"PASS", "FAIL", "n/i"}
    assert merged["counts"] == whole["counts"] and merged["interrupted"] is False
    assert merged["header"]["examples_per_check"] == whole["header"]["examples_per_check"]
    assert merged["header"]["merged"]["shards"] == [1, 2] and "shard" not in merged["header"]
    assert "2 of 2 shards merged" in out.stdout.splitlines()[0]
    assert "ml_dtypes" in (tmp_path / "m.xml").read_text() and "2 of 2 shards merged" in (tmp_path / "m.md").read_text()
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(suite.__file__).parent / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(merged)


def _mismatched(report, what):
    header = report["header"]
    if what == "tool version":
        header["tool"]["version"] = "0.0.1"
    elif what == "profile":
        header["profile"] = "dev"
    elif what == "seed":
        header["seed"] = 7
    elif what == "targets":
        header["targets"] = header["targets"][:1]
    elif what == "targets differ":
        header["targets"][0]["version"] = "9.9"
    elif what == "shard count N":
        header["shard"]["count"] = 3
    elif what == "rule selection":
        header["rules"] = ["FMT"]
    elif what == "--max-examples":
        header["max_examples"] = 4
    return report


@pytest.mark.parametrize("what", ["tool version", "profile", "seed", "targets", "targets differ", "shard count N",
                                  "rule selection",
                                  "--max-examples"])
def test_merge_refuses_reports_of_different_runs(reports, tmp_path, capsys, what):
    folder, _ = reports
    other = write(tmp_path / "2.json", _mismatched(load(folder, "2"), what))
    assert main(["report", "merge", str(folder / "1.json"), other]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsv4spec report: error: not one run: ") and what in err and "\n" not in err


def test_merge_refuses_reports_of_other_rules(reports, tmp_path):
    folder, _ = reports
    one, two = load(folder, "1"), load(folder, "2")
    for report in (one, two):
        report["header"]["spec"]["digest"] = "0" * 16
    out = installed("report", "merge", write(tmp_path / "1.json", one), write(tmp_path / "2.json", two))
    assert out.returncode == 2 and "written under rules digest 0000000000000000" in out.stderr


@pytest.mark.parametrize("given, needle", [
    (["1", "1"], "shard 1 given more than once"),
    (["1", "1copy", "2"], "shard 1 given more than once"),
    (["1"], "shard 2/2 missing (have 1/2); merge every shard, or pass --allow-incomplete"),
    (["whole", "1"], "expected a shard's report (verify --shard K/N), found an unsharded run's"),
    (["notjson"], "expected a JSON report of dsv4spec verify --json, not JSON"),
])
def test_merge_refuses_duplicate_missing_and_foreign_reports(reports, tmp_path, capsys, given, needle):
    folder, _ = reports
    (tmp_path / "1copy.json").write_text((folder / "1.json").read_text())
    (tmp_path / "notjson.json").write_text("<testsuites/>")
    paths = [str(tmp_path / f"{g}.json") if (tmp_path / f"{g}.json").exists() else str(folder / f"{g}.json")
             for g in given]
    assert main(["report", "merge", *paths]) == 2
    assert needle in capsys.readouterr().err


def test_an_incomplete_merge_needs_the_flag_and_says_so(reports, tmp_path, capsys):
    folder, _ = reports
    status = main(["report", "merge", str(folder / "1.json"), "--allow-incomplete",
                   "--json", str(tmp_path / "m.json"), "--markdown", str(tmp_path / "m.md")])
    assert status == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    missing = load(folder, "2")["header"]["shard"]["rules"]
    assert merged["header"]["merged"]["missing"] == [2] and merged["header"]["merged"]["not_merged"] == missing
    assert {r["rule"] for r in merged["results"]}.isdisjoint(missing)
    out = capsys.readouterr()
    assert "(INCOMPLETE: 2/2 missing)" in out.out.splitlines()[0]
    assert f"INCOMPLETE: shard 2/2 not merged; their rules are not in this report: {', '.join(missing)}" in out.err
    assert "**INCOMPLETE: shard 2/2 not merged" in (tmp_path / "m.md").read_text()


@pytest.mark.parametrize("cause, status", [("Ctrl-C", 130), ("SIGTERM", 143)])
def test_an_interrupted_shard_stays_interrupted_by_its_signal(reports, tmp_path, capsys, cause, status):
    """A SIGTERMed shard (a cancelled CI job) was merged as Ctrl-C, exit 130."""
    folder, _ = reports
    two = load(folder, "2")
    cut = two["results"].pop()
    two.update(interrupted=True, not_run=[{"rule": cut["rule"], "target": cut["target"]}])
    two["header"]["interrupted_by"] = cause
    assert main(["report", "merge", str(folder / "1.json"), write(tmp_path / "2.json", two),
                 "--json", str(tmp_path / "m.json")]) == status
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["interrupted"] is True and merged["not_run"] == two["not_run"]
    assert merged["header"]["interrupted_by"] == cause
    assert f"INTERRUPTED ({cause})" in capsys.readouterr().err


@pytest.mark.parametrize("xfail, status", [([], 1), (["rule"], 0)])
def test_the_merge_exit_status_is_verifys(reports, tmp_path, xfail, status):
    folder, _ = reports
    two = load(folder, "2")
    failing = next(r for r in two["results"] if r["target"] == "impl")      # impl claims conformance
    failing["status"] = "FAIL"
    two["header"]["xfail"] = [failing["rule"] for _ in xfail]
    out = installed("report", "merge", str(folder / "1.json"), write(tmp_path / "2.json", two))
    assert out.returncode == status, out.stderr
    assert f"FAIL {failing['rule']} on impl" in out.stdout


def test_the_merge_names_a_failures_cause_across_shards(reports):
    from dsv4spec.properties.merge import merge
    from dsv4spec.properties.suite import checks_for
    folder, _ = reports
    first, second = "IDX.SCORE.FORMULA", "IDX.SCORE.ROUNDING"       # one operation, formula before rounding
    shards = []
    for k, rule in ((1, first), (2, second)):
        report = copy.deepcopy(load(folder, str(k)))
        report["header"].update(rules=[first, second], targets=report["header"]["targets"][:1],
                                shard={"index": k, "count": 2, "rules": [rule]})
        report["results"] = [{"rule": rule, "target": "impl", "status": "FAIL", "detail": "wrong scores",
                              "reproduce": "", "seconds": 0.0, "checks": {c.name: "FAIL" for c in checks_for(rule)}}]
        shards.append((f"{k}.json", report))
    rows = merge(shards).rows
    assert [r.detail for r in rows] == ["wrong scores", f"same cause as {first} (index_scores): wrong scores"]


@pytest.mark.parametrize("value", ["0/3", "4/3", "a/b", "3", "", "1/0", "-1/2"])
def test_a_bad_shard_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["verify", "--target", "impl", f"--shard={value}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --shard: expected K/N, shard K of N with 1 <= K <= N (e.g. 2/4), got {value!r}" in err
    assert err.count("\n") == 1


def test_more_shards_than_rules_is_a_usage_error_in_one_line():
    out = installed("verify", "--target", "impl", "--rules", "FMT.E2M1.RNE,FMT.BF16", "--shard", "1/3")
    assert out.returncode == 2
    assert out.stderr == ("dsv4spec verify: error: --shard 1/3: the selection has 2 rule(s), fewer than 3 shards; "
                          "expected N <= 2\n")


@pytest.mark.parametrize("route", [["--isolate"], ["--jobs", "2"]])
def test_the_worker_routes_get_the_shards_rules_alone(tmp_path, monkeypatch, route):
    from dsv4spec.properties import workers
    given = []

    def fake_run(specs, rule_ids, profile, **_):
        given.append(rule_ids)
        return [], {s: workers.TargetInfo(s, s, claims_conformance=True) for s in specs}
    monkeypatch.setattr(workers, "run", fake_run)
    saved = dict(vars(suite.RUN))
    try:
        main(["verify", *RUN, "--shard", "2/2", *route, "--json", str(tmp_path / "r.json")])
    finally:
        vars(suite.RUN).update(saved)
    assert given == [split([r.id for r in select(["FMT.E4M3", "FP4.PACK"])], 2)[1]]
    assert json.loads((tmp_path / "r.json").read_text())["header"]["shard"]["rules"] == given[0]


@pytest.mark.parametrize("usage, status", [(False, 3), (True, 2)])
def test_a_target_a_shard_could_not_load_keeps_verifys_exit_status(tmp_path, monkeypatch, capsys, usage, status):
    from dsv4spec.properties import workers
    why = "target 'impl' could not be loaded: boom"

    def fake_run(specs, rule_ids, profile, **_):
        return [], {s: workers.TargetInfo(s, s, claims_conformance=True, load_error=why, usage_error=usage)
                    for s in specs}
    monkeypatch.setattr(workers, "run", fake_run)
    saved = dict(vars(suite.RUN))
    paths = [str(tmp_path / f"{k}.json") for k in (1, 2)]
    try:
        main(["verify", *RUN, "--shard", "2/2", "--isolate", "--json", paths[1]])
    finally:
        vars(suite.RUN).update(saved)
    monkeypatch.undo()
    try:
        main(["verify", *RUN, "--shard", "1/2", "--json", paths[0]])
    finally:
        vars(suite.RUN).update(saved)
    capsys.readouterr()
    assert main(["report", "merge", *paths]) == status
    assert f"dsv4spec report merge: error: {why}" in capsys.readouterr().err


@pytest.mark.thorough      # about 7 s on a loaded 2-core machine: a worker imports torch; the cheap test above
def test_a_shard_runs_in_worker_processes_too(reports, tmp_path, capsys):
    folder, _ = reports
    path = tmp_path / "r.json"
    saved = dict(vars(suite.RUN))
    try:
        assert main(["verify", *RUN, "--shard", "2/2", "--isolate", "--json", str(path)]) == 0
    finally:
        vars(suite.RUN).update(saved)
    isolated = json.loads(path.read_text())
    assert isolated["header"]["shard"] == load(folder, "2")["header"]["shard"]
    assert results(isolated) == [dict(r, reproduce=r["reproduce"] and r["reproduce"] + " --isolate")
                                 for r in results(load(folder, "2"))]


def test_help_tells_of_sharding_and_merging(capsys):
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    assert "--shard K/N" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["report", "merge", "--help"])
    assert "--allow-incomplete" in capsys.readouterr().out


def test_the_sharded_ci_example_parses():
    import shlex
    from dsv4spec.cli import build_parser
    text = (Path(HOME) / "docs" / "CLI.md").read_text()
    example = text[text.index("## Sharding over CI jobs"):]
    commands = [line.split("- run: ", 1)[1] for line in example.splitlines() if "- run: dsv4spec" in line]
    verify, merge = [build_parser().parse_args(shlex.split(
        c.replace("${{ matrix.shard }}", "3").replace("r-*.json", "r-1.json r-2.json"))[1:]) for c in commands]
    assert (verify.command, verify.shard, verify.json) == ("verify", (3, 4), "r-3.json")
    assert (merge.command, merge.action, merge.reports) == ("report", "merge", ["r-1.json", "r-2.json"])


THREADED = """
import threading
import dsv4spec.impl as impl
NAME = "threaded"

def e2m1_encode(x):
    if not any(t.name == "left-behind" for t in threading.enumerate()):
        threading.Thread(target=threading.Event().wait, args=(3,), name="left-behind").start()
    return impl.e2m1_encode(x)
"""


def test_a_shards_process_level_finding_is_in_its_json_and_the_merge_exits_as_the_shard_did(tmp_path, capsys):
    """A thread a target leaves running makes each shard exit 1 though every row passes (worker
    route and in-process route alike): the finding is in the JSON, and the merge exits 1 too."""
    (tmp_path / "threaded.py").write_text(THREADED)
    rules = ["--target", "threaded", "--rules", "FMT.E2M1.RNE,FMT.E2M1.SATURATE", "--max-examples", "2", "--quiet"]
    for k, route in ((1, ["--isolate"]), (2, [])):
        shard = installed("verify", *rules, "--shard", f"{k}/2", *route, "--json", f"{k}.json", cwd=tmp_path)
        assert shard.returncode == 1 and "left-behind" in shard.stderr, shard.stdout + shard.stderr
        report = json.loads((tmp_path / f"{k}.json").read_text())
        assert {r["status"] for r in report["results"]} == {"PASS"}
        assert any("left-behind" in f for f in report["header"]["findings"]), report["header"]
    assert main(["report", "merge", *(str(tmp_path / f"{k}.json") for k in (1, 2)), "--json",
                 str(tmp_path / "m.json")]) == 1
    assert "shard 1/2: the target left 1 non-daemon thread(s) running (left-behind)" in capsys.readouterr().err
    assert len(json.loads((tmp_path / "m.json").read_text())["header"]["findings"]) == 2


def test_merge_refuses_a_shard_whose_rows_were_deleted(reports, tmp_path, capsys):
    folder, _ = reports
    two = load(folder, "2")
    gone = two["results"].pop()
    assert main(["report", "merge", str(folder / "1.json"), write(tmp_path / "2.json", two)]) == 2
    err = capsys.readouterr().err
    assert "shard 2's report lacks 1 of its results" in err and f"{gone['rule']} on {gone['target']}" in err


@pytest.mark.parametrize("option", ["--skip", "--xfail"])
def test_merge_refuses_shards_run_with_other_skip_or_xfail_entries(reports, tmp_path, capsys, option):
    folder, _ = reports
    (tmp_path / "list.txt").write_text("FP4.PACK known (ticket 1)\n")
    saved = dict(vars(suite.RUN))
    try:
        main(["verify", *RUN, "--shard", "2/2", option, str(tmp_path / "list.txt"), "--json", str(tmp_path / "2.json")])
    finally:
        vars(suite.RUN).update(saved)
    capsys.readouterr()
    assert main(["report", "merge", str(folder / "1.json"), str(tmp_path / "2.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dsv4spec report: error: not one run: {option} entries differ") and "\n" not in err


@pytest.mark.parametrize("damage", ["header not an object", "result without status", "unknown rule", "targets None"])
def test_a_malformed_report_is_one_line_not_a_traceback(reports, tmp_path, capsys, damage):
    folder, _ = reports
    two = load(folder, "2")
    if damage == "header not an object":
        two["header"] = []
    elif damage == "result without status":
        del two["results"][0]["status"]
    elif damage == "unknown rule":
        two["results"][0]["rule"] = "NO.SUCH.RULE"
    else:
        two["header"]["targets"] = None
    assert main(["report", "merge", str(folder / "1.json"), write(tmp_path / "2.json", two)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsv4spec report: error: {tmp_path / '2.json'}: a malformed report: ") and err.count("\n") == 1
