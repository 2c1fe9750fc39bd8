"""Runtime limits (autotune's overrides of a model's max_concurrency and
queue_limit): each lives with a TTL and is never above the configured cap
(the gate and the dispatcher take min(override, cap))."""
from __future__ import annotations

from app.infra.redis import keys
from app.infra.redis.client import get_redis, script

# Autotune writes both runtime limits only if nobody changed them since it
# read them (two autotune runs at once must not halve twice).
# KEYS[1] max_concurrency override  KEYS[2] queue_limit override
# ARGV[1] expected max_concurrency ('' = absent)  ARGV[2] expected queue_limit ('' = absent)
# ARGV[3] new max_concurrency  ARGV[4] new queue_limit  ARGV[5] ttl in ms
# Returns 1 if written, 0 if the values had moved.
RUNTIME_LIMITS_CAS = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
return 1
"""


def runtime_limits_raw(model: str) -> tuple[str | None, str | None]:
    """The stored (max_concurrency, queue_limit) overrides as strings."""
    mc, ql = get_redis().mget(keys.runtime_max_concurrency(model), keys.runtime_queue_limit(model))
    return mc, ql


def runtime_limits_cas(model: str, expected: tuple[str | None, str | None], new_max_concurrency: int,
                       new_queue_limit: int, ttl_seconds: float) -> bool:
    return bool(script(RUNTIME_LIMITS_CAS)(
        keys=[keys.runtime_max_concurrency(model), keys.runtime_queue_limit(model)],
        args=[expected[0] or "", expected[1] or "", int(new_max_concurrency), int(new_queue_limit),
              max(1, int(ttl_seconds * 1000))],
    ))
