"""KV-cache entry layouts: every cached vector as bytes.

Sources: V4-model L372, L505-506, V41-model L706-707, L758-761 (the caches and their in-place
quantizers), and the codecs of spec.quant.  The reference code keeps its caches
as BF16 after an in-place quantize-dequantize, so the byte layouts are implied by the quantizers,
not materialized: the byte COUNTS below follow from the formats and are normative; the ORDER of the
fields inside an entry is an engine choice (knob entry_field_order), and this module fixes a
canonical one.

An entry is up to four fields, each a run of elements of one format:

    payload   the quantized values (E4M3 bytes, or E2M1 nibbles two to a byte)
    scales    one scale per block of the payload (E8M0, E4M3 or FP32)
    pad       zero bytes that round the scale run up to its alignment
    tail      dims kept unquantized (V4: the 64 RoPE dims in BF16)

Multi-byte elements (BF16, FP32) are little-endian, as on every GPU these models run on; FP4
nibbles follow FP4.PACK.NIBBLE (even element in the low nibble).  The pad bytes are written as 0
and ignored when reading.  Sizes, derived here from bits and block sizes:

    kind          dims  payload             scales               pad  tail          bytes
    v4_main_kv    512   448 E4M3            7 E8M0 (per 64)      1    64 BF16        584
    fp4_index_k   128   128 E2M1            4 E8M0 (per 32)      0    -               68
    v41_main_kv   512   512 E2M1            32 E4M3 (per 16)     0    -              288
    v41_swa_kv    512   512 E4M3            16 E8M0 (per 32)     0    -              528
    v32_index_k   128   128 E4M3            1 FP32 (per 128)     0    -              132
    v32_mla_kv    576   512 E4M3            4 FP32 (per 128)     0    64 BF16        656

The V4 index K is Hadamard-rotated before it is packed (HAD rules); packing takes the vector to
store.  Paged engines may store a whole page planar (all payloads, then all scales, as DeepGEMM's
index-K pool does); that is a pool layout built from these entries, not another entry layout.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from . import formats as F
from . import quant as Q
from .indexer import round_bf16
from .rules import IMPLEMENTATION_DEFINED, INFORMATIVE, V4, V41, V4_ALL, knob, rule


@dataclass(frozen=True)
class ElementFormat:
    name: str
    sign: int
    exponent: int
    mantissa: int

    @property
    def bits(self) -> int:
        return self.sign + self.exponent + self.mantissa


E2M1 = ElementFormat("E2M1", 1, 2, 1)
E4M3 = ElementFormat("E4M3", 1, 4, 3)
E8M0 = ElementFormat("E8M0", 0, 8, 0)
BF16 = ElementFormat("BF16", 1, 8, 7)
FP32 = ElementFormat("FP32", 1, 8, 23)
BYTE = ElementFormat("pad byte", 0, 0, 8)


@dataclass(frozen=True)
class Field:
    role: str               # payload, scales, pad, tail
    format: ElementFormat
    count: int              # elements

    @property
    def nbytes(self) -> int:
        bits = self.count * self.format.bits
        if bits % 8:
            raise ValueError(f"{self.role}: {self.count} {self.format.name} elements are not whole bytes")
        return bits // 8


@dataclass(frozen=True)
class Layout:
    kind: str
    quantized_dims: int
    payload: ElementFormat
    scale: ElementFormat
    block: int
    tail_dims: int = 0          # BF16 dims after the quantized ones
    scale_align: int = 1        # the scale run is padded to a multiple of this many bytes
    scale_rule: str = "act_quant"   # act_quant, or "scale_floor": FlashMLA's 2^ceil(log2 max(amax/448, 1e-4))

    @property
    def dims(self) -> int:
        return self.quantized_dims + self.tail_dims

    @property
    def fields(self) -> dict[str, Field]:
        scales = Field("scales", self.scale, self.quantized_dims // self.block)
        pad = -scales.nbytes % self.scale_align
        return {"payload": Field("payload", self.payload, self.quantized_dims), "scales": scales,
                "pad": Field("pad", BYTE, pad), "tail": Field("tail", BF16, self.tail_dims)}

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fields.values())

    @property
    def bits_per_value(self) -> Fraction:
        """Storage bits per cached dimension (payload, scales and padding)."""
        return Fraction(8 * self.nbytes, self.dims)


# The engines' V4 main entry stores its 7 UE8M0 scales in 8 bytes (SGLang asserts 448 + 64*2 + 8;
# FlashMLA "MODEL1" uses 584): the scale run is aligned to 8 bytes.
V4_MAIN_KV = Layout("v4_main_kv", 448, E4M3, E8M0, Q.FP8_BLOCKS["v4 main/window KV (448 NoPE dims)"],
                    tail_dims=64, scale_align=8)
FP4_INDEX_K = Layout("fp4_index_k", 128, E2M1, E8M0, Q.FP4_IDX_BLOCK)
V41_MAIN_KV = Layout("v41_main_kv", 512, E2M1, E4M3, Q.FP4_KV_BLOCK)
V41_SWA_KV = Layout("v41_swa_kv", 512, E4M3, E8M0, Q.FP8_BLOCKS["v4.1 SWA KV (512 dims)"])
V32_INDEX_K = Layout("v32_index_k", 128, E4M3, FP32, Q.FP8_BLOCKS["v3.2 indexer Q/K (128 dims)"])
# FlashMLA's V3.2 sparse-decode entry (FP8 NoPE in four tiles of 128, FP32 power-of-two scales).
V32_MLA_KV = Layout("v32_mla_kv", 512, E4M3, FP32, 128, tail_dims=64, scale_rule="scale_floor")
# The variant seen in ports: V4.1 main KV with the RoPE dims kept in BF16, V4-style.
V41_MAIN_KV_BF16_ROPE = Layout("v41_main_kv", 448, E2M1, E4M3, Q.FP4_KV_BLOCK, tail_dims=64, scale_align=8)

LAYOUTS: dict[str, Layout] = {l.kind: l for l in (V4_MAIN_KV, FP4_INDEX_K, V41_MAIN_KV, V41_SWA_KV, V32_INDEX_K,
                                                   V32_MLA_KV)}
KINDS = tuple(LAYOUTS)

# ------------------------------------------------------------------------------------------------
# Knobs and rules
# ------------------------------------------------------------------------------------------------

FIELD_ORDERS = {
    "payload_first": ("payload", "scales", "pad", "tail"),
    "scales_first": ("scales", "pad", "payload", "tail"),
    "payload_tail_scales": ("payload", "tail", "scales", "pad"),
}

knob("entry_field_order", "payload_first", {
    "scales_first": "scales (and their pad) first, then the payload, then the BF16 tail",
    "payload_tail_scales": "payload, then the BF16 tail, then the scales and their pad",
}, "The order of the fields inside one packed KV entry (the reference never materializes it).")

knob("v41_main_rope", "fp4", {
    "bf16": "V4.1 main KV with the 64 RoPE dims kept in BF16 as in V4: 448 dims FP4 (224 B) + 28 "
            "E4M3 scales + 4 pad + 64 BF16 (128 B) = 384 B",
}, "Whether the V4.1 main KV quantizes its RoPE dims with the rest.")

knob("v32_mla_scale_floor", "scale", {
    "amax": "act_quant's floor: amax clamped to 1e-4 before the division by 448 (an all-zero tile "
            "gets 2^-22 instead of 2^-13)",
}, "Where the 1e-4 floor of the V3.2 sparse-decode FP8 KV entry's tile scale applies.")

_NO_PACKING = "V4-model L372, L506 (the reference quantizes its caches in place and keeps them as BF16: no packed entry)"

rule("LAYOUT.V4.MAIN", "V4 main KV entry: 583 bytes of content, stored as 584",
     """A V4 main (CSA, HCA and window) KV entry of 512 dims is 448 NoPE dims as FP8 E4M3 (448 B)
     with one E8M0 scale per 64 (7 B), and the 64 RoPE dims as BF16 (128 B): 583 bytes of
     content.  The 584th byte pads the scales to 8 B; it is an engine convention (SGLang's V4 KV
     pool asserts 448 + 64·2 + 8), not the reference's, which keeps its caches in BF16 after an
     in-place QDQ.  This layout follows the engines, a choice of this suite: 584 bytes.
     Unpacking gives exactly act_quant's dequantization of the NoPE dims and the BF16 value of
     the RoPE dims.  FlashMLA's MODEL1 FP8 sparse cache holds the same 584 bytes per token but is
     not this entry: a page of tokens stores, per token, the 448 E4M3 bytes followed by the 128
     RoPE bytes, and only after all the page's tokens the 8-byte scale groups (7 E8M0 scales, the
     8th byte never written), the page padded to a multiple of 576 B; and its scale is floored at
     1e-4 after the division by 448 (as in LAYOUT.V32.MLA), where act_quant floors amax at 1e-4.""",
     applies_to=V4, policy="bytes", sources=("V4-model L372, L505-506", "V4-model L473-474 (kv_cache [.., head_dim] BF16)",
                                             "SGLang-v4-kv-pool DeepSeekV4SingleKVPool (584 bytes per token, one pad byte)",
                                             "FlashMLA-quant L14, L56-62 (MODEL1: tiles of 64, the page's NoPE+RoPE "
                                             "part, then 8-byte scale groups of which 7 are used)",
                                             "FlashMLA-quant L58 (torch.empty: the 8th byte is not written)",
                                             "FlashMLA-quant L66-67 (scale floor)",
                                             "doc-000 FP4 storage L8", "doc-000 summary L3"))

rule("LAYOUT.V32.MLA", "V3.2 sparse-decode FP8 KV entry: 656 bytes",
     """A V3.2 MLA KV entry as FlashMLA's FP8 sparse decode reads it is 576 dims: the 512 NoPE dims
     as FP8 E4M3 (512 B) in four tiles of 128, then the four tiles' scales as FP32 (16 B, tile
     order, little-endian), then the 64 RoPE dims as BF16 (128 B): 656 bytes, no pad.  A tile's
     scale is, as FlashMLA's own quantizer writes it, the power of two
     s = 2^ceil(log2 max(fl32(amax / 448), 1e-4)): the floor is on the scale, so a tile whose amax
     is below 448·10^-4 gets s = 2^-13; the values are fl32(x / s) encoded E4M3 (round to nearest
     even, saturating).  That scale rule is FlashMLA's quantizer's, not a contract of the decode
     kernel: an engine's writer may floor otherwise (v32_mla_scale_floor), and the decode kernel
     reads each FP32 scale as bf16(scale), exact for every power of two written here but a rounding
     of any other scale.  Unpacking gives exactly the E4M3 value times the scale, and the BF16
     value of the RoPE dims.  The official V3.2-Exp code materializes no such entry: it keeps the
     latent and the RoPE key in BF16 caches; this layout is FlashMLA's convention.""",
     applies_to=("v3.2",), policy="bytes", status=IMPLEMENTATION_DEFINED, knob="v32_mla_scale_floor",
     sources=("V32-model L533-534, L561-562 (kv_cache and pe_cache in the default dtype)",
              "V32-model L906 (the default dtype is BF16)",
              "FlashMLA-api L92-98 (the 656-byte entry: 512 E4M3, 4 FP32 scales, 64 BF16)",
              "FlashMLA-quant L13, L35-53 (V32_FP8Sparse: tiles of 128, amax / 448, the scale floor, "
              "the E4M3 cast)", "FlashMLA-quant L17-18 (scale = 2^ceil(log2 max(v, 1e-4)))",
              "FlashMLA-quant L93-104 (dequantization: value × its tile's FP32 scale)",
              "FlashMLA-decode-fp8 L546-550 (the V32 entry's four FP32 scales loaded; L550: each read as bf16(scale))"))

rule("LAYOUT.INDEX_K", "indexer K entry: 68 bytes",
     """An indexer K entry (V4 and V4.1) of 128 dims is FP4 E2M1 (64 B, two per byte) with one E8M0
     scale per 32 (4 B): 68 bytes, 4.25 bits per dim; unpacking gives exactly the FP4 E8M0/32
     dequantization.""",
     applies_to=V4_ALL, policy="bytes", sources=("V4-model L362-370", "V41-model L541-548",
                                                 "V4-kernel L186-200 (fp4_act_quant: E2M1 pairs, one E8M0 per 32)",
                                                 "doc-000 Q&A 6 L23", "doc-003 §5.2 L183",
                                                 "doc-003 §10.2 L306"),
     differs="""Document 003 (§5.2, §10.2) stores the indexer K's dequantization factor as one FP32
     per token (4 B); that is the V3.2 index K.  The V4/V4.1 index K carries four E8M0 bytes, one
     per 32 dims.""")

rule("LAYOUT.V41.MAIN", "V4.1 main KV entry: 288 bytes, RoPE dims quantized",
     """A V4.1 main (compressed) KV entry of 512 dims, RoPE dims included, is FP4 E2M1 (256 B) with
     one E4M3 scale per 16 (32 B): 288 bytes, 4.5 bits per dim, no global scale; unpacking gives
     exactly the FP4 E4M3/16 dequantization.  The content is fixed by the official code: the whole
     512-dim latent, its RoPE tail rotated first, is quantized to FP4 with E4M3 scales per 16 (the
     RoPE dims are not kept apart as in V4).  Keeping the 64 RoPE dims in BF16 (384 B) is the named
     deviation v41_main_rope=bf16; the field order stays LAYOUT.ORDER's.""",
     applies_to=V41, policy="bytes", knob="v41_main_rope",
     sources=("V41-model L758-760 (RoPE on latent[..., -rope_head_dim:], then fp4_act_quant of the whole latent, "
              "16, E4M3 scales)", "doc-000 FP4 storage L8", "doc-000 Q&A 6 L23"))

rule("LAYOUT.V41.SWA", "V4.1 sliding-window KV entry: 528 bytes",
     """A V4.1 window KV entry of 512 dims (post-RoPE, RoPE dims included) is FP8 E4M3 (512 B) with
     one E8M0 scale per 32 (16 B): 528 bytes; unpacking gives exactly act_quant's dequantization.""",
     applies_to=V41, policy="bytes", sources=("V41-model L706-707 (Attention._window_kv)", "V41-model L27 (fp8_block_size = 32)",
                                              "doc-000 details L10", "doc-000 Q&A 6 L23"))

rule("LAYOUT.V32.INDEX_K", "V3.2 indexer K entry: 132 bytes",
     """A V3.2 indexer K entry of 128 dims is FP8 E4M3 (128 B) with its one power-of-two scale (per
     128) stored as an FP32 (4 B): 132 bytes; unpacking gives exactly the E4M3 value times the
     scale.""",
     applies_to=("v3.2",), policy="bytes", sources=("V32-model L448-449, L467-468",
                                                    "V32-model L469-470 (k_fp8 and k_scale written to the caches)"))

rule("LAYOUT.ORDER", "field order inside an entry",
     """The bytes of a packed entry are its fields in the order of entry_field_order (canonical:
     payload, scales, pad, tail), BF16 and FP32 elements little-endian, FP4 nibbles per
     FP4.PACK.NIBBLE, pad bytes 0.  The official code never materializes an entry, so the order is
     this suite's own choice; engines order their fields otherwise.""",
     applies_to=("v3.2",) + V4_ALL, policy="bytes", status=IMPLEMENTATION_DEFINED,
     knob="entry_field_order", sources=(_NO_PACKING, "V41-model L760-761 (the V4.1 latent is stored dequantized)"))

rule("LAYOUT.UNPACK", "unpacking any valid entry dequantizes its fields",
     """For every byte buffer of the right length whose scales are not NaN, unpacking gives exactly
     the codec's dequantization of its payload and scales (E2M1 or E4M3 value times the scale,
     rounded once to fp32) and the BF16 tail's value; pad bytes are ignored.""",
     applies_to=("v3.2",) + V4_ALL, policy="bytes",
     sources=("V4-kernel L165-172 (the in-place FP4 QDQ: E2M1 value × scale)", "V4-kernel L84-91",
              "V41-kernel-port L106-107, L135-137 (E4M3 or E2M1 value × scale)"))

rule("LAYOUT.REJECT", "malformed entries are rejected",
     """Unpacking a buffer that is not uint8, whose last dimension is not the entry size, or that
     holds a NaN scale (E8M0 byte 0xFF, E4M3 byte 0x7F or 0xFF, an FP32 NaN or Inf) raises an error
     naming what was expected, instead of returning garbage.  A contract of this suite's
     entry_unpack operation, not of the official code, which never packs, unpacks or rejects an
     entry: it is checked for targets that implement entry_unpack, and a failure means their unpacker
     returns garbage on malformed input, not that they depart from the official computation.""",
     applies_to=("v3.2",) + V4_ALL, policy="exact", status=INFORMATIVE, sources=(_NO_PACKING,))


# ------------------------------------------------------------------------------------------------
# Packing
# ------------------------------------------------------------------------------------------------


def layout(kind, v41_main_rope: str = "fp4") -> Layout:
    """The layout of an entry kind under the v41_main_rope knob (a Layout is returned as it is)."""
    if isinstance(kind, Layout):
        return kind
    if kind not in LAYOUTS:
        raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "v41_main_kv" and v41_main_rope == "bf16":
        return V41_MAIN_KV_BF16_ROPE
    return LAYOUTS[kind]


def codec_knobs(fn, variants: dict) -> dict:
    """The codec knobs among `variants` that the spec codec `fn` takes as keyword arguments."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in variants.items() if k in names and names[k].kind is inspect.Parameter.KEYWORD_ONLY}


SCALE_FLOOR = np.float32(1e-4)


def floored_scale_quantize(x, block: int, *, e8m0_rounding="ceil_exact", v32_mla_scale_floor="scale"):
    """x [..., b·k] -> (E4M3 bytes, FP32 scales [..., k]): s = 2^ceil(log2 max(fl32(amax / 448), 1e-4)).

    The floor is on the scale, not on amax as in act_quant: a tile with amax below 448·1e-4 gets
    s = 2^-13."""
    xb = Q.blocks(x, block)
    amax = Q.block_amax(xb)
    if v32_mla_scale_floor == "scale":
        v = np.maximum(amax / np.float32(F.E4M3_MAX), SCALE_FLOOR)
    elif v32_mla_scale_floor == "amax":
        v = np.maximum(amax, SCALE_FLOOR) / np.float32(F.E4M3_MAX)
    else:
        raise ValueError(f"unknown v32_mla_scale_floor {v32_mla_scale_floor!r}")
    exponent = Q.pow2_scale_exponent(v, np.float32(1), 0, e8m0_rounding=e8m0_rounding)
    s = np.ldexp(np.float32(1), exponent).astype(np.float32)
    return Q.unblock(F.e4m3_encode(Q.fp8_ratio(xb, s))), s


def _quantize(lay: Layout, x: np.ndarray, variants: dict):
    if lay.scale_rule == "scale_floor":
        payload, s = floored_scale_quantize(x, lay.block, **codec_knobs(floored_scale_quantize, variants))
        return payload, le_bytes(s.astype("<f4"))
    if lay.payload is E2M1:
        fn = Q.fp4_e4m3_quantize if lay.scale is E4M3 else Q.fp4_e8m0_quantize
        return fn(x, **codec_knobs(fn, variants))
    payload, scales = Q.fp8_quantize(x, lay.block, **codec_knobs(Q.fp8_quantize, variants))
    if lay.scale is FP32:
        scales = le_bytes(F.e8m0_decode(scales).astype("<f4"))
    return payload, scales


def _dequantize(lay: Layout, payload: np.ndarray, scales: np.ndarray, variants: dict) -> np.ndarray:
    if lay.payload is E2M1:
        fn = Q.fp4_e4m3_dequantize if lay.scale is E4M3 else Q.fp4_e8m0_dequantize
        return fn(payload, scales, **codec_knobs(fn, variants))
    if lay.scale is FP32:
        scale = from_le_bytes(scales, "<f4")
        return Q.unblock(Q.blocks(F.e4m3_decode(payload), lay.block) * scale[..., None])
    return Q.fp8_dequantize(payload, scales, lay.block)


def le_bytes(a: np.ndarray) -> np.ndarray:
    """The little-endian bytes of the elements of a: [..., n] -> uint8 [..., n·itemsize]."""
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return a.view(np.uint8).reshape(*a.shape[:-1], a.shape[-1] * a.itemsize)


def from_le_bytes(b: np.ndarray, dtype: str) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    return b.view(np.dtype(dtype)).reshape(*b.shape[:-1], -1)


def bf16_tail_bytes(x: np.ndarray) -> np.ndarray:
    return le_bytes(F.bf16_bits(x).astype("<u2"))


def bf16_tail_values(b: np.ndarray) -> np.ndarray:
    return F.f32_from_bits(from_le_bytes(b, "<u2").astype(np.int64) << 16)


def encode_fields(kind, x, variants: dict | None = None) -> dict[str, np.ndarray]:
    """The bytes of each field of the entries of x [..., dims] (float32)."""
    variants = variants or {}
    lay = layout(kind, variants.get("v41_main_rope", "fp4"))
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] != lay.dims:
        raise ValueError(f"{lay.kind}: an entry has {lay.dims} dims, got last dimension {x.shape[-1]}")
    payload, scales = _quantize(lay, x[..., :lay.quantized_dims], variants)
    batch = x.shape[:-1]
    return {"payload": payload, "scales": scales,
            "pad": np.zeros((*batch, lay.fields["pad"].nbytes), np.uint8),
            "tail": bf16_tail_bytes(x[..., lay.quantized_dims:])}


def join(kind, fields: dict[str, np.ndarray], variants: dict | None = None) -> np.ndarray:
    """Fields -> packed entries uint8 [..., nbytes], in the order of entry_field_order."""
    order = FIELD_ORDERS[(variants or {}).get("entry_field_order", "payload_first")]
    return np.concatenate([fields[name] for name in order], axis=-1)


def split(kind, data, variants: dict | None = None) -> dict[str, np.ndarray]:
    """Packed entries uint8 [..., nbytes] -> the bytes of each field."""
    variants = variants or {}
    lay = layout(kind, variants.get("v41_main_rope", "fp4"))
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise TypeError(f"{lay.kind}: packed entries must be uint8, got {data.dtype}")
    if data.ndim == 0 or data.shape[-1] != lay.nbytes:
        raise ValueError(f"{lay.kind}: a packed entry is {lay.nbytes} bytes, got last dimension "
                         f"{data.shape[-1] if data.ndim else 'none (a scalar)'}")
    out, start = {}, 0
    for name in FIELD_ORDERS[variants.get("entry_field_order", "payload_first")]:
        n = lay.fields[name].nbytes
        out[name], start = data[..., start:start + n], start + n
    return out


def nan_scales(lay: Layout, scales: np.ndarray) -> np.ndarray:
    """Which scale elements are NaN (or, for FP32, NaN or Inf)."""
    if lay.scale is E8M0:
        return scales == F.E8M0_NAN_CODE
    if lay.scale is E4M3:
        return (scales & 0x7F) == F.E4M3_NAN_CODE
    return ~np.isfinite(from_le_bytes(scales, "<f4"))


def pack(kind, x, variants: dict | None = None) -> np.ndarray:
    """x [..., dims] float32 -> packed entries uint8 [..., nbytes]."""
    return join(kind, encode_fields(kind, x, variants), variants)


def unpack(kind, data, variants: dict | None = None) -> np.ndarray:
    """Packed entries uint8 [..., nbytes] -> the dequantized float32 entries [..., dims].

    kind is an entry kind or a Layout (every function here takes either)."""
    variants = variants or {}
    lay = layout(kind, variants.get("v41_main_rope", "fp4"))
    f = split(kind, data, variants)
    bad = nan_scales(lay, f["scales"])
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{lay.kind}: scale {where} is NaN; a {lay.scale.name} scale must be a number")
    values = _dequantize(lay, f["payload"], f["scales"], variants)
    return np.concatenate([values, bf16_tail_values(f["tail"])], axis=-1).astype(np.float32)


def qdq(kind, x, variants: dict | None = None) -> np.ndarray:
    """What a round trip through the cache gives: unpack(pack(x))."""
    return unpack(kind, pack(kind, x, variants), variants)


# ------------------------------------------------------------------------------------------------
# FlashMLA's paged caches (the forms sparse_attention_cache takes besides the entries themselves)
# ------------------------------------------------------------------------------------------------
PAGE = 64                   # entries a page (FlashMLA's page_block_size: any; the suite draws 64)
PAGE_ALIGN = {"v4_main_kv": 576, "v32_mla_kv": 1, "v32_index_k": 1}
CACHE_VALUE_DIMS = 512      # the values: V4's whole entry, V3.2's NoPE dims (FlashMLA's head_dim_v)
CACHE_FORMS = ("v4_main_kv", "v32_mla_kv", "v4_main_kv/flashmla_paged", "v32_mla_kv/flashmla_paged")
# V3.2's indexer K cache as index_scores_fp8_cache takes it: the entries, or DeepGEMM's pages (a page's
# E4M3 codes, then its fp32 scales: DeepGEMM tests/test_attention.py kv_cache_cast_to_fp8)
INDEX_CACHE_FORMS = ("v32_index_k", "v32_index_k/deepgemm_paged")


def cache_form(form: str) -> tuple[str, bool]:
    """(entry kind, paged) of a cache form of sparse_attention_cache or index_scores_fp8_cache."""
    if form not in CACHE_FORMS + INDEX_CACHE_FORMS:
        raise ValueError(f"unknown cache form {form!r}; expected one of {', '.join(CACHE_FORMS + INDEX_CACHE_FORMS)}")
    return form.split("/")[0], form.endswith("_paged")


def page_bytes(kind) -> int:
    """The bytes of one page of PAGE entries, padded as FlashMLA pads it."""
    align = PAGE_ALIGN[layout(kind).kind]
    return -(-PAGE * layout(kind).nbytes // align) * align


def _page_parts(kind) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fields each entry keeps in the page's first run, and those in its second run.  MODEL1
    (v4_main_kv): each entry's NoPE and RoPE bytes, then, after the page's entries, each one's 8-byte
    scale group (7 E8M0 and the pad byte, never written); V3.2 (v32_mla_kv): whole entries."""
    if layout(kind).kind == "v4_main_kv":
        return ("payload", "tail"), ("scales", "pad")
    if layout(kind).kind == "v32_index_k":
        return ("payload",), ("scales", "pad")
    return FIELD_ORDERS["payload_first"], ()


def with_pad(kind, entries, value: int) -> np.ndarray:
    """The entries with their pad bytes (which no reader may use) set to `value`."""
    f = split(kind, np.asarray(entries, np.uint8))
    f["pad"] = np.full_like(f["pad"], value)
    return join(kind, f)


def to_pages(kind, entries, unwritten: int = 0) -> np.ndarray:
    """Entries uint8 [N, nbytes] (N a multiple of PAGE) -> FlashMLA's pages uint8 [N/PAGE, page_bytes];
    the bytes no entry writes (the pad byte, the page's padding) hold `unwritten`."""
    entries = np.asarray(entries, np.uint8)
    if entries.ndim != 2 or entries.shape[0] % PAGE:
        raise ValueError(f"to_pages: entries [N, nbytes] with N a multiple of {PAGE}, got {entries.shape}")
    f = split(kind, with_pad(kind, entries, unwritten))
    first, second = _page_parts(kind)
    runs = [np.concatenate([f[n] for n in part], -1).reshape(-1, PAGE * sum(f[n].shape[-1] for n in part))
            for part in (first, second) if part]
    body = np.concatenate(runs, -1)
    pad = np.full((body.shape[0], page_bytes(kind) - body.shape[1]), unwritten, np.uint8)
    return np.concatenate([body, pad], -1)


def from_pages(kind, pages) -> np.ndarray:
    """FlashMLA's pages uint8 [P, page_bytes] -> the entries uint8 [P·PAGE, nbytes] (the inverse of to_pages)."""
    lay, pages = layout(kind), np.asarray(pages, np.uint8)
    if pages.ndim != 2 or pages.shape[1] != page_bytes(kind):
        raise ValueError(f"from_pages: pages [P, {page_bytes(kind)}] for {lay.kind}, got {pages.shape}")
    fields, start = {}, 0
    for part in filter(None, _page_parts(kind)):
        width = sum(lay.fields[n].nbytes for n in part)
        run = pages[:, start:start + PAGE * width].reshape(-1, width)
        start += PAGE * width
        at = 0
        for n in part:
            fields[n], at = run[:, at:at + lay.fields[n].nbytes], at + lay.fields[n].nbytes
    return join(kind, fields)


def as_cache(form: str, entries, unwritten: int = 0xFF) -> np.ndarray:
    """Entries [N, nbytes] as a cache of `form` (pages: N a multiple of PAGE), every byte no entry
    writes holding `unwritten` (0xFF: a NaN scale, were it read as one)."""
    kind, paged = cache_form(form)
    return to_pages(kind, entries, unwritten) if paged else with_pad(kind, entries, unwritten)


def cache_entries(form: str, cache) -> np.ndarray:
    """The entries [N, nbytes] a cache of `form` holds."""
    kind, paged = cache_form(form)
    return from_pages(kind, cache) if paged else np.asarray(cache, np.uint8)


def cache_values(form: str, cache) -> np.ndarray:
    """The attention's K (and V: its first 512 dims) of a cache: each entry unpacked, in BF16, as the
    reference keeps its caches after the in-place QDQ (V4-model L505-506)."""
    return round_bf16(unpack(cache_form(form)[0], cache_entries(form, cache)))
