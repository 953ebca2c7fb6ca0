"""What the A/B scripts (bench/ab_decode.py, bench/ab_logits.py) share around their rows: the GPU
check and the ceilings measured first, and the result's header and its JSON + Markdown record."""
from __future__ import annotations

import json
import os
import platform
import time


def start(script: str, rep: int):
    """(torch, ceilings, t0) on a CUDA GPU, the ceilings (bench_indexer.ceilings) measured and
    printed; None without one (cmd_bench.cuda_torch has said why)."""
    from dsv4spec.cmd_bench import cuda_torch
    torch = cuda_torch(script)
    if torch is None:
        return None
    from bench_indexer import ceilings
    t0 = time.time()
    ceil = ceilings(torch, rep)
    print(f"ceilings {ceil}", flush=True)
    return torch, ceil, t0


def result(torch, ceil, t0, **fields) -> dict:
    import triton
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), ceilings=ceil, seconds=time.time() - t0, **fields)


def record(out, stem: str, res: dict, md: str) -> None:
    """stem.json and stem.md into the folder out (when given); the Markdown printed."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{stem}.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(out, f"{stem}.md"), "w") as f:
            f.write(md)
    print(md)
