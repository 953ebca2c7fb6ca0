"""The registry itself: well-formed rules, a check for every rule that needs one, a mutant for every
checked rule, and SPEC.md in step with the registry."""
import re
from pathlib import Path

import pytest

from dsv4spec.spec import KNOBS, RULES, claims, sources
from dsv4spec.spec.document import render
from dsv4spec.spec.rules import INFORMATIVE, MODELS
from dsv4spec.properties.suite import checks_for, load_checks

ROOT = Path(__file__).resolve().parent.parent


def test_spec_md_is_current():
    assert (ROOT / "SPEC.md").read_text() == render(), \
        "SPEC.md is stale: run `dsv4spec spec --write SPEC.md` (or `make spec`) and commit it"


def test_ids_are_dotted_family_first_and_stable_shape():
    for rule_id in RULES:
        assert re.fullmatch(r"[A-Z][A-Z0-9]*(\.[A-Z0-9_]+)+", rule_id), rule_id


def test_every_rule_cites_the_official_code_or_reference():
    for r in RULES.values():
        assert sources.keys_cited(r.sources) & set(sources.CODE), r.id
        assert set(r.applies_to) <= set(MODELS) and r.applies_to, r.id


def test_every_citation_is_keyed_in_sources():
    """Each citation names a key of the Sources table; a document citation names one of its
    sections and lines inside it; a code citation gives line numbers."""
    bad = [p for r in RULES.values() for c in r.sources for p in sources.problems(c)]
    assert bad == []


@pytest.mark.parametrize("citation, complaint", [
    ("seed 000 Q&A 1", "not in Sources"),
    ("V5-model L12", "not in Sources"),
    ("doc-000 Q&A 9 L13", "with a section of"),
    ("doc-000 Q&A 1", "with a section of"),
    ("doc-003 §9.2 L262", "outside §9.2"),
    ("doc-002 Q&A 5 L22-24", "outside Q&A 5"),
    ("V4-model (Indexer)", "expected 'V4-model L<a>"),
    ("official-rules.md", "expected 'official-rules.md <section"),
])
def test_a_citation_that_cannot_be_followed_fails(citation, complaint):
    assert any(complaint in p for p in sources.problems(citation)), sources.problems(citation)


def test_every_differs_names_the_documents_it_disputes():
    """'Differs from the source documents' says which one, and the rule cites it."""
    for r in RULES.values():
        if r.differs:
            disputed = claims.documents_disputed(r.id)
            assert disputed, f"{r.id}: differs names no document"
            assert disputed <= sources.keys_cited(r.sources), f"{r.id}: cites none of {sorted(disputed)}"


def test_every_source_is_cited_and_rendered():
    cited = set().union(*(sources.keys_cited(r.sources) for r in RULES.values()),
                        *(sources.keys_cited(c.sources) for c in claims.CLAIMS))
    assert cited == set(sources.SOURCES), f"never cited: {sorted(set(sources.SOURCES) - cited)}"
    text = render().split("## Sources", 1)[1]
    for key in sources.SOURCES:
        assert f"| `{key}` |" in text, key


def test_every_knob_is_named_by_a_rule():
    named = {r.knob for r in RULES.values() if r.knob}
    assert set(KNOBS) <= named, f"knobs no rule names: {sorted(set(KNOBS) - named)}"


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_every_non_informative_rule_has_a_check(rule_id):
    load_checks()
    if RULES[rule_id].status != INFORMATIVE:
        assert checks_for(rule_id), f"{rule_id} has no check in properties/"


def test_every_checked_rule_has_a_mutant_that_is_caught_on_it():
    """A property that no mutant can fail is suspect: every rule with a check has a mutant aimed at it
    (tests/test_mutants.py asserts the mutant is caught)."""
    from mutants import catalogue
    aimed = {rule_id for _, rule_id, _ in catalogue()}
    load_checks()
    missing = [r for r in sorted(RULES) if checks_for(r) and r not in aimed]
    assert not missing, f"rules with checks but no mutant: {missing}"


def test_the_operation_contract_is_complete():
    """Every operation a check needs is documented in some properties/<family>.py OPS, and every
    documented operation is checked by at least one rule."""
    import importlib
    from dsv4spec.properties.suite import FAMILY_MODULES
    documented = set()
    for family in FAMILY_MODULES:
        documented |= set(getattr(importlib.import_module(f"dsv4spec.properties.{family}"), "OPS", {}))
    needed = {op for c in load_checks() for op in c.ops}
    assert needed <= documented, f"checked but undocumented operations: {sorted(needed - documented)}"
    assert documented <= needed, f"documented but never checked: {sorted(documented - needed)}"


def test_the_official_domain_is_stated_once_and_its_citations_can_be_followed():
    from dsv4spec.spec import sources
    from dsv4spec.spec.document import render
    from dsv4spec.spec.rules import EXTENSIONS, OFFICIAL_DOMAIN_SOURCES
    assert [p for c in OFFICIAL_DOMAIN_SOURCES for p in sources.problems(c)] == []
    text = render()
    assert text.count("## The official domain") == 1 and all(f"`{name}`" in text for name in EXTENSIONS)
    assert "beyond the reference" not in text     # every such clause names the official domain instead
