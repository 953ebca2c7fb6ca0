"""Decision coverage: which of a rule's decision boundaries a profile's examples reach.

Every rounding or selection decision a rule makes has boundaries (an E2M1 tie, an E8M0 power of
two, an E4M3 midpoint of amax/6, compress_lens a multiple of 8, the 16384-position capacity …).
A check that never puts an input on a boundary, one ulp below it and one above, cannot tell the
official decision from its neighbour.  Coverage runs a rule's checks against a target through a
recording proxy that keeps every input the checks pass to an operation, then evaluates, per
boundary, a predicate over the recorded inputs in spec terms ("some element's |x|/s is exactly
0.75", "one fp32 ulp below", "in a row ≥ 1 at an odd block index").  Levels, as in TestFloat:
element, scale, range, layout.  The recorder also knows which inputs a randomly drawn example made
(suite.forall tells it), so per rule the listing says which boundaries random draws reach, and in
what share of one check's drawn examples (at least 1/50 is the goal), apart from what only the
explicit @examples or a fixed sweep reach.  A layer check draws too few layers at ci (2) for a
share to mean anything, so its strategy (path.layer_keys) is also measured on its own: a few
hundred keys drawn with a fixed seed, each classified by the same boundaries, nothing run
(strategy_rates).  The HAD, CMP, LAYOUT, BUDGET, LAYER, ROPE, PATH and ATTN
rules list the argument-level inputs where their clauses decide (a ratio, an incomplete group,
decode after the ring wrapped, each layout kind, a −1 in a later block of 64, the sink above the
exp overflow …).  properties/clauses.py lists each rule's clauses beside the check and the mutants
that fail when one alone changes (--clauses).

    dsv4spec coverage --profile ci --rules FP4,POOL

The engine (engine.py: the recorder, the runs, the report) is one module; each family's boundaries
are the module of its name (quant.py: FMT, FP4, FP8; indexer.py: IDX, HAD; pool.py; compressor.py;
layout.py; budget.py; rope.py; path.py: PATH, LAYER; attn.py), on the shared vocabulary of
boundary.py (Call, Boundary, around, seen).  Every name stays importable from here.
"""

from __future__ import annotations

from .boundary import arg, around, Boundary, Call, F32, f32_step, LEVELS, of, _rows, seen
from .engine import (BOUNDARIES, boundaries, coverage, _digest, _drawn, drawn_values, _KEYS, layer_key_calls,
                     _layer_keys, LAYER_OPS, layer_strategy_rules, MEMO_OPS, OTHER, _per_drawn_example, _plain,
                     random_counts, random_rates, RANDOM_REACH, rarely_drawn_by_the_strategies, Recorder, render,
                     REQUIRED, rule_coverage, RuleCoverage, _SameProvider, _strategy, STRATEGY_DRAWS, strategy_rates,
                     STRATEGY_SEED)
from .quant import (above_floor, amax_hit, amax_in, _any_block, bf16_boundaries, _block_of, Blocks, blocks_of,
                    codec_blocks, dequant, _e2m1, E2M1_POINTS, e2m1_rounding, e2m1_saturation, _e4m3, E4M3_GRID,
                    E4M3_MIDPOINT_CLASSES, E4M3_MIDPOINTS, e4m3_rounding, element_blocks, _fp4, _fp8, fp8_floor,
                    fp8_linear_shapes, _idx, idx_floor, _just_above_pow2, _kv, kv_clamp, kv_divide, kv_floor,
                    kv_midpoints, kv_saturate, kv_scale, layout, _LOWER_CODE, nonfinite, on_points, on_set,
                    payload_range, pow2_edges, pow2_scale, QUANT_ALL, quant_boundaries, QUANT_FP4, ratio_hit,
                    ratio_in, _spec_scale, zero_sign)
from .indexer import (chunk_boundaries, fp4_scores, had_boundaries, idx_boundaries, _kth_tie, mask_boundaries,
                      _score_calls, score_formula, score_rounding, _scores_differ, _sylvester, topk_boundaries,
                      _topk_rows, tp_boundaries, v32_scores, visible_boundaries, _visible_rows, weight_boundaries,
                      weight_v32_boundaries)
from .pool import _block_kth_tie, pool_boundaries, _pool_rows, pool_rule_boundaries, reindex_boundaries
from .compressor import cmp_boundaries
from .layout import layout_boundaries
from .budget import budget_boundaries
from .rope import rope_boundaries
from .path import (_blocks_apart, layer_boundaries, _layer_call, layer_call_boundaries, path_boundaries,
                   published_k_boundaries)
from .attn import attn_boundaries, _no_entry_yet

