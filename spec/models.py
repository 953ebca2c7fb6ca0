"""Model profiles: the released configuration constants each rule depends on.

Sources: V41-config (V4.1-Flash, rev dba1be0a: every V4.1 field below, kv_source_layers,
index_source_layers, candidate_source_layer, candidate_topk_blocks, candidate_block_size and
window_size included, is a key of that file); for V4 the fields of ModelArgs (V4-model L34-80) with
the values of the released V4-Flash and V4-Pro configs; V32-config for V3.2.  The layer roles are
not config keys: spec.pool derives them as Attention.__init__ and Indexer.__init__ do (V41-model
L653-661, L500-503).  Only constants that some rule or budget reads are kept; each is named once,
here.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Rope:
    """RoPE constants (V4 L475-481 / V4.1 L680-694 with the released config, V41-config): window-only
    layers use `theta` without YaRN; layers with a compress ratio use
    `compress_theta` with YaRN (original_seq_len, factor, beta_fast, beta_slow)."""
    theta: float
    compress_theta: float
    original_seq_len: int
    factor: float
    beta_fast: int
    beta_slow: int


V4_ROPE = Rope(theta=10000.0, compress_theta=160000.0, original_seq_len=65536, factor=16.0,
               beta_fast=32, beta_slow=1)


@dataclass(frozen=True)
class Model:
    name: str
    dim: int
    n_layers: int                      # backbone layers, draft layers excluded
    n_draft: int                       # MTP (V4) or DSpark (V4.1) layers appended to compress_ratios
    n_heads: int
    head_dim: int                      # main attention head dim (K = V shared)
    rope_dim: int
    window: int                        # sliding-window KV length, 0 when absent
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    compress_ratios: tuple[int, ...]   # one per layer, draft layers included; 0 = window only
    norm_eps: float
    hadamard: bool                     # indexer q/k rotated before quantization
    score_dtype: str                   # dtype of every step of the indexer score
    q_lora_rank: int = 0               # width of the q latent qr = q_norm(wq_a(x))
    o_groups: int = 0                  # the output projection wo_a's head groups
    o_lora_rank: int = 0               # wo_a's width per group, wo_b's input o_groups·o_lora_rank
    rope: Rope | None = None           # None: this model's RoPE is outside the rules (V3.2)
    kv_source_layers: tuple[int, ...] = ()
    index_source_layers: tuple[int, ...] = ()
    candidate_source_layer: int = -1
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0

    @property
    def index_weight_scale(self) -> float:
        """softmax_scale · n_heads^-0.5 = index_head_dim^-0.5 · index_n_heads^-0.5."""
        return (self.index_head_dim * self.index_n_heads) ** -0.5

    @property
    def index_weight_scale_exact(self) -> Fraction | None:
        """The weight factor as an exact fraction when it is one (1/64 for V4.1)."""
        product = self.index_head_dim * self.index_n_heads
        root = round(product ** 0.5)
        return Fraction(1, root) if root * root == product else None

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    @property
    def backbone(self) -> range:
        return range(self.n_layers)


V3_2 = Model(
    name="v3.2", dim=7168, n_layers=61, n_draft=0, n_heads=128, head_dim=512, rope_dim=64,
    window=0, index_n_heads=64, index_head_dim=128, index_topk=2048,
    compress_ratios=(1,) * 61, norm_eps=1e-6, hadamard=True, score_dtype="fp32", q_lora_rank=1536,
)

V4_FLASH = Model(
    name="v4-flash", dim=4096, n_layers=43, n_draft=1, n_heads=64, head_dim=512, rope_dim=64,
    window=128, index_n_heads=64, index_head_dim=128, index_topk=512,
    compress_ratios=(0, 0) + (4, 128) * 20 + (4,) + (0,),
    norm_eps=1e-6, hadamard=True, score_dtype="bf16", q_lora_rank=1024, rope=V4_ROPE,
    o_groups=8, o_lora_rank=1024,
)

V4_PRO = Model(
    name="v4-pro", dim=7168, n_layers=61, n_draft=1, n_heads=128, head_dim=512, rope_dim=64,
    window=128, index_n_heads=64, index_head_dim=128, index_topk=1024,
    compress_ratios=(128, 128) + (4, 128) * 29 + (4,) + (0,),
    norm_eps=1e-6, hadamard=True, score_dtype="bf16", q_lora_rank=1536, rope=V4_ROPE,
    o_groups=16, o_lora_rank=1024,
)

V4_1_FLASH = Model(
    name="v4.1-flash", dim=5120, n_layers=40, n_draft=3, n_heads=64, head_dim=512, rope_dim=64,
    window=128, index_n_heads=32, index_head_dim=128, index_topk=512,
    compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0),
    norm_eps=1e-20, hadamard=False, score_dtype="bf16", q_lora_rank=1280, rope=V4_ROPE,
    o_groups=8, o_lora_rank=1024,
    kv_source_layers=(2, 8, 14, 20), index_source_layers=(2, 8, 14, 20, 24, 28, 32, 36),
    candidate_source_layer=20, candidate_topk_blocks=2048, candidate_block_size=8,
)

PROFILES: dict[str, Model] = {m.name: m for m in (V3_2, V4_FLASH, V4_PRO, V4_1_FLASH)}


def profile(name: str) -> Model:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(PROFILES)}") from None
