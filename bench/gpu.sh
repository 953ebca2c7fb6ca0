#!/usr/bin/env bash
# One device session on an NVIDIA GPU: the kernel tests and the conformance suite on CUDA, then the
# benchmarks.  Usage: bash bench/gpu.sh OUTDIR [pytest -k expression]
set -uo pipefail
out=${1:?usage: bench/gpu.sh OUTDIR}
mkdir -p "$out"
export TRITON_INTERPRET=0
python -m pip install --quiet --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt"
cat "$out/gpu.txt"
python -m pytest -q -p no:cacheprovider tests/test_kernels_*.py ${2:+-k "$2"} 2>&1 | tail -25 | tee "$out/pytest_kernels.txt"
python -m dsv4spec verify --quiet --target impl --target kernels --rules FMT,FP4,FP8,HAD,IDX,POOL,LAYER \
  --json "$out/verify.json" --markdown "$out/verify.md" > "$out/verify.txt" 2>&1
echo "verify exit $?"; tail -8 "$out/verify.txt"
for b in bench/bench_*.py; do
  echo "== $b"; timeout 240 python "$b" --out "$out" 2>&1 | tail -30 | tee "$out/$(basename "$b" .py).txt"
done
