"""`dsv4spec mutate`: machine-made mutants of impl/ and official/, and the suite's score on them."""
from __future__ import annotations

import os
import sys


def register(subparsers):
    from dsv4spec.mutate import MODULES, OPERATORS
    p = subparsers.add_parser(
        "mutate", help="derive mutants from impl/ and official/ by AST and report which the rules catch",
        description="Every numeric constant (×2, ÷2, ±1, next fp32 up/down), comparison (< ↔ ≤, > ↔ ≥), "
                    "min/max, rounding or cast (removed; BF16 or E4M3 added), where (branches swapped) "
                    "and reduction axis of the selected modules becomes one mutant, loaded as a target in "
                    "memory and run at the ci profile on the rules whose checks reach the edited code, "
                    "stopping at the first rule it does not pass (killed).  Survivors are listed with "
                    "file:line and operator; tests/mutants/EQUIVALENT.toml marks the equivalent ones "
                    "(by id, with a reason).  Exit status 1 when a mutant survives.")
    p.add_argument("--modules", metavar="M,...", default=",".join(MODULES),
                   help=f"modules to mutate (default: all of {', '.join(MODULES)})")
    p.add_argument("--rules", metavar="PREFIX,...", help="only rules with these id prefixes (e.g. FMT,FP4)")
    p.add_argument("--operators", metavar="OP,...", default=",".join(OPERATORS),
                   help=f"mutation operators (default: {','.join(OPERATORS)})")
    p.add_argument("--shard", metavar="K/N", help="only every N-th mutant from the K-th (split a long pass)")
    p.add_argument("--id", action="append", default=[], metavar="ID", help="only this mutant (repeatable)")
    p.add_argument("--list", action="store_true", help="list the mutants (id, file:line) and run nothing")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    p.add_argument("--profile", default="ci", help="Hypothesis profile (default ci)")
    p.add_argument("--json", metavar="FILE", help="write every result and the scores as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the report (scores, survivors) as Markdown")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: report the results of earlier --json "
                   "files (shards run apart), the equivalence file applied again")
    p.add_argument("--resume", nargs="+", metavar="JSON", help="run only the mutants these earlier --json files "
                   "(a cut-off run's included) do not hold, and report them all together")
    p.set_defaults(func=run)


def run(args) -> int:
    from dsv4spec import mutate as M
    from dsv4spec.command import UsageError, prefixes
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in M.MODULES]
    operators = [o.strip() for o in args.operators.split(",") if o.strip()]
    bad_ops = [o for o in operators if o not in M.OPERATORS]
    if unknown or bad_ops:
        raise UsageError(f"unknown {'module' if unknown else 'operator'} {(unknown or bad_ops)[0]!r}; expected one "
                         f"of {', '.join(M.MODULES if unknown else M.OPERATORS)}")
    shard = None
    if args.shard:
        try:
            k, n = (int(v) for v in args.shard.split("/"))
            assert 1 <= k <= n
        except (ValueError, AssertionError):
            raise UsageError(f"--shard expects K/N with 1 ≤ K ≤ N, got {args.shard!r}") from None
        shard = (k, n)
    if not args.list:
        M.load_equivalent()         # before anything runs: a wheel without the checkout's file is told at once
    if args.merge:
        results = M.from_json(open(path).read() for path in args.merge)
        return _report(M, args, results, "dsv4spec mutate --merge " + " ".join(args.merge))
    mutants = M.select_mutants(modules, operators, shard, args.id)
    earlier = M.from_json(open(path).read() for path in args.resume) if args.resume else []
    done_ids = {r.mutant.id for r in earlier}
    mutants = [m for m in mutants if m.id not in done_ids]
    if args.list:
        for m in mutants:
            print(f"{m.path}:{m.line}  [{m.operator}] {m.change}\n    {m.id}")
        print(f"{len(mutants)} mutants")
        return 0
    prefixes = prefixes(args.rules)

    done_so_far = list(earlier)

    def progress(done, total, result):
        done_so_far.append(result)
        if args.json and (done % 10 == 0 or done == total):   # a cut-off run still leaves its results
            _write(args.json, M.to_json(done_so_far))
        where = f"{result.rule} {result.verdict}" if result.status == "killed" else ""
        print(f"[{done}/{total}] {result.status:<9} {result.seconds:5.1f}s {result.mutant.path}:{result.mutant.line} "
              f"[{result.mutant.operator}] {result.mutant.change[:70]} {where}", file=sys.stderr, flush=True)

    results = earlier + M.run(mutants, prefixes, args.profile, args.jobs, progress)
    command = "dsv4spec mutate " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "mutate" else ""
    return _report(M, args, results, command)


def _report(M, args, results, command) -> int:
    if args.json:
        _write(args.json, M.to_json(results))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(M.markdown(results, command))
    print(M.render(results))
    return 1 if any(r.status == "survived" for r in results) else 0


def _write(path: str, text: str) -> None:
    """Replace the file whole (a run killed while writing leaves the previous version, not half)."""
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
