"""`dsv4spec golden`: generate, verify and check against the golden tensors."""
from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers):
    p = subparsers.add_parser(
        "golden", help="generate or check the golden tensors (regression gate for ports and kernels)",
        description="Golden files live in the installed package (dsv4spec/golden/data) with a manifest "
                    "of sha256 hashes. `generate --out DIR` writes them (impl's outputs, checked against spec/; "
                    "rewriting the stored ones needs --force); `manifest` checks the hashes; "
                    "`check --target T` runs a target on the stored inputs; `export DIR` writes the "
                    "inputs, their layout (LAYOUT.md) and text vectors for a port in another language; "
                    "`check-outputs DIR` compares the output files that port wrote (same file names, "
                    "out.* tensors): exit 1 when one differs or is missing.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write every golden file and the manifest (impl's outputs, checked "
                                        "against spec/) to a directory")
    g.add_argument("--out", type=Path, help="directory (default: the package's golden/data, which needs --force)")
    g.add_argument("--force", action="store_true", help="overwrite the stored goldens in golden/data")
    sub.add_parser("manifest", help="check the stored files against the manifest hashes")
    c = sub.add_parser("check", help="run a target on the golden inputs and compare bit for bit")
    c.add_argument("--target", action="append", default=None, metavar="T")
    e = sub.add_parser("export", help="write the golden inputs, LAYOUT.md and text vectors for a port")
    e.add_argument("dir", type=Path)
    e.add_argument("--rules", metavar="PREFIX,...", help="only the cases gating these rules")
    o = sub.add_parser("check-outputs", help="compare a port's output directory with the goldens")
    o.add_argument("dir", type=Path)
    o.add_argument("--rules", metavar="PREFIX,...", help="only the cases gating these rules (the others "
                                                         "are not expected)")
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
        files = store.export(args.dir, rules=rules)
        print(f"wrote {len(files)} files to {args.dir} (read {args.dir / store.LAYOUT})")
        return 0
    if args.action == "check-outputs":
        results = store.check_outputs(args.dir, rules=rules)
        for rule, status, detail in results:
            print(f"{status:<8} {rule:<20} {detail}")
        bad = [s for _, s, _ in results if s != "PASS"]
        print(f"\n{len(results) - len(bad)} of {len(results)} golden outputs PASS"
              + (f"; {len(bad)} FAIL or MISSING (exit 1)" if bad else ""))
        return 1 if bad else 0
    from dsv4spec.properties.target import load_target
    status = 0
    for spec in args.target or ["impl"]:
        print(f"# {spec}")
        status |= _print(store.check_target(load_target(spec)))
    return status


def _print(results) -> int:
    for name, status, detail in results:
        print(f"{status:<16} {name}" + (f"  {detail}" if detail else ""))
    return 1 if any(s in ("FAIL", "ERROR") for _, s, _ in results) else 0
