"""What check-trace costs per recorded layer-step, against running the reference for it, and the peak
memory of judging one layer's prefill record (docs/TRACE.md).  Not a test: a measurement.

    python bench/bench_trace.py --tokens 65536 --layer 0 --model v4.1-flash [--out DIR] [--keep]

One layer-step, its attention started from the given q_attn and kv_normed (16 heads, as ATTN.LAYER's
cases): the official control computes its stages (reference), dsv4spec.trace.Recorder writes them
(record), then `dsv4spec check-trace` judges them in a fresh process (judge), whose peak resident
memory it reports itself (VmHWM), the reference's read from the kernel (ru_maxrss of this process).  Prints
one JSON line.  Before anything, the memory the measured slopes predict for --tokens is compared with
what the machine has available: short, it exits 3 in one line, having run nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch


# Memory, measured (docs/TRACE.md, 4 096 and 16 384 tokens): the judge's peak grows by about 0.3 GB a
# thousand tokens from 1 GB (the trace's tensors as float32, and a chunk), the reference's (this process:
# the layer's stages and its gathered window rows, then the trace written) by about 0.62 GB from 0.5 GB.
JUDGE_GB_PER_1K, JUDGE_GB_BASE = 0.3, 1.0
REFERENCE_GB_PER_1K, REFERENCE_GB_BASE = 0.62, 0.5
SHORT = 3              # exit status: not enough memory to run it here


def needed_gb(tokens: int, shards: int = 1) -> float:
    """The larger of the two peaks (the reference's stages are freed before the judge starts); shards
    judge side by side, each counted at a whole judge's peak."""
    return max(shards * (JUDGE_GB_BASE + JUDGE_GB_PER_1K * tokens / 1000),
               REFERENCE_GB_BASE + REFERENCE_GB_PER_1K * tokens / 1000)


def available_gb() -> float | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) / 2 ** 20
    except (OSError, KeyError, ValueError):
        return None


def inputs(model: str, layer: int, tokens: int, seed: int = 0) -> dict:
    from dsv4spec.properties.attn import LAYER_HEADS
    from dsv4spec.properties.path import normal_bf16
    from dsv4spec.spec.models import profile
    m = profile(model)
    rng = np.random.default_rng(seed)
    out = {"x": normal_bf16(rng, (tokens, m.dim)), "q_attn": normal_bf16(rng, (tokens, LAYER_HEADS, m.head_dim)),
           "kv_normed": normal_bf16(rng, (tokens, m.head_dim)), "sink": rng.standard_normal(LAYER_HEADS).astype(np.float32)}
    if m.ratio(layer):
        out["kv_entries"] = normal_bf16(rng, (tokens // m.ratio(layer), m.head_dim))
    return {k: torch.from_numpy(v) for k, v in out.items()}


# the judge as a child that writes its own peak (VmHWM, kB) where BENCH_TRACE_PEAK says: the kernel's
# ru_maxrss of a child counts the resident memory of the process it was forked from (here the reference's)
JUDGE_CHILD = """import os, sys
from dsv4spec.cli import main
sys.argv[0] = "dsv4spec"
try:
    status = main()
finally:
    with open(os.environ["BENCH_TRACE_PEAK"], "w") as peak:
        peak.write(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])
sys.exit(status)"""


def judge(trace_dir: str, shards: int) -> tuple[list[str], int, float | None]:
    """`dsv4spec check-trace` in fresh processes, side by side, their progress on this standard error;
    each one's last report line, the largest exit status, and the largest peak in MB (None: unread)."""
    command = [sys.executable, "-c", JUDGE_CHILD, "check-trace", trace_dir]
    peaks = [os.path.join(trace_dir, f".peak{k}") for k in range(1, shards + 1)]
    children = [subprocess.Popen(command + (["--shard", f"{k}/{shards}"] if shards > 1 else []), stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "BENCH_TRACE_PEAK": peak})
                for k, peak in zip(range(1, shards + 1), peaks)]
    outputs = [child.communicate()[0] for child in children]
    for out in outputs:
        print(out, file=sys.stderr)
    last = [out.strip().splitlines()[-1] if out.strip() else "no report (its standard error says why)" for out in outputs]
    return last, max(child.returncode for child in children), read_peak_mb(peaks)


def read_peak_mb(files: list[str]) -> float | None:
    try:
        peaks = [int(open(f).read()) / 1024 for f in files]
    except (OSError, ValueError):
        return None
    for f in files:
        os.remove(f)
    return max(peaks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="v4.1-flash")
    p.add_argument("--layer", type=int, default=0, help="a window or HCA layer (no indexer inputs drawn here)")
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--out", help="where the trace goes (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the trace")
    p.add_argument("--shards", type=int, default=1,
                   help="judge as this many `check-trace --shard K/N` processes side by side (the peak "
                        "reported is the largest one's, the CPU their sum)")
    p.add_argument("--force", action="store_true", help="run even where the memory looks short")
    args = p.parse_args()
    need, have = needed_gb(args.tokens, args.shards), available_gb()
    if have is not None and need > have and not args.force:
        print(f"bench_trace: --tokens {args.tokens} needs about {need:.0f} GB at its peak (measured slopes, "
              f"docs/TRACE.md) and {have:.1f} GB is available: run it on a machine with the memory, or fewer "
              f"--tokens (--force to try anyway)", file=sys.stderr)
        return SHORT
    from dsv4spec.official import attn as official_attn
    from dsv4spec.official.rope import rope_freqs
    from dsv4spec.trace import Recorder
    out_dir = args.out or tempfile.mkdtemp(prefix="bench_trace_")
    given = inputs(args.model, args.layer, args.tokens)
    started, cpu = time.perf_counter(), time.process_time()
    stages = official_attn.attention_layer(dict(given), model=args.model, layer=args.layer, start_pos=0)
    reference_s, reference_cpu = time.perf_counter() - started, time.process_time() - cpu
    reference_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    with Recorder(out_dir, model=args.model, config={"n_heads": 16}) as rec:
        rec.record("rope_freqs", rope_freqs(args.model, args.layer), layer=args.layer)
        rec.record("sink", given.pop("sink"), layer=args.layer)
        for name, value in {**given, **stages}.items():
            rec.record(name, value.to(torch.bfloat16) if value.is_floating_point() else value,
                       layer=args.layer, step=(0, args.tokens))
    record_s = time.perf_counter() - started
    trace_mb = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir)) / 2 ** 20
    del stages, given
    started = time.perf_counter()
    print(f"bench_trace: reference {reference_s:.1f} s, recorded {trace_mb:.0f} MB in {record_s:.1f} s; judging",
          file=sys.stderr, flush=True)
    verdicts, status, peak_mb = judge(out_dir, args.shards)
    judge_s = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    judge_cpu = usage.ru_utime + usage.ru_stime
    peak_mb = usage.ru_maxrss / 1024 if peak_mb is None else peak_mb
    print(json.dumps({"model": args.model, "layer": args.layer, "tokens": args.tokens, "threads": torch.get_num_threads(),
                      "reference_s": round(reference_s, 2), "record_s": round(record_s, 2),
                      "judge_s": round(judge_s, 2), "judge_over_reference_s": round(judge_s / reference_s, 2),
                      "reference_cpu_s": round(reference_cpu, 2), "judge_cpu_s": round(judge_cpu, 2),
                      "judge_over_reference_cpu": round(judge_cpu / reference_cpu, 2),
                      "reference_peak_mb": round(reference_peak_mb), "judge_peak_mb": round(peak_mb),
                      "estimated_peak_mb": round(need * 1024), "trace_mb": round(trace_mb), "shards": args.shards,
                      "exit": status, "verdict": verdicts}))
    if not args.keep and not args.out:
        shutil.rmtree(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
