"""The KV compressor: how m consecutive tokens become one compressed KV (or index-K) entry.

Sources: V4-model L279-377 (V4 `Compressor`) and V41-model L429-485 (V4.1 `Compressor`).  The same compressor produces the main compressed KV (head_dim 512) and, in
V4, the indexer's compressed K (head_dim 128, followed by the Hadamard and FP4 rules of other
families); the rules below do not depend on the head dimension.

One entry j of a ratio-m compressor, for a sequence x[0..n) of fp32 activations (the official code
casts x to fp32 and keeps wkv, wgate and ape in fp32):

    kv_t    = wkv · x_t                                   [coff·d]
    score_t = wgate · x_t + ape[t mod m]                  [coff·d]   (ape: V4 only)
    window  = tokens j·m .. j·m+m-1                       (V4 ratio 4 also: the m tokens before)
    p       = softmax over the window's slots, per channel
    pooled  = sum over slots of p · kv                    [d]
    entry_j = RoPE(RMSNorm(pooled), position j·m)

coff = 2 when the windows overlap (V4 ratio 4), else 1.  V4.1 ratio 1 has no gate: entry_t =
RMSNorm(wkv · x_t).  A group that is not complete emits nothing; its tokens wait in the
compressor state (kv_state / score_state) until the group completes.

RoPE here is the plain rotation of adjacent pairs by angle position·f_i with a given frequency
vector f (the last rope_dim = 2·len(f) channels are rotated).  The released models build f with
compress_rope_theta = 160000 and YaRN (factor 16, original_seq_len 65536, V41-config): YaRN changes
only the frequency vector, never the position rule, so it enters as a different `rope_freqs`.
The official V4.1 compressor returns the pre-RoPE latent and the attention then applies RoPE at
the same position j·m; a pre-RoPE entry is the entry with all frequencies 0.

The reference below computes in float64 from the fp32 inputs.  The official code computes in fp32
with summation orders that depend on the GEMM shapes, so entries are compared within
`entry_tolerance`, a first-order bound on fp32 rounding derived in that function.
"""
from __future__ import annotations

import numpy as np

from .models import profile
from .rules import V4, V41, V4_ALL, knob, rule, shared_tolerance

V4_CODE = "V4-model L279-377 (Compressor; prefill L325-342, decode L343-359)"
V41_CODE = "V41-model L429-485 (Compressor)"
SOURCES_V4 = (V4_CODE, "V4-model L196, L362, L367 (BF16: RMSNorm's output, the pooled vector's cast, "
              "the in-place rotation)")
SOURCES_V41 = (V41_CODE, "V41-model L485, L758 (BF16: norm(kv.to(dtype)); the rotation in place)")

# The tolerance.  u = 2^-24 is the fp32 unit roundoff.  A dot product of length k computed in fp32
# in any order is within k·u·sum|terms| of the exact value; the bound follows one entry through the
# projection (length dim), the softmax and the slot sum (2m slots), RMSNorm and the rotation, and
# is doubled for safety.  It is relative to magnitudes before cancellation, so cancellation in the
# projections or the pooled sum widens it honestly instead of failing good targets.  At every ratio
# the official entry is also rounded to BF16 three times (V4-model L196, L362, L367): the pooled
# vector (`norm(kv.to(dtype))`; at ratio 1 the BF16 Linear's output), RMSNorm's output, and the
# rotated entry; each rounding moves a value v by at most b·|v|, b = 2^-8.
U32 = 2.0 ** -24
U16 = 2.0 ** -8          # unit roundoff of BF16 (8 significant bits): |bf16(v) − v| ≤ 2^-8·|v|

ENTRY_TOLERANCE = shared_tolerance("entry_tolerance", """\
entry_tolerance, per element: twice the first-order bound of fp32 rounding through
the pipeline plus the three official BF16 roundings, at every ratio (u = 2^-24, b = 2^-8).  Pooled
vector p: e₃₂ = (dim + 2m + 4)·u·P + δw·P, with P = max over the window's slots of Σ_k |x_k||W_ck|
(the softmax weights sum to 1, so |p| ≤ P) and δw = 2·(dim + 2)·u·max|score| + 8m·u the relative
move of a softmax weight (ratio 1: e₃₂ = (dim + 2)·u·P, the Linear), then e_p = e₃₂ + b·(|p| + e₃₂)
for the cast of the computed pooled vector to BF16.  RMSNorm: the pooled error e_p carried through
y = w·p/r as w·(e_p + |p|·rms(e_p)/r)/r, plus (d + 8)·u·|y| for fp32 and b·|y| for the BF16 output.
RoPE: a pair keeps its error through the rotation (twice the larger component's), plus
(2u·|angle| + 8u)·|pair| for the fp32 angle, sine and cosine, and b·|pair| for the BF16 entry.  The
BF16 terms are what the official code adds: without them a faithful port exceeds the bound (measured
up to 122× at ratio 4, 8.5× at 128, 465× at ratio 2); with them its worst is 0.34 of it.  A
compressor that skips the gate, the norm or the APE moves entries by a fraction of their size and
exceeds it by 3× to 15× at the least, 66× to 252× in the median (tests/test_compressor.py).""")

DIRECTION_TOLERANCE = shared_tolerance("entry direction", """The entry's direction (rope off, norm weight 1,
scaled to unit RMS) within 2·entry_tolerance / rms(reference entry): """ + ENTRY_TOLERANCE)
TWICE_ENTRY_TOLERANCE = shared_tolerance("twice entry_tolerance", "Twice " + ENTRY_TOLERANCE)

rule("CMP.GROUPS", "one entry per complete group of m tokens",
     """A ratio-m compressor fed n tokens from position 0 has emitted exactly n // m entries; entry
     j pools tokens j·m .. j·m+m-1 (plus, for V4 ratio 4, the m tokens before them).  An
     incomplete group emits nothing: its tokens wait in the compressor state.""",
     applies_to=V4_ALL, policy="exact", sources=SOURCES_V4 + SOURCES_V41 + ("doc-003 §2.1 L27",))

rule("CMP.CAUSAL", "entries never depend on later tokens",
     """Entry j depends only on tokens at positions < (j+1)·m: changing or appending later tokens
     leaves every entry already emitted unchanged.""",
     applies_to=V4_ALL, policy="tolerance", sources=SOURCES_V4 + SOURCES_V41,
     tolerance=TWICE_ENTRY_TOLERANCE + "  (Both sides are the target's own entries.)")

rule("CMP.OVERLAP", "V4 ratio 4: overlapping 8-token windows",
     """With ratio 4 (V4 only) wkv and wgate project to 2·d channels.  Entry j pools an 8-slot
     window: slots 0-3 are group j-1's tokens through the FIRST d channels, slots 4-7 are group
     j's tokens through the SECOND d channels.  Group 0 has no previous group: its slots 0-3 hold
     kv = 0 and score = -inf, so they get weight 0.""",
     applies_to=V4, policy="tolerance",
     sources=SOURCES_V4 + ("doc-003 §2.1 L27", "doc-003 §4 stage 1 L98-102"),
     tolerance=DIRECTION_TOLERANCE)

rule("CMP.APE", "V4 additive positional bias on the gate scores",
     """In V4 the gate score of the token at position t is wgate·x_t + ape[t mod m] (ape is
     [m, coff·d], fp32), added before the window is formed, so a token keeps the bias row of its
     own position in its group in both halves of an overlapping window.  Both V4 compressors
     (ratio 4 and ratio 128) carry an ape; V4.1's (ratios 1 and 2) has none.  Of the source
     documents only document 003 describes the bias, for V4's ratio-4 compressor.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=SOURCES_V4 + SOURCES_V41 + ("V4-model L294 (ape)", "doc-003 §4 stage 1 L100"),
     tolerance=DIRECTION_TOLERANCE)

BF16_POOLING = """the projections kv and score, the softmax weights and their products with kv each
rounded to BF16 (2^-8 of each; a score's rounding moves its weight by 2·2^-8·|s|), the sum over the slots
accumulated in fp32 and rounded once (as torch reduces BF16): (2·2^-8·max|s| + 4·2^-8)·max_s|kv_s| more
on the pooled vector"""

knob("compressor_pooling", "fp32",
     {"bf16": "the gate's softmax and the pooled sum over the slots in BF16 (a port keeping the compressor's "
              "activations BF16), where the official compressor casts x to fp32 first (V4-model L321-322, "
              "pooling L342, L352, L359)"},
     """The precision of the compressor's pooling.  Declared bf16, every entry rule admits """ + BF16_POOLING + ".")

rule("CMP.GATE", "per-channel softmax over the window",
     """The pooled vector is sum over the window's slots of softmax(score)·kv, the softmax taken
     over the slots separately for every channel (4 or 8 slots for V4 ratio 4, 128 for V4 ratio
     128, 2 for V4.1 ratio 2), computed in fp32.  A port pooling in BF16 declares
     compressor_pooling=bf16 (departing from V4-model L321-322, L342).""",
     applies_to=V4_ALL, policy="tolerance", knob="compressor_pooling", sources=SOURCES_V4 + SOURCES_V41 + ("doc-003 §4 stage 1 L100",),
     tolerance=DIRECTION_TOLERANCE)

rule("CMP.RATIO1", "V4.1 ratio 1: a normalized projection",
     """At ratio 1 (V4.1 decoder layers) there is no gate: entry_t = RoPE(RMSNorm(wkv·x_t),
     position t). Unlike ratio 2, the official ratio-1 wkv is a BF16 Linear (no fp32): the
     projection wkv·x_t is summed in fp32 and rounded once to BF16 before RMSNorm, and the normed
     entry and the rotated entry are each rounded to BF16.""",
     applies_to=V41, policy="tolerance",
     sources=SOURCES_V41 + ("V41-model L446 (ratio 1: wkv a Linear of dtype bfloat16)",
                            "V41-model L461-462 (ratio 1: self.norm(self.wkv(x)), no fp32)",
                            "V41-model L181-207 (linear: F.linear for a BF16 weight)"),
     tolerance=ENTRY_TOLERANCE + """  And exactly where the BF16 result is determined: on the channels the
     rotation leaves alone (those before the last rope_dim, and every channel of entry 0, rotated by
     angle 0), the target's entry rounded to BF16 lies between the least and the greatest BF16 value
     the official computation can give: the fp32 sum wkv·x_t in any order (within (dim + 2)·u·Σ|x||W|
     of exact) rounded once to BF16, RMSNorm of those BF16 projections in fp32 (relative (d + 8)·u)
     over every choice the spread leaves, rounded to BF16.  Where no BF16 rounding boundary is that
     close (almost everywhere) one BF16 value is admitted.  A projection kept in fp32 moves the
     normed value by up to 2^-9 of itself, into the neighbouring BF16 value where it lies near a
     BF16 midpoint; the drawn midpoint cases (channels projecting to 2^s·(1 + 2^-8 − 2^-16)) put
     it there.""")

rule("CMP.NORM", "RMSNorm of the pooled vector, eps from the profile",
     """The pooled vector is normalized as y = w · p / sqrt(mean(p^2) + eps) over its d channels,
     with the learned weight w and eps = norm_eps of the model (1e-6 for V4, 1e-20 for V4.1).""",
     applies_to=V4_ALL, policy="tolerance",
     sources=SOURCES_V4 + SOURCES_V41 + ("V41-config (norm_eps)", "V4-model L61, L299 (norm_eps; RMSNorm(head_dim, norm_eps))",
                                         "V41-model L443 (RMSNorm(head_dim, norm_eps))"),
     tolerance=ENTRY_TOLERANCE)

rule("CMP.ROPE", "RoPE at the group's first position",
     """The last rope_dim channels of the normalized entry j are rotated as adjacent pairs
     (y[2i], y[2i+1]) by the angle (j·m)·f_i: the position of the FIRST token of the group
     (prefill freqs_cis[:cutoff:m]; decode start_pos + 1 - m).""",
     applies_to=V4_ALL, policy="tolerance",
     sources=SOURCES_V4 + SOURCES_V41 + ("V4-model L363-367 (prefill freqs_cis[:cutoff:ratio]; decode "
                                         "start_pos + 1 − ratio)", "V41-model L752-758 (RoPE of the latent at j·ratio)"),
     tolerance="""Against the exact rotation of the target's own unrotated entry (frequencies 0), per pair
     (a, b): (4u·|angle| + 16u + b)·|(a, b)|, u = 2^-24, b = 2^-8: the fp32 angle position·f (one
     rounding, relative u, so u·|angle| in the sine and cosine, doubled for their own evaluation),
     the fp32 complex product (a few u), and one BF16 rounding of the rotated entry (b of the pair's
     magnitude).  The last frequency is chosen where it turns a pair of an entry to nearly 0 in one
     channel: there the table's own rounding shows, and the entry is the declared table's rotation
     (ROPE.ROUNDING's interval, or a BF16 table's under rope_table=bf16).""")

rule("CMP.STREAM", "prefill, decode and chunked prefill agree",
     """One prefill from position 0 followed by one token at a time (decode) yields the same
     entries as one prefill of everything: the state carries the incomplete group and, for V4
     ratio 4, the previous group's window half.  Extension `streaming` (beyond the official domain,
     checked only for targets that declare it): so does feeding chunks of any sizes after the
     first.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=SOURCES_V4 + SOURCES_V41 + ("V41-model L479-480 (decode writes one token into its state slot)",
                                         "V4-model L344-359 (decode: the state carries the group and, at ratio 4, "
                                         "the previous window half)"),
     tolerance=TWICE_ENTRY_TOLERANCE + "  (Both sides are the target's own entries.)")


rule("CMP.STATE", "decode state: fp32 slots, scores from −inf, filled by the prefill's tail",
     """A gated compressor (ratio m > 1) keeps, per batch row, an fp32 kv state and an fp32 score
     state of coff·m slots × coff·d channels: kv 0 and score −inf before anything is written.
     Token p's fp32 projection wkv·x_p and score wgate·x_p (+ ape[p mod m] in V4) go to slot
     (m if the windows overlap, else 0) + p mod m: in the prefill the tokens of the trailing
     incomplete group, and at V4 ratio 4 also the last complete group into slots 0 … m−1; in
     decode each token as it arrives.  A group completed in decode is pooled from these fp32
     slots (nothing rounded to BF16 before the pooling); at V4 ratio 4 slots m … 2m−1 then move
     to 0 … m−1, the next window's first half.  A slot never written keeps score −inf and weighs
     0: group 0's first half when decoding starts before group 0 is complete.  Observable: the
     decoded entries are the prefill's, even where a BF16 score would move the softmax weights.""",
     applies_to=V4_ALL, policy="tolerance",
     sources=("V4-model L302-304 (kv_state zeros, score_state −inf, fp32)",
              "V4-model L329-336 (prefill: last complete group, trailing tokens)",
              "V4-model L343-359 (decode: slot, pool, shift)",
              "V41-model L450-456 (kv_state zeros, score_state −inf, fp32)",
              "V41-model L470-472 (prefill: trailing tokens)", "V41-model L476-482 (decode: slot, pool)"),
     tolerance=TWICE_ENTRY_TOLERANCE + "  (Both sides are the target's own "
               "entries: decoded after a prefill, and one prefill of everything.)")


def overlaps(model: str, ratio: int) -> bool:
    """Overlapping 8-token windows: V4, ratio 4 (`overlap = (ratio == 4)` in the V4 Compressor)."""
    return model in V4 and ratio == 4


def has_ape(model: str) -> bool:
    return model in V4


def has_gate(ratio: int) -> bool:
    return ratio > 1


def channel_factor(model: str, ratio: int) -> int:
    """coff: wkv and wgate project to coff·d channels."""
    return 2 if overlaps(model, ratio) else 1


def compressor_ratios(model: str) -> tuple[int, ...]:
    """The compress ratios a model's compressors use (0 = window only, no compressor)."""
    return tuple(sorted({r for r in profile(model).compress_ratios if r > 0}))


def rope_frequencies(rope_dim: int, theta: float) -> np.ndarray:
    """Plain RoPE frequencies f_i = theta^(-2i/rope_dim) in fp32 (YaRN rescales these, §6.2)."""
    return (1.0 / theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)).astype(np.float32)


def rope_angles(positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """position·f_i formed in fp32, as the official freqs_cis table is (outer product in fp32)."""
    return np.float32(positions)[..., None] * np.asarray(freqs, np.float32)


def rope(y: np.ndarray, positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Rotate the last 2·len(freqs) channels as adjacent pairs by position·f_i."""
    rd = 2 * len(freqs)
    if rd == 0:
        return y
    angle = rope_angles(positions, freqs).astype(np.float64)
    out = y.copy()
    a, b = y[..., -rd::2], y[..., -rd + 1::2]
    cos, sin = np.cos(angle), np.sin(angle)
    out[..., -rd::2] = a * cos - b * sin
    out[..., -rd + 1::2] = a * sin + b * cos
    return out


def rope_tolerance(plain: np.ndarray, positions: np.ndarray, freqs: np.ndarray, table: str = "fp32") -> np.ndarray:
    """CMP.ROPE's per-element bound on |rotated entry - rope(plain)|: 0 on the channels left alone,
    (4u·|angle| + 16u + b)·|(a, b)| on each rotated pair (the rule's tolerance text); a BF16 cos/sin
    table (rope_table=bf16) adds 2^-7·(|a| + |b|) ≤ 2^-6.5·|(a, b)|."""
    rd = 2 * len(freqs)
    tol = np.zeros(np.shape(plain))
    if rd == 0:
        return tol
    plain = np.asarray(plain, np.float64)
    pair = np.repeat(np.hypot(plain[..., -rd::2], plain[..., -rd + 1::2]), 2, axis=-1)
    angle = np.repeat(np.abs(rope_angles(positions, freqs).astype(np.float64)), 2, axis=-1)
    tol[..., -rd:] = pair * (4 * U32 * angle + 16 * U32 + U16 + (2.0 ** -6.5 if table == "bf16" else 0.0)) + 1e-35
    return tol


def rms_norm(p: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * p / np.sqrt(np.mean(p * p, axis=-1, keepdims=True) + eps)


def windows(t: np.ndarray, d: int, fill: float) -> np.ndarray:
    """[..., groups, m, 2d] -> [..., groups, 2m, d]: group j-1's first half, then group j's second
    half; group 0's missing previous half is `fill` (kv 0, score -inf)."""
    prev = np.full_like(t[..., :d], fill)
    prev[..., 1:, :, :] = t[..., :-1, :, :d]
    return np.concatenate([prev, t[..., d:]], axis=-2)


def softmax_pool(kv: np.ndarray, score: np.ndarray) -> np.ndarray:
    """sum over slots (axis -2) of softmax(score)·kv, per channel."""
    w = np.exp(score - score.max(axis=-2, keepdims=True))
    return (w * kv).sum(axis=-2) / w.sum(axis=-2)


def pooled(x: np.ndarray, params: dict, model: str, ratio: int) -> np.ndarray:
    """The pooled vectors (before RMSNorm) of every complete group, float64: [..., n // m, d]."""
    x = np.asarray(x, np.float64)
    kv = x @ np.asarray(params["wkv"], np.float64).T
    groups = x.shape[-2] // ratio
    if not has_gate(ratio):
        return kv[..., :groups, :]
    score = x @ np.asarray(params["wgate"], np.float64).T
    if has_ape(model):
        score = score + np.asarray(params["ape"], np.float64)[np.arange(x.shape[-2]) % ratio]
    shape = (*x.shape[:-2], groups, ratio, kv.shape[-1])
    kv, score = kv[..., :groups * ratio, :].reshape(shape), score[..., :groups * ratio, :].reshape(shape)
    if overlaps(model, ratio):
        d = kv.shape[-1] // 2
        kv, score = windows(kv, d, 0.0), windows(score, d, -np.inf)
    return softmax_pool(kv, score)


def compress(x: np.ndarray, params: dict, model: str, ratio: int) -> np.ndarray:
    """All entries of a sequence x [..., n, dim] fed from position 0: [..., n // ratio, d] float64.

    params: wkv [coff·d, dim], wgate [coff·d, dim] (ratio > 1), ape [ratio, coff·d] (V4),
    norm [d] (RMSNorm weight), rope_freqs [rope_dim / 2].
    """
    p = pooled(x, params, model, ratio)
    y = rms_norm(p, np.asarray(params["norm"], np.float64), profile(model).norm_eps)
    return rope(y, np.arange(p.shape[-2]) * ratio, params["rope_freqs"])


def pooled_tolerance(x: np.ndarray, params: dict, model: str, ratio: int, pooling: str = "fp32") -> np.ndarray:
    """The first part of ENTRY_TOLERANCE: a per-element bound on |pooled − exact pooled| for the
    pooled vectors [..., n // ratio, d] of x, cast to BF16 as the official code casts them (ratio 1:
    the BF16 Linear's output), not yet doubled."""
    x = np.asarray(x, np.float64)
    ax = np.abs(x)
    dim = x.shape[-1]
    groups = x.shape[-2] // ratio
    kv_mag = ax @ np.abs(np.asarray(params["wkv"], np.float64)).T      # sum_k |x_k||W_ck|
    if has_gate(ratio):
        s_mag = ax @ np.abs(np.asarray(params["wgate"], np.float64)).T
        if has_ape(model):
            s_mag = s_mag + np.abs(np.asarray(params["ape"], np.float64))[np.arange(x.shape[-2]) % ratio]
        score_err = (dim + 2) * U32 * s_mag.max(axis=-1, initial=0).max(axis=-1, initial=0)     # worst score error, per row
        # A weight p_s = e^{s_s}/sum e^{s} moves by <= 2·max|δs| relatively (plus rounding).
        weight_rel = 2 * score_err[..., None, None] + 4 * (2 * ratio) * U32
        shape = (*x.shape[:-2], groups, ratio, kv_mag.shape[-1])
        mag = kv_mag[..., :groups * ratio, :].reshape(shape)
        if overlaps(model, ratio):
            d = mag.shape[-1] // 2
            mag = windows(mag, d, 0.0)
        # sum_s p_s·|kv_s| <= max_s |kv_s|: the softmax weights sum to 1.
        pooled_mag = mag.max(axis=-2)
        err_p = ((dim + 2 * ratio + 4) * U32 + weight_rel) * pooled_mag
        if pooling == "bf16":
            s_max = s_mag.max(axis=-1, initial=0).max(axis=-1, initial=0)[..., None, None]
            err_p = err_p + (2 * U16 * s_max + 4 * U16) * pooled_mag
    else:
        pooled_mag = kv_mag[..., :groups, :]
        err_p = (dim + 2) * U32 * pooled_mag
    p = pooled(x, params, model, ratio)
    return err_p + U16 * (np.abs(p) + err_p)          # the fp32 pooled vector (ratio 1: the Linear) to BF16


def norm_tolerance(p: np.ndarray, err_p, weight: np.ndarray, model: str) -> tuple[np.ndarray, np.ndarray]:
    """The second part of ENTRY_TOLERANCE: (bound on |normed − exact normed|, |normed|) for the pooled
    vectors p known within err_p (0: the pooled vectors themselves), RMSNorm in fp32 to BF16."""
    err_p = np.broadcast_to(np.asarray(err_p, np.float64), np.shape(p))
    w = np.abs(np.asarray(weight, np.float64))
    r = np.sqrt(np.mean(p * p, axis=-1, keepdims=True) + profile(model).norm_eps)
    r_safe = np.where(r > 0, r, 1.0)
    rms_err = np.sqrt(np.mean(err_p * err_p, axis=-1, keepdims=True))
    y_mag = w * np.abs(p) / r_safe
    return w * (err_p + np.abs(p) * rms_err / r_safe) / r_safe + ((p.shape[-1] + 8) * U32 + U16) * y_mag, y_mag


def entry_tolerance(x: np.ndarray, params: dict, model: str, ratio: int, pooling: str = "fp32") -> np.ndarray:
    """A per-element absolute bound on |entry - exact entry|: [..., n // ratio, d] (ENTRY_TOLERANCE).

    It admits fp32 arithmetic in any order and the official BF16 roundings of the pooled (ratio 1:
    projected) vector, the normed entry and the rotated entry, at every ratio; pooling 'bf16' (the
    knob compressor_pooling) the pooling's own BF16 roundings too (BF16_POOLING)."""
    groups = np.shape(x)[-2] // ratio
    err_y, y_mag = norm_tolerance(pooled(x, params, model, ratio), pooled_tolerance(x, params, model, ratio, pooling),
                                  params["norm"], model)
    freqs = np.asarray(params["rope_freqs"], np.float32)
    rd = 2 * len(freqs)
    if rd:
        angle = np.abs(rope_angles(np.arange(groups) * ratio, freqs).astype(np.float64))
        pair_mag = np.hypot(y_mag[..., -rd::2], y_mag[..., -rd + 1::2])
        pair_err = np.maximum(err_y[..., -rd::2], err_y[..., -rd + 1::2])
        rot_err = 2 * pair_err + pair_mag * (2 * U32 * angle + 8 * U32 + U16)
        err_y = err_y.copy()
        err_y[..., -rd::2] = rot_err
        err_y[..., -rd + 1::2] = rot_err
    return 2 * err_y + 1e-35
