"""Goldens: the stored files match their manifest, the generator reproduces them bit for bit, and
targets are gated on them."""
import json

import numpy as np
import pytest

from dsv4spec.golden import store
from dsv4spec.golden.cases import cases, splitmix64
from dsv4spec.properties.target import Target, load_target
from mutants import mutant


def test_manifest_matches_the_stored_files():
    assert store.verify_manifest() == []


def test_generator_reproduces_every_file_bit_for_bit(tmp_path):
    manifest = store.generate(tmp_path)
    stored = json.loads((store.DATA / store.MANIFEST).read_text())
    assert manifest == stored


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


@pytest.mark.parametrize("name", ["impl", "kernels"])
def test_builtin_targets_reproduce_the_goldens(name):
    results = store.check_target(load_target(name))
    assert all(status == "PASS" for _, status, _ in results), results


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
    results = {rule: s for rule, s, _ in store.check_outputs(tmp_path)}
    assert results[case.rule] == "PASS"
    broken = {k: v.copy() for k, v in want.items()}
    first = next(iter(broken))
    broken[first].reshape(-1)[0] ^= np.array(1, dtype=broken[first].dtype)
    save_file({f"out.{k}": v for k, v in broken.items()}, str(tmp_path / f"{case.name}.safetensors"))
    assert {rule: s for rule, s, _ in store.check_outputs(tmp_path)}[case.rule] == "FAIL"
