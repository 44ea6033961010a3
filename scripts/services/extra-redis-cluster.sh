#!/usr/bin/env bash
# A local 3-master Redis Cluster on loopback (ports 7000-7002) for the
# redis+cluster:// suites. Idempotent: leaves a healthy cluster alone, starts
# the nodes that are down, creates the cluster once, and waits until
# `cluster_state:ok`. Run by scripts/test.sh (it runs every extra-*.sh).
set -euo pipefail

dir=/tmp/anarchon-redis-cluster
ports=(7000 7001 7002)

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "extra-redis-cluster: redis-server/redis-cli are not installed" >&2
  exit 1
fi

state() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p'; }
known() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }

healthy=1
for p in "${ports[@]}"; do
  [ "$(state "$p")" = ok ] && [ "$(known "$p")" = "${#ports[@]}" ] || healthy=0
done
if [ "$healthy" = 1 ]; then
  echo "extra-redis-cluster: cluster is up on ${ports[*]}"
  exit 0
fi

mkdir -p "$dir"
for p in "${ports[@]}"; do
  if ! redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1; then
    echo "extra-redis-cluster: starting node $p"
    redis-server --cluster-enabled yes --port "$p" --bind 127.0.0.1 --daemonize yes \
      --save "" --appendonly no \
      --cluster-config-file "$dir/nodes-$p.conf" --dir "$dir" \
      --logfile "$dir/redis-$p.log"
  fi
done
for p in "${ports[@]}"; do
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1 || { echo "extra-redis-cluster: node $p did not start" >&2; exit 1; }
done

# Create the cluster only when the nodes do not know each other yet (fresh
# nodes). Nodes restarted from their nodes-N.conf rejoin by themselves.
if [ "$(known "${ports[0]}")" != "${#ports[@]}" ]; then
  echo "extra-redis-cluster: creating the cluster"
  redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 \
    --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2
    exit 1
  }
fi

for _ in $(seq 1 300); do
  ok=1
  for p in "${ports[@]}"; do [ "$(state "$p")" = ok ] || ok=0; done
  if [ "$ok" = 1 ]; then
    echo "extra-redis-cluster: cluster_state:ok on ${ports[*]}"
    exit 0
  fi
  sleep 0.1
done
echo "extra-redis-cluster: the cluster did not reach cluster_state:ok (see $dir)" >&2
exit 1
