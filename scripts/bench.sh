#!/usr/bin/env bash
# Side-by-side speed of rlcr and Hugging Face transformers on this machine, in one run.
#
#   scripts/bench.sh [peak|update|updatesmol|answers|sample|train|trainsmol|gemm|all]
#
# Environment:
#   RLCR      the rlcr binary the stage workloads (update, updatesmol, answers) time; default: the
#             one `cargo install --path .` installs, built here as `cargo build --release --bin
#             rlcr` (the release profile: every crate at opt-level 3, no debug assertions; a first
#             release build compiles every dependency again: more than an hour on a shared 2-core
#             machine; PROFILE=dev reuses the dependencies `cargo test` compiled)
#   PROFILE   release (default) or dev: `dev` times the dev-profile binary with rlcr's own crate
#             at opt-level 3 (`--config profile.dev.package.rlcr.opt-level=3`; the dependencies
#             are shared with `cargo test`'s, so only rlcr recompiles)
#   BENCH_DIR where the random-weight model folders, tables and outputs of the stage workloads go
#             (default /tmp/rlcr-bench; scripts/bench_models.py makes them once)
#   SMOLLM2   SmolLM2-135M-Instruct folder (default /tmp/smollm2-hf; make it with
#             scripts/fetch_smollm2.sh and `rlcr import-gguf`): `sample`'s model, and the tokenizer
#             of `answers`' random-weight SmolLM2-shaped model
#   PY        a python with torch + transformers (default /tmp/tv/bin/python, else python3)
#   REPS      repetitions of every measurement (default 3); rlcr and transformers alternate, so
#             both see the same load
#   BATCHES   sampling batch sizes (default "8 32 64"); NEW new tokens per row (default 128)
#   RESULTS   file that keeps the raw RESULT lines (default: a new /tmp/rlcr-bench.* file)
#   THREADS   threads for both sides (default 2: rayon for rlcr, torch.set_num_threads)
#   RLCR_DECODE_BF16  passed through (see src/model/cpu.rs; default: bf16 panels only when lossless)
#
# Workloads (the same on both sides):
#   update  `rlcr update` as users run it, against scripts/bench_transformers.py update (the same
#           PPO step in torch, fp32, on the same folder and table): a random-weight Hugging Face
#           folder of the 38.9M Qwen2 shape and a table of 8 rows x 256 tokens (1 context + 255
#           response tokens; scripts/bench_models.py), `--micro-batch 8`. Each repetition runs
#           `rlcr update --epochs 1` and `--epochs 2` as whole processes (wall and CPU time of the
#           process): `update_run_*` is the one-epoch process, one optimizer step with everything a
#           loop iteration pays (loading the model, reading the table, the first step on fresh
#           memory, writing the model, optimizer state and metrics); `update_*` is the step alone
#           (the two-epoch process less the one-epoch one: one more step in a warm process).
#           torch reports its step after a warm-up step in a process that keeps running, so both
#           rlcr rows are compared with torch's `update_*`
#   updatesmol  the same on SmolLM2-135M's shape, 8 x 512 tokens, `--micro-batch 4` (not in
#           `all`: long)
#   answers `rlcr generate-answers` as a whole process (loading, prefill, decode, writing the
#           table) against scripts/bench_transformers.py sample's `generate` call: BATCHES prompts
#           (the same chat questions), one answer each, NEW new tokens, temperature 1, no system
#           prompt, on a random-weight SmolLM2-135M-shaped folder with SmolLM2's tokenizer (random
#           weights almost never sample EOS, so every row makes NEW tokens on both sides)
#   sample  examples/bench_sample.rs vs scripts/bench_transformers.py sample: B rows (B distinct
#           chat prompts), NEW new tokens each, temperature 1, EOS ignored, fp32
#   train   examples/bench_train.rs vs scripts/bench_transformers.py train: forward + backward
#           on a 38.9M-parameter Qwen2 config, 8 x 256 tokens, fp32, and bf16 (rlcr
#           `--precision bf16` against torch.autocast bf16; names end in _bf16)
#   trainsmol  the same full step on SmolLM2-135M's shape (random weights), 8 x 512 tokens in
#           micro-batches of 4 on both sides, fp32, with each side's peak RSS (not in `all`: long);
#           each side runs a warm-up step first and reports the next; then the same in bf16 on
#           both sides (BF16=0 skips it)
#   gemm    examples/bench_gemm.rs vs scripts/bench_transformers.py gemm: the matrix products of
#           that forward + backward one at a time (GFLOP/s instead of tokens/s)
#   peak    examples/bench_peak.rs only (always run first): the CPU's SIMD flags, its measured
#           f32 FMA peak on zmm and ymm registers, bf16 dot-product peak (VDPBF16PS, where the
#           CPU has avx512_bf16) and memory bandwidth (copy, triad), on THREADS threads
# The examples (bench_peak, bench_train, ...) are built in the dev profile with rlcr's crate at
# opt-level 3, as PROFILE=dev builds the binary. Prints every measurement, then the medians
# (tokens/s wall and tokens per CPU-second), the ratio rlcr / transformers and each side's FLOP
# rate as a fraction of the measured f32 peak (sampling at batch 8 also as a fraction of the
# weight-streaming bound at the measured read bandwidth).
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

PROFILE=${PROFILE:-release}
BENCH_DIR=${BENCH_DIR:-/tmp/rlcr-bench}
target=${CARGO_TARGET_DIR:-target}
# The examples: rlcr itself at opt-level 3 (dependencies are always optimised, see Cargo.toml).
opt3=(--config 'profile.dev.package.rlcr.opt-level=3')
cargo build -q "${opt3[@]}" --example bench_sample --example bench_train --example bench_gemm \
  --example bench_peak
ex=$target/debug/examples
case "$what" in
  update | updatesmol | answers | all)
    if [ -z "${RLCR:-}" ]; then
      case "$PROFILE" in
        release) cargo build -q --release --bin rlcr && RLCR=$target/release/rlcr ;;
        dev) cargo build -q "${opt3[@]}" --bin rlcr && RLCR=$target/debug/rlcr ;;
        *) echo "PROFILE=$PROFILE: release or dev" >&2; exit 2 ;;
      esac
      # A copy: other builds (`cargo test` at opt-level 0) replace target/debug/rlcr.
      mkdir -p "$BENCH_DIR"
      cp "$RLCR" "$BENCH_DIR/rlcr-$PROFILE"
      RLCR=$BENCH_DIR/rlcr-$PROFILE
    fi
    ;;
esac
out=${RESULTS:-$(mktemp /tmp/rlcr-bench.XXXXXX)}
echo "raw results: $out"

{
  echo "# $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)" \
    "model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | xargs), threads $THREADS"
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src crates Cargo.toml Cargo.lock || echo ' + local changes')${RLCR:+, rlcr binary $RLCR ($PROFILE)}"
} | tee -a "$out"

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The roofline of this run: flags, measured peaks and bandwidth (PEAK lines -> "peak NAME VALUE").
"$ex/bench_peak" >"$log"
cat "$log"
awk '/^PEAK /{print "peak", $2, $3}' "$log" >>"$out"
run() { # SIDE CMD...: run, show its output, keep its RESULT lines tagged with the side
  local side=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log"; echo "failed: $*" >&2; exit 1; }
  grep -v '^Loading weights' "$log" || true
  awk -v s="$side" '/^RESULT /{print s, $2, $3, $4}' "$log" >>"$out"
}

# The wall and CPU seconds of a whole process: `timed FILE CMD...` runs CMD (its output in $log)
# and writes "WALL CPU" (user + system of the process and its threads) to FILE.
timed() {
  local f=$1
  shift
  local TIMEFORMAT='%R %U %S'
  { time "$@" >"$log" 2>&1; } 2>"$f.t" || { cat "$log"; echo "failed: $*" >&2; exit 1; }
  awk '{print $1, $2 + $3}' "$f.t" >"$f"
}
# `rlcr update` on MODEL's shape: `update_stage NAME MODEL ROWS LEN MICRO`.
update_stage() {
  local name=$1 model=$2 rows=$3 len=$4 micro=$5
  local dir=$BENCH_DIR/$model table=$BENCH_DIR/$model-${rows}x$len.parquet
  "$PY" scripts/bench_models.py model "$model" "$dir" >/dev/null
  "$PY" scripts/bench_models.py table "$model" "$table" "$rows" "$len" >/dev/null
  local tokens=$((rows * len))
  for _ in $(seq "$REPS"); do
    for e in 1 2; do
      rm -rf "$BENCH_DIR/out-$name"
      timed "$BENCH_DIR/time-$e" "$RLCR" update --model "$dir" --input "$table" \
        -o "$BENCH_DIR/out-$name" --micro-batch "$micro" --epochs "$e"
      grep -E 'update: [0-9]+ steps' "$log" || true
    done
    read -r w1 c1 <"$BENCH_DIR/time-1"
    read -r w2 c2 <"$BENCH_DIR/time-2"
    echo "rlcr update: one epoch ${w1} s wall, ${c1} s CPU; two epochs ${w2} s wall, ${c2} s CPU"
    awk -v n="$tokens" -v w1="$w1" -v c1="$c1" -v w2="$w2" -v c2="$c2" -v name="$name" 'BEGIN {
      printf "rlcr update_run_%s %.2f %.2f\n", name, n / w1, n / c1
      printf "rlcr update_%s %.2f %.2f\n", name, n / (w2 - w1), n / (c2 - c1) }' >>"$out"
    run transformers "$PY" scripts/bench_transformers.py update "$name" "$dir" "$table" "$micro" 1
  done
}

if [ "$what" = peak ]; then
  exit 0
fi
if [ "$what" = update ] || [ "$what" = all ]; then
  update_stage qwen39m_b8_l256 qwen39m 8 256 8
fi
if [ "$what" = updatesmol ]; then
  update_stage smollm2_b8_l512 smollm2 8 512 4
fi
if [ "$what" = answers ] || [ "$what" = all ]; then
  [ -f "$SMOLLM2/tokenizer.json" ] || { echo "no SmolLM2 folder at $SMOLLM2 (scripts/fetch_smollm2.sh, rlcr import-gguf)" >&2; exit 1; }
  dir=$BENCH_DIR/smollm2-sampling
  "$PY" scripts/bench_models.py model smollm2 "$dir" "$SMOLLM2" >/dev/null
  for b in $BATCHES; do
    "$PY" scripts/bench_models.py prompts "$BENCH_DIR/prompts-$b.parquet" "$b" >/dev/null
    for _ in $(seq "$REPS"); do
      timed "$BENCH_DIR/time-answers" "$RLCR" generate-answers --model "$dir" \
        --input "$BENCH_DIR/prompts-$b.parquet" -o "$BENCH_DIR/answers-$b.parquet" \
        --num-answers 1 --batch-size "$b" --max-new-tokens "$NEW" --system-prompt ""
      grep -E 'generate-answers: [0-9]+ rows' "$log" || true
      made=$("$PY" -c 'import sys, pyarrow.parquet as pq
print(sum(len(r) for r in pq.read_table(sys.argv[1]).column("response_ids").to_pylist()))' \
        "$BENCH_DIR/answers-$b.parquet")
      read -r w c <"$BENCH_DIR/time-answers"
      echo "rlcr generate-answers: $made tokens, ${w} s wall, ${c} s CPU (whole process)"
      awk -v n="$made" -v w="$w" -v c="$c" -v name="sample_b${b}_n$NEW" 'BEGIN {
        printf "rlcr answers_run_%s %.2f %.2f\n", name, n / w, n / c }' >>"$out"
      run transformers "$PY" scripts/bench_transformers.py sample "$dir" "$b" "$NEW" 1
    done
  done
fi
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
    run rlcr "$ex/bench_train" qwen39m 8 256 8 2 bf16
    run transformers "$PY" scripts/bench_transformers.py train 8 256 1 fp32,bf16
  done
fi
if [ "$what" = trainsmol ]; then
  for _ in $(seq "$REPS"); do
    run rlcr "$ex/bench_train" smollm2 8 512 4 2
    run transformers "$PY" scripts/bench_transformers.py train 8 512 1 fp32 smollm2 4
    if [ "${BF16:-1}" = 1 ]; then
      run rlcr "$ex/bench_train" smollm2 8 512 4 2 bf16
      run transformers "$PY" scripts/bench_transformers.py train 8 512 1 bf16 smollm2 4
    fi
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
peak = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        print(line.rstrip())
        continue
    f = line.split()
    if f[0] == "peak":
        peak[f[1]] = f[2]
        continue
    side, name, wall, cpu = f
    rows[name][side].append((float(wall), float(cpu)))
print("roofline:", ", ".join(f"{k} {v}" for k, v in peak.items()))
fpeak = float(peak.get("f32_fma_zmm", peak.get("f32_fma_ymm", "nan")))
# Per CPU-second of one thread: the denominator of the per-CPU-second rates (load-independent).
fcpu = float(peak.get("f32_fma_zmm_cpu", peak.get("f32_fma_ymm_cpu", "nan")))
# A decode step reads its weights: the read-only bandwidth bounds it (older runs: copy's).
bw = float(peak.get("bw_read", peak.get("bw_copy", "nan")))
# bf16 workloads (`update --precision bf16`, torch autocast) against the bf16 dot-product peak.
bpeak = float(peak.get("bf16_dot_zmm", "nan"))
bcpu = float(peak.get("bf16_dot_zmm_cpu", "nan"))

# Useful FLOP per token (2 per multiply-add), from the model shapes:
# - Qwen2 38.9M training (bench_train qwen39m, 8 x 256): per token per layer q/k/v/o
#   512*(512+128+128+512) + gate/up/down 3*512*1408 = 2.818M multiply-adds, x 8 layers, + the
#   tied LM head 512*32000 = 16.384M, + causal attention 2*512*128 (mean 128 keys) x 8 = 1.05M:
#   39.97M multiply-adds forward, x 3 for forward + backward = 239.8 MFLOP per token.
# - SmolLM2-135M sampling: 30 layers x (576*(576+192+192+576) + 3*576*1536) + 576*49152 =
#   134.5M multiply-adds = 269 MFLOP per token (attention over <= 160 positions < 2 %: left out);
#   a decode step streams all 538 MB of f32 weights once (bandwidth bound: B * BW / 538 MB).
# - SmolLM2-135M training (bench_train smollm2, 8 x 512): 134.5M multiply-adds as above + causal
#   attention 2*576*256 (mean 256 keys) x 30 = 8.8M: 143.3M forward, x 6 = 860 MFLOP per token.
def flop_per_unit(name):
    name = name.removeprefix("update_run_").removeprefix("update_")
    name = name.removeprefix("answers_run_")
    if name.startswith(("train_smollm2_", "step_smollm2_", "smollm2_")):
        return 860e6
    if name.startswith(("train_", "step_", "qwen39m_")):
        return 239.8e6
    if name.startswith("sample_"):
        return 269e6
    if name.startswith("gemm_"):
        return 1e9  # already GFLOP/s
    return float("nan")

print("(sample/train/step: tokens; gemm: GFLOP; per second wall and per CPU-second;")
print(f" %pk: FLOP rate against the measured f32 peak {fpeak:.0f} GFLOP/s on these threads;")
print(f" %pk/cpu: FLOP per CPU-second against one thread's {fcpu:.0f} GFLOP per CPU-second;")
print(f" names ending in _bf16: against the bf16 dot-product peak {bpeak:.0f} / {bcpu:.0f})")
print(f"{'workload':22} {'n':>3} {'rlcr /s':>11} {'HF /s':>9} {'ratio':>6}"
      f" {'rlcr /cpu-s':>12} {'HF /cpu-s':>10} {'ratio':>6} {'rlcr %pk':>8} {'HF %pk':>7}"
      f" {'%pk/cpu':>8} {'HF':>5}")
for name, sides in rows.items():
    if name.startswith("rss"):
        mem = {k: statistics.median(x[0] for x in v) for k, v in sides.items()}
        print(f"{name:22.22} peak RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in mem.items()))
        continue
    r, h = sides.get("rlcr", []), sides.get("transformers", [])
    if not r:
        continue
    # A whole rlcr process against torch's step or generate call in its running process.
    for whole, part in (("update_run_", "update_"), ("answers_run_", "")):
        if not h and name.startswith(whole):
            h = rows.get(part + name.removeprefix(whole), {}).get("transformers", [])
    rw, rc = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
    fl = flop_per_unit(name)
    pk, pkc = (bpeak, bcpu) if name.endswith("_bf16") else (fpeak, fcpu)
    rp = 100 * rw * fl / 1e9 / pk
    rpc = 100 * rc * fl / 1e9 / pkc
    extra = ""
    if name.startswith("sample_b"):
        b = int(name.split("_")[1][1:])
        bound = b * bw * 1e9 / 538e6
        extra = f"  (bandwidth bound {bound:.0f} tok/s: rlcr {100 * rw / bound:.0f} %)"
    if not h:
        print(f"{name:22.22} {len(r):>3} {rw:>11.1f} {'-':>9} {'-':>6} {rc:>12.1f} {'-':>10}"
              f" {'-':>6} {rp:>7.0f}% {'-':>7} {rpc:>7.0f}% {'-':>5}{extra}")
        continue
    hw, hc = statistics.median(x[0] for x in h), statistics.median(x[1] for x in h)
    hp = 100 * hw * fl / 1e9 / pk
    hpc = 100 * hc * fl / 1e9 / pkc
    print(f"{name:22.22} {min(len(r), len(h)):>3} {rw:>11.1f} {hw:>9.1f} {rw / hw:>6.2f}"
          f" {rc:>12.1f} {hc:>10.1f} {rc / hc:>6.2f} {rp:>7.0f}% {hp:>6.0f}%"
          f" {rpc:>7.0f}% {hpc:>4.0f}%{extra}")
for name, sides in rows.items():
    # References without an rlcr counterpart (torch bf16 autocast): their rate and the ratio
    # of rlcr's fp32 figure of the same workload to them.
    if "rlcr" in sides or "transformers" not in sides or name.startswith("rss"):
        continue
    hw = statistics.median(x[0] for x in sides["transformers"])
    base = name.removesuffix("_bf16")
    rr = rows.get(base, {}).get("rlcr", [])
    ratio = f"{statistics.median(x[0] for x in rr) / hw:.2f}" if rr else "-"
    print(f"{name:22.22}   transformers only: {hw:.1f} /s; rlcr fp32 / this = {ratio}")
EOF
exit
}
