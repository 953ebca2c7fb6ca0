"""Render the rule registry as the Markdown specification kept in the repository (SPEC.md)."""
from __future__ import annotations

from . import glossary, sources
from .models import PROFILES
from .rules import EXTENSIONS, KNOBS, OFFICIAL_DOMAIN, OFFICIAL_DOMAIN_SOURCES, POLICIES, RULES, SHARED_TOLERANCES

FAMILY_TITLES = {
    "FMT": "Exact number formats",
    "FP4": "FP4 E2M1 codecs",
    "FP8": "FP8 act_quant",
    "HAD": "Hadamard rotation",
    "IDX": "Lightning indexer",
    "POOL": "V4.1 candidate pool",
    "LAYER": "Layer roles",
    "CMP": "Compressor",
    "LAYOUT": "KV entry layouts",
    "BUDGET": "Bytes and work per token",
    "ROPE": "RoPE per layer",
    "PATH": "The indexer path, stage by stage",
    "ATTN": "Sparse attention",
}


def render() -> str:
    out = [
        "# dsv4spec — the rules",
        "",
        "Generated from the rule registry in `spec/` by `dsv4spec spec --write`; do not edit by hand "
        "(a test fails when this file is stale). Each rule: its id, status, the models it applies to, "
        "how a result is compared, its statement, and its sources, cited by the keys of the Sources "
        "section at the end (official code by line, source documents by section and line). Where a "
        "source document says otherwise, the rule says what it claimed and why the rule differs.  The "
        "terms the statements use are defined in the Glossary after the comparison policies.",
        "",
        "## Comparison policies",
        "",
        *[f"- **{name}**: {text}" for name, text in POLICIES.items()],
        "",
        "## Shared tolerances",
        "",
        "A tolerance several rules share, stated once; each of them names it.",
        "",
        *_shared_tolerances(),
        "",
        *glossary.render(),
        "## The official domain",
        "",
        " ".join(OFFICIAL_DOMAIN.split()),
        "",
        "Extensions (a target declares the ones it implements, `EXTENSIONS = {...}`):",
        "",
        *[f"- `{name}`: {text}" for name, text in EXTENSIONS.items()],
        "",
        "Sources: " + "; ".join(OFFICIAL_DOMAIN_SOURCES) + ".",
        "",
    ]
    families = list(dict.fromkeys(r.family for r in sorted(RULES.values(), key=_order)))
    for family in families:
        out += [f"## {family} — {FAMILY_TITLES.get(family, family)}", ""]
        for r in sorted((r for r in RULES.values() if r.family == family), key=lambda r: r.id):
            out += [f"### `{r.id}` — {r.title}", "",
                    f"*{r.status}*; applies to {', '.join(r.applies_to)}; compared by **{r.policy}**"
                    + (f"; variant knob `{r.knob}`" if r.knob else "") + ".",
                    r.statement, ""]
            if r.extension:
                out += [f"> **Extension** `{r.extension}`: beyond the official domain (see The official domain); checked only for "
                        "targets that declare it.", ""]
            if r.tolerance:
                out += [_tolerance(r.tolerance), ""]
            if r.differs:
                out += [f"> **Differs from the source documents.** {r.differs}", ""]
            out += ["Sources: " + "; ".join(r.sources) + ".", ""]
    out += ["## Variant knobs", "", "| knob | canonical | alternatives | meaning |", "|---|---|---|---|"]
    for k in sorted(KNOBS.values(), key=lambda k: k.name):
        alts = "; ".join(f"`{v}`: {d}" for v, d in k.alternatives.items())
        out.append(f"| `{k.name}` | `{k.canonical}` | {alts} | {k.doc} |")
    out += ["", "## Model profiles", "", "| model | layers (+draft) | index heads × dim | index_topk | "
            "score dtype | Hadamard | norm eps |", "|---|---|---|---|---|---|---|"]
    for m in PROFILES.values():
        out.append(f"| {m.name} | {m.n_layers} (+{m.n_draft}) | {m.index_n_heads} × {m.index_head_dim} | "
                   f"{m.index_topk} | {m.score_dtype} | {'yes' if m.hadamard else 'no'} | {m.norm_eps:g} |")
    out += ["", *sources.render()]
    return "\n".join(out).rstrip("\n") + "\n"


def _shared_tolerances() -> list[str]:
    """Each shared tolerance once; one that contains an earlier one names it instead of repeating it."""
    lines = []
    for name, text in SHARED_TOLERANCES.items():
        for earlier in list(SHARED_TOLERANCES)[:list(SHARED_TOLERANCES).index(name)]:
            text = text.replace(SHARED_TOLERANCES[earlier], f"**{earlier}** (above)")
        lines.append(f"- **{name}**: {text}")
    return lines


def _tolerance(text: str) -> str:
    """A rule's tolerance, naming the shared tolerance it starts with (the longest) instead of
    repeating it."""
    shared = [name for name, common in SHARED_TOLERANCES.items() if text.startswith(common)]
    if not shared:
        return f"Tolerance: {text}"
    name = max(shared, key=lambda n: len(SHARED_TOLERANCES[n]))
    rest = text[len(SHARED_TOLERANCES[name]):].strip()
    return f"Tolerance: **{name}** (Shared tolerances)" + (f"; {rest}" if rest else ".")


def _order(rule):
    keys = list(FAMILY_TITLES)
    return (keys.index(rule.family) if rule.family in keys else len(keys), rule.id)


def statement_texts() -> dict[str, str]:
    """Every text SPEC.md renders as a statement, keyed by where it is: the rules' titles,
    statements, tolerances and `differs`, and the knobs' meanings and alternatives."""
    out = {}
    for r in RULES.values():
        for part in ("title", "statement", "tolerance", "differs"):
            if getattr(r, part):
                out[f"{r.id} {part}"] = getattr(r, part)
    for k in KNOBS.values():
        out[f"knob {k.name}"] = " ".join([k.doc, *k.alternatives.values()])
    return out


def defined_elsewhere() -> tuple[str, ...]:
    """What SPEC.md defines outside the glossary: rule ids, model names, knob names, `knob=value`
    choices and the identifier-like knob values (payload_first); a bare word that is also a knob
    value (bf16, clamp) still needs its glossary entry."""
    return (*RULES, *PROFILES, *(f"{k.name}={v}" for k in KNOBS.values() for v in k.values), *KNOBS,
            *(v for k in KNOBS.values() for v in k.values if "_" in v))


def undefined_terms() -> dict[str, set[str]]:
    """Statement -> the terms it uses that the glossary does not define (empty when all are)."""
    elsewhere = defined_elsewhere()
    found = {where: glossary.undefined(text, elsewhere) for where, text in statement_texts().items()}
    return {where: terms for where, terms in found.items() if terms}
