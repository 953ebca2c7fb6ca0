"""Built-in targets over the production libraries that serve V4/V4.1 and V3.2 (issue 37).

    dsv4spec verify --target flashmla   --rules ATTN --profile ci
    dsv4spec verify --target deepgemm   --rules FP8.LINEAR --profile ci
    dsv4spec verify --target sgl-kernel --rules IDX.TOPK --profile ci

Each imports the library you installed (never a copy of ours) and maps its calls onto the suite's
operations; every other operation is n/i.  They need a CUDA GPU: without the library, or without
CUDA, loading the target fails with one line saying what is missing and how to install it (exit
status 3).  docs/PRODUCTION.md builds the three on the GPU machine.

    flashmla    sparse_attention(q, kv, sink, indices, scale, *, model)
                    flash_mla.flash_mla_sparse_fwd(q [T,H,D] bf16, kv [N,1,D] bf16, indices [T,1,K]
                    int32, scale, d_v=D, attn_sink=sink): the sparse prefill kernel (FlashMLA-api,
                    flash_mla_sparse_fwd), V4's head dim 512, heads 64 or 128 (its
                    csrc/api/sparse_fwd.h checks h_q), lists in 64s; its BF16 output widened
    flashmla-decode  sparse_attention_cache(q, cache, form, sink, indices, scale, *, model)
                    flash_mla.flash_mla_with_kvcache(q [T,1,H,Dq] bf16, the pages as [P, 64, 1, entry] E4M3
                    (FlashMLA's paged MODEL1 cache, Dq 512, or V3.2's, Dq 576), None, None, 512, metadata,
                    None, scale, causal=False, is_fp8_kvcache=True, indices [T,1,K] int32, attn_sink):
                    the sparse decode kernel; sparse_attention through it over the MODEL1 cache
    deepgemm    fp8_linear(x, w, w_scale, block)
                    act_quant of x by the suite's impl (exact), then deep_gemm.fp8_gemm_nt((a, sfa),
                    (w, sfb), d) with fp32 power-of-two scales (the SM90 recipe, 1×128 and 128×128
                    blocks) into a BF16 d; block 128 only
    deepgemm-logits  index_scores_fp8(q_codes, k_codes, k_scale, w, visible)
                    deep_gemm.fp8_mqa_logits(q E4M3 [T,H,128], (k E4M3 [S,128], k_scale f32 [S]), w f32 [T,H],
                    starts 0, ends visible, clean_logits=True, max_seqlen_k=0; attention.hpp L177 refuses
                    cleaning with a max_seqlen_k): V3.2's indexer logits, −inf past visible
                 index_scores_fp8_cache(q_codes, cache, form, w, visible)
                    deep_gemm.fp8_paged_mqa_logits over DeepGEMM's pages of V3.2's indexer K (64 entries:
                    their E4M3 codes, then their fp32 scales), one token a sequence, context_lens visible
    sgl-kernel  index_topk(scores, visible, k, order)
                    sgl_kernel.fast_topk_v2(scores, lengths=visible, topk=k): its set of indices,
                    ordered as the caller asks (descending score, ties by position, for 'score';
                    ascending position for 'position'); −1 entries kept at the tail

Tensors go to the GPU as the library takes them and results come back on the inputs' device.  A
module that declares DSV4SPEC_CPU_STANDIN = True (the tests' fakes in tests/fake_*/) runs where the
inputs are, so the mapping is exercised on a machine without CUDA.
"""
from __future__ import annotations

import importlib

import torch

from .impl import quant as impl_quant
from .spec import layout as spec_layout
from .spec.rules import V4

STANDIN = "DSV4SPEC_CPU_STANDIN"


class LibraryUnavailable(Exception):
    """The library cannot serve here (not installed, or no CUDA); the message is one line."""


LIBRARIES = {
    "flashmla": ("flash_mla", "FlashMLA (github.com/deepseek-ai/FlashMLA) is built from source: "
                              "`git clone --recursive` it, then `pip install --no-build-isolation -v .` "
                              "(docs/PRODUCTION.md)"),
    "flashmla-decode": ("flash_mla", "FlashMLA (github.com/deepseek-ai/FlashMLA) is built from source: "
                                     "`git clone --recursive` it, then `pip install --no-build-isolation -v .` "
                                     "(docs/PRODUCTION.md)"),
    "deepgemm": ("deep_gemm", "DeepGEMM (github.com/deepseek-ai/DeepGEMM) is built from source: "
                              "`git clone --recursive` it, then `./install.sh` or `pip install "
                              "--no-build-isolation .` (docs/PRODUCTION.md)"),
    "deepgemm-logits": ("deep_gemm", "DeepGEMM (github.com/deepseek-ai/DeepGEMM) is built from source: "
                                     "`git clone --recursive` it, then `./install.sh` or `pip install "
                                     "--no-build-isolation .` (docs/PRODUCTION.md)"),
    "sgl-kernel": ("sgl_kernel", "install the wheel with `pip install sgl-kernel` (matching your torch "
                                 "and CUDA), or build sgl-kernel/ of github.com/sgl-project/sglang "
                                 "(docs/PRODUCTION.md)"),
}


def import_library(name: str):
    """The installed module of library `name`, on a machine where it can run; else LibraryUnavailable."""
    module_name, how = LIBRARIES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] != module_name:
            raise LibraryUnavailable(f"{name}: importing {module_name} failed: No module named {e.name!r} "
                                     f"(a dependency of {module_name}, or its compiled extension missing)") from None
        raise LibraryUnavailable(f"{name}: the Python module {module_name!r} is not installed here; {how}") from None
    except Exception as e:  # noqa: BLE001 -- a broken build: one line
        raise LibraryUnavailable(f"{name}: importing {module_name} raised {type(e).__name__}: {e}") from None
    if not getattr(module, STANDIN, False) and not torch.cuda.is_available():
        raise LibraryUnavailable(f"{name}: {module_name} needs a CUDA GPU and this machine has none "
                                 f"(torch.cuda.is_available() is False)")
    return module


class LibraryTarget:
    CLAIMS_CONFORMANCE = True
    VARIANTS: dict = {}
    INPUT_DTYPE = "bfloat16"

    def __init__(self, module):
        self.lib = module
        self.device = None if getattr(module, STANDIN, False) else torch.device("cuda")
        self.DEVICE = "cpu" if self.device is None else "cuda"
        self.__version__ = str(getattr(module, "__version__", "unknown version"))

    def on_device(self, x: torch.Tensor, dtype=None) -> torch.Tensor:
        x = x if self.device is None else x.to(self.device)
        return (x if dtype is None else x.to(dtype)).contiguous()

    def __repr__(self):
        return f"{type(self).__name__}({self.NAME!r}, {self.__version__})"


class FlashMLA(LibraryTarget):
    NAME = "flashmla"
    MODELS = V4
    SHAPES = {"sparse_attention": {"D": (512,), "H": (64, 128), "K": 128}}   # phase1.cuh: topk % (2·B_TOPK) == 0

    def sparse_attention(self, q, kv, sink, indices, scale, *, model=None):
        out, _max_logits, _lse = self.lib.flash_mla_sparse_fwd(
            self.on_device(q, torch.bfloat16), self.on_device(kv, torch.bfloat16)[:, None, :],
            self.on_device(indices, torch.int32)[:, None, :], scale, d_v=q.shape[-1],
            attn_sink=self.on_device(sink, torch.float32))
        return out.float().to(q.device)


class FlashMLADecode(LibraryTarget):
    """FlashMLA's sparse decode over its FP8 caches: sparse_attention_cache on FlashMLA's paged form of
    LAYOUT.V4.MAIN (MODEL1, q of 512 dims) or LAYOUT.V32.MLA (q of 576), and through it sparse_attention
    (the MODEL1 cache: CACHE_FORMS' first)."""
    NAME = "flashmla-decode"
    MODELS = V4 + ("v3.2",)     # V3.2's 656-byte entries too (LAYOUT.V32.MLA)
    CONTRACT = 8
    CACHE_FORMS = ("v4_main_kv/flashmla_paged", "v32_mla_kv/flashmla_paged")
    SHAPES = {"sparse_attention_cache": {"H": (64, 128), "K": 64},
              "sparse_attention": {"D": (512,), "H": (64, 128), "K": 64}}

    def sparse_attention_cache(self, q, cache, form, sink, indices, scale, *, model=None):
        kind, paged = spec_layout.cache_form(form)
        if not paged:
            raise ValueError(f"flashmla-decode: FlashMLA reads its paged cache ({kind}/flashmla_paged), not {form}")
        entry = spec_layout.layout(kind).nbytes
        pages = self.on_device(cache)
        # a page of PAGE entries (and, for MODEL1, their scale groups) inside a page stride of page_bytes
        k_cache = pages.view(torch.float8_e4m3fn)[:, :spec_layout.PAGE * entry].view(
            pages.shape[0], spec_layout.PAGE, 1, entry)
        meta, _ = self.lib.get_mla_metadata()
        out, _lse = self.lib.flash_mla_with_kvcache(
            self.on_device(q, torch.bfloat16)[:, None], k_cache, None, None, spec_layout.CACHE_VALUE_DIMS, meta,
            None, scale, False, True, self.on_device(indices, torch.int32)[:, None, :],
            self.on_device(sink, torch.float32))
        return out[:, 0].float().to(q.device)


class DeepGEMM(LibraryTarget):
    NAME = "deepgemm"
    MODELS = V4                 # V4.1's FP8 linear has 32-wide blocks, outside the SM90 recipe
    BLOCK = 128

    def fp8_linear(self, x, w, w_scale, block):
        if block != self.BLOCK:
            raise ValueError(f"deepgemm: fp8_gemm_nt's SM90 recipe uses {self.BLOCK}-wide blocks; got block {block}")
        k, n = x.shape[-1], w.shape[0]
        codes, scales = impl_quant.fp8_quantize(x.float().reshape(-1, k).cpu(), block)
        a = self.on_device(codes).view(torch.float8_e4m3fn)
        sfa = self.on_device(impl_quant.e8m0_decode(scales))
        b = self.on_device(w).view(torch.float8_e4m3fn)
        sfb = self.on_device(impl_quant.e8m0_decode(w_scale) if w_scale.dtype == torch.uint8 else w_scale.float())
        d = torch.empty(a.shape[0], n, dtype=torch.bfloat16, device=a.device)
        # fp32 scales as given: the SM90 recipe (its default casts them to packed UE8M0, an SM100 form)
        self.lib.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, self.BLOCK, self.BLOCK), disable_ue8m0_cast=True)
        return d.float().reshape(*x.shape[:-1], n).to(x.device)


class DeepGEMMLogits(LibraryTarget):
    """DeepGEMM's V3.2 indexer logits: index_scores_fp8 through fp8_mqa_logits (E4M3 q [T,H,128], the
    keys (E4M3 [S,128], fp32 scale [S]), fp32 weights [T,H], each query's keys [0, visible), the rest
    cleaned to −inf)."""
    NAME = "deepgemm-logits"
    CONTRACT = 8
    SHAPES = {"index_scores_fp8": {"H": (32, 64)}, "index_scores_fp8_cache": {"H": (32, 64)}}
    CACHE_FORMS = ("v32_index_k/deepgemm_paged",)

    def index_scores_fp8(self, q_codes, k_codes, k_scale, w, visible):
        fp8 = lambda codes: self.on_device(codes).view(torch.float8_e4m3fn)    # noqa: E731
        ends = self.on_device(visible, torch.int32)
        logits = self.lib.fp8_mqa_logits(fp8(q_codes), (fp8(k_codes), self.on_device(k_scale, torch.float32)),
                                         self.on_device(w, torch.float32), torch.zeros_like(ends), ends, True, 0)
        return logits[:, :k_codes.shape[0]].float().to(q_codes.device)


    def index_scores_fp8_cache(self, q_codes, cache, form, w, visible):
        """fp8_paged_mqa_logits: each query its own sequence of one token (next_n 1) over every page
        (block_table the pages in order), context_lens = visible; the logits past it set to −inf here
        (the kernel cleans none for 2-D context_lens, attention.hpp L398)."""
        kind, paged = spec_layout.cache_form(form)
        if not paged:
            raise ValueError(f"deepgemm-logits: fp8_paged_mqa_logits reads DeepGEMM's pages, not {form}")
        page, entry = spec_layout.PAGE, spec_layout.layout(kind).nbytes
        pages = self.on_device(cache).view(cache.shape[0], page, 1, entry)
        T, S = q_codes.shape[0], cache.shape[0] * page
        lens = self.on_device(visible, torch.int32)[:, None].contiguous()
        table = torch.arange(cache.shape[0], dtype=torch.int32, device=lens.device).repeat(T, 1)
        sms = torch.cuda.get_device_properties(lens.device).multi_processor_count if lens.is_cuda else 1
        meta = self.lib.get_paged_mqa_logits_metadata(lens, page, sms)
        logits = self.lib.fp8_paged_mqa_logits(self.on_device(q_codes).view(torch.float8_e4m3fn)[:, None], pages,
                                               self.on_device(w, torch.float32), lens, table, meta, S, False)
        seen = torch.arange(S, device=lens.device)[None, :] < lens
        return torch.where(seen, logits[:, :S].float(), -torch.inf).to(q_codes.device)


class SglKernel(LibraryTarget):
    NAME = "sgl-kernel"
    INPUT_DTYPE = "float32"
    SHAPES = {"index_topk": {"k": (2048,)}}     # top_k.py fast_topk_v2: assert topk == 2048 (V3.2's)

    def index_topk(self, scores, visible, k, order):
        chosen = self.lib.fast_topk_v2(self.on_device(scores, torch.float32), self.on_device(visible, torch.int32), k)
        return ordered(scores, chosen.long().cpu(), order).to(scores.device)


def ordered(scores: torch.Tensor, chosen: torch.Tensor, order: str) -> torch.Tensor:
    """The chosen indices [T, k] (−1 for none) sorted as `order` asks, the −1 entries last."""
    if order not in ("score", "position"):
        raise ValueError(f"sgl-kernel: order must be 'score' or 'position', got {order!r}")
    valid = chosen >= 0
    position = torch.where(valid, chosen, torch.iinfo(torch.int64).max)
    by_position = torch.sort(position, dim=-1, stable=True)
    chosen = torch.where(by_position.values == torch.iinfo(torch.int64).max, -1, by_position.values)
    if order == "position":
        return chosen
    score = torch.where(chosen >= 0, scores.float().cpu().gather(1, chosen.clamp(min=0)), -torch.inf)
    rank = torch.sort(score, dim=-1, descending=True, stable=True).indices
    return chosen.gather(1, rank)


TARGETS = {"flashmla": FlashMLA, "flashmla-decode": FlashMLADecode, "deepgemm": DeepGEMM,
           "deepgemm-logits": DeepGEMMLogits, "sgl-kernel": SglKernel}


def target(name: str) -> LibraryTarget:
    return TARGETS[name](import_library(name))
