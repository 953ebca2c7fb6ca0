#!/usr/bin/env bash
# Every case of bench/probe_ncu.py under Nsight Compute (--set full, the clocks left alone), one
# text report a case: OUTDIR/ncu-CASE.txt.  NCU_S (default 60) bounds each case.  Where the NVTX
# filter profiles nothing, the first 8 launches of our kernels (names starting "_": the warm-up
# calls') are profiled instead, into ncu-CASE-launches.txt.
# Usage: bash bench/probe_ncu.sh OUTDIR [CASE ...]
set -uo pipefail
out=${1:?usage: bash bench/probe_ncu.sh OUTDIR [CASE ...]}
shift
mkdir -p "$out"
cases=("$@"); [ ${#cases[@]} -eq 0 ] && cases=(fp4-e4m3 fp4-e8m0 logits-t1 topk-1m-512)
export TRITON_INTERPRET=0
for c in "${cases[@]}"; do
  start=$SECONDS
  timeout "${NCU_S:-60}" ncu --clock-control none --set full --import-source no --nvtx --nvtx-include "probe/" \
    --target-processes all python3 bench/probe_ncu.py "$c" > "$out/ncu-$c.txt" 2>&1
  status=$?
  kernels=$(grep -c 'Section: GPU Speed Of Light' "$out/ncu-$c.txt")
  if [ "$kernels" = 0 ]; then
    timeout "${NCU_S:-60}" ncu --clock-control none --set full --import-source no -k "regex:^_" --launch-count 8 \
      --target-processes all python3 bench/probe_ncu.py "$c" > "$out/ncu-$c-launches.txt" 2>&1
    status=$?
    kernels="0 in the NVTX range; $(grep -c 'Section: GPU Speed Of Light' "$out/ncu-$c-launches.txt") of the first launches"
  fi
  echo "ncu $c: exit $status in $((SECONDS - start)) s; $kernels kernels"
done
