"""One cause, one verdict (runner/causes.py): a wrong shared operation fails several rules; the
report names the rule whose clause a probe shows broken (else the first in the computation order)
and marks the others, statuses unchanged."""
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


def test_a_layer_rule_is_marked_with_the_rule_of_its_first_broken_stage():
    from dsv4spec.properties.suite import checks_for
    layer = checks_for("PATH.LAYER")[0].name
    norm = checks_for("PATH.K.NORM")[0].name
    broken = f"{layer}: PATH.LAYER: first broken stage 'k_normed' (PATH.K.NORM) [LayerCase('v4.1-flash layer 20')]"
    rows = [Row("PATH.K.NORM", "t", FAIL, "detail", checks={norm: FAIL}),
            Row("PATH.LAYER", "t", FAIL, broken, checks={layer: FAIL}),
            Row("PATH.LAYER", "u", FAIL, broken, checks={layer: FAIL})]       # its stage rule passes on u
    assert C.causes(rows) == {("PATH.LAYER", "t"): ("PATH.K.NORM", "index_layer stage k_normed")}
    marked = C.annotate(rows)
    assert [r.status for r in marked] == [FAIL] * 3
    assert marked[1].detail == "same cause as PATH.K.NORM (index_layer stage k_normed): " + broken
    assert not C.is_marked(marked[0]) and not C.is_marked(marked[2])


def test_an_attention_layer_failure_follows_its_stage_rule_to_that_rule_s_cause():
    """ATTN.LAYER's stage o is judged by ATTN.PROB.ORDER; a wrong sparse_attention that fails it and
    an earlier clause (sparse_attention's order) is reported once, on the earlier clause."""
    from dsv4spec.properties.suite import checks_for
    first, second = C.CLAUSE_ORDER["sparse_attention"][:2]
    layer = checks_for("ATTN.LAYER")[0].name
    rows = [Row(first, "t", FAIL, "detail", checks={checks_for(first)[0].name: FAIL}),
            Row("ATTN.PROB.ORDER", "t", FAIL, "detail", checks={checks_for("ATTN.PROB.ORDER")[0].name: FAIL}),
            Row("ATTN.LAYER", "t", FAIL, f"{layer}: ATTN.LAYER: first broken stage 'o' (ATTN.PROB.ORDER) [case]",
                checks={layer: FAIL})]
    found = C.causes(rows)
    assert found[("ATTN.LAYER", "t")] == found[("ATTN.PROB.ORDER", "t")] == (first, "sparse_attention")


def test_a_wrong_sparse_attention_is_reported_on_its_clause():
    """Probabilities rounded against the global max fail ATTN.PROB.ORDER and the V4.1 leading −1
    rows of ATTN.INIT: one cause, PROB.ORDER (CLAUSE_ORDER's order is the catalogue's: each
    sparse_attention mutant's own rule comes first among the rules it fails)."""
    from mutants.attn import MUTANTS as ATTN
    provider, rule_id = ATTN["probabilities_rounded_against_the_global_max"]
    target = Target(provider, "global_max")
    rows = C.annotate([run_rule(r, target) for r in ("ATTN.INIT", "ATTN.PROB.ORDER")])
    assert [r.status for r in rows] == [FAIL, FAIL]
    assert rows[0].detail.startswith("same cause as ATTN.PROB.ORDER (sparse_attention): ") and not C.is_marked(rows[1])


# A port whose gather reads the row after each listed one (−1 still adds nothing): every ATTN
# check reads the output, so ATTN.SCORE, first in CLAUSE_ORDER, fails too.
NEXT_ROW_PORT = """import torch
from dsv4spec.impl import sparse_attention as _reference
NAME = "next_row"

def sparse_attention(q, kv, sink, indices, scale, *, model):
    shifted = torch.where(indices == -1, indices, (indices + 1) % kv.shape[0])
    return _reference(q, kv, sink, shifted, scale, model=model)
"""


def _next_row_target(tmp_path, monkeypatch):
    (tmp_path / "next_row_port.py").write_text(NEXT_ROW_PORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    import next_row_port
    return Target(next_row_port, "next_row_port")


def test_a_gather_reading_the_wrong_rows_is_reported_on_attn_gather(tmp_path, monkeypatch):
    """The gather probe (only the listed rows decide the output) fails: ATTN.GATHER leads although
    ATTN.SCORE comes first in the computation order; without the target, the order alone decides."""
    target = _next_row_target(tmp_path, monkeypatch)
    rows = [run_rule(r, target) for r in ("ATTN.SCORE", "ATTN.GATHER")]
    assert [r.status for r in rows] == [FAIL, FAIL], [(r.rule_id, r.detail) for r in rows]
    score, gather = C.annotate(rows, [target])
    assert not C.is_marked(gather), gather.detail
    assert score.detail.startswith("same cause as ATTN.GATHER (sparse_attention): "), score.detail
    assert C.causes(rows) == {("ATTN.GATHER", "next_row"): ("ATTN.SCORE", "sparse_attention")}


def test_the_verify_report_names_the_gather_as_the_cause(tmp_path, monkeypatch):
    """verify's report probes the targets it loaded (in process: the subprocess costs seconds)."""
    import json
    from dsv4spec.cli import main
    (tmp_path / "next_row_port.py").write_text(NEXT_ROW_PORT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["verify", "--target", "next_row_port", "--rules", "ATTN.SCORE,ATTN.GATHER", "--quiet",
                 "--json", "r.json"]) == 1
    details = {r["rule"]: r["detail"] for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert details["ATTN.SCORE"].startswith("same cause as ATTN.GATHER (sparse_attention): "), details
    assert not details["ATTN.GATHER"].startswith("same cause as"), details


def test_a_pool_that_does_not_pin_the_newest_block_is_reported_on_pool_pin_newest():
    """Leaving the newest block out also breaks the top-k selection BLOCK_SCORE judges (its block
    is missing where it should be kept): the newest-block probe fails, so PIN_NEWEST leads."""
    from mutants.pool import MUTANTS as POOL
    target = Target(POOL["newest_not_pinned"][0], "newest_not_pinned")
    rows = [run_rule(r, target) for r in ("POOL.BLOCK_SCORE", "POOL.PIN_NEWEST")]
    assert [r.status for r in rows] == [FAIL, FAIL], [(r.rule_id, r.detail) for r in rows]
    block_score, newest = C.annotate(rows, [target])
    assert not C.is_marked(newest), newest.detail
    assert block_score.detail.startswith("same cause as POOL.PIN_NEWEST (candidate_blocks): "), block_score.detail


def test_the_probes_pass_on_the_reference():
    """A probe that failed correct code would blame the wrong clause."""
    import dsv4spec.impl as impl
    target = Target(impl, "impl")
    assert all(probe(target) for probe in C.PROBES.values())
