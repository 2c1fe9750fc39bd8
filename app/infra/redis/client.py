"""The process's Redis clients (fork-safe: app/infra/process.py) and the
registration of Lua scripts, once per client."""
from __future__ import annotations

import redis

from app.config import get_settings
from app.infra.process import PerProcess


def _gate_client() -> redis.Redis:
    return redis.Redis.from_url(get_settings().redis_url, decode_responses=True, health_check_interval=30,
                                socket_connect_timeout=5, socket_timeout=10, retry_on_timeout=True)


def _broker_client() -> redis.Redis | bool:
    s = get_settings()
    url = s.effective_broker_url
    if url == s.redis_url or url.split("://", 1)[0] not in ("redis", "rediss"):
        return False  # no broker Redis of its own
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, socket_timeout=10,
                                retry_on_timeout=True)


# redis-py re-creates pooled connections after fork itself; a fresh client
# per process keeps the registered scripts and the pool obviously ours.
_client: PerProcess[redis.Redis] = PerProcess(_gate_client)
_broker: PerProcess[redis.Redis | bool] = PerProcess(_broker_client)
_scripts: PerProcess[dict] = PerProcess(dict)


def get_redis() -> redis.Redis:
    """The gate's Redis (gates, permits, runtime limits, wake-ups, leadership)."""
    return _client.get()


def broker_redis() -> redis.Redis | None:
    """A client on the broker's own Redis database when the broker is Redis
    and not the same database as the gate (else None): a wipe of either one
    must be noticed (app/infra/redis/epoch.py)."""
    b = _broker.get()
    return b or None


def reset_redis() -> None:
    """New clients on next use (tests change settings between runs)."""
    for item in (_client, _broker, _scripts):
        item.reset()


def script(source: str, client: redis.Redis | None = None):
    """``source`` registered on ``client`` (default: the gate's), once."""
    r = client if client is not None else get_redis()
    cache = _scripts.get()
    s = cache.get((source, id(r)))
    if s is None:
        s = cache[(source, id(r))] = r.register_script(source)
    return s
