"""Report files: written atomically over regular files, through anything else (a symbolic link
keeps pointing where it did; a FIFO or a device stays what it is), with the mode `open` gives."""
import os
import stat

import pytest

from dsv4spec.properties.report import check_writable, write_atomically


def test_a_regular_file_is_replaced_with_mode_0644(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "r.json"
        write_atomically(str(path), "one")
        assert path.read_text() == "one" and stat.S_IMODE(path.stat().st_mode) == 0o644
        path.chmod(0o640)
        write_atomically(str(path), "two")
        assert path.read_text() == "two" and stat.S_IMODE(path.stat().st_mode) == 0o640   # its own mode kept
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "reports").mkdir()
    target = tmp_path / "reports" / "latest.json"
    target.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    check_writable(str(link))
    write_atomically(str(link), "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    dangling = tmp_path / "d.json"
    dangling.symlink_to(tmp_path / "reports" / "fresh.json")
    write_atomically(str(dangling), "made")
    assert dangling.is_symlink() and (tmp_path / "reports" / "fresh.json").read_text() == "made"


def test_a_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # the reader is there before the write
    try:
        check_writable(str(fifo))
        write_atomically(str(fifo), "through the pipe")
        got = os.read(reader, 100)
    finally:
        os.close(reader)
    assert got == b"through the pipe" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def _device(tmp_path, name, minor):
    """A character device node like /dev/null (1, 3) or /dev/full (1, 7), in the temporary folder."""
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")
    return node


def test_a_null_device_is_written_through_and_stays_a_device(tmp_path):
    null = _device(tmp_path, "null", 3)
    check_writable(str(null))
    write_atomically(str(null), "discarded")
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["null"]


def test_a_full_device_is_an_error_in_one_line_and_stays_a_device(tmp_path):
    full = _device(tmp_path, "full", 7)
    with pytest.raises(ValueError, match="cannot write report .*full: No space left on device"):
        write_atomically(str(full), "x" * 10000)
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_exported_goldens_get_the_mode_open_gives(tmp_path):
    from dsv4spec.golden.store import export
    old = os.umask(0o022)
    try:
        export(tmp_path / "out", rules=["FP8.SCALE"])
    finally:
        os.umask(old)
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in written)     # safetensors alone would make these 0600
    assert {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o644}


def test_one_word_for_a_missing_operation_everywhere():
    from dsv4spec.cli import Progress
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import NOT_IMPLEMENTED, Row
    rows = [Row("FMT.E2M1.RNE", "mine", NOT_IMPLEMENTED, "missing e2m1_encode")]
    assert NOT_IMPLEMENTED == "n/i"
    for text in (report.to_json(rows, {}), report.to_junit(rows), report.to_markdown(rows), report.terminal(rows)):
        assert "n/i" in text and "NOT_IMPLEMENTED" not in text
    progress = Progress(1, quiet=False, tty=False)
    progress(rows[0])
    assert progress._counts() == "1 n/i"
    from types import SimpleNamespace

    from dsv4spec.golden import store
    from dsv4spec.properties.target import Target
    golden = store.check_target(Target(SimpleNamespace(NAME="none", index_visible=lambda p, r: p), "none"))
    assert golden and {status for _, status, _ in golden} == {"n/i"}


def test_the_header_shows_the_examples_a_check_costs_per_rule():
    from dsv4spec.cli import main  # noqa: F401 -- the header is the CLI's
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import examples_per_check
    sizes = examples_per_check(["FMT.E2M1.RNE", "POOL.SIZE", "CMP.GATE"], "ci")
    assert sizes == {"FMT.E2M1.RNE": 400, "POOL.SIZE": 25, "CMP.GATE": 25}
    header = {"tool": {"version": "0"}, "spec": {"digest": "d"}, "profile": "ci", "seed": None,
              "examples_per_check": sizes}
    assert "profile ci (25–400 examples a check)" in report.header_line(header)


def test_the_header_names_the_slowest_rules():
    from dsv4spec.properties import report
    from dsv4spec.properties.suite import PASS, Row
    rows = [Row("FMT.E2M1.RNE", "impl", PASS, seconds=0.2), Row("POOL.SIZE", "impl", PASS, seconds=12.5)]
    header = {"tool": {"version": "0"}, "spec": {"digest": "d"}, "profile": "ci", "seed": None,
              "slowest": report.slowest(rows)}
    assert header["slowest"] == [{"rule": "POOL.SIZE", "target": "impl", "seconds": 12.5}]
    assert report.header_line(header).endswith("; slowest: POOL.SIZE on impl 12.5 s")


SCHEMA = os.path.join(os.path.dirname(__import__("dsv4spec.properties.report").properties.report.__file__),
                      "report.schema.json")


def _validator():
    import json
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(SCHEMA))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_json_report_validates_against_the_shipped_schema(tmp_path, capsys, monkeypatch):
    import json
    from dsv4spec.cli import main
    from dsv4spec.properties.suite import RUN
    monkeypatch.setattr(RUN, "max_examples", RUN.max_examples)      # given back after main's --max-examples
    path = tmp_path / "r.json"
    assert main(["verify", "--target", "impl", "--target", "ml_dtypes", "--rules", "FMT.E4M3,FP4.PACK", "--quiet",
                 "--max-examples", "10", "--json", str(path)]) == 0     # the report's form, not the examples
    report = json.loads(path.read_text())
    assert {r["status"] for r in report["results"]} >= {"PASS", "FAIL", "n/i"}      # ml_dtypes: FAIL and n/i
    validator = _validator()
    validator.validate(report)
    report["results"][0]["status"] = "NOT_IMPLEMENTED"                              # version 2's word
    assert not validator.is_valid(report)


def test_an_interrupted_report_validates_too():
    import json
    from dsv4spec.properties.report import to_json
    from dsv4spec.properties.suite import FAIL, Row
    header = json.loads(open(SCHEMA).read())["properties"]["header"]["required"]
    values = {"tool": {"name": "dsv4spec", "version": "0"}, "spec": {"rules": 1, "digest": "0" * 16}, "targets": [],
              "profile": "ci", "seed": None, "timeout_s": 60.0, "examples_per_check": {"FMT.E2M1.RNE": 400},
              "rules": "all", "workers": 1, "worker_devices": [], "isolate": False, "python": "3", "torch": "2",
              "device": "cpu", "gpus": [], "date": "d", "command": "c"}
    assert set(values) == set(header)
    text = to_json([Row("FMT.E2M1.RNE", "mine", FAIL, "x")], values, True, [("FMT.E4M3.RNE", "mine")])
    _validator().validate(json.loads(text))
