#!/usr/bin/env bash
# One device session on an NVIDIA GPU: the conformance suite and the goldens with the kernels on
# CUDA, then the kernel tests; the benchmarks too with BENCH=1.
# Usage: [BENCH=1] bash bench/gpu.sh OUTDIR
set -uo pipefail
out=${1:?usage: bench/gpu.sh OUTDIR}
mkdir -p "$out"
export TRITON_INTERPRET=0
python -m pip install --quiet --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$out/gpu.txt"
timeout "${VERIFY_S:-300}" python -m dsv4spec verify --quiet --target impl --target kernels \
  --rules FMT,FP4,FP8,HAD,IDX,POOL,LAYER --json "$out/verify.json" --markdown "$out/verify.md" > "$out/verify.txt" 2>&1
echo "verify exit $?"; tail -6 "$out/verify.txt"
python -m dsv4spec golden check --target kernels > "$out/golden.txt" 2>&1; echo "golden exit $?"
timeout "${PYTEST_S:-150}" python -m pytest -q -x -p no:cacheprovider tests/test_kernels_*.py > "$out/pytest_kernels.txt" 2>&1
echo "pytest exit $?"; tail -3 "$out/pytest_kernels.txt"
if [ -n "${BENCH:-}" ]; then
  for b in bench/bench_*.py; do timeout 240 python "$b" --out "$out" > "$out/$(basename "$b" .py).txt" 2>&1; done
fi
