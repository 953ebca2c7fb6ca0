"""Sparse attention: the definition by hand, the policy's claims (other blockings and accumulation
orders pass, the official blocks of 64 alone pass ATTN.PROB.ORDER), edge cases, clear errors."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import dsv4spec.impl as impl
import dsv4spec.official as official
from dsv4spec.properties import attn as checks
from dsv4spec.properties.path import FIXED_LAYERS
from dsv4spec.properties.suite import FAIL, PASS, VARIANT, run_rule
from dsv4spec.properties.target import Target
from dsv4spec.spec import RULES
from dsv4spec.spec import attn as spec
from dsv4spec.spec.models import profile
from mutants import attn as attn_mutants
from mutants import mutant

V41, V4 = profile("v4.1-flash"), profile("v4-flash")


def test_one_block_by_hand():
    # two rows, scores 0 and ln 2 (scale 1): p = (1/2, 1) against the max, sink 0 adds e^(0 − ln 2) = 1/2
    q = np.array([[[1.0, 0.0]]])
    kv = np.array([[0.0, 3.0], [math.log(2), 5.0]])
    o = spec.reference(q, kv, np.array([0.0]), np.array([[0, 1]]), 1.0, spec.V41_INIT)
    p0 = float(spec.round_bf16(np.exp(-float(np.float32(math.log(2))))))      # bf16(1/2) = 1/2
    denominator = 0.5 + 1.0 + 0.5
    assert o[0, 0, 1] == pytest.approx((p0 * 3.0 + 5.0) / denominator, rel=1e-6)


def test_early_probabilities_are_rounded_against_the_running_max():
    s = np.full((1, 1, 130), -5.0)
    s[0, 0, 0], s[0, 0, 70] = -1.0, 2.0
    m = spec.running_maxima(s, -np.inf)
    assert np.all(m[..., :64] == -1.0) and np.all(m[..., 64:] == 2.0)


def test_v4_first_block_without_a_valid_entry_is_nan_and_v41_is_not():
    q = np.ones((1, 2, 4))
    kv = np.ones((3, 4))
    idx = np.full((1, 70), -1)
    idx[0, 65] = 2
    assert np.isnan(spec.reference(q, kv, np.zeros(2), idx, 0.5, -np.inf)).all()
    o = spec.reference(q, kv, np.zeros(2), idx, 0.5, spec.V41_INIT)
    assert np.allclose(o, 1 / (1 + np.exp(-2.0)))
    assert np.all(spec.reference(q, kv, np.zeros(2), np.full((1, 5), -1), 0.5, spec.V41_INIT) == 0)


def test_sink_far_above_overflows_to_zero():
    q, kv = np.ones((1, 1, 4)), np.ones((2, 4))
    o = spec.reference(q, kv, np.array([200.0]), np.array([[0, 1]]), 0.5, spec.V41_INIT)
    assert np.all(o == 0)


def test_scale_has_no_yarn_factor():
    for m in (V4, V41):
        assert spec.softmax_scale(m) == float(np.float32(512 ** -0.5))


def _blocked(q, kv, sink, indices, scale, *, model, width=64, split=False, reverse_sum=False):
    """A conforming kernel of another shape: blocks of `width` (list order), or the list split in
    two halves reduced separately and merged (split-K), or the block sums added in reverse."""
    q, kv, sink, indices, scale = impl.attn.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    # a split kernel needs a finite start: a chunk may hold no valid entry
    init = spec.V41_INIT if split else spec.running_max_init(profile(model))

    def reduce(idx):
        T, H, D = q.shape
        acc, total, m = torch.zeros(T, H, D), torch.zeros(T, H), torch.full((T, H), init)
        for start in range(0, idx.shape[1], width):
            blk = idx[:, start:start + width]
            valid = blk != -1
            rows = kv[blk.clamp_min(0)] * valid[..., None]
            s = (torch.einsum("thd,tbd->thb", q, rows) * scale).masked_fill(~valid[:, None, :], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            r = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            part = p.flip(-1).sum(-1) if reverse_sum else p.sum(-1)
            total = total * r + part
            acc = acc * r[..., None] + torch.einsum("thb,tbd->thd", p.bfloat16().float(), rows)
            m = m_new
        return acc, total, m

    if split and indices.shape[1] > 1:
        half = indices.shape[1] // 2
        (a1, t1, m1), (a2, t2, m2) = reduce(indices[:, :half]), reduce(indices[:, half:])
        m = torch.maximum(m1, m2)
        r1, r2 = torch.nan_to_num(torch.exp(m1 - m)), torch.nan_to_num(torch.exp(m2 - m))
        acc, total = a1 * r1[..., None] + a2 * r2[..., None], t1 * r1 + t2 * r2
    else:
        acc, total, m = reduce(indices)
    total = total + torch.exp(sink[None, :] - m)
    return (acc / total[..., None]).bfloat16().float()


KERNEL_RULES = [r for r in sorted(RULES) if r.startswith("ATTN.") and RULES[r].status != "informative" and r not in
                ("ATTN.HEADS", "ATTN.SCALE", "ATTN.Q_NORM", "ATTN.DEROTATE", "ATTN.LAYER")]


@pytest.mark.parametrize("shape", [dict(width=32), dict(width=128), dict(reverse_sum=True)],
                         ids=["width32", "width128", "reversed_sums"])
def test_other_list_order_blockings_pass_every_rule_but_the_order(shape):
    target = mutant("other_blocking", sparse_attention=lambda *a, **k: _blocked(*a, **k, **shape))
    for rule_id in KERNEL_RULES:
        status = run_rule(rule_id, Target(target, "other_blocking")).status
        want = FAIL if rule_id == "ATTN.PROB.ORDER" and "width" in shape else PASS
        assert status == want, (rule_id, status)
    declared = mutant("declared", variants={"attn_order": "list_order"},
                      sparse_attention=lambda *a, **k: _blocked(*a, **k, **shape))
    assert run_rule("ATTN.PROB.ORDER", Target(declared, "declared")).status in (VARIANT, PASS)


def _flashmla_pairs(q, kv, sink, indices, scale, *, model):
    """FlashMLA's SM90 sparse prefill order (csrc/sm90/prefill/sparse/phase1.cuh at 9241ae3e): blocks
    of 64 in pairs, one a warpgroup, V's channels split in halves.  The even block's probabilities
    are rounded against the max after it for channels below D/2 (L144-173, L326) and, scaled from
    fp32 to the max after the odd block, rounded again for the upper half (L283-291, L333-341, L422)."""
    q, kv, sink, indices, scale = impl.attn.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    T, H, D = q.shape
    acc, total = torch.zeros(T, H, D), torch.zeros(T, H)
    m = torch.full((T, H), spec.running_max_init(profile(model)))
    upper = torch.arange(D) >= D // 2

    def block(start):
        blk = indices[:, start:start + 64]
        valid = blk != -1
        rows = kv[blk.clamp_min(0)] * valid[..., None]
        s = (torch.einsum("thd,tbd->thb", q, rows) * scale).masked_fill(~valid[:, None, :], float("-inf"))
        return s, rows

    for start in range(0, indices.shape[1], 128):
        s_even, rows_even = block(start)
        m_even = torch.maximum(m, s_even.amax(-1))
        p_even = torch.exp(s_even - m_even[..., None])
        total = total * torch.exp(m - m_even) + p_even.sum(-1)
        acc = acc * torch.exp(m - m_even)[..., None]
        lower_part = torch.einsum("thb,tbd->thd", p_even.bfloat16().float(), rows_even)
        m = m_even
        if start + 64 < indices.shape[1]:
            s_odd, rows_odd = block(start + 64)
            m_odd = torch.maximum(m, s_odd.amax(-1))
            r = torch.exp(m - m_odd)
            p_odd = torch.exp(s_odd - m_odd[..., None])
            total = total * r + p_odd.sum(-1)
            upper_part = torch.einsum("thb,tbd->thd", (p_even * r[..., None]).bfloat16().float(), rows_even)
            even = torch.where(upper, upper_part, lower_part * r[..., None])
            acc = acc * r[..., None] + even + torch.einsum("thb,tbd->thd", p_odd.bfloat16().float(), rows_odd)
            m = m_odd
        else:
            acc = acc + lower_part
    total = total + torch.exp(sink[None, :] - m)
    return (acc / total[..., None]).bfloat16().float()


def test_flashmla_order_fails_only_the_order_and_is_the_list_order_variant():
    """What the H100 record found (docs/PRODUCTION.md): FlashMLA's order FAILs ATTN.PROB.ORDER alone;
    a port that rounds so and says so (attn_order = list_order) reads VARIANT there."""
    target = Target(mutant("flashmla_pairs", sparse_attention=_flashmla_pairs), "flashmla_pairs")
    for rule_id in KERNEL_RULES:
        status = run_rule(rule_id, target).status
        assert status == (FAIL if rule_id == "ATTN.PROB.ORDER" else PASS), (rule_id, status)
    declared = mutant("declared", variants={"attn_order": "list_order"}, sparse_attention=_flashmla_pairs)
    assert run_rule("ATTN.PROB.ORDER", Target(declared, "declared")).status == VARIANT


# ~20 s: make test keeps the emulation's verdicts (above) and the decode record's pin; make thorough pins this one
@pytest.mark.thorough
def test_flashmla_order_on_flashmlas_shapes_gives_what_the_h100_gave():
    """The ci check fitted to FlashMLA's SHAPES (docs/records/h100/2026-12-05-verify-flashmla-ci-attn.json):
    the emulation above fails on the same outputs with the same values as the library did."""
    emulated = mutant("flashmla_pairs", sparse_attention=_flashmla_pairs)
    emulated.SHAPES = {"sparse_attention": {"D": (512,), "H": (64, 128), "K": 128}}
    row = run_rule("ATTN.PROB.ORDER", Target(emulated, "flashmla_pairs"))
    seen = ("197 of 32768 outputs outside the admitted BF16 interval; at token 0 head 0 channel 264: "
            "got np.float64(0.00946044921875)")
    record = Path(__file__).resolve().parents[1] / "docs/records/h100/2026-12-05-verify-flashmla-ci-attn.json"
    fails = [r["detail"] for r in json.loads(record.read_text())["results"] if r["rule"] == "ATTN.PROB.ORDER"]
    assert fails and seen in fails[0], "the library's own FAIL"
    assert row.status == FAIL and seen in row.detail, row.detail


def _flashmla_decode_splits(q, kv, sink, indices, scale, *, model):
    """FlashMLA's SM90 sparse FP8 decode order as the H100 record shows it (csrc/sm90/decode/sparse_fp8/
    splitkv_mla.cuh at 9241ae3e): each block of 64 of a token's list in a split of its own (num_sm_parts,
    L770), its probabilities rounded to BF16 against that split's running max (scale_softmax L55-80), the
    splits' fp32 partial sums and outputs then combined against the largest max."""
    q, kv, sink, indices, scale = impl.attn.check_attention_inputs("sparse_attention", q, kv, sink, indices, scale)
    T, H, D = q.shape
    init = spec.running_max_init(profile(model))
    parts = []
    for start in range(0, indices.shape[1], 64):
        blk = indices[:, start:start + 64]
        valid = blk != -1
        rows = kv[blk.clamp_min(0)] * valid[..., None]
        s = (torch.einsum("thd,tbd->thb", q, rows) * scale).masked_fill(~valid[:, None, :], float("-inf"))
        m = torch.maximum(torch.full((T, H), init), s.amax(-1))
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        parts.append((torch.einsum("thb,tbd->thd", p.bfloat16().float(), rows), p.sum(-1), m))
    top = torch.stack([m for *_, m in parts]).amax(0)
    weight = [torch.exp(m - top).nan_to_num(0.0) for *_, m in parts]
    acc = sum(o * w[..., None] for (o, _, _), w in zip(parts, weight))
    total = sum(t * w for (_, t, _), w in zip(parts, weight)) + torch.exp(sink[None, :] - top)
    return (acc / total[..., None]).bfloat16().float()


@pytest.mark.parametrize("rule_id, seen", [
    ("ATTN.PROB.BF16", "32 of 32768 outputs outside the admitted BF16 interval; at token 0 head 1 channel 209: "
                       "got np.float64(-3.838539123535156e-05)"),
    ("ATTN.PROB.ORDER", "15 of 32768 outputs outside the admitted BF16 interval; at token 0 head 3 channel 487: "
                        "got np.float64(-0.000827789306640625)")])
def test_flashmla_decode_splits_give_what_the_h100_gave(rule_id, seen):
    """The H100's flashmla-decode FAILs at ci (docs/records/h100/2026-12-07-verify-flashmla-decode-attn-ci.json):
    the emulation of one split a block, on the decode's SHAPES, fails on the same count of outputs with the
    same first value; declared attn_order = split, it is admitted."""
    emulated = mutant("flashmla_decode_splits", sparse_attention=_flashmla_decode_splits)
    emulated.SHAPES = {"sparse_attention": {"D": (512,), "H": (64, 128), "K": 64}}
    record = Path(__file__).resolve().parents[1] / "docs/records/h100/2026-12-07-verify-flashmla-decode-attn-ci.json"
    fails = [r["detail"] for r in json.loads(record.read_text())["results"] if r["rule"] == rule_id]
    assert fails and seen in fails[0], "the library's own FAIL"
    row = run_rule(rule_id, Target(emulated, "flashmla_decode_splits"))
    assert row.status == FAIL and seen in row.detail, row.detail
    emulated.VARIANTS = {"attn_order": "split"}          # flash-decoding, declared: admitted
    assert run_rule(rule_id, Target(emulated, "flashmla_decode_splits")).status in (PASS, VARIANT)


def test_a_split_kernel_passes_when_it_declares_it():
    split = lambda *a, **k: _blocked(*a, **k, split=True)      # noqa: E731
    declared = Target(mutant("split", variants={"attn_order": "split"}, sparse_attention=split), "split")
    for rule_id in KERNEL_RULES:
        assert run_rule(rule_id, declared).status in (PASS, VARIANT), rule_id


@pytest.mark.parametrize("model", ["v4-flash", "v4.1-flash"])
def test_impl_equals_official_on_the_probes(model):
    for kw in (dict(), dict(max_at=100, invalid=0.3), dict(duplicates=9), dict(sink="far_above")):
        if model == "v4.1-flash":
            kw = dict(kw, leading=64) if not kw else kw
        case = checks.make_case(7, model, 2, 5, 32, 130, **kw)
        assert np.array_equal(checks.run(impl, case), checks.run(official, case))


def test_fewer_than_16_heads_are_not_observable():
    case = checks.make_case(3, "v4-flash", 1, 20, 32, 100)
    full = checks.run(official, case)
    case.q, case.sink = case.q[:, :5], case.sink[:5]
    assert np.array_equal(checks.run(official, case), full[:, :5])


def test_derotation_undoes_the_rotation():
    o = torch.randn(3, 2, 512).bfloat16().float()
    pos, f = torch.tensor([0, 9, 4000]), impl.rope_freqs("v4-flash", 2)
    back = impl.attention_output(impl.rope_rotate(o, pos, f), pos, f)
    assert (back - o).abs().max() <= 2 ** -6 * o.abs().max()


@pytest.mark.parametrize("name", sorted(attn_mutants.LAYER_STAGE))
def test_the_layer_check_names_the_planted_stage(name):
    """V4 CSA, prefill from x to out (every stage); a V4.1-only mistake on V4.1's small-latent case
    (its x and o_lora carry an outlier run too)."""
    provider = attn_mutants.MUTANTS[name][0]
    case = checks.small_latent_case(True) if name.endswith("_on_v41") else checks.attention_case(FIXED_LAYERS[0], True, True)
    stage, _, _ = checks.first_broken_attention_stage(Target(provider, name), case)
    assert stage == attn_mutants.LAYER_STAGE[name]


@pytest.mark.parametrize("provider", [impl, official], ids=["impl", "official"])
def test_the_small_latent_case_passes_the_controls(provider):
    case = checks.small_latent_case(True)
    latent = checks.run_attention_layer(Target(provider, "t"), case)["q_latent"]
    assert 2.0 ** -13 < np.sqrt(np.mean(np.square(latent))) < 2.0 ** -10        # about 2^-12 beside the outlier run
    assert checks.first_broken_attention_stage(Target(provider, "t"), case) is None


@pytest.mark.parametrize("provider", [impl, official], ids=["impl", "official"])
def test_a_short_case_starts_from_x_and_passes_with_the_projection_stages(provider):
    case = checks.attention_case(FIXED_LAYERS[0], True, True)
    assert "attn_wq_a" in case.arrays() and "attn_wo_a" in case.arrays() and "q_attn" not in case.arrays()
    out = checks.run_attention_layer(Target(provider, "t"), case)
    assert {"q_latent", "q_norm", "q_attn", "kv_proj", "kv_normed", "o_lora", "out"} <= set(out)
    assert out["o_lora"].shape == (case.seqlen, 2, checks.OUTPUT_RANK) and out["out"].shape == (case.seqlen, 4096)
    assert checks.first_broken_attention_stage(Target(provider, "t"), case) is None


def test_the_output_projections_keep_the_q_and_kv_weights_of_contract_6():
    six, seven = (checks.attention_case(FIXED_LAYERS[0], True, output).arrays() for output in (False, True))
    assert set(seven) - set(six) == {"attn_wo_a", "attn_wo_b", "attn_wo_b_scale"}
    assert all(np.array_equal(six[name], seven[name]) for name in six)


class _OldFormLayer:
    """A target written against contract 5: attention_layer reads the given q_attn and kv_normed."""
    rope_freqs = staticmethod(impl.rope_freqs)

    def __init__(self, contract):
        if contract is not None:
            self.CONTRACT = contract

    @staticmethod
    def attention_layer(inputs, *, model, layer, start_pos=0):
        if "attn_wq_a" in inputs:
            raise KeyError("q_attn")
        return impl.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)


@pytest.mark.parametrize("contract", [5, None])
def test_a_target_of_the_old_contract_is_given_q_attn_and_kv_normed_and_keeps_its_verdict(contract):
    target = Target(_OldFormLayer(contract), "old")
    assert not checks.takes_projections(target)
    case = checks.attention_case(FIXED_LAYERS[0], checks.takes_projections(target))
    assert "q_attn" in case.arrays()
    assert checks.first_broken_attention_stage(target, case) is None


def test_a_target_of_contract_6_is_given_x_and_the_weights():
    assert checks.takes_projections(Target(impl, "impl"))
    provider = _OldFormLayer(6)
    assert checks.takes_projections(Target(provider, "new"))


@pytest.mark.parametrize("contract", [5, 6, None])
def test_only_a_target_of_contract_7_is_given_the_output_projections(contract):
    assert checks.takes_output(Target(impl, "impl")) and checks.takes_output(Target(_OldFormLayer(7), "new"))
    assert not checks.takes_output(Target(_OldFormLayer(contract), "old"))


def _layer_case(model, layer, start_pos):
    """The case of attention_layer_cases() at (model, layer, start_pos), built alone."""
    return checks.attention_case(next(key for key in (*FIXED_LAYERS, *checks.KIND_CASES)
                                      if (key[0], key[1], key[3]) == (model, layer, start_pos)))


def test_a_port_attending_a_token_once_not_once_per_cache_breaks_the_ratio1_layer_at_o():
    """ATTN.DUPLICATES: V4.1's ratio-1 prefill lists each recent token's window row and its
    compressed row; dropping the compressed one changes the attention output."""
    name = "layer_window_and_compressed_rows_deduplicated"
    case = _layer_case("v4.1-flash", 20, 0)
    stage, _, _ = checks.first_broken_attention_stage(Target(attn_mutants.MUTANTS[name][0], name), case)
    assert stage == "o"
    assert checks.first_broken_attention_stage(Target(impl, "impl"), case) is None


@pytest.mark.parametrize("name", sorted(attn_mutants.STAGE_PLANTS))
def test_the_layer_check_names_the_stage_of_each_part_where_a_mistake_is_planted(name):
    provider, stage, where = attn_mutants.STAGE_PLANTS[name]
    broken = checks.first_broken_attention_stage(Target(provider, name), _layer_case(*attn_mutants.PLANT_CASES[where]))
    assert broken is not None and broken[0] == stage, broken


@pytest.mark.parametrize("where", sorted(attn_mutants.PLANT_CASES))
def test_the_plants_cases_pass_impl(where):
    assert checks.first_broken_attention_stage(Target(impl, "impl"), _layer_case(*attn_mutants.PLANT_CASES[where])) is None


def test_the_layer_check_passes_official_on_a_decode_case():
    case = _layer_case("v4.1-flash", 24, 16400)               # V4.1 re-index, decode at 16400
    assert checks.first_broken_attention_stage(Target(official, "official"), case) is None


@pytest.mark.parametrize("key", [*checks.KIND_CASES, *(k for k in FIXED_LAYERS if 0 < k[3] < 128)],   # and the fixed
                         ids=lambda key: "-".join(map(str, key)))                 # decodes while the ring fills
def test_every_layer_kind_passes_official(key):
    assert checks.first_broken_attention_stage(Target(official, "official"), checks.attention_case(key)) is None


@pytest.mark.parametrize("call, message", [
    (lambda: impl.sparse_attention(torch.zeros(1, 2, 8), torch.zeros(4, 8), torch.zeros(2),
                                   torch.tensor([[0, 4]]), 0.1, model="v4-flash"), "−1 or rows 0..3"),
    (lambda: impl.sparse_attention(torch.zeros(1, 2, 8), torch.zeros(4, 6), torch.zeros(2),
                                   torch.tensor([[0]]), 0.1, model="v4-flash"), "head dim 8"),
    (lambda: impl.sparse_attention(torch.zeros(1, 2, 8), torch.zeros(4, 8), torch.zeros(3),
                                   torch.tensor([[0]]), 0.1, model="v4-flash"), "one value per head"),
    (lambda: impl.sparse_attention(torch.zeros(1, 2, 8), torch.zeros(4, 8), torch.zeros(2),
                                   torch.tensor([[0]]), 0.1, model="v3.2"), "V4 or V4.1"),
    (lambda: impl.sparse_attention(torch.zeros(1, 2, 8), torch.zeros(4, 8), torch.zeros(2),
                                   torch.tensor([[0]]), -1.0, model="v4-flash"), "positive float"),
    (lambda: impl.attention_scale("v4-flash", 99), "layers 0..43"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("provider", [impl, official], ids=["impl", "official"])
@pytest.mark.parametrize("prefill", checks.NO_ENTRY_PREFILLS, ids=lambda p: "-".join(map(str, p)))
def test_a_prefill_with_no_compressed_entry_attends_the_window_alone(provider, prefill):
    """seqlen < ratio: the official compressor returns None (V4-model L360-361) and attention goes on
    over the window rows (L527); the layer's stages, index path included, keep their rules."""
    model, layer, seqlen, seed = prefill
    case = checks.attention_case((model, layer, seqlen, 0, seed))
    assert checks.first_broken_attention_stage(Target(provider, provider.__name__), case) is None
    assert checks.run_attention_layer(Target(provider, provider.__name__), case)["kv"].shape[0] == seqlen


@pytest.mark.parametrize("provider", [impl, official], ids=["impl", "official"])
@pytest.mark.parametrize("prefill", checks.NO_ENTRY_PREFILLS, ids=lambda p: "-".join(map(str, p)))
def test_an_index_layer_with_no_compressed_entry_keeps_its_rules(provider, prefill):
    from dsv4spec.properties.path import first_broken_stage, make_layer_case
    model, layer, seqlen, seed = prefill
    assert first_broken_stage(Target(provider, provider.__name__), make_layer_case(model, layer, seqlen, 0, seed)) is None


def test_a_layer_without_rope_freqs_is_judged_with_a_slack_of_magnitudes_at_negated_positions():
    """Issue 40, false alarm 1: o_derot is judged at −p; the spec table's slack grows with |p·f|, not p·f
    (a negative slack failed a correctly rounded value at this case, "± -3.62e-06")."""
    case = checks.attention_case(("v4-pro", 2, 1, 27, 20), True, True)
    assert checks.first_broken_attention_stage(Target(attn_mutants.LayerWithoutTable(), "no table"), case) is None
    off_by_one = attn_mutants.LayerWithoutTable(derotate_at=lambda positions: positions + 1)
    assert checks.first_broken_attention_stage(Target(off_by_one, "off by one"), case)[0] == "o_derot"


POSITION_DECODES = [("v4-flash", 0, 1, 5, 3), ("v4-flash", 2, 1, 27, 11), ("v4-flash", 3, 1, 300, 12),
                    ("v4.1-flash", 24, 1, 20, 151)]


@pytest.mark.parametrize("key", POSITION_DECODES, ids=lambda key: "-".join(map(str, key)))
def test_a_port_keeping_the_window_in_position_order_passes_at_decode(key):
    """Issue 40: the last W rows in order, not a ring (seqlen 1, start_pos 5: offset 6, not 128),
    attend the same tokens; declared window_layout=position_order, every stage passes; the same
    port missing its newest token fails."""
    port = Target(attn_mutants.POSITION_ORDERED, "position_ordered")
    case = checks.attention_case(key)
    out, ring = (checks.run_attention_layer(Target(p, n), case) for p, n in ((port.provider, "p"), (impl, "impl")))
    kept = min(key[3] + 1, 128)                 # the ring's 128 rows, the position-ordered window's W
    assert out["kv"].shape[0] == ring["kv"].shape[0] - 128 + kept and out["window_idx"].tolist() == [list(range(kept))]
    assert all(v["status"] == "PASS" for v in checks.attention_stage_verdicts(port, case))
    name = "layer_position_ordered_window_without_the_newest_token"
    broken = [v["stage"] for v in checks.attention_stage_verdicts(Target(attn_mutants.MUTANTS[name][0], name), case)
              if v["status"] == "FAIL"]
    assert "kv" in broken and ("window_idx" in broken) == (key[3] < 127)      # p ≥ 127: the same 128 rows listed


def test_the_position_ordered_lists_pass_their_rules_declared_and_are_named_undeclared():
    port = attn_mutants.POSITION_ORDERED
    assert {r: run_rule(r, Target(port, "declared")).status for r in ("PATH.WINDOW", "PATH.HCA", "PATH.CONCAT")} == \
        {"PATH.WINDOW": PASS, "PATH.HCA": PASS, "PATH.CONCAT": VARIANT}
    undeclared = mutant("undeclared", **{op: getattr(port, op) for op in ("attention_index",)})
    row = run_rule("PATH.CONCAT", Target(undeclared, "undeclared"))
    assert row.status == FAIL and "matches window_layout=position_order (undeclared)" in row.detail


def test_a_dense_mask_port_is_judged_on_duplicates_in_its_layer_never_on_a_repeated_entry():
    """Issue 40: attention through a mask over [window rows | compressed rows] cannot attend a list
    entry twice; declared attention_form=dense_mask, ATTN.DUPLICATES is judged in the layer, where a
    token held in both caches is attended twice: the correct port is not failed (VARIANT, its sparse
    check skipped); the one attending such a token once FAILs there."""
    row = run_rule("ATTN.DUPLICATES", Target(attn_mutants.DENSE_MASK_PORT, "dense"))
    assert row.status == VARIANT and row.checks == {"an_index_listed_twice_is_attended_twice": "SKIP",
                                                     "a_token_in_both_caches_is_attended_twice": PASS}
    undeclared = mutant("undeclared_dense", sparse_attention=attn_mutants._dense_mask_attention)
    assert run_rule("ATTN.DUPLICATES", Target(undeclared, "undeclared")).status == FAIL        # as on main
    name = "dense_mask_attending_a_token_once"
    row = run_rule("ATTN.DUPLICATES", Target(attn_mutants.MUTANTS[name][0], name))
    assert row.status == FAIL and row.checks["a_token_in_both_caches_is_attended_twice"] == FAIL
    assert run_rule("ATTN.DUPLICATES", Target(impl, "impl")).checks["a_token_in_both_caches_is_attended_twice"] == "SKIP"


def test_an_undeclared_dense_mask_port_is_named_and_a_wrong_deduplication_is_not():
    """Undeclared, a port attending a repeated entry once (as a dense mask does) FAILs ATTN.DUPLICATES
    named "matches attention_form=dense_mask"; one dropping every copy of a repeated row FAILs unnamed."""
    undeclared = mutant("undeclared_dense", sparse_attention=attn_mutants._dense_mask_attention)
    row = run_rule("ATTN.DUPLICATES", Target(undeclared, "undeclared"))
    assert row.status == FAIL and row.detail.startswith("matches attention_form=dense_mask (undeclared); "), row.detail
    wrong = mutant("repeated_rows_dropped", sparse_attention=attn_mutants._repeated_rows_dropped)
    row = run_rule("ATTN.DUPLICATES", Target(wrong, "wrong"))
    assert row.status == FAIL and "matches" not in row.detail, row.detail
