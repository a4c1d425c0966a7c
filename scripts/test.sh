#!/usr/bin/env bash
# Runs every test Rewind has, installing first what the tests need.
# Real clients (nbdinfo, nbdcopy, qemu-img, qemu-io, fio, nbdfuse + ext4) are
# installed, never skipped. Needs root (or sudo) for apt, loop devices and mounts.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

packages=(nbdkit libnbd-bin python3-libnbd fio qemu-utils fuse3 e2fsprogs util-linux curl)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# nbdfuse needs the fuse device; loop devices need their control node.
[ -e /dev/fuse ] || as_root modprobe fuse
[ -e /dev/loop-control ] || as_root modprobe loop

if ! command -v cargo >/dev/null; then
  echo "Rust is not installed: see https://rustup.rs" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test (release: the model, crash and client tests do real work)"
cargo test --workspace --release
echo "== fuzz smoke (fuzz/smoke.sh: every target's corpus and regressions, then a few seconds each)"
./fuzz/smoke.sh
echo "== all tests passed"
