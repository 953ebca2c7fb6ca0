"""Machine-made mutants (dsv4spec/mutate.py): stable ids, mutated copies loaded in memory, the
rules a mutant runs, and a fixed small sample that the suite must kill (`make thorough` runs all)."""
import sys

import torch

from dsv4spec import impl, official
from dsv4spec import mutate as M
from dsv4spec.cli import main
from dsv4spec.impl import quant as impl_quant

SAMPLE = [   # (mutant id, the rule that kills it first): a fixed sample of operators, fast to kill
    ("impl.quant:e4m3_decode:compare:codes >= 128 -> codes > 128#1", "FMT.E4M3.VALUES"),
    ("impl.quant:e8m0_decode:where:torch.where(codes == 255, float('nan'), _pow2(codes - 127)) -> "
     "torch.where(codes == 255, _pow2(codes - 127), float('nan'))#1", "FMT.E8M0.VALUES"),
    ("impl.quant:E2M1_TABLE:const:1.5 -> 1.5000001192092896 (next fp32 up)#1", "FMT.E2M1.VALUES"),
]


def _by_id(mutant_id):
    return next(m for m in M.mutants_of(mutant_id.split(":")[0]) if m.id == mutant_id)


def test_ids_are_unique_and_carry_no_line_number():
    for module in ("impl.quant", "official.pool"):
        mutants = M.mutants_of(module)
        assert len({m.id for m in mutants}) == len(mutants) > 20
        assert all(f":{m.line}" not in m.id.split(":")[1] for m in mutants)
    assert {m.operator for m in M.mutants_of("impl.quant")} == set(M.OPERATORS)


def test_a_mutated_copy_changes_only_its_own_module():
    mutant = _by_id("impl.quant:e2m1_encode:compare:magnitude >= boundary -> magnitude > boundary#1")
    module = M.mutated_module(mutant)
    x = torch.tensor([0.75, 1.75, 3.5, 1.0])
    assert module.e2m1_encode(x).tolist() == [1, 3, 5, 2]        # ties rounded down, not to even
    assert impl_quant.e2m1_encode(x).tolist() == [2, 4, 6, 2]    # the original untouched
    assert M.mutant_target(mutant).op("e2m1_encode")(x).tolist() == [1, 3, 5, 2]


def test_a_mutant_runs_the_rules_its_edit_reaches():
    rules = M.rules_for(_by_id(SAMPLE[1][0]))
    assert "FMT.E8M0.VALUES" in rules and "FP4.DEQUANT" in rules
    assert not [r for r in rules if r.startswith(("IDX.TOPK", "POOL", "FMT.E2M1"))]
    assert rules.index("IDX.SCORE.FP4") > rules.index("FP4.DEQUANT")    # index_scores_fp4 decodes its scales


TOPK = "impl.topk:_topk_from:compare:torch.arange(k)[None, :] < count -> torch.arange(k)[None, :] <= count#1"


def test_every_module_of_impl_and_official_is_mutated():
    assert set(M.MODULES) == {m for package in ("impl", "official") for m in M.package_modules(package)}


def test_a_mutant_reaches_the_operations_of_the_modules_importing_it():
    mutant = _by_id(TOPK)          # impl/topk.py has no operation: indexer, pool and path call it
    assert M.importers("impl.topk") == {"impl.topk": 0, "impl.indexer": 1, "impl.pool": 1, "impl.rope": 2,
                                        "impl.path": 2, "impl.attn": 2}
    assert {"index_topk", "reindex_topk", "pool_scan_topk", "index_layer"} <= M.reaching_ops(mutant)
    rules = M.rules_for(mutant)
    assert rules[0].startswith("IDX.TOPK") and "POOL.REINDEX" in rules and "PATH.POOL_SCAN" in rules
    assert rules.index("POOL.REINDEX") < rules.index("PATH.POOL_SCAN")      # nearest first
    modules = dict(sys.modules)
    target = M.mutant_target(mutant)
    assert dict(sys.modules) == modules                                     # one way: nothing replaced
    assert impl.indexer._topk_from is impl.pool._topk_from is impl.topk._topk_from
    scores, eligible = torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[True, False, True]])
    assert impl.topk._topk_from(scores, eligible, 3, "score").tolist() == [[0, 2, -1]]
    got = target.provider.index_topk.__globals__["_topk_from"](scores, eligible, 3, "score")
    assert got.tolist() == [[0, 2, 1]]                  # the copy's indexer calls the mutated top-k


def test_a_topk_mutant_is_killed_through_an_idx_or_pool_rule():
    result = M.run_mutant(_by_id(TOPK), ["IDX", "POOL"])
    assert result.status == "killed" and result.rule.startswith(("IDX", "POOL")), result


def test_an_import_inside_a_function_reaches_the_copy():
    # official/path.py imports official.quant inside _codec: kv_qdq decodes with the mutated table
    mutant = _by_id("official.quant:FP4_TABLE:const:1.5 -> 3.0 (×2)#1")
    assert {"kv_qdq", "kv_qdq_fp4_e8m0", "index_layer"} <= M.reaching_ops(mutant)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    x[0, :2] = torch.tensor([6.0, 1.5])
    assert official.kv_qdq(x, "fp4_e8m0")[0, :2].tolist() == [6.0, 1.5]
    assert M.mutant_target(mutant).op("kv_qdq_fp4_e8m0")(x)[0, :2].tolist() == [6.0, 3.0]


def test_an_added_cast_rounds_integers_too():
    assert (M._round_bf16(257), M._round_e4m3(17), M._round_e4m3(1000)) == (256, 16, 448)
    assert M._round_bf16(torch.tensor([257, 3])).tolist() == [256, 3]
    assert M._round_bf16(True) is True


def test_the_fixed_sample_is_killed_on_its_rule():
    for mutant_id, rule_id in SAMPLE:
        result = M.run_mutant(_by_id(mutant_id), ["FMT"])
        assert (result.status, result.rule) == ("killed", rule_id), result


def test_every_equivalent_mutant_exists_and_has_a_reason():
    marked = M.load_equivalent()
    known = {m.id for module in {i.split(":")[0] for i in marked} for m in M.mutants_of(module)}
    assert [i for i in marked if i not in known] == []
    assert all(reason.strip() for reason in marked.values())


def test_the_report_scores_and_lists_survivors():
    killed = M.Result(_by_id(SAMPLE[0][0]), "killed", "FMT.E4M3.VALUES", "FAIL", ["FMT.E4M3.VALUES"])
    survived = M.Result(_by_id(SAMPLE[2][0]), "survived", ran=["FMT.E2M1.VALUES"])
    text = M.render([killed, survived])
    assert "score 50.0%" in text and "impl/quant.py:" in text and SAMPLE[2][0] in text
    assert "| FMT | 1 | 1 | 0 | 0 | 50.0% |" in M.markdown([killed, survived])


def test_the_mutate_command_lists(capsys):
    assert main(["mutate", "--modules", "impl.quant", "--operators", "axis", "--list"]) == 0
    out = capsys.readouterr().out
    assert "[axis]" in out and out.strip().endswith("3 mutants")


def test_shards_merge_and_the_equivalence_file_applies_again():
    marked = next(iter(M.load_equivalent()))
    survived = M.Result(_by_id(marked), "survived", ran=["FMT.E4M3.VALUES"])
    killed = M.Result(_by_id(SAMPLE[0][0]), "killed", "FMT.E4M3.VALUES", "FAIL", ["FMT.E4M3.VALUES"])
    merged = M.from_json([M.to_json([survived]), M.to_json([killed])])
    assert [(r.mutant.id, r.status) for r in merged] == [(marked, "equivalent"), (SAMPLE[0][0], "killed")]


def _blocks_at_every_bf16_amax(block):
    amax = torch.arange(0, 0x3E80, dtype=torch.int16).view(torch.bfloat16)    # every BF16 in [0, 1/4)
    x = torch.zeros(len(amax), block, dtype=torch.bfloat16)
    x[:, 0], x[:, 1] = amax, (-amax.float() / 3).bfloat16()
    return x


def test_the_official_floor_equivalences_hold_at_every_bf16_amax():
    # official's quantizers are fed BF16: a floor mutant marked equivalent gives the same bytes for
    # every BF16 amax below 1/4 (the floors, 1e-4 … 6·2^-9, and their neighbours act far below it);
    # its ×2 neighbour (killed) does not
    floors = {"FP4_E4M3_FLOOR": ("fp4_e4m3_quantize", (), 16), "FP4_E8M0_FLOOR": ("fp4_e8m0_quantize", (), 32),
              "FP8_FLOOR": ("fp8_quantize", (32,), 32)}
    marked = [i for i in M.load_equivalent() if i.split(":")[:2][0] == "official.quant" and i.split(":")[1] in floors]
    assert len(marked) == 10
    for mutant_id in marked + ["official.quant:FP4_E4M3_FLOOR:const:6 -> 12 (×2)#1"]:
        op, args, block = floors[mutant_id.split(":")[1]]
        x = _blocks_at_every_bf16_amax(block)
        want, got = getattr(official, op)(x, *args), getattr(M.mutated_module(_by_id(mutant_id)), op)(x, *args)
        same = all(torch.equal(a, b) for a, b in zip(want, got))
        assert same == (mutant_id in marked), mutant_id


def test_mutate_outside_a_checkout_says_it_needs_one(monkeypatch, tmp_path, capsys):
    """From an installed wheel (no tests/mutants/EQUIVALENT.toml), every equivalent mutant would read
    as a survivor: mutate refuses in one line instead (exit 2)."""
    monkeypatch.setattr(M, "EQUIVALENT_FILE", tmp_path / "tests" / "mutants" / "EQUIVALENT.toml")
    assert main(["mutate", "--id", "no-such-mutant"]) == 2
    err = capsys.readouterr().err
    assert "EQUIVALENT.toml: the equivalent mutants are marked in the repository's tests, which an installed wheel " \
           "does not ship; run mutate in a checkout" in err and err.count("\n") == 1, err
    assert main(["mutate", "--id", "no-such-mutant", "--list"]) == 0       # listing needs no equivalence file
