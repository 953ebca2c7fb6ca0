"""The coverage boundaries of FMT, FP4 and FP8: codec ties, saturation, scales and block layouts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...spec import formats as F
from ...spec import quant as Q
from .boundary import around, Boundary, F32, of


# ---------------------------------------------------------------------------------------------
# Codec views: blocks, the spec's scale, and the ratio x/s each element is rounded from
# ---------------------------------------------------------------------------------------------

@dataclass
class Blocks:
    x: np.ndarray        # [R, nb, block] float32
    s: np.ndarray        # [R, nb] the spec's scale value
    ratio: np.ndarray    # [R, nb, block] fl32(x / s), what the element rounding sees
    amax: np.ndarray     # [R, nb]


def _spec_scale(op, amax, block):
    if op == "fp4_e4m3_quantize":
        return F.e4m3_decode(Q.fp4_e4m3_scale(amax))
    if op == "fp4_e8m0_quantize":
        return F.e8m0_decode(Q.fp4_e8m0_scale(amax))
    return F.e8m0_decode(Q.fp8_scale(amax))


def _block_of(call) -> int:
    if call.op == "fp4_e4m3_quantize":
        return Q.FP4_KV_BLOCK
    if call.op == "fp4_e8m0_quantize":
        return Q.FP4_IDX_BLOCK
    return int(call.args[1] if len(call.args) > 1 else call.kwargs["block"])


def codec_blocks(calls, ops) -> list[Blocks]:
    out = []
    for c in of(calls, *ops):
        x = np.asarray(c.args[0], dtype=F32)
        if not np.isfinite(x).all():
            continue
        block = _block_of(c)
        xb = x.reshape(-1, x.shape[-1] // block, block)
        amax = np.abs(xb).max(-1)
        s = _spec_scale(c.op, amax, block)
        with np.errstate(all="ignore"):
            ratio = xb / s[..., None]
        out.append(Blocks(xb, s, ratio, amax))
    return out


def element_blocks(calls, ops) -> list[Blocks]:
    """Element casts (e2m1_encode, e4m3_encode) seen as one row of one block, scale 1."""
    out = []
    for c in of(calls, *ops):
        x = np.asarray(c.args[0], dtype=F32).reshape(1, 1, -1)
        out.append(Blocks(x, np.ones((1, 1), F32), x, np.abs(x).max(-1)))
    return out


QUANT_FP4 = ("fp4_e4m3_quantize", "fp4_e8m0_quantize")
QUANT_ALL = QUANT_FP4 + ("fp8_quantize",)


def ratio_hit(view, signed: str = "any"):
    """hit(calls, v): some element's ratio has magnitude v (and the given sign)."""
    def hit(calls, v):
        for b in view(calls):
            r = b.ratio
            mask = np.abs(r) == v
            if signed == "negative":
                mask &= np.signbit(r)
            if mask.any():
                return True
        return False
    return hit


def amax_hit(view):
    return lambda calls, v: any(np.any(b.amax == v) for b in view(calls))


def layout(name_of_decision: str, view, decision) -> list[Boundary]:
    """Where the decision elements sit: rows ≥ 1, odd blocks, odd and even element positions.

    decision(blocks) -> bool mask [R, nb, block] of the elements on one of the rule's boundaries."""
    def where(pick):
        def reached(calls):
            for b in view(calls):
                mask = decision(b)
                R, nb, block = mask.shape
                r, j, e = np.nonzero(mask)
                if np.any(pick(r, j, e, nb)):
                    return True
            return False
        return reached
    return [
        Boundary(f"{name_of_decision} in a row ≥ 1", "layout", where(lambda r, j, e, nb: r >= 1)),
        Boundary(f"{name_of_decision} at an odd block index of a multi-block row", "layout",
                 where(lambda r, j, e, nb: (j % 2 == 1) & (nb >= 2))),
        Boundary(f"{name_of_decision} at an odd element position", "layout", where(lambda r, j, e, nb: e % 2 == 1)),
        Boundary(f"{name_of_decision} at an even element position", "layout", where(lambda r, j, e, nb: e % 2 == 0)),
    ]


def on_points(points):
    points = np.asarray(points, dtype=F32)
    return lambda b: np.isin(np.abs(b.ratio), points)


E2M1_POINTS = F.E2M1_BOUNDARIES


def e2m1_rounding(view, where: str = "", with_layout: bool = True, beside: bool = True) -> list[Boundary]:
    """Each E2M1 tie of |x|/s exactly, and one ulp either side when `beside`."""
    out = []
    for p in E2M1_POINTS:
        out += around(f"{where}|x|/s at the E2M1 tie {p}", "element", p, ratio_hit(view))[:3 if beside else 1]
    return out + (layout(f"{where}an E2M1 tie", view, on_points(E2M1_POINTS)) if with_layout else [])


def e2m1_saturation(view) -> list[Boundary]:
    return (around("|x|/s at 6 (the largest E2M1)", "element", 6.0, ratio_hit(view))
            + [Boundary("|x|/s in (6, 7): rounds below the clamp would wrap", "range",
                        lambda calls: any(np.any((np.abs(b.ratio) > 6) & (np.abs(b.ratio) < 7)) for b in view(calls))),
               Boundary("|x|/s ≥ 7 (an unclamped encoder overflows its exponent)", "range",
                        lambda calls: any(np.any(np.abs(b.ratio) >= 7) for b in view(calls)))])


def zero_sign(view) -> list[Boundary]:
    def neg_between(lo, hi):
        return lambda calls: any(np.any(np.signbit(b.ratio) & (np.abs(b.ratio) > lo) & (np.abs(b.ratio) < hi))
                                 for b in view(calls))
    return [Boundary("x = −0", "element", lambda calls: any(np.any(np.signbit(b.x) & (b.x == 0)) for b in view(calls))),
            Boundary("−0.25 < x/s < 0 (rounds to −0)", "element", neg_between(0, 0.25)),
            *around("x/s at −0.25 (the tie between −0 and −0.5)", "element", 0.25, ratio_hit(view, "negative")),
            Boundary("negative x/s below the smallest fp32 normal", "range", neg_between(0, 2.0 ** -126))]


# E4M3: the midpoints between neighbouring values, by region and by the parity of the lower code.
E4M3_GRID = np.abs(F.e4m3_decode(np.arange(0x7F, dtype=np.uint8)))           # codes 0 … 0x7E
E4M3_MIDPOINTS = ((E4M3_GRID[1:] + E4M3_GRID[:-1]) / 2).astype(F32)          # between code c and c+1
_LOWER_CODE = np.arange(0x7E)
E4M3_MIDPOINT_CLASSES = {
    f"{region} E4M3 midpoint, lower code {parity}": E4M3_MIDPOINTS[
        ((_LOWER_CODE < 8) if region == "subnormal" else (_LOWER_CODE >= 8))
        & ((_LOWER_CODE % 2 == 0) if parity == "even" else (_LOWER_CODE % 2 == 1))]
    for region in ("subnormal", "normal") for parity in ("even", "odd")}


def on_set(quantity, name: str, level: str, points) -> list[Boundary]:
    """The points of a set, and one fp32 ulp either side of each: some input hits one of them."""
    points = np.asarray(points, dtype=F32)
    sets = {"exactly": points, "1 ulp below": F.f32_from_bits(F.f32_bits(points) - 1),
            "1 ulp above": F.f32_from_bits(F.f32_bits(points) + 1)}
    return [Boundary(f"{name}: {where}", level, lambda calls, s=s: quantity(calls, s)) for where, s in sets.items()]


def ratio_in(view):
    return lambda calls, s: any(np.isin(np.abs(b.ratio), s).any() for b in view(calls))


def amax_in(view):
    return lambda calls, s: any(np.isin(b.amax, s).any() for b in view(calls))


def e4m3_rounding(view) -> list[Boundary]:
    out = []
    for name, points in E4M3_MIDPOINT_CLASSES.items():
        out += on_set(ratio_in(view), f"|x|/s on a {name}", "element", points)
    return out + layout("an E4M3 midpoint", view, on_points(E4M3_MIDPOINTS))


def pow2_edges(view, top: float, ks, level="scale") -> list[Boundary]:
    """amax at top·2^k (where the E8M0 ceil steps) and one ulp either side, for k in each range."""
    out = []
    for label, k in ks:
        out += around(f"amax at {top:g}·2^{k} ({label})", level, top * 2.0 ** k, amax_hit(view))
    return out


def _kv(calls):
    return codec_blocks(calls, ("fp4_e4m3_quantize",))


def _idx(calls):
    return codec_blocks(calls, ("fp4_e8m0_quantize",))


def _fp4(calls):
    return codec_blocks(calls, QUANT_FP4)


def _fp8(calls):
    return codec_blocks(calls, ("fp8_quantize",))


def _e2m1(calls):
    return element_blocks(calls, ("e2m1_encode",))


def _e4m3(calls):
    return element_blocks(calls, ("e4m3_encode",))


def _any_block(view, pred):
    return lambda calls: any(np.any(pred(b)) for b in view(calls))


def kv_midpoints(region: str) -> list[Boundary]:
    out = []
    for name, points in E4M3_MIDPOINT_CLASSES.items():
        if name.startswith(region):
            out += on_set(amax_in(_kv), f"amax/6 on a {name} (amax = 6·midpoint)", "scale", points * F32(6))
    return out


def kv_scale() -> list[Boundary]:
    floor = 6 * 2.0 ** -9
    out = kv_midpoints("normal") + kv_midpoints("subnormal")
    out += [around("amax at the floor 6·2^-9", "range", floor, amax_hit(_kv))[2],
            *around("amax at 6·448 (the largest E4M3 scale)", "range", 6 * 448.0, amax_hit(_kv))[:2],
            Boundary("a subnormal E4M3 scale above the floor (6·2^-9 < amax < 6·2^-6)", "range",
                     _any_block(_kv, lambda b: (b.amax > floor) & (b.amax < 6 * 2.0 ** -6)))]
    return out + [Boundary("amax/6 rounds down: |x|/s > 6 for the block's largest element", "scale",
                           _any_block(_kv, lambda b: (b.amax / b.s > 6) & (b.amax >= 6 * 2.0 ** -6)))]


def kv_floor() -> list[Boundary]:
    floor = 6 * 2.0 ** -9
    exactly, below, _ = around("amax at the floor 6·2^-9", "range", floor, amax_hit(_kv))
    return [exactly, below,
            Boundary("an all-zero block", "range", _any_block(_kv, lambda b: b.amax == 0)),
            Boundary("amax an fp32 subnormal", "range", _any_block(_kv, lambda b: (b.amax > 0) & (b.amax < 2.0 ** -126)))]


def kv_saturate() -> list[Boundary]:
    return [around("amax at 6·448 (the largest E4M3 scale)", "range", 6 * 448.0, amax_hit(_kv))[2],
            *around("amax at 6·464 (amax/6 at the saturation midpoint)", "range", 6 * 464.0, amax_hit(_kv)),
            Boundary("amax ≥ 2^100 (far above saturation)", "range", _any_block(_kv, lambda b: b.amax >= 2.0 ** 100))]


def kv_clamp() -> list[Boundary]:
    def ratio_between(lo, hi):
        return _any_block(_kv, lambda b: (np.abs(b.ratio) > lo) & (np.abs(b.ratio) <= hi))
    return [Boundary("6 < |x|/s ≤ 6.375 (a normal scale rounded down)", "element", ratio_between(6, 6.375)),
            Boundary("6.375 < |x|/s < 9 (a subnormal scale)", "range", ratio_between(6.375, 9)),
            Boundary("|x|/s ≥ 9 (a saturated scale)", "range", ratio_between(9, np.inf)),
            *around("|x|/s at 6", "element", 6.0, ratio_hit(_kv))]


def kv_divide() -> list[Boundary]:
    def disagree(subnormal_scale):
        def pred(b):
            with np.errstate(all="ignore"):
                recip = b.x * (F32(1) / b.s)[..., None]
            codes = F.e2m1_encode(np.clip(b.ratio, -6, 6)) != F.e2m1_encode(np.clip(recip, -6, 6))
            return codes & ((b.s < 2.0 ** -6) == subnormal_scale)[..., None]
        return pred
    return [Boundary(f"x/s and x·fl32(1/s) round to different codes ({kind} scale)", "element",
                     _any_block(_kv, disagree(kind == "subnormal"))) for kind in ("normal", "subnormal")]


def pow2_scale(view, top, bottom_k, top_k) -> list[Boundary]:
    """The E8M0 ceil: amax at top·2^k ± 1 ulp across the range, and amax·fl32(1/top) one ulp above
    a power of two, where a floating-point log2 rounds to the power itself."""
    ks = [("bottom of the range", bottom_k), ("negative k", -9), ("k = 0", 0), ("k = 1", 1), ("positive k", 8),
          ("top of the range", top_k)]
    return pow2_edges(view, top, ks) + [
        Boundary(f"amax·fl32(1/{top:g}) one ulp above a power of two", "scale",
                 _any_block(view, lambda b: _just_above_pow2(b.amax * F32(1.0 / top))))]


def _just_above_pow2(v):
    v = np.asarray(v, dtype=F32)
    bits = F.f32_bits(v)
    return (v > 2.0 ** -126) & ((bits & 0x7FFFFF) == 1)


def above_floor(view, floor, text) -> list[Boundary]:
    """The floor itself and one ulp above belong to the scale rule (its checks keep amax ≥ floor)."""
    return around(f"amax at the floor {text}", "range", floor, amax_hit(view))[::2]


def idx_floor() -> list[Boundary]:
    floor = 6 * 2.0 ** -126
    return [around("amax at the floor 6·2^-126", "range", floor, amax_hit(_idx))[1],
            Boundary("an all-zero block", "range", _any_block(_idx, lambda b: b.amax == 0)),
            Boundary("amax an fp32 subnormal", "range", _any_block(_idx, lambda b: (b.amax > 0) & (b.amax < 2.0 ** -126)))]


def payload_range(view, floor: float, where: str, kv: bool) -> list[Boundary]:
    """The range class in a payload rule: a floor block whose amax/s is below 3 (the floor, not the
    unfloored scale, decides its codes); for the indexer codec (scale down to 2^-126) fp32-subnormal
    elements with a nonzero code; for the KV codec a saturated block (amax/6 > 464) with an
    element on an E2M1 tie."""
    out = [Boundary(f"{where}a floor block with nonzero codes and amax/s < 3", "range", _any_block(
        view, lambda b: (b.amax < floor) & (b.amax / b.s >= 0.25) & (b.amax / b.s < 3)))]
    if not kv:
        out.append(Boundary(f"{where}an fp32-subnormal element with |x|/s ≥ 0.25", "range", _any_block(
            view, lambda b: (np.abs(b.x) < 2.0 ** -126) & (np.abs(b.ratio) >= 0.25))))
    else:
        out.append(Boundary(f"{where}a saturated block (amax/6 > 464) with |x|/s on an E2M1 tie", "range",
                            _any_block(view, lambda b: (b.amax > 6 * 464.0)[..., None]
                                       & np.isin(np.abs(b.ratio), np.asarray(E2M1_POINTS, F32)))))
    return out


def fp8_floor() -> list[Boundary]:
    return [around("amax at the floor fl32(1e-4)", "range", F32(1e-4), amax_hit(_fp8))[1],
            Boundary("an all-zero block", "range", _any_block(_fp8, lambda b: b.amax == 0)),
            Boundary("amax an fp32 subnormal", "range", _any_block(_fp8, lambda b: (b.amax > 0) & (b.amax < 2.0 ** -126)))]


def nonfinite(ops) -> list[Boundary]:
    def has(pred, later_block=False):
        def reached(calls):
            for c in of(calls, *ops):
                x = np.asarray(c.args[0], dtype=F32)
                rows, cols = np.nonzero(pred(x.reshape(-1, x.shape[-1])))
                if rows.size and (not later_block or np.any((rows >= 1) & (cols >= _block_of(c)))):
                    return True
            return False
        return reached
    return [Boundary("NaN in a block", "range", has(np.isnan)),
            Boundary("+Inf in a block", "range", has(lambda x: x == np.inf)),
            Boundary("−Inf in a block", "range", has(lambda x: x == -np.inf)),
            Boundary("a non-finite value in a row ≥ 1, block ≥ 1", "layout", has(lambda x: ~np.isfinite(x), True))]


def fp8_linear_shapes() -> list[Boundary]:
    """FP8.LINEAR decides per block: each model's block, K of several blocks (a scale product per
    K block), N of one and of several weight blocks, and act_quant quotients below E4M3's normal
    range (448·|x|/amax < 2^-6 implies x/s < 2^-6, s being amax/448 rounded up to a power of two)."""
    def linear(pred):
        return lambda calls: any(pred(np.asarray(c.args[0], np.float64), np.asarray(c.args[1]), c.args[3])
                                 for c in of(calls, "fp8_linear"))

    def subnormal_quotients(x, w, block):
        xb = np.abs(x).reshape(-1, block)
        amax = xb.max(1, keepdims=True)
        r = 448.0 * xb / np.where(amax > 0, amax, 1.0)
        return bool(((r > 0) & (r < 2.0 ** -6)).any())
    return [*(Boundary(f"block {b} ({model})", "layout", linear(lambda x, w, block, b=b: block == b))
              for b, model in ((128, "V4"), (32, "V4.1"))),
            Boundary("K of several blocks", "layout", linear(lambda x, w, block: x.shape[-1] >= 2 * block)),
            Boundary("N of one weight block", "layout", linear(lambda x, w, block: w.shape[0] == block)),
            Boundary("N of several weight blocks", "layout", linear(lambda x, w, block: w.shape[0] > block)),
            Boundary("act_quant quotients that are E4M3 subnormals", "element", linear(subnormal_quotients))]


def blocks_of(op, shapes) -> list[Boundary]:
    def reached(n, block, dtype_bf16):
        def pred(calls):
            for c in of(calls, op):
                x = np.asarray(c.args[0])
                if x.shape[-1] == n and _block_of(c) == block and x.reshape(-1, n).shape[0] >= 2:
                    if bool(np.array_equal(F.bf16_round(x), x)) == dtype_bf16:
                        return True
            return False
        return pred
    return [Boundary(f"{n} dims in blocks of {block}, rows ≥ 2, {'BF16' if bf16 else 'fp32'} values", "layout",
                     reached(n, block, bf16)) for n, block in shapes for bf16 in (True, False)]


def dequant(op, scale_classes) -> list[Boundary]:
    def codes(calls, pred):
        return any(pred(np.asarray(c.args[0])) for c in of(calls, op))

    def scales(calls, pred):
        return any(pred(np.asarray(c.args[1])) for c in of(calls, op))
    nibbles = [Boundary(f"every code in the {half} nibble", "element",
                        lambda calls, sh=sh: codes(calls, lambda p: np.unique((p >> sh) & 0xF).size == 16))
               for half, sh in (("low", 0), ("high", 4))] if op.startswith("fp4") else [
        Boundary(f"E4M3 bytes {name}", "element", lambda calls, p=p: codes(calls, p))
        for name, p in (("subnormal, both signs", lambda q: np.any((q & 0x78) == 0) and np.any((q & 0xF8) == 0x80)),
                        ("±448 (0x7E, 0xFE)", lambda q: np.isin([0x7E, 0xFE], q).all()),
                        ("−0 (0x80)", lambda q: np.any(q == 0x80)))]
    return [Boundary(f"{op}: {b.name}", b.level, b.reached) for b in nibbles] + [
        Boundary(f"{op}: scale bytes {name}", "scale", lambda calls, p=p: scales(calls, p)) for name, p in scale_classes]


# ---------------------------------------------------------------------------------------------
# The boundaries of each rule
# ---------------------------------------------------------------------------------------------

def quant_boundaries() -> dict[str, list[Boundary]]:
    """FMT, FP4 and FP8: the codecs' element and scale boundaries."""
    e4m3_dequant_scales = [("with a subnormal E4M3 (< 0x08)", lambda s: np.any((s > 0) & (s < 8))),
                           ("with the largest E4M3 (0x7E)", lambda s: np.any(s == 0x7E))]
    e8m0_scales = [("0x00 (2^-127)", lambda s: np.any(s == 0)), ("0xFE (2^127)", lambda s: np.any(s == 0xFE))]
    return {
        "FMT.E2M1.VALUES": [Boundary("all 16 codes", "element", lambda calls: any(
            np.unique(c.args[0]).size == 16 for c in of(calls, "e2m1_decode")))],
        "FMT.E2M1.RNE": e2m1_rounding(_e2m1, with_layout=False),
        "FMT.E2M1.SATURATE": e2m1_saturation(_e2m1),
        "FMT.E2M1.ZERO_SIGN": zero_sign(_e2m1),
        "FMT.E4M3.VALUES": [Boundary("all 256 bytes", "element", lambda calls: any(
            np.unique(c.args[0]).size == 256 for c in of(calls, "e4m3_decode")))],
        "FMT.E4M3.RNE": [b for b in e4m3_rounding(_e4m3) if b.level != "layout"],
        "FMT.E4M3.SATFINITE": [*(b for i, b in enumerate(around("|x| at 448", "element", 448.0, ratio_hit(_e4m3)))
                                 if i != 1),      # one ulp below 448 is FMT.E4M3.RNE's
                               *around("|x| at 464 (the saturation midpoint)", "element", 464.0, ratio_hit(_e4m3)),
                               Boundary("±Inf", "range", lambda calls: any(np.isinf(b.x).any() for b in _e4m3(calls))),
                               Boundary("NaN", "range", lambda calls: any(np.isnan(b.x).any() for b in _e4m3(calls)))],
        "FMT.E8M0.VALUES": [Boundary("all 256 bytes", "element", lambda calls: any(
            np.unique(c.args[0]).size == 256 for c in of(calls, "e8m0_decode")))],
        "FMT.BF16.RNE": bf16_boundaries(),
        "FMT.CEIL_LOG2": pow2_scale(_idx, 6.0, -125, 125) + pow2_scale(_fp8, 448.0, -22, 118),
        "FP4.PACK.NIBBLE": [Boundary("distinct codes in the low and high nibble", "layout", lambda calls: any(
                                np.any(c.args[0][..., 0::2] != c.args[0][..., 1::2]) for c in of(calls, "fp4_pack"))),
                            Boundary("a quantizer's first byte holding two different codes", "layout", _any_block(
                                _idx, lambda b: F.e2m1_encode(b.ratio[:, :, 0]) != F.e2m1_encode(b.ratio[:, :, 1])))],
        "FP4.E2M1.RNE": e2m1_rounding(_kv, "KV: ", beside=False) + e2m1_rounding(_idx, "indexer: ")
        + payload_range(_kv, 6 * 2.0 ** -9, "KV: ", True) + payload_range(_idx, 6 * 2.0 ** -126, "indexer: ", False),
        "FP4.E2M1.ZERO_SIGN": zero_sign(_fp4),
        "FP4.KV.SCALE": kv_scale(),
        "FP4.KV.FLOOR": kv_floor(),
        "FP4.KV.SATURATE": kv_saturate(),
        "FP4.KV.DIVIDE": kv_divide() + [b for b in e2m1_rounding(_kv, "KV: ", with_layout=False)
                                         if "exactly" not in b.name] + payload_range(_kv, 6 * 2.0 ** -9, "", True),
        "FP4.KV.CLAMP": kv_clamp(),
        "FP4.IDX.SCALE": pow2_scale(_idx, 6.0, -120, 120) + above_floor(_idx, 6 * 2.0 ** -126, "6·2^-126"),
        "FP4.IDX.FLOOR": idx_floor(),
        "FP4.DEQUANT": dequant("fp4_e4m3_dequantize", e4m3_dequant_scales) + dequant("fp4_e8m0_dequantize", e8m0_scales),
        "FP4.NONFINITE": nonfinite(QUANT_FP4),
        "FP8.SCALE": pow2_scale(_fp8, 448.0, -22, 118) + above_floor(_fp8, F32(1e-4), "fl32(1e-4)"),
        "FP8.FLOOR": fp8_floor(),
        # |x|/s never exceeds 448 under a power-of-two ceil scale: no "1 ulp above" there.
        "FP8.E4M3": e4m3_rounding(_fp8) + around("|x|/s at 448", "element", 448.0, ratio_hit(_fp8))[:2]
        + [Boundary("a floor block (amax < fl32(1e-4)) with |x|/s ≥ 2^-10 (nonzero codes)", "range", _any_block(
            _fp8, lambda b: (b.amax > 0) & (b.amax < F32(1e-4)) & (b.amax / b.s >= 2.0 ** -10)))],
        "FP8.DEQUANT": dequant("fp8_dequantize", e8m0_scales),
        "FP8.BLOCKS": blocks_of("fp8_quantize", ((448, 64), (512, 32), (128, 128))),
        "FP8.V4_INPLACE": [b for b in e4m3_rounding(lambda calls: codec_blocks(calls, ("fp8_qdq",)))
                           if "subnormal" not in b.name],
        "FP8.NONFINITE": nonfinite(("fp8_quantize",)),
        "FP8.LINEAR": fp8_linear_shapes(),
    }


def bf16_boundaries() -> list[Boundary]:
    def low(pred, name, level="element"):
        return Boundary(name, level, lambda calls: any(
            pred(F.f32_bits(np.asarray(c.args[0], dtype=F32))) for c in of(calls, "bf16_round")))
    return [low(lambda b: np.any(((b & 0xFFFF) == 0x8000) & ((b >> 16) & 1 == 0) & ((b & 0x7F800000) != 0x7F800000)),
                "a tie with an even upper half (stays)"),
            low(lambda b: np.any(((b & 0xFFFF) == 0x8000) & ((b >> 16) & 1 == 1) & ((b & 0x7F800000) != 0x7F800000)),
                "a tie with an odd upper half (rounds up)"),
            low(lambda b: np.any((b & 0xFFFF) == 0x7FFF), "one ulp below a tie"),
            low(lambda b: np.any((b & 0xFFFF) == 0x8001), "one ulp above a tie"),
            low(lambda b: np.any(((b & 0x7FFFFFFF) > 0x7F7F7FFF) & ((b & 0x7FFFFFFF) < 0x7F800000)),
                "rounds past the largest BF16 to Inf", "range"),
            low(lambda b: np.any(((b & 0x7F800000) == 0) & ((b & 0x7FFFFF) != 0)), "an fp32 subnormal", "range"),
            low(lambda b: np.any((b & 0x7FFFFFFF) > 0x7F800000), "NaN", "range"),
            low(lambda b: np.any((b & 0x7FFFFFFF) == 0x7F800001), "the NaN with only the lowest payload bit", "range")]
