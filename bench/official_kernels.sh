#!/usr/bin/env bash
# The official V4 kernels (your own copy of inference/kernel.py, TileLang) through the suite on a CUDA GPU:
# every rule they can serve in the ci and dev profiles, then the bit comparison with `official` and
# `kernels` on the same inputs (bench/official_kernels.py).  Nothing of DeepSeek's is committed: the
# kernel file and TileLang travel in ignored folders (.official/, .peers/).
#
#   here, once:    bash bench/official_kernels.sh prepare [KERNEL_PY] [PEERS_DIR]
#   on the GPU:    bash bench/official_kernels.sh run OUTDIR        (carry .official and .peers)
#
# OUTDIR receives at most 7 files: log.txt, verify_{ci,dev}.{json,md}, compare.{json,md}.
# VERIFY_S (default 170) bounds each verify run, COMPARE_S (default 120) the comparison, SEED the dev seed;
# RULES narrows the verify runs (default: every rule; those it cannot serve are n/i); SKIP_INSTALL=1
# skips `pip install -e .` (a checkout already installed).
set -uo pipefail
case "${1:-}" in
prepare)
  kernel=${2:-/work/shared/reference/official-v4/kernel.py}
  peers=${3:-/work/shared/reference/gpu-peers}
  mkdir -p .official .peers
  cp "$kernel" .official/kernel.py || exit 1
  cp "$peers"/tilelang-*-py312-cu13.tar.xz "$peers"/tilelang-*-ascend-overlay.tar.xz .peers/ || exit 1
  du -sh .official .peers
  exit 0;;
run)
  out=${2:?usage: bash bench/official_kernels.sh run OUTDIR};;
*)
  echo "usage: bash bench/official_kernels.sh prepare [KERNEL_PY] [PEERS_DIR] | run OUTDIR" >&2
  exit 2;;
esac

mkdir -p "$out"
log="$out/log.txt"
: > "$log"
say() { echo "$*" | tee -a "$log"; }
[ -f .official/kernel.py ] || { say "no .official/kernel.py: run 'bash bench/official_kernels.sh prepare' and carry .official"; exit 1; }
site=$(mktemp -d)
for archive in .peers/tilelang-*-py312-cu13.tar.xz .peers/tilelang-*-ascend-overlay.tar.xz; do
  [ -f "$archive" ] || { say "no $archive: run 'bash bench/official_kernels.sh prepare' and carry .peers"; exit 1; }
  tar xJf "$archive" -C "$site" || { say "cannot unpack $archive"; exit 1; }
done
export PYTHONPATH=$site/tlsite${PYTHONPATH:+:$PYTHONPATH}
export TRITON_INTERPRET=0 DSV4SPEC_OFFICIAL_KERNEL=$PWD/.official/kernel.py
if [ -z "${SKIP_INSTALL:-}" ]; then
  python -m pip install --quiet --no-build-isolation --no-deps -e . >> "$log" 2>&1 || { say "pip install -e . failed"; exit 1; }
fi
python -c "import tilelang, torch; print('tilelang', tilelang.__version__, '· torch', torch.__version__, '·', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" 2>&1 | tee -a "$log"
sha256sum .official/kernel.py | tee -a "$log"

for profile in ci dev; do
  seed=(); [ "$profile" = dev ] && seed=(--seed "${SEED:-1}")
  start=$SECONDS
  rules=(); [ -n "${RULES:-}" ] && rules=(--rules "$RULES")
  timeout "${VERIFY_S:-170}" python -m dsv4spec verify --target official-kernels --profile "$profile" "${seed[@]}" "${rules[@]}" \
    --isolate --timeout 120 --json "$out/verify_$profile.json" --markdown "$out/verify_$profile.md" \
    > "$out/verify_$profile.txt" 2> "$out/verify_$profile.progress"
  status=$?
  say "verify $profile: exit $status in $((SECONDS - start)) s"
  grep -vE "^\S+\s+n/i\s*$" "$out/verify_$profile.txt" >> "$log"        # the rows it served, and the summary
  tail -3 "$out/verify_$profile.progress" >> "$log"
  rm -f "$out/verify_$profile.txt" "$out/verify_$profile.progress"
done

start=$SECONDS
timeout "${COMPARE_S:-120}" python bench/official_kernels.py --kernel .official/kernel.py --out "$out" >> "$log" 2>&1
say "compare: exit $? in $((SECONDS - start)) s"
timeout 60 python -m pytest -q -n 0 -p no:cacheprovider tests/test_official_kernels.py -rs 2>&1 | tail -3 | tee -a "$log"
