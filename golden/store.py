"""Golden files: generate them with impl, hash them into a manifest, check targets and port outputs.

Layout of one case file `<name>.safetensors`: tensors `in.<input>` and `out.<output>`; metadata
`case`: JSON of the op, the rule and the keyword arguments.  A non-Python port reads the `in.*` tensors, writes its own
`<name>.safetensors` with the same `out.*` names, and `dsv4spec golden check-outputs DIR` compares.
Files are never loaded with pickle: safetensors only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from .cases import Case, built, cases, spec_outputs
from .layers import rebuild

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = "manifest.json"
GENERATOR_VERSION = 2


def _numpy(t) -> np.ndarray:
    """A result as numpy; BF16 widens exactly to float32 (numpy has no BF16)."""
    if not hasattr(t, "detach"):
        return np.asarray(t)
    import torch
    return (t.float() if t.dtype == torch.bfloat16 else t).detach().cpu().numpy()


def run_case(case: Case, op, input_dtype: str = "float32") -> dict[str, np.ndarray]:
    """The operation's outputs on the case's inputs, float inputs in `input_dtype` (the golden
    inputs are BF16 values: "bfloat16" holds them exactly)."""
    import torch

    def tensor(v):
        t = torch.from_numpy(v.copy())
        return t.to(torch.bfloat16) if input_dtype == "bfloat16" and t.dtype == torch.float32 else t
    if case.call == "mapping":
        result = op({k: tensor(v) for k, v in case.inputs.items()}, **case.args)
        if not isinstance(result, dict):
            raise ValueError(f"{case.op} returned {type(result).__name__}, expected a dict of named outputs")
        return {name: np.ascontiguousarray(_numpy(result[name])) for name in case.outputs if name in result}
    extra, keywords = case.call_args()
    result = op(*(tensor(v) for v in case.inputs.values()), *extra, **keywords)
    result = result if isinstance(result, tuple) else (result,)
    if len(result) != len(case.outputs):
        raise ValueError(f"{case.op} returned {len(result)} outputs, expected {case.outputs}")
    return {name: np.ascontiguousarray(_numpy(t)) for name, t in zip(case.outputs, result)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(out: Path, *, force: bool = False) -> dict:
    """Write every case with impl's outputs, each checked against spec/, and the manifest.

    Refuses to overwrite the stored goldens (golden/data) unless `force`: they change only when a
    case or the generator changes, on purpose."""
    import dsv4spec.impl as impl
    out = Path(out)
    if out.resolve() == DATA.resolve() and (DATA / MANIFEST).exists() and not force:
        raise FileExistsError(f"{DATA} holds the stored goldens; give another directory, or --force (force=True) to "
                              f"regenerate them (then commit the files and the manifest together)")
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for case in map(built, cases()):
        outputs = run_case(case, getattr(impl, case.op))
        problem = compare(case, outputs, spec_outputs(case), against="spec/")
        if problem:
            raise RuntimeError(f"impl disagrees with spec/ on a golden case, nothing written for it: {problem}")
        tensors = {f"in.{k}": np.ascontiguousarray(v) for k, v in case.inputs.items() if k not in case.generated}
        tensors.update({f"out.{k}": v for k, v in outputs.items()})
        path = out / f"{case.name}.safetensors"
        about = {"op": case.op, "rule": case.rule, "args": case.args}
        if case.generated:
            about["generated"] = {k: recipe.about() for k, recipe in case.generated.items()}
        # One metadata key: safetensors writes several in a random order, which would break
        # bit-for-bit regeneration.
        _save(tensors, path, metadata={"case": json.dumps(about, sort_keys=True)})
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
    """(inputs, outputs) of a stored case, the inputs kept as recipes rebuilt."""
    path = str(data / f"{name}.safetensors")
    tensors = load_file(path)
    inputs = {k[3:]: v for k, v in tensors.items() if k.startswith("in.")}
    outputs = {k[4:]: v for k, v in tensors.items() if k.startswith("out.")}
    with safe_open(path, "np") as handle:
        about = json.loads((handle.metadata() or {}).get("case", "{}"))
    inputs.update({k: rebuild(recipe) for k, recipe in about.get("generated", {}).items()})
    return inputs, outputs


def compare(case: Case, got: dict[str, np.ndarray], want: dict[str, np.ndarray],
            against: str = "the golden") -> str | None:
    """None when equal bit for bit; otherwise the first difference, decoded.

    Against spec/, `want` holds spec's own arrays (int64, float64): they are compared in the
    golden's dtype, which must hold every value exactly."""
    for name in case.outputs:
        if name not in got:
            return f"{case.name}: output {name!r} missing"
        a, b = np.asarray(got[name]), np.asarray(want[name])
        if name in case.unordered and a.shape == b.shape and a.ndim == 2:
            a, b = _rows_sorted(a, case.unordered[name]), _rows_sorted(b, case.unordered[name])
        if a.shape != b.shape:
            return f"{case.name}.{name}: shape {a.shape}, expected {b.shape} ({against})"
        if a.dtype != b.dtype and a.dtype.kind == b.dtype.kind == "i":
            a, b = a.astype(np.int64), b.astype(np.int64)      # index lists: int32 or int64 (the contract)
        if a.dtype != b.dtype:
            exact = np.array_equal(b.astype(a.dtype).astype(b.dtype), b, equal_nan=b.dtype.kind == "f")
            if against == "the golden" or not exact:
                return f"{case.name}.{name}: dtype {a.dtype}, expected {b.dtype} ({against})"
            b = b.astype(a.dtype)
        diff = np.flatnonzero(a.reshape(-1).view(np.uint8) != b.reshape(-1).view(np.uint8))
        if diff.size:
            i = int(diff[0]) // a.itemsize
            idx = tuple(int(j) for j in np.unravel_index(i, a.shape))
            order = " (rows sorted where their order is free)" if name in case.unordered else ""
            return (f"{case.name}.{name}: {diff.size} bytes differ from {against}{order}; first at {idx}: "
                    f"got {a.reshape(-1)[i]!r}, expected {b.reshape(-1)[i]!r} "
                    f"(rule {case.output_rules.get(name, case.rule)})")
    return None


def _rows_sorted(a: np.ndarray, columns: int | None) -> np.ndarray:
    """Each row with its first `columns` entries (all when None) in ascending order."""
    a = a.copy()
    a[:, :columns] = np.sort(a[:, :columns], axis=1)
    return a


def check_target(target, data: Path = DATA, names=None) -> list[tuple[str, str, str]]:
    """(case, status, detail) for each golden case (those in `names` when given) against a target:
    PASS, FAIL, ERROR or n/i (not implemented).  A FAIL names the first output that differs: a layer
    case's outputs are its stages in path order."""
    results = []
    for case in cases():
        if names is not None and case.name not in names:
            continue
        if not target.has(case.op):
            results.append((case.name, "n/i", f"missing {case.op}"))   # the suite's word
            continue
        inputs, want = load_case(case.name, data)
        ordered = {name: inputs[name] for name in _input_names(case, inputs)}   # in the operation's order
        stored = dataclasses.replace(case, inputs=ordered)
        try:
            problem = compare(case, run_case(stored, target.op(case.op), target.input_dtype(case.op)), want)
        except Exception as e:      # noqa: BLE001 -- a target may raise anything (a contract error included)
            results.append((case.name, "ERROR", f"{type(e).__name__}: {e}"))
            continue
        results.append((case.name, "FAIL" if problem else "PASS", problem or ""))
    return results


# ------------------------------------------------------------------------------------------------
# Ports in other languages: export the inputs, check the outputs they wrote
# ------------------------------------------------------------------------------------------------

LAYOUT = "LAYOUT.md"
VECTORS = "vectors"


def selected(rules: list[str] | None = None) -> list[Case]:
    """The cases whose rule starts with one of the prefixes (all when None)."""
    from ..spec.rules import _matches
    chosen = [c for c in cases() if not rules or any(_matches(c.rule, p) for p in rules)]
    if rules and not chosen:
        raise ValueError(f"no golden case gates a rule matching {', '.join(rules)}; "
                         f"cases gate {', '.join(sorted({c.rule for c in cases()}))}")
    return chosen


def _input_names(case: Case, stored: dict) -> list[str]:
    """The order of a case's inputs (a mapping case's, as stored: it takes them by name)."""
    return sorted(stored) if case.call == "mapping" else list(case.inputs)


def check_outputs(port_dir: Path, data: Path = DATA, rules: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(rule, status, detail) per golden case, comparing the files a port wrote in `port_dir` (same
    names, `out.*` tensors) with the goldens: PASS, FAIL, or MISSING (no file, or an output absent)."""
    port_dir = Path(port_dir)
    if not port_dir.is_dir():
        raise FileNotFoundError(f"{port_dir} is not a directory of port outputs")
    results = []
    for case in selected(rules):
        f = port_dir / f"{case.name}.safetensors"
        if not f.exists():
            results.append((case.rule, "MISSING", f"{case.name}: no {f.name} in {port_dir}"))
            continue
        got = {k[4:]: v for k, v in load_file(str(f)).items() if k.startswith("out.")}
        absent = [name for name in case.outputs if name not in got]
        if absent:
            results.append((case.rule, "MISSING", f"{case.name}: no tensor {', '.join('out.' + n for n in absent)} "
                                                  f"in {f.name}"))
            continue
        _, want = load_case(case.name, data)
        problem = compare(case, got, want)
        results.append((case.rule, "FAIL" if problem else "PASS", problem or case.name))
    return results


def _save(tensors: dict, path: Path, metadata: dict) -> None:
    """save_file, with the mode `open` gives a new file (0666 less the umask): safetensors creates 0600."""
    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def export(out: Path, data: Path = DATA, rules: list[str] | None = None) -> list[Path]:
    """Write the golden inputs (tensors `in.*` only), LAYOUT.md describing every file, and one-line
    text vectors of the element and block codecs; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written, sections = [], []
    for case in selected(rules):
        inputs, want = load_case(case.name, data)
        names = _input_names(case, inputs)
        path = out / f"{case.name}.safetensors"
        about = json.dumps({"op": case.op, "rule": case.rule, "args": case.args, "inputs": names,
                            "outputs": list(case.outputs), "call": case.call,
                            "positional": list(case.positional)}, sort_keys=True)
        _save({f"in.{k}": np.ascontiguousarray(inputs[k]) for k in names}, path, metadata={"case": about})
        written.append(path)
        sections.append(_layout(case, {k: inputs[k] for k in names}, want))
    (out / LAYOUT).write_text(_LAYOUT_HEAD + "\n".join(sections))
    written.append(out / LAYOUT)
    (out / VECTORS).mkdir(exist_ok=True)
    for name, lines in text_vectors(data).items():
        path = out / VECTORS / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


_LAYOUT_HEAD = """# Golden inputs for a port

Each `<case>.safetensors` holds the inputs of one operation as tensors `in.<name>` (little-endian,
C order) and, in its metadata key `case` (JSON), the operation, the rule it gates, the extra
arguments and the order of the inputs and outputs.  Run your operation on the inputs in that order, then the arguments named in `positional`, in
that order, then the other arguments by keyword (`"call": "mapping"`: pass them as one mapping
from name to tensor, as `index_layer(inputs, **args)` takes them, and read the outputs from the
mapping it returns), write `<case>.safetensors` into an output
folder with one tensor `out.<name>` per output listed (dtype and shape as listed), then run

    dsv4spec golden check-outputs OUTPUT_FOLDER [--rules PREFIX,...]

Every listed output must be there: a missing file or tensor fails the check (select the rules your
port implements with --rules).  `vectors/*.txt` hold one-line test vectors of the element and block
codecs: `RULE op hex(input) -> hex(outputs)`, fp32 inputs as 8-hex-digit bit patterns, bytes as
2-hex-digit values, one block per line.

"""


def _describe_array(name, a) -> str:
    return f"| `{name}` | {a.dtype} | {list(a.shape)} |"


def _layout(case: Case, inputs: dict, want: dict) -> str:
    from ..spec import RULES
    ops = _op_contract()
    lines = [f"## {case.name}.safetensors", "", f"- operation: `{ops.get(case.op, case.op)}`",
             f"- rule: `{case.rule}`: {RULES[case.rule].statement}",
             f"- extra arguments: {json.dumps(case.args) if case.args else 'none'}"
             + (f" ({', '.join(case.positional)} positional, after the inputs)" if case.positional else "")]
    if case.call == "mapping":
        lines.append("- call: the inputs as one mapping; the outputs are its stages in path order, each gating "
                     "its own rule: " + ", ".join(f"`{k}` {r}" for k, r in case.output_rules.items()))
    for name, columns in case.unordered.items():
        lines.append(f"- `out.{name}`: the order of the {'entries' if columns is None else f'first {columns} entries'} "
                     f"of a row is free (compared as a set)")
    lines += ["", "| tensor | dtype | shape |", "|---|---|---|"]
    lines += [_describe_array(f"in.{k}", v) for k, v in inputs.items()]
    lines += [_describe_array(f"out.{k}", want[k]) + " (you write it)" for k in case.outputs]
    return "\n".join(lines) + "\n"


def _op_contract() -> dict[str, str]:
    import importlib
    from ..properties.suite import FAMILY_MODULES
    contract = {}
    for family in FAMILY_MODULES:
        contract.update(getattr(importlib.import_module(f"dsv4spec.properties.{family}"), "OPS", {}))
    return contract


def _hex(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    if a.dtype == np.float32:
        return " ".join(f"{w:08x}" for w in a.view(np.uint32).reshape(-1))
    return " ".join(f"{int(b):02x}" for b in a.reshape(-1))


def text_vectors(data: Path = DATA, blocks: int = 64) -> dict[str, list[str]]:
    """One-line vectors: the element codecs from the exact definitions in spec/formats on every
    boundary, its neighbours and the E2M1/E4M3 grids; the block codecs from the goldens' first
    `blocks` blocks and their stored outputs."""
    from ..spec import formats as F
    out = {}
    grid = np.concatenate([F.E2M1_VALUES, np.array(F.E2M1_BOUNDARIES, np.float32), [7.0, 1e4, -0.0]]).astype(np.float32)
    e2m1_in = np.unique(np.concatenate([grid, np.nextafter(grid, np.float32(np.inf)),
                                        np.nextafter(grid, np.float32(-np.inf))]).astype(np.float32))
    e2m1_in = np.concatenate([e2m1_in, -e2m1_in])
    rule = lambda v: ("FMT.E2M1.SATURATE" if abs(v) > 6 else "FMT.E2M1.ZERO_SIGN"  # noqa: E731
                      if np.signbit(v) and abs(v) <= 0.25 else "FMT.E2M1.RNE")
    out["e2m1_encode"] = [f"{rule(v)} e2m1_encode {_hex(np.float32([v]))} -> {_hex(F.e2m1_encode(np.float32([v])))}"
                          for v in e2m1_in]
    e4m3 = F.e4m3_decode(np.arange(0x7F, dtype=np.uint8)).astype(np.float32)
    mids = ((e4m3[1:].astype(np.float64) + e4m3[:-1]) / 2).astype(np.float32)
    e4m3_in = np.concatenate([e4m3, mids, np.float32([464.0, 463.9, 1e6])])
    e4m3_in = np.concatenate([e4m3_in, -e4m3_in]).astype(np.float32)
    out["e4m3_encode"] = [f"{'FMT.E4M3.SATFINITE' if abs(v) > 448 else 'FMT.E4M3.RNE'} e4m3_encode "
                          f"{_hex(np.float32([v]))} -> {_hex(F.e4m3_encode(np.float32([v])))}" for v in e4m3_in]
    for case in cases():
        if case.op not in ("fp4_e4m3_quantize", "fp4_e8m0_quantize", "fp8_quantize"):
            continue
        inputs, want = load_case(case.name, data)
        x = inputs["x"]
        n_blocks = want[case.outputs[1]].shape[-1]
        block = x.shape[-1] // n_blocks
        xb = x.reshape(-1, block)
        payload = want[case.outputs[0]].reshape(xb.shape[0], -1)
        scales = want[case.outputs[1]].reshape(-1)
        extra = f" block={case.args['block']}" if "block" in case.args else ""
        out[case.name] = [f"{case.rule} {case.op}{extra} {_hex(xb[i])} -> {_hex(payload[i])} | {_hex(scales[i:i + 1])}"
                          for i in range(min(blocks, xb.shape[0]))]
    return out
