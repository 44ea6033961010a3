#!/usr/bin/env bash
# A Redis that also listens on a Unix socket, for the redis+unix:// suites and
# the bench's `redis-lease-unix` backend: /tmp/anarchon-redis-unix/redis.sock,
# and the same server on 127.0.0.1:6391 (so a bench can compare the two
# transports on one server, and so common.sh's port check finds it). The
# shared Redis on 6379 has no socket, and `unixsocket` cannot be set on a
# running server. Idempotent. Run by scripts/test.sh (every extra-*.sh).
set -euo pipefail
. "$(dirname "$0")/common.sh"

dir=/tmp/anarchon-redis-unix
mkdir -p "$dir"
chmod 700 "$dir"
ensure_service "Redis on a Unix socket" 6391 \
  redis-server --port 6391 --bind 127.0.0.1 --unixsocket "$dir/redis.sock" --unixsocketperm 700 \
  --daemonize yes --save "" --appendonly no --dir "$dir" --logfile "$dir/redis.log"
