# Sourced by scripts/bench-matrix.sh and scripts/bench-aged.sh: a scratch
# directory, the backend URLs of the machine's stores under one run tag, and
# the cleanup of everything the run left in them.
#
#   bench_scratch TAG          sets $tag and $tmp; removes both at exit
#   bench_url BACKEND SUFFIX   the --backend URL of BACKEND for one run
#   bench_redis_cli BACKEND    redis-cli's address options for a redis-* BACKEND
#
# redis-lease-unix and redis-lease-6391 are one server
# (scripts/services/extra-redis-unix.sh) over its Unix socket and over TCP.

bench_scratch() {
  tag=$1
  tmp=$(mktemp -d)
  trap bench_cleanup EXIT
}

bench_cleanup() {
  rm -rf "$tmp"
  # The PostgreSQL tables and functions and the Redis keys of this run
  # (prefix bench_$tag).
  if command -v psql >/dev/null; then
    psql -qAt -h 127.0.0.1 -U postgres test -c \
      "SELECT format('DROP TABLE IF EXISTS %I CASCADE;', tablename) FROM pg_tables WHERE tablename LIKE 'bench_${tag}%'
       UNION ALL
       SELECT format('DROP FUNCTION IF EXISTS %I(%s);', proname, pg_get_function_identity_arguments(oid)) FROM pg_proc WHERE proname LIKE 'bench_${tag}%'" \
      2>/dev/null | psql -q -h 127.0.0.1 -U postgres test >/dev/null 2>&1 || true
  fi
  if command -v redis-cli >/dev/null; then
    redis-cli --scan --pattern "bench_${tag}*" | xargs -r -n 1000 redis-cli DEL >/dev/null || true
    if [ -S "$bench_redis_sock" ]; then
      redis-cli -s "$bench_redis_sock" --scan --pattern "bench_${tag}*" |
        xargs -r -n 1000 redis-cli -s "$bench_redis_sock" DEL >/dev/null || true
    fi
  fi
}

bench_redis_sock=/tmp/anarchon-redis-unix/redis.sock

bench_redis_cli() { # backend
  case $1 in
    redis-lease-unix | redis-lease-6391) echo "-s $bench_redis_sock" ;;
    *) echo "-p 6379" ;;
  esac
}

bench_url() { # backend suffix
  case $1 in
    sqlite) echo "sqlite://$tmp/sqlite-$2.db" ;;
    postgres) echo "postgres://postgres@127.0.0.1:5432/test?table=bench_${tag}_$2&max_connections=64" ;;
    redis-lease) echo "redis://127.0.0.1:6379/0?strategy=lease&prefix=bench_${tag}_lease_$2" ;;
    redis-lease-unix) echo "redis+unix://$bench_redis_sock?strategy=lease&prefix=bench_${tag}_lease_$2" ;;
    redis-lease-6391) echo "redis://127.0.0.1:6391/0?strategy=lease&prefix=bench_${tag}_lease_$2" ;;
    redis-stream-id) echo "redis://127.0.0.1:6379/0?strategy=stream-id&prefix=bench_${tag}_sid_$2" ;;
    rabbitmq) echo "amqp://guest:guest@127.0.0.1:5672/%2f?prefix=bench_${tag}_$2&slot_ttl_ms=120000" ;;
    nats) echo "nats://127.0.0.1:4222?prefix=bench_${tag}_$2" ;;
    *) echo "unknown backend $1" >&2; return 1 ;;
  esac
}
