"""The top-k engine of the Triton kernels, shared by kernels.indexer (index_topk) and kernels.pool
(candidate blocks, re-index): the k largest fp32 scores of each row among its first n_valid
positions, in position order (V4.1) or score order with ties by position (V4), or marked as the
blocks of a mask.

Top-k.  A row is an unordered multiset of fp32 scores mapped to order-preserving uint32 keys
(-0 folded onto +0).  The fast path is a threshold filter (group maxima give a threshold that
lets through about 1.1 k keys; one streaming pass appends those keys by atomic slots, the next
tile in flight; a per-row select fixes the k-th key (one histogram relative to the threshold, or
8-bit digit passes) and the last tied position, then puts the k chosen positions into V4.1's
order through a bitmap of the row (short rows) or a sort; see "Threshold filter" below, tunables
in FilterTune); rows it cannot hold go through the
radix engine: radix select on the top 12 key bits (per-chunk histograms plus a row
histogram), refined on 12 and then 8 more bits only while the boundary bin is too full; then one
ordered compaction writes, in position order, every key above the boundary and the boundary-bin
keys (at most CAP per row); a last per-row program finds the exact k-th key among those
candidates, breaks ties toward the lowest position, and emits positions (V4.1 order) or sorts
the <= CAP candidates by (score desc, position asc) (V4 order).  Deterministic: every count is an
integer; the radix engine places by prefix sums, and the filter's atomic slots only decide where a
candidate waits, never whether it is chosen or where it lands in the output.  The rows the filter
flags are served either after a host read-back of the flags (sync=True, the default: the
several-programs-a-row radix engine on those rows only, no launch when none is flagged) or on the
device (sync=False: one launch of one program a row, _radix_rows_kernel, which returns at once for
unflagged rows and runs the whole radix select for flagged ones; nothing waits for the host, so a
CUDA graph can capture the call).  The selection is unique (ties to the lowest position), so both
give the same bits.  Few rows of long rows take neither: the few-row passes (few.py) spread the select over
each row's chunks.

One module a pass family: radix.py (the radix engine), filter.py (the threshold filter), fused.py
(the fused one- or two-launch path), few.py (the few-row passes); here, the launcher _topk_engine
and its choice of path.  Every name stays importable as dsv4spec.kernels.topk.X.
"""

from __future__ import annotations

import contextlib
import os

import torch

# Every engine's names, importable as kernels.topk.X (the tests, the benches, the sm_90 compile script).
from .radix import (_BINS, _boundary_bin, _boundary_kernel, _compact_kernel, _compact_range, _emit_selection,
                    _final_kernel, _final_select, _hist_kernel, _order_key, _output_args, _PASSES, _pow2, _radix_cap,
                    _radix_pass, _radix_row, _radix_rows_kernel, _range_hist, _refine, _topk_config, _topk_radix,
                    _topk_radix_rows, _valid_keys)
from .filter import (_bit_of, _BITMAP_WORDS_PER_PICK, _chosen, _DIGIT, _digit_pass, _emit_by_bitmap, _emit_sorted,
                     _filter_chunk, _filter_config, _filter_kernel, _FILTER_OVERRIDE, _filter_plan, _filter_shape,
                     filter_tuning, FilterTune, _group_max_chunk, _group_max_kernel, _list_keys, _mark_blocks,
                     _MAX_GROUPS, _popcount, _row_keys, _select_kernel, _select_row, _threshold_kernel,
                     _threshold_row, _top16_pass, _topk_filter, _write_sorted)
from .fused import (_CAPTURED, _filter_finish_kernel, _finish_row, _fused_plan, _FusedPlan, _last_to_arrive,
                    _max_threshold_kernel, _new_workspace, _ONE_PROGRAM_ROW, _row_topk_kernel, _topk_fused,
                    _workspace)
from .few import (_few_boundary, _few_chunk_hist, _few_config, _FEW_DIGITS, _few_emit_kernel, _few_pass_kernel,
                  _few_place, _few_plan, _FEW_PROGRAMS, _FEW_ROWS, few_rows, _FEW_ROWS_MAX, _FEW_ROWS_MIN_K,
                  _FEW_ROWS_MIN_N, FEW_ROWS_MODES, _few_rows_serve, _FewPlan, _new_few_workspace, _topk_few_rows)


TOPK_PATHS = ("auto", "fused", "launches")
_TOPK_PATH = [os.environ.get("DSV4SPEC_TOPK_PATH", "auto")]   # the env var: the A/B's other sides
# "auto" takes the fused path eagerly on calls of up to this many scores (R·N).  H200, 12-03
# (docs/records/h200/2026-12-03-ab-topk-mid-rows.txt, -many-rows.txt), eager µs fused / launches: 8×1M
# 134 / 337 and 64×256K 196 / 324 (16M scores: the launches path pays its five launches' host
# time), 512×64K 673 / 263, 1024×32K 585 / 194, 64×1M 469 / 270, 1024×64K 1442 / 476 (32M and
# more: the fused kernels' longer device time is no longer hidden behind the host's).
_FUSED_MAX_SCORES = 1 << 24
if _TOPK_PATH[0] not in TOPK_PATHS:
    raise ValueError(f"DSV4SPEC_TOPK_PATH must be one of {TOPK_PATHS}, got {_TOPK_PATH[0]!r}")


@contextlib.contextmanager
def topk_path(name: str):
    """Within the block, _topk_engine takes path name: "auto" (the default: "fused" eagerly on up
    to _FUSED_MAX_SCORES scores, "launches" on more and inside a CUDA graph capture), "fused"
    (eagerly on every shape) or "launches" (the four launches of the filter, then the radix
    fallback's launch or read-back, as before 12-02)."""
    if name not in TOPK_PATHS:
        raise ValueError(f"topk_path: expected one of {TOPK_PATHS}, got {name!r}")
    saved = _TOPK_PATH[0]
    _TOPK_PATH[0] = name
    try:
        yield
    finally:
        _TOPK_PATH[0] = saved


def _topk_engine(x: torch.Tensor, n_valid: torch.Tensor, k: int, *, by_score: bool = False,
                 drop_neg_inf: bool = False, remap: torch.Tensor | None = None,
                 mask_out: torch.Tensor | None = None, mask_block: int = 0,
                 group: int | None = None, cap: int | None = None,
                 blocks: tuple[int, int] | None = None, sync: bool = True) -> torch.Tensor | None:
    """Top-k of each row of x [R,N] (fp32, on the device) among positions < n_valid[r] (int32).

    Returns int64 [R,k] (position order, or score order with ties by position; -1 tail), or,
    with mask_out ([R,W] int8, zeroed), marks the selected positions' blocks of mask_block.
    The threshold filter serves every row it can; the rows it flags go through a radix engine:
    sync=True reads the flags back to the host and, only when a row is flagged, runs _topk_radix
    (several programs a row) on those rows: no extra launch in the common case, one
    synchronization.  sync=False launches _topk_radix_rows (one program a row), whose programs of
    unflagged rows return at once: one extra launch, no read-back, so the call can be captured in
    a CUDA graph.  Both give the same bits: the selection is unique (ties to the lowest position).
    group (G), cap (candidates per row) and blocks ((BLOCK, CH)) override the filter's defaults
    for tests.

    Few rows of long rows (_few_rows_serve; the switch few_rows, DSV4SPEC_FEW_ROWS) go through
    neither: _topk_few_rows spreads the select over the rows' chunks (a launch a key digit, then
    the emission; nothing read back), the same bits.

    That is the "launches" path.  The "fused" path (topk_path; the default's eager calls of up to
    _FUSED_MAX_SCORES scores) runs the same filter and select, and the radix engine on the rows
    whose candidates overflow, in one launch where a row is one program's and two otherwise, never
    reading back (sync has no effect), with its workspaces cached per shape and its launch
    configuration computed once per shape: the same bits.
    """
    R, N = x.shape
    mask = mask_out is not None
    if _few_rows_serve(x, k):
        out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
        if R:
            _topk_few_rows(x, n_valid, k, out, by_score=by_score, drop_neg_inf=drop_neg_inf, remap=remap,
                           mask=mask, mask_block=mask_block, blocks=blocks)
        return None if mask else out
    if _fused_serves(x):
        override = tuple(sorted(_FILTER_OVERRIDE.items())) if _FILTER_OVERRIDE else ()
        plan = _fused_plan(R, N, k, by_score, drop_neg_inf, remap is not None, mask, mask_block, group,
                           cap, blocks, override)
        if plan is not None:
            out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
            if R:
                _topk_fused(plan, x, n_valid, out, remap, mask)
            return None if mask else out
    out = mask_out if mask else torch.empty((R, k), dtype=torch.int64, device=x.device)
    fallback = dict(by_score=by_score, drop_neg_inf=drop_neg_inf, mask_block=mask_block)
    flag = _topk_filter(x, n_valid, k, out, remap=remap, mask=mask, group=group, cap=cap,
                        blocks=blocks, **fallback)
    if flag is None:
        return _topk_radix(x, n_valid, k, remap=remap, mask_out=mask_out, **fallback)
    if not sync:
        _topk_radix_rows(x, n_valid, k, flag, out, remap=remap, mask=mask, **fallback)
    elif bool(flag.any()):   # (the one read back: did the filter leave rows?)
        redo = torch.nonzero(flag).flatten()
        if not mask:
            out[redo] = _topk_radix(x[redo], n_valid[redo], k,
                                    remap=None if remap is None else remap[redo], **fallback)
        else:
            sub = torch.zeros_like(mask_out[redo])
            _topk_radix(x[redo], n_valid[redo], k, mask_out=sub, **fallback)
            mask_out[redo] = sub
    return None if mask else out


def _fused_serves(x: torch.Tensor) -> bool:
    """Whether _topk_engine takes the fused path on x (topk_path's modes).  Measured on the H200
    (docs/records/h200/2026-12-02-ab-topk.json): the fused path costs less host time (eager 103 against
    471 µs at 1×1M k 512) but more device time (graph 49 against 33 µs), so a CUDA-graph capture,
    where host time is paid once, takes the launches path, and so do large eager calls
    (_FUSED_MAX_SCORES).  Same bits."""
    mode = _TOPK_PATH[0]
    if mode == "launches" or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    return mode == "fused" or x.numel() <= _FUSED_MAX_SCORES


def clear_workspaces():
    """Forget the fused path's plans and the workspaces kept with them (not those a CUDA graph
    captured: they stay while the process lives)."""
    _fused_plan.cache_clear()
    _few_plan.cache_clear()
