#!/usr/bin/env bash
# One device session on an NVIDIA GPU: the conformance suite with the kernels on CUDA (one family
# group at a time, results streamed so a cut-off run still leaves evidence), the goldens, then the
# kernel tests; the benchmarks too with BENCH=1.
# Usage: [TARGETS="impl kernels"] [BENCH=1] bash bench/gpu.sh OUTDIR
# PYTEST_FILES (default tests/test_kernels_*.py) splits the kernel tests over calls: on a cold
# Triton cache they take more than one 300 s bound (12-03: 95 % of them with -n 16).
set -uo pipefail
out=${1:?usage: bench/gpu.sh OUTDIR}
mkdir -p "$out"
export TRITON_INTERPRET=0
python -m pip install --quiet --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$out/gpu.txt"
targets=(); for t in ${TARGETS:-kernels}; do targets+=(--target "$t"); done
for group in FMT,FP4,FP8 HAD,IDX,POOL,LAYER,PATH.ORDER; do
  name=verify_${group//,/_}
  start=$SECONDS
  timeout "${VERIFY_S:-300}" python -m dsv4spec verify "${targets[@]}" --rules "$group" \
    --json "$out/$name.json" --markdown "$out/$name.md" > "$out/$name.txt" 2> "$out/$name.progress"
  echo "verify $group: exit $? in $((SECONDS - start)) s"; grep -E "^(impl|kernels):|conformance" "$out/$name.txt"
done
python -m dsv4spec golden check --target kernels > "$out/golden.txt" 2>&1; echo "golden exit $?"; grep -c PASS "$out/golden.txt"
# every kernel test, 20-run determinism included (tests/test_kernels_determinism.py); no -x: one run shows
# every failure
timeout "${PYTEST_S:-300}" python -m pytest -q -n "${PYTEST_N:-8}" -p no:cacheprovider ${PYTEST_FILES:-tests/test_kernels_*.py} \
  > "$out/pytest_kernels.txt" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$out/pytest_kernels.txt"; tail -1 "$out/pytest_kernels.txt"
if [ -n "${BENCH:-}" ]; then
  for b in bench/bench_*.py; do timeout 240 python "$b" --out "$out" > "$out/$(basename "$b" .py).txt" 2>&1; done
fi
