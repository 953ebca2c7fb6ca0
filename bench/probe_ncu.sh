#!/usr/bin/env bash
# Every case of bench/probe_ncu.py under Nsight Compute (--set full, the clocks left alone), one
# text report a case: OUTDIR/ncu-CASE.txt.  NCU_S (default 60) bounds each case.
# Usage: bash bench/probe_ncu.sh OUTDIR [CASE ...]
set -uo pipefail
out=${1:?usage: bash bench/probe_ncu.sh OUTDIR [CASE ...]}
shift
mkdir -p "$out"
cases=("$@"); [ ${#cases[@]} -eq 0 ] && read -ra cases <<< "$(python3 bench/probe_ncu.py --cases)"
export TRITON_INTERPRET=0
for c in "${cases[@]}"; do
  start=$SECONDS
  timeout "${NCU_S:-60}" ncu --clock-control none --set full --import-source no --nvtx --nvtx-include "probe/" \
    --target-processes all python3 bench/probe_ncu.py "$c" > "$out/ncu-$c.txt" 2>&1
  status=$?
  kernels=$(grep -c 'Section: GPU Speed Of Light Throughput' "$out/ncu-$c.txt")
  echo "ncu $c: exit $status in $((SECONDS - start)) s; $kernels kernels"
done
