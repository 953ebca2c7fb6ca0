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

from .cases import Case, built
from .catalog import cases, spec_outputs
from .layers import rebuild
from .porting import layout_text, op_contract

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


def generate(out: Path, *, force: bool = False, names=None) -> dict:
    """Write every case (those in `names` when given) with impl's outputs, each checked against
    spec/, and the manifest of what was written.

    Refuses to overwrite the stored goldens (golden/data) unless `force`: they change only when a
    case or the generator changes, on purpose."""
    import dsv4spec.impl as impl
    out = Path(out)
    if names is not None and out.resolve() == DATA.resolve():
        raise ValueError("a selection of cases is generated elsewhere only: the stored manifest lists them all")
    if out.resolve() == DATA.resolve() and (DATA / MANIFEST).exists() and not force:
        raise FileExistsError(f"{DATA} holds the stored goldens; give another directory, or --force (force=True) to "
                              f"regenerate them (then commit the files and the manifest together)")
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for case in map(built, (c for c in cases() if names is None or c.name in names)):
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
        if case.notes:
            about["notes"] = case.notes
        # One metadata key: safetensors writes several in a random order, which would break
        # bit-for-bit regeneration.
        _save(tensors, path, metadata={"case": json.dumps(about, sort_keys=True)})
        files[path.name] = {"sha256": sha256(path), "rule": case.rule, "op": case.op}
    manifest = {"generator_version": GENERATOR_VERSION, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def verify_manifest(data: Path | None = None) -> list[str]:
    """Problems with the stored goldens: a malformed manifest, an entry naming anything but a file
    of the data folder, missing files, hash mismatches, files not in the manifest."""
    data = DATA if data is None else data
    path = data / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"no golden manifest at {path}; run `dsv4spec golden generate`")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        return [f"{path}: malformed: not readable JSON ({e})"]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return [f"{path}: malformed: expected an object with \"files\": {{NAME: {{\"sha256\": HEX}}}}"]
    problems = []
    for name, entry in files.items():
        if Path(name).name != name or name in (".", ".."):
            problems.append(f"{name!r}: not a file name of the data folder (refused, never opened)")
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            problems.append(f"{name}: malformed entry {entry!r}; expected {{\"sha256\": HEX}}")
            continue
        f = data / name
        if not f.is_file():
            problems.append(f"{name}: listed in the manifest but missing")
        elif sha256(f) != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest (edited by hand?)")
    extra = {p.name for p in data.glob("*.safetensors")} - set(files)
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
        if name in case.zero_sign_free and a.dtype.kind == "f":
            a, b = a + a.dtype.type(0), b + b.dtype.type(0)            # −0 + 0 = +0: the sign of a zero is free
        diff = np.flatnonzero(a.reshape(-1).view(np.uint8) != b.reshape(-1).view(np.uint8))
        if diff.size:
            i = int(diff[0]) // a.itemsize
            idx = tuple(int(j) for j in np.unravel_index(i, a.shape))
            order = " (rows sorted where their order is free)" if name in case.unordered else ""
            show = _decoder(case, name, a.dtype)
            return (f"{case.name}.{name}: {diff.size} bytes differ from {against}{order}; first at {idx}: "
                    f"got {show(a.reshape(-1)[i])}, expected {show(b.reshape(-1)[i])} "
                    f"(rule {case.output_rules.get(name, case.rule)})")
    return None


def _decoder(case: Case, name: str, dtype):
    """How one element of an output reads in a message: its bits and fields, never a numpy repr."""
    from ..properties.formats import e2m1_text, e4m3_text, e8m0_text, f32_text, packed_text
    if dtype == np.uint8:
        fields = {"packed": packed_text, "q": e4m3_text,
                  "scales": e4m3_text if case.op == "fp4_e4m3_quantize" else e8m0_text}.get(name, e2m1_text
                                                                                           if "codes" in name else None)
        return lambda v: f"0x{int(v):02x}" + (f" {fields(int(v))}" if fields else "")
    if dtype == np.float32:
        return lambda v: f"0x{int(np.float32(v).view(np.uint32)):08x} {f32_text(int(np.float32(v).view(np.uint32)))}"
    if dtype.kind in "iub":
        return lambda v: str(int(v))
    return lambda v: str(v.item() if hasattr(v, "item") else v)


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
        if target.input_dtype(case.op) == "bfloat16" and not _bf16_values(inputs):
            results.append((case.name, "n/i", f"fp32 inputs BF16 cannot hold; {case.op} takes bfloat16 "
                                              f"(the target's INPUT_DTYPE)"))
            continue
        ordered = {name: inputs[name] for name in _input_names(case, inputs)}   # in the operation's order
        stored = dataclasses.replace(case, inputs=ordered)
        try:
            problem = compare(case, run_case(stored, target.op(case.op), target.input_dtype(case.op)), want)
        except Exception as e:      # noqa: BLE001 -- a target may raise anything (a contract error included)
            results.append((case.name, "ERROR", f"{type(e).__name__}: {e}"))
            continue
        results.append((case.name, "FAIL" if problem else "PASS", problem or ""))
    return results


def _bf16_values(inputs: dict) -> bool:
    """Whether every float input is a BF16 value (a BF16-only operation receives it unchanged)."""
    from ..spec.formats import bf16_round
    return all(np.array_equal(bf16_round(v), v, equal_nan=True) for v in inputs.values()
               if np.asarray(v).dtype == np.float32)


# ------------------------------------------------------------------------------------------------
# Ports in other languages: export the inputs, check the outputs they wrote
# ------------------------------------------------------------------------------------------------

LAYOUT = "LAYOUT.md"
CASES = "cases"


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


def check_outputs(port_dir: Path, data: Path = DATA, rules: list[str] | None = None,
                  ops: str | None = None) -> list[tuple[str, str, str]]:
    """(rule, status, detail) per golden case, comparing the files a port wrote in `port_dir`
    (`<case>.safetensors` with `out.*` tensors, or `<case>.txt` in the text form) with the goldens:
    PASS, FAIL, MISSING (no file, or an output absent), ERROR (a file that cannot be read: the
    other cases are still judged) or n/i (no file, and the port declares its operations, `ops` or
    port.txt's ops=, without the case's)."""
    from .vectors import declared_ops
    port_dir = Path(port_dir)
    if not port_dir.is_dir():
        raise FileNotFoundError(f"{port_dir} is not a directory of port outputs")
    implemented = declared_ops(port_dir, ops)
    results = []
    for case in selected(rules):
        binary, text = port_dir / f"{case.name}.safetensors", port_dir / f"{case.name}.txt"
        if not binary.exists() and not text.exists():
            if implemented is not None and not _case_ops(case) & implemented:
                results.append((case.rule, "n/i", f"{case.name}: missing {case.op} (not among the operations "
                                                  f"the port declares)"))
            else:
                results.append((case.rule, "MISSING", f"{case.name}: neither {binary.name} nor {text.name} "
                                                      f"in {port_dir}"))
            continue
        f = binary if binary.exists() else text
        if not f.is_file():
            results.append((case.rule, "ERROR", f"{case.name}: {f.name} is not a regular file (never read: it "
                                                f"could block)"))
            continue
        try:
            got = _port_outputs(f)
        except Exception as e:      # noqa: BLE001 -- a corrupt or truncated file is the port's, reported
            results.append((case.rule, "ERROR", f"{case.name}: {f.name} cannot be read: {type(e).__name__}: {e}"))
            continue
        absent = [name for name in case.outputs if name not in got]
        if absent:
            results.append((case.rule, "MISSING", f"{case.name}: no output {', '.join(absent)} in {f.name}"))
            continue
        _, want = load_case(case.name, data)
        problem = compare(case, got, want)
        results.append((case.rule, "FAIL" if problem else "PASS", problem or case.name))
    return results


def _case_ops(case: Case) -> set[str]:
    """The operation names that answer a case: its own, and the per-format name of a bundled one
    (the kv_qdq case of fmt fp4_e4m3 is kv_qdq_fp4_e4m3's)."""
    from ..runner.target import SPLIT
    return {case.op} | {split for split, (bundled, fmt) in SPLIT.items()
                        if bundled == case.op and case.args.get("fmt") == fmt}


def _save(tensors: dict, path: Path, metadata: dict) -> None:
    """save_file, with the mode `open` gives a new file (0666 less the umask): safetensors creates 0600."""
    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _port_outputs(f: Path) -> dict[str, np.ndarray]:
    """The outputs in a port's file: `out.NAME` tensors of a safetensors file, or the value lines
    (`NAME DTYPE RANK DIMS VALUES`) of a text file."""
    if f.suffix == ".safetensors":
        return {k[4:]: v for k, v in load_file(str(f)).items() if k.startswith("out.")}
    from . import vectors as V
    records, stray = V.read_records(f)
    if stray or len(records) != 1:
        raise ValueError(stray[0] if stray else f"expected one `@ case=NAME` header, found {len(records)}")
    out = {}
    for n, line in records[0][2]:
        try:
            name, value = V.parse_value(line.split())
        except ValueError as e:
            raise ValueError(f"line {n}: {e}") from None
        out[name] = np.asarray(_numpy(value))
    return out


def export(out: Path, data: Path = DATA, rules: list[str] | None = None, level: int | None = None,
           layers: bool = False, bf16: bool = False) -> dict:
    """Write, for a port in another language: vectors/ and expected/ (every check's calls, text),
    cases/ (the golden cases' inputs, as safetensors and as text; the layer cases, 100 MB of
    weights, only when `layers`), export.txt and LAYOUT.md describing all of it; every file
    world-readable.  Returns {"vectors": {rule: RuleVectors}, "cases": [Case]}."""
    from . import vectors as V
    out = Path(out)
    V.make_dir(out)
    level = V.DEFAULT_LEVEL if level is None else level
    recorded = V.export(out, rules=rules, level=level, bf16=bf16)
    chosen = [c for c in cases() if _gated(c, rules) and (layers or (not c.generated and c.build is None))]
    V.make_dir(out / CASES)
    sections = []
    for case in chosen:
        inputs, want = load_case(case.name, data)
        names = _input_names(case, inputs)
        path = out / CASES / f"{case.name}.safetensors"
        save_file({f"in.{k}": np.ascontiguousarray(inputs[k]) for k in names}, str(path),
                  metadata=_flat_about(case, names))
        os.chmod(path, V.FILE_MODE)
        V.write_text(out / CASES / f"{case.name}.txt", _case_text(case, inputs, names))
        sections.append(_layout(case, {k: inputs[k] for k in names}, want))
    V.write_text(out / LAYOUT, layout_text(recorded, sections, level, layers))
    return {"vectors": recorded, "cases": chosen}


def _gated(case: Case, rules) -> bool:
    from ..spec.rules import _matches
    return not rules or any(_matches(case.rule, p) for p in rules)


def _flat_about(case: Case, names: list[str]) -> dict[str, str]:
    """The case's description as flat string metadata (one header JSON to parse, no JSON inside it)."""
    return {"op": case.op, "rule": case.rule, "call": case.call, "inputs": ",".join(names),
            "outputs": ",".join(case.outputs), "positional": ",".join(case.positional),
            "args": " ".join(f"{k}={v}" for k, v in case.args.items())}


def _case_text(case: Case, inputs: dict, names: list[str]) -> str:
    from . import vectors as V
    lines = [line for k in names for line in V.value_lines(k, inputs[k])]
    lines += [line for k, v in case.args.items() for line in V.value_lines(k, v)]
    head = " ".join(f"{k}={v}" for k, v in _flat_about(case, names).items() if k != "args" and v)
    return f"@ case={case.name} {head} lines={len(lines)}\n" + "\n".join(lines) + "\n"


def _describe_array(name, a) -> str:
    return f"| `{name}` | {a.dtype} | {list(a.shape)} |"


def _layout(case: Case, inputs: dict, want: dict) -> str:
    from ..spec import RULES
    ops = op_contract()
    lines = [f"### cases/{case.name}.safetensors, cases/{case.name}.txt", "",
             f"- operation: `{ops.get(case.op, case.op)}`",
             f"- rule: `{case.rule}`: {RULES[case.rule].statement}",
             f"- extra arguments: {' '.join(f'{k}={v}' for k, v in case.args.items()) if case.args else 'none'}"
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
