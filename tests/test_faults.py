"""Faults a target or its environment may bring, none of which may turn a verdict false (issue 34):
a target that ends the process, reuses its result buffers, writes into its inputs, leaves a thread
running, or a port that lies about sizes, prints control characters, or hangs with children."""
import subprocess
import sys
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


def test_a_check_gives_hypothesis_back_its_mining_of_local_literals(few_examples):
    """The suite turns off Hypothesis's mining of local modules' literals while its own checks run
    and nowhere else: before, importing the suite turned it off for the whole process."""
    from hypothesis.internal.conjecture import providers
    from dsv4spec.impl import e2m1_encode
    run_rule("FMT.E2M1.ZERO_SIGN", Target(SimpleNamespace(NAME="impl", e2m1_encode=e2m1_encode), "impl"))
    assert providers._get_local_constants.__module__ == providers.__name__, "the suite left Hypothesis patched"


USER_LIBRARY = "MAGIC = 918273645\n"      # a literal of a local module (not a test file)
USER_TEST = '''
from hypothesis.internal.conjecture import providers

from mylib import MAGIC


def test_hypothesis_still_mines_the_users_literals():
    assert MAGIC in providers._get_local_constants().integers
'''
SUITE_FIRST = '''
import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith("dsv4spec::"))     # the suite's items run first
'''


@pytest.mark.thorough
def test_the_plugin_leaves_a_users_hypothesis_tests_as_they_are(tmp_path):
    """Beside the suite's items, a user's test sees Hypothesis as it would alone: drawing from the
    literals of the user's own modules is how Hypothesis finds many bugs."""
    (tmp_path / "mylib.py").write_text(USER_LIBRARY)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    (tmp_path / "conftest.py").write_text(SUITE_FIRST)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--dsv4spec-target", "impl",
                           "--dsv4spec-rules", "FMT.E2M1.ZERO_SIGN"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert "2 passed" in done.stdout, done.stdout[-3000:]


def test_records_and_tensors_of_correct_results_pass_the_call_boundary_unchanged(few_examples):
    """The copy at the call boundary keeps a result's type: a named tuple (layer_role's Role) too."""
    import dsv4spec.impl as impl
    assert run_rule("LAYER.V4", Target(impl, "impl")).status == PASS
