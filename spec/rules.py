"""The rule record and its registry.

A rule is declared once, in the spec module of its family, next to the definitional code it
governs.  Everything else -- checks, reports, goldens -- refers to it by its id.
"""
from __future__ import annotations

from dataclasses import dataclass, field

NORMATIVE = "normative"
IMPLEMENTATION_DEFINED = "implementation-defined"
INFORMATIVE = "informative"
STATUSES = (NORMATIVE, IMPLEMENTATION_DEFINED, INFORMATIVE)

MODELS = ("v3.2", "v4-flash", "v4-pro", "v4.1-flash")
V4 = ("v4-flash", "v4-pro")
V41 = ("v4.1-flash",)
V4_ALL = V4 + V41

# The reference's scope: the one statement every "official domain" clause refers to (rendered as
# SPEC.md's section "The official domain"; its citations are checked like a rule's).
OFFICIAL_DOMAIN = """The official reference runs one prefill of s ≥ 1 tokens from position 0 (start_pos = 0:
queries i = positions 0 … s−1, one chunk), then decodes one token per step (start_pos = p > 0, seqlen 1,
the caches filled by the steps before it).  Nothing else is exercised: no chunked prefill, no prefill
at a later position, no decode of several tokens at once.  Its operations receive what that
run gives them: BF16 activations into the quantizers, index pools made by the candidate selection,
compressor chunks of s then 1 token.  Every rule is stated and checked on this domain; a behaviour
beyond it is an extension (below), checked only for targets that declare it, and never required."""
OFFICIAL_DOMAIN_SOURCES = (
    "V4-model L813-823 (the reference run: a prefill of 128 tokens from position 0, then positions 128-149 one "
    "token each)",
    "V4-model L325 (prefill is start_pos == 0)", "V4-model L343-348 (otherwise one token: squeeze(1))",
    "V4-model L518-530 (the window: prefill, else one token)", "V41-model L479-480 (decode squeezes one token)")

# Extensions beyond the official domain (design.md "Results, and when a target conforms"): checks
# labelled with one run only for targets that declare it (EXTENSIONS = {"chunked_prefill"}).
EXTENSIONS = {
    "chunked_prefill": "prefill in chunks starting at any position (the official domain: one prefill from position 0)",
    "streaming": "the compressor fed chunks of any size after the first (the official domain: one prefill from "
                 "position 0, then one token per decode step)",
}

# How a target's result is compared with the reference.
POLICIES = {
    "bytes": "byte equality; the first mismatch is decoded field by field",
    "exact": "exact equality of values (integers, booleans, exactly representable floats)",
    "tolerance": "values within a stated tolerance of a reference computed from the target's own inputs",
    "tie-aware": "validity plus equality of the multiset of reference scores at the chosen indices",
    "structural": "structural invariants plus equality of block-score multisets",
}


@dataclass(frozen=True)
class Knob:
    """A variant knob: one implementation-defined choice, its canonical value and the others seen."""

    name: str
    canonical: str
    alternatives: dict[str, str]  # value -> what it means / where it is seen
    doc: str
    declared_only: bool = False   # a step a port leaves out on purpose: taken as declared, never guessed

    @property
    def values(self) -> tuple[str, ...]:
        return (self.canonical, *self.alternatives)


@dataclass(frozen=True)
class Rule:
    """A normative rule fixes the official behaviour; if it names a knob, the other values of that
    knob are deviations seen in shipped code that a target may declare (reported VARIANT).  An
    implementation-defined rule covers what the official code leaves open; its knob's canonical
    value is the behaviour this suite chose."""

    id: str
    title: str
    statement: str
    status: str
    applies_to: tuple[str, ...]
    policy: str
    sources: tuple[str, ...]
    knob: str | None = None
    differs: str | None = None  # what a source document claims instead, and why the rule differs
    tolerance: str | None = None  # for policy "tolerance": the bound and its derivation
    extension: str | None = None  # beyond the official domain: the extension a target must declare
    family: str = field(default="", compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"rule {self.id}: status must be one of {STATUSES}, got {self.status!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"rule {self.id}: policy must be one of {tuple(POLICIES)}, got {self.policy!r}")
        if self.status == IMPLEMENTATION_DEFINED and self.knob is None:
            raise ValueError(f"rule {self.id}: an implementation-defined rule names its variant knob")
        if self.status == INFORMATIVE and self.knob is not None:
            raise ValueError(f"rule {self.id}: an informative rule has no variant knob")
        unknown = set(self.applies_to) - set(MODELS)
        if unknown:
            raise ValueError(f"rule {self.id}: unknown model profiles {sorted(unknown)}")
        if not self.sources:
            raise ValueError(f"rule {self.id}: a rule cites at least one source")
        if self.extension is not None and self.extension not in EXTENSIONS:
            raise ValueError(f"rule {self.id}: unknown extension {self.extension!r}; known: {sorted(EXTENSIONS)}")


RULES: dict[str, Rule] = {}
KNOBS: dict[str, Knob] = {}
SHARED_TOLERANCES: dict[str, str] = {}      # name -> a tolerance several rules share (SPEC.md states it once)


def shared_tolerance(name: str, text: str) -> str:
    """Name a tolerance several rules share, so that SPEC.md states it once and each rule refers to
    it by name; returns the text, for rule(..., tolerance=...)."""
    if name in SHARED_TOLERANCES:
        raise ValueError(f"shared tolerance {name!r} declared twice")
    SHARED_TOLERANCES[name] = " ".join(text.split())
    return text


def rule(id: str, title: str, statement: str, *, applies_to, policy: str, sources,
         status: str = NORMATIVE, knob: str | None = None, differs: str | None = None,
         tolerance: str | None = None, extension: str | None = None) -> Rule:
    """Declare a rule; the family is the id's first component."""
    if id in RULES:
        raise ValueError(f"rule {id} declared twice")
    r = Rule(id, title, " ".join(statement.split()), status, tuple(applies_to), policy,
             tuple(sources), knob, differs and " ".join(differs.split()),
             tolerance and " ".join(tolerance.split()), extension, id.split(".")[0])
    if knob is not None and knob not in KNOBS:
        raise ValueError(f"rule {id}: knob {knob!r} is not declared (declare it before the rule)")
    RULES[id] = r
    return r


def knob(name: str, canonical: str, alternatives: dict[str, str], doc: str, declared_only: bool = False) -> Knob:
    if name in KNOBS:
        raise ValueError(f"knob {name} declared twice")
    k = Knob(name, canonical, dict(alternatives), " ".join(doc.split()), declared_only)
    KNOBS[name] = k
    return k


def canonical_variants() -> dict[str, str]:
    return {k.name: k.canonical for k in KNOBS.values()}


def check_variants(declared: dict[str, str]) -> dict[str, str]:
    """The canonical variants overridden by a target's declared ones, validated."""
    merged = canonical_variants()
    for name, value in declared.items():
        if name not in KNOBS:
            raise ValueError(f"unknown variant knob {name!r}; known knobs: {', '.join(sorted(KNOBS))}")
        if value not in KNOBS[name].values:
            raise ValueError(f"knob {name!r} has no value {value!r}; expected one of {KNOBS[name].values}")
        merged[name] = value
    return merged


def select(prefixes: list[str] | None) -> list[Rule]:
    """The rules whose id starts with one of the comma-free prefixes (all when None)."""
    rules = sorted(RULES.values(), key=lambda r: r.id)
    if not prefixes:
        return rules
    for p in prefixes:
        if not any(_matches(r.id, p) for r in rules):
            families = sorted({r.family for r in rules})
            raise ValueError(f"no rule matches prefix {p!r}; families are {', '.join(families)}")
    return [r for r in rules if any(_matches(r.id, p) for p in prefixes)]


def _matches(rule_id: str, prefix: str) -> bool:
    return rule_id == prefix or rule_id.startswith(prefix.rstrip(".") + ".")
