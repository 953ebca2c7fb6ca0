#!/usr/bin/env bash
# The peers' rows of `dsv4spec bench` on a CUDA GPU: the codecs and top-k against the official TileLang
# kernels (your own copy of inference/kernel.py), FlagGems' DSA top-k (in child processes) and torch
# (bench/bench_peers.py), then sparse attention against the official sparse_attn (bench/bench_attn.py);
# every row eager and replayed from a CUDA graph.  Nothing of DeepSeek's or of the peers is committed:
# the kernel file and the peers' archives travel in ignored folders (.official/, .peers/).
#
#   here, once:    bash bench/peers.sh prepare [KERNEL_PY] [PEERS_DIR]
#   on the GPU:    bash bench/peers.sh run OUTDIR          (carry .official and .peers)
#                  bash bench/peers.sh record OUTDIR       (the complete record, every part, peers included)
#
# prepare copies KERNEL_PY (default /work/shared/reference/official-v4/kernel.py) to .official/kernel.py
# and, from PEERS_DIR (default /work/shared/reference/gpu-peers), the TileLang archives, the FlagGems
# wheel and the SQLAlchemy wheel it imports to .peers/.  run unpacks TileLang into a temporary folder
# (PYTHONPATH), installs FlagGems there with pip --target (no index), and runs
#   dsv4spec bench --only peers  --official .official/kernel.py --flaggems SITE/fgsite   (PEERS_S, default 135 s)
#   dsv4spec bench --only attn --quick --official .official/kernel.py                  (ATTN_S, default 45 s)
#   pytest tests/test_kernels_ops.py (the operators compiled with inductor, no sync)     (TESTS_S, default 40 s)
# record runs, with the same set-up, `dsv4spec bench --record OUTDIR/record --out OUTDIR/bench` with the
# peers (RECORD_S, default 560 s): OUTDIR/record/<date>.json and .md are the record to copy into
# docs/records/h200/ (the folder on the GPU machine does not come back), bench.txt its terminal table.
# run's OUTDIR receives log.txt, peers/ and attn/ (bench.json, bench.md, parts/ of each run), peers.txt,
# attn.txt and pytest_ops.txt.  ATTN_FULL=1 runs every attention shape (about 20 s more).
# QUICK=1 runs the smaller shapes; REP (default 50) is do_bench's time per timing in ms; FLAGGEMS_S
# (default 50) bounds the FlagGems child processes together; SKIP_INSTALL=1 skips `pip install -e .`;
# PYTHON (default python3) is the interpreter.
set -uo pipefail
case "${1:-}" in
prepare)                        # official_kernels.sh's (kernel.py, TileLang), then FlagGems' wheels
  bash bench/official_kernels.sh prepare "${2:-/work/shared/reference/official-v4/kernel.py}" \
    "${3:-/work/shared/reference/gpu-peers}" > /dev/null || exit 1
  cp "${3:-/work/shared/reference/gpu-peers}"/{flag_gems,sqlalchemy}-*.whl .peers/ || exit 1
  du -sh .official .peers
  exit 0;;
run|record)
  mode=$1; out=${2:?usage: bash bench/peers.sh $1 OUTDIR};;
*)
  echo "usage: bash bench/peers.sh prepare [KERNEL_PY] [PEERS_DIR] | run OUTDIR | record OUTDIR" >&2
  exit 2;;
esac

mkdir -p "$out"
py=${PYTHON:-python3}
out=$(cd "$out" && pwd)
log="$out/log.txt"
: > "$log"
say() { echo "$*" | tee -a "$log"; }
site=$(mktemp -d)
official=(); flaggems=()
if [ -f .official/kernel.py ]; then official=(--official "$PWD/.official/kernel.py")
else say "no .official/kernel.py (bash bench/peers.sh prepare, and carry .official): the official kernels' cells are skipped"; fi
tl_ok=1
for archive in .peers/tilelang-*-py312-cu13.tar.xz .peers/tilelang-*-ascend-overlay.tar.xz; do
  [ -f "$archive" ] && tar xJf "$archive" -C "$site" || { say "no TileLang ($archive missing or unreadable): the official kernels' cells are skipped"; tl_ok=0; break; }
done
[ "$tl_ok" = 1 ] && export PYTHONPATH=$site/tlsite${PYTHONPATH:+:$PYTHONPATH}
wheels=(.peers/flag_gems-*.whl .peers/sqlalchemy-*.whl)
if [ -f "${wheels[0]}" ] && [ -f "${wheels[1]}" ] && \
   "$py" -m pip install -q --no-index --no-deps --target "$site/fgsite" "${wheels[@]}" >> "$log" 2>&1; then
  flaggems=(--flaggems "$site/fgsite")
else say "no FlagGems (.peers/flag_gems-*.whl and sqlalchemy-*.whl, or their install failed): its cells are skipped"; fi
export TRITON_INTERPRET=0 DSV4SPEC_FLAGGEMS_S=${FLAGGEMS_S:-50}
if [ -z "${SKIP_INSTALL:-}" ]; then
  "$py" -m pip install --quiet --no-build-isolation --no-deps -e . >> "$log" 2>&1 || { say "pip install -e . failed"; exit 1; }
fi
"$py" -c "import torch, triton; print('torch', torch.__version__, '· triton', triton.__version__, '·', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" 2>&1 | tee -a "$log"
"$py" -c "import tilelang; print('tilelang', tilelang.__version__)" 2>&1 | tail -1 | tee -a "$log"
[ -f .official/kernel.py ] && sha256sum .official/kernel.py | tee -a "$log"
quick=(); [ -n "${QUICK:-}" ] && quick=(--quick)

if [ "$mode" = record ]; then
  start=$SECONDS
  timeout "${RECORD_S:-560}" "$py" -m dsv4spec bench --record "$out/record" --rep "${REP:-100}" "${official[@]}" \
    "${flaggems[@]}" --out "$out/bench" > "$out/bench.txt" 2>&1
  status=$?
  say "bench --record: exit $status in $((SECONDS - start)) s"
  grep -vE '^\{' "$out/bench.txt" | tail -20 | tee -a "$log"
  rm -rf "$site"
  exit $status
fi

start=$SECONDS
timeout "${PEERS_S:-135}" "$py" -m dsv4spec bench --only peers "${quick[@]}" --rep "${REP:-50}" "${official[@]}" \
  "${flaggems[@]}" --out "$out/peers" > "$out/peers.txt" 2>&1
say "bench peers: exit $? in $((SECONDS - start)) s"
grep -vE '^\{' "$out/peers.txt" | tail -40 | tee -a "$log"
attn_quick=(--quick); [ -n "${ATTN_FULL:-}" ] && attn_quick=("${quick[@]}")
start=$SECONDS
timeout "${ATTN_S:-45}" "$py" -m dsv4spec bench --only attn "${attn_quick[@]}" --rep "${REP:-50}" "${official[@]}" \
  --out "$out/attn" > "$out/attn.txt" 2>&1
say "bench attn: exit $? in $((SECONDS - start)) s"
grep -vE '^\{' "$out/attn.txt" | tail -15 | tee -a "$log"
start=$SECONDS
timeout "${TESTS_S:-40}" "$py" -m pytest -q -n 0 -p no:cacheprovider -rs tests/test_kernels_ops.py > "$out/pytest_ops.txt" 2>&1
say "pytest tests/test_kernels_ops.py: exit $? in $((SECONDS - start)) s"
grep -E "^(FAILED|ERROR)" "$out/pytest_ops.txt" | cut -c1-200 | tee -a "$log"; tail -1 "$out/pytest_ops.txt" | tee -a "$log"
rm -rf "$site"
