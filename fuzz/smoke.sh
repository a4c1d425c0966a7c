#!/usr/bin/env bash
# CI's fuzz smoke (called by scripts/test.sh): builds every cargo fuzz target,
# replays each one's committed corpus and regression inputs (every input
# that ever crashed it must pass now), then fuzzes each for a few seconds.
# Installs cargo-fuzz if missing. The long campaigns are in fuzz/README.md.
#
#   fuzz/smoke.sh             all targets, FUZZ_SECONDS (default 8) each
#   fuzz/smoke.sh pack        one target
set -euo pipefail
cd "$(dirname "$0")"

seconds="${FUZZ_SECONDS:-8}"
# The targets' build lives outside the clone, so that CI (a fresh clone on a
# machine it keeps) rebuilds only what changed: a cold build of every target
# takes about 6 minutes on 2 cores, a warm one well under 1.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME:-/tmp}/.cache/rewind/fuzz-target}"

# cargo fuzz needs nightly's flags. The rustup nightly if there is one;
# otherwise stable, told to accept them (no sanitizer is used, see below).
if rustup run nightly rustc --version >/dev/null 2>&1; then
  cargo=(cargo +nightly)
else
  export RUSTC_BOOTSTRAP=1
  cargo=(cargo)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi

# No sanitizer: the code under test is safe Rust (the one unsafe block is
# the targets' counting allocator), so AddressSanitizer would only halve the
# speed. Debug assertions and overflow checks are on, as in the tests.
build=(fuzz build --sanitizer none --debug-assertions)
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  mapfile -t targets < <("${cargo[@]}" fuzz list)
fi
start=$(date +%s)
echo "== cargo fuzz build (${#targets[@]} targets)"
"${cargo[@]}" "${build[@]}"
# The seeds' writer is built by no target: checked here, so that it keeps
# up with the encoders it calls (fuzz/README.md).
"${cargo[@]}" check --quiet -p rewind-fuzz-seeds
built=$(date +%s)

bin="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
  # Regressions: each input that once crashed the target, run once.
  if compgen -G "regressions/$target/*" >/dev/null; then
    "$bin/$target" regressions/"$target"/* >"$scratch/$target.regressions" 2>&1 || {
      cat "$scratch/$target.regressions"
      echo "fuzz target $target fails a regression input" >&2
      exit 1
    }
  fi
  # The committed corpus, then fresh inputs mutated from it; new inputs go
  # to a scratch directory so the committed corpus stays as it is.
  mkdir -p "$scratch/$target"
  "$bin/$target" "$scratch/$target" "corpus/$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$scratch/$target-" -print_final_stats=1 >"$scratch/$target.log" 2>&1 || {
    tail -50 "$scratch/$target.log"
    echo "fuzz target $target crashed; the input is above, kept as $scratch/$target-crash-*" >&2
    trap - EXIT
    exit 1
  }
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$target.log")
  echo "   $target: $runs runs, no crash"
done
echo "== fuzz smoke: ${#targets[@]} targets built in $((built - start)) s, fuzzed in $(($(date +%s) - built)) s"
