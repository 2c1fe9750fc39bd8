"""Pub/sub: cache invalidations (their listener is app/infra/wakeups.py), stop notices (a running
attempt someone else ended: its worker closes the call; app/jobs/calls.py listens) and express notices (a job
queued for a tenant with nothing running on its model: the workers' express slots pull it; app/jobs/express.py).  Terminal wake-ups,
after the winning commit only, are published by dispatch.finish's script."""
from __future__ import annotations

from contextlib import suppress

import redis

from app.infra.redis import keys
from app.infra.redis.client import get_redis


def publish_invalidate(what: str) -> None:
    """Tell every API process to drop its cached keys/models now (else: within their TTL).  Best effort."""
    with suppress(redis.RedisError):
        get_redis().publish(keys.invalidate_channel(), what)


def publish_express(model: str) -> None:
    """Tell the workers' express slots that ``model`` has a job of a tenant holding no permit.  Best effort: the
    job is pulled by the next free slot anyway."""
    with suppress(redis.RedisError):
        get_redis().publish(keys.express_channel(), model)


def publish_stop(job_id: str, attempt: int) -> None:
    """Tell the worker running ``job_id``'s attempt ``attempt`` to stop its call now.  Best effort: workers
    also check their calls' rows every half second."""
    with suppress(redis.RedisError):
        get_redis().publish(keys.stop_channel(), f"{job_id} {attempt}")
