"""The README's third-party example stays a working example: its declared variant is VARIANT, its
canonical operations PASS, what it lacks is n/i, and undeclaring the variant turns it into a FAIL."""
import sys
from pathlib import Path

from dsv4spec.properties.suite import FAIL, NOT_IMPLEMENTED, PASS, VARIANT, run_rule
from dsv4spec.properties.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def test_the_example_port_reports_as_documented():
    port = load_target("examples.fp4_port:PORT")
    assert run_rule("FMT.E2M1.RNE", port).status == PASS
    assert run_rule("FMT.E2M1.ZERO_SIGN", port).status == PASS
    assert run_rule("FP4.PACK.NIBBLE", port).status == VARIANT
    assert run_rule("FP4.KV.SCALE", port).status == NOT_IMPLEMENTED


def test_the_same_port_without_its_declaration_fails_and_is_named():
    port = load_target("examples.fp4_port:PORT")
    port.variants = dict(port.variants, nibble_order="low_first")
    row = run_rule("FP4.PACK.NIBBLE", port)
    assert row.status == FAIL and "matches nibble_order=high_first" in row.detail
