"""A port of the FP4 E4M3/16 KV quantizer that knows nothing of dsv4spec: it reads the exported text
vectors as LAYOUT.md describes them, computes with numpy alone and writes its outputs.  DEVIATIONS
are the four mistakes of issue 20, each selected by name."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

DEVIATIONS = ("ties_away", "scale_reciprocal_6", "payload_reciprocal", "floor_2^-6")
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E4M3 = np.array([(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                 for e in range(16) for m in range(8)][:0x7F])          # codes 0 .. 0x7E


def nearest(table: np.ndarray, v: np.ndarray, away: bool = False) -> np.ndarray:
    """The index of the nearest table entry to each v >= 0; ties to the even index (or away from zero)."""
    v = np.asarray(v, dtype=np.float64)
    i = np.clip(np.searchsorted(table, v), 1, len(table) - 1)
    lo, hi = table[i - 1], table[i]
    up = (v - lo > hi - v) | ((v - lo == hi - v) & ((i % 2 == 0) | away))
    return np.where(v >= table[-1], len(table) - 1, np.where(up, i, i - 1))


def quantize(x: np.ndarray, deviation: str | None):
    xb = x.astype(np.float32).reshape(-1, 16)
    amax = np.abs(xb).max(axis=1)
    floor = np.float32(6 * 2.0 ** -6 if deviation == "floor_2^-6" else 6 * 2.0 ** -9)
    amax = np.maximum(amax, floor)
    over6 = amax * np.float32(1 / 6) if deviation == "scale_reciprocal_6" else amax / np.float32(6)
    scale_code = nearest(E4M3, over6)
    s = E4M3[scale_code].astype(np.float32)[:, None]
    ratio = xb * (np.float32(1) / s) if deviation == "payload_reciprocal" else xb / s
    ratio = np.clip(ratio, -6, 6)
    codes = nearest(E2M1, np.abs(ratio), away=deviation == "ties_away") | (np.signbit(ratio) << 3)
    codes = codes.astype(np.uint8).reshape(-1, 2)
    packed = codes[:, 0] | (codes[:, 1] << 4)
    lead = x.shape[:-1]
    return packed.reshape(*lead, x.shape[-1] // 2), scale_code.astype(np.uint8).reshape(*lead, x.shape[-1] // 16)


def read_tensor(tokens: list[str]) -> np.ndarray:
    name, dtype, rank = tokens[0], tokens[1], int(tokens[2])
    shape = [int(d) for d in tokens[3:3 + rank]]
    assert dtype == "f32", f"this port reads f32 inputs, got {dtype} for {name}"
    return np.array([int(w, 16) for w in tokens[3 + rank:]], dtype=np.uint32).view(np.float32).reshape(shape)


def tensor_line(name: str, a: np.ndarray) -> str:
    return " ".join([name, "u8", str(a.ndim), *map(str, a.shape), *(f"{int(b):02x}" for b in a.reshape(-1))])


def run(vectors: Path, out: Path, deviation: str | None = None, rules=("FP4.KV.", "FP4.E2M1.")):
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(vectors.glob("*.txt")):
        if not f.name.startswith(tuple(rules)):
            continue
        lines, header = [], None
        for line in f.read_text().splitlines():
            if line.startswith("@"):
                header = dict(t.split("=", 1) for t in line.split()[1:])
            elif line and not line.startswith("#") and header and header["op"] == "fp4_e4m3_quantize":
                packed, scales = quantize(read_tensor(line.split()), deviation)
                lines += [f"@ id={header['id']}", tensor_line("0", packed), tensor_line("1", scales)]
        if lines:
            (out / f.name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    run(Path(sys.argv[1]) / "vectors", Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
