"""No admitted set without a representable value: around every exact value a tolerance judge can
meet, |got − centre| ≤ tol admits at least one value of the output's dtype (the nearest one: if it
is outside, every other one is too).  JUDGES lists every judge of spec/ and properties/ (a test
finds them in the code by name), each with a probe drawing inputs whose exact results land on BF16 or
fp32 midpoints, next to them, at tiny and huge magnitudes and among subnormals.
"""
import ast
from pathlib import Path

import numpy as np
import pytest

from dsv4spec.properties import quant as pquant
from dsv4spec.spec import attn as sattn
from dsv4spec.spec import indexer as sidx
from dsv4spec.spec import path as spath
from dsv4spec.spec import rope as srope
from dsv4spec.spec.indexer import bf16_quantum, round_bf16
from dsv4spec.spec.models import profile

ROOT = Path(__file__).resolve().parents[1]
SCALES = [2.0 ** e for e in (-200, -160, -133, -130, -126, -100, -60, -20, -6, 0, 6, 20, 60, 100, 120)]


def _round(x, dtype):
    return round_bf16(x) if dtype == "bf16" else np.asarray(x, np.float32).astype(np.float64)


def _midpoints(rng, n, scale):
    """BF16 a, b with a + b on a BF16 midpoint, half of them one 2^-8 of a half-ulp past it."""
    a = round_bf16(rng.standard_normal(n) * scale)
    half = bf16_quantum(a) / 2
    b = np.where(rng.random(n) < 0.5, half, round_bf16(half * (1 + 2.0 ** -7))) * np.sign(rng.standard_normal(n))
    return a, round_bf16(b)


def matmul_probe(rng, scale):
    a, b = _midpoints(rng, 64, scale)
    x, w = np.stack([a, b], -1), np.ones((1, 2))
    return a + b, spath.matmul_tolerance(x, w)[:, 0], "bf16"


def rms_norm_probe(rng, scale):
    x, w = round_bf16(rng.standard_normal((8, 16)) * scale), round_bf16(rng.standard_normal(16))
    return spath.rms_norm(x, w, 1e-6), spath.rms_norm_tolerance(x, w, 1e-6), "bf16"


def rotate_probe(rng, scale):
    x = round_bf16(rng.standard_normal((8, 64)) * scale)
    positions, freqs = rng.integers(0, 2 ** 16, 8), srope.frequencies_fp32(profile("v4-flash"), 2)
    return srope.rotate_exact(x, positions, freqs), srope.rotate_tolerance(x, positions, freqs), "bf16"


def hadamard_probe(rng, scale):
    a, b = _midpoints(rng, 8, scale)
    x = np.zeros((8, 128))
    x[:, 0], x[:, 1] = a * np.sqrt(128.0), b * np.sqrt(128.0)     # exact = (a ± b) on channels 0, 1
    x = round_bf16(x)
    exact = (x @ sidx.sylvester_hadamard(128).T) * sidx.HADAMARD_SCALE
    return exact, sidx.hadamard_tolerance(x), "bf16"


def _score_inputs(rng, scale):
    q = round_bf16(rng.standard_normal((2, 4, 8)) * np.sqrt(scale))
    k = round_bf16(rng.standard_normal((3, 8)) * np.sqrt(scale))
    return q, k, round_bf16(rng.standard_normal((2, 4)))


def index_score_probe(rng, scale):
    q, k, w = _score_inputs(rng, scale)
    return sidx.index_scores(q, k, w, np.array([3, 3]), "bf16"), sidx.index_score_tolerance(q, k, w, "bf16"), "bf16"


def index_score_fp32_probe(rng, scale):
    q, k, w = _score_inputs(rng, scale)
    exact = (np.maximum(np.einsum("thd,sd->ths", q, k), 0.0) * w[..., None]).sum(axis=1)
    return exact, sidx.index_score_tolerance(q, k, w, "fp32"), "fp32"


def q_rescale_probe(rng, scale):
    """ATTN.Q_NORM's set is exact, bf16(q·r) for each BF16 factor r from q_rescale_factors' lo to hi:
    its own lowest member must be admitted (an empty range of factors admits nothing)."""
    q = round_bf16(rng.standard_normal((2, 3, 64)) * scale)
    m = profile("v4-flash")
    lo, _ = sattn.q_rescale_factors(q, m)
    got = round_bf16(q * lo)
    return got, sattn.q_rescale_admitted(got, q, m)


def row_parallel_probe(rng, scale):
    """ATTN.TP.REDUCE: the official all-reduce's result, fp32 sums of the ranks' BF16 partials in rank
    order then one BF16 rounding, is a member of the set."""
    partials = round_bf16(rng.standard_normal((3, 4, 8)) * scale)
    total = partials[0].astype(np.float32)
    for p in partials[1:]:
        total = (total + p.astype(np.float32)).astype(np.float32)
    got = round_bf16(total.astype(np.float64))
    return got, sattn.admitted(got, *sattn.row_parallel_bounds(partials))


def attn_bounds_probe(rng, scale):
    q, kv = round_bf16(rng.standard_normal((2, 3, 16)) * scale), round_bf16(rng.standard_normal((5, 16)) * scale)
    idx = np.array([[0, 1, 2, -1], [4, 3, -1, -1]])
    lo, hi = sattn.bounds(q, kv, rng.standard_normal(3), idx, 0.25, -np.inf)
    lo, hi = round_bf16(lo), round_bf16(hi)        # sattn.admitted: the BF16 values of [bf16(lo), bf16(hi)]
    return (lo + hi) / 2, (hi - lo) / 2, "bf16"


def fp8_linear_probe(rng, scale):
    w, w_scale = pquant.fp8_weight(rng, 128, 128, 128)
    x = pquant.fp8_activation(rng, (4, 128), 3) * np.float32(min(max(scale, 2.0 ** -60), 2.0 ** 60))
    exact, tol = pquant.fp8_linear_bounds(round_bf16(x), w, w_scale, 128)
    return exact, tol, "bf16"


def entry_probe(rng, scale):
    from dsv4spec.properties.compressor import make_case
    from dsv4spec.spec import compressor as scomp
    x_scale = min(max(scale, 2.0 ** -60), 2.0 ** 60)             # fp32 x·W must not overflow
    case = make_case("v4-flash", 4, 12, int(rng.integers(2 ** 31)), x_scale=x_scale)
    return (scomp.compress(case.x, case.params, case.model, case.ratio),
            scomp.entry_tolerance(case.x, case.params, case.model, case.ratio), "bf16")


def compressed_rope_probe(rng, scale):
    from dsv4spec.spec import compressor as scomp
    plain = round_bf16(rng.standard_normal((2, 8, 16)) * scale)
    positions, freqs = np.arange(8) * int(rng.integers(1, 129)), scomp.rope_frequencies(8, 10000.0)
    return scomp.rope(plain, positions, freqs), scomp.rope_tolerance(plain, positions, freqs), "bf16"


JUDGES = {      # every judge -> its probe, or why its admitted set needs none of its own
    "spec/path.py:matmul_tolerance": matmul_probe,
    "spec/path.py:rms_norm_tolerance": rms_norm_probe,
    "spec/rope.py:rotate_tolerance": rotate_probe,
    "spec/indexer.py:hadamard_tolerance": hadamard_probe,
    "spec/indexer.py:index_score_tolerance": (index_score_probe, index_score_fp32_probe),
    "spec/indexer.py:index_score_allreduce_tolerance": "added to index_score_tolerance's (never alone)",
    "spec/attn.py:q_rescale_admitted": q_rescale_probe,
    "spec/attn.py:admitted": "the BF16 values of [bf16(lo), bf16(hi)] of spec/attn.py:bounds (probed there)",
    "properties/attn.py:_linear_bounds": "caches fp8_linear_bounds",
    "spec/document.py:_tolerance": "renders a rule's tolerance text (not a judge)",
    "spec/rules.py:shared_tolerance": "names a tolerance text SPEC.md states once (not a judge)",
    "spec/attn.py:bounds": attn_bounds_probe,
    "spec/attn.py:row_parallel_bounds": row_parallel_probe,
    "properties/quant.py:fp8_linear_bounds": fp8_linear_probe,
    "properties/path.py:_q_bounds": "caches fp8_linear_bounds",
    "spec/compressor.py:entry_tolerance": entry_probe,
    "spec/compressor.py:pooled_tolerance": "entry_tolerance's first part (probed there); judged alone on a trace's "
                                           "cmp_pooled, which the control trace passes (tests/test_trace.py)",
    "spec/compressor.py:norm_tolerance": "entry_tolerance's second part (probed there); judged alone on a trace's "
                                         "cmp_normed, which the control trace passes (tests/test_trace.py)",
    "spec/compressor.py:rope_tolerance": compressed_rope_probe,
    # a declared precision choice (rope_table, compressor_pooling, attn_scores, attn_probs) only adds
    # non-negative terms to these judges: their admitted sets hold the canonical ones, probed above
    "properties/compressor.py:_tolerance": "entry_tolerance at the declared compressor_pooling (probed there)",
}


def _judges_in_code() -> set[str]:
    found = set()
    for folder in ("spec", "properties"):
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and (node.name.endswith(("_tolerance", "_bounds", "_admitted"))
                                                          or node.name in ("bounds", "admitted")):
                    found.add(f"{folder}/{path.name}:{node.name}")
    return found


def test_every_judge_is_listed():
    assert _judges_in_code() == set(JUDGES), "list each new judge in JUDGES with a probe"


PROBES = [(name, p) for name, probes in JUDGES.items() if not isinstance(probes, str)
          for p in (probes if isinstance(probes, tuple) else (probes,))]


@pytest.mark.parametrize("name, probe", PROBES, ids=[p.__name__ for _, p in PROBES])
@pytest.mark.parametrize("scale", SCALES)
def test_admitted_set_holds_a_value_of_the_dtype(name, probe, scale):
    rng = np.random.default_rng(int(np.log2(scale)) + 200)
    result = probe(rng, scale)
    if len(result) == 2:                      # an exact set, probed with one of its own members
        got, admitted = result
        assert np.asarray(admitted).all(), f"{name}: the set leaves out its own member {np.asarray(got).ravel()[:4]}"
        return
    centre, tol, dtype = result
    centre, tol = np.broadcast_arrays(np.asarray(centre, np.float64), np.asarray(tol, np.float64))
    finite = np.isfinite(centre) & (np.abs(_round(centre, dtype)) < np.inf)
    near = _round(centre, dtype)
    bad = finite & ~(np.abs(near - centre) <= tol)
    assert not bad.any(), (f"{name}: {int(bad.sum())} admitted sets hold no {dtype} value; e.g. centre "
                           f"{centre[bad][0]!r} ± {tol[bad][0]:.3g}, the nearest {dtype} {near[bad][0]!r}")


def test_the_layers_derotation_admits_the_official_value_beside_a_bf16_midpoint():
    """Issue 33's element: V4-Pro layer 2 at position 27, o pair (−0.1650390625, 0.49609375); the exact
    de-rotated odd channel 0.0129111… lies 2.2e-6 above a BF16 midpoint and the official
    apply_rotary_emb(..., inverse=True) gives its upper neighbour 0.012939453125."""
    o = np.zeros((1, 1, 512))
    o[0, 0, 448:450] = -0.1650390625, 0.49609375
    freqs, positions = srope.frequencies_fp32(profile("v4-pro"), 2), np.array([-27])
    exact = srope.rotate_exact(o, positions, freqs)[0, 0, 449]
    tol = srope.rotate_tolerance(o, positions, freqs)[0, 0, 449]
    assert abs(exact - 0.012911149476) < 1e-11 and abs(0.012939453125 - exact) <= tol
