"""Golden files: generate them with impl, hash them into a manifest, check targets and port outputs.

Layout of one case file `<name>.safetensors`: tensors `in.<input>` and `out.<output>`; metadata
`case`: JSON of the op, the rule and the keyword arguments.  A non-Python port reads the `in.*` tensors, writes its own
`<name>.safetensors` with the same `out.*` names, and `dsv4spec golden check-outputs DIR` compares.
Files are never loaded with pickle: safetensors only.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from .cases import Case, cases

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = "manifest.json"
GENERATOR_VERSION = 1


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def run_case(case: Case, op) -> dict[str, np.ndarray]:
    import torch
    result = op(*(torch.from_numpy(v.copy()) for v in case.inputs.values()), **case.args)
    result = result if isinstance(result, tuple) else (result,)
    if len(result) != len(case.outputs):
        raise ValueError(f"{case.op} returned {len(result)} outputs, expected {case.outputs}")
    return {name: np.ascontiguousarray(_numpy(t)) for name, t in zip(case.outputs, result)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(out: Path = DATA) -> dict:
    """Write every case with impl's outputs and the manifest; returns the manifest."""
    import dsv4spec.impl as impl
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for case in cases():
        tensors = {f"in.{k}": np.ascontiguousarray(v) for k, v in case.inputs.items()}
        tensors.update({f"out.{k}": v for k, v in run_case(case, getattr(impl, case.op)).items()})
        path = out / f"{case.name}.safetensors"
        # One metadata key: safetensors writes several in a random order, which would break
        # bit-for-bit regeneration.
        about = json.dumps({"op": case.op, "rule": case.rule, "args": case.args}, sort_keys=True)
        save_file(tensors, str(path), metadata={"case": about})
        files[path.name] = {"sha256": sha256(path), "rule": case.rule, "op": case.op}
    manifest = {"generator_version": GENERATOR_VERSION, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def verify_manifest(data: Path = DATA) -> list[str]:
    """Problems with the stored goldens: missing files, hash mismatches, files not in the manifest."""
    path = data / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"no golden manifest at {path}; run `dsv4spec golden generate`")
    manifest = json.loads(path.read_text())
    problems = []
    for name, entry in manifest["files"].items():
        f = data / name
        if not f.exists():
            problems.append(f"{name}: listed in the manifest but missing")
        elif sha256(f) != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest (edited by hand?)")
    extra = {p.name for p in data.glob("*.safetensors")} - set(manifest["files"])
    problems += [f"{name}: not in the manifest" for name in sorted(extra)]
    return problems


def load_case(name: str, data: Path = DATA) -> tuple[dict, dict]:
    tensors = load_file(str(data / f"{name}.safetensors"))
    inputs = {k[3:]: v for k, v in tensors.items() if k.startswith("in.")}
    outputs = {k[4:]: v for k, v in tensors.items() if k.startswith("out.")}
    return inputs, outputs


def compare(case: Case, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    """None when equal bit for bit; otherwise the first difference, decoded."""
    for name in case.outputs:
        if name not in got:
            return f"{case.name}: output {name!r} missing"
        a, b = np.asarray(got[name]), want[name]
        if a.shape != b.shape:
            return f"{case.name}.{name}: shape {a.shape}, expected {b.shape}"
        if a.dtype != b.dtype:
            return f"{case.name}.{name}: dtype {a.dtype}, expected {b.dtype}"
        diff = np.flatnonzero(a.reshape(-1).view(np.uint8) != b.reshape(-1).view(np.uint8))
        if diff.size:
            i = int(diff[0]) // a.itemsize
            idx = tuple(int(j) for j in np.unravel_index(i, a.shape))
            return (f"{case.name}.{name}: {diff.size} bytes differ; first at {idx}: "
                    f"got {a.reshape(-1)[i]!r}, expected {b.reshape(-1)[i]!r} (rule {case.rule})")
    return None


def check_target(target, data: Path = DATA) -> list[tuple[str, str, str]]:
    """(case, status, detail) for each golden case against a target: PASS, FAIL or NOT_IMPLEMENTED."""
    results = []
    for case in cases():
        if not target.has(case.op):
            results.append((case.name, "NOT_IMPLEMENTED", f"missing {case.op}"))
            continue
        inputs, want = load_case(case.name, data)
        ordered = {name: inputs[name] for name in case.inputs}     # operations take them positionally
        stored = Case(case.name, case.rule, case.op, ordered, case.args, case.outputs)
        problem = compare(case, run_case(stored, target.op(case.op)), want)
        results.append((case.name, "FAIL" if problem else "PASS", problem or ""))
    return results


def check_outputs(port_dir: Path, data: Path = DATA) -> list[tuple[str, str, str]]:
    """Compare a port's output files (same names and `out.*` tensors) with the goldens."""
    results = []
    for case in cases():
        f = Path(port_dir) / f"{case.name}.safetensors"
        if not f.exists():
            results.append((case.name, "NOT_IMPLEMENTED", f"no {f.name} in {port_dir}"))
            continue
        got = {k[4:]: v for k, v in load_file(str(f)).items() if k.startswith("out.")}
        _, want = load_case(case.name, data)
        problem = compare(case, got, want)
        results.append((case.name, "FAIL" if problem else "PASS", problem or ""))
    return results
