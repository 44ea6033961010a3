#!/usr/bin/env bash
# A Redis that also listens on a Unix socket, for the redis+unix:// suites and
# the bench's `redis-lease-unix` backend: /tmp/anarchon-redis-unix/redis.sock,
# and the same server on 127.0.0.1:6391 (so a bench can compare the two
# transports on one server). The shared Redis on 6379 has no socket, and
# `unixsocket` cannot be set on a running server. Idempotent: leaves a server
# that answers on the socket alone. Run by scripts/test.sh (every extra-*.sh).
set -euo pipefail

dir=/tmp/anarchon-redis-unix
sock=$dir/redis.sock
port=6391

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "extra-redis-unix: redis-server/redis-cli are not installed" >&2
  exit 1
fi

if [ "$(redis-cli -s "$sock" ping 2>/dev/null)" = PONG ]; then
  echo "extra-redis-unix: up on $sock and $port"
  exit 0
fi

mkdir -p "$dir"
chmod 700 "$dir"
echo "extra-redis-unix: starting on $sock and $port"
redis-server --port "$port" --bind 127.0.0.1 --unixsocket "$sock" --unixsocketperm 700 \
  --daemonize yes --save "" --appendonly no --dir "$dir" --logfile "$dir/redis.log"
for _ in $(seq 1 100); do
  [ "$(redis-cli -s "$sock" ping 2>/dev/null)" = PONG ] && {
    echo "extra-redis-unix: up on $sock and $port"
    exit 0
  }
  sleep 0.1
done
echo "extra-redis-unix: the server did not answer on $sock (see $dir/redis.log)" >&2
exit 1
