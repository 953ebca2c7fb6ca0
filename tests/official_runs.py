"""Run the `official` control target in a Hypothesis profile with several seeds (not part of `make test`).

    python tests/official_runs.py --profile dev --seeds 20 --rules FMT,FP4,FP8
    python tests/official_runs.py --profile thorough --rules FMT,FP4,FP8

Seed N runs exactly what `dsv4spec verify --target official --profile dev --seed N` runs; seeds are
1 … N unless --first says otherwise.  Prints one summary line per seed and the totals; exits 1 if any row is
FAIL, ERROR or TIMEOUT, printing the row and the seed that reproduces it.
"""
import argparse
import collections
import sys
import time

from dsv4spec.properties.report import SHORT
from dsv4spec.properties.suite import ERROR, FAIL, PROFILES, RUN, TIMEOUT, verify
from dsv4spec.properties.target import load_target


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=PROFILES, default="dev")
    p.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    p.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--rules", default=None, help="rule id prefixes, e.g. FMT,FP4,FP8 (default: all)")
    p.add_argument("--target", default="official")
    args = p.parse_args(argv)
    target = load_target(args.target)
    prefixes = args.rules.split(",") if args.rules else None
    totals, bad = collections.Counter(), []
    for seed in range(args.first, args.first + args.seeds):
        RUN.seed = seed
        start = time.perf_counter()
        rows = verify([target], prefixes, args.profile)
        counts = collections.Counter(r.status for r in rows)
        totals.update(counts)
        bad += [(seed, r) for r in rows if r.status in (FAIL, ERROR, TIMEOUT)]
        print(f"seed {seed}: " + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(counts.items()))
              + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{args.target}, profile {args.profile}, {args.seeds} seed(s), rules {args.rules or 'all'}: "
          + ", ".join(f"{n} {SHORT[s]}" for s, n in sorted(totals.items())))
    for seed, r in bad:
        print(f"\n{r.status} {r.rule_id} (seed {seed}):\n    " + r.detail.replace("\n", "\n    "))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
