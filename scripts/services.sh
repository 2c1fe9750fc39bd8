#!/usr/bin/env bash
# Start the local services the system and its tests talk to, if they are not
# already up: PostgreSQL, Redis and (with --rabbitmq) RabbitMQ.  Installs them
# from Debian's packages when they are missing entirely.  --cluster installs
# what the multi-host tests start themselves (tests/cluster/harness.py):
# pgbouncer, redis-server, iproute2 (they run their own servers, never these).
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

if ! port_open 5432; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  wait_port 5432
fi

if ! port_open 6379; then
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port 6379
fi

if [ "$want_rabbit" = 1 ] && ! port_open 5672; then
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  rabbitmq-server -detached
  wait_port 5672
fi

if [ "$want_cluster" = 1 ]; then
  missing=()
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
fi
