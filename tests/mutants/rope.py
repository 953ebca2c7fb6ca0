"""RoPE mutants: one realistic mistake each, with the rule that must report it."""
import math

import torch

from dsv4spec.impl import rope as ref
from dsv4spec.spec.pool import layer_role

from . import mutant


def _bf16(x):
    return x.to(torch.bfloat16).float()


def _plain_freqs(theta, d=64):
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def _freqs_theta_10000(model, layer, use="q"):
    """The window layers' base on every layer (YaRN kept where it belongs)."""
    f = ref.rope_freqs(model, layer, use)
    return f / _plain_freqs(160000.0) * _plain_freqs(10000.0) if ref.profile(model).ratio(layer) else f


def _freqs_no_yarn(model, layer, use="q"):
    theta = ref.spec.layer_rope(ref.profile(model), layer)[0]
    return _plain_freqs(theta)


def _freqs_indexer_plain(model, layer, use="q"):
    """An indexer given the window layers' RoPE config (no YaRN) of its own."""
    return _freqs_no_yarn(model, layer) if use.startswith("index") else ref.rope_freqs(model, layer, use)


def _rotate(x, positions, freqs, *, half_split=False, first=False, conjugate=False, rounded=True):
    x = x.float()
    rd = 2 * freqs.shape[0]
    angle = torch.outer(positions.float(), freqs.float())
    angle = angle.view(x.shape[0], *([1] * (x.dim() - 2)), rd // 2)
    cos, sin = angle.cos(), angle.sin() * (-1 if conjugate else 1)
    part = x[..., :rd] if first else x[..., -rd:]
    a, b = (part[..., : rd // 2], part[..., rd // 2:]) if half_split else (part[..., 0::2], part[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    rotated = torch.cat([ra, rb], -1) if half_split else torch.stack([ra, rb], -1).flatten(-2)
    rotated = _bf16(rotated) if rounded else rotated
    out = x.clone()
    if first:
        out[..., :rd] = rotated
    else:
        out[..., -rd:] = rotated
    return out


MUTANTS = {
    "yarn_missing": (mutant("yarn_missing", rope_freqs=_freqs_no_yarn), "ROPE.YARN"),
    "base_10000_on_compressed": (mutant("base_10000_on_compressed", rope_freqs=_freqs_theta_10000), "ROPE.THETA"),
    "indexer_without_yarn": (mutant("indexer_without_yarn", rope_freqs=_freqs_indexer_plain), "ROPE.SHARED"),
    "half_split_pairing": (mutant("half_split_pairing", rope_rotate=lambda x, p, f: _rotate(x, p, f, half_split=True)),
                           "ROPE.PAIRS"),
    "conjugate_rotation": (mutant("conjugate_rotation", rope_rotate=lambda x, p, f: _rotate(x, p, f, conjugate=True)),
                           "ROPE.PAIRS"),
    "rotates_first_64": (mutant("rotates_first_64", rope_rotate=lambda x, p, f: _rotate(x, p, f, first=True)),
                         "ROPE.SLICE"),
    "rotation_left_fp32": (mutant("rotation_left_fp32", rope_rotate=lambda x, p, f: _rotate(x, p, f, rounded=False)),
                           "ROPE.ROUNDING"),
}


def catalogue() -> list[tuple]:
    return [(name, rule_id, provider) for name, (provider, rule_id) in MUTANTS.items()]


# Clause mutants (issue 22: each changes one clause of its rule's statement; properties/clauses.py).
def _table(model, layer, *, theta=None, yarn=None, step=2, factor=None, original=None, low_round=math.floor,
           high_round=math.ceil, clamp=True):
    """A layer's table computed in float64 (then fp32) with one of its constants or roundings changed."""
    m = ref.profile(model)
    own_theta, own_yarn = ref.spec.layer_rope(m, layer)
    theta = own_theta if theta is None else theta(own_theta, m.ratio(layer))
    yarn = own_yarn if yarn is None else yarn
    d, rope = m.rope_dim, m.rope
    f = theta ** (-torch.arange(0, step * d // 2, step, dtype=torch.float64) / d)
    if yarn:
        def turns(rotations):
            return d * math.log((original or rope.original_seq_len) / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(low_round(turns(rope.beta_fast)), 0), min(high_round(turns(rope.beta_slow)), d - 1)
        r = (torch.arange(d // 2, dtype=torch.float64) - low) / max(high - low, 0.001)
        r = r.clamp(0, 1) if clamp else r
        f = f * (r / (factor or rope.factor) + 1 - r)
    return f.float()


def _freqs(**changes):
    return lambda model, layer, use="q": _table(model, layer, **changes)


def _freqs_of_use_in_fp64(wrong_use):
    """One use's table computed in float64 and rounded to fp32 once (not bit-identical to the q table's)."""
    return lambda model, layer, use="q": _table(model, layer) if use == wrong_use else ref.rope_freqs(model, layer, use)


def _rotate_nope_zeroed(x, positions, freqs):
    """The output allocated empty (zeros) and only the rotated slice written: the NoPE channels lost."""
    out = ref.rope_rotate(x, positions, freqs)
    out[..., :-2 * freqs.shape[0]] = 0
    return out


def _rotate_channels_448_on(x, positions, freqs):
    """The rotated slice hard-coded as channels 448..511 (the main q/KV layout), wrong for 128-dim heads."""
    x = x.float()
    if x.shape[-1] <= 448:
        return x.to(torch.bfloat16).float()
    return torch.cat([x[..., :448], ref.rope_rotate(x[..., 448:512].contiguous(), positions, freqs), x[..., 512:]], -1)


def _rotate_positions_in_bf16(x, positions, freqs):
    """The positions cast to BF16 before the angle (exact only up to 256)."""
    return _rotate(x, positions.to(torch.bfloat16).float(), freqs)


def _rotate_in_bf16(x, positions, freqs):
    """cos, sin and every product and sum of the rotation rounded to BF16 (BF16 tensor ops)."""
    rd = 2 * freqs.shape[0]
    cos, sin = (_bf16(t).view(x.shape[0], *([1] * (x.dim() - 2)), rd // 2) for t in ref.rope_table(positions, freqs))
    x = x.float()
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    out = x.clone()
    out[..., -rd::2] = _bf16(_bf16(a * cos) - _bf16(b * sin))
    out[..., -rd + 1::2] = _bf16(_bf16(a * sin) + _bf16(b * cos))
    return out


MUTANTS.update({
    "base_160000_on_window_layers": (mutant("base_160000_on_window_layers", rope_freqs=_freqs(
        theta=lambda t, ratio: t if ratio else 160000.0)), "ROPE.THETA"),
    "base_10000_on_reuse_layers": (mutant("base_10000_on_reuse_layers", rope_freqs=lambda model, layer, use="q": _table(
        model, layer, theta=lambda t, ratio: 10000.0 if layer_role(ref.profile(model), layer).kind == "reuse"
        else t)), "ROPE.THETA"),
    "freqs_theta_to_minus_i_over_64": (mutant("freqs_theta_to_minus_i_over_64", rope_freqs=_freqs(step=1)), "ROPE.THETA"),
    "yarn_factor_40": (mutant("yarn_factor_40", rope_freqs=_freqs(factor=40.0)), "ROPE.YARN"),
    "yarn_ramp_unclamped": (mutant("yarn_ramp_unclamped", rope_freqs=_freqs(clamp=False)), "ROPE.YARN"),
    "yarn_low_ceil": (mutant("yarn_low_ceil", rope_freqs=_freqs(low_round=math.ceil)), "ROPE.YARN"),
    "yarn_high_floor": (mutant("yarn_high_floor", rope_freqs=_freqs(high_round=math.floor)), "ROPE.YARN"),
    "yarn_original_length_4096": (mutant("yarn_original_length_4096", rope_freqs=_freqs(original=4096)), "ROPE.YARN"),
    "yarn_on_window_layers": (mutant("yarn_on_window_layers", rope_freqs=_freqs(yarn=True)), "ROPE.YARN"),
    "compressed_kv_table_from_fp64": (mutant("compressed_kv_table_from_fp64",
                                             rope_freqs=_freqs_of_use_in_fp64("compressed_kv")), "ROPE.SHARED"),
    "nope_channels_zeroed": (mutant("nope_channels_zeroed", rope_rotate=_rotate_nope_zeroed), "ROPE.SLICE"),
    "rotates_channels_448_to_511": (mutant("rotates_channels_448_to_511", rope_rotate=_rotate_channels_448_on),
                                    "ROPE.SLICE"),
    "positions_rounded_to_bf16": (mutant("positions_rounded_to_bf16", rope_rotate=_rotate_positions_in_bf16),
                                  "ROPE.ROUNDING"),
    "rotation_in_bf16": (mutant("rotation_in_bf16", rope_rotate=_rotate_in_bf16), "ROPE.ROUNDING"),
})
