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
# Lints in the test build itself: clippy's driver compiles the workspace's own crates (library,
# binary, tests, examples, and the benches, which `cargo test` builds only when asked) with
# clippy's lints denied as `cargo clippy --all-targets -- -D warnings` does, and the
# dependencies with plain rustc. `cargo clippy` would compile the whole burn/cubecl stack a
# second time, metadata only (about 8 of a cold run's minutes on 2 cores per feature set), for
# no more lints.
if ! clippy_driver=$(command -v clippy-driver); then
  echo "test.sh: clippy-driver not found (rustup component add clippy)" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
cargo test --workspace --benches --no-run
cargo test --workspace
if [ "${RLCR_TEST_GPU:-0}" = 1 ]; then
  # One build with both GPU backends, linted as above: the burn/cubecl stack they share is
  # compiled once, instead of once per backend and again for the lints. The library, binary and
  # tests (the examples, benches and kernels crate have no GPU code: linted above).
  scripts/check_cuda_patch.sh
  cargo test --features wgpu,cuda --lib --bins --tests --no-run
  # No NVIDIA device here (CI): the no-driver test must see no driver.
  [ -e /dev/nvidiactl ] || export RLCR_TEST_NO_CUDA_DRIVER=1
  cargo test --features wgpu,cuda --lib --test integration -- \
    devices device_strings transfer_counts sample::draw cuda backend::gpu:: graph without_atomics \
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
