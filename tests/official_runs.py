"""Run the `official` control target in a Hypothesis profile with several seeds (not part of `make test`).

    python tests/official_runs.py --profile dev --seeds 20 --rules FMT,FP4,FP8
    python tests/official_runs.py --profile dev --seeds 10 --jobs 14 --log runs.jsonl
    python tests/official_runs.py --profile thorough --rules FMT,FP4,FP8

Seed N runs exactly what `dsv4spec verify --target official --profile dev --seed N` runs; seeds are
1 … N unless --first says otherwise.  With --jobs, every (seed, rule) pair is one task of a pool of
worker processes, so one slow rule does not hold a seed back.  --log appends each finished pair as a
JSON line (a cut-off run keeps what it finished) and skips the pairs it already holds (a rerun resumes).
Prints one summary line per seed and the totals; exits 1 if any row is FAIL, ERROR or TIMEOUT,
printing the row and the seed that reproduces it.
"""
import argparse
import collections
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from dsv4spec.properties.report import SHORT
from dsv4spec.properties.suite import ERROR, FAIL, PROFILES, RUN, TIMEOUT, verify
from dsv4spec.properties.target import load_target
from dsv4spec.spec.rules import select

_TARGETS = {}


def run_pair(target_name: str, profile: str, seed: int, rule_id: str) -> dict:
    """One rule under one seed, in this process: a JSON-able record."""
    if target_name not in _TARGETS:
        _TARGETS[target_name] = load_target(target_name)
    RUN.seed = seed
    start = time.perf_counter()
    row = verify([_TARGETS[target_name]], profile=profile, rule_ids=[rule_id])[0]
    return dict(seed=seed, rule=rule_id, status=row.status, detail=row.detail,
                seconds=round(time.perf_counter() - start, 2))


def _logged(path) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=PROFILES, default="dev")
    p.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    p.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--rules", default=None, help="rule id prefixes, e.g. FMT,FP4,FP8 (default: all)")
    p.add_argument("--target", default="official")
    p.add_argument("--jobs", type=int, default=1, help="worker processes over (seed, rule) pairs (default 1)")
    p.add_argument("--log", help="JSON-lines file: append each finished pair, skip the pairs it holds")
    args = p.parse_args(argv)
    seeds = range(args.first, args.first + args.seeds)
    rules = [r.id for r in select(args.rules.split(",") if args.rules else None)]
    records = [r for r in _logged(args.log) if r["seed"] in seeds and r["rule"] in rules]
    done = {(r["seed"], r["rule"]) for r in records}
    todo = [(s, r) for s in seeds for r in rules if (s, r) not in done]
    todo.sort(key=lambda pair: not pair[1].endswith("LAYER"))      # the longest rules first: no late straggler
    log = open(args.log, "a") if args.log else None

    def finished(record):
        records.append(record)
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        print(f"[{len(records)}/{len(seeds) * len(rules)}] seed {record['seed']} {record['rule']} "
              f"{SHORT[record['status']]} ({record['seconds']:.0f} s)", file=sys.stderr, flush=True)

    if args.jobs <= 1:
        for seed, rule in todo:
            finished(run_pair(args.target, args.profile, seed, rule))
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_pair, args.target, args.profile, s, r) for s, r in todo]
            for f in as_completed(futures):
                finished(f.result())
    by_seed = collections.defaultdict(list)
    for r in records:
        by_seed[r["seed"]].append(r)
    totals = collections.Counter()
    for seed in seeds:
        counts = collections.Counter(r["status"] for r in by_seed[seed])
        totals.update(counts)
        print(f"seed {seed}: " + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(counts.items()))
              + f" ({sum(r['seconds'] for r in by_seed[seed]):.0f} s of rule time"
              + (f", {len(rules) - len(by_seed[seed])} rules not run)" if len(by_seed[seed]) < len(rules) else ")"))
    print(f"{args.target}, profile {args.profile}, {args.seeds} seed(s), rules {args.rules or 'all'}: "
          + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(totals.items())))
    bad = [r for r in records if r["status"] in (FAIL, ERROR, TIMEOUT)]
    for r in bad:
        print(f"\n{r['status']} {r['rule']} (seed {r['seed']}):\n    " + r["detail"].replace("\n", "\n    "))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
