"""RoPE mutants: one realistic mistake each, with the rule that must report it."""
import torch

from dsv4spec.impl import rope as ref

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
