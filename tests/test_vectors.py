"""Vectors at full strength: a port that reads only the exported text vectors is judged by the same
checks as `verify`: each of issue 20's four deviations FAILs on its own rule with decoded bits, a
corrupt or missing output file is ERROR on its own checks, and a correct port passes."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4spec
from dsv4spec.golden import vectors as V
from dsv4spec.properties.target import load_target

sys.path.insert(0, str(Path(__file__).parent))
import vector_port  # noqa: E402

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)
KV_RULES = ["FP4.KV", "FP4.E2M1"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "dsv4spec", "golden", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1"})


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("vectors")
    V.export(root, rules=KV_RULES, level=2)
    return root


def ported(export, tmp_path, deviation=None):
    vector_port.run(export / V.INPUTS, tmp_path / "out", deviation)
    return {row.rule_id: row for row in V.judge(export, tmp_path / "out", rules=KV_RULES)}


def test_a_correct_port_passes_every_rule_it_implements(export, tmp_path):
    rows = ported(export, tmp_path)
    assert {r: row.status for r, row in rows.items()} == dict.fromkeys(rows, "PASS")
    assert "FP4.KV.SCALE" in rows and "missing fp4_e8m0_quantize" in rows["FP4.E2M1.RNE"].detail


# deviation -> (the rule it breaks, the variant named, the other rules that may fail with it)
DEVIATIONS = {
    "ties_away": ("FP4.E2M1.RNE", "matches e2m1_ties=away_from_zero", set()),
    "scale_reciprocal_6": ("FP4.KV.SCALE", None, set()),
    "payload_reciprocal": ("FP4.KV.DIVIDE", "matches scale_apply=reciprocal", set()),
    # a floor of 6·2^-6 also forces the scales of blocks between the two floors: FP4.KV.SCALE's
    # subnormal scales, as verify reports it
    "floor_2^-6": ("FP4.KV.FLOOR", "matches fp4_kv_scale_floor=6x2^-6", {"FP4.KV.SCALE"}),
}


@pytest.mark.parametrize("deviation", list(DEVIATIONS))
def test_each_deviation_fails_on_its_own_rule_with_decoded_bits(export, tmp_path, deviation):
    rule, variant, also = DEVIATIONS[deviation]
    rows = ported(export, tmp_path, deviation)
    failing = {r for r, row in rows.items() if row.status != "PASS"}
    assert rule in failing and failing <= {rule} | also, {r: rows[r].detail[:200] for r in failing}
    detail = rows[rule].detail
    assert rows[rule].status == "FAIL" and "got 0x" in detail and " s=0 e=" in detail and "np." not in detail
    assert variant is None or detail.startswith(variant)
    assert rows[rule].reproduce.endswith(f"--rules {rule}")


def test_each_deviation_is_caught_at_level_1_alone(tmp_path):
    V.export(tmp_path / "in", rules=["FP4.KV", "FP4.E2M1.RNE"], level=1)
    for deviation, (rule, _, _) in DEVIATIONS.items():
        vector_port.run(tmp_path / "in" / V.INPUTS, tmp_path / deviation, deviation)
        rows = {row.rule_id: row.status for row in V.judge(tmp_path / "in", tmp_path / deviation)}
        assert rows[rule] == "FAIL", (deviation, rows)


def test_a_corrupt_or_truncated_file_is_an_error_on_its_own_checks(export, tmp_path):
    vector_port.run(export / V.INPUTS, tmp_path / "out")
    out = tmp_path / "out"
    (out / "FP4.KV.SCALE.txt").write_bytes(b"\x00\xffgarbage\n@ id=x\n")
    lines = (out / "FP4.KV.FLOOR.txt").read_text().splitlines()
    (out / "FP4.KV.FLOOR.txt").write_text("\n".join(lines[:4]) + "\n" + lines[4][:30] + "\n")    # cut mid-line
    (out / "FP4.KV.CLAMP.txt").unlink()
    rows = {row.rule_id: row for row in V.judge(export, out, rules=KV_RULES)}
    assert rows["FP4.KV.SCALE"].status == "ERROR" and "line 1" in rows["FP4.KV.SCALE"].detail
    assert rows["FP4.KV.FLOOR"].status == "ERROR" and "FP4.KV.FLOOR.txt" in rows["FP4.KV.FLOOR"].detail
    assert rows["FP4.KV.CLAMP"].status == "ERROR" and "no output file" in rows["FP4.KV.CLAMP"].detail
    assert all(rows[r].status == "PASS" for r in ("FP4.KV.DIVIDE", "FP4.KV.SATURATE", "FP4.E2M1.RNE"))
    assert not any("Traceback" in row.detail for row in rows.values())


def test_check_vectors_exits_1_on_a_failure_and_prints_no_traceback(export, tmp_path):
    vector_port.run(export / V.INPUTS, tmp_path / "out", "payload_reciprocal")
    result = cli("check-vectors", str(export), str(tmp_path / "out"), "--rules", "FP4.KV")
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert any(line.startswith("FAIL") and "FP4.KV.DIVIDE" in line and "scale_apply=reciprocal" in line
               for line in result.stdout.splitlines())
    vector_port.run(export / V.INPUTS, tmp_path / "clean")
    assert cli("check-vectors", str(export), str(tmp_path / "clean"), "--rules", "FP4.KV").returncode == 0
    missing = cli("check-vectors", str(export), str(tmp_path / "nope"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_a_declared_variant_is_honoured(export, tmp_path):
    vector_port.run(export / V.INPUTS, tmp_path / "out", "payload_reciprocal")
    (tmp_path / "out" / V.PORT).write_text("name=recip\nvariant.scale_apply=reciprocal\n")
    rows = {row.rule_id: row for row in V.judge(export, tmp_path / "out", rules=["FP4.KV.DIVIDE"])}
    assert rows["FP4.KV.DIVIDE"].status == "VARIANT"


def test_the_official_control_passes_bf16_vectors(tmp_path):
    """No false alarms: the official computation, answering BF16 vectors as a port would."""
    V.export(tmp_path / "in", rules=["FP4.KV", "FP4.NONFINITE", "FMT.E2M1"], level=1, bf16=True)
    V.answer(tmp_path / "in", tmp_path / "out", load_target("official"))
    rows = {row.rule_id: row.status for row in V.judge(tmp_path / "in", tmp_path / "out")}
    assert rows and set(rows.values()) == {"PASS"}, rows


def test_records_round_trip_through_their_text_form():
    import numpy as np
    import torch
    values = {"a": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, "b": np.array([1, -1], np.int64),
              "c": torch.tensor([1.5, -0.0]).to(torch.bfloat16), "d": np.array(True), "k": 32, "s": "score",
              "f": 0.1, "n": None, "t": (8, 1)}
    for name, v in values.items():
        (line,) = V.value_lines(name, v)
        back = V.parse_value(line.split())[1]
        if isinstance(v, (np.ndarray, torch.Tensor)):
            assert V.value_lines(name, back) == [line]
        else:
            assert back == v
    with pytest.raises(ValueError, match="3 values for shape"):
        V.parse_value("x f32 1 4 00000000 00000000 00000000".split())


def test_exported_files_are_world_readable(export):
    for path in [export, *export.rglob("*")]:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))


def _kv_mutants():
    from mutants import catalogue
    from dsv4spec.spec.rules import _matches
    return [(n, r, p) for n, r, p in catalogue() if any(_matches(r, k) for k in KV_RULES)]


@pytest.mark.parametrize("name, rule_id, provider", _kv_mutants(), ids=[f"{n}-{r}" for n, r, _ in _kv_mutants()])
def test_every_kv_mutant_fails_its_rule_through_the_vectors(export, tmp_path, name, rule_id, provider):
    """Teeth: the mutants of tests/mutants that break an FP4 KV or E2M1 rule, answering the vectors
    as a port would, are caught on that rule by the vectors alone."""
    from dsv4spec.properties.target import Target
    V.answer(export, tmp_path, Target(provider, name), rules=[rule_id])
    (row,) = [r for r in V.judge(export, tmp_path, rules=[rule_id]) if r.rule_id == rule_id]
    assert row.status == "FAIL", f"mutant {name} survived {rule_id} in the vectors: {row.status} {row.detail}"


def test_a_port_declaring_its_operations_reads_n_i_where_it_wrote_nothing(export, tmp_path):
    """As exec: judges a partial port (here one of fp4_e8m0_quantize alone, judged on the KV rules):
    a rule calling none of the declared operations, without an output file, is n/i (exit 0);
    undeclared, it stays ERROR; so does a declared operation's missing file (a port that crashed
    before writing)."""
    out = tmp_path / "out"
    out.mkdir()

    def status(**kw):
        (row,) = V.judge(export, out, rules=["FP4.KV.SCALE"], **kw)
        return row.status
    assert status() == "ERROR"
    (out / V.PORT).write_text("ops=fp4_e8m0_quantize\n")
    assert status() == "n/i" and status(ops="fp4_e4m3_quantize") == "ERROR"
    with pytest.raises(ValueError, match="--ops names operations the contract does not know: fp4_quantize"):
        status(ops="fp4_quantize")
    result = cli("check-vectors", str(export), str(out), "--rules", "FP4.KV")
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(line.startswith("n/i") and "FP4.KV.SCALE" in line and "missing fp4_e4m3_quantize" in line
               for line in result.stdout.splitlines()), result.stdout


def test_declaring_no_operation_or_writing_empty_files_is_never_green(export, tmp_path):
    """`ops=` empty in port.txt or `--ops ""` is a usage error (exit 2), never every rule n/i; a
    declared operation's 0-byte output file is ERROR (its records are unanswered), as a missing one
    is; a FIFO is refused without being read."""
    import os
    out = tmp_path / "out"
    out.mkdir()
    (out / V.PORT).write_text("ops=\n")
    for extra in ((), ("--ops", "")):
        result = cli("check-vectors", str(export), str(out), "--rules", "FP4.KV.SCALE", *extra)
        assert result.returncode == 2 and "declares no operation" in result.stderr, result.stdout + result.stderr
    (out / V.PORT).write_text("ops=fp4_e4m3_quantize,e2m1_encode\n")
    for rule in ("FP4.KV.SCALE", "FP4.E2M1.RNE"):
        (out / V.rule_file(rule)).write_bytes(b"")
    (row,) = V.judge(export, out, rules=["FP4.KV.SCALE"])
    assert row.status == "ERROR" and "no output for vector" in row.detail, row.detail
    (rne,) = V.judge(export, out, rules=["FP4.E2M1.RNE"])
    assert rne.status == "ERROR", rne.detail
    (out / V.rule_file("FP4.KV.SCALE")).unlink()
    os.mkfifo(out / V.rule_file("FP4.KV.SCALE"))
    (row,) = V.judge(export, out, rules=["FP4.KV.SCALE"])
    assert row.status == "ERROR" and "is not a regular file" in row.detail, row.detail
