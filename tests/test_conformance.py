"""The project's own targets conform: impl passes every checked rule, and kernels every rule of the
families it implements (its other rows are n/i by design: no compressor, layout or budget kernels).
Both reject NaN/Inf, an allowed implementation-defined choice reported VARIANT ("detected: …")."""
import pytest

from dsv4spec.properties.suite import NOT_IMPLEMENTED, PASS, VARIANT, checks_for, load_checks, run_rule
from dsv4spec.properties.target import load_target
from dsv4spec.spec import RULES

load_checks()
CHECKED = sorted(r for r in RULES if checks_for(r))
KERNEL_FAMILIES = ("FMT", "FP4", "FP8", "HAD", "IDX", "POOL", "LAYER")
# single rules of other families with a kernel: kernels/path.py; kernels/attn.py's sparse_attention
# (ATTN.SCALE, Q_NORM, DEROTATE and LAYER are operations around the kernel that kernels leaves out)
KERNEL_RULES = ("PATH.ORDER", "ATTN.GATHER", "ATTN.DUPLICATES", "ATTN.INIT", "ATTN.SCORE", "ATTN.PROB.BF16",
                "ATTN.PROB.ORDER", "ATTN.RESCALE", "ATTN.SINK", "ATTN.OUTPUT")


def _left_out_by_kernels(rule_id):
    """Every check of the rule needs an operation a kernels module lists in NOT_PROVIDED (FP8.LINEAR:
    fp8_linear); a rule with another check on a provided operation (IDX.WEIGHT.SCALE) stays PASS."""
    from dsv4spec.kernels import indexer, quant
    left_out = set(quant.NOT_PROVIDED) | set(indexer.NOT_PROVIDED)
    return all(left_out & set(c.ops) for c in checks_for(rule_id))


DETECTED = {"FP4.NONFINITE": "detected: nonfinite_input=reject", "FP8.NONFINITE": "detected: nonfinite_input=reject"}


def _conforms(row, expected):
    if row.rule_id in DETECTED and expected == PASS:
        return row.status == VARIANT and row.detail == DETECTED[row.rule_id]
    return row.status == expected


@pytest.mark.parametrize("rule_id", CHECKED)
def test_impl_passes(rule_id):
    row = run_rule(rule_id, load_target("impl"))
    assert _conforms(row, PASS), f"{rule_id} on impl: {row.status} {row.detail}"


@pytest.mark.parametrize("rule_id", CHECKED)
def test_kernels_pass_their_families(rule_id):
    row = run_rule(rule_id, load_target("kernels"))
    implemented = (RULES[rule_id].family in KERNEL_FAMILIES or rule_id in KERNEL_RULES) and not _left_out_by_kernels(rule_id)
    expected = PASS if implemented else NOT_IMPLEMENTED
    assert _conforms(row, expected), f"{rule_id} on kernels: {row.status} {row.detail}"
