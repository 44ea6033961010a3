#!/usr/bin/env bash
# User-space instructions the sidecar executes per claim, counted by
# valgrind's callgrind: a count, not a time, so it is the same whatever else
# the machine is doing, and a before and an after can be told apart by a
# few percent on a noisy VM where claims/s moves by 30 % from run to run.
#
#   scripts/bench-instr.sh BIN [BIN ...]            # each a release `anarchon`
#   BACKEND='sqlite://…' scripts/bench-instr.sh BIN
#
# For each binary, ROUNDS times (alternated): `BIN serve` under callgrind
# on a fresh data dir, 200 claims to warm up, the counters zeroed, then
# THREADS Python clients (clients/python, grpcio) × PER claims, each a new
# slot (every claim wins and writes), and the counters dumped. Prints the
# total and the instructions per claim; the profile stays in
# $OUT/<label>/cg.out.* for `callgrind_annotate --inclusive=yes`.
# The kernel's part (loopback TCP, scheduling) is not counted.
#
# Environment: BACKEND (redis lease under a fresh prefix), THREADS (16),
# PER (250), ROUNDS (2), OUT (/tmp/anarchon-instr), PORT (47061).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is needed (Debian: valgrind)" >&2; exit 2; }
threads=${THREADS:-16}
per=${PER:-250}
rounds=${ROUNDS:-2}
out=${OUT:-/tmp/anarchon-instr}
port=${PORT:-47061}
root=$PWD

drive() { # ADDR THREADS PER JOB: claims, every one a new slot
  python3 - "$@" <<'EOF'
import sys, threading, time
sys.path.insert(0, sys.argv[5] + "/clients/python")
import anarchon
addr, threads, per, job = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
base = int(time.time() * 1000)
won = [0] * threads
def run(t):
    c = anarchon.Client(addr)
    for i in range(per):
        won[t] += c.claim(f"{job}-{t}", base + i, max_late_ms=86_400_000).won
ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
for x in ths: x.start()
for x in ths: x.join()
if sum(won) != threads * per:
    sys.exit(f"{sum(won)} of {threads * per} claims won: every claim is a new slot")
EOF
}

for round in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    label="$(basename "$bin")-$round"
    d="$out/$label"
    rm -rf "$d" && mkdir -p "$d/data"
    backend=${BACKEND:-"redis://127.0.0.1:6379/?strategy=lease&prefix=anarchon-instr-$RANDOM$RANDOM"}
    valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$bin" serve \
      --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data-dir "$d/data" \
      --backend "$backend" >"$d/serve.log" 2>&1 &
    vg=$!
    for _ in $(seq 1 120); do grep -q 'store ready' "$d/serve.log" && break; sleep 0.5; done
    grep -q 'store ready' "$d/serve.log" || { cat "$d/serve.log" >&2; kill $vg; exit 1; }
    drive "127.0.0.1:$port" 4 50 "warm-$label-$RANDOM" "$root"
    callgrind_control -z $vg >/dev/null 2>&1
    drive "127.0.0.1:$port" "$threads" "$per" "claim-$label-$RANDOM" "$root"
    callgrind_control -d $vg >/dev/null 2>&1
    kill $vg && wait $vg 2>/dev/null || true
    dump=$(ls "$d"/cg.out.* | head -1)
    total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    echo "$label instructions=$total claims=$((threads * per)) per_claim=$((total / (threads * per)))"
  done
done
