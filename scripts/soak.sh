#!/usr/bin/env bash
# The chaos soak (issue 11): for each lease store in turn, three `anarchon
# serve` sidecars in a mesh, 30 gRPC claimers contending for a slot every
# 200 ms and for a lock, a random sidecar SIGKILLed and restarted every few
# seconds, and the store server restarted once at half time (PostgreSQL,
# Redis; SQLite has no server). Prints a table and one `SOAK_JSON {…}` line
# per store; exits non-zero when a run shows a double win, a reused fencing
# number, a stale renew/release or a missing winner.
#
#   scripts/soak.sh --minutes M [--stores sqlite,postgres,redis]
#   scripts/soak.sh --faults partition,pause,kill,store --minutes M [--stores …]
#
# With --faults it runs the fault lab's long run instead (tests/faults.rs,
# docs/safety.md): three sidecars on 127.0.0.2–.4 under their own group ids,
# a Hold client per sidecar contending for one lock, and one random fault
# after another on the holder's sidecar — nftables cuts (mesh both ways,
# one way, mesh + store), SIGSTOP, SIGKILL + restart, store restarts and
# store cuts — checked for overlapping holders on the clients' clocks. One
# `LAB_JSON {…}` line per store (target/soak/lab-<UTC time>.jsonl).
# SOAK_PROFILE=--profile=dev runs a debug build instead of --release.
#
# M minutes per store (so three stores take about 3 × M minutes). The whole
# output goes to target/soak/soak-<UTC time>.log, the JSON lines to
# target/soak/soak-<UTC time>.jsonl.
#
# It restarts the machine's own PostgreSQL and Redis (as tests/common/
# restart.rs does): do not run it while others use those servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services/common.sh

minutes=10
stores=sqlite,postgres,redis
faults=
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --stores) stores="$2"; shift 2 ;;
    --faults) faults="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
case "$minutes" in
  ''|*[!0-9.]*) echo "soak.sh: --minutes wants a number, got '$minutes'" >&2; exit 64 ;;
esac

ensure_stores || true
out="${CARGO_TARGET_DIR:-target}/soak"
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
log="$out/soak-$stamp.log"
echo "soak.sh: $minutes min per store on $stores; load average $(cut -d' ' -f1-3 /proc/loadavg); log $log"
status=0
if [ -n "$faults" ]; then
  command -v nft >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables; }
  log="$out/lab-$stamp.log"
  LAB_SOAK_MINUTES="$minutes" LAB_SOAK_STORES="$stores" LAB_SOAK_FAULTS="$faults" \
    cargo test ${SOAK_PROFILE:---release} --locked --test faults -- --ignored --exact lab_soak --nocapture 2>&1 \
    | tee "$log" || status=$?
  grep '^LAB_JSON ' "$log" | sed 's/^LAB_JSON //' > "$out/lab-$stamp.jsonl" || true
  echo "soak.sh: load average $(cut -d' ' -f1-3 /proc/loadavg); JSON lines in $out/lab-$stamp.jsonl"
  exit "$status"
fi
SOAK_MINUTES="$minutes" SOAK_STORES="$stores" \
  cargo test --release --locked --test soak -- --ignored --exact soak --nocapture 2>&1 \
  | tee "$log" || status=$?
grep '^SOAK_JSON ' "$log" | sed 's/^SOAK_JSON //' > "$out/soak-$stamp.jsonl" || true
echo "soak.sh: load average $(cut -d' ' -f1-3 /proc/loadavg); JSON lines in $out/soak-$stamp.jsonl"
exit "$status"
