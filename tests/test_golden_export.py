"""A port in another language: `golden export` writes the golden cases' inputs (cases/, text and
safetensors) and their layout, the port writes its outputs, `golden check-outputs` judges them by
case and fails on anything missing or unreadable.  (The per-check vectors: tests/test_vectors.py.)"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import dsv4spec
import dsv4spec.impl as impl

HOME = str(Path(dsv4spec.__file__).resolve().parent.parent)


# The rules the golden cases gate (the layer cases' PATH.LAYER aside: 100 MB of weights, --layers)
GATING = ["FP4.KV.SCALE", "FP4.IDX.SCALE", "FP8.SCALE", "IDX.SCORE.FP4", "IDX.SCORE.ROUNDING", "IDX.SCORE.V32_FP32",
          "IDX.TOPK.ORDER", "POOL.TOPK_BLOCKS", "PATH.WINDOW", "PATH.HCA", "PATH.CONCAT", "PATH.QDQ"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "dsv4spec", "golden", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1"})


def _args(text: str) -> dict:
    pairs = (item.partition("=") for item in text.split())
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, _, v in pairs}


def port(inputs: Path, outputs: Path):
    """A 'port' that reads only the exported safetensors files and their flat metadata (impl stands
    in for the foreign code)."""
    outputs.mkdir(exist_ok=True)
    for f in sorted(inputs.glob("*.safetensors")):
        with safe_open(str(f), "np") as handle:
            case = handle.metadata()
        tensors = load_file(str(f))
        inputs = {n: torch.from_numpy(tensors[f"in.{n}"]) for n in case["inputs"].split(",") if n}
        args, positional, names = _args(case["args"]), case["positional"].split(",") if case["positional"] else [], \
            case["outputs"].split(",")
        if case["call"] == "mapping":
            named = getattr(impl, case["op"])(inputs, **args)
            result = [named[n] for n in names]
        else:
            extra = [args[k] for k in positional]
            keywords = {k: v for k, v in args.items() if k not in positional}
            result = getattr(impl, case["op"])(*inputs.values(), *extra, **keywords)
            result = result if isinstance(result, tuple) else (result,)
        save_file({f"out.{n}": np.ascontiguousarray(t.numpy()) for n, t in zip(names, result)},
                  str(outputs / f.name))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    result = cli("export", str(root / "in"), "--level", "1", "--rules", ",".join(GATING))
    assert result.returncode == 0, result.stderr
    assert " MB, to " in result.stdout
    port(root / "in" / "cases", root / "out")
    return root


def test_exported_inputs_hold_no_expected_outputs_and_are_described(exported):
    files = sorted((exported / "in" / "cases").glob("*.safetensors"))
    assert files and all(not any(k.startswith("out.") for k in load_file(str(f))) for f in files)
    layout = (exported / "in" / "LAYOUT.md").read_text()
    assert all(f"### cases/{f.name}" in layout for f in files) and "`out.scales` | uint8" in layout
    for words in ("8-byte little-endian", "__metadata__", "safetensors#format", "`NAME f32 RANK", "`@ id=N`",
                  "level 1", "error=", "check-vectors"):
        assert words in layout, words
    assert "index_layer_v41_l2" not in layout and "--layers" in layout        # 100 MB of weights: on request


def test_outputs_of_a_correct_port_pass(exported):
    result = cli("check-outputs", str(exported / "out"), "--rules", ",".join(GATING))
    assert result.returncode == 0, result.stdout
    assert "PASS     FP4.KV.SCALE" in result.stdout


def test_one_flipped_byte_fails_on_its_rule_decoded(exported, tmp_path):
    for f in (exported / "out").glob("*.safetensors"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(tmp_path / "fp4_e4m3_kv.safetensors"))
    tensors["out.scales"][3, 5] ^= 1
    save_file(tensors, str(tmp_path / "fp4_e4m3_kv.safetensors"))
    result = cli("check-outputs", str(tmp_path), "--rules", ",".join(GATING))
    assert result.returncode == 1
    failing = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and failing[0].split()[1] == "FP4.KV.SCALE" and "at (3, 5)" in failing[0]
    assert " s=0 e=" in failing[0] and "np." not in failing[0]


def test_a_corrupt_output_file_is_an_error_on_its_case_and_the_others_are_judged(exported, tmp_path):
    for f in (exported / "out").glob("*.safetensors"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    data = (tmp_path / "fp4_e4m3_kv.safetensors").read_bytes()
    (tmp_path / "fp4_e4m3_kv.safetensors").write_bytes(data[:len(data) // 2])          # truncated
    result = cli("check-outputs", str(tmp_path), "--rules", ",".join(GATING))
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert [line.split()[:2] for line in lines if not line.startswith("PASS") and line.strip()][0] == \
        ["ERROR", "FP4.KV.SCALE"]
    assert sum(line.startswith("PASS") for line in lines) == len([f for f in tmp_path.iterdir()]) - 1


def copy_outputs(exported: Path, to: Path, *names: str):
    for name in names:
        (to / f"{name}.safetensors").write_bytes((exported / "out" / f"{name}.safetensors").read_bytes())


def test_text_outputs_are_read_like_safetensors(exported, tmp_path):
    from dsv4spec.golden import vectors as V
    tensors = load_file(str(exported / "out" / "fp4_e4m3_kv.safetensors"))
    lines = [line for name in ("packed", "scales") for line in V.value_lines(name, tensors[f"out.{name}"])]
    (tmp_path / "fp4_e4m3_kv.txt").write_text("@ case=fp4_e4m3_kv\n" + "\n".join(lines) + "\n")
    copy_outputs(exported, tmp_path, "fp4_e4m3_kv_fp32")       # FP4.KV.SCALE's other case
    assert cli("check-outputs", str(tmp_path), "--rules", "FP4.KV").returncode == 0
    (tmp_path / "fp4_e4m3_kv.txt").write_text("@ case=fp4_e4m3_kv\n" + lines[0][:40] + "\n")
    result = cli("check-outputs", str(tmp_path), "--rules", "FP4.KV")
    assert result.returncode == 1 and "ERROR" in result.stdout and "values for shape" in result.stdout


def test_an_empty_or_wrong_folder_fails(tmp_path):
    empty = cli("check-outputs", str(tmp_path))
    assert empty.returncode == 1 and "MISSING" in empty.stdout and "0 of" in empty.stdout
    wrong = cli("check-outputs", str(tmp_path / "nope"))
    assert wrong.returncode == 2 and "is not a directory" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_partial_port_selects_its_rules_and_a_missing_tensor_fails(exported, tmp_path):
    copy_outputs(exported, tmp_path, "fp4_e4m3_kv", "fp4_e4m3_kv_fp32")
    assert cli("check-outputs", str(tmp_path), "--rules", "FP4.KV").returncode == 0
    tensors = load_file(str(tmp_path / "fp4_e4m3_kv.safetensors"))
    save_file({"out.packed": tensors["out.packed"]}, str(tmp_path / "fp4_e4m3_kv.safetensors"))
    result = cli("check-outputs", str(tmp_path), "--rules", "FP4.KV")
    assert result.returncode == 1 and "no output scales" in result.stdout


def test_case_text_form_needs_no_json(exported):
    from dsv4spec.golden import vectors as V
    text = (exported / "in" / "cases" / "fp8_v41_swa.txt").read_text().splitlines()
    head = V.parse_header(text[0])
    assert head["case"] == "fp8_v41_swa" and head["inputs"] == "x" and "positional" not in head   # block: by keyword
    assert int(head["lines"]) == len(text) - 1 and text[-1] == "block int 32"
    name, x = V.parse_value(text[1].split())
    assert name == "x" and x.dtype == np.float32 and x.shape[-1] == 512


def test_a_port_declaring_its_operations_reads_n_i_for_the_cases_it_leaves_out(exported, tmp_path):
    """As exec: judges a partial port: a case of an undeclared operation without a file is n/i (exit
    0; a kv_qdq case is its per-format operation's); a declared operation's missing case stays MISSING."""
    from dsv4spec.golden import store
    copy_outputs(exported, tmp_path, "fp4_e4m3_kv", "fp4_e4m3_kv_fp32", "kv_qdq_fp4_e4m3")
    (tmp_path / "port.txt").write_text("ops=fp4_e4m3_quantize,kv_qdq_fp4_e4m3\n")
    result = cli("check-outputs", str(tmp_path), "--rules", "FP4,FP8,PATH.QDQ")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split()[:2] for line in result.stdout.splitlines() if line[:1] in ("P", "n")]
    assert rows.count(["PASS", "FP4.KV.SCALE"]) == 2 and rows.count(["PASS", "PATH.QDQ"]) == 1   # two cases gate it
    assert ["n/i", "FP4.IDX.SCALE"] in rows and ["n/i", "FP8.SCALE"] in rows and ["n/i", "PATH.QDQ"] in rows
    declared = store.check_outputs(tmp_path, rules=["FP8"], ops="fp4_e4m3_quantize,fp8_quantize")
    assert {status for _, status, _ in declared} == {"MISSING"}


def test_declaring_no_operation_or_writing_zero_bytes_is_never_green(tmp_path):
    """`ops=` empty or `--ops ""` is a usage error (exit 2), not every case n/i; a 0-byte output
    file is ERROR; a FIFO where an output belongs is refused in one line, never read (it would block)."""
    import os
    (tmp_path / "port.txt").write_text("ops=\n")
    for extra in ((), ("--ops", "")):
        result = cli("check-outputs", str(tmp_path), "--rules", "FP4.KV", *extra)
        assert result.returncode == 2 and "declares no operation" in result.stderr, result.stdout + result.stderr
    (tmp_path / "port.txt").write_text("ops=fp4_e4m3_quantize\n")
    (tmp_path / "fp4_e4m3_kv.safetensors").write_bytes(b"")
    os.mkfifo(tmp_path / "fp4_e4m3_kv_fp32.txt")
    result = subprocess.run([sys.executable, "-m", "dsv4spec", "golden", "check-outputs", str(tmp_path), "--rules",
                             "FP4.KV"], capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME})
    rows = [line.split(None, 2) for line in result.stdout.splitlines() if line.startswith(("ERROR", "PASS", "n/i"))]
    assert result.returncode == 1 and [r[0] for r in rows] == ["ERROR", "ERROR"], result.stdout + result.stderr
    assert "fp4_e4m3_kv_fp32.txt is not a regular file" in result.stdout and "Traceback" not in result.stdout
