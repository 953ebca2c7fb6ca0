"""INPUT_DTYPE is honoured by every operation that receives values, not only the codecs: a target
declaring "bfloat16" receives BF16 tensors (of the same values) from every check of each one."""
import types

import pytest
import torch

import dsv4spec.impl as impl
from dsv4spec.properties.suite import checks_for, load_checks, run_check
from dsv4spec.properties.target import Target

# operation -> its values argument (position) and one rule whose checks call it
VALUE_OPS = {
    "hadamard": (0, "HAD.ROUNDING"), "index_rotate": (0, "HAD.MATRIX"), "rope_rotate": (0, "ROPE.ROUNDING"),
    "fp8_qdq": (0, "FP8.V4_INPLACE"), "fp4_e8m0_quantize": (0, "FP4.IDX.SCALE"), "fp8_quantize": (0, "FP8.SCALE"),
    "compress": (0, "CMP.GATE"), "entry_pack": (1, "LAYOUT.V41.MAIN"), "rope_quantize": (0, "PATH.ORDER"),
    "kv_qdq": (0, "PATH.QDQ"),          # through the per-format operations it provides "index_scores": (0, "IDX.SCORE.FORMULA"), "index_weights": (0, "IDX.WEIGHT.SCALE"),
}


def spy(seen):
    def wrap(op):
        fn = getattr(impl, op)

        def call(*args, **kwargs):
            seen.setdefault(op, set()).add(str(args[VALUE_OPS[op][0]].dtype))
            return fn(*args, **kwargs)
        return call
    provider = types.SimpleNamespace(**{op: getattr(impl, op) for op in dir(impl) if not op.startswith("_")})
    for op in VALUE_OPS:
        setattr(provider, op, wrap(op))
    provider.INPUT_DTYPE, provider.NAME = "bfloat16", "bf16 spy"
    return Target(provider, "bf16-spy")


@pytest.mark.parametrize("op", sorted(VALUE_OPS))
def test_an_operation_declared_bfloat16_receives_bfloat16(op):
    load_checks()
    seen = {}
    target = spy(seen)
    chks = [c for c in checks_for(VALUE_OPS[op][1]) if any(o == op or o.startswith(op + "_") for o in c.ops)]
    assert chks, f"no check of {VALUE_OPS[op][1]} calls {op}"
    for chk in chks[:1]:
        run_check(chk, target, "ci", shrink=False)
    assert seen.get(op) == {"torch.bfloat16"}, seen
