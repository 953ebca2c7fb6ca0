"""FlashMLA's split sparse decode, emulated on the CPU (tests/test_attn.py::_flashmla_decode_splits),
as a target with the built-in flashmla-decode's SHAPES and MODELS, so that a dev seed draws the cases
the library was given.  From the checkout's root:

    PYTHONPATH=docs/records/h200/2026-12-07-conformance dsv4spec verify --target emulation_target \
        --profile dev --seed 3 --rules ATTN.PROB.ORDER,ATTN.PROB.BF16
"""
import importlib.util
import sys
from pathlib import Path

from dsv4spec.production import FlashMLADecode

_TESTS = Path(__file__).resolve().parents[4] / "tests"
sys.path.insert(0, str(_TESTS))                     # test_attn imports the mutants package beside it
_found = importlib.util.spec_from_file_location("_test_attn", _TESTS / "test_attn.py")
_test_attn = importlib.util.module_from_spec(_found)
_found.loader.exec_module(_test_attn)

NAME = "flashmla-decode-emulation"
MODELS = FlashMLADecode.MODELS
SHAPES = {"sparse_attention": FlashMLADecode.SHAPES["sparse_attention"]}
sparse_attention = _test_attn._flashmla_decode_splits
