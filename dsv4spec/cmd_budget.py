"""`dsv4spec budget`: cache bytes and indexer/attention work per layer kind, from the layer lists."""
from __future__ import annotations

import json
import re
import sys
from fractions import Fraction

SUFFIXES = {"": 1, "k": 2 ** 10, "m": 2 ** 20}
DEFAULT_CONTEXT = 2 ** 20


def register(subparsers):
    p = subparsers.add_parser(
        "budget", help="KV-cache bytes and indexer/attention work per layer kind",
        description="Per layer kind of a model: compressed-cache bytes per token (main KV and index K), "
                    "the constant sliding-window bytes, and the multiply-adds per generated token of "
                    "the indexer and of core attention at a context length; then totals.  Everything is "
                    "derived from the profile's layer list (spec/budget.py).")
    p.add_argument("--model", metavar="M", help="v4-flash, v4-pro or v4.1-flash (default: all three)")
    p.add_argument("--context", metavar="N", default=str(DEFAULT_CONTEXT),
                   help="context length in tokens: an integer, or with a binary suffix K (2^10) or M "
                        "(2^20); default 1M = 1048576")
    p.add_argument("--json", action="store_true", help="print the budget as JSON")
    p.add_argument("--plot", metavar="F.png", help="draw KV bytes and indexer work vs context for all "
                                                   "models (needs matplotlib)")
    p.set_defaults(func=run)


def parse_context(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", text or "")
    if not m:
        raise ValueError(f"--context must be a non-negative integer, optionally with K or M, got {text!r}")
    return int(m.group(1)) * SUFFIXES[m.group(2).lower()]


def run(args) -> int:
    from dsv4spec.spec import budget
    from dsv4spec.spec.models import profile
    from dsv4spec.spec.rules import V4_ALL
    try:
        context = parse_context(args.context)
        models = [args.model] if args.model else list(V4_ALL)
        for m in models:
            if profile(m).name not in V4_ALL:
                raise ValueError(f"budgets cover {', '.join(V4_ALL)}; {m} has no compressed KV cache")
        if args.plot:
            plot(args.plot, budget, V4_ALL)
    except ValueError as e:
        print(f"dsv4spec budget: error: {e}", file=sys.stderr)
        return 2
    summaries = [budget.summary(m, context) for m in models]
    if args.json:
        print(json.dumps([_plain(s) for s in summaries], indent=2))
    else:
        print("\n\n".join(table(s) for s in summaries))
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, Fraction):
        return int(v) if v.denominator == 1 else float(v)
    return v


def _num(v) -> str:
    if isinstance(v, Fraction):
        return f"{int(v):,}" if v.denominator == 1 else f"{float(v):,.4f}".rstrip("0")
    if isinstance(v, int) and v >= 10 ** 7:
        return f"{v:.3e}"
    return f"{v:,}"


COLUMNS = [("layers", "layers"), ("main_bytes_per_token", "main B/tok"), ("index_k_bytes_per_token", "index K B/tok"),
           ("window_bytes", "window B"), ("indexer_macs", "indexer MAC/tok"), ("attention_macs", "attention MAC/tok")]


def table(s: dict) -> str:
    rows = [[name] + [_num(r[key]) for key, _ in COLUMNS] for name, r in s["rows"].items()]
    t = s["totals"]
    rows.append(["total"] + [_num(t[key]) for key, _ in COLUMNS])
    head = ["layer kind"] + [title for _, title in COLUMNS]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [f"{s['model']} at context {s['context']:,} tokens (backbone layers; MAC = multiply-add, per generated token)",
             fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append(f"compressed cache {_num(t['kv_bytes_per_token'])} B/token; with the windows "
                 f"{_num(t['kv_bytes_at_context'])} B at this context")
    if t["indexer_macs_without_pool"] != t["indexer_macs"]:
        lines.append(f"indexer without the candidate pool: {_num(t['indexer_macs_without_pool'])} MAC/token "
                     f"(with it: {float(Fraction(t['indexer_macs'], t['indexer_macs_without_pool'])):.3f} of that)")
    return "\n".join(lines)


def plot(path: str, budget, models) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed; install it with "
                         "`pip install matplotlib` (it is not a dependency of dsv4spec)") from None
    contexts = [2 ** k for k in range(10, 24)]
    fig, (kv, idx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m in models:
        per_token, window = budget.kv_bytes_per_token(m), budget.window_bytes_per_layer(m) * len(budget.layer_budgets(m))
        kv.plot(contexts, [float(per_token * n + window) / 2 ** 30 for n in contexts], label=m)
        idx.plot(contexts, [budget.indexer_macs_per_token(m, n) for n in contexts], label=m)
        if budget.reindex_layers(m):
            idx.plot(contexts, [budget.indexer_macs_per_token(m, n, pool=False) for n in contexts], "--",
                     label=f"{m} without pool")
    kv.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="KV cache per sequence (GiB)",
           title="compressed cache + windows")
    idx.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="multiply-adds per generated token",
            title="indexer work (q·k)")
    for ax in (kv, idx):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
