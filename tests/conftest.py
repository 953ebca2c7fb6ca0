import os
import zlib

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

from dsv4spec.interpreter import skip_dead_overflow_checks  # noqa: E402

skip_dead_overflow_checks()   # our test processes only (dsv4spec/interpreter.py says why it is safe)


# `make test` runs a sample of each slow parametrization below; `make thorough` runs every case
# (pytest -m thorough).  A number keeps that many cases, chosen by a CRC of the case's id: the same
# cases on every machine and every run, never a random draw.  A tuple keeps the cases whose id it
# names, a function the cases it returns.  The rest are marked `thorough` (pyproject.toml leaves them out by default).  Sized by
# `pytest --durations=0` and a fresh clone's `make test` on the 2-core CI machine (issue 33): what is kept runs in a
# tenth of the time and still reaches every rule, kernel path and engine at least once.
LONG_TAIL = {
    # the kernels target on each rule under the interpreter: `make verify` runs it on every rule; make test keeps
    # a cheap rule of three families it serves and three rules it leaves n/i (IDX.TOPK.ORDER and FP4.KV.DIVIDE,
    # a CRC's picks before, cost 15 and 8 CPU s)
    "test_conformance.py::test_kernels_pass_their_families":
        ("[IDX.SCORE.FORMULA]", "[FP4.IDX.SCALE]", "[FP8.BLOCKS]", "[CMP.APE]", "[PATH.QDQ]", "[PATH.HADAMARD]"),
    # impl on each rule at ci: `make verify` judges impl on every rule at ci too (ATTN.LAYER alone ~28 s)
    "test_conformance.py::test_impl_passes": 12,
    # compiles for sm_90 (ptxas on the CPU, 40-300 s a group): the one-kernel compiles stay
    "test_kernels_indexer.py::test_every_kernel_compiles_for_sm90": 0,
    "test_kernels_attn.py::test_kernel_compiles_for_sm90_at_its_launch_configurations": 0,
    "test_kernels_attn.py::test_every_path_passes_the_order_rules": 2,
    "test_kernels_attn.py::test_kernel_passes_the_rule": 2,
    "test_kernels_pool.py::test_row_topk_is_the_engine": 1,
    "test_kernels_pool.py::test_few_row_passes_are_the_engine": 2,
    "test_kernels_pool.py::test_candidate_list_is_the_mask_as_blocks": 8,
    "test_kernels_pool.py::test_candidate_blocks_match_impl": 8,
    "test_kernels_pool.py::test_gather_pool_by_chunks": 3,
    "test_kernels_pool.py::test_scores_with_block_max_are_the_block_scores": 3,
    "test_kernels_indexer.py::test_topk_fused_path_gives_the_launches_bits": 8,
    "test_kernels_indexer.py::test_topk_position_order_by_bitmap_and_by_sort": 1,
    "test_kernels_indexer.py::test_topk_fused_path_block_mask": 3,
    "test_kernels_indexer.py::test_topk_few_rows_give_the_engine_bits": 1,
    "test_kernels_indexer.py::test_topk_few_rows_other_digits_and_chunks": 1,
    "test_kernels_indexer.py::test_topk_sync_free_fallback_gives_the_read_back_bits": 6,
    "test_kernels_indexer.py::test_topk_refinement_and_chunking": 4,
    "test_kernels_indexer.py::test_topk_threshold_filter_serves_every_row": 8,
    "test_kernels_indexer.py::test_topk_select_ignores_candidate_order": 4,
    "test_kernels_indexer.py::test_topk_one_program_radix_serves_only_flagged_rows": 2,
    "test_kernels_indexer.py::test_score_variants_give_the_shipped_bits": 2,
    "test_kernels_indexer.py::test_topk_filter_reservations_across_many_tiles": 3,
    "test_kernels_indexer.py::test_topk_sync_free_block_mask": 2,
    # the control's codec rules through a BF16-only port: test_official runs every rule at fp32
    "test_official.py::test_a_bf16_only_port_passes_every_codec_rule": 5,
    # the cast targets' rows (`make verify` runs both on every rule, unasserted): make test asserts the rows
    # that are not PASS (ml_dtypes' FAIL naming its overflow, the n/i of what a cast lacks) and one PASS each
    "test_formats.py::test_cast_target_rows":
        lambda cases: [c for c in cases if c.name.split("-")[1].rstrip("]") in (
            "FMT.E4M3.SATFINITE", "FMT.CEIL_LOG2", "FMT.E2M1.VALUES", "FMT.E8M0.VALUES")],
    # every mutant of a codec rule is caught (test_mutants); its focus on the other rules is sampled: the
    # cheapest case (11 s; e2m1_zero_sign_lost, the CRC's pick, 54 s), still three rules of two families
    "test_mutants_quant.py::test_mutant_fails_only_its_own_rules": ("[e8m0_scale_one_too_low]",),
    "test_mutants_quant.py::test_undeclared_known_variant_is_named": 10,
    # numpy with the most SIMD levels this machine has switched off: the strongest of the levels
    "test_golden.py::test_generator_gives_the_same_bits_on_every_numpy_dispatch_level":
        lambda cases: [max(cases, key=lambda c: c.name.count("+"))],
    "test_golden_attn.py::test_attention_cases_regenerate_bit_for_bit_under_one_and_two_threads": ("[2]",),
    # a layer clause's mutant runs every stage of ATTN.LAYER's 24 explicit cases (~40 s): make test keeps
    # every other clause; test_attn.py judges each of these mutants by this check's stage judges on a whole
    # case (test_the_layer_check_names_the_planted_stage, test_a_port_keeping_the_window_in_position_order_
    # passes_at_decode); make thorough fails the rule through this check on every layer mutant
    "test_clauses.py::test_the_named_check_fails_on_the_clause_mutant":
        lambda cases: [c for c in cases if "every_attention_stage" not in c.name],
    # each kind × 3 routes (~10 s a kind); the routes answer every TargetLoadError alike, so make test keeps
    # a module raising on import (a syntax error raises there too) and an exec port (its missing file raises
    # before the start, its broken handshake after); the usage error of no operation (exit 2) stays on
    # every route in test_exec_target (an exec port declaring none); a module providing none, in make thorough
    "test_load_failures.py::test_an_unloadable_target_is_answered_the_same_on_every_route":
        ("[import error]", "[exec command that breaks the handshake]"),
    # the guard's and the workers' report of a process ended while loading: one way of ending it in make test
    # (test_faults ends a run with os._exit, "exit status 0")
    "test_load_failures.py::test_a_target_that_ends_the_process_as_it_loads_could_not_be_loaded_on_every_route":
        ("[a signal]",),
    # ATTN.LAYER's coverage (its five boundaries: the models, prefill and decode, a prefill with no entry yet) is
    # the fixed layer cases' (25 CPU s); make test keeps every other rule's
    "test_coverage.py::test_random_draws_reach_every_boundary_of_the_other_families":
        lambda cases: [c for c in cases if "[ATTN.LAYER]" not in c.name],
    # the H100 record pinned by one of its two failing rules in make test, both in make thorough
    "test_attn.py::test_flashmla_decode_splits_give_what_the_h100_gave": 1,
}


def _sampled(function: str, cases: list) -> set:
    keep = LONG_TAIL[function]
    if callable(keep):
        return set(keep(cases))
    if isinstance(keep, tuple):
        kept = {c for c in cases if any(k in c.name for k in keep)}
        if len(kept) != len(keep):
            raise pytest.UsageError(f"tests/conftest.py LONG_TAIL[{function!r}] keeps {keep}, matching "
                                    f"{sorted(c.name for c in kept)}")
        return kept
    return set(sorted(cases, key=lambda c: (zlib.crc32(c.name.encode()), c.name))[:keep])


@pytest.hookimpl(tryfirst=True)      # before -m deselects
def pytest_collection_modifyitems(config, items):
    by_function: dict = {}
    for item in items:
        function = item.nodeid.split("[")[0].removeprefix("tests/")
        if function in LONG_TAIL:
            by_function.setdefault(function, []).append(item)
    files = {item.nodeid.split("::")[0].removeprefix("tests/") for item in items}
    stale = {f for f in set(LONG_TAIL) - set(by_function) if f.split("::")[0] in files}
    if stale:                                   # a renamed test must not leave the table behind
        raise pytest.UsageError(f"tests/conftest.py LONG_TAIL names tests that are not collected: {sorted(stale)}")
    for function, cases in by_function.items():
        kept = _sampled(function, cases)
        for item in cases:
            if item not in kept:
                item.add_marker(pytest.mark.thorough)
