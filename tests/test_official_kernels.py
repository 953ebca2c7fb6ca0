"""The official-kernels target: wiring proved on the CPU with a stand-in kernel.py of the same
signatures (tests/fake_official_kernel); the real file runs only on a CUDA GPU with TileLang."""
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from dsv4spec import official_kernels as OK
from dsv4spec.cli import main
from dsv4spec.official import quant as Q
from dsv4spec.properties.suite import NOT_IMPLEMENTED, PASS, VARIANT, run_rule
from dsv4spec.properties.target import TargetLoadError, TargetNotFound, load_target, locate

FAKE = str(Path(__file__).parent / "fake_official_kernel" / "kernel.py")


@pytest.fixture(scope="module")
def fake():
    return load_target(f"official-kernels:{FAKE}")


def bf16(*shape, seed=0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16)


def test_it_serves_what_the_file_defines_under_the_suite_names(fake):
    assert fake.name == "official-kernels" and fake.version.startswith("kernel.py sha256 ")
    for op in OK.OPERATIONS:
        assert fake.has(op) == (op != "fp4_e4m3_quantize")      # V4's fp4_act_quant takes no scale_dtype
    assert not fake.has("fp8_dequantize") and not fake.has("e2m1_encode")
    assert run_rule("FP8.DEQUANT", fake).status == NOT_IMPLEMENTED


def test_a_file_with_fewer_kernels_serves_fewer_operations(tmp_path):
    (tmp_path / "kernel.py").write_text(f"exec(open({FAKE!r}).read())\ndel sparse_attn, fp8_gemm\n")
    t = load_target(f"official-kernels:{tmp_path / 'kernel.py'}")
    assert t.has("fp8_quantize") and not t.has("sparse_attention") and not t.has("fp8_linear")


@pytest.mark.parametrize("rule_id", ["FP8.SCALE", "FP8.E4M3", "FP4.IDX.SCALE", "FP4.PACK.NIBBLE"])
def test_the_codec_rules_pass_through_the_adapters(fake, rule_id):
    row = run_rule(rule_id, fake)
    assert row.status == PASS, row.detail


def test_the_in_place_branch_through_bf16_is_reported_as_the_named_variant(fake):
    row = run_rule("FP8.V4_INPLACE", fake)
    assert row.status == VARIANT and "v4_fp8_inplace=bf16" in row.detail


@pytest.mark.parametrize("blocks", [1, 3, 5])
def test_padding_to_a_power_of_two_block_count_changes_no_block(fake, blocks):
    x = bf16(4, 2, 64 * blocks)
    q, s = fake.fp8_quantize(x, 64)
    want_q, want_s = Q.fp8_quantize(x, 64)
    assert torch.equal(q, want_q) and torch.equal(s, want_s)
    packed, scales = fake.fp4_e8m0_quantize(x)
    want_p, want_sc = Q.fp4_e8m0_quantize(x)
    assert torch.equal(packed, want_p) and torch.equal(scales, want_sc)


def test_empty_inputs_come_back_empty(fake):
    q, s = fake.fp8_quantize(torch.zeros(0, 128, dtype=torch.bfloat16), 128)
    assert q.shape == (0, 128) and s.shape == (0, 1)


def test_fp8_linear_quantizes_the_activation_and_restores_the_default_dtype(fake):
    x = bf16(5, 256, seed=1)
    wq = bf16(128, 256, seed=2).float().to(torch.float8_e4m3fn).view(torch.uint8)    # test input only
    ws = torch.tensor([[126, 129]], dtype=torch.uint8)                                  # E8M0 [N/128, K/128]
    out = fake.fp8_linear(x, wq, ws, 128)
    assert out.shape == (5, 128) and out.dtype == torch.float32 and torch.get_default_dtype() == torch.float32
    xq, xs = Q.fp8_quantize(x, 128)
    deq_x = Q.fp8_dequantize(xq, xs, 128)
    deq_w = Q.e4m3_decode(wq) * Q.e8m0_decode(ws).repeat_interleave(128, 0).repeat_interleave(128, 1)
    bound = 2 ** -8 * (deq_x.abs() @ deq_w.abs().T)                # the BF16 output's rounding, and more
    assert ((out - deq_x @ deq_w.T).abs() <= bound).all()
    with pytest.raises(ValueError, match="128×128 blocks"):
        fake.fp8_linear(x, wq, ws, 32)


def test_sparse_attention_passes_the_official_layout(fake):
    q, kv = bf16(1, 2, 16, 512, seed=3), bf16(1, 10, 512, seed=4)
    idx = torch.full((1, 2, 64), -1)
    idx[0, 0, :3], idx[0, 1, :2] = torch.tensor([0, 1, 2]), torch.tensor([3, 4])
    out = fake.sparse_attention(q, kv, torch.zeros(16), idx, 512 ** -0.5)
    assert out.shape == q.shape and out.dtype == torch.float32
    with pytest.raises(RuntimeError, match="No valid warp partition"):     # as TileLang at D = 16
        fake.sparse_attention(q[..., :16], kv[..., :16], torch.zeros(16), idx, 0.25)


@pytest.mark.parametrize("shapes", [{"sparse_attention": {"D": 0}}, {"sparse_attention": {"D": ()}},
                                    {"sparse_attention": (512,)}, {"sparse_attention": {"H": 16.0}}])
def test_declared_sizes_are_validated(shapes):
    from types import SimpleNamespace
    from dsv4spec.properties.target import Target
    with pytest.raises(ValueError, match="SHAPES must map each operation"):
        Target(SimpleNamespace(SHAPES=shapes, sparse_attention=lambda *a, **k: None), "bad")


def test_the_attention_checks_run_at_the_sizes_the_kernel_declares(fake):
    assert fake.shape_limits("sparse_attention") == {"D": (512,), "H": 16, "K": 64}
    from dsv4spec.properties import attn as checks
    case = checks.make_case(3, "v4-flash", 2, 5, 16, 100, target=fake)
    assert case.q.shape == (2, 16, 512) and case.indices.shape == (2, 128) and (case.indices[:, 100:] == -1).all()
    for rule_id in ("ATTN.GATHER", "ATTN.SINK", "ATTN.PROB.ORDER", "ATTN.OUTPUT"):
        row = run_rule(rule_id, fake)
        assert row.status == PASS, (rule_id, row.status, row.detail)


def test_the_environment_variable_names_the_file(monkeypatch):
    monkeypatch.setenv(OK.ENV, FAKE)
    assert load_target("official-kernels").has("fp8_quantize")


def test_no_file_is_a_one_line_usage_error(monkeypatch, tmp_path):
    monkeypatch.delenv(OK.ENV, raising=False)
    with pytest.raises(TargetNotFound, match=f"official-kernels:PATH/TO/kernel.py or set {OK.ENV}"):
        locate("official-kernels")
    with pytest.raises(TargetNotFound, match="is not a file"):
        load_target(f"official-kernels:{tmp_path / 'nothing.py'}")


def test_cli_without_a_kernel_file_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv(OK.ENV, raising=False)
    assert main(["verify", "--target", "official-kernels", "--rules", "FP8.SCALE"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and OK.ENV in err


@pytest.mark.skipif(importlib.util.find_spec("tilelang") is not None, reason="TileLang is installed here")
def test_a_kernel_file_that_needs_tilelang_fails_to_load_in_one_line(tmp_path):
    (tmp_path / "kernel.py").write_text("import torch\nimport tilelang\n")
    with pytest.raises(TargetLoadError) as e:
        load_target(f"official-kernels:{tmp_path / 'kernel.py'}")
    assert "TileLang" in str(e.value) and "\n" not in str(e.value)


REAL = os.environ.get(OK.ENV, "")
HAVE_GPU = torch.cuda.is_available() and importlib.util.find_spec("tilelang") is not None and os.path.isfile(REAL)


@pytest.mark.skipif(not HAVE_GPU, reason="official-kernels: needs a CUDA GPU, TileLang and DSV4SPEC_OFFICIAL_KERNEL "
                                         "(bench/official_kernels.sh runs it on the H200)")
@pytest.mark.parametrize("rule_id", ["FP8.SCALE", "FP8.E4M3", "FP4.IDX.SCALE", "FP4.E2M1.RNE"])
def test_the_real_kernels_pass_the_codec_rules(rule_id):
    row = run_rule(rule_id, load_target("official-kernels"))
    assert row.status == PASS, row.detail


def test_the_comparison_script_runs_on_the_cpu_with_the_stand_in(tmp_path):
    import json
    spec = importlib.util.spec_from_file_location("bench_official_kernels",
                                                  Path(__file__).parents[1] / "bench" / "official_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--cpu", "--kernel", FAKE, "--out", str(tmp_path), "--rows", "4"]) == 0
    result = json.loads((tmp_path / "compare.json").read_text())
    assert all(count == 0 for row in result["codecs"] for counts in row["against"].values() for count in counts)
    assert result["qdq"]["branch"].startswith("bf16") and result["linear"]["max_error_in_units"] <= 1
    assert "## The in-place branch" in (tmp_path / "compare.md").read_text()


def test_a_v41_style_fp4_act_quant_also_serves_the_e4m3_codec(tmp_path, fake):
    assert not fake.has("fp4_e4m3_quantize")                  # V4's fp4_act_quant has no scale_dtype
    (tmp_path / "kernel.py").write_text(f"""exec(open({FAKE!r}).read())
def fp4_act_quant(x, block_size=32, inplace=False, scale_dtype=torch.float8_e8m0fnu):
    assert not inplace and (block_size, scale_dtype) in ((32, torch.float8_e8m0fnu), (16, torch.float8_e4m3fn))
    packed, s = (Q.fp4_e8m0_quantize if block_size == 32 else Q.fp4_e4m3_quantize)(x.contiguous())
    return packed.view(torch.float4_e2m1fn_x2), s.view(scale_dtype)
""")
    t = load_target(f"official-kernels:{tmp_path / 'kernel.py'}")
    assert t.has("fp4_e4m3_quantize") and t.has("fp4_e8m0_quantize")
    assert run_rule("FP4.KV.SCALE", t).status == PASS
