#!/usr/bin/env bash
# Fails unless a `--features cuda` build uses the cubecl-llvm stand-in (crates/cubecl-llvm-stub)
# of the root manifest's `[patch.crates-io]`. When burn or cubecl move to a cubecl-llvm version
# other than the stand-in's, cargo only warns that the patch is unused and builds the real crate,
# whose build script downloads LLVM; this check makes that a failure (scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
stub_version=$(sed -n 's/^version = "\(.*\)"/\1/p' crates/cubecl-llvm-stub/Cargo.toml | head -1)
err=$(mktemp)
trap 'rm -f "$err"' EXIT
# The packages named cubecl-llvm in the cuda build's graph, with their sources.
if ! tree=$(cargo tree --features cuda -e normal,build --prefix none -i cubecl-llvm --depth 0 2>"$err"); then
  cat "$err" >&2
  echo "check_cuda_patch: cubecl-llvm is not in the --features cuda graph any more; remove the" \
    "stand-in (crates/cubecl-llvm-stub) and its [patch.crates-io] entry" >&2
  exit 1
fi
if grep -q "was not used in the crate graph" "$err"; then
  cat "$err" >&2
  echo "check_cuda_patch: the cubecl-llvm patch is unused: cubecl-cuda now wants another" \
    "cubecl-llvm than the stand-in's $stub_version; update crates/cubecl-llvm-stub to it" >&2
  exit 1
fi
want="cubecl-llvm v$stub_version ($PWD/crates/cubecl-llvm-stub)"
if [ "$tree" != "$want" ]; then
  echo "check_cuda_patch: expected only '$want' in the cuda graph, found:" >&2
  echo "$tree" >&2
  exit 1
fi
# And Cargo.lock keeps no registry copy (nor its LLVM download chain).
if grep -A2 '^name = "cubecl-llvm"$' Cargo.lock | grep -q '^source = '; then
  echo "check_cuda_patch: Cargo.lock has a crates.io cubecl-llvm; the stand-in is not used" >&2
  exit 1
fi
for pkg in tracel-llvm-bundler llvm-sys; do
  if grep -q "^name = \"$pkg\"$" Cargo.lock; then
    echo "check_cuda_patch: Cargo.lock has $pkg: something still builds LLVM" >&2
    exit 1
  fi
done
echo "check_cuda_patch: ok ($want)"
