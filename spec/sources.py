"""The sources every rule and claim cites, each under a short key.

A citation is "<key> <where>": for official code, the line numbers of the copy named below
("V41-model L758-760", optionally followed by a note in parentheses); for a source document, a
section and its lines ("doc-000 Q&A 1 L13"); for code cited without line numbers, the function or
setting meant.  Every key names code by repository, path and revision, or a source document by
title and section: no citation names a file outside this repository.  `problems` checks a citation
against this table, so a key, a section or a line that does not exist fails the tests
(tests/test_registry.py, tests/test_claims.py).

Revisions: the HF model-card revision for the HF copies, and the commit of the public copy whose
line numbers are cited.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """Official code (or shipped code adapted from it): where a reader finds the cited lines."""

    what: str
    repository: str
    path: str
    revision: str
    note: str = ""
    lines: bool = True          # citations give line numbers
    official: bool = True       # the official code (or a verbatim copy or bit-exact port), not shipped third-party code


@dataclass(frozen=True)
class Document:
    """A source document (in Chinese): its title and sections with their line ranges (lines of the
    document's plain text, as numbered from its first line)."""

    title: str
    english: str
    sections: dict[str, tuple[int, int]]


_TT = "tenstorrent/tt-metal"
_TT_V41 = "models/demos/deepseek_v3_d_p/reference/deepseek_v41/"
_LAB = "foreverlasting1202/DeepSeek-V4-Deconstruction-Lab"
_V41_REV = "HF deepseek-ai/DeepSeek-V4.1-Flash rev dba1be0a40aa45a94ad051997016db3960a90277"
_V32 = "deepseek-ai/DeepSeek-V3.2-Exp"

CODE: dict[str, Code] = {
    "V4-model": Code(
        "DeepSeek-V4-Flash inference/model.py (827 lines), initial release", _LAB,
        "DeepSeek_official/model.py", "d2d12325ba8c9bbe3590446d1bed85158f0b44ab",
        "a verbatim copy; a second copy vendored from HF deepseek-ai/DeepSeek-V4-Flash@60d8d707 agrees "
        "line for line on Compressor, Indexer and Attention. V4-Pro is assumed to ship the same code "
        "(no V4-Pro copy is public)"),
    "V4-kernel": Code(
        "DeepSeek-V4-Flash inference/kernel.py (535 lines, TileLang), initial release", _LAB,
        "DeepSeek_official/kernel.py", "d2d12325ba8c9bbe3590446d1bed85158f0b44ab",
        "in this revision the in-place act_quant casts through BF16 (L55 sets out_dtype = in_dtype); "
        "the later revision V4-kernel-60d8 casts through FP8"),
    "V4-kernel-60d8": Code(
        "DeepSeek-V4-Flash inference/kernel.py of HF deepseek-ai/DeepSeek-V4-Flash@60d8d707, as adapted "
        "in TorchInferno", "bobrenjc93/TorchInferno", "src/torchinferno/kernels/deepseek_v4_tilelang_definitions.py",
        "915d99d36b23c67c3a975d72920b395b413af94b",
        "'adapted from deepseek-ai/DeepSeek-V4-Flash inference/kernel.py at commit 60d8d70770c6776ff598c94bb586a859a38244f1' "
        "(its docstring); cited by function, without line numbers (the adaptation adds kernels before act_quant)",
        lines=False, official=False),
    "SGLang-v4-kv-pool": Code(
        "SGLang's DeepSeek-V4 KV-cache pool (shipped engine code, not official)", "sgl-project/sglang",
        "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py", "007bddd4a95b44d3c8cd22c8a24d0ee1455955fd",
        "cited by class: DeepSeekV4SingleKVPool.get_bytes_per_token (448 + 64·2 + 448/64 + scale_pad 1) and "
        "create_buffer (asserts 448 + 64 * 2 + 8 = 584 bytes per token)", lines=False, official=False),
    "FlashMLA-quant": Code(
        "FlashMLA's test-side KV-cache quantizer (the FP8 sparse cache layouts V32_FP8Sparse and "
        "MODEL1_FP8Sparse; shipped library code, not official model code)", "deepseek-ai/FlashMLA",
        "tests/quant.py", "9241ae3ef9bac614dd25e45e507e089f888280e0", official=False),
    "FlashMLA-api": Code(
        "FlashMLA's Python interface (flash_mla_with_kvcache, flash_mla_sparse_fwd; shipped library code)",
        "deepseek-ai/FlashMLA", "flash_mla/flash_mla_interface.py", "9241ae3ef9bac614dd25e45e507e089f888280e0",
        official=False),
    "FlashMLA-decode-fp8": Code(
        "FlashMLA's SM90 sparse FP8 decode kernel (shipped library code)", "deepseek-ai/FlashMLA",
        "csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh", "9241ae3ef9bac614dd25e45e507e089f888280e0", official=False),
    "V41-model": Code(
        "DeepSeek-V4.1-Flash inference/model.py", "HF deepseek-ai/DeepSeek-V4.1-Flash",
        "inference/model.py", "dba1be0a40aa45a94ad051997016db3960a90277",
        f"lines are upstream lines; the public copy {_TT} {_TT_V41}model.py (commit 702412b8) has "
        "each line 9 lines further down"),
    "V41-config": Code(
        "DeepSeek-V4.1-Flash inference/config.json", "HF deepseek-ai/DeepSeek-V4.1-Flash",
        "inference/config.json", "dba1be0a40aa45a94ad051997016db3960a90277",
        f"public copy {_TT} {_TT_V41}config.json (commit b2ee7540), vendored unchanged; cited by key "
        "(window_size, compress_ratios, kv_source_layers, index_source_layers, candidate_source_layer, "
        "candidate_topk_blocks, candidate_block_size, norm_eps, the RoPE keys)", lines=False),
    "V41-kernel": Code(
        "DeepSeek-V4.1-Flash inference/kernel.py (TileLang)", "HF deepseek-ai/DeepSeek-V4.1-Flash",
        "inference/kernel.py", "dba1be0a40aa45a94ad051997016db3960a90277",
        "no verbatim public copy: the lines are those the bit-exact port V41-kernel-port cites as K41:n "
        "(read there, not in the kernel itself)"),
    "V41-kernel-port": Code(
        "Bit-exact CPU (torch) port of the V4.1 kernels, citing upstream lines as K41:n", _TT,
        _TT_V41 + "kernel_cpu.py", "b2ee7540c83c2957b3268b0d1095b39e2b75473b",
        f"ported from {_V41_REV}"),
    "V32-model": Code("DeepSeek-V3.2-Exp inference/model.py", _V32, "inference/model.py", "3b99a53"),
    "V32-kernel": Code("DeepSeek-V3.2-Exp inference/kernel.py (TileLang)", _V32, "inference/kernel.py",
                       "3b99a53"),
    "V32-config": Code("DeepSeek-V3.2-Exp inference/config_671B_v3.2.json", _V32,
                       "inference/config_671B_v3.2.json", "3b99a53", lines=False),
}

DOCUMENTS: dict[str, Document] = {
    "doc-000": Document(
        "DeepSeek-V4.1 模型结构（3）：序列维度（下），Hierarchical Sparse Indexer 与 FP4 KV cache",
        "DeepSeek-V4.1 structure (3): the sequence dimension (part 3), the hierarchical sparse indexer "
        "and the FP4 KV cache",
        {"whole": (1, 23), "summary": (2, 3), "pool work": (5, 6), "FP4 storage": (7, 8),
         "details": (9, 10), "Q&A 1": (12, 13), "Q&A 2": (14, 15), "Q&A 3": (16, 17),
         "Q&A 4": (18, 19), "Q&A 5": (20, 21), "Q&A 6": (22, 23)}),
    "doc-002": Document(
        "DeepSeek-V4 模型结构（2）：序列维度（中），Lightning Indexer 与稀疏选择",
        "DeepSeek-V4 structure (2): the sequence dimension (part 2), the lightning indexer and sparse "
        "selection",
        {"whole": (1, 29), "summary": (2, 3), "why sparse": (5, 6), "design trade-offs": (7, 8),
         "V4 vs V3.2": (9, 10), "training and inference": (11, 12), "Q&A 1": (14, 15),
         "Q&A 2": (16, 17), "Q&A 3": (18, 19), "Q&A 4": (20, 21), "Q&A 5": (22, 23),
         "Q&A 6": (24, 25), "Q&A 7": (26, 27), "Q&A 8": (28, 29)}),
    "doc-003": Document(
        "DeepSeek-V4 Lightning Indexer 全解析：原理、MQA 架构、计算逻辑与混合精度实践",
        "DeepSeek-V4 Lightning Indexer, a full analysis: principles, MQA architecture, computation and "
        "mixed precision",
        {"whole": (1, 451), "§1": (3, 11), "§2.1": (17, 31), "§2.2": (33, 38), "§2.3": (40, 47),
         "§3.1": (55, 64), "§3.2": (66, 72), "§4 stage 1": (88, 106), "§4 stage 2": (108, 135),
         "§4 stage 3": (137, 159), "§4 stage 4": (161, 165), "§5.1": (171, 176), "§5.2": (178, 184),
         "§6.1": (190, 194), "§6.2": (196, 200), "§7.1": (206, 212), "§7.2": (214, 219),
         "§7.3": (221, 241), "§8": (245, 254), "§9.1": (260, 267), "§9.2": (269, 282),
         "§10.1": (290, 294), "§10.2": (296, 307), "§10.3": (309, 323), "§10.4": (325, 329),
         "§11.1": (337, 385), "§11.2": (387, 396), "§12": (400, 420), "§13": (424, 432),
         "§14": (436, 448)}),
}

# Section headings of documents 000 and 002 (which number nothing), for the Sources table.
HEADINGS = {
    ("doc-000", "summary"): "内容提要", ("doc-000", "pool work"): "候选池如何降低解码计算量",
    ("doc-000", "FP4 storage"): "FP4 量化如何压缩 KV 存储", ("doc-000", "details"): "实现细节与边界条件",
    ("doc-002", "summary"): "内容提要", ("doc-002", "why sparse"): "为什么压缩后还要稀疏选择",
    ("doc-002", "design trade-offs"): "indexer的设计权衡", ("doc-002", "V4 vs V3.2"): "V4与V3.2的差异",
    ("doc-002", "training and inference"): "训练与推理细节",
}

SOURCES = {**CODE, **DOCUMENTS}

_LINES = r"L\d+(?:-\d+)?(?:, L\d+(?:-\d+)?)*"
_CODE = re.compile(rf"^(?P<lines>{_LINES})(?: \((?P<note>.+)\))?$")
_DOC = re.compile(rf"^(?P<section>.+?) (?P<lines>{_LINES})(?: \((?P<note>.+)\))?$")


def line_ranges(lines: str) -> list[tuple[int, int]]:
    """'L13, L20-21' -> [(13, 13), (20, 21)]."""
    out = []
    for part in lines.split(", "):
        a, _, b = part[1:].partition("-")
        out.append((int(a), int(b or a)))
    return out


# A path outside the repository (the project's working notes, a local copy of a document): no
# citation may name one, whatever its key.
OUTSIDE = re.compile(r"(?:\.\./|/work/|\bshared/|\bseeds/|official-v4/|official-rules\.md|conventions\.md|"
                     r"performance\.md|design\.md|\b\d{3}_[0-9a-f]{16}\.txt)")


def problems(citation: str) -> list[str]:
    """Why a citation cannot be followed (empty when it can)."""
    key, _, where = citation.partition(" ")
    if OUTSIDE.search(citation):
        return [f"{citation!r}: names a file outside the repository ({OUTSIDE.search(citation)[0]!r}); "
                "cite the official code by key and line, or a source document by key and section"]
    if key not in SOURCES:
        return [f"{citation!r}: key {key!r} is not in Sources ({', '.join(SOURCES)})"]
    src = SOURCES[key]
    if isinstance(src, Document):
        m = _DOC.match(where)
        if not m or m["section"] not in src.sections:
            return [f"{citation!r}: expected '{key} <section> L<a>[-<b>]' with a section of "
                    f"{', '.join(src.sections)}"]
        first, last = src.sections[m["section"]]
        return [f"{citation!r}: L{a}-{b} lies outside {m['section']} (L{first}-{last})"
                for a, b in line_ranges(m["lines"]) if not first <= a <= b <= last]
    if src.lines and not _CODE.match(where):
        return [f"{citation!r}: expected '{key} L<a>[-<b>][, L<c>…] [(note)]'"]
    if not src.lines and not where:
        return [f"{citation!r}: expected '{key} <section or note>'"]
    return []


def keys_cited(citations) -> set[str]:
    return {c.partition(" ")[0] for c in citations}


def render() -> list[str]:
    """The Sources section of SPEC.md."""
    out = ["## Sources", "",
           "Every citation is `<key> <where>`: line numbers of the copy named here for code (or, for code "
           "cited without line numbers, the function or setting meant), a section and its lines for a "
           "source document.  Every key is official code by repository, path and revision, shipped code "
           "adapted from it, or a source document by title and section; no citation names a file outside "
           "this repository.", "",
           "| key | what | repository | path | revision | note |", "|---|---|---|---|---|---|"]
    for key, c in CODE.items():
        out.append(f"| `{key}` | {c.what} | {c.repository} | `{c.path}` | `{c.revision}` | {c.note} |")
    out += ["", "The source documents (in Chinese), cited by section and line (lines of the document's "
            "plain text):", "", "| key | title | sections (lines) |", "|---|---|---|"]
    for key, d in DOCUMENTS.items():
        sections = "; ".join(f"{name}{_heading(key, name)} L{a}-{b}"
                             for name, (a, b) in d.sections.items() if name != "whole")
        out.append(f"| `{key}` | {d.title} ({d.english}) | {sections} |")
    return out + [""]


def _heading(key: str, section: str) -> str:
    heading = HEADINGS.get((key, section))
    return f" ({heading})" if heading else ""
