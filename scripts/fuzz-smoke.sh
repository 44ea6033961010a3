#!/usr/bin/env bash
# Coverage-guided fuzzing of every `cargo fuzz` target in fuzz/ (libFuzzer).
#
#   scripts/fuzz-smoke.sh                 # bounded smoke run: 20 s per target
#   scripts/fuzz-smoke.sh --seconds 600   # a longer run (docs/FUZZING.md)
#
# Installs cargo-fuzz from crates.io when it is missing. The fuzz crate needs
# nightly-only compiler flags (sanitizer coverage), which the stable
# toolchain accepts with RUSTC_BOOTSTRAP=1. Builds go to
# $FUZZ_TARGET_DIR (default /var/tmp/anarchon-fuzz-target), outside the
# checkout, so repeated runs on one machine reuse the build. Each run starts
# from the committed seeds in fuzz/corpus/<target> and writes what it finds
# to a scratch directory; a crash leaves its input in fuzz/artifacts/ and
# fails the script.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=20
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    *) echo "fuzz-smoke.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke.sh: installing cargo-fuzz"
  cargo install --locked cargo-fuzz --version 0.13.2
fi
export RUSTC_BOOTSTRAP=1
target_dir="${FUZZ_TARGET_DIR:-/var/tmp/anarchon-fuzz-target}"
flags=(-O -a -s none --target-dir "$target_dir")
cargo fuzz build "${flags[@]}"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/anarchon-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
for t in $(cargo fuzz list); do
  mkdir -p "$scratch/$t" "corpus/$t"
  echo "== fuzz $t for ${seconds}s"
  cargo fuzz run "${flags[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    2>"$scratch/$t.log" || { tail -60 "$scratch/$t.log" >&2; echo "fuzz-smoke.sh: $t FAILED" >&2; exit 1; }
  grep -E "^stat::(number_of_executed_units|peak_rss_mb|new_units_added)|^#[0-9]+ *DONE" "$scratch/$t.log" || true
  echo "   corpus: $(ls "$scratch/$t" | wc -l) new inputs, $(ls "corpus/$t" | wc -l) seeds"
done
echo "fuzz-smoke.sh: every target ran ${seconds}s without a crash"
