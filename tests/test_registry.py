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
    official = {k for k, c in sources.CODE.items() if c.official}
    assert official < set(sources.CODE)     # shipped third-party code is keyed too, but never alone
    for r in RULES.values():
        assert sources.keys_cited(r.sources) & official, r.id
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
    ("V4-kernel-60d8", "expected 'V4-kernel-60d8 <section or note>'"),
    # nothing outside the repository, whatever the key
    ("official-rules.md §5.1", "outside the repository"),
    ("conventions.md 'Knobs'", "outside the repository"),
    ("doc-000 Q&A 1 L13 (shared/seeds/000_441c543b83921174.txt)", "outside the repository"),
    ("V4-model L12 (../shared/reference/official-v4/model.py)", "outside the repository"),
])
def test_a_citation_that_cannot_be_followed_fails(citation, complaint):
    assert any(complaint in p for p in sources.problems(citation)), sources.problems(citation)


def test_no_source_is_a_file_outside_the_repository():
    """The Sources table keys official code by repository, path and revision, and source documents by
    title and section: no key is a project note, no document row names a local file."""
    assert not {"official-rules.md", "conventions.md"} & set(sources.SOURCES)
    for key, code in sources.CODE.items():
        assert code.repository and code.path and code.revision, key
        assert not sources.OUTSIDE.search(f"{code.repository} {code.path} {code.note}"), key
    for key, doc in sources.DOCUMENTS.items():
        assert doc.title and doc.sections and not hasattr(doc, "file"), key


def _outside_sources(text: str) -> str:
    head, _, rest = text.partition("\n## Sources\n")
    return head


def test_spec_md_names_no_path_outside_the_repository():
    """SPEC.md never points into the project's working folders, and every path it names outside the
    Sources table (whose paths are the cited repositories' own) is a file of this repository."""
    text = (ROOT / "SPEC.md").read_text()
    assert not sources.OUTSIDE.search(text), sources.OUTSIDE.search(text)[0]
    body = _outside_sources(text)
    paths = set(re.findall(r"[\w.-]+(?:/[\w.-]+)+\.(?:py|md|txt|json)\b", body))
    assert paths, "SPEC.md names no file at all: the check would be vacuous"
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []
    bare = set(re.findall(r"(?<![\w/.-])[\w-]+\.(?:py|md|txt|json)\b", body))
    cited = {Path(c.path).name for c in sources.CODE.values()}
    assert sorted(bare - cited - {p.name for p in ROOT.rglob("*") if p.is_file()}) == []


def test_a_path_outside_the_repository_in_spec_md_is_caught(monkeypatch):
    import dsv4spec.spec.document as document
    monkeypatch.setitem(RULES, "FMT.BF16.RNE", __import__("dataclasses").replace(
        RULES["FMT.BF16.RNE"], sources=RULES["FMT.BF16.RNE"].sources + ("official-rules.md §4.1",)))
    assert sources.OUTSIDE.search(document.render())
    assert any("outside the repository" in p for c in RULES["FMT.BF16.RNE"].sources for p in sources.problems(c))


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


# ------------------------------------------------------------------------------------------------
# The glossary
# ------------------------------------------------------------------------------------------------
def test_every_term_a_statement_uses_is_in_the_glossary():
    from dsv4spec.spec.document import undefined_terms
    assert undefined_terms() == {}, "terms used but not in spec/glossary.py GLOSSARY"


def test_the_term_finder_sees_the_terms_of_the_statements():
    """Not vacuous: the finder picks up the identifiers and words the statements really use."""
    from dsv4spec.spec import glossary
    from dsv4spec.spec.document import defined_elsewhere, statement_texts
    used = set().union(*(glossary.terms(t, defined_elsewhere()) for t in statement_texts().values()))
    for term in ("compress_lens", "fl32", "start_pos", "end_pos", "E2M1", "E4M3", "E8M0", "BF16 ulp", "amax",
                 "QDQ", "ratio", "window", "pool", "candidate", "teacher forcing", "index_topk", "bf16"):
        assert term in used, term
    assert len(used) > 100


@pytest.mark.parametrize("added, term", [
    ("the row is cut at frobnicate_width", "frobnicate_width"),     # an identifier
    ("then squash(x) is taken", "squash"),                          # a called name
    ("as `frob` says", "frob"),                                     # a backticked word
    ("as in teacher forcing", None),                                # a TERMS word that is defined
])
def test_a_statement_with_an_undefined_term_fails(monkeypatch, added, term):
    from dataclasses import replace
    from dsv4spec.spec.document import undefined_terms
    monkeypatch.setitem(RULES, "IDX.MASK", replace(RULES["IDX.MASK"], statement=RULES["IDX.MASK"].statement + " " + added))
    found = undefined_terms()
    assert found == ({"IDX.MASK statement": {term}} if term else {})


def test_a_term_dropped_from_the_glossary_fails(monkeypatch):
    from dsv4spec.spec import glossary
    from dsv4spec.spec.document import undefined_terms
    for term in ("compress_lens", "teacher forcing", "fl32"):
        monkeypatch.delitem(glossary.GLOSSARY, term)
    missing = set().union(*undefined_terms().values())
    assert missing == {"compress_lens", "teacher forcing", "fl32"}


def test_every_glossary_term_is_used_and_rendered():
    """No dead entries: each term occurs in SPEC.md outside the glossary, and the glossary is rendered."""
    from dsv4spec.spec import glossary
    text = (ROOT / "SPEC.md").read_text()
    head, _, rest = text.partition("## Glossary\n")
    section, _, tail = rest.partition("\n## ")
    others = head + tail
    unused = [t for t in glossary.GLOSSARY if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", others)]
    assert unused == []
    for term in glossary.GLOSSARY:
        assert f"- **{term}**:" in section, term
def test_the_official_domain_is_stated_once_and_its_citations_can_be_followed():
    from dsv4spec.spec import sources
    from dsv4spec.spec.document import render
    from dsv4spec.spec.rules import EXTENSIONS, OFFICIAL_DOMAIN_SOURCES
    assert [p for c in OFFICIAL_DOMAIN_SOURCES for p in sources.problems(c)] == []
    text = render()
    assert text.count("## The official domain") == 1 and all(f"`{name}`" in text for name in EXTENSIONS)
    assert "beyond the reference" not in text     # every such clause names the official domain instead
