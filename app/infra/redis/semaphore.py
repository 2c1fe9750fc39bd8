"""maxConcurrency: a Redis semaphore per tenant+model of expiring leases."""
from __future__ import annotations

from dataclasses import dataclass

from app.infra.redis import keys
from app.infra.redis.client import get_redis, script

# Per tenant+model concurrency semaphore with expiring leases.
# KEYS[1] semaphore sorted set (member lease id, score expiry in Redis time)
# KEYS[2] runtime max_concurrency override (optional integer string)
# ARGV[1] lease id  ARGV[2] configured max_concurrency (cap)  ARGV[3] lease ttl (s)
# Returns {acquired 0|1, effective limit, holders after}.
# Expiry uses the Redis server's clock, so workers with skewed clocks agree;
# expired leases (a SIGKILLed worker's) are dropped before counting.  The
# limit is the runtime override if present, never above the cap; <= 0 admits
# nobody.
SEM_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local held = redis.call('ZCARD', KEYS[1])
if limit <= 0 then return {0, limit, held} end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if held >= limit then return {0, limit, held} end
  held = held + 1
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 60)
return {1, limit, held}
"""

# Drop the expired leases of one semaphore (a SIGKILLed worker's permits).
# KEYS[1] semaphore sorted set.  Returns how many were dropped.
SEM_REAP = """
local t = redis.call('TIME')
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) + tonumber(t[2]) / 1000000)
"""

# One re-delivery chain per waiting job attempt: a job that found no permit
# re-publishes itself; a second message for the same attempt (recovery's
# re-publish, a duplicate) sees another chain holding the key and stops.
# KEYS[1] permit_wait key  ARGV[1] chain token (the Celery task id)  ARGV[2] ttl (ms)
# Returns 1 if this chain holds (or took over) the key, else 0.
PERMIT_WAIT_HOLD = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class PermitDecision:
    acquired: bool
    limit: int
    holders: int


def semaphore_acquire(model: str, tenant: str, lease_id: str, cap: int, ttl_seconds: float) -> PermitDecision:
    acquired, limit, held = script(SEM_ACQUIRE)(
        keys=[keys.semaphore(model, tenant), keys.runtime_max_concurrency(model)],
        args=[lease_id, int(cap), f"{ttl_seconds:.3f}"],
    )
    return PermitDecision(bool(acquired), int(limit), int(held))


def semaphore_release(model: str, tenant: str, lease_id: str) -> bool:
    """Give a permit back.  Idempotent; an expired lease is simply gone."""
    return bool(get_redis().zrem(keys.semaphore(model, tenant), lease_id))


def semaphore_reap_all() -> int:
    """Expired leases dropped across every semaphore."""
    prefix = keys.semaphore("", "")[:-1]  # "<prefix>:sem:"
    reap = script(SEM_REAP)
    return sum(int(reap(keys=[k])) for k in get_redis().scan_iter(match=prefix + "*", count=500))


def semaphore_holders(model: str, tenant: str) -> list[str]:
    return list(get_redis().zrange(keys.semaphore(model, tenant), 0, -1))


def permit_wait_hold(job_id: str, attempt: int, token: str, ttl_seconds: float) -> bool:
    return bool(script(PERMIT_WAIT_HOLD)(keys=[keys.permit_wait(job_id, attempt)],
                                         args=[token, int(ttl_seconds * 1000)]))
