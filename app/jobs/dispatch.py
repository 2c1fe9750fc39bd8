"""Fair dispatch (docs/architecture.md, "Fair dispatch"): a pending job gets
its run_job message only when its tenant has a free permit and the fair
scheduler (app/infra/redis/dispatch.py) picks it.

Who calls what: every move into pending and every repair queues jobs through
ONE entry builder (``entry``, from the row) and ``queue`` / ``queue_entries``:
admission (through the outbox), a retry re-admitted and a busy answer's return
(both from the transition's effects, app/jobs/effects.py), and the repairs
(republish, requeue, promotion, a wipe).  The worker after its group's claim
``claimed`` (the permits last the lease); every move out of pending/running
``finished`` (slots and permits back, wake-ups; one step per model for a
group); a busy answer ``returned`` (from the effects); the periodic pass
``kick_all``.  Each call may dispatch jobs (anyone's): their messages are
published here, in one LPUSH.  A message carries the attempt the job was
queued for, so one that outlived its attempt is refused by the claim CAS,
not run again.

Redis errors are logged, never raised: the row is the truth and the
maintenance passes put back whatever a lost call left out (``queue`` with
mode NX; gate slots and permits are reconciled).
"""
from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

import redis

from app.clock import as_utc
from app.infra import metrics, publisher
from app.infra.celery_config import KICK_MODEL_TASK
from app.infra.redis import dispatch as rd, upstream

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


# A job's queue entry: (tenant, job id, order score, the attempt its message carries: "<n>", or "<n>h" for a job
# at the head of its tenant's queue, its credential scope or "").
Entry = tuple[str, str, float, str, str]


def entry(row) -> Entry:
    """THE way a job's queue entry is built, from its row (or an admission's values: a mapping): every move
    into pending (admission, a retry re-admitted, a busy answer's return) and every repair (republish, requeue,
    promotion, a wipe) queues what this says.  A row with ``promoted_at`` is at the head of its tenant's queue
    (a head retry, a promoted one, a busy answer's return: their queue time is their creation), and its
    message goes out at high priority, past the broker's queue."""
    get = row.get if isinstance(row, Mapping) else lambda k, d=None: getattr(row, k, d)
    attempt = get("attempt") or 0
    return (get("tenant_id"), get("id"), order_score(get("enqueue_at"), get("priority")),
            f"{attempt}h" if get("promoted_at") is not None else str(attempt), upstream.scope_of(get("model_key")))


def _safely(model: str, what: str, call, *, more: int = 0, strict: bool = False):
    """Run a dispatch step and publish what it dispatched, (tenant, job_id, attempt) each; ``more``: the
    step answers that many values before the triples.  Redis failing: ``[]`` (``(None,)*more + ([],)``),
    or raised (``strict``)."""
    try:
        out = call()
    except redis.RedisError as exc:
        if strict:
            raise
        log.warning("dispatch (%s) of %s failed: %s; the maintenance pass repairs it", what, model, exc)
        return (None,) * more + ([],) if more else []
    sent = out[more] if more else out
    high = [(job_id, int(a[:-1])) for _t, job_id, a in sent if a.endswith("h")]
    normal = [(job_id, int(a)) for _t, job_id, a in sent if not a.endswith("h")]
    if high:
        publisher.publish_run_jobs(high, publisher.Priority.HIGH)
    if normal:
        publisher.publish_run_jobs(normal)
    for tenant, n in Counter(tenant for tenant, _, _ in sent).items():
        metrics.dispatched(model, tenant, n)
    return out


def queue_entries(model: str, entries: list[Entry], *, mode: str = "", cap: int | None = None,
                  strict: bool = False) -> int:
    """Queue entries (``entry``) of one model and dispatch what may run now: ``mode`` '' to add or move, 'NX'
    only where missing (repairs), 'XXLT' only to move a queued job ahead (promotion); a job holding a permit
    or waiting aside is never queued twice.  Returns how many jobs were dispatched.  ``strict``: a Redis
    error is raised, not logged."""
    if not entries:
        return 0
    return len(_safely(model, "queue", lambda: rd.enqueue(model, entries, mode=mode, cap=cap), strict=strict))


def queue(rows: Iterable, *, mode: str = "", caps: dict[str, int] | None = None, strict: bool = False) -> int:
    """Queue jobs (their rows, ``entry``), grouped by model: one step per model."""
    by_model: dict[str, list[Entry]] = {}
    for row in rows:
        by_model.setdefault(row.model_name, []).append(entry(row))
    return sum(queue_entries(m, e, mode=mode, cap=(caps or {}).get(m), strict=strict) for m, e in by_model.items())


def claimed(model: str, jobs: list[tuple[str, str]], lease_seconds: float, cap: int) -> None:
    """A group of (tenant, job_id) claimed: their permits last the lease, in one step."""
    _safely(model, "claim", lambda: rd.claimed(model, jobs, lease_seconds, cap=cap))


def finished(model: str, jobs: list[tuple[str, str, str | None, float | None, float | None]],
             cap: int | None = None) -> None:
    """Jobs that left pending/running, (tenant, job_id, wake-up, ran, keep) each, in one step: slots back,
    permits back unless ``keep`` (their calls may still run: app/infra/redis/dispatch.py finish); a wake-up
    (None: none; "": the job id; else the row's snapshot) for their waiters; ``ran``: a done attempt's seconds."""
    _safely(model, "finish", more=1, call=lambda: rd.finish(model, jobs, cap=cap))


@dataclass(frozen=True)
class Busy:
    """A busy answer (429/503) as its job returns to the queue: the answer's Retry-After (capped seconds;
    None: none usable) and how long the job itself waits (app/infra/redis/upstream.py job_delay)."""
    retry_after: float | None
    delay: float


def returned(row, busy: Busy, cap: int | None = None) -> None:
    """A busy answer's job (its row, pending again at the head: ``entry``): it waits ``busy.delay``, then is
    back in its tenant's queue; permits back, charge settled, its scope's controller told.  A kick is
    published for when the job may run again and when a pause the answer moved ends (the periodic kick
    covers a lost one)."""
    tenant, job, score, attempt, _scope = entry(row)
    started = row.started_at.timestamp() if row.started_at else 0.0
    due, till, _sent = _safely(row.model_name, "return", more=2, call=lambda: rd.returned(
        row.model_name, tenant, job, score, attempt, started, busy.retry_after, busy.delay, random.random(),
        cap=cap))
    for at in {due, till} - {None, 0.0}:
        publisher.publish_task(KICK_MODEL_TASK, [row.model_name], countdown=max(0.0, at - time.time()))


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
