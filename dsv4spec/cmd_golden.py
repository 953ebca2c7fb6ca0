"""`dsv4spec golden`: generate, verify and check against the golden tensors."""
from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers):
    p = subparsers.add_parser(
        "golden", help="generate or check the golden tensors (regression gate for ports and kernels)",
        description="Golden files live in the installed package (dsv4spec/golden/data) with a manifest "
                    "of sha256 hashes. `generate` rewrites them with impl; `manifest` checks the hashes; "
                    "`check --target T` runs a target on the stored inputs; `check-outputs DIR` compares "
                    "the output files a non-Python port wrote (same file names, out.* tensors).")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="regenerate every golden file and the manifest with impl")
    g.add_argument("--out", type=Path, help="directory (default: the package's golden/data)")
    sub.add_parser("manifest", help="check the stored files against the manifest hashes")
    c = sub.add_parser("check", help="run a target on the golden inputs and compare bit for bit")
    c.add_argument("--target", action="append", default=None, metavar="T")
    o = sub.add_parser("check-outputs", help="compare a port's output directory with the goldens")
    o.add_argument("dir", type=Path)
    p.set_defaults(func=run)


def run(args) -> int:
    from dsv4spec.golden import store
    if args.action == "generate":
        manifest = store.generate(args.out or store.DATA)
        print(f"wrote {len(manifest['files'])} golden files and {store.MANIFEST} to {args.out or store.DATA}")
        return 0
    problems = store.verify_manifest()
    if args.action == "manifest" or problems:
        for line in problems:
            print(line, file=sys.stderr)
        print("manifest: " + ("OK" if not problems else f"{len(problems)} problems"))
        return 1 if problems else 0
    if args.action == "check-outputs":
        if not args.dir.is_dir():
            raise FileNotFoundError(f"{args.dir} is not a directory of port outputs")
        return _print(store.check_outputs(args.dir))
    from dsv4spec.properties.target import load_target
    status = 0
    for spec in args.target or ["impl"]:
        print(f"# {spec}")
        status |= _print(store.check_target(load_target(spec)))
    return status


def _print(results) -> int:
    for name, status, detail in results:
        print(f"{status:<16} {name}" + (f"  {detail}" if detail else ""))
    return 1 if any(s == "FAIL" for _, s, _ in results) else 0
