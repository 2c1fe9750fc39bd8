"""Token buckets in Redis, for request rate limits (app/web/ratelimit.py).

Invariants:
- A take is ONE Lua script (ratelimit_token_bucket.lua: refill, take, write back), so any number of takers
  admit at most ``burst + rate * t`` over any span ``t``.
- Time is the Redis server's (``TIME``): skewed API hosts share a bucket; a clock stepping back refills
  nothing and never freezes a bucket.
- A bucket is one hash (``tk`` tokens, ``ts`` last take) that expires once it would be full again: an absent
  bucket IS a full one.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.infra.redis import keys, scripts
from app.infra.redis.client import get_redis

bucket_key = keys.ratelimit


@dataclass(frozen=True)
class Take:
    allowed: bool
    remaining: float     # tokens left after this take (fractional)
    retry_after: float   # seconds until another take of the same cost would pass (0: now)
    full_after: float    # seconds until the bucket is full again


def take(bucket_id: str, rate: float, burst: int, cost: int = 1) -> Take:
    """Take ``cost`` tokens (one round trip); ``redis.RedisError`` without Redis: the caller decides."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    if burst < 1:
        raise ValueError(f"burst must be >= 1, got {burst!r}")
    if not 0 <= cost <= burst:
        raise ValueError(f"cost must be within 0..burst ({burst}), got {cost!r}")
    allowed, tokens, wait, full = scripts.get("ratelimit_token_bucket")(
        keys=[bucket_key(bucket_id)], args=[repr(float(rate)), int(burst), int(cost)])
    return Take(bool(allowed), float(tokens), float(wait), float(full))


def peek(bucket_id: str, rate: float, burst: int) -> float:
    """Tokens the bucket holds now at the Redis server's time (a read only; a missing bucket is full)."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.time()
    pipe.hmget(bucket_key(bucket_id), "tk", "ts")
    (sec, usec), (tk, ts) = pipe.execute()
    if tk is None or ts is None:
        return float(burst)
    elapsed = max(0.0, sec + usec / 1e6 - float(ts))
    return min(float(burst), float(tk) + elapsed * rate)
