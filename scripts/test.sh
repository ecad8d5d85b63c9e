#!/usr/bin/env bash
# The test command of the README: formatting, lints, and every test of the workspace (rlcr and
# its kernels crate, crates/rlcr-kernels).
#
# RLCR_TEST_GPU=1 also tests the GPU backends (CI sets it), in one build with both features: the
# `wgpu` tests run on a wgpu device (any Vulkan/Metal/DX12 adapter; on Linux without a GPU, Mesa's
# software Vulkan device from `apt-get install mesa-vulkan-drivers`), and the `cuda` feature is
# built for real (offline: docs/backends.md) and run on this machine, which has no CUDA driver:
# `--device cuda` must fail on one line; then scripts/gpu_check.sh's dry run (tiny sizes, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh clone gives every file the clone's time, and cargo rebuilds a path dependency whose
# sources are newer than its last build, with everything that depends on it: for the cubecl-llvm
# stand-in (crates/cubecl-llvm-stub, `--features cuda` only) that is cubecl-cuda and the whole
# cubecl/burn stack above it, on every CI run over a reused target directory. Its files take the
# time of the last commit that changed them (when they are as committed), so a reused build stays
# valid until they change.
if git diff --quiet HEAD -- crates/cubecl-llvm-stub 2>/dev/null &&
  t=$(git log -1 --format=%ct -- crates/cubecl-llvm-stub) && [ -n "$t" ]; then
  find crates/cubecl-llvm-stub -type f -exec touch -d "@$t" {} +
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
if [ "${RLCR_TEST_GPU:-0}" = 1 ]; then
  # One build with both GPU backends: the burn/cubecl stack they share is compiled once for the
  # lints and once for the tests, instead of once per backend for each (two builds of the stack
  # fewer on 2 cores).
  scripts/check_cuda_patch.sh
  cargo clippy --features wgpu,cuda --all-targets -- -D warnings
  # No NVIDIA device here (CI): the no-driver test must see no driver.
  [ -e /dev/nvidiactl ] || export RLCR_TEST_NO_CUDA_DRIVER=1
  cargo test --features wgpu,cuda --lib --test integration -- \
    devices device_strings transfer_counts sample::draw cuda backend::gpu:: graph \
    --skip model::graph:: --skip decode_graph_replays
  # The recorded decode steps alone, one test at a time: a capture window takes every buffer
  # from what the pool already holds, and another test thread allocating on the same device
  # meanwhile can leave it none (seen: 2 failed captures in 12 loaded runs with parallel test
  # threads, none in 12 with one). A process that samples drives its device from one thread.
  cargo test --features wgpu,cuda --lib -- model::graph:: decode_graph_replays --test-threads=1
  if python3 -c 'import torch, transformers, pyarrow' 2>/dev/null || [ "${RLCR_REQUIRE_TORCH:-0}" = 1 ]; then
    scripts/gpu_check.sh --dry-run --rlcr "${CARGO_TARGET_DIR:-target}/debug/rlcr" \
      --out "${CARGO_TARGET_DIR:-target}/gpu-check-dry"
  else
    echo "test.sh: torch/transformers/pyarrow not importable: scripts/gpu_check.sh --dry-run skipped"
  fi
fi
