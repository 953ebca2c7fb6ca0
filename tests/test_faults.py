"""Faults a target or its environment may bring, none of which may turn a verdict false (issue 34):
a target that ends the process, reuses its result buffers, writes into its inputs, leaves a thread
running, or a port that lies about sizes, prints control characters, or hangs with children."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dsv4spec.impl import quant as impl_quant
from dsv4spec.properties.suite import ERROR, FAIL, PASS, RUN, run_rule
from dsv4spec.properties.target import Target


@pytest.fixture
def few_examples():
    saved, RUN.max_examples = RUN.max_examples, 5
    yield
    RUN.max_examples = saved


def _static_buffers(quantize):
    """quantize, taking a NaN or an infinity as 0, returning its results in the same two tensors on
    every call (a CUDA graph's static outputs), and wrong: zero codes for an input with a NaN or an
    infinity, whose finite blocks must keep theirs."""
    buffers = []

    def static(x, *args, **kwargs):
        codes, scales = quantize(torch.where(torch.isfinite(x), x, 0), *args, **kwargs)
        if not bool(torch.isfinite(x).all()):
            codes = torch.zeros_like(codes)         # wrong: the finite blocks lose their codes
        if not buffers:
            buffers.extend([codes.clone(), scales.clone()])
        buffers[0].copy_(codes)
        buffers[1].copy_(scales)
        return buffers[0], buffers[1]
    return static


def test_a_target_reusing_its_result_buffers_is_judged_on_each_result(few_examples):
    target = Target(SimpleNamespace(NAME="graphed", fp4_e4m3_quantize=_static_buffers(impl_quant.fp4_e4m3_quantize)),
                    "graphed")
    row = run_rule("FP4.NONFINITE", target)
    assert row.status == FAIL, f"{row.status}: {row.detail}"


def _in_place(encode):
    def e2m1_encode(x):
        codes = encode(x)
        x.zero_()
        return codes
    return e2m1_encode


def test_a_target_writing_into_its_input_is_an_error_naming_the_argument(few_examples):
    from dsv4spec.impl import e2m1_encode
    row = run_rule("FMT.E2M1.RNE", Target(SimpleNamespace(NAME="scribbler", e2m1_encode=_in_place(e2m1_encode)), "s"))
    assert row.status == ERROR and "e2m1_encode modified its input 'x' in place" in row.detail, row.detail


def test_an_untouched_nan_input_is_not_taken_for_a_modified_one(few_examples):
    """Bitwise: a NaN compares unequal to itself, never to its own copy's bits."""
    def zeroing_nonfinite(x):
        return impl_quant.fp4_e4m3_quantize(torch.where(torch.isfinite(x), x, 0))
    row = run_rule("FP4.NONFINITE", Target(SimpleNamespace(NAME="z", fp4_e4m3_quantize=zeroing_nonfinite), "z"))
    assert row.status in (PASS, "VARIANT"), f"{row.status}: {row.detail}"
