"""The built-in targets over production libraries (dsv4spec.production): on this CPU machine the
libraries are the stand-ins in tests/fake_*/ (their signatures, bodies computing with impl/), put on
PYTHONPATH of the installed `dsv4spec` command; without them loading fails with exit 3."""
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from dsv4spec import production
from hopper_mma import mma_sum
from dsv4spec.properties.suite import run_rule
from dsv4spec.properties.target import Target

TESTS = Path(__file__).resolve().parent
DSV4SPEC = str(Path(sys.executable).with_name("dsv4spec"))

# target, its fake library's folder, the rules checked (cheap ones of each family), a rule that must PASS
CASES = [("flashmla", "fake_flashmla", "ATTN.SINK,ATTN.GATHER", "ATTN.SINK"),
         ("deepgemm", "fake_deepgemm", "FP8.LINEAR", "FP8.LINEAR"),
         ("sgl-kernel", "fake_sgl_kernel", "IDX.TOPK.ORDER,IDX.TOPK.COUNT", "IDX.TOPK.ORDER")]


def verify(target: str, rules: str, tmp_path, fake: str | None = None, hide: str | None = None):
    """The command on `target`; fake: a stand-in library's folder first on the path; hide: a module
    made unimportable (as where it is not installed, also on a machine that has it)."""
    path = [str(TESTS / fake)] if fake else []
    if hide:
        (tmp_path / "hide").mkdir()
        (tmp_path / "hide" / "sitecustomize.py").write_text(f"import sys\nsys.modules[{hide!r}] = None\n")
        path.append(str(tmp_path / "hide"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
    report = tmp_path / "report.json"
    done = subprocess.run([DSV4SPEC, "verify", "--target", target, "--rules", rules, "--profile", "ci",
                           "--max-examples", "2", "--json", str(report), "--quiet"],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    return done, (json.loads(report.read_text())["results"] if report.exists() else [])


@pytest.mark.parametrize("target, fake, rules, must_pass", CASES)
def test_the_mapping_passes_on_a_faithful_stand_in(target, fake, rules, must_pass, tmp_path):
    done, results = verify(target, rules, tmp_path, fake)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {r["rule"]: r["status"] for r in results}[must_pass] == "PASS"


@pytest.mark.parametrize("target, module, how", [("flashmla", "flash_mla", "git clone --recursive"),
                                                 ("deepgemm", "deep_gemm", "git clone --recursive"),
                                                 ("sgl-kernel", "sgl_kernel", "pip install sgl-kernel")])
def test_a_missing_library_exits_3_saying_how_to_install_it(target, module, how, tmp_path):
    done, _ = verify(target, "ATTN.SINK", tmp_path, hide=module)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"the Python module '{module}' is not installed here" in done.stderr and how in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="names the missing GPU")
def test_a_library_without_cuda_is_refused_naming_the_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_mla", types.ModuleType("flash_mla"))   # a real build: no stand-in flag
    with pytest.raises(production.LibraryUnavailable, match="flash_mla needs a CUDA GPU"):
        production.target("flashmla")


def test_a_library_that_drops_the_sink_fails():
    """The mapping hands the sink over: a FlashMLA that ignores attn_sink is caught on ATTN.SINK."""
    found = importlib.util.spec_from_file_location("fake_flash_mla", TESTS / "fake_flashmla" / "flash_mla" / "__init__.py")
    flash_mla = importlib.util.module_from_spec(found)
    found.loader.exec_module(flash_mla)
    sinkless = types.SimpleNamespace(
        DSV4SPEC_CPU_STANDIN=True,
        flash_mla_sparse_fwd=lambda *a, attn_sink=None, **kw: flash_mla.flash_mla_sparse_fwd(*a, **kw))
    assert run_rule("ATTN.SINK", Target(production.FlashMLA(sinkless), "flashmla")).status == "FAIL"


@pytest.mark.parametrize("order, want", [("score", [[3, 0, 1, -1]]), ("position", [[0, 1, 3, -1]])])
def test_the_top_k_set_is_ordered_as_the_caller_asks(order, want):
    scores = torch.tensor([[2.0, 1.0, 9.0, 5.0]])
    chosen = torch.tensor([[1, -1, 3, 0]])        # a kernel's set, in no order, padded with −1
    assert production.ordered(scores, chosen, order).tolist() == want


def _fake(folder: str, module: str):
    found = importlib.util.spec_from_file_location(f"fake_{module}", TESTS / folder / module / "__init__.py")
    loaded = importlib.util.module_from_spec(found)
    found.loader.exec_module(loaded)
    return loaded


@pytest.mark.parametrize("rule", ["IDX.TOPK.SELECTION", "IDX.TOPK.PAD"])
def test_a_top_k_that_takes_only_k_2048_is_judged_at_2048(rule):
    """sgl-kernel's fast_topk_v2 asserts topk == 2048: its SHAPES draws every case at k = 2048 (PASS);
    undeclared, the same library is blamed for its own assertion on the small k the checks draw."""
    sgl = _fake("fake_sgl_kernel", "sgl_kernel")
    undeclared = type("Undeclared", (production.SglKernel,), {"SHAPES": {}})
    assert run_rule(rule, Target(production.SglKernel(sgl), "sgl-kernel")).status == "PASS"
    row = run_rule(rule, Target(undeclared(sgl), "sgl-kernel"))
    assert row.status != "PASS" and "topk=2048" in row.detail


def test_a_top_k_at_2048_that_drops_the_last_entry_fails():
    """The redrawn cases still judge: a kernel that loses its 2048th pick fails IDX.TOPK.COUNT."""
    sgl = _fake("fake_sgl_kernel", "sgl_kernel")
    dropping = types.SimpleNamespace(DSV4SPEC_CPU_STANDIN=True, fast_topk_v2=lambda s, n, k, row_starts=None:
                                     torch.cat([sgl.fast_topk_v2(s, n, k)[:, :-1], torch.full((s.shape[0], 1), -1,
                                                                                            dtype=torch.int32)], 1))
    assert run_rule("IDX.TOPK.COUNT", Target(production.SglKernel(dropping), "sgl-kernel")).status == "FAIL"


@pytest.mark.parametrize("rule", ["LAYOUT.V4.MAIN", "LAYOUT.V32.MLA", "ATTN.SINK", "ATTN.PROB.BF16"])
def test_flashmla_decode_over_its_paged_caches_passes_on_a_faithful_stand_in(rule):
    """The sparse FP8 decode mapped on both layouts' paged forms (LAYOUT rules) and, over MODEL1, on ATTN."""
    decode = production.FlashMLADecode(_fake("fake_flashmla", "flash_mla"))
    assert run_rule(rule, Target(decode, "flashmla-decode")).status == "PASS"


def test_flashmla_decode_that_reads_the_unwritten_scale_byte_fails():
    """A decode that takes MODEL1's 8th scale byte (never written; 0xFF here) as the 7th tile's scale."""
    flash_mla = _fake("fake_flashmla", "flash_mla")

    def eighth_byte(q, k_cache, *args, **kw):
        raw = k_cache.view(torch.uint8)
        pages = torch.as_strided(raw, (raw.shape[0], raw.stride(0)), (raw.stride(0), 1)).clone()
        scales = pages[:, 64 * 576:64 * 584].view(-1, 64, 8)
        scales[..., 6] = scales[..., 7].clone()
        view = pages.view(torch.float8_e4m3fn)[:, :64 * 584].view(k_cache.shape)
        return flash_mla.flash_mla_with_kvcache(q, view, *args, **kw)
    lib = types.SimpleNamespace(DSV4SPEC_CPU_STANDIN=True, get_mla_metadata=flash_mla.get_mla_metadata,
                                flash_mla_with_kvcache=eighth_byte)
    assert run_rule("LAYOUT.V4.MAIN", Target(production.FlashMLADecode(lib), "flashmla-decode")).status != "PASS"


def test_deepgemm_logits_maps_fp8_mqa_logits_onto_the_fp8_scores():
    """V3.2's indexer logits (index_scores_fp8) through DeepGEMM's fp8_mqa_logits: PASS on a faithful
    stand-in; one that forgets the keys' scale fails IDX.SCORE.V32_FP32."""
    deep_gemm = _fake("fake_deepgemm", "deep_gemm")
    assert run_rule("IDX.SCORE.V32_FP32", Target(production.DeepGEMMLogits(deep_gemm), "deepgemm-logits")).status == "PASS"
    unscaled = types.SimpleNamespace(DSV4SPEC_CPU_STANDIN=True, fp8_mqa_logits=lambda q, kv, *a: deep_gemm.fp8_mqa_logits(
        q, (kv[0], torch.ones_like(kv[1])), *a), fp8_paged_mqa_logits=deep_gemm.fp8_paged_mqa_logits,
        get_paged_mqa_logits_metadata=deep_gemm.get_paged_mqa_logits_metadata)
    assert run_rule("IDX.SCORE.V32_FP32", Target(production.DeepGEMMLogits(unscaled), "deepgemm-logits")).status == "FAIL"


def test_deepgemm_paged_logits_read_its_pages_of_the_v32_index_k_cache():
    """index_scores_fp8_cache through fp8_paged_mqa_logits (DeepGEMM's pages: codes, then fp32 scales):
    PASS on a faithful stand-in; one that reads the scales as the first run of the page fails."""
    deep_gemm = _fake("fake_deepgemm", "deep_gemm")
    rule = "IDX.SCORE.V32_FP32"
    assert run_rule(rule, Target(production.DeepGEMMLogits(deep_gemm), "deepgemm-logits")).status == "PASS"

    def scales_first(q, kv_cache, *args, **kw):
        pages, block_kv, _, width = kv_cache.shape
        raw = kv_cache.reshape(pages, -1)
        swapped = torch.cat([raw[:, -4 * block_kv:], raw[:, :-4 * block_kv]], 1).view(kv_cache.shape)
        return deep_gemm.fp8_paged_mqa_logits(q, swapped, *args, **kw)
    lib = types.SimpleNamespace(DSV4SPEC_CPU_STANDIN=True, fp8_mqa_logits=deep_gemm.fp8_mqa_logits,
                                get_paged_mqa_logits_metadata=deep_gemm.get_paged_mqa_logits_metadata,
                                fp8_paged_mqa_logits=scales_first)
    assert run_rule(rule, Target(production.DeepGEMMLogits(lib), "deepgemm-logits")).status == "FAIL"


def truncating_mma(fraction_bits: int):
    """DeepGEMM's MMA as tests/hopper_mma.py models it, with `fraction_bits`."""
    return lambda q, k: mma_sum(q.double()[..., :, None, :] * k.double()[..., None, :, :], fraction_bits)


def test_deepgemm_logits_through_a_truncating_fp8_mma_pass_and_a_narrow_accumulator_or_bf16_fails(monkeypatch):
    """IDX.SCORE.V32_FP32's FP8 forms draw codes whose dots an FP8 MMA keeps exact: a stand-in whose MMA
    truncates to 13 fraction bits (Hopper's, about) passes them; one of 9 bits, and one rounding its
    scores to BF16, fail.  (DeepGEMM on an H100 departed from fp32 by 4.08·2^-12 of Σ|q·k| on an
    arbitrary draw: docs/PRODUCTION.md.)"""
    deep_gemm = _fake("fake_deepgemm", "deep_gemm")
    target = Target(production.DeepGEMMLogits(deep_gemm), "deepgemm-logits")
    for bits, status in ((13, "PASS"), (9, "FAIL")):
        monkeypatch.setattr(deep_gemm, "_dots", truncating_mma(bits))
        assert run_rule("IDX.SCORE.V32_FP32", target).status == status, bits
    monkeypatch.undo()

    def in_bf16(logits):
        return lambda *a, **kw: logits(*a, **kw).to(torch.bfloat16).float()
    bf16 = types.SimpleNamespace(DSV4SPEC_CPU_STANDIN=True, fp8_mqa_logits=in_bf16(deep_gemm.fp8_mqa_logits),
                                 fp8_paged_mqa_logits=in_bf16(deep_gemm.fp8_paged_mqa_logits),
                                 get_paged_mqa_logits_metadata=deep_gemm.get_paged_mqa_logits_metadata)
    assert run_rule("IDX.SCORE.V32_FP32", Target(production.DeepGEMMLogits(bf16), "deepgemm-logits")).status == "FAIL"
