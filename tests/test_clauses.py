"""The clause listing: each rule's statement clauses, quoted from spec/, beside the check and the
catalogue mutants that fail when that clause alone changes; no clause without one (a gap)."""
import pytest

from dsv4spec.properties import clauses as CL
from dsv4spec.properties.suite import FAIL, checks_for, load_checks, run_check
from dsv4spec.properties.target import Target
from dsv4spec.spec import RULES
from mutants import catalogue

CATALOGUE = {(name, rule_id): provider for name, rule_id, provider in catalogue()}
LISTED = sorted({c.rule_id for c in load_checks() if c.rule_id.split(".")[0] in CL.FAMILIES})


def test_every_checked_rule_of_the_listed_families_has_clauses():
    assert [r for r in LISTED if not CL.clauses(r)] == []
    assert set(CL.CLAUSES) <= set(RULES)


def test_each_clause_is_quoted_from_its_statement():
    wrong = {r: cl.text for r, cls in CL.CLAUSES.items() for cl in cls
             if CL.normalized(cl.text) not in CL.normalized(RULES[r].statement)}
    assert wrong == {}


def test_each_clause_names_a_catalogue_mutant_of_its_rule_and_a_check_of_it():
    gaps = [(r, cl.text) for r, cls in CL.CLAUSES.items() for cl in cls if not cl.mutants]
    assert gaps == []
    unknown = [(r, m) for r, cls in CL.CLAUSES.items() for cl in cls for m in cl.mutants if (m, r) not in CATALOGUE]
    assert unknown == []
    for r, cls in CL.CLAUSES.items():
        names = [chk.name for chk in checks_for(r)]
        for cl in cls:
            assert (cl.check in names) if cl.check else len(names) == 1, (r, cl.text, names)


MULTI = [(r, cl.check, m) for r, cls in CL.CLAUSES.items() for cl in cls if cl.check for m in cl.mutants]


@pytest.mark.parametrize("rule_id, check, name", MULTI, ids=[f"{m}-{c}" for _, c, m in MULTI])
def test_the_named_check_fails_on_the_clause_mutant(rule_id, check, name):
    """Where a rule has several checks, the one the listing names is the one that fails."""
    chk = next(chk for chk in checks_for(rule_id) if chk.name == check)
    assert run_check(chk, Target(CATALOGUE[(name, rule_id)], name), "ci", shrink=False).status == FAIL
