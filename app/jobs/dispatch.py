"""Fair dispatch (docs/architecture.md, "Fair dispatch"): a pending job gets
its run_job message only when its tenant has a free permit and the fair
scheduler (app/infra/redis/dispatch.py) picks it.

Who calls what: admission (through the outbox) ``enqueue_new``; the worker
after its group's claim ``claimed`` (the permits last the lease); every move out of
pending/running ``finished`` (slots and permits back, wake-ups; one step per model for a group); retries,
promotion and recovery ``requeue``; a busy upstream ``returned``; the
periodic pass ``kick_all``.  Each call may dispatch jobs (anyone's): their
messages are published here, in one LPUSH.  A message carries the attempt
the job was queued for, so one that outlived its attempt is refused by the
claim CAS, not run again.

Redis errors are logged, never raised: the row is the truth and the
maintenance passes put back whatever a lost call left out (``requeue`` with
mode NX; gate slots and permits are reconciled).
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import datetime
from typing import Iterable

import redis

from app.clock import as_utc
from app.infra import metrics, publisher
from app.infra.celery_config import KICK_MODEL_TASK
from app.infra.redis import dispatch as rd

log = logging.getLogger(__name__)

# A message for "whatever attempt the row is pending at" (the operator's requeue).
CURRENT = -1
DEFAULT_PRIORITY = 5
# Seconds between two priorities' bands: far beyond any queue time, and a
# score stays exact to ~10 µs (float64) at the lowest band.
PRIORITY_BAND = 1e10


def order_score(at: datetime, priority: int | None = DEFAULT_PRIORITY) -> float:
    """A job's place in its tenant's queue (lower first): its priority's band
    (9 first), then its queue time (a retry at the head keeps its first: seed 002's head/tail)."""
    return (9 - (DEFAULT_PRIORITY if priority is None else priority)) * PRIORITY_BAND + as_utc(at).timestamp()


def head(attempt: int) -> str:
    """The attempt of a retry queued at the head (retryQueueMaxSeconds 0, or
    promoted): its message goes out at high priority too, past the broker's queue."""
    return f"{attempt}h"


def _safely(model: str, what: str, call, *, more: bool = False):
    """Run a dispatch step and publish what it dispatched, (tenant, job_id, attempt) each; ``more``: the
    step answers (its value, the triples).  Redis failing: ``[]`` (``(None, [])``)."""
    try:
        out = call()
    except redis.RedisError as exc:
        log.warning("dispatch (%s) of %s failed: %s; the maintenance pass repairs it", what, model, exc)
        return (None, []) if more else []
    sent = out[1] if more else out
    high = [(job_id, int(a[:-1])) for _t, job_id, a in sent if a.endswith("h")]
    normal = [(job_id, int(a)) for _t, job_id, a in sent if not a.endswith("h")]
    if high:
        publisher.publish_run_jobs(high, publisher.Priority.HIGH)
    if normal:
        publisher.publish_run_jobs(normal)
    for tenant, n in Counter(tenant for tenant, _, _ in sent).items():
        metrics.dispatched(model, tenant, n)
    return out


def enqueue_new(items: Iterable[tuple[str, str, str, float]]) -> int:
    """Queue newly admitted jobs, (model, tenant, job_id, score) each, and
    dispatch what may run now.  Returns how many were dispatched."""
    by_model: dict[str, list[tuple[str, str, float, int | str]]] = {}
    for model, tenant, job_id, score in items:
        by_model.setdefault(model, []).append((tenant, job_id, score, 0))
    return sum(len(_safely(m, "enqueue", lambda m=m, e=e: rd.enqueue(m, e, mode="NX"))) for m, e in by_model.items())


def requeue(model: str, entries: list[tuple[str, str, float, int | str]], *, mode: str = "",
            cap: int | None = None) -> int:
    """Queue (tenant, job_id, score, attempt) entries again: ``mode`` '' to add
    or move, 'NX' only where missing, 'XXLT' only to move a queued job ahead;
    a job holding a permit is never queued twice."""
    if not entries:
        return 0
    return len(_safely(model, "requeue", lambda: rd.enqueue(model, entries, mode=mode, cap=cap)))


def claimed(model: str, jobs: list[tuple[str, str]], lease_seconds: float, cap: int) -> None:
    """A group of (tenant, job_id) claimed: their permits last the lease, in one step."""
    _safely(model, "claim", lambda: rd.claimed(model, jobs, lease_seconds, cap=cap))


def finished(model: str, jobs: list[tuple[str, str, str | None, float | None]], cap: int | None = None) -> None:
    """Jobs that left pending/running, (tenant, job_id, wake-up, ran) each, in one step: slots and permits
    back; a wake-up (None: none; "": the job id; else the row's snapshot) for their waiters; ``ran``: a done
    attempt's seconds."""
    _safely(model, "finish", more=True, call=lambda: rd.finish(model, jobs, cap=cap))


def returned(model: str, tenant: str, job_id: str, score: float, attempt: int, started: float,
             retry_after: float | None, cap: int | None = None) -> None:
    """Busy upstream: pending again, queued at the head (``score``), permit back,
    the model's limit lowered and, with a Retry-After, paused until a kick (or the periodic one)."""
    till, _pairs = _safely(model, "return", more=True, call=lambda: rd.returned(
        model, tenant, job_id, score, head(attempt), started, retry_after, cap=cap))
    if till and till > 0:
        publisher.publish_task(KICK_MODEL_TASK, [model], countdown=max(0.0, till - time.time()))


def kick(model: str, *, cap: int | None = None, requeue_inflight: bool = False) -> int:
    return len(_safely(model, "kick", lambda: rd.kick(model, cap=cap, requeue_inflight=requeue_inflight)))


def kick_all(caps: dict[str, int], *, requeue_inflight: bool = False) -> int:
    """Every model with dispatch state (and every configured one): blocked
    tenants tried again, lost messages re-queued."""
    names = sorted(set(caps) | rd.models())
    try:
        # Each model's steps read their own copy of the weights (one hash slot,
        # Redis Cluster): a model that appeared since the last change gets them here.
        rd.copy_weights(names)
    except redis.RedisError as exc:
        log.warning("dispatch weights not copied: %s; the next pass tries again", exc)
    return sum(kick(model, cap=caps.get(model), requeue_inflight=requeue_inflight) for model in names)
