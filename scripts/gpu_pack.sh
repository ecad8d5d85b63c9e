#!/usr/bin/env bash
# Builds the release CUDA binary and assembles what a GPU machine without Rust needs to run
# scripts/gpu_check.sh: .gpu/rlcr.xz (stripped, `xz -9`) next to this repository's working tree
# (fixtures and scripts travel with it). Checks that the working tree plus .gpu/ stays within
# LIMIT_MIB (default 64 MiB, what one call to such a machine carries). docs/backends.md says how
# it is used.
#
#   scripts/gpu_pack.sh            # cargo build --release --features cuda, then pack
#   scripts/gpu_pack.sh --no-build # pack the binary already built
#   FUSION=1 scripts/gpu_pack.sh   # also .gpu/rlcr-fusion.xz: the same build with burn's
#                                  # operation fusion (for gpu_check.sh --rlcr-fusion)
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB=${LIMIT_MIB:-64}
TARGET=${CARGO_TARGET_DIR:-target}
if [ "${1:-}" != --no-build ]; then
  nice -n 10 cargo build --release --features cuda --bin rlcr
fi
bin="$TARGET/release/rlcr"
[ -x "$bin" ] || { echo "gpu_pack: $bin is missing (build it, or drop --no-build)" >&2; exit 1; }
mkdir -p .gpu
strip -o .gpu/rlcr "$bin"
rm -f .gpu/rlcr.xz .gpu/rlcr-fusion.xz
xz -9 -T1 .gpu/rlcr
if [ "${FUSION:-0}" = 1 ]; then
  # The same target folder: cargo keeps both feature sets' artifacts (only burn's GPU crates and
  # rlcr differ); the binary above is already packed.
  nice -n 10 cargo build --release --features "cuda burn/fusion" --bin rlcr
  strip -o .gpu/rlcr-fusion "$bin"
  xz -9 -T1 .gpu/rlcr-fusion
fi
git describe --always --dirty >.gpu/commit
size() { du -b "$1" | cut -f1; }
echo "gpu_pack: release $(size "$bin") bytes, stripped+xz $(size .gpu/rlcr.xz) bytes (.gpu/rlcr.xz)"
# What a call carries: tracked files and untracked files git does not ignore, plus .gpu/.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -bc 2>/dev/null | tail -n 1 | cut -f1)
total=$(( tree + $(size .gpu) ))
echo "gpu_pack: working tree $tree bytes + .gpu $(size .gpu) bytes = $(( total / 1048576 )) MiB (limit $LIMIT_MIB MiB)"
if [ $total -gt $(( LIMIT_MIB * 1048576 )) ]; then
  echo "gpu_pack: over the limit" >&2
  exit 1
fi
