"""Runtime limits (autotune's overrides of a model's max_concurrency and queue_limit): each lives with a TTL and
is never above the configured cap (the gate and the dispatcher take min(override, cap)).  Autotune writes both
in one compare-and-set step (runtime_limits_cas.lua)."""
from __future__ import annotations

from app.infra.redis import keys, scripts
from app.infra.redis.client import get_redis


def runtime_limits_raw(model: str) -> tuple[str | None, str | None]:
    """The stored (max_concurrency, queue_limit) overrides as strings."""
    return tuple(get_redis().mget(keys.runtime_max_concurrency(model), keys.runtime_queue_limit(model)))


def runtime_limits_cas(model: str, expected: tuple[str | None, str | None], new_max_concurrency: int,
                       new_queue_limit: int, ttl_seconds: float) -> bool:
    return bool(scripts.get("runtime_limits_cas")(
        keys=[keys.runtime_max_concurrency(model), keys.runtime_queue_limit(model)],
        args=[expected[0] or "", expected[1] or "", int(new_max_concurrency), int(new_queue_limit),
              max(1, int(ttl_seconds * 1000))],
    ))
