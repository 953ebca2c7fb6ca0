"""The claims ledger: every numeric claim of the three seed documents, recomputed by the spec.

Seeds (in /shared/seeds, Chinese; paraphrased here):
    000  seed 000_441c543b83921174.txt  "DeepSeek-V4.1 structure (3)": hierarchical indexer, FP4 KV
    002  seed 002_e74b7ccc8c4303c7.txt  "DeepSeek-V4 structure (2)": lightning indexer, CSA
    003  seed 003_38a9efe628eb9795.txt  "DeepSeek-V4 Lightning Indexer, full analysis"

Each claim has a verdict:
    reproduced      the spec computes the stated value (within the rounding the claim itself uses);
    corrected       the spec computes something else, and `rule` names the rule that says why;
    not checkable   the numerics alone cannot check it (a trained model's recall, a latency, a
                    training recipe, an engine's page size).
`dsv4spec claims` and tests/test_claims.py recompute every entry, so the ledger cannot drift.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from . import budget as B
from . import formats as F
from . import indexer as I
from . import layout as L
from .models import profile
from .pool import BLOCK_SIZE, POOL_CAPACITY, TOPK_BLOCKS, has_indexer, layer_role
from .rules import RULES

REPRODUCED, CORRECTED, NOT_CHECKABLE = "reproduced", "corrected", "not checkable"
S000 = "seed 000_441c543b83921174.txt"
S002 = "seed 002_e74b7ccc8c4303c7.txt"
S003 = "seed 003_38a9efe628eb9795.txt"
M1 = 2 ** 20     # the seeds' "1M context": 4·2^20·4096 ≈ 1.7e10 holds for 2^20, not 10^6 (1.6e10)


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    claim: str
    stated: object
    compute: Callable[[], object] | None
    verdict: str
    rule: str | None = None       # the rule that corrects it, or the one it rests on
    rel_tol: float = 0.0          # the claim's own rounding ("≈ 0.4" → 0.05)
    note: str = ""

    @property
    def computed(self):
        return None if self.compute is None else self.compute()

    def matches(self) -> bool:
        got = self.computed
        if isinstance(self.stated, (int, float, Fraction)) and not isinstance(self.stated, bool) \
                and isinstance(got, (int, float, Fraction)):
            return abs(got - self.stated) <= self.rel_tol * abs(self.stated)
        return got == self.stated


def _mask_value():
    one = np.ones((1, 1, 1))
    return float(I.index_scores(one, np.ones((1, 1)), np.ones((1, 1)), np.array([0]))[0, 0])


def _e2m1_values():
    return F.e2m1_decode(np.arange(16, dtype=np.uint8))


def _pages_touched(k_entries: int, context: int, page_tokens: int = 64) -> int:
    """Most pages k selected compressed entries can lie in (they may be anywhere in the context)."""
    return min(k_entries, math.ceil(context / page_tokens))


def _v41_part(kind: str, field: str):
    return lambda: B.summary("v4.1-flash", 0)["rows"][kind][field]


def _v4_flash_part(ratio: int, field: str):
    kind = "csa" if ratio == 4 else "hca"
    return lambda: B.summary("v4-flash", 0)["rows"][f"{kind} (ratio {ratio})"][field]


def _reindex_layers_v41():
    return B.reindex_layers("v4.1-flash")


C = Claim
CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ seed 000 (V4.1)
    C("pool-capacity", f"{S000} summary; Q&A 'how does the indexer cut decode work'",
      "Layer 20 keeps at most 16384 candidate positions: the best 2048 blocks of 8.",
      16384, lambda: POOL_CAPACITY, REPRODUCED, "POOL.SIZE"),
    C("pool-blocks", f"{S000} Q&A 'how does the indexer cut decode work'",
      "Blocks of 8 positions, 2048 kept.", (2048, 8),
      lambda: (profile("v4.1-flash").candidate_topk_blocks, profile("v4.1-flash").candidate_block_size),
      REPRODUCED, "POOL.TOPK_BLOCKS"),
    C("pool-no-pruning-below", f"{S000} 'implementation details'; Q&A 'key details of the pool'",
      "Below 16384 tokens the pool prunes nothing; pruning starts only above 16384.",
      16384, lambda: TOPK_BLOCKS * BLOCK_SIZE, REPRODUCED, "POOL.ALL_REACHABLE",
      note="The largest context with no pruning is exactly 16384 (N ≤ 16384, not N < 16384); the "
           "seed's 'above 16384' phrasing has the boundary right."),
    C("reindex-layers", f"{S000} Q&A 'how does the indexer cut decode work'",
      "The re-index layers are 24, 28, 32 and 36.", (24, 28, 32, 36), _reindex_layers_v41,
      REPRODUCED, "LAYER.V41"),
    C("reindex-topk", f"{S000} Q&A 'how does the indexer cut decode work'",
      "Layer 20 and the re-index layers each take a top-512.", 512,
      lambda: profile("v4.1-flash").index_topk, REPRODUCED, "POOL.REINDEX"),
    C("reindex-constant-work", f"{S000} Q&A 'how does the indexer cut decode work'",
      "A re-index layer scores a constant 16384 × 4096 ≈ 6.7e7 multiply-adds per token.", 6.7e7,
      lambda: B.indexer_layer_macs("v4.1-flash", 24, M1), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.005,
      note="4096 = index_n_heads 32 × index_head_dim 128."),
    C("reindex-1m-without-pool", f"{S000} 'how the pool cuts decode work'",
      "At 1M context the 4 re-index layers would score ≈1.7e10 multiply-adds without the pool.", 1.7e10,
      lambda: B.reindex_macs("v4.1-flash", M1, pool=False), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.02,
      note="4·2^20·4096 = 1.718e10 (1M = 2^20 tokens)."),
    C("reindex-1m-with-pool", f"{S000} 'how the pool cuts decode work'",
      "... and ≈2.7e8 with it.", 2.7e8, lambda: B.reindex_macs("v4.1-flash", M1, pool=True),
      REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.01, note="4·16384·4096 = 2.68e8."),
    C("reindex-1m-ratio", f"{S000} Q&A 'how does the indexer cut decode work'",
      "At 1M the re-index scoring is 1/64 of what it was.", Fraction(1, 64),
      lambda: Fraction(B.reindex_macs("v4.1-flash", M1), B.reindex_macs("v4.1-flash", M1, pool=False)),
      REPRODUCED, "BUDGET.INDEX_WORK"),
    C("indexer-forty-percent", f"{S000} 'how the pool cuts decode work'",
      "The whole indexer costs about four tenths of its no-pool cost at 1M.", 0.4,
      lambda: float(B.indexer_pool_saving("v4.1-flash", M1)), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.05,
      note="0.394 = (3·2^19 + 2^20 + 4·16384) / (3·2^19 + 5·2^20), counting the encoder's three "
           "ratio-2 index sources and layer 20."),
    C("v4-main-584", f"{S000} summary; 'FP4 quantization'", "A V4 main KV entry is 584 bytes.", 584,
      lambda: L.V4_MAIN_KV.nbytes, REPRODUCED, "LAYOUT.V4.MAIN",
      note="448 FP8 + 7 E8M0 + 1 pad + 64 BF16·2; the initial V4 kernel's in-place FP8 QDQ is a BF16 "
           "no-op (FP8.V4_INPLACE)."),
    C("v41-main-288", f"{S000} summary; 'FP4 quantization'", "A V4.1 main KV entry is 288 bytes.", 288,
      lambda: L.V41_MAIN_KV.nbytes, REPRODUCED, "LAYOUT.V41.MAIN"),
    C("v41-main-4.5-bits", f"{S000} 'FP4 quantization'; Q&A 'FP4 main KV vs indexer K'",
      "E2M1 with one E4M3 scale per 16 costs 4.5 bits per number.", Fraction(9, 2),
      lambda: L.V41_MAIN_KV.bits_per_value, REPRODUCED, "LAYOUT.V41.MAIN"),
    C("index-k-4.25-bits", f"{S000} Q&A 'FP4 main KV vs indexer K'",
      "The indexer K, E2M1 with one E8M0 scale per 32, costs 4.25 bits per number.", Fraction(17, 4),
      lambda: L.FP4_INDEX_K.bits_per_value, REPRODUCED, "LAYOUT.INDEX_K"),
    C("e2m1-15-values", f"{S000} Q&A 'why FP4 main KV'", "E2M1 (1 sign, 2 exponent, 1 mantissa bits) "
      "represents 15 values.", 15, lambda: len(set(_e2m1_values().tolist())), REPRODUCED, "FMT.E2M1.VALUES",
      note="16 codes; +0 and −0 are one value."),
    C("e4m3-times-e2m1-max", f"{S000} Q&A 'why FP4 main KV'",
      "The largest E4M3 scale times the largest E2M1 value is 448 × 6 = 2688.", 2688,
      lambda: F.E4M3_MAX * F.E2M1_MAX, REPRODUCED, "FP4.KV.SATURATE"),
    C("rmsnorm-bound", f"{S000} Q&A 'why FP4 main KV'",
      "After RMSNorm no component of a 512-dim KV exceeds 22.6 in magnitude (RoPE keeps the bound).",
      22.6, lambda: math.sqrt(profile("v4.1-flash").head_dim), REPRODUCED, "CMP.NORM", rel_tol=0.002,
      note="sqrt(512) = 22.63 with a unit norm weight: mean(y²) ≤ 1 bounds one component by sqrt(d); "
           "the learned RMSNorm weight multiplies the bound.  RoPE rotates pairs, so a component stays "
           "below the pair norm, itself below sqrt(d)."),
    C("rmsnorm-measured-10", f"{S000} Q&A 'why FP4 main KV'", "The largest component measured is about 10.",
      10, None, NOT_CHECKABLE, note="A property of trained activations."),
    C("v41-qat-small-drop", f"{S000} Q&A 'why FP4 main KV'", "QAT in post-training keeps the loss small.",
      None, None, NOT_CHECKABLE),
    C("v4-flash-3514", f"{S000} summary; Q&A '890 bytes'", "V4-Flash stores 3514 bytes of global KV per token.",
      3514, lambda: B.kv_bytes_per_token("v4-flash"), REPRODUCED, "BUDGET.KV_BYTES", rel_tol=0.5 / 3514,
      note="Exactly 3514.25 = 21·(584+68)/4 + 20·584/128."),
    C("v4-flash-csa-part", f"{S000} Q&A '890 bytes'", "V4-Flash's 21 CSA layers contribute 3066 (main) + 357 (index K).",
      (3066, 357), lambda: (_v4_flash_part(4, "main_bytes_per_token")(), _v4_flash_part(4, "index_k_bytes_per_token")()),
      REPRODUCED, "BUDGET.KV_BYTES"),
    C("v4-flash-hca-part", f"{S000} Q&A '890 bytes'", "... and its 20 HCA layers about 91.", 91,
      _v4_flash_part(128, "main_bytes_per_token"), REPRODUCED, "BUDGET.KV_BYTES", rel_tol=0.5 / 91,
      note="Exactly 91.25 = 20·584/128; HCA layers store no index K."),
    C("v41-full-layer-356", f"{S000} Q&A '890 bytes'", "A full (KV source) layer stores one 288-byte main "
      "entry and one 68-byte index-K entry: 356 bytes.", 356,
      lambda: L.V41_MAIN_KV.nbytes + L.FP4_INDEX_K.nbytes, REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-encoder-part", f"{S000} Q&A '890 bytes'", "The 3 encoder full layers (m=2) store 1.5 entries per token: "
      "432 bytes of main KV and 102 of index K.", (432, 102),
      lambda: (_v41_part("index_source (ratio 2)", "main_bytes_per_token")(),
               _v41_part("index_source (ratio 2)", "index_k_bytes_per_token")()), REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-layer20-part", f"{S000} Q&A '890 bytes'", "Decoder layer 20 (m=1) stores 288 + 68.", (288, 68),
      lambda: (_v41_part("candidate_source (ratio 1)", "main_bytes_per_token")(),
               _v41_part("candidate_source (ratio 1)", "index_k_bytes_per_token")()), REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-890", f"{S000} summary; Q&A '890 bytes'", "V4.1-Flash stores 890 bytes of global KV per token.", 890,
      lambda: B.kv_bytes_per_token("v4.1-flash"), REPRODUCED, "BUDGET.KV_BYTES",
      note="Without cross-layer sharing the main KV alone would be 8352 B/token."),
    C("v41-vs-v4-ratio", f"{S000} Q&A '890 bytes'", "V4.1-Flash's global KV is about 1/3.9 of V4-Flash's.", 3.9,
      lambda: float(B.kv_bytes_per_token("v4-flash") / B.kv_bytes_per_token("v4.1-flash")), REPRODUCED,
      "BUDGET.KV_BYTES", rel_tol=0.05 / 3.9, note="3514.25 / 890 = 3.95, 3.9 to the seed's one decimal (truncated)."),
    C("v41-swa-fp8", f"{S000} 'implementation details'; Q&A 'FP4 main KV vs indexer K'",
      "The sliding-window KV stays FP8.", "E4M3", lambda: L.V41_SWA_KV.payload.name, REPRODUCED, "LAYOUT.V41.SWA"),
    C("v41-encoder-full-layers", f"{S000} Q&A 'training and layers'", "The encoder has 3 full layers at m = 2.", 3,
      lambda: sum(1 for s in profile("v4.1-flash").kv_source_layers if profile("v4.1-flash").ratio(s) == 2),
      REPRODUCED, "LAYER.V41"),
    # ------------------------------------------------------------------ seed 002 (V4)
    C("entries-at-1m", f"{S002} summary; 'why sparse selection after compression'",
      "At 1M context the ratio-4 cache still holds about 260 thousand entries.", 260_000,
      lambda: M1 // 4, REPRODUCED, "IDX.VISIBLE", rel_tol=0.01, note="2^20 / 4 = 262144."),
    C("v4-pro-top-1024", f"{S002} summary; Q&A 'role of the lightning indexer'",
      "The indexer selects the top-1024 compressed blocks.", 1024, lambda: profile("v4-pro").index_topk,
      REPRODUCED, "IDX.TOPK.COUNT", note="True of V4-Pro; V4-Flash keeps 512."),
    C("index-heads-dims", f"{S002} summary; 'design trade-offs'", "The indexer has 64 heads of 128 dims.",
      (64, 128), lambda: (profile("v4-pro").index_n_heads, profile("v4-pro").index_head_dim), REPRODUCED,
      "IDX.WEIGHT.SCALE", note="V4.1 uses 32 heads."),
    C("indexer-one-eighth", f"{S002} 'design trade-offs'",
      "The indexer's 64×128 is 1/8 of the work of the 128-head, 512-dim main attention.", Fraction(1, 8),
      lambda: B.indexer_to_attention_width("v4-pro"), REPRODUCED, "BUDGET.ATTN_WORK",
      note="Per scored entry, q·k width against q·k width; the indexer scores every entry while the "
           "attention reads only window + top-k, so per token the totals differ."),
    C("top-1024-covers-4096", f"{S002} 'V4 vs V3.2'", "1024 blocks of 4 tokens cover 4096 tokens.", 4096,
      lambda: profile("v4-pro").index_topk * 4, REPRODUCED, "IDX.TOPK.COUNT"),
    C("v32-top-2048", f"{S002} 'V4 vs V3.2'", "V3.2 selects 2048 tokens.", 2048,
      lambda: profile("v3.2").index_topk, REPRODUCED, "IDX.TOPK.V32"),
    C("csa-core-151m", f"{S002} Q&A 'CSA core attention'",
      "CSA core attention is about 151 M per token per layer, independent of the context.", 151e6,
      lambda: B.core_attention_macs("v4-pro", 2, M1), REPRODUCED, "BUDGET.ATTN_WORK", rel_tol=0.005,
      note="2·128·512·1152 = 150,994,944 multiply-adds (the seed says MFLOP; as FLOPs it is 302 M)."),
    C("csa-1152-entries", f"{S002} Q&A 'CSA core attention'; 'one CSA layer'",
      "Each query attends to 1152 entries: 128 window + 1024 selected.", 1152,
      lambda: B.attended_entries("v4-pro", 2, M1), REPRODUCED, "BUDGET.ATTN_WORK"),
    C("v4-pro-hidden", f"{S002} Q&A 'one CSA layer'", "The hidden size is 7168.", 7168,
      lambda: profile("v4-pro").dim, REPRODUCED, "BUDGET.ATTN_WORK"),
    C("v4-pro-q-latent-1536", f"{S002} Q&A 'where the indexer's k and q come from'",
      "The indexer query expands the 1536-dim low-rank latent c^Q.", 1536, None, NOT_CHECKABLE,
      note="q_lora_rank is not a profile field (official-rules.md §8 gives 1536 for V4-Pro)."),
    C("v4-pro-output-16384", f"{S002} Q&A 'one CSA layer'", "The output projection maps 16384 to 7168.", 16384,
      None, NOT_CHECKABLE, note="o_groups·o_lora_rank = 16·1024 (official-rules.md §8) is not a profile field."),
    C("v4-random-hadamard", f"{S002} Q&A 'quantization in the indexer'",
      "The indexer q and k get a random Hadamard rotation before FP4.", "random",
      lambda: "deterministic Sylvester, no random signs", CORRECTED, "HAD.MATRIX"),
    C("v4-training-recipe", f"{S002} 'training and inference details'",
      "Dense warm-up for 1T tokens, sparse training from 64K sequence length.", None, None, NOT_CHECKABLE),
    # ------------------------------------------------------------------ seed 003 (V4 indexer)
    C("hca-no-indexer", f"{S003} §2.1", "HCA (m = 128) layers need no indexer.", 0,
      lambda: sum(1 for l in profile("v4-flash").backbone if profile("v4-flash").ratio(l) == 128
                  and has_indexer(layer_role(profile("v4-flash"), l))), REPRODUCED, "LAYER.V4"),
    C("entries-250k", f"{S003} §2.2", "A million tokens still leave over 250 thousand compressed blocks.",
      True, lambda: M1 // 4 > 250_000, REPRODUCED, "IDX.VISIBLE"),
    C("fp4-halves-fp8", f"{S003} §2.2, §5.2", "FP4 halves the indexer K memory of FP8.", 0.5,
      lambda: L.FP4_INDEX_K.nbytes / L.V32_INDEX_K.nbytes, REPRODUCED, "LAYOUT.INDEX_K", rel_tol=0.05,
      note="68 B vs the V3.2 FP8 entry's 132 B: 0.515."),
    C("recall-99.7", f"{S003} §2.2, §7.1", "Top-k recall 99.7% (Pro, 1024) and 99.5% (Flash, 512); "
      "perplexity within 0.1%.", None, None, NOT_CHECKABLE, note="Measured on a trained model."),
    C("config-table", f"{S003} §2.3", "Pro and Flash: m = 4, 64 indexer heads of 128 dims, top-1024 (Pro) "
      "and top-512 (Flash).", (4, 64, 128, 1024, 512),
      lambda: (min(r for r in profile("v4-pro").compress_ratios if r), profile("v4-flash").index_n_heads,
               profile("v4-flash").index_head_dim, profile("v4-pro").index_topk, profile("v4-flash").index_topk),
      REPRODUCED, "IDX.TOPK.COUNT"),
    C("page-64-tokens", f"{S003} §2.3, §6.1", "A page holds 64 tokens, i.e. 16 compressed blocks at m = 4.",
      64, None, NOT_CHECKABLE, note="The reference has no paging; 64 is an engine parameter "
      "(official-rules.md §7.3, §10 Q7).  64 / 4 = 16 is only arithmetic."),
    C("mqa-one-64th", f"{S003} §3.1, §8", "Sharing one K across the 64 query heads makes the indexer cache 1/64 "
      "of an MHA cache.", Fraction(1, 64), lambda: Fraction(1, profile("v4-flash").index_n_heads),
      REPRODUCED, "LAYOUT.INDEX_K", note="V4.1's 32 heads make it 1/32."),
    C("index-k-fp32-scale", f"{S003} §4 stage 3, §5.2, §10.2", "The K dequantization factor kv_scale is one "
      "FP32 per token (4 B).", "1 FP32 per entry",
      lambda: f"{L.FP4_INDEX_K.fields['scales'].count} {L.FP4_INDEX_K.scale.name} per entry", CORRECTED,
      "LAYOUT.INDEX_K", note="4 bytes either way, but four E8M0 powers of two, one per 32 dims; the FP32 "
      "scale is V3.2's."),
    C("score-fp32-then-bf16", f"{S003} §4 stage 4, §10.1", "Scores are FP32 and cast once to BF16 before "
      "top-k.", "fp32, then bf16", lambda: profile("v4-flash").score_dtype + " at every step", CORRECTED,
      "IDX.SCORE.ROUNDING"),
    C("topk-bf16-2x", f"{S003} §4 stage 4", "The BF16 cast makes top-k 2× faster.", 2, None, NOT_CHECKABLE),
    C("masked-scores-zero", f"{S003} §9.1", "Future positions' scores are set to 0.", 0.0, _mask_value,
      CORRECTED, "IDX.MASK", note="The code the seed quotes adds −inf, as the reference does."),
    C("sixteen-pages", f"{S003} §9.2", "The top-1024 load 1024 tokens ÷ 64 = 16 pages.", 16,
      lambda: _pages_touched(profile("v4-pro").index_topk, M1), CORRECTED, "IDX.TOPK.SELECTION",
      note="The top-k are 1024 compressed entries (4096 tokens) anywhere in the context, so at 1M they "
           "can lie in up to 1024 distinct 64-token pages; and the page size is not in the reference."),
    C("fp4-to-fp8-lossless", f"{S003} §10.3", "FP4 → FP8 dequantization is lossless: E4M3 holds every E2M1 value.",
      True, lambda: bool(np.array_equal(F.e4m3_decode(F.e4m3_encode(_e2m1_values())), _e2m1_values())),
      REPRODUCED, "FMT.E4M3.VALUES",
      note="True of the element values.  V4's main attention reads its own FP8 cache, not the indexer's FP4 K."),
    C("v4-hadamard", f"{S003} §1, §11", "The V4 indexer q and k are Hadamard-rotated before FP4.", True,
      lambda: profile("v4-flash").hadamard, REPRODUCED, "HAD.PLACEMENT",
      note="V4 only: V4.1 has no rotation (HAD.ABSENT_V41)."),
    C("v4-main-fp8-rope-bf16", f"{S003} §10.2", "The main KV is FP8 with the RoPE part in BF16.", ("E4M3", 64),
      lambda: (L.V4_MAIN_KV.payload.name, L.V4_MAIN_KV.tail_dims), REPRODUCED, "LAYOUT.V4.MAIN"),
    C("swa-128", f"{S003} §1, §6.2", "The sliding window holds 128 uncompressed tokens.", 128,
      lambda: profile("v4-flash").window, REPRODUCED, "BUDGET.WINDOW"),
    C("index-query-shape", f"{S003} §7.3", "The indexer query is [64, 128].", (64, 128),
      lambda: (profile("v4-flash").index_n_heads, profile("v4-flash").index_head_dim), REPRODUCED,
      "IDX.WEIGHT.SCALE"),
    C("latency-split", f"{S003} §7.2", "Decode step: indexer ~35%, top-k ~15%, attention ~50%.", None, None,
      NOT_CHECKABLE),
    C("system-gains", f"{S003} §13", "Attention compute 1/200+ at 1M; FLOPs 10-27% of V3.2; KV cache 2% of a "
      "BF16 design, 7-10% of V3.2.", None, None, NOT_CHECKABLE,
      note="The baselines (V3.2's main cache layout, 'a BF16 design') are not in the reference."),
)


def problems() -> list[str]:
    """Every way the ledger disagrees with its own verdicts (empty when it holds)."""
    out = []
    ids = [c.id for c in CLAIMS]
    if len(set(ids)) != len(ids):
        out.append("duplicate claim ids")
    for c in CLAIMS:
        if c.rule is not None and c.rule not in RULES:
            out.append(f"{c.id}: cites unknown rule {c.rule}")
        if c.verdict == REPRODUCED and (c.compute is None or not c.matches()):
            out.append(f"{c.id}: marked reproduced, but the spec computes {c.computed!r} vs stated {c.stated!r}")
        elif c.verdict == CORRECTED and (c.compute is None or c.rule is None or c.matches()):
            out.append(f"{c.id}: marked corrected, but computes {c.computed!r} vs stated {c.stated!r} "
                       f"(rule {c.rule})")
        elif c.verdict == NOT_CHECKABLE and c.compute is not None:
            out.append(f"{c.id}: marked not checkable but has a computation")
        elif c.verdict not in (REPRODUCED, CORRECTED, NOT_CHECKABLE):
            out.append(f"{c.id}: unknown verdict {c.verdict!r}")
    return out


def _plain(v):
    if isinstance(v, Fraction):
        return str(v) if v.denominator != 1 else int(v)
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    return v


def ledger() -> list[dict]:
    """The ledger as plain data (for `dsv4spec claims --json`)."""
    return [{"id": c.id, "source": c.source, "claim": c.claim, "stated": _plain(c.stated),
             "computed": _plain(c.computed), "verdict": c.verdict, "rule": c.rule, "note": c.note}
            for c in CLAIMS]
