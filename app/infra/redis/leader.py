"""Beat leadership: one lock, a fencing token per leadership, and a capped
history of the periodic runs that went ahead (app/maintenance/periodic.py)."""
from __future__ import annotations

from app.infra.redis import keys, scripts
from app.infra.redis.client import get_redis


def leader_acquire(owner: str, ttl_seconds: float) -> int:
    """Fencing token (> 0) while ``owner`` holds the beat lock, else 0."""
    return int(scripts.get("leader_acquire")(keys=[keys.beat_lock(), keys.beat_token()],
                                              args=[owner, max(1, int(ttl_seconds * 1000))]))


def leader_release(owner: str) -> bool:
    return bool(scripts.get("leader_release")(keys=[keys.beat_lock()], args=[owner]))


def leader_current() -> tuple[int, str] | None:
    """(token, owner) of the current beat leader, if any."""
    token, sep, owner = (get_redis().get(keys.beat_lock()) or "").partition(" ")
    return (int(token), owner) if sep else None


def leader_ttl_ms() -> int | None:
    """Milliseconds left on the beat lock (None: no lock)."""
    ms = int(get_redis().pttl(keys.beat_lock()))
    return ms if ms >= 0 else None


def record_beat_run(entry: str, keep: int) -> None:
    if keep <= 0:
        return
    pipe = get_redis().pipeline(transaction=True)
    pipe.rpush(keys.beat_history(), entry)
    pipe.ltrim(keys.beat_history(), -keep, -1)
    pipe.execute()


def beat_history(limit: int = 100) -> list[str]:
    return get_redis().lrange(keys.beat_history(), -max(1, limit), -1)
