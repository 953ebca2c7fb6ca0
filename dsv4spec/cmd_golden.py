"""`dsv4spec golden`: generate, verify and check against the golden tensors."""
from __future__ import annotations

import sys
from pathlib import Path


OPS_HELP = ("the operations the port implements (canonical names, `dsv4spec ops`; default: OUT/port.txt's "
            "ops= line): what calls none of them and has no output file reads n/i, as in verify, and a "
            "declared operation's missing output is still an error.  Declaring none, every output is expected")


def register(subparsers):
    p = subparsers.add_parser(
        "golden", help="generate or check the golden tensors (regression gate for ports and kernels)",
        description="Golden files live in the installed package (dsv4spec/golden/data) with a manifest "
                    "of sha256 hashes. `generate --out DIR` writes them (impl's outputs, checked against spec/; "
                    "rewriting the stored ones needs --force); `manifest` checks the hashes; "
                    "`check --target T` runs a target on the stored inputs; `export DIR` writes, for a port "
                    "in another language, the text vectors of every check (vectors/RULE.txt, the reference's "
                    "outputs in expected/), the golden cases' inputs (cases/) and LAYOUT.md describing them; "
                    "`check-vectors DIR OUT` judges the outputs the port wrote for the vectors, rule by rule, "
                    "with verify's checks; `check-outputs OUT` compares its outputs of the golden cases: "
                    "exit 1 when one fails, is missing or cannot be read.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write every golden file and the manifest (impl's outputs, checked "
                                        "against spec/) to a directory")
    g.add_argument("--out", type=Path, help="directory (default: the package's golden/data, which needs --force)")
    g.add_argument("--force", action="store_true", help="overwrite the stored goldens in golden/data")
    sub.add_parser("manifest", help="check the stored files against the manifest hashes")
    c = sub.add_parser("check", help="run a target on the golden inputs and compare bit for bit")
    c.add_argument("--target", action="append", default=None, metavar="T")
    e = sub.add_parser("export", help="write the text vectors, the golden cases' inputs and LAYOUT.md for a port",
                       description="Writes DIR/vectors/RULE.txt (the inputs of every call each rule's checks "
                                   "make on impl), DIR/expected/RULE.txt (impl's outputs), DIR/cases/ (the golden "
                                   "cases' inputs, text and safetensors), DIR/export.txt and DIR/LAYOUT.md (read "
                                   "it first: it states every format).  Files 0644, folders 0755.")
    e.add_argument("dir", type=Path)
    e.add_argument("--rules", metavar="PREFIX,...", help="only these rules' vectors and cases")
    e.add_argument("--level", type=int, choices=(1, 2, 3), default=2,
                   help="1: the checks' explicit examples (every boundary); 2 (default): and 25 generated "
                        "examples per check; 3: and the ci profile's generated examples")
    e.add_argument("--bf16", action="store_true",
                   help="BF16 input tensors for the operations the official code feeds BF16 (the quantizers): "
                        "vectors for a BF16-only port (default: float32, a superset of the values)")
    e.add_argument("--layers", action="store_true",
                   help="also the PATH.LAYER cases (index_layer on full-size weights, about 100 MB)")
    v = sub.add_parser("check-vectors", help="judge the outputs a port wrote for exported vectors, by rule",
                       description="Replays every exported rule's checks on the port's outputs OUT/RULE.txt "
                                   "(LAYOUT.md states the format): the same comparison policies, failure "
                                   "messages and variant naming as verify.  A missing or unreadable file or "
                                   "record is ERROR on the checks that need it; the rest is still judged.  "
                                   "A port that declares its operations (--ops, or ops= in OUT/port.txt) "
                                   "reads n/i on a rule that calls none of them and has no output file.  "
                                   "Exit 1 on any FAIL or ERROR.")
    v.add_argument("dir", type=Path, help="the export (written by `golden export`)")
    v.add_argument("out", type=Path, help="the port's outputs, one RULE.txt per rule it implements")
    v.add_argument("--rules", metavar="PREFIX,...", help="only these rules (the others are not expected)")
    v.add_argument("--ops", metavar="OP,...", help=OPS_HELP)
    o = sub.add_parser("check-outputs", help="compare a port's output directory with the goldens",
                       description="Compares the port's OUT/CASE.safetensors or OUT/CASE.txt with each golden "
                                   "case, bit for bit: PASS, FAIL, MISSING (no file, or an output absent), "
                                   "ERROR (unreadable) or n/i.  Exit 1 on any FAIL, MISSING or ERROR.")
    o.add_argument("dir", type=Path)
    o.add_argument("--rules", metavar="PREFIX,...", help="only the cases gating these rules (the others "
                                                         "are not expected)")
    o.add_argument("--ops", metavar="OP,...", help=OPS_HELP)
    p.set_defaults(func=run)


def run(args) -> int:
    from dsv4spec.golden import store
    if args.action == "generate":
        try:
            manifest = store.generate(args.out or store.DATA, force=args.force)
        except FileExistsError as e:
            print(f"dsv4spec golden generate: refused: {e}", file=sys.stderr)
            return 2
        print(f"wrote {len(manifest['files'])} golden files and {store.MANIFEST} to {args.out or store.DATA}")
        return 0
    problems = store.verify_manifest()
    if args.action == "manifest" or problems:
        for line in problems:
            print(line, file=sys.stderr)
        print("manifest: " + ("OK" if not problems else f"{len(problems)} problems"))
        return 1 if problems else 0
    rules = [p.strip() for p in (getattr(args, "rules", None) or "").split(",") if p.strip()] or None
    if args.action == "export":
        done = store.export(args.dir, rules=rules, level=args.level, layers=args.layers, bf16=args.bf16)
        files = [p for p in args.dir.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        print(f"wrote {len(files)} files, {size / 1e6:.1f} MB, to {args.dir}: vectors of "
              f"{sum(1 for rv in done['vectors'].values() if rv.records)} rules at level {args.level}, "
              f"{len(done['cases'])} golden cases (read {args.dir / store.LAYOUT})")
        return 0
    if args.action == "check-vectors":
        return _check_vectors(args, rules)
    if args.action == "check-outputs":
        results = store.check_outputs(args.dir, rules=rules, ops=args.ops)
        for rule, status, detail in results:
            print(f"{status:<8} {rule:<20} {detail}")
        bad = [s for _, s, _ in results if s not in ("PASS", "n/i")]
        absent = sum(s == "n/i" for _, s, _ in results)
        print(f"\n{sum(s == 'PASS' for _, s, _ in results)} of {len(results)} golden outputs PASS"
              + (f", {absent} n/i (not implemented)" if absent else "")
              + (f"; {len(bad)} FAIL, MISSING or ERROR (exit 1)" if bad else ""))
        if any(s == "FAIL" for _, s, _ in results):
            print("(a case is filed under the rule it gates; for the clause a difference breaks and the variant "
                  "it matches, answer the vectors of `golden export` and run `golden check-vectors`)")
        return 1 if bad else 0
    from dsv4spec.runner.target import load_target
    status = 0
    for spec in args.target or ["impl"]:
        print(f"# {spec}")
        status |= _print(store.check_target(load_target(spec)))
    return status


def _check_vectors(args, rules) -> int:
    from dsv4spec.golden import vectors
    from dsv4spec.runner.suite import program
    try:
        rows = vectors.judge(args.dir, args.out, rules=rules, program=program(), ops=args.ops)
    except (FileNotFoundError, ValueError) as e:
        print(f"dsv4spec golden check-vectors: {e}", file=sys.stderr)
        return 2
    for row in rows:
        first, *rest = (row.detail or "").splitlines() or [""]
        print(f"{row.status:<16} {row.rule_id:<24} {first}")
        for line in rest:
            print(f"{'':<41} {line}")
        if row.reproduce:
            print(f"{'':<41} reproduce: {row.reproduce}")
    bad = [r for r in rows if r.status in ("FAIL", "ERROR")]
    absent = sum(r.status == "n/i" for r in rows)
    print(f"\n{sum(r.status == 'PASS' for r in rows)} of {len(rows)} rules PASS"
          + (f", {absent} n/i (not implemented)" if absent else "")
          + (f"; {len(bad)} FAIL or ERROR (exit 1)" if bad else ""))
    return 1 if bad else 0


def _print(results) -> int:
    for name, status, detail in results:
        print(f"{status:<16} {name}" + (f"  {detail}" if detail else ""))
    return 1 if any(s in ("FAIL", "ERROR") for _, s, _ in results) else 0
