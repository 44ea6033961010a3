#!/usr/bin/env bash
# Redis high-availability setups on loopback for tests/redis_ha.rs:
#   * a Redis Cluster of 3 masters + 3 replicas on 7100-7105
#     (cluster-node-timeout 1000 ms, so a failover takes ~2 s);
#   * a Sentinel group "anarchon-ha": 1 master on 7110, replicas on 7111 and
#     7112, three Sentinels on 26390-26392 (down-after 1000 ms).
# Every node keeps an append-only file (appendfsync always), so a restarted
# node comes back with its data. Idempotent: leaves healthy setups alone,
# starts what is down (a node that was killed rejoins as whatever its config
# says), creates the cluster only on fresh nodes. Run by scripts/test.sh (it
# runs every extra-*.sh). The tests kill, pause and restart these nodes, and
# put them back before they end.
set -euo pipefail

dir=/tmp/anarchon-redis-ha
cports=(7100 7101 7102 7103 7104 7105)
sports=(7110 7111 7112)
sentinels=(26390 26391 26392)
master_name=anarchon-ha

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "extra-redis-ha: redis-server/redis-cli are not installed" >&2
  exit 1
fi
mkdir -p "$dir"

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null | tr -d '\r'; }
up() { [ "$(cli "$1" ping)" = PONG ]; }
wait_up() {
  for _ in $(seq 1 100); do up "$1" && return 0; sleep 0.1; done
  echo "extra-redis-ha: node $1 did not start (see $dir)" >&2; exit 1
}
# A stopped (SIGSTOP) node left behind by an interrupted test: wake it.
cont_all() { pgrep -f "redis-server 127.0.0.1:$1" | xargs -r kill -CONT 2>/dev/null || true; }

# --- cluster ---------------------------------------------------------------
for p in "${cports[@]}"; do
  cont_all "$p"
  if ! up "$p"; then
    echo "extra-redis-ha: starting cluster node $p"
    mkdir -p "$dir/c$p"
    redis-server --cluster-enabled yes --port "$p" --bind 127.0.0.1 --daemonize yes \
      --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 \
      --save "" --appendonly yes --appendfsync always \
      --cluster-config-file "$dir/c$p/nodes.conf" --dir "$dir/c$p" \
      --logfile "$dir/c$p/redis.log"
  fi
done
for p in "${cports[@]}"; do wait_up "$p"; done
known=$(cli 7100 cluster info | sed -n 's/^cluster_known_nodes://p')
if [ "$known" != 6 ]; then
  echo "extra-redis-ha: creating the cluster"
  redis-cli --cluster create 127.0.0.1:7100 127.0.0.1:7101 127.0.0.1:7102 \
    127.0.0.1:7103 127.0.0.1:7104 127.0.0.1:7105 \
    --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2
    exit 1
  }
fi

# --- sentinel --------------------------------------------------------------
# The current master, as the Sentinels see it (after failovers it moves).
current_master() {
  for s in "${sentinels[@]}"; do
    local a
    a=$(cli "$s" sentinel get-master-addr-by-name "$master_name" | sed -n 2p)
    [ -n "$a" ] && { echo "$a"; return; }
  done
  echo "${sports[0]}"
}
fresh=1
for s in "${sentinels[@]}"; do [ -f "$dir/s$s/sentinel.conf" ] && fresh=0; done
for p in "${sports[@]}"; do
  cont_all "$p"
  if ! up "$p"; then
    echo "extra-redis-ha: starting sentinel-group node $p"
    mkdir -p "$dir/r$p"
    args=()
    if [ "$p" != "${sports[0]}" ] || [ "$fresh" = 0 ]; then
      m=${sports[0]}
      [ "$fresh" = 0 ] && m=$(current_master)
      [ "$m" != "$p" ] && args=(--replicaof 127.0.0.1 "$m")
    fi
    redis-server --port "$p" --bind 127.0.0.1 --daemonize yes \
      --save "" --appendonly yes --appendfsync always \
      --dir "$dir/r$p" --logfile "$dir/r$p/redis.log" "${args[@]}"
  fi
done
for p in "${sports[@]}"; do wait_up "$p"; done
for s in "${sentinels[@]}"; do
  if ! up "$s"; then
    echo "extra-redis-ha: starting sentinel $s"
    mkdir -p "$dir/s$s"
    if [ ! -f "$dir/s$s/sentinel.conf" ]; then
      cat >"$dir/s$s/sentinel.conf" <<CONF
port $s
bind 127.0.0.1
daemonize yes
dir $dir/s$s
logfile $dir/s$s/sentinel.log
sentinel monitor $master_name 127.0.0.1 ${sports[0]} 2
sentinel down-after-milliseconds $master_name 1000
sentinel failover-timeout $master_name 4000
sentinel parallel-syncs $master_name 2
CONF
    fi
    redis-server "$dir/s$s/sentinel.conf" --sentinel
  fi
done
for s in "${sentinels[@]}"; do wait_up "$s"; done

# --- wait until both are healthy --------------------------------------------
for _ in $(seq 1 300); do
  ok=1
  for p in "${cports[@]}"; do
    [ "$(cli "$p" cluster info | sed -n 's/^cluster_state://p')" = ok ] || ok=0
  done
  # every cluster master has its replica
  [ "$(cli 7100 cluster nodes | awk '$3 ~ /slave/ && $3 !~ /fail/' | wc -l)" = 3 ] || ok=0
  # the Sentinel master: every Sentinel names it, none has a failover under
  # way, and both replicas are online (a replica still waiting for its first
  # sync is counted in connected_slaves, but promoted it would come up
  # without the data the tests' claims rely on)
  m=$(current_master)
  for s in "${sentinels[@]}"; do
    [ "$(cli "$s" sentinel get-master-addr-by-name "$master_name" | sed -n 2p)" = "$m" ] || ok=0
    [ "$(cli "$s" sentinel master "$master_name" | sed -n '/^flags$/{n;p}')" = master ] || ok=0
  done
  [ "$(cli "$m" info replication | grep -c '^slave[0-9]*:.*state=online')" = 2 ] || ok=0
  if [ "$ok" = 1 ]; then
    echo "extra-redis-ha: cluster ok on ${cports[*]}; sentinel master $m, sentinels ${sentinels[*]}"
    exit 0
  fi
  sleep 0.1
done
echo "extra-redis-ha: the setups did not become healthy (see $dir)" >&2
exit 1
