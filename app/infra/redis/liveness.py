"""Worker liveness: one hash per Celery node (app/infra/metrics.py writes it, app/observe/cluster.py renders it,
app/maintenance/recovery.py acts on its absence); it expires by itself when the node stops touching it."""
from __future__ import annotations

from app.infra.redis import keys
from app.infra.redis.client import get_redis, read_under


def worker_touch(node: str, fields: dict, ttl_seconds: int) -> None:
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(keys.worker(node), mapping=fields)
    pipe.expire(keys.worker(node), ttl_seconds)
    pipe.execute()


def worker_forget(node: str) -> None:
    get_redis().delete(keys.worker(node))


def workers_read() -> dict[str, dict[str, str]]:
    return read_under(keys.worker(""), "hgetall")


def liveness_settled(ttl_seconds: float) -> bool:
    """Whether a missing node hash means a dead node: only once this Redis has held liveness for a whole TTL
    (after a wipe every hash is missing at once until the next beats; the mark set here is wiped with them)."""
    r = get_redis()
    now = float(r.time()[0])
    r.set(keys.liveness_since(), now, nx=True)
    since = float(r.get(keys.liveness_since()) or now)
    return now - since >= ttl_seconds
