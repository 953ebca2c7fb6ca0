"""A versioned target contract: adapters written against an earlier version keep their verdicts on
upgrade (tests/frozen_adapters, never edited), a wrong one keeps its FAIL, and `dsv4spec ops --json`
states the version with its changes."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from dsv4spec.properties.suite import RUN, load_checks, run_rule
from dsv4spec.properties import target as contract
from dsv4spec.properties.target import Target

FROZEN = Path(__file__).parent / "frozen_adapters"
HOME = Path(__file__).resolve().parent.parent
ADAPTERS, PROTOCOL = HOME / "docs" / "ADAPTERS.md", HOME / "PROTOCOL.md"
RULES = ("PATH.QDQ", "PATH.K.CACHE")
# adapter -> its verdict on each rule of RULES: the one it had under the contract it was written for
VERDICTS = {
    "contract1_kv_qdq": {"PATH.QDQ": "PASS", "PATH.K.CACHE": "n/i"},      # fp4_e8m0 came in version 2
    "contract2_kv_qdq": {"PATH.QDQ": "PASS", "PATH.K.CACHE": "PASS"},
    "contract2_kv_qdq_wrong": {"PATH.QDQ": "PASS", "PATH.K.CACHE": "FAIL"},
    "contract3_split": {"PATH.QDQ": "PASS", "PATH.K.CACHE": "PASS"},
}


def dsv4spec_command() -> list[str]:
    """The installed console script beside this interpreter (what users run)."""
    script = Path(sys.executable).parent / "dsv4spec"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsv4spec"]


def test_frozen_adapters_keep_their_verdicts_on_upgrade(tmp_path):
    targets = [arg for name in VERDICTS for arg in ("--target", name)]
    result = subprocess.run([*dsv4spec_command(), "verify", *targets, "--rules", ",".join(RULES),
                             "--max-examples", "2", "--quiet", "--json", str(tmp_path / "r.json")],
                            cwd=FROZEN, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stdout + result.stderr          # the wrong adapter's FAIL
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    got = {}
    for row in rows:                # each adapter's NAME is its module's
        got.setdefault(row["target"], {})[row["rule"]] = row["status"]
    assert got == VERDICTS, result.stdout
    detail = {(r["target"], r["rule"]): r["detail"] for r in rows}
    assert "kv_qdq(x, 'fp4_e8m0') (the format came in contract 2)" in detail[("contract1_kv_qdq", "PATH.K.CACHE")]


def _rule(provider, rule_id="PATH.K.CACHE"):
    load_checks()
    RUN.max_examples, before = 2, RUN.max_examples
    try:
        return run_rule(rule_id, Target(provider, "frozen")).status
    finally:
        RUN.max_examples = before


def _kv_qdq(formats, asked):
    import dsv4spec.impl as lib

    def kv_qdq(x, fmt):
        asked.append(fmt)
        if fmt not in formats:
            raise ValueError(f"unknown fmt {fmt!r}")
        return lib.kv_qdq(x, fmt)
    return kv_qdq


def test_a_declared_contract_decides_without_asking():
    """CONTRACT = 1: fp4_e8m0 is never asked (n/i); CONTRACT = 2: it is, and a rejection is ERROR."""
    asked = []
    old = types.SimpleNamespace(CONTRACT=1, kv_qdq=_kv_qdq(("fp4_e4m3", "fp8_e8m0_32", "fp4_e8m0"), asked))
    assert _rule(old) == "n/i" and "fp4_e8m0" not in asked
    assert Target(old, "frozen").withheld("kv_qdq_fp4_e8m0") == \
        "contract 1 withholds kv_qdq(x, 'fp4_e8m0') (the format came in contract 2)"
    broken = types.SimpleNamespace(CONTRACT=2, kv_qdq=_kv_qdq(("fp4_e4m3", "fp8_e8m0_32"), []))
    assert _rule(broken) == "ERROR"


def test_an_undeclared_adapter_is_asked_once_whether_it_takes_a_later_format():
    asked = []
    target = Target(types.SimpleNamespace(kv_qdq=_kv_qdq(("fp4_e4m3", "fp8_e8m0_32"), asked)), "frozen")
    assert not target.has("kv_qdq_fp4_e8m0") and not target.has("kv_qdq_fp4_e8m0")
    assert asked == ["fp4_e8m0"] and target.has("kv_qdq_fp4_e4m3", "kv_qdq_fp8_e8m0_32")


@pytest.mark.parametrize("declared", [0, contract.CONTRACT_VERSION + 1, "5", True, 5.0])
def test_a_contract_outside_the_known_versions_is_refused(declared):
    with pytest.raises(ValueError, match=f"CONTRACT must be an int from 1 to {contract.CONTRACT_VERSION}"):
        Target(types.SimpleNamespace(CONTRACT=declared, e2m1_encode=abs), "bad")


def test_ops_json_states_the_contract_version_and_each_change(capsys):
    from dsv4spec.cli import main
    assert main(["ops", "--json"]) == 0
    stated = json.loads(capsys.readouterr().out)["contract"]
    assert stated["version"] == contract.CONTRACT_VERSION
    assert [c["version"] for c in stated["changes"]] == list(range(1, contract.CONTRACT_VERSION + 1))
    assert all(c["date"] and c["change"] for c in stated["changes"])


def test_the_changelog_lists_every_version():
    text = ADAPTERS.read_text()
    changelog = text[text.index("## Contract versions"):]
    for version, (date, _) in contract.CONTRACT_CHANGES.items():
        assert f"- **{version}** ({date})" in changelog, version


def test_the_exec_protocol_states_the_same_contract_version():
    assert f"**target contract version {contract.CONTRACT_VERSION}**" in " ".join(PROTOCOL.read_text().split())


def test_a_contract_6_layer_is_never_given_the_output_projections():
    """contract6_layer (version 6) is given x and the q/kv weights, never wo_a and wo_b: it passes, as
    it did; handed them, it would miss o_lora."""
    import importlib.util
    from dsv4spec.properties import attn as checks
    from dsv4spec.properties.path import FIXED_LAYERS
    spec = importlib.util.spec_from_file_location("contract6_layer", FROZEN / "contract6_layer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target = Target(module, "contract6_layer")
    assert checks.takes_projections(target) and not checks.takes_output(target)
    for key in (FIXED_LAYERS[0], checks.PROBE_KEY):
        case = checks.attention_case(key, True, checks.takes_output(target))
        assert "attn_wq_a" in case.arrays() and "attn_wo_a" not in case.arrays()
        assert checks.first_broken_attention_stage(target, case) is None
    assert checks.first_broken_attention_stage(target, checks.attention_case(FIXED_LAYERS[0], True, True))[0] == "o_lora"


def _contract6_layer():
    import importlib.util
    spec = importlib.util.spec_from_file_location("contract6_layer", FROZEN / "contract6_layer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _attention_row(provider, name, key):
    """ATTN.LAYER's row through the runner, its check on the one layer case `key`."""
    from unittest import mock
    from dsv4spec.properties import attn as checks
    from dsv4spec.properties import suite
    from dsv4spec.properties.stages import report

    def one_case(target):
        case = checks.attention_case(key, checks.takes_projections(target), checks.takes_output(target))
        report("ATTN.LAYER", case, checks.attention_stage_verdicts(target, case) + checks.withheld_stages(target, case))
    chk = suite.Check("ATTN.LAYER", "one_case", one_case, ("attention_layer",))
    with mock.patch.object(suite, "checks_for", lambda rule_id: [chk]):
        return run_rule("ATTN.LAYER", Target(provider, name))


def test_a_stage_a_version_withheld_is_named_not_judged_in_the_row_and_the_json():
    from dsv4spec.properties.path import FIXED_LAYERS
    from dsv4spec.properties.report import terminal, to_json, to_junit, to_markdown
    row = _attention_row(_contract6_layer(), "contract6_layer", FIXED_LAYERS[0])
    assert row.status == "PASS"
    assert "not judged: o_lora, out (contract 6 withholds wo_a and wo_b (contract 7))" in row.detail
    withheld = [(v["stage"], v["status"]) for v in json.loads(to_json([row], {}))["results"][0]["stages"]
                if v["status"] != "PASS"]
    assert withheld == [("o_lora", "not judged"), ("out", "not judged")]
    assert "PASS ATTN.LAYER on contract6_layer: every stage judged passes; not judged: o_lora, out" in terminal([row])
    assert all("not judged: o_lora, out (contract 6 withholds" in text for text in (to_junit([row]), to_markdown([row])))


def test_an_undeclared_target_returning_the_output_stages_is_judged_on_them():
    """Issue 42: no CONTRACT, o_lora and out both ×1.5: FAIL on both, not a PASS that hides them."""
    import dsv4spec.impl as impl
    from dsv4spec.properties import attn as checks
    from dsv4spec.properties.path import FIXED_LAYERS
    from mutants import mutant

    def attention_layer(inputs, **kw):
        out = impl.attention_layer(inputs, **kw)
        return {**out, **{name: out[name] * 1.5 for name in ("o_lora", "out") if name in out}}
    provider = mutant("outputs_times_1_5", attention_layer=attention_layer)
    assert not hasattr(provider, "CONTRACT") and checks.takes_output(Target(provider, "t"))
    row = _attention_row(provider, "outputs_times_1_5", FIXED_LAYERS[0])
    assert row.status == "FAIL" and [v["stage"] for v in row.stages if v["status"] == "FAIL"] == ["o_lora", "out"]
    assert _attention_row(impl, "impl", FIXED_LAYERS[0]).status == "PASS"


def test_an_exec_port_declares_its_contract_in_the_handshake(monkeypatch):
    from dsv4spec.properties.target import TargetLoadError, load_target
    spec = "exec:" + " ".join([sys.executable, str(Path(__file__).parent / "exec_fake_port.py")])
    monkeypatch.setenv("FAKE_HELLO", "contract=6")
    assert load_target(spec).contract == 6
    monkeypatch.setenv("FAKE_HELLO", "")
    assert load_target(spec).contract is None
    for wrong in ("seven", "0", "99"):
        monkeypatch.setenv("FAKE_HELLO", f"contract={wrong}")
        with pytest.raises(TargetLoadError, match="contract"):
            load_target(spec)


def test_a_golden_port_declares_its_contract_in_port_txt(tmp_path):
    from dsv4spec.golden.vectors import PORT, _Replay, read_declarations
    (tmp_path / PORT).write_text("name=p\ncontract=6\n")
    declared = read_declarations(tmp_path)
    assert Target(_Replay("FMT.E2M1.RNE", [], {}, types.SimpleNamespace(results={}, errors={}, raised={},
                                                                        file_error=""), {}, "p", declared), "p").contract == 6
    (tmp_path / PORT).write_text("contract=99\n")
    with pytest.raises(ValueError, match="contract= must be"):
        read_declarations(tmp_path)
