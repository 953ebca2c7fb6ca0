"""Budgets against hand derivations from the model configs, the BUDGET checks, the CLI."""
import json
import subprocess
import sys
from fractions import Fraction

import pytest

from dsv4spec.spec import budget

M1 = 2 ** 20


def test_kv_bytes_per_token():
    # V4-Flash: 21 CSA (584 + 68) / 4 + 20 HCA 584 / 128 = 3423 + 91.25
    assert budget.kv_bytes_per_token("v4-flash") == Fraction(3423) + Fraction(9125, 100)
    # V4-Pro: 30 CSA · 163 + 31 HCA (layers 0, 1 and 29 odd ones) · 4.5625
    assert budget.kv_bytes_per_token("v4-pro") == 30 * 163 + 31 * Fraction(45625, 10000)
    # V4.1-Flash: main 3·288/2 + 288 = 720, index 3·68/2 + 68 = 170
    assert budget.main_kv_bytes_per_token("v4.1-flash") == 720
    assert budget.index_k_bytes_per_token("v4.1-flash") == 170
    # without sharing: 18 ratio-2 layers · 144 + 20 ratio-1 layers · 288
    assert budget.main_kv_bytes_per_token("v4.1-flash", sharing=False) == 18 * 144 + 20 * 288 == 8352


def test_window_is_constant_per_layer():
    assert budget.window_bytes_per_layer("v4-flash") == 128 * 584
    assert budget.window_bytes_per_layer("v4.1-flash") == 128 * 528


def test_indexer_work_and_the_pool():
    per_entry = 32 * 128                                   # V4.1 index heads × head dim
    assert budget.indexer_layer_macs("v4.1-flash", 24, M1) == 16384 * per_entry    # ≈ 6.7e7
    assert budget.indexer_layer_macs("v4.1-flash", 20, M1) == M1 * per_entry        # the source scans all
    assert budget.reindex_macs("v4.1-flash", M1, pool=False) == 4 * M1 * per_entry  # ≈ 1.7e10
    assert budget.reindex_macs("v4.1-flash", M1) == 4 * 16384 * per_entry           # ≈ 2.7e8
    # whole indexer: encoder 3 · 2^19 + layer 20 · 2^20 + re-index (4 · 16384 | 4 · 2^20)
    assert budget.indexer_pool_saving("v4.1-flash", M1) == Fraction(3 * 2**19 + 2**20 + 4 * 16384,
                                                                    3 * 2**19 + 5 * 2**20)
    # at or below 16384 tokens the pool saves nothing
    assert budget.indexer_pool_saving("v4.1-flash", 16384) == 1 < 1 / budget.indexer_pool_saving("v4.1-flash", 16385)
    assert budget.indexer_macs_per_token("v4-flash", M1) == 21 * (M1 // 4) * 64 * 128


def test_core_attention():
    assert budget.core_attention_macs("v4-pro", 2, M1) == 2 * 128 * 512 * (128 + 1024) == 150_994_944
    assert budget.attended_entries("v4-pro", 3, M1) == 128 + M1 // 128            # HCA: everything visible
    assert budget.attended_entries("v4.1-flash", 25, M1) == 128 + 512               # a reuse layer
    assert budget.attended_entries("v4-flash", 2, 100) == 100 + 25                  # short context


def test_budgets_refuse_v32():
    with pytest.raises(ValueError, match="no compressed KV cache"):
        budget.kv_bytes_per_token("v3.2")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "dsv4spec", "budget", *args], capture_output=True, text=True)


def test_cli_table_and_json():
    out = cli("--model", "v4.1-flash").stdout
    assert "candidate_source (ratio 1)" in out and "890 B/token" in out and "0.394" in out
    data = json.loads(cli("--model", "v4-flash", "--context", "1M", "--json").stdout)
    assert data[0]["totals"]["kv_bytes_per_token"] == 3514.25 and data[0]["context"] == M1


@pytest.mark.parametrize("args,needle", [(["--model", "v9"], "unknown model"), (["--context", "-3"], "non-negative"),
                                         (["--context", "1.5"], "non-negative integer"),
                                         (["--model", "v3.2"], "no compressed KV cache")])
def test_cli_errors_exit_2_without_traceback(args, needle):
    r = cli(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_cli_plot_needs_matplotlib(tmp_path):
    r = cli("--plot", str(tmp_path / "b.png"))
    try:
        import matplotlib  # noqa: F401
        assert r.returncode == 0 and (tmp_path / "b.png").exists()
    except ImportError:
        assert r.returncode == 2 and "pip install matplotlib" in r.stderr and "Traceback" not in r.stderr
