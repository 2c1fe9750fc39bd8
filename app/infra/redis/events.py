"""Pub/sub: cache invalidations (their listener is app/infra/wakeups.py), stop notices (a running
attempt someone else ended: its worker closes the call; app/jobs/calls.py listens) and express notices (a job
queued for a tenant with nothing running on its model: the workers' express slots pull it; app/jobs/express.py).  Terminal wake-ups,
after the winning commit only, are published by dispatch.finish's script.  ``listen`` is the one subscriber loop
a worker process's listeners run (stop notices, express notices)."""
from __future__ import annotations

import logging
import time
from contextlib import suppress
from typing import Callable

import redis

from app.infra.redis import keys
from app.infra.redis.client import get_redis, pubsub_client

log = logging.getLogger(__name__)


def listen(client_name: str, channel: str, on_notice: Callable[[str], object], what: str, wait: float,
           tick: Callable[[], object] | None = None) -> None:
    """Forever, on the calling thread: each message of ``channel`` to ``on_notice`` (its data as text), and
    ``tick()`` after every wait of at most ``wait`` seconds, also while Redis is away (it is subscribed to again
    then; an outage is logged once, as ``what``).  A notice that fails is logged; the loop goes on."""
    ps, away = None, False
    while True:
        m = None
        try:
            if ps is None:
                ps = pubsub_client(client_name).pubsub(ignore_subscribe_messages=True)
                ps.subscribe(channel)
            m = ps.get_message(timeout=wait)
            if away:
                away = False
                log.info("%s back", what)
        except Exception as exc:  # Redis away: whatever the notices speed up happens without them meanwhile
            if not away:  # once per outage, not every wait
                away = True
                log.warning("%s unavailable: %s", what, exc)
            ps = None
            time.sleep(wait)
        if m and m.get("type") == "message":
            try:
                on_notice(str(m["data"]))
            except Exception:
                log.exception("%s: one not handled", what)
        if tick is not None:
            tick()


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
