"""The process's Redis clients (fork-safe: app/infra/process.py).

``ASYNCH_REDIS_URL`` is one Redis (``redis://``, ``rediss://``, ``unix://``) or a Redis Cluster
(``redis+cluster://host:port[,host:port...]``, ``rediss+cluster://`` with TLS): then the gate's client is
redis-py's ``RedisCluster``, which routes each command and script by its keys' hash slot (keys.py gives every
model's keys one slot).  The Celery broker is never a cluster (kombu cannot use one): app/config.py refuses a
cluster URL without an ASYNCH_BROKER_URL of its own."""
from __future__ import annotations

import itertools
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from app.config import get_settings, is_cluster_url
from app.infra.process import PerProcess


def _common() -> dict:
    t = get_settings().redis_timeout_seconds
    return {"decode_responses": True, "socket_connect_timeout": min(5.0, t), "socket_timeout": t}


def cluster_nodes(url: str) -> tuple[list[ClusterNode], dict]:
    """Startup nodes and connection options of a ``redis+cluster://`` URL."""
    parts = urlsplit(url)
    auth, _, hosts = parts.netloc.rpartition("@")
    user, _, password = auth.partition(":")
    pairs = [hp.strip().rpartition(":") if ":" in hp else (hp.strip(), "", "") for hp in hosts.split(",")]
    creds = {"username": unquote(user), "password": unquote(password)}
    return ([ClusterNode(host.strip("[]"), int(port or 6379)) for host, _, port in pairs],
            {"ssl": parts.scheme.startswith("rediss"), **{k: v for k, v in creds.items() if v}})


def _gate_client() -> redis.Redis | RedisCluster:
    url = get_settings().redis_url
    if is_cluster_url(url):
        nodes, opts = cluster_nodes(url)
        # retry_on_timeout is not a cluster option: RedisCluster retries a
        # command on another node itself after a connection error.
        return RedisCluster(startup_nodes=nodes, health_check_interval=30, **opts, **_common())
    return redis.Redis.from_url(url, health_check_interval=30, retry_on_timeout=True, **_common())


def _broker_client() -> redis.Redis | bool:
    s = get_settings()
    url = s.effective_broker_url
    if url == s.redis_url or url.split("://", 1)[0] not in ("redis", "rediss"):
        return False  # no broker Redis of its own
    return redis.Redis.from_url(url, retry_on_timeout=True, **_common())


# redis-py re-creates pooled connections after fork itself; a fresh client per process keeps the registered scripts
# (they live on the client) and the pool obviously ours.
_client: PerProcess[redis.Redis] = PerProcess(_gate_client)
_broker: PerProcess[redis.Redis | bool] = PerProcess(_broker_client)
_next_node = itertools.count()


def get_redis() -> redis.Redis:
    """The gate's Redis (gates, permits, runtime limits, wake-ups, leadership)."""
    return _client.get()


def is_cluster(client: redis.Redis | None = None) -> bool:
    return isinstance(client if client is not None else get_redis(), RedisCluster)


def pubsub_client(client_name: str) -> redis.Redis:
    """A dedicated connection for a pub/sub listener.  Under Redis Cluster a PUBLISH reaches every node's
    subscribers, so it takes one node, the next on each reconnect (a dead node is left behind)."""
    url = get_settings().redis_url
    opts = {**_common(), "socket_timeout": None, "health_check_interval": 15, "client_name": client_name}
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **opts)
    cluster = get_redis()
    nodes = cluster.get_primaries() or cluster.get_nodes()
    node = nodes[next(_next_node) % len(nodes)]
    _, auth = cluster_nodes(url)
    return redis.Redis(host=node.host, port=node.port, **auth, **opts)


def read_under(prefix: str, command: str) -> dict:
    """suffix -> the answer of ``command`` (a read: zcard, hgetall) for each key under ``prefix``, if not empty."""
    found = list(get_redis().scan_iter(match=prefix + "*", count=500))
    pipe = get_redis().pipeline(transaction=False)
    for k in found:
        getattr(pipe, command)(k)
    return {k[len(prefix):]: v for k, v in zip(found, pipe.execute()) if v}


def broker_redis() -> redis.Redis | None:
    """A client on the broker's own Redis database, if it has one (else None):
    a wipe of either must be noticed (epoch.py)."""
    return _broker.get() or None


def reset_redis() -> None:
    """New clients on next use (tests change settings between runs)."""
    for item in (_client, _broker):
        item.reset()

