"""One cause, one verdict (properties/causes.py): a wrong shared operation fails several rules; the
report names the rule whose clause comes first and marks the others, statuses unchanged."""
from mutants.indexer import MUTANTS

from dsv4spec.properties import causes as C
from dsv4spec.properties.suite import FAIL, PASS, Row, exit_status, run_rule
from dsv4spec.properties.target import Target

SCORE_RULES = ("IDX.MASK", "IDX.SCORE.ROUNDING", "IDX.SCORE.FORMULA")


def test_a_wrong_index_scores_is_reported_with_one_cause():
    provider, _ = MUTANTS["relu_after_weight"]
    target = Target(provider, "relu_after_weight")
    rows = [run_rule(rule_id, target) for rule_id in SCORE_RULES]
    failing = [r.rule_id for r in rows if r.status == FAIL]
    assert "IDX.SCORE.FORMULA" in failing and len(failing) >= 2, [(r.rule_id, r.status) for r in rows]
    marked = C.annotate(rows)
    assert [r.status for r in marked] == [r.status for r in rows]
    assert exit_status(marked, [target]) == exit_status(rows, [target])
    cause = [r for r in marked if r.status == FAIL and not C.is_marked(r)]
    assert [r.rule_id for r in cause] == ["IDX.SCORE.FORMULA"]
    for r in marked:
        if r.status == FAIL and r.rule_id != "IDX.SCORE.FORMULA":
            assert r.detail.startswith("same cause as IDX.SCORE.FORMULA (index_scores): "), r.detail


def _row(rule_id, status, check, target="t"):
    return Row(rule_id, target, status, "detail", checks={check: status})


def test_only_failures_on_the_shared_operation_are_grouped_and_per_target():
    from dsv4spec.properties.suite import checks_for
    mask, = [c.name for c in checks_for("IDX.MASK")][:1]
    rounding = checks_for("IDX.SCORE.ROUNDING")[0].name
    topk = checks_for("IDX.TOPK.COUNT")[0].name
    rows = [_row("IDX.MASK", FAIL, mask), _row("IDX.SCORE.ROUNDING", FAIL, rounding),
            _row("IDX.TOPK.COUNT", FAIL, topk), _row("IDX.MASK", FAIL, mask, target="other"),
            _row("IDX.SCORE.FORMULA", PASS, "x")]
    found = C.causes(rows)
    assert found == {("IDX.MASK", "t"): ("IDX.SCORE.ROUNDING", "index_scores")}
