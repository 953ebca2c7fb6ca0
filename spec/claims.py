"""The claims ledger: every numeric claim of the three source documents, recomputed by the spec.

The documents (in Chinese; keyed by title and section in spec.sources and the Sources section of SPEC.md):
    doc-000  "DeepSeek-V4.1 structure (3)": hierarchical sparse indexer, FP4 KV cache
    doc-002  "DeepSeek-V4 structure (2)": lightning indexer, CSA
    doc-003  "DeepSeek-V4 Lightning Indexer, a full analysis"

Each claim cites the sections and lines it comes from, and has a verdict:
    reproduced      the spec computes the stated value (within the rounding the claim itself uses);
    corrected       the spec computes something else, and `rule` names the rule whose `differs`
                    says why;
    not checkable   the numerics alone cannot check it (a trained model's recall, a latency, a
                    training recipe, an engine's page size).
Every computed value is derived from the model profiles and the spec's definitions, never typed in:
a claim's own parameters (1M = 2^20 tokens, a 64-token page) are the only literals.
`dsv4spec claims` and tests/test_claims.py recompute every entry, so the ledger cannot drift.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from . import budget as B
from . import compressor as CMP
from . import formats as F
from . import indexer as I
from . import layout as L
from . import sources as SRC
from .models import profile
from .pool import BLOCK_SIZE, POOL_CAPACITY, TOPK_BLOCKS, has_indexer, layer_role
from .rules import RULES

REPRODUCED, CORRECTED, NOT_CHECKABLE = "reproduced", "corrected", "not checkable"
M1 = 2 ** 20     # the documents' "1M context": 4·2^20·4096 ≈ 1.7e10 holds for 2^20, not 10^6 (1.6e10)
PAGE_TOKENS = 64  # document 003's page (an engine parameter, not in the reference)


@dataclass(frozen=True)
class Claim:
    id: str
    sources: tuple[str, ...]      # citations: "doc-000 Q&A 1 L13"
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

    @property
    def documents(self) -> set[str]:
        return {k for k in SRC.keys_cited(self.sources) if k in SRC.DOCUMENTS}

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


def _csa_ratio(model: str) -> int:
    """The compress ratio of the layers with their own indexer (V4: the CSA layers, 4)."""
    m = profile(model)
    ratios = {m.ratio(layer) for layer in m.backbone if layer_role(m, layer).kind == "csa"}
    if len(ratios) != 1:
        raise ValueError(f"{model}: expected one CSA compress ratio, got {sorted(ratios)}")
    return ratios.pop()


def _csa_layer(model: str) -> int:
    m = profile(model)
    return next(layer for layer in m.backbone if layer_role(m, layer).kind == "csa")


def _tokens_per_scored_entry(model: str) -> int:
    """Tokens one compressed entry pools: its group, plus the group before through the overlap."""
    ratio = _csa_ratio(model)
    return CMP.channel_factor(model, ratio) * ratio


def _pages_spanned(model: str, context: int) -> tuple[int, int]:
    """Fewest and most 64-token pages the top-k compressed entries can lie in at this context."""
    m = profile(model)
    tokens = m.index_topk * _csa_ratio(model)
    return math.ceil(tokens / PAGE_TOKENS), min(m.index_topk, math.ceil(context / PAGE_TOKENS))


def _indexer_growth(model: str) -> str:
    """How one decode step's indexer work grows with the context: doubling N multiplies it by r."""
    r = Fraction(B.indexer_macs_per_token(model, 2 * M1), B.indexer_macs_per_token(model, M1))
    return "sub-linear" if r < 2 else "linear" if r == 2 else "super-linear"


def _indexer_to_attention_per_entry(model: str) -> Fraction:
    """Indexer multiply-adds per scored entry over core attention's per attended entry (BUDGET.*)."""
    layer = _csa_layer(model)
    index = Fraction(B.indexer_layer_macs(model, layer, M1), B.scored_entries(model, layer, M1))
    attention = Fraction(B.core_attention_macs(model, layer, M1), B.attended_entries(model, layer, M1))
    return index / attention


def _rotation(model: str) -> str:
    """The spec's indexer rotation: none, the plain Sylvester matrix, or one with random signs."""
    m = profile(model)
    if not I.rotates_index_qk(m):
        return "none"
    d = m.index_head_dim
    sylvester = np.ones((1, 1))
    while sylvester.shape[0] < d:
        sylvester = np.block([[sylvester, sylvester], [sylvester, -sylvester]])
    signs = np.sign(I.hadamard(np.eye(d)))
    return "deterministic Sylvester, no random signs" if np.array_equal(signs, sylvester.T) else "random"


def _score_rounding(model: str) -> str:
    """How the model's score is rounded, told apart on one query where the three forms differ:
    32 heads alternating w = ±1 on dots 1 + 3·2^-9 and 1 + 2^-9 (IDX.SCORE.ROUNDING's example) and
    one more head with w = 1 on a dot of 3·2^-13.  Exactly 2^-4 + 3·2^-13; cast once to BF16,
    2^-4 + 2^-11; rounded at every step, 2^-3."""
    m = profile(model)
    sign = np.where(np.arange(33) % 2 == 0, 1.0, -1.0)
    q = np.stack([np.ones(33), np.where(sign > 0, 3.0, 1.0) * 2.0 ** -9], axis=-1)
    q[32] = (3 * 2.0 ** -13, 0.0)
    k, w, visible = np.ones((1, 2)), sign[None], np.array([1])
    score = I.index_scores(q[None], k, w, visible, m.score_dtype)[0, 0]
    exact = I.index_scores(q[None], k, w, visible, "fp32")[0, 0]
    if score == exact:
        return "fp32 throughout"
    return "fp32, then bf16" if score == I.round_bf16(exact) else "rounded at every step"


def _v41_part(kind: str, field: str):
    return lambda: B.summary("v4.1-flash", 0)["rows"][kind][field]


def _v4_flash_part(ratio: int, field: str):
    kind = "csa" if ratio == 4 else "hca"
    return lambda: B.summary("v4-flash", 0)["rows"][f"{kind} (ratio {ratio})"][field]


def _reindex_layers_v41():
    return B.reindex_layers("v4.1-flash")


C = Claim
CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ document 000 (V4.1)
    C("pool-capacity", ("doc-000 summary L3", "doc-000 Q&A 1 L13"),
      "Layer 20 keeps at most 16384 candidate positions: the best 2048 blocks of 8.",
      16384, lambda: POOL_CAPACITY, REPRODUCED, "POOL.SIZE"),
    C("pool-blocks", ("doc-000 Q&A 1 L13",),
      "Blocks of 8 positions, 2048 kept.", (2048, 8),
      lambda: (profile("v4.1-flash").candidate_topk_blocks, profile("v4.1-flash").candidate_block_size),
      REPRODUCED, "POOL.TOPK_BLOCKS"),
    C("pool-no-pruning-below", ("doc-000 details L10", "doc-000 Q&A 2 L15"),
      "Below 16384 tokens the pool prunes nothing; pruning starts only above 16384.",
      16384, lambda: TOPK_BLOCKS * BLOCK_SIZE, REPRODUCED, "POOL.ALL_REACHABLE",
      note="The largest context with no pruning is exactly 16384 (N ≤ 16384, not N < 16384); the "
           "document's 'only after exceeding 16384 tokens' (Q&A 2) has the boundary right."),
    C("reindex-layers", ("doc-000 Q&A 1 L13",),
      "The re-index layers are 24, 28, 32 and 36.", (24, 28, 32, 36), _reindex_layers_v41,
      REPRODUCED, "LAYER.V41"),
    C("reindex-topk", ("doc-000 Q&A 1 L13",),
      "Layer 20 and the re-index layers each take a top-512.", 512,
      lambda: profile("v4.1-flash").index_topk, REPRODUCED, "POOL.REINDEX"),
    C("reindex-constant-work", ("doc-000 Q&A 1 L13",),
      "A re-index layer scores a constant 16384 × 4096 ≈ 6.7e7 multiply-adds per token.", 6.7e7,
      lambda: B.indexer_layer_macs("v4.1-flash", 24, M1), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.005,
      note="4096 = index_n_heads 32 × index_head_dim 128.  A kernel that scores only the pool; the "
           "reference scores every position and then masks, as the document itself says (details)."),
    C("reindex-1m-without-pool", ("doc-000 pool work L6",),
      "At 1M context the 4 re-index layers would score ≈1.7e10 multiply-adds without the pool.", 1.7e10,
      lambda: B.reindex_macs("v4.1-flash", M1, pool=False), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.02,
      note="4·2^20·4096 = 1.718e10 (1M = 2^20 tokens)."),
    C("reindex-1m-with-pool", ("doc-000 pool work L6",),
      "... and ≈2.7e8 with it.", 2.7e8, lambda: B.reindex_macs("v4.1-flash", M1, pool=True),
      REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.01, note="4·16384·4096 = 2.68e8."),
    C("reindex-1m-ratio", ("doc-000 Q&A 1 L13",),
      "At 1M the re-index scoring is 1/64 of what it was.", Fraction(1, 64),
      lambda: Fraction(B.reindex_macs("v4.1-flash", M1), B.reindex_macs("v4.1-flash", M1, pool=False)),
      REPRODUCED, "BUDGET.INDEX_WORK"),
    C("indexer-forty-percent", ("doc-000 pool work L6",),
      "The whole indexer costs about four tenths of its no-pool cost at 1M.", 0.4,
      lambda: float(B.indexer_pool_saving("v4.1-flash", M1)), REPRODUCED, "BUDGET.INDEX_WORK", rel_tol=0.05,
      note="0.394 = (3·2^19 + 2^20 + 4·16384) / (3·2^19 + 5·2^20), counting the encoder's three "
           "ratio-2 index sources and layer 20."),
    C("v4-main-584", ("doc-000 summary L3", "doc-000 FP4 storage L8"), "A V4 main KV entry is 584 bytes.", 584,
      lambda: L.V4_MAIN_KV.nbytes, REPRODUCED, "LAYOUT.V4.MAIN",
      note="448 FP8 + 7 E8M0 + 64 BF16·2 = 583 bytes of content, plus the one pad byte engines store; "
           "the reference keeps BF16 and materializes no bytes."),
    C("v41-main-288", ("doc-000 summary L3", "doc-000 FP4 storage L8"), "A V4.1 main KV entry is 288 bytes.", 288,
      lambda: L.V41_MAIN_KV.nbytes, REPRODUCED, "LAYOUT.V41.MAIN"),
    C("v41-main-4.5-bits", ("doc-000 FP4 storage L8", "doc-000 Q&A 6 L23"),
      "E2M1 with one E4M3 scale per 16 costs 4.5 bits per number.", Fraction(9, 2),
      lambda: L.V41_MAIN_KV.bits_per_value, REPRODUCED, "LAYOUT.V41.MAIN"),
    C("index-k-4.25-bits", ("doc-000 Q&A 6 L23",),
      "The indexer K, E2M1 with one E8M0 scale per 32, costs 4.25 bits per number.", Fraction(17, 4),
      lambda: L.FP4_INDEX_K.bits_per_value, REPRODUCED, "LAYOUT.INDEX_K"),
    C("e2m1-15-values", ("doc-000 Q&A 3 L17",), "E2M1 (1 sign, 2 exponent, 1 mantissa bits) "
      "represents 15 values.", 15, lambda: len(set(_e2m1_values().tolist())), REPRODUCED, "FMT.E2M1.VALUES",
      note="16 codes; +0 and −0 are one value."),
    C("e4m3-times-e2m1-max", ("doc-000 Q&A 3 L17",),
      "The largest E4M3 scale times the largest E2M1 value is 448 × 6 = 2688.", 2688,
      lambda: F.E4M3_MAX * F.E2M1_MAX, REPRODUCED, "FP4.KV.SATURATE"),
    C("rmsnorm-bound", ("doc-000 Q&A 3 L17",),
      "After RMSNorm no component of a 512-dim KV exceeds 22.6 in magnitude (RoPE keeps the bound).",
      22.6, lambda: math.sqrt(profile("v4.1-flash").head_dim), REPRODUCED, "CMP.NORM", rel_tol=0.002,
      note="sqrt(512) = 22.63 with a unit norm weight: mean(y²) ≤ 1 bounds one component by sqrt(d); "
           "the learned RMSNorm weight multiplies the bound.  RoPE rotates pairs, so a component stays "
           "below the pair norm, itself below sqrt(d)."),
    C("rmsnorm-measured-10", ("doc-000 Q&A 3 L17",), "The largest component measured is about 10.",
      10, None, NOT_CHECKABLE, note="A property of trained activations."),
    C("v41-qat-small-drop", ("doc-000 Q&A 3 L17",), "QAT in post-training keeps the loss small.",
      None, None, NOT_CHECKABLE),
    C("v4-flash-3514", ("doc-000 summary L3", "doc-000 Q&A 4 L19"),
      "V4-Flash stores 3514 bytes of global KV per token.",
      3514, lambda: B.kv_bytes_per_token("v4-flash"), REPRODUCED, "BUDGET.KV_BYTES", rel_tol=0.5 / 3514,
      note="Exactly 3514.25 = 21·(584+68)/4 + 20·584/128."),
    C("v4-flash-csa-part", ("doc-000 Q&A 4 L19",),
      "V4-Flash's 21 CSA layers contribute 3066 (main) + 357 (index K).", (3066, 357),
      lambda: (_v4_flash_part(4, "main_bytes_per_token")(), _v4_flash_part(4, "index_k_bytes_per_token")()),
      REPRODUCED, "BUDGET.KV_BYTES"),
    C("v4-flash-hca-part", ("doc-000 Q&A 4 L19",), "... and its 20 HCA layers about 91.", 91,
      _v4_flash_part(128, "main_bytes_per_token"), REPRODUCED, "BUDGET.KV_BYTES", rel_tol=0.5 / 91,
      note="Exactly 91.25 = 20·584/128; HCA layers store no index K."),
    C("v41-full-layer-356", ("doc-000 Q&A 4 L19",), "A full (KV source) layer stores one 288-byte main "
      "entry and one 68-byte index-K entry: 356 bytes.", 356,
      lambda: L.V41_MAIN_KV.nbytes + L.FP4_INDEX_K.nbytes, REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-encoder-part", ("doc-000 Q&A 4 L19",), "The 3 encoder full layers (m=2) store 1.5 entries per "
      "token: 432 bytes of main KV and 102 of index K.", (432, 102),
      lambda: (_v41_part("index_source (ratio 2)", "main_bytes_per_token")(),
               _v41_part("index_source (ratio 2)", "index_k_bytes_per_token")()), REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-layer20-part", ("doc-000 Q&A 4 L19",), "Decoder layer 20 (m=1) stores 288 + 68.", (288, 68),
      lambda: (_v41_part("candidate_source (ratio 1)", "main_bytes_per_token")(),
               _v41_part("candidate_source (ratio 1)", "index_k_bytes_per_token")()), REPRODUCED, "BUDGET.KV_BYTES"),
    C("v41-890", ("doc-000 summary L3", "doc-000 FP4 storage L8", "doc-000 Q&A 4 L19"),
      "V4.1-Flash stores 890 bytes of global KV per token.", 890,
      lambda: B.kv_bytes_per_token("v4.1-flash"), REPRODUCED, "BUDGET.KV_BYTES",
      note="Without cross-layer sharing the main KV alone would be 8352 B/token."),
    C("v41-vs-v4-ratio", ("doc-000 Q&A 4 L19",), "V4.1-Flash's global KV is about 1/3.9 of V4-Flash's.", 3.9,
      lambda: float(B.kv_bytes_per_token("v4-flash") / B.kv_bytes_per_token("v4.1-flash")), REPRODUCED,
      "BUDGET.KV_BYTES", rel_tol=0.05 / 3.9,
      note="3514.25 / 890 = 3.9486, which rounds to the document's 3.9 at one decimal."),
    C("v41-swa-fp8", ("doc-000 details L10", "doc-000 Q&A 6 L23"),
      "The sliding-window KV stays FP8.", "E4M3", lambda: L.V41_SWA_KV.payload.name, REPRODUCED, "LAYOUT.V41.SWA"),
    C("v41-encoder-full-layers", ("doc-000 Q&A 4 L19", "doc-000 Q&A 5 L21"),
      "The encoder has 3 full layers at m = 2.", 3,
      lambda: sum(1 for s in profile("v4.1-flash").kv_source_layers if profile("v4.1-flash").ratio(s) == 2),
      REPRODUCED, "LAYER.V41"),
    # ------------------------------------------------------------------ document 002 (V4)
    C("entries-at-1m", ("doc-002 summary L3", "doc-002 why sparse L6"),
      "At 1M context the ratio-4 cache still holds about 260 thousand entries.", 260_000,
      lambda: M1 // _csa_ratio("v4-pro"), REPRODUCED, "CMP.GROUPS", rel_tol=0.01, note="2^20 / 4 = 262144."),
    C("v4-pro-top-1024", ("doc-002 summary L3", "doc-002 Q&A 1 L15"),
      "The indexer selects the top-1024 compressed blocks.", 1024, lambda: profile("v4-pro").index_topk,
      REPRODUCED, "IDX.TOPK.COUNT", note="True of V4-Pro; V4-Flash keeps 512."),
    C("index-heads-dims", ("doc-002 summary L3", "doc-002 design trade-offs L8"),
      "The indexer has 64 heads of 128 dims.",
      (64, 128), lambda: (profile("v4-pro").index_n_heads, profile("v4-pro").index_head_dim), REPRODUCED,
      "IDX.WEIGHT.SCALE", note="V4.1 uses 32 heads."),
    C("indexer-one-eighth", ("doc-002 design trade-offs L8",),
      "The indexer's 64×128 is 1/8 of the compute of the 128-head, 512-dim main attention.", Fraction(1, 8),
      lambda: _indexer_to_attention_per_entry("v4-pro"), CORRECTED, "BUDGET.ATTN_WORK",
      note="Per entry, 64·128 indexer multiply-adds against 2·128·512 for the attention's q·k and p·v: "
           "1/16.  The 1/8 is the ratio of the q·k widths alone.  Per token the totals differ further: "
           "the indexer scores every entry, the attention reads window + top-k."),
    C("top-1024-covers-4096", ("doc-002 V4 vs V3.2 L10",), "1024 blocks of 4 tokens cover 4096 tokens.", 4096,
      lambda: profile("v4-pro").index_topk * _csa_ratio("v4-pro"), REPRODUCED, "IDX.TOPK.COUNT",
      note="The 4096 tokens of the selected entries' own groups; through the overlap each entry also "
           "draws on the 4 tokens before its group."),
    C("v32-top-2048", ("doc-002 V4 vs V3.2 L10", "doc-002 Q&A 2 L17"), "V3.2 selects 2048 tokens.", 2048,
      lambda: profile("v3.2").index_topk, REPRODUCED, "IDX.TOPK.V32"),
    C("csa-core-151m", ("doc-002 Q&A 5 L23",),
      "CSA core attention is about 151 MFLOP per token per layer, independent of the context.", 151e6,
      lambda: 2 * B.core_attention_macs("v4-pro", _csa_layer("v4-pro"), M1), CORRECTED, "BUDGET.ATTN_WORK",
      note="2·128·512·1152 = 150,994,944 multiply-adds, i.e. 301,989,888 FLOP (≈ 302 M): the document "
           "counts multiply-adds and calls them FLOPs."),
    C("csa-1152-entries", ("doc-002 Q&A 5 L23", "doc-002 Q&A 8 L29"),
      "Each query attends to 1152 entries: 128 window + 1024 selected.", 1152,
      lambda: B.attended_entries("v4-pro", _csa_layer("v4-pro"), M1), REPRODUCED, "IDX.TOPK.COUNT",
      note="The window (BUDGET.WINDOW) plus k = min(index_topk, N // ratio) selected entries."),
    C("v4-pro-hidden", ("doc-002 Q&A 8 L29",), "The hidden size is 7168.", 7168,
      lambda: profile("v4-pro").dim, REPRODUCED, None, note="A model-profile constant (the released V4-Pro config)."),
    C("v4-pro-q-latent-1536", ("doc-002 Q&A 6 L25",),
      "The indexer query expands the 1536-dim low-rank latent c^Q.", 1536,
      lambda: profile("v4-pro").q_lora_rank, REPRODUCED, "PATH.Q.LATENT",
      note="q_lora_rank, the width of qr = q_norm(wq_a(x)) that the indexer's wq_b reads (V4-model L393, L496)."),
    C("v4-pro-output-16384", ("doc-002 Q&A 8 L29",), "The output projection maps 16384 to 7168.", (16384, 7168),
      lambda: (profile("v4-pro").o_groups * profile("v4-pro").o_lora_rank, profile("v4-pro").dim), REPRODUCED,
      "ATTN.LAYER", note="wo_b's input o_groups·o_lora_rank to dim (V4-model L462-463)."),
    C("v4-random-hadamard", ("doc-002 Q&A 7 L27",),
      "The indexer q and k get a random Hadamard rotation before FP4.", "random",
      lambda: _rotation("v4-pro"), CORRECTED, "HAD.MATRIX"),
    C("v4-training-recipe", ("doc-002 training and inference L12", "doc-002 Q&A 4 L21"),
      "Dense warm-up for 1T tokens, sparse training from 64K sequence length.", None, None, NOT_CHECKABLE),
    # ------------------------------------------------------------------ document 003 (V4 indexer)
    C("hca-no-indexer", ("doc-003 §2.1 L31",), "HCA (m = 128) layers need no indexer.", 0,
      lambda: sum(1 for l in profile("v4-flash").backbone if profile("v4-flash").ratio(l) == 128
                  and has_indexer(layer_role(profile("v4-flash"), l))), REPRODUCED, "LAYER.V4"),
    C("entries-250k", ("doc-003 §2.2 L35",), "A million tokens still leave over 250 thousand compressed blocks.",
      True, lambda: M1 // _csa_ratio("v4-pro") > 250_000, REPRODUCED, "CMP.GROUPS"),
    C("fp4-halves-fp8", ("doc-003 §2.2 L37", "doc-003 §5.2 L184"), "FP4 halves the indexer K memory of FP8.", 0.5,
      lambda: L.FP4_INDEX_K.nbytes / L.V32_INDEX_K.nbytes, REPRODUCED, "LAYOUT.V32.INDEX_K", rel_tol=0.05,
      note="68 B (LAYOUT.INDEX_K) vs the V3.2 FP8 entry's 132 B: 0.515."),
    C("recall-99.7", ("doc-003 §2.2 L38", "doc-003 §7.1 L208-212"), "Top-k recall 99.7% (Pro, 1024) and 99.5% "
      "(Flash, 512); perplexity within 0.1%.", None, None, NOT_CHECKABLE, note="Measured on a trained model."),
    C("config-table", ("doc-003 §2.3 L42-46",), "Pro and Flash: m = 4, 64 indexer heads of 128 dims, top-1024 "
      "(Pro) and top-512 (Flash).", (4, 64, 128, 1024, 512),
      lambda: (_csa_ratio("v4-pro"), profile("v4-flash").index_n_heads,
               profile("v4-flash").index_head_dim, profile("v4-pro").index_topk, profile("v4-flash").index_topk),
      REPRODUCED, "IDX.TOPK.COUNT"),
    C("page-64-tokens", ("doc-003 §2.3 L47", "doc-003 §6.1 L192"),
      "A page holds 64 tokens, i.e. 16 compressed blocks at m = 4.",
      64, None, NOT_CHECKABLE, note="The reference has no paging (one flat kv_cache a layer, V4-model "
      "L473-474); 64 is an engine parameter.  64 / 4 = 16 is only arithmetic."),
    C("mqa-one-64th", ("doc-003 §3.1 L64", "doc-003 §8 L249"), "Sharing one K across the 64 query heads makes "
      "the indexer cache 1/64 of an MHA cache.", Fraction(1, 64), lambda: Fraction(1, profile("v4-flash").index_n_heads),
      REPRODUCED, "IDX.SCORE.FORMULA", note="One k[s] per entry for all heads; V4.1's 32 heads make it 1/32."),
    C("index-k-fp32-scale", ("doc-003 §4 stage 3 L158", "doc-003 §5.2 L183", "doc-003 §10.2 L306"),
      "The K dequantization factor kv_scale is one FP32 per token (4 B).", "1 FP32 per entry",
      lambda: f"{L.FP4_INDEX_K.fields['scales'].count} {L.FP4_INDEX_K.scale.name} per entry", CORRECTED,
      "LAYOUT.INDEX_K", note="4 bytes either way, but four E8M0 powers of two, one per 32 dims; the FP32 "
      "scale is V3.2's."),
    C("score-fp32-then-bf16", ("doc-003 §4 stage 4 L163-165", "doc-003 §10.1 L292-294"),
      "Scores are FP32 and cast once to BF16 before top-k.", "fp32, then bf16", lambda: _score_rounding("v4-flash"),
      CORRECTED, "IDX.SCORE.ROUNDING"),
    C("topk-bf16-2x", ("doc-003 §4 stage 4 L163",), "The BF16 cast makes top-k 2× faster.", 2, None, NOT_CHECKABLE),
    C("masked-scores-zero", ("doc-003 §9.1 L262",), "Future positions' scores are set to 0.", 0.0, _mask_value,
      CORRECTED, "IDX.MASK", note="The code the document quotes adds −inf, as the reference does."),
    C("scoring-unit-token", ("doc-003 §9.2 L276", "doc-003 §10.4 L329"),
      "The smallest scoring unit is a single token.", 1, lambda: _tokens_per_scored_entry("v4-pro"),
      CORRECTED, "IDX.VISIBLE",
      note="V4 scores compressed entries: at ratio 4 an entry pools 8 tokens (its group of 4 and, through "
           "the overlap, the 4 before); the document's own §9.2 keeps '1024 compressed K blocks'."),
    C("sixteen-pages", ("doc-003 §9.2 L276-280",), "The top-1024 load 1024 tokens ÷ 64 = 16 pages.", 16,
      lambda: _pages_spanned("v4-pro", M1), CORRECTED, "IDX.VISIBLE",
      note="1024 entries at ratio 4 stand for 4096 tokens, 16 entries to a 64-token page; lying anywhere "
           "in the context they span between 64 and min(1024, N/64) pages: (64, 1024) at N = 2^20.  The "
           "page size is not in the reference."),
    C("indexer-sub-linear", ("doc-003 §1 L9", "doc-003 §8 L251"),
      "The indexer brings attention from O(n²) down to sub-linear cost.", "sub-linear",
      lambda: _indexer_growth("v4-pro"), CORRECTED, "BUDGET.INDEX_WORK",
      note="Doubling the context doubles one decode step's indexer work, (N // ratio)·64·128 per CSA "
           "layer: linear per token, quadratic over a sequence."),
    C("fp4-to-fp8-lossless", ("doc-003 §10.3 L314",),
      "FP4 → FP8 dequantization is lossless: E4M3 holds every E2M1 value.",
      True, lambda: bool(np.array_equal(F.e4m3_decode(F.e4m3_encode(_e2m1_values())), _e2m1_values())),
      REPRODUCED, "FMT.E4M3.VALUES",
      note="True of the element values.  V4's main attention reads its own FP8 cache, not the indexer's FP4 K."),
    C("v4-hadamard", ("doc-003 §11.1 L345-353", "doc-002 design trade-offs L8"),
      "The V4 indexer query is rotated (rotate_activation) before its FP4 quantization.", True,
      lambda: I.rotates_index_qk(profile("v4-flash")), REPRODUCED, "HAD.PLACEMENT",
      note="V4 only: V4.1 has no rotation (HAD.ABSENT_V41)."),
    C("v4-main-fp8-rope-bf16", ("doc-003 §10.2 L307", "doc-003 §10.4 L328"),
      "The main KV is FP8 with the RoPE part in BF16.", ("E4M3", 64),
      lambda: (L.V4_MAIN_KV.payload.name, L.V4_MAIN_KV.tail_dims), REPRODUCED, "LAYOUT.V4.MAIN"),
    C("swa-128", ("doc-003 §2.1 L29", "doc-003 §6.2 L199", "doc-003 §9.2 L282"),
      "The sliding window holds 128 uncompressed tokens.", 128,
      lambda: profile("v4-flash").window, REPRODUCED, "BUDGET.WINDOW"),
    C("index-query-shape", ("doc-003 §7.3 L224",), "The indexer query is [64, 128].", (64, 128),
      lambda: (profile("v4-flash").index_n_heads, profile("v4-flash").index_head_dim), REPRODUCED,
      "IDX.SCORE.FORMULA"),
    C("latency-split", ("doc-003 §7.2 L214-219",), "Decode step: indexer ~35%, top-k ~15%, attention ~50%.",
      None, None, NOT_CHECKABLE),
    C("system-gains", ("doc-003 §13 L429-430",), "Attention compute 1/200+ at 1M; FLOPs 10-27% of V3.2; KV "
      "cache 2% of a BF16 design, 7-10% of V3.2.", None, None, NOT_CHECKABLE,
      note="The baselines (V3.2's main cache layout, 'a BF16 design') are not in the reference."),
)

_DOC_NAMED = re.compile(r"[Dd]ocuments? (\d{3}(?:(?:, | and | or )\d{3})*)")


def documents_disputed(rule_id: str) -> set[str]:
    """The source documents a rule's `differs` says are wrong ("Document 003 (§9.2) says …")."""
    differs = RULES[rule_id].differs or ""
    return {f"doc-{n}" for m in _DOC_NAMED.finditer(differs) for n in re.findall(r"\d{3}", m[1])}


def problems() -> list[str]:
    """Every way the ledger disagrees with its own verdicts, its citations or the rules (empty when
    it holds)."""
    out = []
    ids = [c.id for c in CLAIMS]
    if len(set(ids)) != len(ids):
        out.append("duplicate claim ids")
    for c in CLAIMS:
        out += [f"{c.id}: {p}" for cite in c.sources for p in SRC.problems(cite)]
        if not c.documents:
            out.append(f"{c.id}: cites no source document")
        if c.rule is not None and c.rule not in RULES:
            out.append(f"{c.id}: cites unknown rule {c.rule}")
            continue
        if c.verdict == REPRODUCED and (c.compute is None or not c.matches()):
            out.append(f"{c.id}: marked reproduced, but the spec computes {c.computed!r} vs stated {c.stated!r}")
        elif c.verdict == CORRECTED and (c.compute is None or c.rule is None or c.matches()):
            out.append(f"{c.id}: marked corrected, but computes {c.computed!r} vs stated {c.stated!r} "
                       f"(rule {c.rule})")
        elif c.verdict == NOT_CHECKABLE and c.compute is not None:
            out.append(f"{c.id}: marked not checkable but has a computation")
        elif c.verdict not in (REPRODUCED, CORRECTED, NOT_CHECKABLE):
            out.append(f"{c.id}: unknown verdict {c.verdict!r}")
        out += _contradictions(c)
    return out


def _contradictions(c: Claim) -> list[str]:
    """A corrected claim rests on a rule that says its document is wrong; a reproduced one never does."""
    if c.rule is None:
        return []
    disputed = documents_disputed(c.rule) & c.documents
    if c.verdict == CORRECTED and not disputed:
        return [f"{c.id}: marked corrected, but {c.rule} says nothing against {', '.join(sorted(c.documents))}"]
    if c.verdict == REPRODUCED and disputed:
        return [f"{c.id}: marked reproduced, but {c.rule} says {', '.join(sorted(disputed))} is wrong"]
    return []


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
    return [{"id": c.id, "source": "; ".join(c.sources), "claim": c.claim, "stated": _plain(c.stated),
             "computed": _plain(c.computed), "verdict": c.verdict, "rule": c.rule, "note": c.note}
            for c in CLAIMS]
