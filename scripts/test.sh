#!/usr/bin/env bash
# Runs every test Rewind has, installing first what the tests need.
# Real clients (nbdinfo, nbdcopy, qemu-img, qemu-io, fio, nbdfuse + ext4, libnfs's nfs-cp, nfs-ls and nfs-cat) and
# real servers (nfs-ganesha behind `rewind proxy`, MinIO) are installed, never skipped. Needs root for apt, loop
# devices, mounts and nfs-ganesha (its VFS back end opens files by handle).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

packages=(nbdkit libnbd-bin python3-libnbd fio qemu-utils fuse3 e2fsprogs util-linux curl python3-pip libnfs-utils
  nfs-ganesha nfs-ganesha-vfs rpcbind)
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

# MinIO, the real S3 server of the object-storage tests, built from source
# with Go (about 4 minutes on 2 cores) in the background while Rust builds.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null; then
  echo "Go (1.24 or newer) is needed to build MinIO for the S3 tests: see https://go.dev/doc/install" >&2
  exit 1
fi
export REWIND_MINIO="$(go env GOPATH)/bin/minio"
minio_build=""
if ! go version -m "$REWIND_MINIO" 2>/dev/null | grep -q "github.com/minio/minio[[:space:]]*$MINIO_VERSION"; then
  echo "== building MinIO $MINIO_VERSION in the background (log: target/minio-build.log)"
  mkdir -p target
  (cd /tmp && go install "github.com/minio/minio@$MINIO_VERSION") >target/minio-build.log 2>&1 &
  minio_build=$!
fi

# The lab's real trace (CloudPhysics, from PyPI's libcachesim source package; cached).
./scripts/fetch-traces.sh >/dev/null

if ! command -v cargo >/dev/null; then
  echo "Rust is not installed: see https://rustup.rs" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check (the workspace, and the fuzz workspace beside it)"
cargo fmt --all --check
(cd fuzz && cargo fmt --all --check)
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test (release: the model, crash and client tests do real work)"
cargo test --workspace --release --no-run
if [ -n "$minio_build" ]; then
  echo "== waiting for MinIO's build"
  wait "$minio_build" || { cat target/minio-build.log >&2; echo "MinIO did not build" >&2; exit 1; }
fi
cargo test --workspace --release
echo "== fuzz smoke (fuzz/smoke.sh: every target's corpus and regressions, then a few seconds each)"
./fuzz/smoke.sh
echo "== all tests passed"
