#!/usr/bin/env bash
# The one command that runs every test: makes sure the local stores are up
# (starting any that is down), then runs formatting, lints and every suite.
#
#   scripts/test.sh            # everything
#   scripts/test.sh --quick    # skip clippy
#
# Under CI=true a store that cannot be reached fails its suite instead of
# being skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services/common.sh

quick=0
[ "${1:-}" = "--quick" ] && quick=1

failed=0
ensure_stores || failed=1
for extra in scripts/services/extra-*.sh; do
  [ -e "$extra" ] || continue
  bash "$extra" || failed=1
done
if [ "$failed" = 1 ] && [ "${CI:-}" = "true" ]; then
  echo "test.sh: a store could not be started; CI cannot skip its suites" >&2
  exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
if [ "$quick" = 0 ]; then
  echo "== cargo clippy"
  cargo clippy --all-targets --locked -- -D warnings
fi
echo "== cargo test"
cargo test --locked --all-targets -- --test-threads "${TEST_THREADS:-2}"
echo "== cargo fuzz (a bounded smoke run of every target)"
scripts/fuzz-smoke.sh --seconds "${FUZZ_SECONDS:-20}"
for t in clients/test.sh helm/test.sh; do
  if [ -x "$t" ]; then echo "== $t"; "$t"; fi
done
echo "test.sh: all suites passed"
