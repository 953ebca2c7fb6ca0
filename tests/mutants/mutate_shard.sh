#!/usr/bin/env bash
# One shard of the full machine-made mutation pass (dsv4spec mutate) on a many-core machine, inside
# one 10-minute window: every mutant of impl/ and official/, one worker per core, CPU only.
# Usage: bash tests/mutants/mutate_shard.sh K N OUTDIR     (then, here: dsv4spec mutate --merge OUTDIR/*.json)
set -uo pipefail
k=${1:?usage: mutate_shard.sh K N OUTDIR}; n=${2:?}; out=${3:?}
mkdir -p "$out"
export TRITON_INTERPRET=1
python -m pip install --quiet --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
timeout "${MUTATE_S:-560}" python -m dsv4spec mutate --shard "$k/$n" --jobs "${JOBS:-$(nproc)}" \
  --json "$out/mutate-$k-of-$n.json" > "$out/mutate-$k-of-$n.txt" 2> "$out/mutate-$k-of-$n.progress"
echo "mutate shard $k/$n: exit $?"; head -1 "$out/mutate-$k-of-$n.txt"; tail -2 "$out/mutate-$k-of-$n.progress"
