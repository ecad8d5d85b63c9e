#!/usr/bin/env bash
# Side-by-side speed of rlcr and Hugging Face transformers on this machine, in one run.
#
#   scripts/bench.sh [sample|train|gemm|all]
#
# Environment:
#   SMOLLM2   SmolLM2-135M-Instruct folder (default /tmp/smollm2-hf; make it with
#             scripts/fetch_smollm2.sh)
#   PY        a python with torch + transformers (default /tmp/tv/bin/python, else python3)
#   REPS      repetitions of every measurement (default 3); rlcr and transformers alternate, so
#             both see the same load
#   BATCHES   sampling batch sizes (default "8 32 64"); NEW new tokens per row (default 128)
#   RESULTS   file that keeps the raw RESULT lines (default: a new /tmp/rlcr-bench.* file)
#   THREADS   threads for both sides (default 2: rayon for rlcr, torch.set_num_threads)
#   RLCR_DECODE_BF16  passed through (see src/model/cpu.rs; default: bf16 panels only when lossless)
#
# Workloads (the same on both sides):
#   sample  examples/bench_sample.rs vs scripts/bench_transformers.py sample: B rows (B distinct
#           chat prompts), NEW new tokens each, temperature 1, EOS ignored, fp32
#   train   examples/bench_train.rs vs scripts/bench_transformers.py train: forward + backward
#           on a 38.9M-parameter Qwen2 config, 8 x 256 tokens, fp32
#   gemm    examples/bench_gemm.rs vs scripts/bench_transformers.py gemm: the matrix products of
#           that forward + backward one at a time (GFLOP/s instead of tokens/s)
# Prints every measurement, then the medians (tokens/s wall and tokens per CPU-second) and the
# ratio rlcr / transformers.
set -euo pipefail
{ # the whole script is parsed before it runs (safe to edit while a benchmark is running)
cd "$(dirname "$0")/.."
what=${1:-all}
SMOLLM2=${SMOLLM2:-/tmp/smollm2-hf}
PY=${PY:-/tmp/tv/bin/python}
[ -x "$PY" ] || PY=python3
REPS=${REPS:-3}
BATCHES=${BATCHES:-"8 32 64"}
NEW=${NEW:-128}
THREADS=${THREADS:-2}
export RAYON_NUM_THREADS=$THREADS THREADS OMP_NUM_THREADS=$THREADS

# rlcr itself at opt-level 3 (dependencies are always optimised, see Cargo.toml).
CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo build -q --example bench_sample --example bench_train \
  --example bench_gemm
ex=${CARGO_TARGET_DIR:-target}/debug/examples
out=${RESULTS:-$(mktemp /tmp/rlcr-bench.XXXXXX)}
echo "raw results: $out"

{
  echo "# $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $THREADS"
} | tee -a "$out"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() { # SIDE CMD...: run, show its output, keep its RESULT lines tagged with the side
  local side=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log"; echo "failed: $*" >&2; exit 1; }
  grep -v '^Loading weights' "$log" || true
  awk -v s="$side" '/^RESULT /{print s, $2, $3, $4}' "$log" >>"$out"
}

if [ "$what" = sample ] || [ "$what" = all ]; then
  [ -f "$SMOLLM2/config.json" ] || { echo "no SmolLM2 folder at $SMOLLM2 (scripts/fetch_smollm2.sh)" >&2; exit 1; }
  for b in $BATCHES; do
    for _ in $(seq "$REPS"); do
      run rlcr "$ex/bench_sample" "$SMOLLM2" "$b" "$NEW"
      run transformers "$PY" scripts/bench_transformers.py sample "$SMOLLM2" "$b" "$NEW" 1
    done
  done
fi
if [ "$what" = train ] || [ "$what" = all ]; then
  for _ in $(seq "$REPS"); do
    run rlcr "$ex/bench_train" qwen39m 8 256 8 2
    run transformers "$PY" scripts/bench_transformers.py train 8 256 1
  done
fi
if [ "$what" = gemm ] || [ "$what" = all ]; then
  for _ in $(seq "$REPS"); do
    run rlcr "$ex/bench_gemm" 3
    run transformers "$PY" scripts/bench_transformers.py gemm 3
  done
fi

echo
"$PY" - "$out" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    if line.startswith("#"):
        print(line.rstrip())
        continue
    side, name, wall, cpu = line.split()
    rows[name][side].append((float(wall), float(cpu)))
print("(sample/train: tokens; gemm: GFLOP; per second wall and per CPU-second)")
print(f"{'workload':22} {'n':>3} {'rlcr /s':>11} {'HF /s':>9} {'ratio':>6}"
      f" {'rlcr /cpu-s':>15} {'HF /cpu-s':>13} {'ratio':>6}")
for name, sides in rows.items():
    r, h = sides.get("rlcr", []), sides.get("transformers", [])
    if not r or not h:
        continue
    rw, rc = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
    hw, hc = statistics.median(x[0] for x in h), statistics.median(x[1] for x in h)
    print(f"{name:22.22} {min(len(r), len(h)):>3} {rw:>11.1f} {hw:>9.1f} {rw / hw:>6.2f}"
          f" {rc:>15.1f} {hc:>13.1f} {rc / hc:>6.2f}")
EOF
exit
}
