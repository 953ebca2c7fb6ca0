"""A port in another language: `golden export` writes the inputs and their layout, the port writes
its outputs, `golden check-outputs` judges them by rule and fails on anything missing."""
import json
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


def cli(*args):
    return subprocess.run([sys.executable, "-m", "dsv4spec", "golden", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": HOME, "TRITON_INTERPRET": "1"})


def port(inputs: Path, outputs: Path):
    """A 'port' that reads only the exported files (impl stands in for the foreign code)."""
    outputs.mkdir(exist_ok=True)
    for f in sorted(inputs.glob("*.safetensors")):
        with safe_open(str(f), "np") as handle:
            case = json.loads(handle.metadata()["case"])
        tensors = load_file(str(f))
        inputs = {n: torch.from_numpy(tensors[f"in.{n}"]) for n in case["inputs"]}
        if case["call"] == "mapping":
            named = getattr(impl, case["op"])(inputs, **case["args"])
            result = [named[n] for n in case["outputs"]]
        else:
            extra = [case["args"][k] for k in case["positional"]]
            keywords = {k: v for k, v in case["args"].items() if k not in case["positional"]}
            result = getattr(impl, case["op"])(*inputs.values(), *extra, **keywords)
            result = result if isinstance(result, tuple) else (result,)
        save_file({f"out.{n}": np.ascontiguousarray(t.numpy()) for n, t in zip(case["outputs"], result)},
                  str(outputs / f.name))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    result = cli("export", str(root / "in"))
    assert result.returncode == 0, result.stderr
    port(root / "in", root / "out")
    return root


def test_exported_inputs_hold_no_expected_outputs_and_are_described(exported):
    files = sorted((exported / "in").glob("*.safetensors"))
    assert files and all(not any(k.startswith("out.") for k in load_file(str(f))) for f in files)
    layout = (exported / "in" / "LAYOUT.md").read_text()
    assert all(f"## {f.name}" in layout for f in files) and "`out.scales` | uint8" in layout


def test_outputs_of_a_correct_port_pass(exported):
    result = cli("check-outputs", str(exported / "out"))
    assert result.returncode == 0, result.stdout
    assert "PASS     FP4.KV.SCALE" in result.stdout


def test_one_flipped_byte_fails_on_its_rule(exported, tmp_path):
    for f in (exported / "out").glob("*.safetensors"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(tmp_path / "fp4_e4m3_kv.safetensors"))
    tensors["out.scales"][3, 5] ^= 1
    save_file(tensors, str(tmp_path / "fp4_e4m3_kv.safetensors"))
    result = cli("check-outputs", str(tmp_path))
    assert result.returncode == 1
    failing = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and failing[0].split()[1] == "FP4.KV.SCALE" and "at (3, 5)" in failing[0]


def test_an_empty_or_wrong_folder_fails(tmp_path):
    empty = cli("check-outputs", str(tmp_path))
    assert empty.returncode == 1 and "MISSING" in empty.stdout and "0 of" in empty.stdout
    wrong = cli("check-outputs", str(tmp_path / "nope"))
    assert wrong.returncode == 2 and "is not a directory" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_partial_port_selects_its_rules_and_a_missing_tensor_fails(exported, tmp_path):
    (tmp_path / "fp4_e4m3_kv.safetensors").write_bytes((exported / "out" / "fp4_e4m3_kv.safetensors").read_bytes())
    assert cli("check-outputs", str(tmp_path), "--rules", "FP4.KV").returncode == 0
    tensors = load_file(str(tmp_path / "fp4_e4m3_kv.safetensors"))
    save_file({"out.packed": tensors["out.packed"]}, str(tmp_path / "fp4_e4m3_kv.safetensors"))
    result = cli("check-outputs", str(tmp_path), "--rules", "FP4.KV")
    assert result.returncode == 1 and "no tensor out.scales" in result.stdout


def test_text_vectors_are_one_line_each_with_rule_and_hex_bits(exported):
    lines = (exported / "in" / "vectors" / "e2m1_encode.txt").read_text().splitlines()
    for line in lines:
        rule, op, x, arrow, code = line.split()
        value = np.array([int(x, 16)], dtype=np.uint32).view(np.float32)
        assert rule.startswith("FMT.E2M1.") and op == "e2m1_encode" and arrow == "->"
        assert int(code, 16) == int(impl.e2m1_encode(torch.from_numpy(value))[0])      # impl agrees with the spec
    block = (exported / "in" / "vectors" / "fp4_e4m3_kv.txt").read_text().splitlines()[0].split()
    assert block[:2] == ["FP4.KV.SCALE", "fp4_e4m3_quantize"] and len(block) == 2 + 16 + 1 + 8 + 1 + 1
