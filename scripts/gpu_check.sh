#!/usr/bin/env bash
# One prepared check of rlcr on an NVIDIA GPU, for a machine with a GPU, torch and transformers
# but no Rust toolchain: everything rlcr needs is a release binary built elsewhere
# (scripts/gpu_pack.sh) and this repository's fixtures and scripts. Every step has a time limit
# inside an overall budget (default 450 s), so the whole check fits one call of 8 minutes; a
# step that fails or runs out of time is recorded and the next one runs. Results go to
# OUT/gpu_check.json and each step's output and log to OUT/logs.tar.gz (two files: a device call
# brings back at most 8); a table is printed last.
#
#   scripts/gpu_check.sh --rlcr .gpu/rlcr.xz [--rlcr-fusion .gpu/rlcr-fusion.xz] [--out DIR] [--budget SECONDS]
#   scripts/gpu_check.sh --dry-run [--device cpu|wgpu] [--rlcr target/debug/rlcr]
#   ... --only "fusion main"     only these groups of steps (parity bf16 sampling training qwen
#                                sample256 fusion main; default all), e.g. a second call on a
#                                GPU machine for what the first one's budget left out (the
#                                fusion group makes the inputs and references it needs)
#
# Steps, in order of priority (see docs/backends.md for the goals):
#   env        GPU, driver, CUDA, nvcc, torch and transformers versions
#   parity     `rlcr --device cuda logprobs` (after a `generate-answers` on the same device) on
#              fixtures/tiny-llama, fixtures/tiny-qwen2 and random SmolLM2-135M / Qwen2.5-0.5B
#              shapes made by transformers, against transformers on the GPU (float32, TF32 off)
#              and float64: max |Δ log-prob|
#   bf16       `rlcr --device cuda logprobs` on fixtures/tiny-qwen2-bf16 (a bf16 checkpoint, held
#              in bf16) against float64, and with `--precision bf16` against torch.autocast bf16
#              on the GPU: max |Δ log-prob| against float64
#   sampling   `generate-answers` on the SmolLM2 shape, 64 and 256 rows x 256 new tokens, against
#              transformers `generate` (float32, temperature 1, EOS ignored): tokens/s; again with
#              RLCR_CUDA_GRAPH=on (recorded, replayed decode steps): tokens/s, launches, and the
#              share of answers unlike the launched run's
#   training   one `update` step (the second of two: the first compiles the kernels) on the
#              SmolLM2 shape (16 x 512 tokens) and the Qwen2.5-0.5B shape (8 x 512), f32 and
#              `--precision bf16`, against torch's same full step (PPO loss, clipping, AdamW;
#              fp32 and torch.autocast bf16): tokens/s, peak GPU memory (nvidia-smi), and the
#              mean token entropy of the first forward against float64 (the bf16 error)
#   fusion     with --rlcr-fusion (a second binary built with burn's operation fusion,
#              `FUSION=1 scripts/gpu_pack.sh`): the SmolLM2 shape's log-probs against float64,
#              sampling 64 rows and one f32 `update` step, each against the binary without fusion
#   fast       `RLCR_GPU_F32=fast` (the backend's f32 matmul, TF32 on NVIDIA tensor cores; the
#              default splits each operand for f32 accuracy): the parity of tiny-qwen2, SmolLM2
#              and Qwen2.5-0.5B, and the SmolLM2 f32 `update` step against torch's
#   profiles   cubecl's kernel profiler (every launch timed alone) on a short sampling run (64
#              rows x 32 new tokens), one f32 `update` step on the SmolLM2 shape, and the fusion
#              binary's sampling: kernel launches and GPU-busy time per step, kernels compiled,
#              and the kernels that take the most time (the table's last lines)
#   main job   `make -f scripts/rl.mk DEVICE=cuda` (the tiny model's loop) until the budget ends:
#              iterations done and seconds
#
# --dry-run runs every step at tiny sizes on --device cpu (default) or wgpu, with whatever
# torch sees (the CPU in CI), so that the script is known to work before it meets a GPU; its
# figures are not measurements and its goals are not judged (budget 1800 s by default).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
HELPER="$ROOT/scripts/gpu_check.py"

MODE=gpu
DEVICE=""
RLCR_IN=""
FUSION_IN=""
OUTDIR="${OUT:-$ROOT/gpu-check-out}"
BUDGET=""
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --device) DEVICE=$2; shift ;;
    --rlcr) RLCR_IN=$2; shift ;;
    --rlcr-fusion) FUSION_IN=$2; shift ;;
    --out) OUTDIR=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --only) ONLY=" $2 "; shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$DEVICE" ]; then
  if [ $MODE = dry ]; then DEVICE=cpu; else DEVICE=cuda; fi
fi
# The dry run has time (CI): a step skipped for want of budget would be a failure there.
if [ -z "$BUDGET" ]; then
  if [ $MODE = dry ]; then BUDGET=1800; else BUDGET=450; fi
fi
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlcr-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOGS="$WORK/logs"
mkdir -p "$OUTDIR" "$LOGS"
ROWS="$WORK/rows.jsonl"
ERRORS="$WORK/errors.txt"
ENVF="$WORK/env.jsonl"
: >"$ROWS"; : >"$ERRORS"; : >"$ENVF"

# --- the rlcr binary: a path, or an .xz of one (scripts/gpu_pack.sh)
if [ -z "$RLCR_IN" ]; then
  echo "gpu_check: --rlcr PATH is required (a binary, or the .xz of scripts/gpu_pack.sh)" >&2
  exit 2
fi
# unpack IN NAME: the binary IN (a path, or an .xz of one) as an absolute path on stdout.
unpack() {
  case "$1" in
    *.xz)
      if command -v xz >/dev/null; then xz -dc "$1" >"$WORK/$2"
      else "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$WORK/$2"
      fi || { echo "gpu_check: cannot decompress $1" >&2; return 1; }
      chmod +x "$WORK/$2"; echo "$WORK/$2" ;;
    *) echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" ;;
  esac
}
RLCR=$(unpack "$RLCR_IN" rlcr) || exit 1
FUSION=""
if [ -n "$FUSION_IN" ]; then FUSION=$(unpack "$FUSION_IN" rlcr-fusion) || exit 1; fi

# --- sizes
if [ $MODE = dry ]; then
  TINY=--tiny; PAR_NEW=8; SAMPLE_NEW=16; SAMPLE_B1=8; SAMPLE_B2=16; TRAIN_LEN=96
  SMOL_ROWS=4; QWEN_ROWS=2; MAIN_ITERS=1; PROFILE_NEW=4
  MAIN_FLAGS=(SFT=0 PROMPTS_PER_ITER=4 G_A=2 G_C=1 MAX_NEW=8 MAX_NEW_CONF=8 EPOCHS=1 MINI_BATCHES=1)
else
  TINY=""; PAR_NEW=32; SAMPLE_NEW=256; SAMPLE_B1=64; SAMPLE_B2=256; TRAIN_LEN=512
  SMOL_ROWS=16; QWEN_ROWS=8; MAIN_ITERS=20; MAIN_FLAGS=(); PROFILE_NEW=32
fi

# --- helpers
# want GROUP: whether GROUP's steps run (--only).
want() { [ -z "$ONLY" ] || [[ "$ONLY" == *" $1 "* ]]; }
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
json_str() { "$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
# env KEY VALUE: one environment fact.
envfact() { printf '{"%s": %s}\n' "$1" "$(json_str "$2")" >>"$ENVF"; }
# row CHECK RLCR REF KIND THRESHOLD: one result (numbers or null); KIND: max (rlcr <= THRESHOLD),
# min (rlcr >= THRESHOLD), ratio (rlcr/ref >= THRESHOLD), le_ref (rlcr <= ref), info.
row() {
  printf '{"check": %s, "rlcr": %s, "ref": %s, "kind": "%s", "threshold": %s}\n' \
    "$(json_str "$1")" "${2:-null}" "${3:-null}" "$4" "${5:-null}" >>"$ROWS"
}
# step NAME TIMEOUT_MAX CMD...: runs CMD with the smaller of TIMEOUT_MAX and the budget left,
# stdout to OUT/logs/NAME.out, stderr to OUT/logs/NAME.log; failures go to the error list.
step() {
  local name=$1 max=$2; shift 2
  local t; t=$(left)
  if [ "$t" -gt "$max" ]; then t=$max; fi
  if [ "$t" -lt 5 ]; then
    echo "$name: skipped (budget spent)" >>"$ERRORS"; return 124
  fi
  local t0; t0=$(date +%s)
  timeout "$t" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.log"
  local rc=$?
  echo "gpu_check: $name: rc $rc, $(( $(date +%s) - t0 )) s (budget left $(left) s)" >&2
  if [ $rc -ne 0 ]; then
    local why
    why=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-300)
    if [ $rc -eq 124 ]; then why="timed out after $t s; $why"; fi
    echo "$name: exit $rc: $why" >>"$ERRORS"
  fi
  return $rc
}
# jget FILE KEY: a number from the JSON object printed by a helper step (null when absent).
jget() { "$PY" -c 'import json,sys
try:
    v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]).get(sys.argv[2])
except Exception:
    v = None
print("null" if v is None else v)' "$1" "$2"; }
# rlcr's own sampling rate: `generate-answers: N rows, T tokens in S s (R tokens/s)`.
rlcr_rate() { sed -n 's/.*generate-answers: .* (\([0-9.]*\) tokens\/s).*/\1/p' "$1" | tail -n 1 | grep . || echo null; }
# rlcr's host transfers per decode step (`generate-answers: host transfers per decode step: R
# reads (B bytes), U uploads (C bytes); N steps`): FIELD 1 reads, 2 bytes read, 3 uploads.
rlcr_moves() { sed -n 's/.*generate-answers: host transfers per decode step: \([0-9.]*\) reads (\([0-9.]*\) bytes), \([0-9.]*\) uploads.*/\1 \2 \3/p' "$1" | tail -n 1 | cut -d' ' -f"$2" | grep . || echo null; }
# rlcr's kernel launches per decode step (the same line, `…, K kernel launches; N steps`).
rlcr_launches() { sed -n 's/.*generate-answers: host transfers per decode step: .*, \([0-9.]*\) kernel launches;.*/\1/p' "$1" | tail -n 1 | grep . || echo null; }
# rlcr's GPU memory pool (`STAGE: GPU memory pool: peak X MiB in use, Y MiB reserved (…)`) in
# log FILE: FIELD 1 the peak bytes in live allocations, 2 the peak the pool reserved (MiB).
rlcr_pool() { sed -n "s/.*$2: GPU memory pool: peak \([0-9.]*\) MiB in use, \([0-9.]*\) MiB reserved.*/\1 \2/p" "$1" | tail -n 1 | cut -d' ' -f"$3" | grep . || echo null; }
# The second optimizer step of `update` (the first compiles kernels): tokens/s and entropy of step 1.
update_rate() { "$PY" -c 'import json,sys
m = [json.loads(l) for l in open(sys.argv[1])]
s = m[-1]
print(s["tokens"] / s["seconds"] if s["seconds"] > 0 else "null")' "$1/train_metrics.jsonl" 2>/dev/null || echo null; }
# Seconds of optimizer step N (1: with the kernels' first compilation, 2: without).
update_secs() { "$PY" -c 'import json,sys
m = [json.loads(l) for l in open(sys.argv[1])]
print(m[int(sys.argv[2]) - 1]["seconds"])' "$1/train_metrics.jsonl" "$2" 2>/dev/null || echo null; }
update_entropy() { "$PY" -c 'import json,sys
print(json.loads(open(sys.argv[1]).readline())["entropy"])' "$1/train_metrics.jsonl" 2>/dev/null || echo null; }
# Peak GPU memory (MiB, whole GPU) while CMD runs, sampled by nvidia-smi every 100 ms.
MEMLOG="$WORK/mem.csv"
mem_start() {
  if command -v nvidia-smi >/dev/null && [ $MODE = gpu ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$MEMLOG" 2>/dev/null &
    MEMPID=$!
  else MEMPID=""; fi
}
mem_stop() {
  if [ -n "$MEMPID" ]; then
    kill "$MEMPID" 2>/dev/null; wait "$MEMPID" 2>/dev/null
    sort -n "$MEMLOG" | tail -n 1 | grep . || echo null
  else echo null; fi
}

echo "gpu_check: mode $MODE, device $DEVICE, budget $BUDGET s, results in $OUTDIR" >&2

# --- env (and NVRTC under a name the binary's CUDA 12.8 bindings look for: libnvrtc.so)
envfact mode "$MODE"
envfact rlcr_device "$DEVICE"
envfact rlcr "$("$RLCR" --version 2>&1 | head -n 1)"
# The commit the binary was built from (scripts/gpu_pack.sh writes it next to the binary).
if [ -f "$(dirname "$RLCR_IN")/commit" ]; then envfact commit "$(cat "$(dirname "$RLCR_IN")/commit")"; fi
if [ $MODE = gpu ]; then
  # The CUDA installation whose headers NVRTC gets: CUDA_PATH if set, else the first of the
  # usual places (and nvcc's) that has them.
  if [ -z "${CUDA_PATH:-}" ]; then
    for c in /usr/local/cuda /usr/local/cuda-13* /usr/local/cuda-12* /opt/cuda \
      "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x/x)")")"; do
      if [ -f "$c/include/cuda_fp16.h" ]; then CUDA_PATH=$c; break; fi
    done
  fi
  export CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
  if command -v nvidia-smi >/dev/null; then
    envfact gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    envfact driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
    envfact cuda "$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
  fi
  if command -v nvcc >/dev/null; then
    envfact nvcc "$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  fi
  mkdir -p "$WORK/lib"
  nvrtc=""
  for d in "$CUDA_PATH/lib64" "$CUDA_PATH/targets/x86_64-linux/lib" \
    $("$PY" -c 'import glob,os,nvidia; [print(os.path.dirname(p)) for p in glob.glob(os.path.join(os.path.dirname(nvidia.__file__), "*", "lib", "libnvrtc.so*"))]' 2>/dev/null); do
    nvrtc=$(ls "$d"/libnvrtc.so* 2>/dev/null | grep -v builtins | sort | tail -n 1)
    if [ -n "$nvrtc" ]; then
      ln -sf "$nvrtc" "$WORK/lib/libnvrtc.so"
      export LD_LIBRARY_PATH="$WORK/lib:$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
  envfact nvrtc "${nvrtc:-not found}"
  envfact make "$(command -v make || echo 'not found (the main job needs it)')"
  envfact cuda_path "$CUDA_PATH"
fi
if step env 60 "$PY" "$HELPER" env; then
  for k in torch transformers torch_cuda capability gpu_memory_gib; do
    v=$(jget "$LOGS/env.out" $k)
    if [ "$v" != null ]; then envfact "$k" "$v"; fi
  done
fi

# --- models
M="$WORK/models"
mkdir -p "$M"
models=(tiny-llama tiny-qwen2)
ln -s "$ROOT/fixtures/tiny-llama" "$M/tiny-llama"
ln -s "$ROOT/fixtures/tiny-qwen2" "$M/tiny-qwen2"
step model-smollm2 90 "$PY" "$HELPER" model smollm2 "$M/smollm2" $TINY && models+=(smollm2)
"$RLCR" --seed 1 -q prepare --from countdown-synth --count 8 -o "$WORK/prompts.parquet" \
  2>>"$LOGS/prepare.log" || echo "prepare: failed (logs.tar.gz: logs/prepare.log)" >>"$ERRORS"

# parity MODEL: generate-answers then logprobs on DEVICE, then the references.
parity() {
  local m=$1 d="$WORK/parity-$1"
  mkdir -p "$d"
  step "gen-$m" 120 "$RLCR" --device "$DEVICE" --seed 2 generate-answers --model "$M/$m" \
    --input "$WORK/prompts.parquet" -o "$d/answers.parquet" --num-answers 2 \
    --max-new-tokens $PAR_NEW --batch-size 16 || { row "logprobs $m: max |rlcr - f64|" null null max 1e-4; return; }
  step "logprobs-$m" 120 "$RLCR" --device "$DEVICE" logprobs --model "$M/$m" \
    --input "$d/answers.parquet" -o "$d/lp.parquet" --column lp || { row "logprobs $m: max |rlcr - f64|" null null max 1e-4; return; }
  if step "parity-$m" 120 "$PY" "$HELPER" parity "$d/lp.parquet" "$M/$m" lp; then
    local o="$LOGS/parity-$m.out"
    row "logprobs $m: max |rlcr - f64| (ref: hf)" "$(jget "$o" rlcr_vs_f64)" "$(jget "$o" hf_vs_f64)" max 1e-4
  else
    row "logprobs $m: max |rlcr - f64|" null null max 1e-4
  fi
}
# parity_fast MODEL: the log-probs of parity MODEL's answers again with RLCR_GPU_F32=fast (the
# backend's f32 matmul: TF32 on NVIDIA tensor cores; the default splits the operands for f32
# accuracy) against float64.
parity_fast() {
  local m=$1 d="$WORK/parity-$1"
  [ -f "$d/answers.parquet" ] || return
  local r=null h=null
  if step "logprobs-fast-$m" 120 env RLCR_GPU_F32=fast "$RLCR" --device "$DEVICE" logprobs \
      --model "$M/$m" --input "$d/answers.parquet" -o "$d/lp-fast.parquet" --column lp \
    && step "parity-fast-$m" 120 "$PY" "$HELPER" parity "$d/lp-fast.parquet" "$M/$m" lp; then
    r=$(jget "$LOGS/parity-fast-$m.out" rlcr_vs_f64); h=$(jget "$LOGS/parity-fast-$m.out" hf_vs_f64)
  fi
  row "logprobs $m, GPU_F32=fast (TF32): |rlcr - f64|" "$r" "$h" info
}
if want parity; then
  parity tiny-llama
  parity tiny-qwen2
  parity_fast tiny-qwen2
fi

# bf16_parity: the bf16 checkpoint, held in bf16: f32 products (the float64 figures of its
# weights within 1e-4) and `--precision bf16` (no further from float64 than torch's autocast).
bf16_parity() {
  local m=tiny-qwen2-bf16 d="$WORK/parity-bf16"
  mkdir -p "$d"
  ln -sfn "$ROOT/fixtures/$m" "$M/$m"
  local p
  for p in f32 bf16; do
    local r=null ref=null
    if [ $p = bf16 ] && [[ $DEVICE == wgpu* ]]; then
      # wgpu has no bf16 arithmetic: `--precision bf16` is refused there (docs/backends.md).
      row "logprobs $m --precision bf16: refused on wgpu" null null info
      continue
    fi
    if step "gen-$m-$p" 120 "$RLCR" --device "$DEVICE" --seed 2 generate-answers --model "$M/$m" \
        --input "$WORK/prompts.parquet" -o "$d/answers-$p.parquet" --num-answers 2 \
        --max-new-tokens $PAR_NEW --batch-size 16 \
      && step "logprobs-$m-$p" 120 "$RLCR" --device "$DEVICE" logprobs --model "$M/$m" \
        --input "$d/answers-$p.parquet" -o "$d/lp-$p.parquet" --column lp --precision $p \
      && step "parity-$m-$p" 120 "$PY" "$HELPER" parity-bf16 "$d/lp-$p.parquet" "$M/$m" lp; then
      r=$(jget "$LOGS/parity-$m-$p.out" rlcr_vs_f64); ref=$(jget "$LOGS/parity-$m-$p.out" autocast_vs_f64)
    fi
    if [ $p = f32 ]; then
      row "logprobs $m (held bf16): max |rlcr - f64|" "$r" null max 1e-4
    else
      row "logprobs $m --precision bf16: |rlcr - f64| vs autocast" "$r" "$ref" le_ref
    fi
  done
}
want bf16 && bf16_parity
# (The dry run checks parity_fast's plumbing on tiny-qwen2 only: on the CPU it measures nothing.)
want parity && [[ " ${models[*]} " == *" smollm2 "* ]] && parity smollm2 && [ $MODE = gpu ] &&
  parity_fast smollm2

# --- sampling (SmolLM2 shape): rlcr generate-answers against transformers generate
sampling() {
  local rows=$1 prompts=$(( $1 / 8 )) d="$WORK/sample-$1"
  mkdir -p "$d"
  "$RLCR" --seed 3 -q prepare --from countdown-synth --count $prompts -o "$d/prompts.parquet" 2>>"$LOGS/prepare.log"
  local r=null h=null
  if step "sample-rlcr-$rows" 150 "$RLCR" --device "$DEVICE" --seed 4 generate-answers \
    --model "$M/smollm2" --input "$d/prompts.parquet" -o "$d/answers.parquet" --num-answers 8 \
    --max-new-tokens $SAMPLE_NEW --batch-size $rows --temperature 1; then
    r=$(rlcr_rate "$LOGS/sample-rlcr-$rows.log")
  fi
  # On a GPU the sampler draws on the device: about one read of 8 bytes a row per step (the
  # prefill's share on top); the CPU reads the whole logits (4 x vocabulary bytes a row).
  local log="$LOGS/sample-rlcr-$rows.log"
  row "sample smollm2 ${rows}x$SAMPLE_NEW: host reads per decode step" "$(rlcr_moves "$log" 1)" null max 1.1
  row "sample smollm2 ${rows}x$SAMPLE_NEW: bytes read per step per row" \
    "$("$PY" -c 'import sys; print("null" if sys.argv[1] == "null" else float(sys.argv[1]) / int(sys.argv[2]))' "$(rlcr_moves "$log" 2)" "$rows")" null info
  row "sample smollm2 ${rows}x$SAMPLE_NEW: uploads per decode step" "$(rlcr_moves "$log" 3)" null info
  row "sample smollm2 ${rows}x$SAMPLE_NEW: kernel launches per decode step" "$(rlcr_launches "$log")" null info
  row "sample smollm2 ${rows}x$SAMPLE_NEW: pool MiB in use (ref: reserved)" \
    "$(rlcr_pool "$log" generate-answers 1)" "$(rlcr_pool "$log" generate-answers 2)" info
  if step "sample-hf-$rows" 120 "$PY" "$HELPER" generate "$M/smollm2" $prompts $rows $SAMPLE_NEW; then
    h=$(jget "$LOGS/sample-hf-$rows.out" tokens_per_s)
  fi
  row "sample smollm2 ${rows}x$SAMPLE_NEW: tokens/s vs hf" "$r" "$h" ratio 5
  if [ "$rows" = "$SAMPLE_B1" ]; then row "sample smollm2 ${rows}x$SAMPLE_NEW: tokens/s" "$r" null min 10000; fi
  # The same run with the decode step recorded once per batch width and replayed
  # (RLCR_CUDA_GRAPH=on): its rate, its launches, and whether it drew the same answers.
  local g=null glog="$LOGS/sample-rlcr-graph-$rows.log"
  if step "sample-rlcr-graph-$rows" 150 env RLCR_CUDA_GRAPH=on "$RLCR" --device "$DEVICE" --seed 4 \
    generate-answers --model "$M/smollm2" --input "$d/prompts.parquet" -o "$d/answers-graph.parquet" \
    --num-answers 8 --max-new-tokens $SAMPLE_NEW --batch-size $rows --temperature 1; then
    g=$(rlcr_rate "$glog")
  fi
  row "sample smollm2 ${rows}x$SAMPLE_NEW, decode graph: tokens/s vs hf" "$g" "$h" ratio 5
  row "sample smollm2 ${rows}x$SAMPLE_NEW, decode graph: kernel launches per decode step" "$(rlcr_launches "$glog")" null info
  row "sample smollm2 ${rows}x$SAMPLE_NEW, decode graph: share of answers unlike the launched run's" \
    "$(differing "$d/answers.parquet" "$d/answers-graph.parquet")" null max 0.01
}
# differing A B: the share of rows whose response_text differs between two answers tables of the
# same prompts (null when either is missing).
differing() { "$PY" -c 'import sys
import pyarrow.parquet as pq
a, b = (pq.read_table(f, columns=["sample_id", "response_text"]).to_pylist() for f in sys.argv[1:3])
a = {r["sample_id"]: r["response_text"] for r in a}
b = {r["sample_id"]: r["response_text"] for r in b}
print(sum(a[k] != b.get(k) for k in a) / max(len(a), 1) if a.keys() == b.keys() else 1.0)' "$1" "$2" 2>/dev/null || echo null; }
want sampling && [[ " ${models[*]} " == *" smollm2 "* ]] && sampling $SAMPLE_B1

# profile NAME STEPS CMD...: CMD (an rlcr run) under cubecl's kernel profiler, which times every
# launch alone (so the run is slower than unprofiled: only the launch counts and the GPU-busy
# time are figures), with its compilation log; the summary goes to logs/profile-NAME.out and the
# results' "profiles". The profiler is configured by a cubecl.toml in the run's working folder.
profile() {
  local name=$1 steps=$2; shift 2
  # The CPU backend runs no cubecl kernels: nothing to profile.
  [ "$DEVICE" = cpu ] && return
  local d="$WORK/profile-$name"
  mkdir -p "$d"
  printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\n[compilation.logger]\nlevel = "basic"\nfile = "%s"\n' \
    "$d/kernels.txt" "$d/compile.txt" >"$d/cubecl.toml"
  (cd "$d" && step "profile-run-$name" 90 "$@") || return
  cp "$d/kernels.txt" "$LOGS/profile-$name.kernels.txt" 2>/dev/null
  cp "$d/compile.txt" "$LOGS/profile-$name.compile.txt" 2>/dev/null
  step "profile-$name" 60 "$PY" "$HELPER" profile "$d/kernels.txt" "$d/compile.txt" "$steps" || return
  cp "$LOGS/profile-$name.out" "$PROFILES/$name.json"
  local o="$LOGS/profile-$name.out"
  row "profile $name: kernel launches per step" "$(jget "$o" launches_per_step)" null info
  row "profile $name: GPU-busy ms per step" "$(jget "$o" busy_ms_per_step)" null info
  row "profile $name: kernels compiled" "$(jget "$o" compiled)" null info
}
PROFILES="$WORK/profiles"
mkdir -p "$PROFILES"
if want sampling && [[ " ${models[*]} " == *" smollm2 "* ]]; then
  profile "sample-smollm2-${SAMPLE_B1}x$PROFILE_NEW" "$PROFILE_NEW" "$RLCR" --device "$DEVICE" \
    --seed 4 generate-answers --model "$M/smollm2" --input "$WORK/sample-$SAMPLE_B1/prompts.parquet" \
    -o "$WORK/profile-answers.parquet" --num-answers 8 --max-new-tokens $PROFILE_NEW \
    --batch-size $SAMPLE_B1 --temperature 1
fi

# --- training: one update step, f32 and bf16, against torch's
training() {
  local m=$1 rows=$2 d="$WORK/train-$1"
  mkdir -p "$d"
  step "table-$m" 120 "$PY" "$HELPER" train-table "$M/$m" "$d/train.parquet" $rows $TRAIN_LEN || return
  local p
  for p in f32 bf16; do
    local tp=fp32; [ $p = bf16 ] && tp=bf16
    local r=null e=null mem=null h=null he=null ref=null hmem=null
    mem_start
    if step "update-$m-$p" 180 "$RLCR" --device "$DEVICE" update --model "$M/$m" \
      --input "$d/train.parquet" -o "$d/out-$p" --lr 1e-6 --micro-batch $rows --epochs 2 \
      --precision $p; then
      r=$(update_rate "$d/out-$p"); e=$(update_entropy "$d/out-$p")
    fi
    mem=$(mem_stop)
    mem_start
    if step "torch-$m-$p" 150 "$PY" "$HELPER" torch-step "$M/$m" "$d/train.parquet" $tp; then
      local o="$LOGS/torch-$m-$p.out"
      h=$(jget "$o" tokens_per_s); he=$(jget "$o" entropy_err); ref=$(jget "$o" entropy_f64)
    fi
    hmem=$(mem_stop)
    row "update $m ${rows}x$TRAIN_LEN $p: tokens/s vs torch" "$r" "$h" ratio 1.0
    # The first step compiles the kernels (NVRTC on CUDA; autotune, when built in, also times
    # candidate kernels then): its cost against the second's.
    row "update $m $p: step 1 s (ref: step 2 s)" "$(update_secs "$d/out-$p" 1)" "$(update_secs "$d/out-$p" 2)" info
    if [ $m = qwen05 ] && [ $p = bf16 ]; then row "update qwen05 bf16: tokens/s" "$r" null min 10000; fi
    row "update $m $p: peak GPU MiB vs torch" "$mem" "$hmem" info
    row "update $m $p: pool MiB in use (ref: reserved)" \
      "$(rlcr_pool "$LOGS/update-$m-$p.log" update 1)" "$(rlcr_pool "$LOGS/update-$m-$p.log" update 2)" info
    local err=null
    if [ "$e" != null ] && [ "$ref" != null ]; then
      err=$("$PY" -c 'import sys; print(abs(float(sys.argv[1]) - float(sys.argv[2])))' "$e" "$ref")
    fi
    if [ $p = f32 ]; then
      row "update $m f32: |entropy - f64| (ref: torch)" "$err" "$he" max 1e-4
      F32_ENTROPY=$e
    else
      row "update $m bf16: |entropy - f64| vs autocast" "$err" "$he" le_ref
      # Equal entropies mean the products ran in f32.
      if [ "$e" != null ] && [ "$e" = "${F32_ENTROPY:-}" ]; then
        echo "update-$m-bf16: same entropy as f32 ($e): --precision bf16 had no effect on $DEVICE" >>"$ERRORS"
      fi
    fi
  done
}
want training && [[ " ${models[*]} " == *" smollm2 "* ]] && training smollm2 $SMOL_ROWS
if want training && [ -f "$WORK/train-smollm2/train.parquet" ]; then
  # The f32 step again with the backend's f32 matmul (RLCR_GPU_F32=fast: TF32 on NVIDIA)
  # against torch's fp32 step.
  r=null; e=null
  if step update-smollm2-fast 180 env RLCR_GPU_F32=fast "$RLCR" --device "$DEVICE" update \
    --model "$M/smollm2" --input "$WORK/train-smollm2/train.parquet" -o "$WORK/train-smollm2/out-fast" \
    --lr 1e-6 --micro-batch $SMOL_ROWS --epochs 2 --precision f32; then
    r=$(update_rate "$WORK/train-smollm2/out-fast"); e=$(update_entropy "$WORK/train-smollm2/out-fast")
  fi
  row "update smollm2 f32 GPU_F32=fast: tokens/s vs torch" "$r" "$(jget "$LOGS/torch-smollm2-f32.out" tokens_per_s)" info
  ref=$(jget "$LOGS/torch-smollm2-f32.out" entropy_f64)
  err=null
  if [ "$e" != null ] && [ "$ref" != null ]; then
    err=$("$PY" -c 'import sys; print(abs(float(sys.argv[1]) - float(sys.argv[2])))' "$e" "$ref")
  fi
  row "update smollm2 f32 GPU_F32=fast: |entropy - f64|" "$err" "$(jget "$LOGS/torch-smollm2-f32.out" entropy_err)" info
  profile "update-smollm2-f32" 1 "$RLCR" --device "$DEVICE" update --model "$M/smollm2" \
    --input "$WORK/train-smollm2/train.parquet" -o "$WORK/profile-update" --lr 1e-6 \
    --micro-batch $SMOL_ROWS --epochs 1 --precision f32
fi

if want qwen; then
  step model-qwen05 120 "$PY" "$HELPER" model qwen05 "$M/qwen05" $TINY && models+=(qwen05)
  [[ " ${models[*]} " == *" qwen05 "* ]] && parity qwen05 && [ $MODE = gpu ] && parity_fast qwen05
  [[ " ${models[*]} " == *" qwen05 "* ]] && training qwen05 $QWEN_ROWS
fi
want sample256 && [[ " ${models[*]} " == *" smollm2 "* ]] && sampling $SAMPLE_B2

# --- burn's operation fusion: the same figures from the second binary, against the first
fusion() {
  local d="$WORK/fusion" m=smollm2
  mkdir -p "$d"
  envfact rlcr_fusion "$("$FUSION" --version 2>&1 | tr '\n' ' ')"
  # What the comparisons read, made here when the groups that make them did not run (--only):
  # the parity answers, the sampling prompts and the unfused sampling rate, the training table
  # and the unfused update.
  local a="$WORK/parity-$m" p="$WORK/sample-$SAMPLE_B1" t="$WORK/train-$m"
  mkdir -p "$a" "$p" "$t"
  [ -f "$a/answers.parquet" ] || step "gen-$m" 120 "$RLCR" --device "$DEVICE" --seed 2 \
    generate-answers --model "$M/$m" --input "$WORK/prompts.parquet" -o "$a/answers.parquet" \
    --num-answers 2 --max-new-tokens $PAR_NEW --batch-size 16
  [ -f "$p/prompts.parquet" ] || "$RLCR" --seed 3 -q prepare --from countdown-synth \
    --count $(( SAMPLE_B1 / 8 )) -o "$p/prompts.parquet" 2>>"$LOGS/prepare.log"
  [ -f "$LOGS/sample-rlcr-$SAMPLE_B1.log" ] || step "sample-rlcr-$SAMPLE_B1" 150 "$RLCR" \
    --device "$DEVICE" --seed 4 generate-answers --model "$M/$m" --input "$p/prompts.parquet" \
    -o "$p/answers.parquet" --num-answers 8 --max-new-tokens $SAMPLE_NEW --batch-size $SAMPLE_B1 \
    --temperature 1
  [ -f "$t/train.parquet" ] || step "table-$m" 120 "$PY" "$HELPER" train-table "$M/$m" \
    "$t/train.parquet" $SMOL_ROWS $TRAIN_LEN
  [ -d "$t/out-f32" ] || step "update-$m-f32" 180 "$RLCR" --device "$DEVICE" update --model "$M/$m" \
    --input "$t/train.parquet" -o "$t/out-f32" --lr 1e-6 --micro-batch $SMOL_ROWS --epochs 2 \
    --precision f32
  if step fusion-logprobs 120 "$FUSION" --device "$DEVICE" logprobs --model "$M/$m" \
    --input "$WORK/parity-$m/answers.parquet" -o "$d/lp.parquet" --column lp &&
    step fusion-parity 120 "$PY" "$HELPER" parity "$d/lp.parquet" "$M/$m" lp; then
    row "fusion: logprobs $m: max |rlcr - f64| (ref: hf)" "$(jget "$LOGS/fusion-parity.out" rlcr_vs_f64)" "$(jget "$LOGS/fusion-parity.out" hf_vs_f64)" max 1e-4
  else
    row "fusion: logprobs $m: max |rlcr - f64|" null null max 1e-4
  fi
  local r=null
  if step fusion-sample 150 "$FUSION" --device "$DEVICE" --seed 4 generate-answers \
    --model "$M/$m" --input "$WORK/sample-$SAMPLE_B1/prompts.parquet" -o "$d/answers.parquet" \
    --num-answers 8 --max-new-tokens $SAMPLE_NEW --batch-size $SAMPLE_B1 --temperature 1; then
    r=$(rlcr_rate "$LOGS/fusion-sample.log")
  fi
  row "fusion: sample $m ${SAMPLE_B1}x$SAMPLE_NEW tokens/s (ref: no fusion)" "$r" "$(rlcr_rate "$LOGS/sample-rlcr-$SAMPLE_B1.log")" info
  r=null
  if step fusion-update 180 "$FUSION" --device "$DEVICE" update --model "$M/$m" \
    --input "$WORK/train-$m/train.parquet" -o "$d/out" --lr 1e-6 --micro-batch $SMOL_ROWS \
    --epochs 2 --precision f32; then
    r=$(update_rate "$d/out")
  fi
  row "fusion: update $m f32 tokens/s (ref: no fusion)" "$r" "$(update_rate "$WORK/train-$m/out-f32")" info
  row "fusion: update $m f32 step 1 s (ref: step 2 s)" "$(update_secs "$d/out" 1)" "$(update_secs "$d/out" 2)" info
  profile "fusion-sample-smollm2-${SAMPLE_B1}x$PROFILE_NEW" "$PROFILE_NEW" "$FUSION" \
    --device "$DEVICE" --seed 4 generate-answers --model "$M/$m" \
    --input "$WORK/sample-$SAMPLE_B1/prompts.parquet" -o "$d/profile-answers.parquet" \
    --num-answers 8 --max-new-tokens $PROFILE_NEW --batch-size $SAMPLE_B1 --temperature 1
}
want fusion && [ -n "$FUSION" ] && [[ " ${models[*]} " == *" smollm2 "* ]] && fusion

# --- the main job, for what is left of the budget (at most 5 minutes)
if want main; then
  t0=$(date +%s)
  step main-job 300 make -f "$ROOT/scripts/rl.mk" RLCR="$RLCR" DEVICE="$DEVICE" RUNS="$WORK/runs" \
    RUN=gpu ITERS=$MAIN_ITERS "${MAIN_FLAGS[@]}"
  rc=$?
  done_iters=$(ls -d "$WORK"/runs/gpu/iter-*/model/config.json 2>/dev/null | wc -l)
  row "main job (rl.mk): iterations of $MAIN_ITERS done" "$done_iters" null min "$MAIN_ITERS"
  row "main job (rl.mk): seconds (exit $rc)" "$(( $(date +%s) - t0 ))" null info
fi

# --- results
"$PY" - "$OUTDIR/gpu_check.json" "$MODE" "$ENVF" "$ROWS" "$ERRORS" "$(elapsed)" "$PROFILES" <<'EOF'
import glob, json, os, sys
path, mode, envf, rowsf, errf, secs, profiles = sys.argv[1:]
env = {}
for line in open(envf):
    env.update(json.loads(line))
rows = [json.loads(l) for l in open(rowsf)]
for r in rows:
    a, b, k, t = r["rlcr"], r["ref"], r["kind"], r["threshold"]
    ok, goal = None, ""
    if k == "max":
        goal = f"<= {t:g}"; ok = None if a is None else a <= t
    elif k == "min":
        goal = f">= {t:g}"; ok = None if a is None else a >= t
    elif k == "ratio":
        goal = f">= {t:g} x ref"; ok = None if a is None or not b else a / b >= t
    elif k == "le_ref":
        goal = "<= ref"; ok = None if a is None or b is None else a <= b
    if a is None and k != "info":
        ok = False
    if mode != "gpu":
        ok = None  # the dry run's figures are not measurements
    r["goal"], r["ok"] = goal, ok
errors = [l.rstrip("\n") for l in open(errf) if l.strip()]
res = {"mode": mode, "seconds": int(secs), "env": env, "rows": rows, "errors": errors,
       "profiles": {os.path.basename(p)[:-5]: json.load(open(p))
                    for p in sorted(glob.glob(os.path.join(profiles, "*.json")))}}
json.dump(res, open(path, "w"), indent=1)
EOF
tar -czf "$OUTDIR/logs.tar.gz" -C "$WORK" logs
"$PY" "$HELPER" table "$OUTDIR/gpu_check.json"
# Exit status: 0 when every step ran (the goals are judged in the table, not here).
[ ! -s "$ERRORS" ]
