"""A/B of the FP4 decode logits (the score kernel at T = 1) on one CUDA GPU, in one process, same inputs.

Device command (at most 4 minutes, bounded by --budget with a cold Triton cache; then, at most
2.5 minutes, the score tests on CUDA, which run every switch of the score kernel against impl
and against the shipped bits; the sm_90 compile of the variants runs without a GPU):

    export TRITON_INTERPRET=0; python -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1; timeout 240 python bench/ab_logits.py --out $OUT --rep 20 --budget 190 2>&1 | tee $OUT/ab_logits.log | tail -45; timeout 150 python -m pytest -q -p no:cacheprovider -n 16 tests/test_kernels_indexer.py -k "scores_match_impl or variants_give" 2>&1 | tail -4

Cases (CASES): T = 1 FP4 q and K (E2M1 + E8M0/32, D = 128), every key visible: S = 262144 with
H = 32 (the V4.1 decode step's candidate layer) and S = 1M with H = 64 (issue 23's row "FP4 decode
logits T=1 S=1M ≥ 40 % of copy"), each with the scores written ([1, S] fp32) and with the block
maxima written instead (BLOCK_MAX = 8, [1, S/8], as the decode step takes them).

Variants: kernels.indexer.SCORE_AB, the score kernel's switches, each the shipped bits by
construction.  Shipped since the 12-02 run (docs/records/h200/2026-12-02-ab-logits.md): the epilogue's BF16
roundings as packed pairs in inline PTX (cvt.rn.bf16x2.f32, mul.rn.bf16x2) and the keys' FP4 decode
with a byte's two codes in one register (placed by two integer multiplies and two masks, scaled by
two mul.rn.bf16x2).  The others: int_fp32 (the integer roundings and one code a register, shipped
before), round_int, round_cvt (Triton's conversion, cvt.rn.bf16.f32), fp4_fp32.  That run's names
(the predictions below) were relative to int_fp32: round_x2, fp4_bytes, x2 (both: shipped now),
fp4_words and contiguous (measured no faster; removed).  Configurations (CONFIGS: keys a
block, pipeline depth, programs a row, warps; None = as shipped: 64, 2, 528, 4), swept under the
shipped variant and under the fastest bit-identical one.  Each row: eager and CUDA-graph µs
(do_bench median, L2 flushed), the K bytes' rate against the copy rate measured in the same run,
and the output compared bit for bit (fp32 patterns) with the shipped path's on the same inputs;
the shipped scores are also judged against torch's BF16-steps score (bench_indexer.scores_validity).
Rows run in priority order until --budget seconds have passed (compiles included); the rest
are listed as skipped.  Writes ab_logits.json and ab_logits.md to --out; refuses (exit 2)
without a GPU.  --cpu-smoke: every variant at a few splits, small sizes, in the Triton
interpreter, bits against the shipped path (no timing; there the roundings fall back to the
shipped code and the decodes multiply in fp32 where the GPU runs PTX, so it checks the splits,
the decodes' bit placement and join order, and the script).

Static profile (sm_90 SASS of the key loop compiled on the host from this tree, 64 keys a block,
4 warps, 2 stages: instructions a thread per key block, H 64 scores / H 32 block maxima):
shipped 829 / 726 (H 64: IMAD 169, FMUL 128, LOP3 98, SHF 67, PRMT 62, IADD3 37, SGXT 34: the
FP4 decode of 64 codes a thread, 2 FMUL and ≈ 5 integer operations a code, is the larger part,
the epilogue's 32 key-head pairs a thread the rest); round_cvt 741; round_x2 713 / 667;
fp4_bytes 677 / 578; fp4_words 673 (66 STS.U16: the words' layout is stored to shared memory
16 bits at a time); x2 561 / 515; x2_words 559 / 509; contiguous 838.  tests/test_kernels_indexer.py
compiles the variants for sm_90 (the inline PTX assembles).

Predictions (written before the call; the record: 1M H 64 scores 103 µs graph, 17 % of copy;
the loop is issue- and integer-pipe-bound, so time ≈ shipped × instructions / 829 above the
17 µs byte floor):
- shipped ≈ 100-105 µs at 1M (16-17 % of copy), ≈ 20-24 µs at 262144 H 32 block maxima.
- round_cvt / round_x2: −6 to −14 % at 1M H 64; −3 to −8 % at H 32.
- fp4_bytes: −12 to −20 % at 1M H 64, −15 to −22 % at H 32; fp4_words no better than fp4_bytes
  (its 16-bit shared stores), possibly worse.
- x2: −25 to −33 % at 1M H 64: ≈ 68-78 µs, 22-25 % of copy; at 262144 H 32 ≈ 15-17 µs.  The
  40 % goal (≈ 42 µs) is not met by these.
- contiguous: within ± 5 % of the stride.
- configurations: 3 stages 0 to −5 %; 4 stages no better than 3; 264 or 132 programs slower
  (+10-40 %: too few warps to hide the loads behind the integer work); 1056 within ± 5 %;
  8 warps at 64 keys ± 5 %; 128 keys a block ± 10 %.
- bits: every variant and configuration equal to the shipped output (a difference is a bug).
Beyond these: 40 % needs ≈ 350 instructions a block, and the integer (ALU) pipe, 16 lanes a
scheduler, is the bound: x2 keeps ≈ 290 ALU instructions (LOP3, PRMT, FMNMX, F2FP, LEA, ISETP,
SEL), ≈ 580 cycles a warp and block, ≈ 36 µs at 1M with perfect overlap, where the shipped
kernel reaches about half of its own ALU floor (≈ 49 µs of ≈ 393 ALU instructions against 103
µs measured).  What remains in x2's 561: the decode's 5 integer operations and 2 BF16 multiplies
a byte (32 bytes a thread), ≈ 70 PRMT/LDS.U8 moving bytes into the asm's registers (the MMA
operand's register layout puts a thread's bytes 4 apart; fp4_words loads whole words but then
stores the decoded tile to shared memory 16 bits at a time), the epilogue (32 FMNMX, 32 FADD, 16
HMUL2, 17 F2FP), addressing.  Candidates, each to be proved bit-identical first: the ReLU folded
into the conversion (cvt.rn.relu.bf16x2.f32, −32 FMNMX; the sign of a zero dot must match
max.f32's), one BF16 multiply a code where the scale byte is <= 128 (f2 = 1; a block-uniform
branch), a decode in the shared-memory store's layout.  Moving K to the MMA's B operand (heads
on M) would change the head sum's order, hence bits: not a variant of this kernel.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (S, H, BLOCK_MAX) in priority order: the row, the decode step's, then the other outputs
CASES = ((1 << 20, 64, 0), (1 << 18, 32, 8), (1 << 18, 32, 0), (1 << 20, 64, 8))
D = 128
# (keys a block, pipeline depth, programs a row, warps) at T = 1; None: as shipped
CONFIGS = (None, (64, 3, 528, 4), (64, 4, 528, 4), (64, 2, 264, 4), (64, 2, 1056, 4), (64, 3, 132, 4),
           (64, 2, 528, 8), (128, 3, 528, 8), (128, 2, 264, 8), (128, 3, 1056, 4))
SMOKE_CONFIGS = (None, (64, 0, 2, 4), (64, 0, 3, 4), (128, 0, 3, 4))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for ab_logits.json and ab_logits.md")
    ap.add_argument("--rep", type=int, default=20, help="do_bench rep (ms)")
    ap.add_argument("--budget", type=float, default=190.0,
                    help="seconds for the whole sweep, compiles included; rows past it are skipped")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the variants' bit comparisons at S <= 512 in the Triton interpreter, no timing")
    return ap.parse_args(argv)


@contextlib.contextmanager
def variant(KI, name: str, config=None):
    """The score kernel with SCORE_AB[name]'s switches and, at T = 1 without a gather, config
    (keys a block, pipeline depth, programs a row, warps) in place of the shipped one."""
    shipped = KI._score_config
    saved = {switch: getattr(KI, switch) for switch in KI.SCORE_AB[name]}

    def configured(T, S, H_PAD, D_PAD, gather):
        tq, block_s, n_s, warps, stages = shipped(T, S, H_PAD, D_PAD, gather)
        if config is None or gather or T != 1:
            return tq, block_s, n_s, warps, stages
        return tq, config[0], config[2], config[3], 0 if KI.INTERPRET else config[1]
    try:
        for switch, value in KI.SCORE_AB[name].items():
            setattr(KI, switch, value)
        KI._score_config = configured
        yield
    finally:
        KI._score_config = shipped
        for switch, value in saved.items():
            setattr(KI, switch, value)


def fp4_case(torch, S, H, g, device):
    """T = 1 FP4 q [1, H, 64 B] and K [S, 64 B] (random bytes; scale bytes 122-129), BF16 head
    weights, every key visible: the arguments of _launch_scores up to the output."""
    qp = torch.randint(0, 256, (1, H, D // 2), device=device, dtype=torch.uint8, generator=g)
    qs = torch.randint(122, 130, (1, H, D // 32), device=device, dtype=torch.uint8, generator=g)
    kp = torch.randint(0, 256, (S, D // 2), device=device, dtype=torch.uint8, generator=g)
    ks = torch.randint(122, 130, (S, D // 32), device=device, dtype=torch.uint8, generator=g)
    w = (torch.randn(1, H, device=device, generator=g) * 0.02).bfloat16()
    vis = torch.full((1,), S, dtype=torch.int32, device=device)
    return qp, qs, kp, ks, w, vis


def launcher(KI, args, S, H, block_max, out):
    qp, qs, kp, ks, w, vis = args

    def run():
        KI._launch_scores(qp, qs, kp, ks, w, vis, None, 1, S, H, D, out, fp4=True, bf16=True, block_max=block_max)
    return run


def same_bits(torch, a, b) -> bool:
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def cpu_smoke() -> int:
    """Every variant at every smoke configuration (1-3 programs a row, 64 or 128 keys a block) on
    S = 512 (H 16) and S = 300 (H 4, a partial last block), scores and block maxima, bits
    against the shipped path's."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from dsv4spec.kernels import indexer as KI
    g = torch.Generator().manual_seed(3)
    ok = True
    for S, H, block_max in ((512, 16, 0), (512, 16, 8), (300, 4, 8)):
        args = fp4_case(torch, S, H, g, "cpu")
        out = torch.empty(1, S // block_max if block_max else S)
        run = launcher(KI, args, S, H, block_max, out)
        run()
        want = out.clone()
        for name in KI.SCORE_AB:
            for config in SMOKE_CONFIGS:
                out.fill_(float("nan"))
                with variant(KI, name, config):
                    run()
                same = same_bits(torch, out, want)
                ok &= same
                if not same:
                    print(f"S={S} H={H} block_max={block_max} {name} {config}: bits differ", flush=True)
        print(f"S={S} H={H} block_max={block_max}: {len(KI.SCORE_AB)} variants x {len(SMOKE_CONFIGS)} "
              f"configs, bits {'equal' if ok else 'DIFFER'}", flush=True)
    return 0 if ok else 1


def time_row(torch, KI, run, out, want, name, config, rep, bench, capture):
    """(same bits, eager µs, graph µs) of run under variant name and config; raises when it does
    not compile or launch."""
    with variant(KI, name, config):
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        same = same_bits(torch, out, want)
        graph, _ = capture(torch, run)
        tg = bench(graph.replay, rep) * 1e6
        te = bench(run, rep) * 1e6
        del graph
    return same, te, tg


def prepare(torch, KI, S, H, block_max, g, device):
    """One case: its inputs, output buffer, launch closure and the shipped path's output (and,
    for scores, that output's validity against torch's BF16-steps score)."""
    from bench_indexer import dequant_fp4, scores_validity, torch_scores_bf16
    args = fp4_case(torch, S, H, g, device)
    out = torch.empty(1, S // block_max if block_max else S, device=device)
    run = launcher(KI, args, S, H, block_max, out)
    run()
    c = dict(case=f"logits fp4 T=1 S={S} H={H}", out=f"block maxima /{block_max}" if block_max else "scores",
             run=run, buffer=out, want=out.clone(), k_bytes=S * (D // 2 + D // 32), validity=None)
    if not block_max:
        qp, qs, kp, ks, w, vis = args
        c["validity"] = scores_validity(torch, c["want"], torch_scores_bf16(
            torch, dequant_fp4(torch, qp, qs), dequant_fp4(torch, kp, ks), w, vis))
        print(f"{c['case']} shipped scores: {c['validity']}", flush=True)
    return c


def sweep(torch, KI, rep, copy, bench, capture, g, budget, variants=None, configs=CONFIGS, cases=CASES,
          device="cuda"):
    """Rows in priority order: the first two cases' variants at the shipped configuration, then
    their configurations under the shipped variant and under each case's fastest bit-identical
    one, then the same for the other cases; a row that does not compile or launch is reported and
    recorded as an error; rows past the budget are listed as skipped."""
    t_end = time.time() + budget
    names = list(KI.SCORE_AB) if variants is None else list(variants)
    rows, skipped = [], []

    def run_rows(c, plan):
        first = len(rows)
        for name, config in plan:
            head = dict(case=c["case"], out=c["out"], variant=name, config=config)
            if time.time() > t_end:
                skipped.append(head)
                continue
            try:
                same, te, tg = time_row(torch, KI, c["run"], c["buffer"], c["want"], name, config, rep, bench,
                                        capture)
            except Exception as e:   # a variant or configuration that does not compile or launch: say so, go on
                torch.cuda.synchronize()
                print(f"{c['case']} {c['out']} {name} {config}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                rows.append(dict(head, error=str(e)[:300]))
                continue
            row = dict(head, config="shipped" if config is None else dict(block_s=config[0], stages=config[1],
                                                                         programs=config[2], warps=config[3]),
                       eager_us=te, graph_us=tg, k_bytes=c["k_bytes"],
                       vs_copy=c["k_bytes"] / (tg * 1e-6) / 1e12 / copy, same_as_shipped=same,
                       validity_of_shipped=c["validity"])
            rows.append(row)
            print(f"{c['case']} {c['out']:16s} {name:10s} {str(config):20s} graph {tg:7.1f} us eager {te:7.1f} us "
                  f"{100 * row['vs_copy']:4.0f} % of copy  same {same}  ({time.time() - t_end + budget:.0f} s)",
                  flush=True)
        same_rows = [r for r in rows[first:] if r.get("same_as_shipped")]
        return min(same_rows, key=lambda r: r["graph_us"])["variant"] if same_rows else names[0]

    prepared = [prepare(torch, KI, S, H, block_max, g, device) for S, H, block_max in cases]
    for group in (prepared[:2], prepared[2:]):
        best = [run_rows(c, [(name, None) for name in names]) for c in group]
        for c, b in zip(group, best):
            run_rows(c, [(name, config) for config in configs[1:] for name in dict.fromkeys((names[0], b))])
    return rows, skipped


def markdown(result) -> str:
    lines = [f"# ab_logits on {result['device']}", "",
             f"copy {result['ceilings']['copy_TBps']:.2f} TB/s; torch {result['torch']}, Triton {result['triton']}; "
             f"{result['seconds']:.0f} s.", "",
             "| case | out | variant | config | eager µs | graph µs | % of copy | bits = shipped |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['out']} | {r['variant']} | {r['config']} | error: {r['error'][:80]} | | | |")
            continue
        lines.append(f"| {r['case']} | {r['out']} | {r['variant']} | {r['config']} | {r['eager_us']:.1f} | "
                     f"{r['graph_us']:.1f} | {100 * r['vs_copy']:.0f} | {r['same_as_shipped']} |")
    if result["skipped"]:
        lines += ["", f"Skipped (out of --budget): {len(result['skipped'])} rows."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cpu_smoke:
        return cpu_smoke()
    from ab_common import record, result, start
    session = start("ab_logits", a.rep)
    if session is None:
        return 2
    torch, ceil, t0 = session
    from bench_indexer import bench, capture
    from dsv4spec.kernels import indexer as KI
    g = torch.Generator(device="cuda").manual_seed(6)
    rows, skipped = sweep(torch, KI, a.rep, ceil["copy_TBps"], bench, capture, g, a.budget - (time.time() - t0))
    res = result(torch, ceil, t0, rows=rows, skipped=skipped)
    record(a.out, "ab_logits", res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
