#!/usr/bin/env bash
# Device call H (issue 41): bench_trace at 65536 tokens, one judge process on every core, after the
# judge stopped reading the whole step's KV per chunk (trace/judge.py reads_only).  Nothing to carry.
set -u
o=$OUT/h; mkdir -p "$o"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$o/install.txt" 2>&1
( while sleep 5; do echo "$SECONDS $(free -m | awk '/Mem:/{print $3, $7}')"; done ) > "$o/memory.txt" & mon=$!
timeout -k 5 570 python3 bench/bench_trace.py --tokens 65536 > "$o/bench_trace.json" 2> "$o/bench_trace.err"
echo "exit $? at $SECONDS s" >> "$o/bench_trace.err"; kill $mon
cat "$o/bench_trace.err" "$o/bench_trace.json"; tar -C "$OUT" -czf "$OUT/h.tgz" h && rm -rf "$o"
