"""Goldens: the stored files match their manifest, the generator reproduces them bit for bit on
every numpy CPU dispatch level, checks impl against spec/ as it writes, never overwrites the stored
files by accident, and targets are gated on them."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dsv4spec.golden import store
from dsv4spec.golden.cases import splitmix64
from dsv4spec.golden.catalog import cases
from dsv4spec.spec import formats as F
from dsv4spec.properties.target import Target, load_target
from mutants import mutant


def test_manifest_matches_the_stored_files():
    assert store.verify_manifest() == []


def test_generator_reproduces_every_file_bit_for_bit(tmp_path):
    manifest = store.generate(tmp_path)
    stored = json.loads((store.DATA / store.MANIFEST).read_text())
    assert manifest == stored


def dispatch_levels() -> list[str]:
    """NPY_DISABLE_CPU_FEATURES values from everything on down to numpy's baseline: each level
    switches off one more of the dispatch targets this CPU supports (highest first)."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:                                  # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    available = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    return [" ".join(available[i:]) for i in range(len(available), -1, -1)]


GENERATE = """
import json, sys
from pathlib import Path
try:
    from numpy._core._multiarray_umath import __cpu_features__
except ImportError:
    from numpy.core._multiarray_umath import __cpu_features__
from dsv4spec.golden import store
off = sys.argv[2].split()
assert not any(__cpu_features__[f] for f in off), f"numpy did not switch off {off}"
print(json.dumps(store.generate(Path(sys.argv[1]))))
"""


@pytest.mark.parametrize("disabled", dispatch_levels(), ids=lambda d: "off:" + (d.replace(" ", "+") or "none"))
def test_generator_gives_the_same_bits_on_every_numpy_dispatch_level(tmp_path, disabled):
    """The inputs use integer and exactly rounded arithmetic only, so numpy's SIMD paths (AVX-512,
    AVX2/FMA3, baseline) cannot change a bit; torch's kernels at their lowest level check impl's
    side (ATEN_CPU_CAPABILITY=default) when numpy is at its baseline too."""
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": disabled}
    if disabled and disabled == dispatch_levels()[-1]:
        env["ATEN_CPU_CAPABILITY"] = "default"
    run = subprocess.run([sys.executable, "-c", GENERATE, str(tmp_path), disabled], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    stored = json.loads((store.DATA / store.MANIFEST).read_text())
    assert json.loads(run.stdout.splitlines()[-1]) == stored


def test_generate_refuses_to_overwrite_the_stored_goldens():
    before = store.sha256(store.DATA / store.MANIFEST)
    with pytest.raises(FileExistsError, match="--force"):
        store.generate(store.DATA)
    from dsv4spec.cli import main
    assert main(["golden", "generate"]) == 2
    assert store.sha256(store.DATA / store.MANIFEST) == before and store.verify_manifest() == []


def test_generator_checks_impl_against_spec(tmp_path, monkeypatch):
    import dsv4spec.impl as impl
    right = impl.fp8_quantize

    def one_code_off(x, block):
        q, scales = right(x, block)
        q = q.clone()
        q.view(-1)[7] ^= 1
        return q, scales

    monkeypatch.setattr(impl, "fp8_quantize", one_code_off)
    with pytest.raises(RuntimeError, match=r"fp8_v4_main_kv.q: 1 bytes differ from spec/; first at \(0, 7\)"):
        store.generate(tmp_path)


def test_codec_inputs_are_bf16_and_sit_on_the_boundaries():
    """Every codec input is a BF16 value (the official domain), and each holds the E2M1 or E4M3
    ties at scale 1 and amaxes one BF16 ulp either side of 6·2^k or 448·2^k."""
    for case in cases()[:5]:
        x = case.inputs["x"]
        assert np.array_equal(F.bf16_round(x), x, equal_nan=False), case.name
        top = 448.0 if case.op == "fp8_quantize" else 6.0
        ties = (1.0625, 17.0, 240.0) if top == 448.0 else (0.25, 0.75, 5.0)
        assert all(np.any(x == t) for t in ties), case.name
        edge = F.f32_from_bits(F.f32_bits(np.float32(top)) + np.array([-0x10000, 0x10000]))
        assert all(np.any(np.abs(x) == e) for e in edge), case.name


def test_splitmix64_matches_a_scalar_reference():
    """The vectorized stream equals the scalar algorithm (Python integers, explicit 64-bit masks);
    seeded with 0 its first outputs are the well-known 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4."""
    mask = (1 << 64) - 1

    def scalar(seed, n):
        state, out = seed, []
        for _ in range(n):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            out.append(z ^ (z >> 31))
        return out

    assert [int(w) for w in splitmix64(12345, 1000)] == scalar(12345, 1000)
    assert [hex(int(w)) for w in splitmix64(0, 2)] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]


@pytest.mark.parametrize("name", ["impl", "official", "kernels"])
def test_builtin_targets_reproduce_the_goldens(name):
    """impl and official pass every case (official's quantizers receive BF16 tensors, as they
    declare; its int32 index lists compare by value); kernels passes every case of an operation it
    has (it lacks the index lists, kv_qdq and the layer operation)."""
    target = load_target(name)
    results = store.check_target(target)
    assert all(status == "PASS" for _, status, _ in results if status != "n/i"), results
    missing = {case for case, status, _ in results if status == "n/i"}
    ops = {case.name: case.op for case in cases()}
    bf16_only = {case for case in FP32_CASES if target.input_dtype(ops[case]) == "bfloat16"}
    assert all(not target.has(ops[case]) for case in missing - bf16_only)
    assert (len(missing) < len(results) - 10) if name == "kernels" else missing == bf16_only
    assert bf16_only == (set(FP32_CASES) if name == "official" else set())


FP32_CASES = ("fp4_e4m3_kv_fp32", "fp4_e8m0_index_fp32", "fp8_fp32_log2")


def test_a_bf16_quantizer_is_not_asked_the_fp32_cases():
    results = {n: (s, d) for n, s, d in store.check_target(load_target("official"), names=set(FP32_CASES))}
    assert all(s == "n/i" and "takes bfloat16" in d for s, d in results.values()) and len(results) == 3


def _planted(name):
    """A Python port with one deviation a Rust port planted (tests/mutants/quant.py)."""
    from mutants import quant as Q
    if name == "e4m3_scale_from_amax_times_fl32_one_sixth":
        return mutant(name, fp4_e4m3_quantize=Q.MUTANTS["kv_scale_reciprocal_6"].fp4_e4m3_quantize)
    log2 = Q.exponent_float_log2
    return mutant(name, fp4_e8m0_quantize=lambda x: Q.fp4_idx(x, exponent=log2),
                  fp8_quantize=lambda x, block: Q.fp8(x, block, exponent=log2))


@pytest.mark.parametrize("deviation, failing", [
    ("e4m3_scale_from_amax_times_fl32_one_sixth", {"fp4_e4m3_kv_fp32"}),
    ("e8m0_exponent_from_a_float_log2", {"fp4_e8m0_index_fp32", "fp8_fp32_log2"}),
])
def test_the_planted_scale_deviations_fail_the_fp32_golden_cases(deviation, failing):
    """No BF16 amax tells these apart (spec/formats.py, e8m0_rounding; FP4.KV.SCALE): the BF16
    codec cases pass them, the fp32 cases built on their boundaries fail them."""
    codec = {"fp4_e4m3_kv", "fp4_e8m0_index", "fp8_v4_main_kv", "fp8_v41_swa", "fp8_v32_index", *FP32_CASES}
    results = {n: (s, d) for n, s, d in store.check_target(Target(_planted(deviation), deviation), names=codec)}
    assert {n for n, (s, _) in results.items() if s != "PASS"} == failing, results
    assert all(results[n][0] == "FAIL" and "differ from the golden" in results[n][1] for n in failing)


def test_a_wrong_codec_is_caught_by_the_goldens():
    import dsv4spec.impl as impl

    def lossy(x):
        packed, scales = impl.fp4_e4m3_quantize(x)
        return packed ^ (0x11 * (packed == 0x22)).to(packed.dtype), scales  # one code pair remapped

    results = dict((n, s) for n, s, _ in store.check_target(Target(mutant("golden", fp4_e4m3_quantize=lossy), "m")))
    assert results["fp4_e4m3_kv"] == "FAIL"


def test_port_outputs_are_compared(tmp_path):
    from safetensors.numpy import save_file
    case = cases()[0]
    _, want = store.load_case(case.name)
    save_file({f"out.{k}": v for k, v in want.items()}, str(tmp_path / f"{case.name}.safetensors"))
    results = by_case(store.check_outputs(tmp_path))
    assert results[case.name] == "PASS"
    broken = {k: v.copy() for k, v in want.items()}
    first = next(iter(broken))
    broken[first].reshape(-1)[0] ^= np.array(1, dtype=broken[first].dtype)
    save_file({f"out.{k}": v for k, v in broken.items()}, str(tmp_path / f"{case.name}.safetensors"))
    assert by_case(store.check_outputs(tmp_path))[case.name] == "FAIL"


def by_case(results) -> dict:
    """check_outputs' (rule, status, detail) rows by case: several cases gate one rule."""
    import re
    return {re.match(r"\w+", detail).group(): status for _, status, detail in results}


@pytest.mark.parametrize("manifest, says", [
    ("{not json", "malformed: not readable JSON"),
    ('{"files": []}', 'malformed: expected an object with "files"'),
    ('{"files": {"fp4_e4m3_kv.safetensors": "abc"}}', "fp4_e4m3_kv.safetensors: malformed entry 'abc'"),
    ('{"files": {"../outside.safetensors": {"sha256": "00"}}}', "'../outside.safetensors': not a file name of the "
                                                                "data folder (refused, never opened)"),
])
def test_golden_manifest_validates_a_malformed_manifest_in_one_line(tmp_path, monkeypatch, capsys, manifest, says):
    from dsv4spec.cli import main
    data = tmp_path / "data"
    data.mkdir()
    (data / store.MANIFEST).write_text(manifest)
    (tmp_path / "outside.safetensors").write_bytes(b"secret")
    opened = []
    real_sha256 = store.sha256
    monkeypatch.setattr(store, "sha256", lambda f: opened.append(f) or real_sha256(f))
    monkeypatch.setattr(store, "DATA", data)
    assert main(["golden", "manifest"]) == 1
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and says in out.err and "Traceback" not in out.err, out.err
    assert out.out.strip() == "manifest: 1 problems" and not opened
