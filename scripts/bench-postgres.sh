#!/usr/bin/env bash
# Repeats `anarchon bench` against the local PostgreSQL and prints the median
# of each figure, so that one noisy run on a shared machine does not decide.
#
#   scripts/bench-postgres.sh [RUNS] [SECONDS] [CLIENTS...]
#
# Environment: CLAIM=function|transaction (default function), PG_URL
# (default postgres://postgres@127.0.0.1:5432/test), PARAMS (more URL
# parameters, e.g. '&options=-c%20synchronous_commit%3Doff'). Every run uses
# the table prefix bench_<claim>; build first with `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
seconds=${2:-5}
shift $(( $# > 2 ? 2 : $# ))
clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(1 16 64)
claim=${CLAIM:-function}
url="${PG_URL:-postgres://postgres@127.0.0.1:5432/test}?table=bench_${claim}&claim=${claim}&max_connections=64${PARAMS:-}"
bin=./target/release/anarchon

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "claim=$claim${PARAMS:+ params=$PARAMS} runs=$runs seconds=$seconds load=$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %10s %10s %8s %9s %9s %9s %9s\n' clients raw/s sidecar/s ratio raw_p50 raw_p99 side_p50 side_p99
for c in "${clients[@]}"; do
  out=$(for _ in $(seq 1 "$runs"); do
    "$bin" bench --backend "$url" --clients "$c" --seconds "$seconds" --json
  done)
  m() { jq -r "$1" <<<"$out" | median; }
  printf '%-8s %10.0f %10.0f %8.2f %9.2f %9.2f %9.2f %9.2f\n' "$c" \
    "$(m .raw_claims_per_s)" "$(m .sidecar_claims_per_s)" "$(m .ratio)" \
    "$(m .raw.p50_ms)" "$(m .raw.p99_ms)" "$(m .sidecar.p50_ms)" "$(m .sidecar.p99_ms)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
