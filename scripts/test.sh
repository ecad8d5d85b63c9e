#!/usr/bin/env bash
# The test command of the README: formatting, lints, and every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test
