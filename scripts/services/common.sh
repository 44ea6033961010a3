# Sourced by scripts/test.sh: start the machine's stores when they are down,
# with the exact commands of this machine's setup.
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
  local i
  for i in $(seq 1 $(( $3 * 10 ))); do port_up "$2" && return 0; sleep 0.1; done
  echo "test.sh: $1 did not come up on port $2" >&2; return 1
}

ensure_service() { # name port start-command...
  local name=$1 port=$2; shift 2
  if port_up "$port"; then echo "test.sh: $name is up on $port"; return 0; fi
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "test.sh: $name is down and $1 is not installed" >&2; return 1
  fi
  echo "test.sh: starting $name"
  "$@" || true
  wait_port "$name" "$port" 60
}

ensure_stores() {
  ensure_service PostgreSQL 5432 sh -c 'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start'
  ensure_service Redis 6379 redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  ensure_service RabbitMQ 5672 rabbitmq-server -detached
  ensure_service NATS 4222 start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
}
