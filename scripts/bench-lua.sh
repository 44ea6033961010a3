#!/usr/bin/env bash
# The Redis `lease` script's own cost, without the sidecar: every claim a new
# slot (so every call wins and writes), measured three ways for each script
# given, alternated ROUNDS times, so that a before and an after share a run:
#
#   scripts/bench-lua.sh [SCRIPT.lua ...]    # default src/store/redis/lease.lua
#   git show HEAD~1:src/store/redis/lease.lua >/tmp/before.lua
#   scripts/bench-lua.sh /tmp/before.lua src/store/redis/lease.lua
#
# 1. `redis-benchmark` (CONNS connections, N calls) of one EVALSHA claim, then
#    `INFO commandstats`: µs per EVALSHA and per command the script called.
#    redis-server is pinned to CPU 0 and redis-benchmark to CPU 1 for the
#    run (the affinity is put back after), which takes most of the noise
#    of the two sharing a core.
# 2. The script's Lua alone: the same claim run PURE_N times inside one
#    EVAL with `redis.call` replaced by a stub that answers at once, timed
#    with Redis's TIME: the µs of interpreter work per claim (conversions,
#    tables, closures, string building) that no command accounts for.
# 3. Redis's whole CPU per claim (INFO cpu, user + system, over the
#    redis-benchmark run): the script, the command parsing and the replies.
#
# BATCH=K (default 1) wraps each script so that one EVALSHA runs K claims,
# each on its own fresh slot, one after another (the script's text becomes
# the body of a function called K times with that claim's arguments): what
# a store that sent several claims per call would save. N is then the
# number of calls (N x K claims), and the Lua-alone figure is left out.
#
# CONNS=C and PIPELINE=P (default 16 and 1): redis-benchmark's connections
# and the calls each keeps in flight; CONNS=1 PIPELINE=16 is how the
# sidecar's one multiplexed connection sends 16 clients' claims.
#
# Environment: REDIS_PORT (6379), N (60000), ROUNDS (3), PURE_N (20000),
# BATCH (1), CONNS (16), PIPELINE (1).
# Keys are written under `anarchon-bench-lua:` and deleted before each run;
# nothing else in the server is touched. INFO commandstats is reset.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${REDIS_PORT:-6379}
n=${N:-60000}
rounds=${ROUNDS:-3}
pure_n=${PURE_N:-20000}
batch=${BATCH:-1}
conns=${CONNS:-16}
pipeline=${PIPELINE:-1}
for v in BATCH:"$batch" CONNS:"$conns" PIPELINE:"$pipeline"; do
  [[ ${v#*:} =~ ^[1-9][0-9]*$ ]] || { echo "bench-lua: ${v%%:*}=${v#*:} is not a whole number >= 1" >&2; exit 2; }
done
scripts=("$@")
[ ${#scripts[@]} -gt 0 ] || scripts=(src/store/redis/lease.lua)
cli() { redis-cli -p "$port" "$@"; }

P=anarchon-bench-lua
J="$P:{job}"
keys=("$J:runs" "$J:slots" "$J:running" "$J:fence" "$J:history"
  "$P:jobs" "$P:holder:n1:1" "$P:memory" "$P:liveness")
# claim: slot token node instance lease_ms max_late_ms skip max_attempts
# maxlen holder-member holder-ttl job expected-memory quarantine time-fence,
# then no dead holders (0 0 0). max_late is huge so that any random slot is
# still claimable.
claim_args() { # $1: the slot; sets args
  args=(claim "$1" abcdef0123456789 n1 1 30000 999999999999999 0 3 1000
    "job:$1" 60000 job "" 1000 0 0 0 0)
}

pure_script() { # $1: the script; prints it wrapped with a stubbed redis.call
  cat <<'HEAD'
local real = redis
local t0 = real.call('TIME')
local n = tonumber(ARGV[#ARGV])
local stub = {
  call = function(cmd)
    if cmd == 'TIME' then return { '1733300000', '123456' } end
    if cmd == 'GET' then return 'abc 0 0' end
    if cmd == 'HGET' then return false end
    if cmd == 'EXISTS' then return 1 end
    if cmd == 'INCR' then return 7 end
    return 1
  end,
  error_reply = real.error_reply,
}
local body = function(redis)
HEAD
  cat "$1"
  cat <<'TAIL'
end
for _ = 1, n do body(stub) end
local t1 = real.call('TIME')
return tostring(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) / n)
TAIL
}

batch_script() { # $1: the script; prints it wrapped to run several claims per call
  echo 'local function one(KEYS, ARGV)'
  cat "$1"
  cat <<'TAIL'
end
-- ARGV: the number of claims, the number of arguments of each, then each
-- claim's arguments in turn. Reply: each claim's reply.
local n, per = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 0, n - 1 do
  out[i + 1] = one(KEYS, { unpack(ARGV, 3 + i * per, 2 + (i + 1) * per) })
end
return out
TAIL
}

load_script() { # $1: the script; prints its sha as called in this run
  if [ "$batch" = 1 ]; then
    cli -x SCRIPT LOAD <"$1"
  else
    batch_script "$1" | cli -x SCRIPT LOAD
  fi
}

call_args() { # $1: the first claim's slot, or __rand_int__; sets call, one call's arguments
  if [ "$batch" = 1 ]; then
    claim_args "$1"
    call=("${args[@]}")
    return
  fi
  # Each claim of the call on its own slot: the next one, or a random one.
  call=("$batch" 0)
  for i in $(seq 0 $((batch - 1))); do
    if [ "$1" = __rand_int__ ]; then claim_args "$1"; else claim_args $(($1 + i)); fi
    call+=("${args[@]}")
  done
  call[1]=${#args[@]}
}

redis_cpu() { # Redis's CPU seconds so far, user + system
  cli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}

pid=$(cli INFO server | sed -n 's/^process_id:\([0-9]*\).*/\1/p' | tr -d '\r')
old_affinity=$(taskset -p "$pid" | sed 's/.*: //')
trap 'taskset -p "$old_affinity" "$pid" >/dev/null 2>&1 || true' EXIT

echo "bench-lua: $n calls of $batch claim(s) over $conns connection(s), $pipeline in flight each, x ${#scripts[@]} script(s) x $rounds round(s); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
claims=$((n * batch))
for round in $(seq "$rounds"); do
  for s in "${scripts[@]}"; do
    sha=$(load_script "$s")
    cli --scan --pattern "$P:*" | xargs -r redis-cli -p "$port" DEL >/dev/null
    # Every claim of one call on a fresh slot of its own must win.
    call_args 42
    answers=$(cli EVALSHA "$sha" ${#keys[@]} "${keys[@]}" "${call[@]}")
    won=$(grep -c '^1 ' <<<"$answers" || true)
    [ "$won" = "$batch" ] || { echo "bench-lua: $s won $won of $batch fresh slots (answered: $answers)" >&2; exit 1; }
    cli CONFIG RESETSTAT >/dev/null
    cpu0=$(redis_cpu)
    taskset -p 0x1 "$pid" >/dev/null
    call_args __rand_int__
    rps=$(taskset -c 1 redis-benchmark -p "$port" -q -n "$n" -c "$conns" -P "$pipeline" -r 100000000000 \
      EVALSHA "$sha" ${#keys[@]} "${keys[@]}" "${call[@]}" |
      tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
    taskset -p "$old_affinity" "$pid" >/dev/null
    cpu=$(awk -v a="$cpu0" -v b="$(redis_cpu)" -v c="$claims" 'BEGIN { printf "%.1f", (b - a) * 1e6 / c }')
    stats=$(cli INFO commandstats | tr -d '\r')
    inner=$(sed -n 's/^cmdstat_\([a-z]*\):calls=\([0-9]*\),usec=[0-9]*,usec_per_call=\([0-9.]*\).*/\1 \2 \3/p' <<<"$stats" |
      awk -v n="$claims" '$1 != "evalsha" && $1 != "config" && $1 != "script" && $1 != "info" && $2 >= n / 2 {
          printf "%s %.2f, ", $1, $3 * $2 / n; sum += $3 * $2 / n }
        END { printf "sum %.2f", sum }')
    per_call=$(sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p' <<<"$stats")
    per_claim=$(awk -v c="$per_call" -v k="$batch" 'BEGIN { printf "%.2f", c / k }')
    if [ "$batch" = 1 ]; then
      claim_args 1733300000000
      pure=$(cli EVAL "$(pure_script "$s")" ${#keys[@]} "${keys[@]}" "${args[@]}" "$pure_n")
      pure=$(printf '%.2f µs' "$pure")
    else
      pure=-
    fi
    printf 'round %s  %-40s %9s calls/s  EVALSHA %6s µs/claim  Redis CPU %5s µs/claim  Lua alone %s  commands (µs per claim): %s\n' \
      "$round" "$s" "$rps" "$per_claim" "$cpu" "$pure" "$inner"
  done
done
cli --scan --pattern "$P:*" | xargs -r redis-cli -p "$port" DEL >/dev/null
