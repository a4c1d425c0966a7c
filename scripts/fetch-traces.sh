#!/usr/bin/env bash
# The real block trace the lab's tests and bench/lab.py read: the CloudPhysics
# VSCSI trace (113,872 requests) that libCacheSim distributes, in its vscsi
# and oracleGeneral binary formats. They come from the libcachesim source
# package on PyPI (its data/ directory; 81 MB, fetched once), are checked
# against their SHA-256 and kept in ~/.cache/rewind/traces (REWIND_TRACES
# overrides). Prints the directory.
set -euo pipefail

dir="${REWIND_TRACES:-${HOME:-/tmp}/.cache/rewind/traces}"
declare -A sha256=(
  [cloudPhysicsIO.vscsi]=3e67d66a07e9292bb47f6c765eb24ab3ea3f1f7de7d64a1b9e8c28b38b7439b9
  [cloudPhysicsIO.oracleGeneral.bin]=65438dd7b2d3dec7ffe8a5c9348045da92de3311f339b7b59c9a0a44e6050dea
)

intact() {
  for file in "${!sha256[@]}"; do
    echo "${sha256[$file]}  $dir/$file" | sha256sum --check --status 2>/dev/null || return 1
  done
}

if ! intact; then
  echo "== fetching the CloudPhysics trace (libcachesim 0.3.5's source package, PyPI)" >&2
  command -v pip3 >/dev/null || python3 -m pip --version >/dev/null 2>&1 || {
    echo "pip is needed to fetch the trace: apt-get install python3-pip" >&2
    exit 1
  }
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$scratch" libcachesim==0.3.5 >&2
  tar -xzf "$scratch"/libcachesim-0.3.5.tar.gz -C "$scratch" --wildcards \
    '*/data/cloudPhysicsIO.vscsi' '*/data/cloudPhysicsIO.oracleGeneral.bin'
  mkdir -p "$dir"
  for file in "${!sha256[@]}"; do
    mv "$(find "$scratch" -name "$file" -print -quit)" "$dir/$file"
  done
  intact || { echo "the fetched trace does not match its SHA-256" >&2; exit 1; }
fi
echo "$dir"
