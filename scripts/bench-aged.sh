#!/usr/bin/env bash
# The "Aged data" figures of docs/BENCHMARKS.md: each lease store measured
# fresh, then again after N finished runs (default 10^6) with retention
# pruning on, in one `anarchon bench --age N` run per store. One JSON line per
# store into docs/benchmarks/aged.jsonl, and a markdown table on stdout.
#
#   scripts/bench-aged.sh [N] [SECONDS] [CLIENTS]    # 1000000 5 16
#
# Environment: STORES="redis-lease postgres sqlite", OUT, BUILD=0 (use the
# binary already built), CARGO_TARGET_DIR, AGE_ARGS (more bench flags, e.g.
# "--age-retention-ms 10000 --age-prune-every-ms 1000").
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
seconds=${2:-5}
clients=${3:-16}
read -r -a stores <<<"${STORES:-redis-lease postgres sqlite}"
out=${OUT:-docs/benchmarks/aged.jsonl}
bin=${CARGO_TARGET_DIR:-target}/release/anarchon
[ "${BUILD:-1}" = 1 ] && cargo build --release --locked
read -r -a extra <<<"${AGE_ARGS:-}"

. scripts/bench-common.sh
bench_scratch "a$(date +%s)"

url_for() {
  case $1 in
    sqlite | postgres | redis-lease) bench_url "$1" aged ;;
    *) echo "not a lease store: $1" >&2; return 1 ;;
  esac
}

mkdir -p "$(dirname "$out")"
for s in "${stores[@]}"; do
  echo "== $s: fresh, then $n finished runs, then aged; $(uptime)" >&2
  "$bin" bench --backend "$(url_for "$s")" --clients "$clients" --seconds "$seconds" \
    --age "$n" "${extra[@]}" --json \
    | jq -c --arg l "$s" --arg at "$(date -u +%FT%TZ)" '. + {"label": $l, "at": $at}' | tee -a "$out"
done
echo "== done; $(uptime)" >&2
echo
echo "| store | runs | aging took | raw fresh / aged claims/s | raw aged ÷ fresh | sidecar fresh / aged claims/s | sidecar aged ÷ fresh | load avg |"
echo "|---|---|---|---|---|---|---|---|"
tail -n "${#stores[@]}" "$out" | jq -r '"| \(.label) | \(.aged.runs) | \(.aged.seconds | round) s | \(.raw_claims_per_s | round) / \(.aged.raw_claims_per_s | round) | \(.aged.raw_aged_vs_fresh) | \(.sidecar_claims_per_s | round) / \(.aged.sidecar_claims_per_s | round) | \(.aged.sidecar_aged_vs_fresh) | \(.loadavg_start)–\(.loadavg_end) |"'
