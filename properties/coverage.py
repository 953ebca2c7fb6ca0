"""Decision coverage: which of a rule's decision boundaries a profile's examples reach.

Every rounding or selection decision a rule makes has boundaries (an E2M1 tie, an E8M0 power of
two, an E4M3 midpoint of amax/6, compress_lens a multiple of 8, the 16384-position capacity …).
A check that never puts an input on a boundary, one ulp below it and one above, cannot tell the
official decision from its neighbour.  Coverage runs a rule's checks against a target through a
recording proxy that keeps every input the checks pass to an operation, then evaluates, per
boundary, a predicate over the recorded inputs in spec terms ("some element's |x|/s is exactly
0.75", "one fp32 ulp below", "in a row ≥ 1 at an odd block index").  Levels, as in TestFloat:
element, scale, range, layout.  The recorder also knows which inputs a randomly drawn example made
(suite.forall tells it), so per rule the listing says which boundaries random draws reach, and in
what share of one check's drawn examples (at least 1/50 is the goal), apart from what only the
explicit @examples or a fixed sweep reach.  A layer check draws too few layers at ci (2) for a
share to mean anything, so its strategy (path.layer_keys) is also measured on its own: a few
hundred keys drawn with a fixed seed, each classified by the same boundaries, nothing run
(strategy_rates).  The HAD, CMP, LAYOUT, BUDGET, LAYER, ROPE, PATH and ATTN
rules list the argument-level inputs where their clauses decide (a ratio, an incomplete group,
decode after the ring wrapped, each layout kind, a −1 in a later block of 64, the sink above the
exp overflow …).  properties/clauses.py lists each rule's clauses beside the check and the mutants
that fail when one alone changes (--clauses).

    dsv4spec coverage --profile ci --rules FP4,POOL
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..spec import formats as F
from ..spec import indexer as spec_indexer
from ..spec import pool as spec_pool
from ..spec import quant as Q
from ..spec.rules import V4, V4_ALL, V41, select
from .compare import as_numpy
from .suite import checks_for, run_check
from .target import Target, load_target

LEVELS = ("element", "scale", "range", "layout")
F32 = np.float32


# ---------------------------------------------------------------------------------------------
# The recording proxy
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    op: str
    args: tuple          # numpy arrays (tensors converted) and plain Python values
    kwargs: dict
    drawn: int | None = None   # the number of the randomly drawn example that made it (from 1); 0: an
    check: str = ""            # explicit @example; None: a fixed sweep.  The check that made it


class Recorder(Target):
    """A view of a target that records the inputs of every operation call, then makes it, and
    which of them a randomly drawn example made (suite.forall calls example_starts)."""

    def __init__(self, target: Target, memo: dict | None = None):
        self.__dict__.update(target.__dict__)
        # A provider of its own: a check that caches a target's results by provider (path.run_layer)
        # calls this one's operations afresh, so every rule's recording holds its own inputs; the
        # layer operations' results are kept in `memo` (one coverage run's), keyed by their inputs.
        self.provider = _SameProvider(target.provider)
        self.memo = {} if memo is None else memo
        self.calls: list[Call] = []
        self.check = ""
        self.drawn: int | None = None
        self.draws = 0

    def example_starts(self, explicit: bool):
        if explicit:
            self.drawn = 0
        else:
            self.draws += 1
            self.drawn = self.draws

    def op(self, name: str):
        fn = Target.op(self, name)

        def recorded(*args, **kwargs):
            call = Call(name, tuple(_plain(a) for a in args), {k: _plain(v) for k, v in kwargs.items()},
                        self.drawn, self.check)
            self.calls.append(call)
            if name not in MEMO_OPS:
                return fn(*args, **kwargs)
            key = (name, _digest(call.args), _digest(call.kwargs))
            if key not in self.memo:
                self.memo[key] = fn(*args, **kwargs)
            return self.memo[key]
        return recorded


MEMO_OPS = ("index_layer", "attention_layer")      # a layer at real shapes: seconds a call


def _digest(a):
    """A hashable digest of an operation's inputs (arrays by dtype, shape and bytes)."""
    if isinstance(a, dict):
        return tuple((k, _digest(v)) for k, v in sorted(a.items()))
    if isinstance(a, (tuple, list)):
        return tuple(_digest(v) for v in a)
    if isinstance(a, np.ndarray) or hasattr(a, "detach"):
        a = np.ascontiguousarray(_plain(a))
        return a.dtype.str, a.shape, hashlib.sha1(a.tobytes()).hexdigest()
    return a


class _SameProvider:
    """The provider's operations and attributes under another identity."""

    def __init__(self, provider):
        self.__dict__["_provider"] = provider

    def __getattr__(self, name):
        return getattr(self._provider, name)


def _plain(a):
    return as_numpy(a).copy() if hasattr(a, "detach") else a


def of(calls, *ops):
    return [c for c in calls if c.op in ops]


# ---------------------------------------------------------------------------------------------
# Boundaries
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Boundary:
    name: str
    level: str
    reached: object      # calls -> bool
    op: str = ""         # the operation whose calls it reads (seen); "" for one that reads several


def f32_step(v, ulps: int) -> F32:
    """The fp32 `ulps` steps above (below, when negative) the positive fp32 v."""
    return F.f32_from_bits(F.f32_bits(F32(v)) + ulps)[()]


def around(name: str, level: str, point, hit) -> list[Boundary]:
    """The boundary at `point` and one fp32 ulp either side: hit(calls, value) says whether some
    recorded input puts the decision's quantity exactly on value."""
    return [Boundary(f"{name}: {where}", level, lambda calls, v=f32_step(point, d): hit(calls, v))
            for where, d in (("exactly", 0), ("1 ulp below", -1), ("1 ulp above", 1))]


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
# Indexer and pool
# ---------------------------------------------------------------------------------------------

def visible_boundaries() -> list[Boundary]:
    def hit(ratio, offset, decode=False):
        def pred(calls):
            for c in of(calls, "index_visible"):
                p, r = np.asarray(c.args[0]), int(c.args[1])
                if r == ratio and (not decode or p.size == 1) and np.any((p + 1) % r == offset % r):
                    return True
            return False
        return pred
    out = []
    for r in (2, 4, 128):
        out += [Boundary(f"ratio {r}: p + 1 a multiple of {r} (a new entry becomes visible)", "element", hit(r, 0)),
                Boundary(f"ratio {r}: one position before", "element", hit(r, -1)),
                Boundary(f"ratio {r}: one position after", "element", hit(r, 1)),
                Boundary(f"ratio {r}: decode (one position) on the multiple", "layout", hit(r, 0, True))]
    return out + [Boundary("ratio 1", "element", lambda calls: any(int(c.args[1]) == 1 for c in of(calls, "index_visible"))),
                  Boundary("position 0", "range", lambda calls: any(np.any(np.asarray(c.args[0]) == 0)
                                                                   for c in of(calls, "index_visible")))]


def _score_calls(calls, dtype=None):
    out = []
    for c in of(calls, "index_scores"):
        d = c.args[4] if len(c.args) > 4 else c.kwargs.get("score_dtype", "bf16")
        if dtype is None or d == dtype:
            out.append((c, d))
    return out


def _visible_rows(pred):
    def reached(calls):
        for c, _ in _score_calls(calls):
            visible, S = np.asarray(c.args[3]), np.asarray(c.args[1]).shape[0]
            if np.any(pred(visible, S, np.arange(visible.size))):
                return True
        return False
    return reached


def mask_boundaries() -> list[Boundary]:
    def all_negative(calls):
        for c, _ in _score_calls(calls):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            s = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32")
            rows = visible > 0
            if np.any(rows & np.all(np.where(np.isfinite(s), s < 0, True), axis=1)):
                return True
        return False
    return [Boundary("a row with visible = 0", "range", _visible_rows(lambda v, S, t: v == 0)),
            Boundary("a row with visible = S", "range", _visible_rows(lambda v, S, t: v == S)),
            Boundary("a row ≥ 1 with 0 < visible < S", "layout", _visible_rows(lambda v, S, t: (v > 0) & (v < S) & (t >= 1))),
            Boundary("a row whose visible scores are all negative (a masked 0 would win)", "element", all_negative)]


def _scores_differ(a_dtype, b_kind):
    """Some score where two roundings differ: the BF16 steps vs fp32 then one cast, or vs fp32."""
    def reached(calls):
        for c, d in _score_calls(calls, a_dtype):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            steps = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "bf16")
            exact = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32")
            other = spec_indexer.round_bf16(exact) if b_kind == "one_cast" else exact
            if np.any(np.isfinite(steps) & (steps != other)):
                return True
        return False
    return reached


def score_formula() -> list[Boundary]:
    def dots(pred):
        def reached(calls):
            for c, _ in _score_calls(calls):
                q, k, w = (np.asarray(a, dtype=np.float64) for a in c.args[:3])
                d = np.einsum("thd,sd->ths", q, k)
                if np.any(pred(d, w[:, :, None])):
                    return True
            return False
        return reached
    return [Boundary("a negative dot with a positive weight (ReLU zeroes it)", "element", dots(lambda d, w: (d < 0) & (w > 0))),
            Boundary("a negative dot with a negative weight (ReLU after the weight would keep it)", "element",
                     dots(lambda d, w: (d < 0) & (w < 0))),
            Boundary("a positive dot with a negative weight", "element", dots(lambda d, w: (d > 0) & (w < 0))),
            *(Boundary(f"score dtype {dtype}", "layout", lambda calls, dtype=dtype: bool(_score_calls(calls, dtype)))
              for dtype in ("bf16", "fp32"))]


def score_rounding() -> list[Boundary]:
    def dot_on_bf16_tie(calls):
        for c, _ in _score_calls(calls, "bf16"):
            q, k = (np.asarray(a, dtype=np.float64) for a in c.args[:2])
            d = np.einsum("thd,sd->ths", q, k).astype(F32)
            if np.any((F.f32_bits(d) & 0xFFFF) == 0x8000):
                return True
        return False
    def absorbed(calls):
        for c, _ in _score_calls(calls, "bf16"):
            q, k, w = (np.asarray(a, dtype=np.float64) for a in c.args[:3])
            dots = spec_indexer.round_bf16(np.einsum("thd,sd->ths", q, k))
            p = spec_indexer.round_bf16(np.maximum(dots, 0) * w[:, :, None])
            running = np.zeros_like(p[:, 0])
            for h in range(p.shape[1]):
                running = spec_indexer.round_bf16(running + p[:, h])
            if np.any(np.abs(running - spec_indexer.round_bf16(p.sum(1))) > 2 * spec_indexer.bf16_quantum(
                    np.maximum(np.abs(running), np.abs(p).max(1)))):
                return True
        return False
    def many_heads(calls):
        return any(np.asarray(c.args[0]).shape[0] >= 2 and np.asarray(c.args[0]).shape[1] >= 32
                   for c, _ in _score_calls(calls, "bf16"))
    return [Boundary("BF16 steps and fp32-then-one-cast differ", "element", _scores_differ("bf16", "one_cast")),
            Boundary("a BF16 running head sum drifts beyond the tolerance (small heads absorbed)", "element", absorbed),
            Boundary("a head's dot exactly on a BF16 tie", "element", dot_on_bf16_tie),
            Boundary("32 heads, several rows", "layout", many_heads)]


def v32_scores() -> list[Boundary]:
    def not_bf16(calls):
        for c, _ in _score_calls(calls, "fp32"):
            q, k, w, visible = (np.asarray(a, dtype=np.float64) for a in c.args[:4])
            s = spec_indexer.index_scores(q, k, w, visible.astype(np.int64), "fp32").astype(F32)
            if np.any(np.isfinite(s) & (F.bf16_round(s) != s)):
                return True
        return False
    return [Boundary("fp32 scores differ from the BF16-step scores", "element", _scores_differ("fp32", "steps")),
            Boundary("an fp32 score BF16 cannot hold", "element", not_bf16)]


def fp4_scores() -> list[Boundary]:
    def packed(index, pred):
        return lambda calls: any(pred(np.asarray(c.args[index])) for c in of(calls, "index_scores_fp4"))
    every = lambda p: np.unique(p & 0xF).size == 16 and np.unique(p >> 4).size == 16  # noqa: E731
    return [Boundary("every E2M1 code in both nibbles of q", "element", packed(0, every)),
            Boundary("every E2M1 code in both nibbles of k", "element", packed(2, every)),
            Boundary("k scales differing inside a row", "scale", packed(3, lambda s: np.any(s.min(-1) != s.max(-1)))),
            Boundary("32 heads, several rows and keys", "layout", packed(0, lambda p: p.shape[0] >= 2 and p.shape[1] >= 32))]


def tp_boundaries() -> list[Boundary]:
    def shards(calls):              # two calls of ≥ 2 heads each over the same keys: shards of one score
        parts = [c for c, _ in _score_calls(calls, "bf16") if np.asarray(c.args[0]).shape[1] >= 2]
        return any(np.array_equal(a.args[1], b.args[1]) and np.array_equal(a.args[3], b.args[3])
                   for i, a in enumerate(parts) for b in parts[i + 1:])
    return [Boundary("heads split into shards of ≥ 2 heads", "layout", shards),
            Boundary("a negative weight inside a shard", "element", lambda calls: any(
                np.any(np.asarray(c.args[2]) < 0) for c, _ in _score_calls(calls, "bf16")))]


def chunk_boundaries() -> list[Boundary]:
    def slices(pred):
        def reached(calls):
            cs = [c for c, _ in _score_calls(calls, "bf16")]
            for small in cs:
                qs = np.asarray(small.args[0])
                for big in cs:
                    qb = np.asarray(big.args[0])
                    if qb.shape[0] <= qs.shape[0] or qb.shape[1:] != qs.shape[1:]:
                        continue
                    for a in range(qb.shape[0] - qs.shape[0] + 1):
                        if np.array_equal(qb[a:a + qs.shape[0]], qs) and pred(a, small, big):
                            return True
            return False
        return reached
    def rows(call):
        return np.asarray(call.args[0]).shape[0]

    def keys(call):
        return np.asarray(call.args[1]).shape[0]
    decode = lambda a, s, b: rows(s) == 1 and keys(s) < keys(b)  # noqa: E731
    return [Boundary("a chunk starting at row ≥ 1", "layout", slices(lambda a, s, b: a >= 1 and rows(s) >= 2)),
            Boundary("decode of a row with fewer entries than the prefill", "layout", slices(decode))]


def weight_boundaries() -> list[Boundary]:
    return [Boundary(f"model {m}", "layout", lambda calls, m=m: any(c.args[1] == m for c in of(calls, "index_weights")))
            for m in V4_ALL]


def weight_v32_boundaries() -> list[Boundary]:
    """The one fp32 rounding of bf16(raw·2^-3)·q_scale·fl32(128^-0.5), either way, over scales."""
    c = float(np.float32(128 ** -0.5))

    def products(calls):
        for call in of(calls, "index_weights_v32"):
            exact = np.asarray(call.args[0], np.float64) * 0.125 * np.asarray(call.args[1], np.float64) * c
            yield exact, exact.astype(np.float32).astype(np.float64), np.asarray(call.args[1], np.float64)
    return [Boundary("a weight rounded up", "element", lambda calls: any((r > e).any() for e, r, _ in products(calls))),
            Boundary("a weight rounded down", "element", lambda calls: any((r < e).any() for e, r, _ in products(calls))),
            Boundary("q_scale 1", "scale", lambda calls: any((q == 1).any() for _, _, q in products(calls))),
            Boundary("q_scale ≤ 2^-30", "range", lambda calls: any((q <= 2.0 ** -30).any() for _, _, q in products(calls)))]


def _topk_rows(calls):
    for c in of(calls, "index_topk"):
        scores, visible = np.asarray(c.args[0], dtype=np.float64), np.asarray(c.args[1])
        k, order = int(c.args[2]), c.args[3]
        for t in range(scores.shape[0]):
            yield t, scores[t], int(visible[t]), k, order


def _kth_tie(row, n, k):
    vis = np.sort(row[:n])[::-1]
    return 0 < k < n and vis[k - 1] == vis[k]


def topk_boundaries() -> list[Boundary]:
    def rows(pred):
        return lambda calls: any(pred(t, row, n, k, o) for t, row, n, k, o in _topk_rows(calls))
    return [Boundary("k = 0", "range", rows(lambda t, r, n, k, o: k == 0)),
            Boundary("k = S (every column)", "range", rows(lambda t, r, n, k, o: k == r.size and k > 0)),
            Boundary("a row ≥ 1 with fewer visible entries than k (padding)", "layout", rows(lambda t, r, n, k, o: t >= 1 and 0 < n < k)),
            Boundary("visible = 0 with k > 0", "range", rows(lambda t, r, n, k, o: n == 0 and k > 0)),
            Boundary("a tie at the k-th score", "element", rows(lambda t, r, n, k, o: _kth_tie(r, n, k))),
            Boundary("finite scores past the visible range", "range", rows(lambda t, r, n, k, o: np.any(np.isfinite(r[n:])))),
            Boundary("visible scores beyond fp16's range (|s| > 65504)", "range",
                     rows(lambda t, r, n, k, o: 0 < k < n and np.any(np.isfinite(r[:n]) & (np.abs(r[:n]) > 65504)))),
            Boundary("visible nonzero scores below half fp16's smallest subnormal", "range",
                     rows(lambda t, r, n, k, o: 0 < k < n and np.any((r[:n] != 0) & (np.abs(r[:n]) <= 2.0 ** -25)))),
            Boundary("order 'score'", "layout", rows(lambda t, r, n, k, o: o == "score" and 1 < k < n)),
            Boundary("order 'position'", "layout", rows(lambda t, r, n, k, o: o == "position" and 1 < k < n))]


def _pool_rows(calls):
    for c in of(calls, "candidate_blocks"):
        scores, lens = np.asarray(c.args[0], dtype=np.float64), np.asarray(c.args[1])
        topk_blocks = int(c.args[2]) if len(c.args) > 2 else spec_pool.TOPK_BLOCKS
        for t in range(scores.shape[0]):
            yield t, scores[t], int(lens[t]), topk_blocks


def _block_kth_tie(row, n, topk_blocks):
    scores = spec_pool.block_scores(row, n)
    finite = np.sort(scores[np.isfinite(scores)])[::-1]
    m = topk_blocks - (1 if n > 0 else 0)                 # the pinned block takes one place
    return 0 < m < finite.size and finite[m - 1] == finite[m]


def pool_boundaries() -> list[Boundary]:
    cap = spec_pool.POOL_CAPACITY

    def rows(pred):
        return lambda calls: any(pred(t, row, n, kb) for t, row, n, kb in _pool_rows(calls))
    weak = lambda r, n: n > 8 and np.max(r[spec_pool.newest_block(n) * 8:n]) < np.min(  # noqa: E731
        spec_pool.block_scores(r, n)[:spec_pool.newest_block(n)])
    return [Boundary("compress_lens = 0", "range", rows(lambda t, r, n, kb: n == 0)),
            Boundary("compress_lens a multiple of 8", "element", rows(lambda t, r, n, kb: n > 0 and n % 8 == 0)),
            Boundary("compress_lens ≡ 1 (mod 8)", "element", rows(lambda t, r, n, kb: n % 8 == 1)),
            Boundary("compress_lens ≡ 7 (mod 8)", "element", rows(lambda t, r, n, kb: n % 8 == 7)),
            Boundary("a row ≥ 1 with compress_lens not a multiple of 8", "layout", rows(lambda t, r, n, kb: t >= 1 and n % 8)),
            Boundary("compress_lens = W, W not a multiple of 8", "layout", rows(lambda t, r, n, kb: n == r.size and r.size % 8)),
            Boundary(f"{cap - 1} reachable positions", "range", rows(lambda t, r, n, kb: n == cap - 1)),
            Boundary(f"{cap} reachable positions (the capacity, all kept)", "range", rows(lambda t, r, n, kb: n == cap)),
            Boundary(f"{cap + 1} reachable positions (one block pruned)", "range", rows(lambda t, r, n, kb: n == cap + 1)),
            Boundary("more blocks than topk_blocks (small topk_blocks)", "range",
                     rows(lambda t, r, n, kb: kb < spec_pool.TOPK_BLOCKS and -(-n // 8) > kb)),
            Boundary("a tie at the k-th block score", "element", rows(lambda t, r, n, kb: _block_kth_tie(r, n, kb))),
            Boundary("the newest block weaker than every other", "element", rows(lambda t, r, n, kb: weak(r, n))),
            Boundary("a reachable block entirely −inf", "range", rows(
                lambda t, r, n, kb: n > 8 and np.any(np.all(np.isneginf(r[:n - n % 8].reshape(-1, 8)), axis=1))))]


def reindex_boundaries(op: str = "reindex_topk") -> list[Boundary]:
    def rows(pred):
        def reached(calls):
            for c in of(calls, op):
                visible, pool, k = np.asarray(c.args[3]), np.asarray(c.args[4], dtype=bool), int(c.args[5])
                eligible = pool & spec_indexer.visibility_mask(visible, pool.shape[1])
                if any(pred(eligible[t], pool[t], k) for t in range(pool.shape[0])):
                    return True
            return False
        return reached
    return [Boundary("an empty pool row", "range", rows(lambda e, p, k: not p.any())),
            Boundary("a full pool row", "range", rows(lambda e, p, k: p.all())),
            Boundary("fewer eligible positions than topk (padding)", "range", rows(lambda e, p, k: 0 < e.sum() < k)),
            Boundary("more eligible positions than topk", "range", rows(lambda e, p, k: 0 < k < e.sum())),
            Boundary(f"a pool of a pruned row (> {spec_pool.POOL_CAPACITY} positions)", "range",
                     rows(lambda e, p, k: p.size > spec_pool.POOL_CAPACITY and 0 < p.sum() < p.size))]


# ---------------------------------------------------------------------------------------------
# The boundaries of each rule
# ---------------------------------------------------------------------------------------------

def _boundaries() -> dict[str, list[Boundary]]:
    e4m3_dequant_scales = [("with a subnormal E4M3 (< 0x08)", lambda s: np.any((s > 0) & (s < 8))),
                           ("with the largest E4M3 (0x7E)", lambda s: np.any(s == 0x7E))]
    e8m0_scales = [("0x00 (2^-127)", lambda s: np.any(s == 0)), ("0xFE (2^127)", lambda s: np.any(s == 0xFE))]
    topk = topk_boundaries()
    pool = pool_boundaries()
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
        "IDX.VISIBLE": visible_boundaries(),
        "IDX.MASK": mask_boundaries(),
        "IDX.SCORE.FORMULA": score_formula(),
        "IDX.SCORE.ROUNDING": score_rounding(),
        "IDX.SCORE.V32_FP32": v32_scores(),
        "IDX.SCORE.FP4": fp4_scores(),
        "IDX.SCORE.TP": tp_boundaries(),
        "IDX.CHUNK": chunk_boundaries(),
        "IDX.WEIGHT.SCALE": weight_boundaries(),
        "IDX.WEIGHT.V32": weight_v32_boundaries(),
        "IDX.TOPK.COUNT": topk, "IDX.TOPK.PAD": topk, "IDX.TOPK.ORDER": [b for b in topk if b.level == "layout"],
        "IDX.TOPK.SELECTION": topk, "IDX.TOPK.TIES": [b for b in topk if "tie" in b.name or b.level == "layout"],
        "POOL.BLOCK_SCORE": [b for b in pool if "reachable positions" not in b.name],
        "POOL.PIN_NEWEST": [b for b in pool if "newest" in b.name or "mod 8" in b.name or "multiple" in b.name],
        "POOL.PIN_EMPTY": [b for b in pool if "= 0" in b.name],
        "POOL.PIN_COUNTS": [b for b in pool if "newest" in b.name or "topk_blocks" in b.name],
        "POOL.TOPK_BLOCKS": pool,
        "POOL.DROP_INF": [b for b in pool if "−inf" in b.name or "= 0" in b.name],
        "POOL.MASK": [b for b in pool if b.level == "layout" or "mod 8" in b.name],
        "POOL.SIZE": [b for b in pool if "reachable positions" in b.name or "topk_blocks" in b.name],
        "POOL.ALL_REACHABLE": [b for b in pool if "reachable positions" in b.name],
        "POOL.REINDEX": reindex_boundaries(),
    }


# ---------------------------------------------------------------------------------------------
# The other families: the inputs where each clause decides (argument levels, not element values)
# ---------------------------------------------------------------------------------------------

def arg(c: Call, i: int, name: str):
    return c.args[i] if len(c.args) > i else c.kwargs.get(name)


def seen(op: str, name: str, level: str, pred) -> Boundary:
    """Some call of `op` satisfies pred(call)."""
    return Boundary(name, level, lambda calls: any(bool(pred(c)) for c in of(calls, op)), op)


def _rows(c, i=0):
    x = np.asarray(arg(c, i, "x"))
    return x.reshape(-1, x.shape[-1]).shape[0] if x.ndim else 0


def _sylvester(n: int) -> np.ndarray:
    return np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=np.float64)


def had_boundaries() -> dict[str, list[Boundary]]:
    def not_bf16(c):                # an exact H·x/√128 that BF16 cannot hold: the rounding decides
        x = np.asarray(arg(c, 0, "x"), dtype=np.float64)
        y = F32((x @ _sylvester(x.shape[-1]).T) / np.sqrt(x.shape[-1]))
        return np.any(F.bf16_round(y) != y)

    def spread(c):                  # nonzero inputs 2^20 apart: the tolerance's ‖x‖₁ term is not all
        a = np.abs(np.asarray(arg(c, 0, "x"), dtype=np.float64))
        return np.any(a.max(-1) >= 2.0 ** 20 * np.where(a > 0, a, np.inf).min(-1))
    rows = seen("hadamard", "several rows at once", "layout", lambda c: _rows(c) >= 2)
    return {"HAD.MATRIX": [seen("hadamard", "a basis vector (one column of H)", "element", lambda c: np.any(
                               (np.abs(np.asarray(c.args[0])) > 0).sum(-1) == 1)), rows,
                           *[seen("index_rotate", f"index_rotate for {m}", "range", lambda c, m=m: arg(c, 1, "model") == m)
                             for m in ("v3.2", "v4-flash")]],
            "HAD.ROUNDING": [seen("hadamard", "an fp32 result BF16 cannot hold", "element", not_bf16),
                             seen("hadamard", "inputs of exponents 2^20 apart in one row", "range", spread), rows],
            "HAD.ABSENT_V41": [seen("index_rotate", "index_rotate for v4.1-flash", "range",
                                    lambda c: arg(c, 1, "model") == "v4.1-flash")]}


def cmp_boundaries() -> dict[str, list[Boundary]]:
    def S(c):
        return np.asarray(arg(c, 0, "x")).shape[1]

    def ratio(c):
        return int(arg(c, 99, "ratio"))
    groups = [seen("compress", "S a multiple of the ratio", "layout", lambda c: S(c) % ratio(c) == 0 and S(c) > 0),
              seen("compress", "S not a multiple of the ratio (an incomplete last group)", "layout",
                   lambda c: S(c) % ratio(c) != 0 and S(c) > ratio(c)),
              seen("compress", "S below the ratio (no complete group)", "range", lambda c: 0 < S(c) < ratio(c)),
              seen("compress", "batch ≥ 2", "layout", lambda c: np.asarray(arg(c, 0, "x")).shape[0] >= 2)]
    by_ratio = {r: seen("compress", f"ratio {r}", "range", lambda c, r=r: ratio(c) == r) for r in (1, 2, 4, 128)}
    feed = [seen("compressor_feed", "a feed of one token (decode)", "layout",
                 lambda c: np.asarray(arg(c, 1, "x")).shape[1] == 1),
            seen("compressor_feed", "a feed of several tokens (a chunk)", "layout",
                 lambda c: np.asarray(arg(c, 1, "x")).shape[1] > 1)]
    def feeds(calls):               # (ratio, model, [tokens of each feed]) per compressor_state
        out = []
        for c in calls:
            if c.op == "compressor_state":
                out.append((int(c.kwargs.get("ratio", 0)), c.kwargs.get("model"), []))
            elif c.op == "compressor_feed" and out:
                out[-1][2].append(np.asarray(arg(c, 1, "x")).shape[1])
        return out

    def fed(name, level, pred):
        return Boundary(name, level, lambda calls: any(sizes and pred(m, model, sizes) for m, model, sizes in feeds(calls)))
    state = [fed("decode from before group 0 completes (a prefill shorter than the ratio)", "range",
                 lambda m, model, n: n[0] < m and len(n) > m - n[0]),
             fed("a prefill ending inside a group, the group completed in decode", "layout",
                 lambda m, model, n: n[0] > m and n[0] % m != 0 and sum(n) - n[0] >= m - n[0] % m),
             fed("a prefill ending on a group boundary, then decode", "layout",
                 lambda m, model, n: n[0] >= m and n[0] % m == 0 and len(n) > 1),
             fed("V4 ratio 4: two groups completed in decode (the window half shifted)", "layout",
                 lambda m, model, n: m == 4 and model in V4 and sum(n) - n[0] >= 8),
             *(fed(f"a state of ratio {r}", "range", lambda m, model, n, r=r: m == r) for r in (2, 4, 128))]
    return {"CMP.STATE": state, "CMP.GROUPS": groups + feed[:1], "CMP.CAUSAL": groups[:2] + [by_ratio[4]],
            "CMP.OVERLAP": [by_ratio[4], groups[0]], "CMP.APE": [by_ratio[4], by_ratio[128]],
            "CMP.GATE": [by_ratio[2], by_ratio[128], groups[3]], "CMP.RATIO1": [by_ratio[1]],
            "CMP.NORM": [by_ratio[4], by_ratio[128]], "CMP.ROPE": [by_ratio[4], by_ratio[128], groups[0]],
            "CMP.STREAM": feed + [by_ratio[4], by_ratio[128]]}


def layout_boundaries() -> dict[str, list[Boundary]]:
    from ..spec import layout as L

    def kind_of(kind, op="entry_pack"):
        return seen(op, f"{op} of {kind}", "layout", lambda c: arg(c, 0, "kind") == kind)

    def rows(kind):
        return seen("entry_pack", f"several {kind} entries at once", "layout",
                    lambda c: arg(c, 0, "kind") == kind and _rows(c, 1) >= 2)
    rule_kind = {"LAYOUT.V4.MAIN": "v4_main_kv", "LAYOUT.INDEX_K": "fp4_index_k", "LAYOUT.V41.MAIN": "v41_main_kv",
                 "LAYOUT.V41.SWA": "v41_swa_kv", "LAYOUT.V32.INDEX_K": "v32_index_k",
                 "LAYOUT.V32.MLA": "v32_mla_kv"}
    out = {rule: [kind_of(k), kind_of(k, "entry_unpack"), rows(k)] for rule, k in rule_kind.items() if k in L.KINDS}
    out["LAYOUT.ORDER"] = [kind_of(k) for k in L.KINDS]
    out["LAYOUT.UNPACK"] = [kind_of(k, "entry_unpack") for k in L.KINDS]
    out["LAYOUT.REJECT"] = [seen("entry_unpack", "an entry of the wrong byte count", "range", lambda c: np.asarray(
        arg(c, 1, "data")).shape[-1] != L.LAYOUTS[arg(c, 0, "kind")].nbytes if arg(c, 0, "kind") in L.LAYOUTS else True)]
    return out


def budget_boundaries() -> dict[str, list[Boundary]]:
    from ..spec.pool import POOL_CAPACITY
    models = V4_ALL                 # the budget rules apply to V4 and V4.1

    def each_model(op, rule_models=models):
        return [seen(op, f"{op} of {m}", "range", lambda c, m=m: arg(c, 0, "model") == m) for m in rule_models]

    def context(op, i=1):
        return [seen(op, f"context ≤ {POOL_CAPACITY} (every position a candidate)", "range",
                     lambda c: 0 < int(arg(c, i, "context")) <= POOL_CAPACITY),
                seen(op, f"context > {POOL_CAPACITY} (the pool caps the work)", "range",
                     lambda c: int(arg(c, i, "context")) > POOL_CAPACITY)]
    return {"BUDGET.KV_BYTES": each_model("kv_bytes_per_token"),
            "BUDGET.WINDOW": each_model("window_bytes_per_layer"),
            "BUDGET.INDEX_WORK": each_model("indexer_macs_per_token") + context("indexer_macs_per_token"),
            "BUDGET.ATTN_WORK": each_model("core_attention_macs") + context("core_attention_macs", 2)}


def layer_boundaries() -> dict[str, list[Boundary]]:
    def layers(models):
        return [seen("layer_role", f"layer 0 of {m}", "layout", lambda c, m=m: arg(c, 0, "model") == m and
                     int(arg(c, 1, "layer")) == 0) for m in models] + [
                seen("layer_role", f"layers 1 … 3 of {m} (the first pattern)", "layout", lambda c, m=m: arg(
                    c, 0, "model") == m and 1 <= int(arg(c, 1, "layer")) <= 3) for m in models] + [
                seen("layer_role", f"a layer ≥ 40 of {m}", "layout", lambda c, m=m: arg(c, 0, "model") == m
                     and int(arg(c, 1, "layer")) >= 40) for m in models]
    return {"LAYER.V4": layers(("v4-flash", "v4-pro")), "LAYER.V41": layers(("v4.1-flash",))}


def rope_boundaries() -> dict[str, list[Boundary]]:
    def positions(c):
        return np.asarray(arg(c, 1, "positions"))

    def width(c):
        return np.asarray(arg(c, 0, "x")).shape[-1], 2 * np.asarray(arg(c, 2, "freqs")).size
    rotate = [seen("rope_rotate", "position 0 (the identity)", "range", lambda c: np.any(positions(c) == 0)),
              seen("rope_rotate", "a position ≥ 2^16 (a large angle)", "range", lambda c: np.any(positions(c) >= 2 ** 16)),
              seen("rope_rotate", "several positions at once", "layout", lambda c: np.unique(positions(c)).size >= 2)]

    def pair(which):                # a unit vector on channel 2i or 2i+1 of the rotated slice
        def pred(c):
            x, rd = np.asarray(arg(c, 0, "x")), 2 * np.asarray(arg(c, 2, "freqs")).size
            nz = np.nonzero(x[..., -rd:].reshape(-1, rd))[1]
            return nz.size and which(nz)
        return pred
    pairs = [seen("rope_rotate", "the first pair (channels 0, 1 of the slice)", "element", pair(lambda j: np.any(j // 2 == 0))),
             seen("rope_rotate", "the last pair (channels 62, 63 of the slice)", "element", pair(lambda j: np.any(j // 2 == 31))),
             seen("rope_rotate", "an odd channel (the imaginary part)", "element", pair(lambda j: np.any(j % 2 == 1))),
             seen("rope_rotate", "a channel of the second half (i + 32 under half-split pairing)", "element",
                  pair(lambda j: np.any(j >= 32)))]
    slice_ = [seen("rope_rotate", "channels before the rotated ones", "layout", lambda c: width(c)[0] > width(c)[1])]
    from ..spec import rope as spec_rope
    from ..spec.models import profile

    def compressed(c):              # YaRN is on exactly the layers with a compress ratio
        return bool(spec_rope.layer_rope(profile(arg(c, 0, "model")), int(arg(c, 1, "layer")))[1])
    uses = {"ROPE.THETA": [seen("rope_freqs", f"a {kind} layer", "range", lambda c, r=r: compressed(c) == r)
                           for kind, r in (("compressed", True), ("window-only", False))],
            "ROPE.YARN": [seen("rope_freqs", f"rope_freqs of {m}", "range", lambda c, m=m: arg(c, 0, "model") == m)
                          for m in ("v4-flash", "v4.1-flash")],
            "ROPE.SHARED": [seen("rope_freqs", "a use other than the main q", "layout", lambda c: arg(c, 2, "use")
                                 not in (None, "q"))]}
    layer = [seen("index_layer", "a layer from position 0 (prefill)", "range", lambda c: int(arg(c, 99, "start_pos") or 0) == 0),
             seen("index_layer", "a layer at a later start position (decode)", "range",
                  lambda c: int(arg(c, 99, "start_pos") or 0) > 0)] + layer_call_boundaries()[2:3]
    return {"ROPE.PAIRS": pairs + rotate[1:2], "ROPE.ROUNDING": rotate[1:2] + rotate[2:], "ROPE.SLICE": slice_,
            "ROPE.POSITIONS": layer, **uses}


def _blocks_apart(c) -> bool:
    x = np.abs(np.asarray(arg(c, 0, "x"), np.float64)).reshape(-1, 512)
    amax = x.reshape(x.shape[0], -1, 16).max(-1)
    return bool(np.any(amax.max(-1) >= 2.0 ** 12 * np.where(amax > 0, amax, np.inf).min(-1)))


def _layer_call(c):
    """(model profile, ratio, seqlen, start_pos) of an index_layer call."""
    from ..spec.models import profile
    m = profile(arg(c, 99, "model"))
    return m, m.ratio(int(arg(c, 99, "layer"))), int(np.shape(arg(c, 0, "inputs")["x"])[0]), int(arg(c, 99, "start_pos") or 0)


def layer_call_boundaries() -> list[Boundary]:
    """Where a layer's stages decide, as the drawn layer cases reach them (path.layer_keys)."""
    def entries(c):
        m, r, T, p = _layer_call(c)
        return (p + T) // r if r else 0

    def decode(pred):
        return lambda c: _layer_call(c)[3] > 0 and pred(*_layer_call(c))

    def prefill(pred):
        return lambda c: _layer_call(c)[3] == 0 and pred(*_layer_call(c))
    return [seen("index_layer", "decode after the ring wrapped (start ≥ 128)", "range", decode(lambda m, r, T, p: p >= m.window)),
            seen("index_layer", "decode while the ring fills (start < 128)", "range", decode(lambda m, r, T, p: p < m.window)),
            seen("index_layer", "decode completing an entry at ratio > 1 (start mod ratio = ratio − 1)", "range",
                 decode(lambda m, r, T, p: r > 1 and (p + 1) % r == 0)),
            seen("index_layer", "prefill at a multiple of the ratio > 1", "range", prefill(lambda m, r, T, p: r > 1 and T % r == 0)),
            seen("index_layer", "more compressed entries than the top-k", "range", lambda c: entries(c) > _layer_call(c)[0].index_topk),
            seen("index_layer", "V4.1 entries beyond the pool (16384)", "range", lambda c: _layer_call(c)[1] > 0 and entries(c) >
                 _layer_call(c)[0].candidate_topk_blocks * _layer_call(c)[0].candidate_block_size > 0)]


def published_k_boundaries() -> list[Boundary]:
    """Where PATH.K.PUBLISHED decides: a V4.1 source's decode step that publishes nothing, and there
    more entries than the top-k (the selection then follows the scored cache)."""
    from ..spec.path import reads_published_k

    def published(c):
        m, r, T, p = _layer_call(c)
        return reads_published_k(m, int(arg(c, 99, "layer")), T, p)
    return [seen("index_layer", "a V4.1 source decoding a step that completes no group", "range", published),
            seen("index_layer", "there more compressed entries than the top-k", "range",
                 lambda c: published(c) and (_layer_call(c)[3] + 1) // _layer_call(c)[1] > _layer_call(c)[0].index_topk)]


def path_boundaries() -> dict[str, list[Boundary]]:
    def start(c):
        return int(arg(c, 1, "start_pos"))

    def seqlen(c):
        return int(arg(c, 0, "seqlen"))
    window = [seen("window_index", "prefill longer than the window (128)", "range", lambda c: start(c) == 0 and seqlen(c) > 128),
              seen("window_index", "prefill within the window", "range", lambda c: start(c) == 0 and 0 < seqlen(c) <= 128),
              seen("window_index", "decode before the ring fills (start < 128)", "range", lambda c: 0 < start(c) < 128),
              seen("window_index", "decode after the ring wrapped (start ≥ 128)", "range", lambda c: start(c) >= 128)]
    hca = [seen("compressed_index", "decode at a start position not a multiple of the ratio", "range",
                lambda c: start(c) > 0 and start(c) % 128 != 0),
           seen("compressed_index", "prefill from 0", "range", lambda c: start(c) == 0)]
    layer = [seen("index_layer", f"an index_layer of {m}", "range", lambda c, m=m: arg(c, 99, "model") == m)
             for m in ("v4-flash", "v4-pro", "v4.1-flash")]
    drawn = layer_call_boundaries()
    def ring(name, pred):
        return seen("window_ring", name, "range", lambda c: pred(int(arg(c, 0, "prefill")), int(arg(c, 1, "decoded"))))
    rings = [ring("a prefill of at most 128 (no slot overwritten)", lambda p, d: p <= 128),
             ring("a prefill longer than 128 (the ring wrapped in the prefill)", lambda p, d: p > 128),
             ring("a prefill within 2 of 128", lambda p, d: abs(p - 128) <= 2),
             ring("decode that wraps the ring (p + d crosses a multiple of 128)", lambda p, d: d > 0 and (p - 1) // 128
                  != (p + d - 1) // 128),
             ring("no decode step", lambda p, d: d == 0)]

    def k_rows(name, level, pred):
        return seen("kv_qdq_fp4_e8m0", name, level, lambda c: pred(np.abs(np.asarray(arg(c, 0, "x"), np.float64))))

    def amaxes(a):
        return a.reshape(a.shape[0] if a.ndim > 1 else 1, -1, 32).max(-1)
    k_cache = [k_rows("several keys", "layout", lambda a: a.ndim > 1 and a.shape[0] >= 2),
               k_rows("blocks of 32 whose amax is 2^12 apart in one key", "scale",
                      lambda a: np.any(amaxes(a).max(-1) >= 2.0 ** 12 * np.where(amaxes(a) > 0, amaxes(a), np.inf).min(-1))),
               k_rows("a block with amax below 2^-30", "range", lambda a: np.any((amaxes(a) > 0) & (amaxes(a) < 2.0 ** -30)))]
    return {"PATH.WINDOW.RING": rings, "PATH.K.CACHE": k_cache, "PATH.POOL_SCAN": [b for b in reindex_boundaries("pool_scan_topk") if b.name != "an empty pool row"],
            "PATH.WINDOW": window, "PATH.HCA": hca,
            "PATH.CONCAT": [seen("attention_index", "decode (one row)", "layout", lambda c: int(arg(c, 2, "seqlen")) == 1),
                            seen("attention_index", "prefill (several rows)", "layout", lambda c: int(arg(c, 2, "seqlen")) > 1)],
            "PATH.QDQ": [seen(f"kv_qdq_{fmt}", f"kv_qdq_{fmt} of several rows", "layout", lambda c: _rows(c) >= 2)
                         for fmt in ("fp4_e4m3", "fp8_e8m0_32")] + [
                seen(f"kv_qdq_{fmt}", f"kv_qdq_{fmt} of blocks 2^12 apart in one row", "scale", _blocks_apart)
                for fmt in ("fp4_e4m3", "fp8_e8m0_32")],
            **{rule: layer + drawn for rule in ("PATH.Q.PROJ", "PATH.HADAMARD", "PATH.W.PROJ", "PATH.LAYER")},
            **{rule: layer[2:] + drawn for rule in ("PATH.K.PROJ", "PATH.K.NORM")},    # V4.1's index K
            "PATH.K.PUBLISHED": published_k_boundaries(),
            "PATH.ORDER": layer + drawn + [seen("rope_quantize", "rope_quantize at a position > 0", "range",
                                        lambda c: np.any(np.asarray(arg(c, 1, "positions")) > 0))]}


def attn_boundaries() -> dict[str, list[Boundary]]:
    """Where the sparse-attention clauses decide (spec/attn.py): −1 anywhere in a list, a row listed
    twice, V4.1's first block all −1, the row max in a later block of 64, the sink against the row
    max M (above the fp32 exp overflow, near M, far below), and each model."""
    from ..spec import attn as spec_attn
    from ..spec import rope as spec_rope
    from ..spec.models import profile

    def kernel(name, level, pred):
        return seen("sparse_attention", name, level, lambda c: pred(np.asarray(c.args[3]), c))

    def model(c):
        return arg(c, 5, "model")

    def row_max_at(c):                  # per (token, head): the list position of the row max
        s = spec_attn.scores(*(np.asarray(c.args[i], np.float64) for i in (0, 1, 3)), float(c.args[4]))
        return np.argmax(np.where(np.isfinite(s), s, -np.inf), axis=-1), s

    def sink_offset(c):                 # sink − M per (token, head)
        _, s = row_max_at(c)
        M = np.max(np.where(np.isfinite(s), s, -np.inf), axis=-1)
        with np.errstate(invalid="ignore"):
            return np.asarray(c.args[2], np.float64)[None, :] - M
    models = [kernel(f"sparse_attention of {m}", "range", lambda i, c, m=m: model(c) == m) for m in ("v4-flash", "v4.1-flash")]
    blocks = [kernel("a list of several blocks of 64", "layout", lambda i, c: i.shape[1] > spec_attn.BLOCK),
              kernel("a list whose last block is partial (K not a multiple of 64)", "layout",
                     lambda i, c: i.shape[1] % spec_attn.BLOCK != 0)]

    def leading(i):                     # −1 entries before the first valid one, per row
        valid = i != -1
        return np.where(valid.any(1), valid.argmax(1), i.shape[1])
    gather = [kernel("a −1 entry after a valid one", "element", lambda i, c: np.any(
                  (i == -1) & (np.arange(i.shape[1]) > leading(i)[:, None]))),
              kernel("a −1 entry in a later block of 64", "layout", lambda i, c: np.any(i[:, spec_attn.BLOCK:] == -1)),
              kernel("a list without −1", "element", lambda i, c: np.any((i != -1).all(1)))]

    def twice(i):
        return any(np.unique(r[r >= 0]).size < (r >= 0).sum() for r in i)
    init = [kernel("V4.1: a first block of 64 entries all −1", "range",
                   lambda i, c: model(c) in V41 and np.any(leading(i) >= spec_attn.BLOCK)),
            kernel("V4.1: fewer than 64 leading −1 entries", "range",
                   lambda i, c: model(c) in V41 and np.any((leading(i) > 0) & (leading(i) < spec_attn.BLOCK))),
            kernel("V4.1: a row without a valid entry", "range",
                   lambda i, c: model(c) in V41 and np.any((i == -1).all(1))),
            kernel("V4: a list that starts valid", "range", lambda i, c: model(c) in V4 and np.any(i[:, 0] >= 0))]
    later = [kernel("the row max in a later block of 64 than the first", "element",
                    lambda i, c: np.any(row_max_at(c)[0] >= spec_attn.BLOCK)),
             kernel("the row max on the first entry of a later block", "element",
                    lambda i, c: np.any((row_max_at(c)[0] >= spec_attn.BLOCK) & (row_max_at(c)[0] % spec_attn.BLOCK == 0)))]
    fl_scale = float(np.float32(512 ** -0.5))
    score = [kernel("the scale 512^-0.5", "scale", lambda i, c: float(c.args[4]) == fl_scale),
             kernel("a scale other than 512^-0.5 (the argument, not a constant)", "scale",
                    lambda i, c: float(c.args[4]) != fl_scale)]
    over = spec_attn.EXP_OVERFLOW
    sink = [kernel(f"sink − M > {over:.2f} (exp overflows: the output is 0)", "range",
                   lambda i, c: np.any(sink_offset(c) > over + spec_attn.EXP_UNDETERMINED)),
            kernel("0 < sink − M ≤ 88 (the sink outweighs the scores)", "range",
                   lambda i, c: np.any((sink_offset(c) > 0) & (sink_offset(c) <= 88))),
            kernel("|sink − M| ≤ 1 (the sink a term like the scores)", "element", lambda i, c: np.any(np.abs(sink_offset(c)) <= 1)),
            kernel("sink − M < −30 (a sink far below every score)", "range", lambda i, c: np.any(sink_offset(c) < -30))]
    shape = [kernel("several tokens and heads", "layout", lambda i, c: np.asarray(c.args[0]).shape[0] >= 2
                    and np.asarray(c.args[0]).shape[1] >= 2)]

    def scale_layers(compressed):
        return seen("attention_scale", f"attention_scale of a {'compressed' if compressed else 'window-only'} layer",
                    "range", lambda c: bool(profile(arg(c, 0, "model")).ratio(int(arg(c, 1, "layer")))) == compressed)

    def q_model(m):
        return seen("attention_q", f"attention_q of {m}", "range", lambda c: arg(c, 1, "model") == m)

    def heads_of_unequal_rms(c):
        q = np.asarray(arg(c, 0, "q"), np.float64)
        rms = np.sqrt((q * q).mean(-1))
        return np.any(rms.max(-1) >= 4 * np.maximum(rms.min(-1), 1e-30))

    def derot(name, level, pred):
        return seen("attention_output", name, level, lambda c: pred(np.asarray(arg(c, 1, "positions")),
                                                                    np.asarray(arg(c, 2, "freqs"))))
    window_table = spec_rope.frequencies_fp32(profile("v4-flash"), 0)
    derotate = [derot("a position ≥ 2^16 (a large angle)", "range", lambda p, f: np.any(p >= 2 ** 16)),
                derot("several positions at once", "layout", lambda p, f: np.unique(p).size >= 2),
                derot("a window-only layer's table", "range", lambda p, f: np.array_equal(f, window_table)),
                derot("a compressed layer's table (YaRN)", "range", lambda p, f: not np.array_equal(f, window_table))]
    layer = [seen("attention_layer", f"attention_layer of {m}", "range", lambda c, m=m: arg(c, 1, "model") == m)
             for m in ("v4-flash", "v4.1-flash")]
    layer += [seen("attention_layer", "attention_layer in prefill (start_pos 0)", "range",
                   lambda c: int(arg(c, 3, "start_pos") or 0) == 0),
              seen("attention_layer", "attention_layer in decode (start_pos > 0)", "range",
                   lambda c: int(arg(c, 3, "start_pos") or 0) > 0),
              seen("attention_layer", "a prefill with no compressed entry yet (seqlen < ratio)", "range",
                   _no_entry_yet)]
    return {"ATTN.GATHER": gather + blocks[:1] + models, "ATTN.DUPLICATES": [
                kernel("a row listed twice", "element", lambda i, c: twice(i)),
                kernel("a row listed twice, in different blocks of 64", "layout", lambda i, c: i.shape[1] > spec_attn.BLOCK
                       and twice(i) and any(np.intersect1d(r[:spec_attn.BLOCK][r[:spec_attn.BLOCK] >= 0],
                                                           r[spec_attn.BLOCK:]).size for r in i))] + models,
            "ATTN.INIT": init, "ATTN.SCORE": score + models, "ATTN.PROB.BF16": blocks + models,
            "ATTN.PROB.ORDER": later + models, "ATTN.RESCALE": later[:1] + blocks[:1] + models,
            "ATTN.SINK": sink + models, "ATTN.OUTPUT": shape + blocks[1:] + models,
            "ATTN.SCALE": [scale_layers(True), scale_layers(False)],
            "ATTN.Q_NORM": [q_model("v4-flash"), q_model("v4.1-flash"),
                            seen("attention_q", "heads of unequal RMS (4× apart)", "scale", heads_of_unequal_rms)],
            "ATTN.DEROTATE": derotate, "ATTN.LAYER": layer}


def _no_entry_yet(c) -> bool:
    """A prefill of a compressed layer shorter than its ratio: the official compressor returns None."""
    _, ratio, seqlen, start_pos = _layer_call(c)
    return start_pos == 0 and 0 < seqlen < ratio


def other_families() -> dict[str, list[Boundary]]:
    out = {}
    for part in (had_boundaries, cmp_boundaries, layout_boundaries, budget_boundaries, layer_boundaries,
                 rope_boundaries, path_boundaries, attn_boundaries):
        out.update(part())
    return out


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


def boundaries(rule_id: str) -> list[Boundary]:
    return BOUNDARIES.get(rule_id, [])


BOUNDARIES = {**_boundaries(), **other_families()}
REQUIRED = ("FMT", "FP4", "FP8", "IDX", "POOL")      # families whose ci coverage must be complete
OTHER = ("HAD", "CMP", "LAYOUT", "BUDGET", "LAYER", "ROPE", "PATH", "ATTN")   # the argument-level ones


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

RANDOM_REACH = 1 / 50       # each boundary reached by at least this share of a check's drawn examples


@dataclass
class RuleCoverage:
    rule_id: str
    reached: list[Boundary]
    missed: list[Boundary]
    calls: int
    drawn: dict = None      # boundary name -> the largest share of one check's drawn examples reaching it
    by_examples: frozenset = frozenset()    # names of the boundaries explicit @examples reach
    counts: dict = None     # boundary name -> (drawn examples reaching it, drawn examples) of that check
    strategy: dict = None   # layer boundary name -> the share of its layer strategy's own draws (strategy_rates)

    def random_rate(self, b: Boundary) -> float:
        return (self.drawn or {}).get(b.name, 0.0)

    def random_count(self, b: Boundary) -> tuple[int, int]:
        return (self.counts or {}).get(b.name, (0, 0))

    def strategy_rate(self, b: Boundary) -> float | None:
        return (self.strategy or {}).get(b.name)

    def reached_by(self, b: Boundary) -> str:
        """'drawn' (random draws reach it), 'examples' (explicit @examples only) or 'sweep' (a
        fixed, exhaustive sweep only)."""
        return "drawn" if self.random_rate(b) > 0 else "examples" if b.name in self.by_examples else "sweep"


def _per_drawn_example(calls) -> dict[str, list[list[Call]]]:
    """{check: [the calls of each of its drawn examples]}."""
    out: dict[str, dict[int, list[Call]]] = {}
    for c in calls:
        if c.drawn:
            out.setdefault(c.check, {}).setdefault(c.drawn, []).append(c)
    return {check: list(by.values()) for check, by in out.items()}


def random_counts(listed, calls, sample: int = 100) -> dict[str, tuple[int, int]]:
    """Per boundary, (reaching, drawn) for the check whose drawn examples reach it in the largest
    share (at most `sample` examples a check, evenly spaced; of a boundary read from one operation,
    only the checks that call it); (0, the most such a check drew) when no drawn example reaches it."""
    drawn = [c for c in calls if c.drawn]
    examples = {check: ex[::max(1, len(ex) // sample)] for check, ex in _per_drawn_example(calls).items()}
    calling = {op: [ex for ex in examples.values() if any(c.op == op for e in ex for c in e)]
               for op in {c.op for c in drawn}}
    counts = {}
    for b in listed:
        checks = calling.get(b.op, []) if b.op else list(examples.values())
        hits = [(sum(bool(b.reached(e)) for e in ex), len(ex)) for ex in checks] if b.reached(drawn) else []
        counts[b.name] = max(hits, key=lambda h: h[0] / h[1], default=(0, max(map(len, checks), default=0)))
    return counts


def random_rates(listed, calls, sample: int = 100) -> dict[str, float]:
    """Per boundary, the largest share of one check's drawn examples that reach it on their own
    (random_counts; 0 when no drawn example reaches it)."""
    return {name: hits / n if n else 0.0 for name, (hits, n) in random_counts(listed, calls, sample).items()}


# ---------------------------------------------------------------------------------------------
# The layer strategies, measured on their own
# ---------------------------------------------------------------------------------------------
# A layer check runs a whole layer an example, so ci draws 2 (dev 10, thorough 100): too few to show
# a rate of 1/50 from the checks' own draws.  The strategy itself is cheap: STRATEGY_DRAWS keys of
# path.layer_keys drawn as a dev run draws them (seed STRATEGY_SEED), each classified by the same
# boundaries as a call of the layer operations, and nothing run on them.
STRATEGY_DRAWS, STRATEGY_SEED = 400, 0
LAYER_OPS = MEMO_OPS


def drawn_values(strategy, draws: int = STRATEGY_DRAWS, seed: int = STRATEGY_SEED) -> list:
    """`draws` values of a strategy as a dev run with the seed `seed` generates them (the generate
    phase alone: no explicit example, no shrinking)."""
    from hypothesis import Phase, given, seed as seeded, settings
    from .suite import settings_for
    out = []

    @seeded(seed)
    @settings(settings_for("PATH.LAYER", "dev", shrink=False), max_examples=draws, phases=(Phase.generate,))
    @given(strategy)
    def draw(value):
        out.append(value)
    draw()
    return out


def layer_key_calls(key: tuple) -> list[Call]:
    """A layer key (model, layer, seqlen, start_pos, seed) as the calls of the layer operations the
    boundaries read (x of seqlen rows, the model, the layer and the start position)."""
    model, layer, seqlen, start_pos, _ = key
    inputs = {"x": np.empty((seqlen, 0), F32)}
    return [Call(op, (inputs,), dict(model=model, layer=layer, start_pos=start_pos), 1) for op in LAYER_OPS]


def layer_strategy_rules() -> dict[str, tuple]:
    """{rule: the layer kinds its layer check draws from (path.layer_keys)}."""
    from . import attn, path      # noqa: F401  (each registers its layer checks' kinds)
    return dict(path.LAYER_CHECK_KINDS)


_KEYS: dict = {}         # sorted kinds -> the default draws of layer_keys(kinds), once a process


def _layer_keys(kinds: tuple) -> list[tuple]:
    from .path import layer_keys
    key = tuple(sorted(kinds))
    if key not in _KEYS:
        _KEYS[key] = drawn_values(layer_keys(key))
    return _KEYS[key]


def strategy_rates(rule_id: str, keys: list | None = None) -> dict[str, float]:
    """Per layer boundary of the rule (one its layer operations decide), the share of its layer
    check's strategy draws that reach it (`keys`: the draws to classify, default that strategy's
    STRATEGY_DRAWS); {} for a rule without a layer check."""
    kinds = layer_strategy_rules().get(rule_id)
    if kinds is None:
        return {}
    keys = _layer_keys(kinds) if keys is None else keys
    calls = [layer_key_calls(k) for k in keys]
    return {b.name: sum(bool(b.reached(c)) for c in calls) / max(1, len(calls))
            for b in boundaries(rule_id) if b.op in LAYER_OPS}


def rarely_drawn_by_the_strategies(rates: dict | None = None) -> dict[str, dict[str, float]]:
    """{rule: {layer boundary: its strategy rate}} for those below RANDOM_REACH (`rates`: rule ->
    strategy_rates, default every rule with a layer check)."""
    rates = {r: strategy_rates(r) for r in layer_strategy_rules()} if rates is None else rates
    low = {rule: {name: rate for name, rate in by.items() if rate < RANDOM_REACH} for rule, by in rates.items()}
    return {rule: by for rule, by in low.items() if by}


def rule_coverage(rule_id: str, target: Target | None = None, profile: str = "ci",
                  memo: dict | None = None) -> RuleCoverage:
    """Run every check of the rule against the target (impl by default) and evaluate its boundaries,
    on every input and on the randomly drawn examples alone (`memo`: layer results shared by the
    rules of one run)."""
    recorder = Recorder(target or load_target("impl"), memo)
    for chk in checks_for(rule_id):
        recorder.check, recorder.drawn = chk.name, None      # None until an example starts: a sweep
        run_check(chk, recorder, profile)
    listed = boundaries(rule_id)
    hit = [b.reached(recorder.calls) for b in listed]
    explicit = [c for c in recorder.calls if c.drawn == 0]
    counts = random_counts(listed, recorder.calls)
    return RuleCoverage(rule_id, [b for b, h in zip(listed, hit) if h],
                        [b for b, h in zip(listed, hit) if not h], len(recorder.calls),
                        {name: h / n if n else 0.0 for name, (h, n) in counts.items()},
                        frozenset(b.name for b, h in zip(listed, hit) if h and b.reached(explicit)),
                        counts, strategy_rates(rule_id))


def coverage(prefixes=None, target: Target | None = None, profile: str = "ci", progress=None) -> list[RuleCoverage]:
    out, memo = [], {}
    target = target or load_target("impl")
    for r in select(prefixes):
        if r.id in BOUNDARIES:
            out.append(rule_coverage(r.id, target, profile, memo))
            if progress:
                progress(out[-1])
    return out


def _drawn(rc: RuleCoverage, b: Boundary) -> str:
    """How the checks' own drawn examples reach a boundary: a share, or 'k of n' where one check
    draws too few examples (under 50) for a share to say anything of 1/50."""
    hits, n = rc.random_count(b)
    return f"random draws {hits} of {n}" if n < 1 / RANDOM_REACH else f"random draws {hits / n:.1%}"


def _strategy(rc: RuleCoverage, b: Boundary) -> str:
    rate = rc.strategy_rate(b)
    return "" if rate is None else f"; the strategy {rate:.1%} of {STRATEGY_DRAWS} draws"


def render(results: list[RuleCoverage], show_reached: bool = False, show_clauses: bool = False) -> str:
    """Per rule: the boundaries reached (by any input; by random draws; by at least 1/50 of one
    check's drawn examples), then each one missed, reached only by explicit examples or fixed
    sweeps, or drawn too rarely, with --reached every one with its random reach, and with
    --clauses the statement's clauses beside the check and the mutants that fail when one changes.
    A layer boundary also shows the share of its layer strategy's own draws that reach it
    (strategy_rates): what a layer check draws per example, which ci's 2 draws cannot show."""
    from . import clauses as CL
    lines = []
    for rc in results:
        total = len(rc.reached) + len(rc.missed)
        by_draws = [b for b in rc.reached if rc.random_rate(b) > 0]
        often = [b for b in by_draws if rc.random_rate(b) >= RANDOM_REACH]
        strategy = [b for b in rc.reached + rc.missed if rc.strategy_rate(b) is not None]
        lines.append(f"{rc.rule_id:<22} {len(rc.reached):>3}/{total:<3} boundaries reached, "
                     f"{len(by_draws):>3} by random draws, {len(often):>3} in ≥ 1/50 of the draws ({rc.calls} calls)"
                     + (f"; {sum(rc.strategy_rate(b) >= RANDOM_REACH for b in strategy)}/{len(strategy)} layer "
                        f"boundaries in ≥ 1/50 of the strategy's {STRATEGY_DRAWS} draws" if strategy else ""))
        for b in sorted(rc.missed, key=lambda b: LEVELS.index(b.level)):
            lines.append(f"    MISSED        [{b.level}] {b.name}" + (f"  ({_strategy(rc, b)[2:]})" if _strategy(rc, b) else ""))
        for b in rc.reached:
            rate, strat = rc.random_rate(b), rc.strategy_rate(b)
            if show_reached:
                how = _drawn(rc, b) if rate else f"{rc.reached_by(b)} only"
                lines.append(f"    reached [{b.level}] {b.name}  ({how}{_strategy(rc, b)})")
            elif strat is not None and strat < RANDOM_REACH:
                lines.append(f"    rarely drawn  [{b.level}] {b.name}  ({_drawn(rc, b)}{_strategy(rc, b)})")
            elif rate == 0:
                lines.append(f"    {rc.reached_by(b) + ' only':<13} [{b.level}] {b.name}"
                             + (f"  ({_drawn(rc, b)}{_strategy(rc, b)})" if strat is not None else ""))
            elif rate < RANDOM_REACH:
                lines.append(f"    rarely {rate:6.1%} [{b.level}] {b.name}")
        if show_clauses:
            lines += CL.render(rc.rule_id, [chk.name for chk in checks_for(rc.rule_id)])
    reached = sum(len(rc.reached) for rc in results)
    drawn = sum(1 for rc in results for b in rc.reached if rc.random_rate(b) > 0)
    often = sum(1 for rc in results for b in rc.reached if rc.random_rate(b) >= RANDOM_REACH)
    missed = sum(len(rc.missed) for rc in results)
    layer = [rc.strategy_rate(b) for rc in results for b in rc.reached + rc.missed if rc.strategy_rate(b) is not None]
    lines.append(f"\n{len(results)} rules, {reached} boundaries reached ({drawn} by random draws, {often} in "
                 f"≥ 1/50 of them), {missed} missed"
                 + (f"; {sum(r >= RANDOM_REACH for r in layer)}/{len(layer)} layer boundaries in ≥ 1/50 of their "
                    f"strategy's {STRATEGY_DRAWS} draws" if layer else ""))
    return "\n".join(lines)
