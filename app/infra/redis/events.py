"""Pub/sub: cache invalidations (terminal wake-ups, after the winning commit
only, are published by dispatch.finish's script).  The listener is app/infra/wakeups.py."""
from __future__ import annotations

from contextlib import suppress

import redis

from app.infra.redis import keys
from app.infra.redis.client import get_redis


def publish_invalidate(what: str) -> None:
    """Tell every API process to drop its cached keys/models now (else: within their TTL).  Best effort."""
    with suppress(redis.RedisError):
        get_redis().publish(keys.invalidate_channel(), what)
