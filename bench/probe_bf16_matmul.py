"""The GPU's own BF16 matmuls against the suite's judge of them (issue 43).

ATTN.LAYER's o_lora and PATH's projections assume a BF16 matmul accumulates in fp32 in any order and
rounds once (spec.path.matmul_tolerance).  torch on CUDA runs them through cuBLAS with
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction at its default (True), which lets
cuBLAS reduce split-K partial sums in BF16.  This probe draws BF16 operands at the shapes those rules
use (the grouped wo_a einsum of V4 and V4.1, the projections) and at shapes where cuBLAS splits K
(few rows, long K), computes them on the GPU both ways (the flag True and False, torch.matmul and
torch.einsum), and counts the outputs outside spec.path.matmul ± matmul_tolerance.  Prints one line
per case and writes --out/probe_bf16_matmul.json.

    python bench/probe_bf16_matmul.py --out out/
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch

from dsv4spec.spec import path as spec_path

# (name, rows T, groups g, rank r per group, K per group): V4 and V4.1's wo_a (64 heads of 512 in 8
# groups of 1024 rows; V4-model L62-63), a projection, and split-K shapes (few rows, long K)
CASES = [("wo_a V4 T=1", 1, 8, 1024, 4096), ("wo_a V4 T=7", 7, 8, 1024, 4096),
         ("wo_a V4 T=64", 64, 8, 1024, 4096), ("wq_b-like T=4", 4, 1, 8192, 1536),
         ("splitK 1x16384->64", 1, 1, 64, 16384), ("splitK 8x32768->128", 8, 1, 128, 32768),
         ("splitK 2x65536->32", 2, 1, 32, 65536)]


def bf16(rng, shape, scale):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * scale).bfloat16()


def outside(out, x, w) -> int:
    """How many of out [T, N] lie outside matmul(x, w) ± matmul_tolerance(x, w)."""
    xs, ws = x.float().numpy(), w.float().numpy()
    ref, tol = spec_path.matmul(xs, ws), spec_path.matmul_tolerance(xs, ws)
    return int((np.abs(out.float().cpu().numpy().astype(np.float64) - ref) > tol).sum())


def run_case(rng, name, t, g, r, k):
    x, w = bf16(rng, (t, g, k), 1.0), bf16(rng, (g, r, k), k ** -0.5)
    row = {"case": name, "T": t, "groups": g, "rank": r, "K": k}
    for flag in (True, False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
        xd, wd = x.cuda(), w.cuda()
        forms = {"einsum": torch.einsum("tgk,grk->tgr", xd, wd),
                 "matmul": torch.stack([xd[:, i] @ wd[i].T for i in range(g)], 1)}
        for form, out in forms.items():
            row[f"{form}_reduced_{flag}"] = sum(outside(out[:, i], x[:, i], w[i]) for i in range(g))
    row["outputs"] = t * g * r
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU"); return 2
    default = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    rows = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        for case in CASES:
            row = dict(run_case(rng, *case), seed=seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "default_allow_bf16_reduced_precision_reduction": default, "rows": rows}
    if args.out:
        pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(args.out) / "probe_bf16_matmul.json").write_text(json.dumps(result, indent=1))
    bad = sum(v for r in rows for key, v in r.items() if key.endswith(("_True", "_False")))
    print(f"{torch.cuda.get_device_name()}: {bad} outputs outside matmul_tolerance over {len(rows)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
