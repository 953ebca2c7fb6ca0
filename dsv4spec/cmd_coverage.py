"""`dsv4spec coverage`: which decision boundaries of each rule a profile's examples reach."""
from __future__ import annotations

import sys


def register(subparsers):
    p = subparsers.add_parser(
        "coverage", help="per rule, the decision boundaries a profile's examples reach and miss",
        description="Runs each rule's checks against a target (impl by default) through a recording proxy "
                    "and lists, per rule, its decision boundaries by level (element, scale, range, layout): "
                    "an E2M1 tie exactly, one ulp below and one above, amax on each power-of-two edge, "
                    "compress_lens a multiple of 8 … reached or MISSED, and which of them random draws reach "
                    "(in what share of one check's drawn examples; the goal is ≥ 1/50) rather than only "
                    "explicit @examples or a fixed sweep ('k of n' where a check draws under 50 examples, as "
                    "the layer checks do at ci (2) and in dev (10)).  A layer boundary also shows "
                    "the share of its layer strategy's own draws that reach it (400 keys drawn with a fixed "
                    "seed, nothing run).  Exit status 1 when a boundary is missed.")
    p.add_argument("--profile", default="ci", help="Hypothesis profile: ci (default), dev, thorough")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the dev and thorough profiles (default: a fresh "
                   "one, printed; ci is derandomized)")
    p.add_argument("--rules", metavar="PREFIX,...", help="rule id prefixes (default: every rule with boundaries)")
    p.add_argument("--target", default="impl", metavar="T", help="the target whose checks are recorded")
    p.add_argument("--reached", action="store_true", help="list the boundaries reached too")
    p.add_argument("--clauses", action="store_true",
                   help="list each rule's statement clauses beside the check and the catalogue mutants that fail "
                        "when that clause alone changes (GAP: none does)")
    p.set_defaults(func=run)


def run(args) -> int:
    from dsv4spec.command import UsageError, prefixes
    from dsv4spec.runner.coverage import coverage, render
    from dsv4spec.runner.suite import DERANDOMIZED, PROFILES, RUN, new_seed
    from dsv4spec.runner.target import load_target
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile {args.profile!r}; expected one of {', '.join(PROFILES)}")
    RUN.seed = None if args.profile in DERANDOMIZED else (args.seed if args.seed is not None else new_seed())
    if RUN.seed is not None:
        print(f"dsv4spec coverage: profile {args.profile}, seed {RUN.seed}", file=sys.stderr)

    def progress(rc):
        print(f"{rc.rule_id} …", file=sys.stderr, flush=True)

    results = coverage(prefixes(args.rules), load_target(args.target), args.profile,
                       progress=None if not sys.stderr.isatty() else progress)
    print(render(results, show_reached=args.reached, show_clauses=args.clauses))
    return 1 if any(rc.missed for rc in results) else 0
