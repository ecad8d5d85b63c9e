#!/usr/bin/env bash
# Benchmark `rlcr score`: rows/s on synthetic countdown rows, Parquet in and out.
#
# usage: scripts/bench_score.sh [ROWS] [DIR]
#   ROWS  rows in the table (default 1000000)
#   DIR   where the tables go (default /dev/shm/rlcr-bench: tmpfs, so that the figure measures
#         rlcr rather than the disk; the output is still fsync'ed and renamed as always)
# env:
#   RLCR             an optimized rlcr binary (default: `cargo build --release`, then use it)
#   CONTEXT_TOKENS   prompt tokens per row (default 100)
#   RESPONSE_TOKENS  response tokens (and log-probs) per row (default 120)
#   RUNS             timed runs (default 3; the best wall time is reported)
#
# The table is made by scripts/gen_bench_table.py (pyarrow) once per size and kept. Prints, per
# run, wall seconds, CPU seconds (user + system, all threads) and rows/s; then the best run.
# Other processes on the machine inflate the wall time, not the CPU time: compare CPU seconds
# when the machine is busy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-1000000}
DIR=${2:-/dev/shm/rlcr-bench}
CTX=${CONTEXT_TOKENS:-100}
RESP=${RESPONSE_TOKENS:-120}
RUNS=${RUNS:-3}
mkdir -p "$DIR"
if [ -z "${RLCR:-}" ]; then
  cargo build --release --bin rlcr >&2
  RLCR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/rlcr
fi
IN="$DIR/countdown-$ROWS-$CTX-$RESP.parquet"
OUT="$DIR/scored.parquet"
if [ ! -f "$IN" ]; then
  echo "generating $IN" >&2
  python3 scripts/gen_bench_table.py "$IN" --rows "$ROWS" --context-tokens "$CTX" --response-tokens "$RESP"
fi
echo "input: $IN ($(du -h "$IN" | cut -f1)), $ROWS rows, $CTX context + $RESP response tokens per row"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
best=""
for i in $(seq 1 "$RUNS"); do
  rm -f "$OUT"
  t=$( { /usr/bin/time -f "%e %U %S" "$RLCR" -q score --input "$IN" -o "$OUT" >/dev/null; } 2>&1 | tail -1)
  read -r wall user sys <<<"$t"
  cpu=$(python3 -c "print(f'{$user + $sys:.2f}')")
  rate=$(python3 -c "print(f'{$ROWS / max($wall, 1e-9):,.0f}')")
  echo "run $i: ${wall} s wall, ${cpu} s CPU, ${rate} rows/s"
  if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $wall < $best else 1)"; then best=$wall; fi
done
echo "best: $(python3 -c "print(f'{$ROWS / max($best, 1e-9):,.0f}')") rows/s ($best s for $ROWS rows); output $(du -h "$OUT" | cut -f1)"
