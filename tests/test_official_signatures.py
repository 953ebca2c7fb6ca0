"""dsv4spec.adapters.from_official_kernels: a module with the official kernel.py's signatures
(act_quant, fp4_act_quant, fp8_gemm, sparse_attn) becomes a target in one line, with no glue of
its own; torch's default dtype is BF16 only inside fp8_gemm's call and is restored after."""
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import dsv4spec.adapters as A
from dsv4spec import official_kernels as OK
from dsv4spec.properties.suite import ERROR, FAIL, PASS, RUN, run_rule
from dsv4spec.properties.target import Target

# act_quant, fp4_act_quant, fp8_gemm, sparse_attn with the official signatures, whose bodies call
# the official/ port (dsv4spec.official): the module a port keeping kernel.py's signatures is
KERNEL = Path(__file__).parent / "fake_official_kernel" / "kernel.py"


def signature_module(name="signatures", **replaced) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"_test_{name}", KERNEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__dict__.update(replaced)
    return module


@pytest.fixture(scope="module")
def adapted():
    return Target(A.from_official_kernels(signature_module()), "signatures")


@pytest.fixture
def few_examples(monkeypatch):
    monkeypatch.setattr(RUN, "max_examples", 3)


@pytest.fixture(autouse=True)
def default_dtype_is_float32():
    assert torch.get_default_dtype() == torch.float32
    yield
    assert torch.get_default_dtype() == torch.float32, "the adapter left torch's default dtype changed"


def test_the_official_kernels_target_is_this_adapter():
    assert issubclass(OK.OfficialKernels, A.OfficialKernelSignatures)
    assert OK.OPERATIONS is A.OFFICIAL_KERNEL_OPERATIONS


def test_it_serves_the_operations_of_the_functions_the_module_has(adapted):
    assert adapted.name == "_test_signatures" and adapted.provider.served == {
        "fp8_quantize": "act_quant", "fp8_qdq": "act_quant", "fp4_e8m0_quantize": "fp4_act_quant",
        "fp8_linear": "fp8_gemm", "sparse_attention": "sparse_attn"}


@pytest.mark.parametrize("rule_id", ["FP8.SCALE", "FP4.IDX.SCALE", "FP8.LINEAR", "ATTN.GATHER"])
def test_the_official_port_through_the_adapter_passes(adapted, few_examples, rule_id):
    row = run_rule(rule_id, adapted)
    assert row.status == PASS, (rule_id, row.detail)


def test_fp8_gemm_runs_under_the_default_dtype_bfloat16_and_it_is_restored(few_examples):
    seen = []

    def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
        seen.append(torch.get_default_dtype())
        return module_gemm(a, a_s, b, b_s, scale_dtype)

    module = signature_module("recording")
    module_gemm, module.fp8_gemm = module.fp8_gemm, fp8_gemm
    assert run_rule("FP8.LINEAR", Target(A.from_official_kernels(module), "recording")).status == PASS
    assert seen and set(seen) == {torch.bfloat16}


def test_the_default_dtype_is_restored_when_fp8_gemm_raises():
    def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
        raise RuntimeError("out of shared memory")

    target = A.from_official_kernels(signature_module("raising", fp8_gemm=fp8_gemm))
    x = torch.ones(2, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="out of shared memory"):
        target.fp8_linear(x, torch.zeros(128, 128, dtype=torch.uint8), torch.full((1, 1), 127, dtype=torch.uint8), 128)
    assert torch.get_default_dtype() == torch.float32


def test_an_fp8_gemm_that_ignores_the_default_dtype_fails_fp8_linear_on_its_bf16_output(few_examples):
    """fp8_gemm must write its output in the default dtype (BF16); one that keeps the fp32
    accumulator is a deviation of the port, named as one."""
    def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
        with A.default_dtype(torch.float32):                    # the fp32 accumulator, unrounded
            return module_gemm(a, a_s, b, b_s, scale_dtype)

    module = signature_module("fp32_gemm")
    module_gemm, module.fp8_gemm = module.fp8_gemm, fp8_gemm
    row = run_rule("FP8.LINEAR", Target(A.from_official_kernels(module), "fp32 gemm"))
    assert row.status in (FAIL, ERROR) and "BF16" in row.detail, row.detail


def test_sparse_attn_receives_the_official_int32_batch_of_one():
    received = {}

    def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        received.update(q=q, kv=kv, idx=topk_idxs)
        return q

    target = A.from_official_kernels(types.SimpleNamespace(sparse_attn=sparse_attn))
    out = target.sparse_attention(torch.ones(2, 16, 512), torch.ones(5, 512), torch.zeros(16),
                                  torch.zeros(2, 64, dtype=torch.int64), 0.1, model="v4-flash")
    assert received["q"].shape == (1, 2, 16, 512) and received["q"].dtype == torch.bfloat16
    assert received["kv"].shape == (1, 5, 512) and received["idx"].dtype == torch.int32
    assert out.shape == (2, 16, 512) and out.dtype == torch.float32


def test_a_one_line_adapter_file_verifies_from_the_command_line(tmp_path):
    (tmp_path / "myport.py").write_text(
        "import importlib.util, dsv4spec.adapters as A\n"
        f"spec = importlib.util.spec_from_file_location('kernel', {str(KERNEL)!r})\n"
        "kernel = importlib.util.module_from_spec(spec); spec.loader.exec_module(kernel)\n"
        "target = A.from_official_kernels(kernel, name='myport')\n")
    dsv4spec = Path(sys.executable).parent / "dsv4spec"
    done = subprocess.run([str(dsv4spec), "verify", "--target", "myport:target", "--rules", "FP8.LINEAR",
                           "--max-examples", "1"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FP8.LINEAR  PASS" in done.stdout and "myport: 1 PASS" in done.stdout, done.stdout
