"""RoPE per layer (ROPE.*): which frequencies a layer uses, which dimensions it rotates and how,
and at which positions.

The official code builds one table per attention layer (`precompute_freqs_cis`, V4-model
L475-481 and its definition; V4.1 upstream L680-696) and uses it for everything that layer
rotates: the main q, the window KV, the compressed KV and the indexer's q and k.

    f_i = θ^(-2i/d),  i = 0 .. d/2 − 1,  d = rope_dim = 64
    θ = compress_rope_theta = 160000 with YaRN  when the layer's compress ratio is > 0
    θ = rope_theta = 10000, no YaRN             when the ratio is 0 (window-only layers)

YaRN (original_seq_len L = 65536, factor 16, beta_fast 32, beta_slow 1) blends each frequency
towards f_i / factor with a linear ramp over the dimension index:

    c(r)  = d · ln(L / (2π r)) / (2 ln θ)                      the dim index completing r turns over L
    low   = max(floor(c(beta_fast)), 0),  high = min(ceil(c(beta_slow)), d − 1)
    ramp_i = clamp((i − low) / (high − low), 0, 1)             (high − low replaced by 0.001 if 0)
    f_i ← f_i / factor · ramp_i + f_i · (1 − ramp_i)

For θ = 160000 that is low = 15, high = 25: dims 0-15 keep f_i, dims 25-31 get f_i / 16.

The rotation treats the LAST d channels of a head as d/2 complex numbers of CONSECUTIVE pairs
(x[2i] real, x[2i+1] imaginary: `view_as_complex(x.unflatten(-1, (-1, 2)))`) and multiplies pair i
by e^(i·p·f_i) in fp32 (complex64), writing the result back in the tensor's BF16.  The angle is
fl32(p · f_i): the table is `outer(arange(seqlen), freqs)` in fp32.

Positions: the query of token t at t (start_pos + t); compressed entry j at j·ratio, the first
token of its group (prefill `freqs_cis[:cutoff:ratio]`, decode `freqs_cis[start_pos + 1 − ratio]`).

Exactness: the frequency table is defined here in float64 (the math above); the official fp32
computation differs from it by a few fp32 ulps, hence the stated tolerance of ROPE.YARN.  The
rotation is defined on the fp32 table a target uses (its own, teacher-forced): the exact rotation
of BF16 inputs by the fp32 angle, rounded once to BF16, within the fp32 error of cos, sin and the
complex product (ROPE.ROUNDING).  The correction range uses math.log; its floor and ceiling are
15.45 → 15 and 24.71 → 25, far from any integer, so no machine can disagree on them.
"""
from __future__ import annotations

import math

import numpy as np

from .indexer import bf16_quantum, round_bf16
from .models import Model
from .rules import INFORMATIVE, V4_ALL, knob, rule

SOURCE_V4 = "V4-model L475-481 (Attention: compress_rope_theta with YaRN iff the layer compresses)"
SOURCE_V41 = "V41-model L680-696 (the same, per layer)"
SOURCE_TABLE = "V4-model L199-229 (precompute_freqs_cis; YaRN L205-224, fp32 table L220-228)"
SOURCE_APPLY = "V4-model L232-244 (apply_rotary_emb: consecutive pairs as complex64, copied back)"
SOURCE_CONFIG = "V41-config (compress_rope_theta 160000, rope_theta 10000, original_seq_len 65536, rope_factor 16)"
SOURCE_BETA = "V4-model L66-72 (ModelArgs: beta_fast 32, beta_slow 1, not overridden)"
READING = "V41-model L368-389 (precompute_freqs_cis; the YaRN ramp L382-386)"

USES = ("q", "window_kv", "compressed_kv", "index_q", "index_k")
FREQ_RTOL = 2.0 ** -20          # the fp32 table against the float64 math (16 fp32 ulps)
YARN_RTOL = 2.0 ** -14          # the YaRN factor read from the target's own table (see yarn_factors)


def layer_rope(model: Model, layer: int) -> tuple[float, bool]:
    """(θ, YaRN on?) of one layer: compress_rope_theta with YaRN iff its compress ratio is > 0."""
    if model.rope is None:
        raise ValueError(f"{model.name}: its RoPE is outside these rules; expected a V4 or V4.1 model")
    if not 0 <= layer < len(model.compress_ratios):
        raise ValueError(f"{model.name} has layers 0..{len(model.compress_ratios) - 1}, got layer {layer}")
    if model.ratio(layer) > 0:
        return model.rope.compress_theta, True
    return model.rope.theta, False


def correction_range(model: Model, theta: float) -> tuple[int, int]:
    """(low, high): the dims between which YaRN's ramp runs, for base θ."""
    rope, d = model.rope, model.rope_dim

    def turns_dim(rotations: float) -> float:
        return d * math.log(rope.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    return max(math.floor(turns_dim(rope.beta_fast)), 0), min(math.ceil(turns_dim(rope.beta_slow)), d - 1)


def ramp(model: Model, theta: float) -> np.ndarray:
    """YaRN's ramp over the d/2 frequency indices: 0 keeps f_i, 1 divides it by the factor."""
    low, high = correction_range(model, theta)
    width = high - low if high != low else 0.001
    return np.clip((np.arange(model.rope_dim // 2) - low) / width, 0.0, 1.0)


def yarn_factor(model: Model, theta: float) -> np.ndarray:
    """The multiplier YaRN applies to each f_i: ramp/factor + (1 − ramp)."""
    r = ramp(model, theta)
    return r / model.rope.factor + (1.0 - r)


def frequencies(model: Model, layer: int) -> np.ndarray:
    """The exact frequencies f_i of a layer (float64)."""
    theta, yarn = layer_rope(model, layer)
    f = theta ** (-np.arange(0, model.rope_dim, 2, dtype=np.float64) / model.rope_dim)
    return f * yarn_factor(model, theta) if yarn else f


def frequencies_fp32(model: Model, layer: int) -> np.ndarray:
    """The official fp32 computation, step by step (1/θ^(2i/d), then the blend), as float32.

    numpy's float32 power is the platform's; it stays within FREQ_RTOL of `frequencies`."""
    theta, yarn = layer_rope(model, layer)
    f32 = np.float32
    exponent = np.arange(0, model.rope_dim, 2, dtype=f32) / f32(model.rope_dim)
    freqs = f32(1.0) / np.power(f32(theta), exponent)
    if yarn:
        smooth = f32(1.0) - ramp(model, theta).astype(f32)
        freqs = freqs / f32(model.rope.factor) * (f32(1.0) - smooth) + freqs * smooth
    return freqs.astype(f32)


def yarn_factors_of(freqs) -> tuple[float, np.ndarray]:
    """(θ, YaRN multipliers) read back from a frequency table: θ = f_1^(-d/2), g_i = f_i / f_1^i.

    Dim 1 lies below every correction range, so f_1 = θ^(-2/d) whatever YaRN does; an error ε in
    f_1 becomes i·ε ≤ 31 · 2^-20 < 2^-15 in f_1^i, inside YARN_RTOL."""
    f = np.asarray(freqs, dtype=np.float64)
    d = 2 * f.size
    return float(f[1] ** (-d / 2)), f / f[1] ** np.arange(f.size)


# ------------------------------------------------------------------------------------------------
# the rotation
# ------------------------------------------------------------------------------------------------
def angles(positions, freqs) -> np.ndarray:
    """fl32(fl32(p) · f_i) [T, d/2], as outer(arange, freqs) forms it."""
    p = np.asarray(positions, dtype=np.float32)
    return (p[:, None] * np.asarray(freqs, dtype=np.float32)[None, :]).astype(np.float64)


def _broadcast(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A per-(token, pair) array [T, d/2] broadcast over the head axes of x [T, ..., D]."""
    return values.reshape(values.shape[0], *([1] * (x.ndim - 2)), values.shape[1])


def rotate_exact(x, positions, freqs) -> np.ndarray:
    """The exact rotation (float64, before any rounding) of the last 2·len(freqs) channels."""
    theta = angles(positions, freqs)
    return _turned(x, np.cos(theta), np.sin(theta))


def _turned(x, cos, sin, step=None) -> np.ndarray:
    """The last d channels of x, as d/2 complex pairs, times cos + i·sin [T, d/2]: exact, or each
    product and the sum rounded by `step`."""
    x = np.asarray(x, dtype=np.float64)
    step = step or (lambda v: v)
    cos, sin = _broadcast(x, cos), _broadcast(x, sin)
    rd = 2 * cos.shape[-1]
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    out = x.copy()
    out[..., -rd::2] = step(step(a * cos) - step(b * sin))
    out[..., -rd + 1::2] = step(step(a * sin) + step(b * cos))
    return out


def rotate(x, positions, freqs) -> np.ndarray:
    """bf16 of the exact rotation: x [T, ..., D] BF16 values, positions [T], freqs [d/2] fp32."""
    return round_bf16(rotate_exact(x, positions, freqs))


# δ per unit of |a| + |b|, by the table's precision (the knob rope_table): fp32 2^-21; a BF16 cos/sin
# table adds 2^-8 for the rounded cos and sin and 2^-8 for products and sum taken in BF16
TABLE_ERROR = {"fp32": 2.0 ** -21, "bf16": 2.0 ** -7 + 2.0 ** -21}


def rotate_error(x, freqs, table: str = "fp32") -> np.ndarray:
    """δ: the error of the complex product before the BF16 rounding, per element.

    fp32 table: cos and sin in fp32 within 2^-23 each, two products and a sum each rounded (2^-24
    relative): |error| ≤ (|a| + |b|) · 2^-21 generously.  bf16 table (rope_table=bf16): cos and sin
    each within 2^-8 of themselves, the products and the sum perhaps BF16 too: 2^-7 · (|a| + |b|)
    more.  Zero outside the rotated slice."""
    x = np.asarray(x, dtype=np.float64)
    rd = 2 * np.asarray(freqs).size
    out = np.zeros_like(x)
    pair = np.abs(x[..., -rd::2]) + np.abs(x[..., -rd + 1::2])
    out[..., -rd::2] = out[..., -rd + 1::2] = pair * TABLE_ERROR[table]
    return out


def rotate_tolerance(x, positions, freqs, table: str = "fp32") -> np.ndarray:
    """|target − exact rotation| allowed: one BF16 ulp of (|exact| + δ), plus δ."""
    return _ulp_and(rotate_exact(x, positions, freqs), rotate_error(x, freqs, table))


def _ulp_and(value, delta) -> np.ndarray:
    return bf16_quantum(np.abs(value) + delta) + delta


def determined(x, positions, freqs, table: str = "fp32") -> np.ndarray:
    """Elements whose BF16 rotation is the same for every error within δ (no midpoint within
    δ of the exact value): on these every conforming target gives `rotate` bit for bit."""
    exact = rotate_exact(x, positions, freqs)
    delta = rotate_error(x, freqs, table)
    return (round_bf16(exact - delta) == round_bf16(exact + delta))


# ------------------------------------------------------------------------------------------------
# a BF16 cos/sin table (rope_table=bf16), told from the official fp32 one
# ------------------------------------------------------------------------------------------------
# A port's fp32 cos and sin of the fp32 angle are taken within 2^-18 of the exact ones, relative (64
# fp32 ulps), when asking which BF16 value its table holds.
TABLE_SETTLED = 2.0 ** -18


def bf16_table(positions, freqs) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [T, d/2] of the fp32 angles fl32(p·f_i), each rounded to BF16 (rope_table=bf16)
    where the official table is complex64, torch.polar of the fp32 angles (V4-model L227-228)."""
    theta = angles(positions, freqs)
    return round_bf16(np.cos(theta)), round_bf16(np.sin(theta))


def bf16_table_settled(positions, freqs) -> np.ndarray:
    """[T, d/2]: the pairs whose BF16 cos and sin are the same from any fp32 cos and sin within
    TABLE_SETTLED of the exact ones."""
    theta = angles(positions, freqs)
    return np.logical_and(*(round_bf16(v * (1 - TABLE_SETTLED)) == round_bf16(v * (1 + TABLE_SETTLED))
                            for v in (np.cos(theta), np.sin(theta))))


def rotate_by_bf16_table(x, positions, freqs) -> np.ndarray:
    """The exact rotation (float64) of x by bf16_table's cos and sin."""
    return _turned(x, *bf16_table(positions, freqs))


def bf16_table_admits(got, x, positions, freqs) -> np.ndarray:
    """Whether each element of `got` is x rotated by bf16_table as a port does it: the products
    and sum in fp32 (apply_rotary_emb's own arithmetic), written fp32 or BF16 (within one BF16 ulp
    of (|v| + δ), plus δ, of the exact product v by the BF16 table); or x, the products and the sum
    each in BF16 (a BF16 tensor times a BF16 table), bit for bit."""
    by_table = rotate_by_bf16_table(x, positions, freqs)
    got = np.asarray(got, dtype=np.float64)
    in_fp32 = np.abs(got - by_table) <= _ulp_and(by_table, rotate_error(x, freqs))
    return in_fp32 | (got == _in_bf16(x, positions, freqs))


def _in_bf16(x, positions, freqs) -> np.ndarray:
    """BF16 x times bf16_table, each product and the sum rounded to BF16."""
    return _turned(round_bf16(x), *bf16_table(positions, freqs), step=round_bf16)


def bf16_table_shows(x, positions, freqs) -> np.ndarray:
    """The rotated elements of x on which no value is both the fp32 table's (rotate_tolerance) and
    a BF16 table's (bf16_table_admits): there a port's table precision is seen, and its reading
    named.  Only where the BF16 table is settled (bf16_table_settled)."""
    shows = np.zeros(np.shape(x), dtype=bool)
    rd = 2 * np.asarray(freqs).size
    if rd == 0:
        return shows
    exact, tol = rotate_exact(x, positions, freqs), rotate_tolerance(x, positions, freqs)
    by_table = rotate_by_bf16_table(x, positions, freqs)
    apart = np.abs(by_table - exact) > tol + _ulp_and(by_table, rotate_error(x, freqs))
    apart &= np.abs(_in_bf16(x, positions, freqs) - exact) > tol
    settled = np.repeat(_broadcast(exact, bf16_table_settled(positions, freqs)), 2, axis=-1)
    shows[..., -rd:] = apart[..., -rd:] & settled
    return shows


def compressed_positions(count: int, ratio: int, start_pos: int = 0) -> np.ndarray:
    """The RoPE positions of compressed entries: j·ratio in prefill; start_pos + 1 − ratio for the
    one entry a decode step at start_pos completes."""
    if start_pos == 0:
        return np.arange(count, dtype=np.int64) * ratio
    return np.full(count, start_pos + 1 - ratio, dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# rules
# ------------------------------------------------------------------------------------------------
rule("ROPE.THETA", "Base 160000 on layers with a compress ratio, 10000 on window-only layers",
     """The frequencies of a layer are f_i = θ^(-2i/64) (i = 0..31) before YaRN, with θ =
     compress_rope_theta = 160000 when the layer's compress ratio is > 0 (V4 CSA and HCA, V4.1
     ratio-2 and ratio-1 layers, whether they own their KV or not) and θ = rope_theta = 10000 on
     ratio-0 (window-only, MTP/DSpark) layers.  Checked on dims 0-14, which YaRN leaves alone,
     within 2^-20 relative.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=(SOURCE_V4, SOURCE_V41, SOURCE_TABLE, SOURCE_CONFIG, READING),
     tolerance="""2^-20 relative (16 fp32 ulps): the official table is 1/θ^(2i/d) in fp32 (a power
     within 2 ulps, a reciprocal within 0.5) and the YaRN blend in fp32 (under 8 ulps more).""")

rule("ROPE.YARN", "YaRN on compressed layers only: factor 16, ramp from beta_fast 32 to beta_slow 1",
     """On a layer with a compress ratio, f_i is multiplied by ramp_i/16 + (1 − ramp_i) with ramp_i
     = clamp((i − low)/(high − low), 0, 1), low = max(floor(c(32)), 0), high = min(ceil(c(1)), 63),
     c(r) = 64·ln(65536/(2πr))/(2 ln θ): dims 0-15 unchanged, 25-31 divided by 16 for θ = 160000.
     Window-only layers have no YaRN (every multiplier 1).  The multipliers are read from the
     target's own table relative to its own θ (f_i / f_1^i), so a wrong base is reported by
     ROPE.THETA alone.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=(SOURCE_V4, SOURCE_V41, SOURCE_TABLE, SOURCE_CONFIG, SOURCE_BETA, READING),
     tolerance="""2^-14 relative on the multiplier: the table's own 2^-20, amplified at most 31 times
     by f_1^i.""")

rule("ROPE.SHARED", "One table per layer for the main q, the window KV, the compressed KV and the index q/k",
     """Everything a layer rotates uses that layer's single table: the main q, the window KV, the
     compressed KV entries and the indexer's q and k get bit-identical frequencies (and the same
     pairing).  An indexer does not have a RoPE configuration of its own (unlike V3.2's HF indexer,
     whose half-split pairing differs from its main attention's).""",
     applies_to=V4_ALL, policy="exact",
     sources=(SOURCE_V4, SOURCE_V41, "V4-model L493-494 (the attention hands its freqs_cis to its indexer)",
              "V41-model L551, L733-734 (the indexer's q at the attention's table)",
              "V32-model L457-464 (V3.2's indexer: [rope | nope] split)"))

rule("ROPE.PAIRS", "Consecutive pairs (2i, 2i+1) rotate as complex numbers by +p·f_i",
     """Channel 2i is the real and 2i+1 the imaginary part of complex number i of the rotated slice
     (view_as_complex of unflatten(-1, (-1, 2)): interleaved, not the half-split 'NeoX' pairing
     (i, i + 32)), multiplied by e^(+i·p·f_i): y[2i] = x[2i]cos − x[2i+1]sin, y[2i+1] = x[2i]sin +
     x[2i+1]cos.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=(SOURCE_APPLY, "V41-model L392-406 (apply_rotary_emb, the same pairing)"),
     tolerance="""that of ROPE.ROUNDING; on vectors the angle turns to nearly 0 in one channel, the
     declared table's (the knob rope_table)""")

rule("ROPE.SLICE", "Only the last 64 channels rotate",
     """RoPE rotates x[..., −64:] of every head (main q and KV: 448 NoPE + 64 RoPE; indexer q and k:
     64 NoPE + 64 RoPE); every other channel passes bit for bit.  V3.2's indexer layout [rope |
     nope] rotates the first 64 instead.""",
     applies_to=V4_ALL, policy="exact",
     sources=(SOURCE_APPLY, "V4-model L413 (apply_rotary_emb(q[..., -rd:]))",
              "V4-model L367, L499, L504 (kv[..., -rd:], q[..., -rd:])", "V41-model L551, L758, L772",
              "V32-model L457-459 (V3.2 rotates the first 64)"))

knob("rope_table", "fp32",
     {"bf16": "a BF16 cos/sin table: the cosine and sine of p·f_i rounded to BF16 before the product, where "
              "the official table is complex64 (V4-model L226-228, torch.polar of the fp32 angles) and "
              "apply_rotary_emb multiplies in fp32 (V4-model L235, L242)"},
     """The precision of the RoPE table a port multiplies by.  Declared bf16, every rotation (ROPE.ROUNDING,
     ATTN.DEROTATE, the layers' rotated stages) admits the error of cos and sin each within 2^-9 of itself:
     2^-7·(|x[2i]| + |x[2i+1]|) more per element (the rounded cos and sin, and BF16 products).  ROPE.ROUNDING,
     ROPE.PAIRS and CMP.ROPE also rotate pairs that the angle turns to nearly 0 in one channel, where what remains is
     the table's own rounding and no value is both the fp32 table's (ROPE.ROUNDING's interval) and a BF16
     table's (cos and sin rounded to nearest BF16, the products and sum in fp32 within that interval of
     their exact value, or in BF16 bit for bit): there each reads its own table, so a BF16 table
     undeclared FAILs, named "matches rope_table=bf16", and declared must be one.""")

rule("ROPE.ROUNDING", "The angle is fl32(p·f_i); the rotation is fp32, rounded once to BF16",
     """With the fp32 table f the rotation of BF16 values by angle fl32(fl32(p)·f_i) is computed in
     fp32 (complex64) and written back as BF16: the result is BF16-representable and lies within
     one BF16 ulp of (|exact| + δ), plus δ = 2^-21·(|x[2i]| + |x[2i+1]|), of the exact rotation by
     that fp32 angle.  A port multiplying by a BF16 cos/sin table declares rope_table=bf16 (departing
     from V4-model L226-228, L242): δ grows by 2^-7·(|x[2i]| + |x[2i+1]|) (cos and sin each within
     2^-8 of themselves, and the products and sum perhaps in BF16).""",
     applies_to=V4_ALL, policy="tolerance", knob="rope_table",
     sources=(SOURCE_TABLE, SOURCE_APPLY, "V4-model L235, L243 (x.float(), then copied back into the BF16 tensor)"),
     tolerance="""δ bounds the fp32 cos and sin (2^-23 each) and the rounded products and sum of
     the complex multiply; the BF16 write-back adds one ulp of the rounded value.""")

rule("ROPE.POSITIONS", "Tokens at their positions; compressed entry j at j·ratio",
     """The query (main and index) of token t is rotated at its absolute position start_pos + t.
     Compressed entry j (main KV, index K) is rotated at j·ratio, the position of the first token
     of its group (prefill freqs_cis[:cutoff:ratio]; decode start_pos + 1 − ratio), not at j.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=("V4-model L413 (q at freqs_cis[start_pos:end_pos])", "V41-model L541-552",
              "V4-model L363-367 (compressed entry j at j·ratio)", "V41-model L752-758 (the same)"),
     tolerance="that of ROPE.ROUNDING, on the target's own stage inputs")

rule("ROPE.INVERSE", "The attention output is de-rotated with the conjugate",
     """After sparse attention the output's last 64 channels are rotated back by e^(−i·p·f_i) at the
     query's positions (apply_rotary_emb(..., inverse=True)), so the shared K = V latent can stay in
     its rotated form.  Outside the indexer path; stated for completeness.""",
     applies_to=V4_ALL, policy="tolerance", status=INFORMATIVE,
     sources=(SOURCE_APPLY, "V4-model L534 (apply_rotary_emb(o[..., -rd:], freqs_cis, True))",
              "V41-model L781 (the same)"))
