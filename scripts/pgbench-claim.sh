#!/usr/bin/env bash
# PostgreSQL's own CPU per claim for two versions of the claim functions,
# measured with pgbench and alternated (docs/BENCHMARKS.md, issue 19 rounds 11,
# 12 and 22). No sidecar runs: pgbench calls `PREFIX_claim_batch` (14
# arguments, straight to the lock; FUNCTION picks another batch function of
# the same arguments) with N claims of new slots per call, each of its own
# job, and the CPU of every PostgreSQL process (the postmaster's reaped
# children included) is read from /proc before and after each run, so
# PostgreSQL must run on this host.
#
#   scripts/pgbench-claim.sh [ROUNDS]         # default 3
#
# Environment:
#   OLD=8           the "old" prefix gets migrations 1..OLD; the "new" one all
#   FUNCTION=claim_batch  the batch function called (claim_batch_whole: the
#                   batch without subtransactions, migrations 10 to 12)
#   BATCHES="1 4 16"  claims per call
#   SECONDS_PER_RUN=8, CLIENTS=4 (pgbench -c), PGHOST=127.0.0.1, PGUSER=postgres,
#   PGDATABASE=test
# Both prefixes (pgb_old_*, pgb_new_*) are dropped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
old=${OLD:-8}
read -r -a batches <<<"${BATCHES:-1 4 16}"
secs=${SECONDS_PER_RUN:-8}
clients=${CLIENTS:-4}
function=${FUNCTION:-claim_batch}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
command -v pgbench >/dev/null || { echo "pgbench is needed (Debian: postgresql-client)" >&2; exit 2; }
tmp=$(mktemp -d)

drop() { # PREFIX: its functions and tables
  psql -qAt -c "SELECT 'DROP FUNCTION ' || oid::regprocedure || ';' FROM pg_proc
                WHERE proname LIKE '$1\\_%'" >"$tmp/drop.sql"
  for t in runs jobs liveness meta migrations; do echo "DROP TABLE IF EXISTS $1_$t CASCADE;"; done >>"$tmp/drop.sql"
  psql -q -v ON_ERROR_STOP=1 -f "$tmp/drop.sql" >/dev/null 2>&1 || true
}
cleanup() { drop pgb_old; drop pgb_new; rm -rf "$tmp"; }
trap cleanup EXIT

for p in pgb_old pgb_new; do
  drop "$p"
  for f in migrations/postgres/*.sql; do
    v=$((10#$(basename "$f" | cut -c1-4)))
    if [ "$p" = pgb_new ] || [ "$v" -le "$old" ]; then sed "s/{prefix}/$p/g" "$f"; fi
  done >"$tmp/$p.sql"
  psql -q -v ON_ERROR_STOP=1 -f "$tmp/$p.sql" >/dev/null
done

repeat() { # N V: V, N times, comma-separated
  local out="" i
  for ((i = 0; i < $1; i++)); do out+="${out:+,}$2"; done
  echo "$out"
}

script() { # PREFIX N: one call of PREFIX_FUNCTION with N claims of new slots
  local n=$2 k jobs="" slots="" sets=""
  for ((k = 0; k < n; k++)); do
    sets+="\\set s$k random(1, 9000000000000000)"$'\n'
    jobs+="${jobs:+,}'j'||:client_id||'-$k'"
    slots+="${slots:+,}:s$k"
  done
  printf '%sSELECT count(*) FROM %s_%s(array[%s], array[%s]::bigint[], array[%s]::text[], '"'node'"', 1, array[%s]::bigint[], array[%s]::bigint[], array[%s]::boolean[], array[%s]::bigint[], '"'{}'"'::text[], '"'{}'"'::bigint[], '"'{}'"'::text[], '"'{}'"'::bigint[], true);\n' \
    "$sets" "$1" "$function" "$jobs" "$slots" "$(repeat "$n" "'tok'")" "$(repeat "$n" 60000)" \
    "$(repeat "$n" 9000000000000000000)" "$(repeat "$n" false)" "$(repeat "$n" 3)"
}

pg_ticks() { # CPU ticks of every postgres process, with the reaped children
  local pm t=0 p s
  pm=$(pgrep -o -x postgres)
  for p in $(pgrep -x postgres); do
    s=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + s))
  done
  echo $((t + $(awk '{print $16 + $17}' "/proc/$pm/stat")))
}
hz=$(getconf CLK_TCK)

echo "pgbench-claim: ${function}, migrations 1..$old against all, $clients clients, $secs s per run; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-8s %12s %16s\n' version claims claims/s "pg µs/claim"
for ((r = 1; r <= rounds; r++)); do
  for n in "${batches[@]}"; do
    for p in pgb_old pgb_new; do
      script "$p" "$n" >"$tmp/run.sql"
      a=$(pg_ticks)
      tps=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$tmp/run.sql" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
      b=$(pg_ticks)
      awk -v p="${p#pgb_}" -v n="$n" -v tps="$tps" -v d="$((b - a))" -v hz="$hz" -v s="$secs" \
        'BEGIN { c = tps * n; printf "%-8s %-8s %12.0f %16.1f\n", p, n, c, d / hz * 1e6 / (c * s) }'
    done
  done
done
