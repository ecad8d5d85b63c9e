#!/usr/bin/env bash
# The test command of the README: formatting, lints, and every test of the workspace (rlcr and
# its kernels crate, crates/rlcr-kernels).
#
# RLCR_TEST_GPU=1 also tests the GPU backends (CI sets it): the `wgpu` feature's tests run on a
# wgpu device (any Vulkan/Metal/DX12 adapter; on Linux without a GPU, Mesa's
# software Vulkan device from `apt-get install mesa-vulkan-drivers`), and the `cuda` feature is
# type-checked (`DOCS_RS=1` skips the LLVM download of burn's CUDA build; nothing CUDA runs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
if [ "${RLCR_TEST_GPU:-0}" = 1 ]; then
  cargo clippy --features wgpu --all-targets -- -D warnings
  cargo test --features wgpu --lib --test integration -- devices device_strings
  DOCS_RS=1 cargo check --features cuda
fi
