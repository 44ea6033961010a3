#!/usr/bin/env bash
# The benchmark matrix of docs/BENCHMARKS.md: `anarchon bench` (release
# build with the `etcd` feature) against every local store at 1, 16 and 64
# clients, one JSON line per run into docs/benchmarks/matrix.jsonl, then
# scripts/plot-bench.py renders docs/benchmarks/claims.png and prints the
# markdown tables.
#
#   scripts/bench-matrix.sh [SECONDS]          # default 5 s per path
#
# Environment:
#   CLIENTS="1 16 64"   client counts
#   BACKENDS="sqlite postgres redis-lease redis-stream-id rabbitmq nats"
#                       (also redis-lease-unix and redis-lease-6391: one
#                       server over its Unix socket and over TCP, from
#                       scripts/services/extra-redis-unix.sh)
#   ETCD_WITH=sqlite    the backends whose runs also measure etcd (--against
#                       etcd; a space-separated list, or "all"): by default
#                       etcd is measured once per client count; with
#                       ETCD_WITH=all every row has etcd from its own run,
#                       so each store's ratio to etcd comes from one run
#   OUT=docs/benchmarks/matrix.jsonl  (another OUT is plotted to OUT's name
#                       with .png, leaving docs/benchmarks/claims.png alone)
#   APPEND=1            keep the lines already in OUT (repeats: the plot and
#                       tables take the median of each cell)
#   BUILD=0             use the binary already built
#   CARGO_TARGET_DIR    where that binary is (default target)
#   BIN=PATH            measure this binary instead (implies BUILD=0), e.g.
#                       the release build of an earlier commit, to put a
#                       before and an after in one run (APPEND=1)
#   VARIANT=NAME        a label for BIN's lines ("variant" in the JSON)
#   TRANSPORT=tcp       how the clients reach the sidecar and etcd: tcp, or
#                       unix (the sidecar's --listen-unix socket, etcd's
#                       unix:// listener); "transport" in the JSON
#
# Each line also has, for the Redis backends, the server's own CPU µs per
# script call over the run (INFO commandstats: evalsha usec_per_call).
#
# Needs the stores on loopback (scripts/services), etcd (Debian:
# etcd-server) and protoc for the build (Debian: protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
read -r -a clients <<<"${CLIENTS:-1 16 64}"
transport=${TRANSPORT:-tcp}
# Passed only when set, so that the builds before --transport still run.
transport_arg=()
[ -n "${TRANSPORT:-}" ] && transport_arg=(--transport "$TRANSPORT")
read -r -a backends <<<"${BACKENDS:-sqlite postgres redis-lease redis-stream-id rabbitmq nats}"
etcd_with=${ETCD_WITH:-sqlite}
out=${OUT:-docs/benchmarks/matrix.jsonl}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/anarchon}
variant=${VARIANT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -n "${BIN:-}" ] && BUILD=0

if [ "${BUILD:-1}" = 1 ]; then
  PROTOC=${PROTOC:-$(command -v protoc || echo /usr/bin/protoc)} \
    cargo build --release --locked --features etcd
fi

. scripts/bench-common.sh
bench_scratch "m$(date +%s)"

mkdir -p "$(dirname "$out")"
[ "${APPEND:-0}" = 1 ] || : >"$out"
# The machine's CPU, recorded in every line: the same build's figures moved
# by up to 40 % from one boot of this VM to the next (docs/BENCHMARKS.md,
# round 18), so compare lines of one CPU and one boot only.
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)
echo "bench-matrix: $seconds s per path, $(nproc) cores ($cpu); uptime: $(uptime)" >&2
for b in "${backends[@]}"; do
  for c in "${clients[@]}"; do
    against=raw
    case " $etcd_with " in *" $b "* | *" all "*) against=etcd ;; esac
    echo "== $variant: $b, $c clients, --against $against over $transport; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    # shellcheck disable=SC2046 # bench_redis_cli gives two words
    case $b in redis-*) redis-cli $(bench_redis_cli "$b") CONFIG RESETSTAT >/dev/null ;; esac
    line=$("$bin" bench --backend "$(bench_url "$b" "$c")" --clients "$c" --seconds "$seconds" \
      --against "$against" "${transport_arg[@]}" --json)
    lua=null
    case $b in redis-*)
      # shellcheck disable=SC2046
      lua=$(redis-cli $(bench_redis_cli "$b") INFO commandstats | tr -d '\r' |
        sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
      lua=${lua:-null} ;;
    esac
    jq -c --arg l "$b" --arg v "$variant" --arg at "$(date -u +%FT%TZ)" --argjson lua "$lua" \
      --arg cpu "$cpu" --arg boot "$boot" \
      '. + {"label": $l, "variant": $v, "at": $at, "redis_lua_us_per_call": $lua, "cpu": $cpu, "boot_id": $boot}' \
      <<<"$line" >>"$out"
  done
done
echo "bench-matrix: done; uptime: $(uptime)" >&2

venv=${HOME}/.cache/anarchon-bench-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r scripts/plot-bench.requirements.txt
fi
# The page's main plot only for the page's main matrix; another OUT gets its
# own plot beside it (OUT=x.jsonl → x.png), so a side run never replaces it.
png=docs/benchmarks/claims.png
[ "$out" = docs/benchmarks/matrix.jsonl ] || png=${out%.jsonl}.png
"$venv/bin/python" scripts/plot-bench.py "$out" "$png"
