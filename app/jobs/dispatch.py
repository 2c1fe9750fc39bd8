"""Fair dispatch, pulled by free call slots (docs/architecture.md, "Fair dispatch", "A slot per call"): a pending job
waits in its tenant's queue until a worker's free call slot takes it, and the fair scheduler
(app/infra/redis/dispatch.py) picks which one at that moment.

Who calls what: every move into pending and every repair queues jobs through ONE entry builder (``entry``, from
the row) and ``queue`` / ``queue_entries``: admission (through the outbox), a retry re-admitted and a busy answer's
return (both from the transition's effects, app/jobs/effects.py), and the repairs (republish, requeue, promotion,
a wipe).  A worker's free slots take jobs with ``pull`` (answering the model's doorbell) and ``finished`` (the
slots its ended calls freed, in the step that releases them) and an express slot with ``pull_idle`` (a tenant
holding no permit: ``_rung`` publishes the express notice of a step that queued such a job); every move out of
pending/running and every call's end is ``finished``; a busy answer ``returned``; the periodic pass
``kick_all``.  A step that leaves work no slot took rings the model's doorbell (one ``asynch.pull`` message;
``_rung``): workers with free slots answer it.

Redis errors are logged, never raised: the row is the truth and the maintenance passes put back whatever a lost
call left out (``queue`` with mode NX; gate slots and permits are reconciled; a doorbell is rung again).
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
from app.infra.redis import dispatch as rd, events, keys, upstream
from app.infra.redis.client import get_redis

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


# A job's queue entry: (tenant, job id, order score, the attempt it is pending at, its credential scope or "").
Entry = tuple[str, str, float, str, str]
Pulled = tuple[str, str, int]  # a job a free slot took: (tenant, job id, the attempt it is pending at)


def entry(row) -> Entry:
    """THE way a job's queue entry is built, from its row (or an admission's values: a mapping): every move
    into pending (admission, a retry re-admitted, a busy answer's return) and every repair (republish, requeue,
    promotion, a wipe) queues what this says.  A row's queue time (``enqueue_at``) is its place: a head retry,
    a promoted one and a busy answer's return carry their creation's."""
    get = row.get if isinstance(row, Mapping) else lambda k, d=None: getattr(row, k, d)
    return (get("tenant_id"), get("id"), order_score(get("enqueue_at"), get("priority")), str(get("attempt") or 0),
            upstream.scope_of(get("model_key")))


def _rung(model: str, step: rd.Step) -> rd.Step:
    """After a step: ring the model's doorbell if it said so (and note it among the doorbells out, which a
    worker's writer yields its freed slots to: app/jobs/slots.py), count what it pulled."""
    if step.ring:
        if publisher.publish_bell(model, publisher.Priority.HIGH if step.high else publisher.Priority.NORMAL):
            try:
                # NX: a doorbell rung again (its lease passed unanswered) is still the same wait
                get_redis().zadd(keys.bells(), {model: time.time()}, nx=True)
            except redis.RedisError:
                pass
        else:  # not rung: the next step may ring it at once
            try:
                get_redis().hdel(keys.dispatch_conf(model), "bell")
            except redis.RedisError:
                pass
    if step.express:
        events.publish_express(model)
    for tenant, n in Counter(t for t, _, _ in step.pulled).items():
        metrics.dispatched(model, tenant, n)
    return step


def _safely(model: str, what: str, call, *, strict: bool = False):
    """Run a dispatch step, then ring and count (``_rung``).  Redis failing: an empty Step (``None`` for a step
    that answers more), or raised (``strict``)."""
    try:
        out = call()
    except redis.RedisError as exc:
        if strict:
            raise
        log.warning("dispatch (%s) of %s failed: %s; the maintenance pass repairs it", what, model, exc)
        return None
    step = next(x for x in out if isinstance(x, rd.Step)) if isinstance(out, tuple) else out
    _rung(model, step)
    return out


def queue_entries(model: str, entries: list[Entry], *, mode: str = "", cap: int | None = None,
                  strict: bool = False) -> None:
    """Queue entries (``entry``) of one model: ``mode`` '' to add or move, 'NX' only where missing (repairs),
    'XXLT' only to move a queued job ahead (promotion); a job holding a permit or waiting aside is never queued
    twice.  ``strict``: a Redis error is raised, not logged."""
    if entries:
        _safely(model, "queue", lambda: rd.enqueue(model, entries, mode=mode, cap=cap), strict=strict)


def queue(rows: Iterable, *, mode: str = "", caps: dict[str, int] | None = None, strict: bool = False) -> None:
    """Queue jobs (their rows, ``entry``), grouped by model: one step per model."""
    by_model: dict[str, list[Entry]] = {}
    for row in rows:
        by_model.setdefault(row.model_name, []).append(entry(row))
    for m, e in by_model.items():
        queue_entries(m, e, mode=mode, cap=(caps or {}).get(m), strict=strict)


def pull(model: str, most: int, lease: float) -> list[Pulled]:
    """A worker answers the model's doorbell with ``most`` free call slots: the jobs the ring picks now, their
    permits taken for ``lease`` (claim them at once).  The doorbell is answered (rung again if work is left)."""
    step = _safely(model, "pull", lambda: rd.pull(model, most, lease))
    if step is None:
        return []
    if not step.ring:
        try:
            get_redis().zrem(keys.bells(), model)
        except redis.RedisError:
            pass
    return step.pulled


def pull_idle(model: str, lease: float) -> list[Pulled]:
    """A worker's express slot answers an express notice: at most one job of a tenant holding no permit on the
    model (the lowest pass among them), its permit taken for ``lease`` (claim it at once)."""
    step = _safely(model, "express pull", lambda: rd.pull_idle(model, lease))
    return [] if step is None else step.pulled


def claimed(model: str, jobs: list[tuple[str, str]], lease_seconds: float, cap: int) -> None:
    """Jobs the worker-less runWork pass claimed from their rows, (tenant, job_id) each: their permits last the
    lease, in one step."""
    _safely(model, "claim", lambda: rd.claimed(model, jobs, lease_seconds, cap=cap))


def finished(model: str, jobs: list[tuple[str, str, str | None, float | None, tuple[float, int] | str | None]],
             cap: int | None = None, most: int = 0, lease: float = 0.0) -> list[Pulled]:
    """Jobs that left pending/running and calls that ended, (tenant, job_id, wake-up, ran, keep) each, in one
    step: slots back, permits back unless ``keep`` (a call may still run: app/infra/redis/dispatch.py finish); a
    wake-up (None: none; "": the job id; else the row's snapshot) for their waiters; ``ran``: a done attempt's
    seconds.  ``most``: the caller's slots these calls freed, each taking the job the ring picks now (returned),
    its permit lasting ``lease``."""
    out = _safely(model, "finish", lambda: rd.finish(model, jobs, cap=cap, most=most, lease=lease))
    return [] if out is None else out[1].pulled


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
    step = _safely(row.model_name, "return", lambda: rd.returned(
        row.model_name, tenant, job, score, attempt, started, busy.retry_after, busy.delay, random.random(),
        cap=cap))
    for at in ({float(x) for x in step.head} - {0.0}) if step is not None else ():
        publisher.publish_task(KICK_MODEL_TASK, [row.model_name], countdown=max(0.0, at - time.time()))


def kick(model: str, *, cap: int | None = None, broker_lost: bool = False) -> int:
    """The model's blocked tenants tried again, delayed jobs whose time came queued, its doorbell rung if work
    waits (``broker_lost``: its message is gone, ring anew); the doorbells out kept true (``keys.bells``).
    Returns 1 if it rang, else 0."""
    out = _safely(model, "kick", lambda: rd.kick(model, cap=cap, broker_lost=broker_lost))
    if out is not None and not out[0].ring and not out[1]:
        try:
            get_redis().zrem(keys.bells(), model)
        except redis.RedisError:
            pass
    return int(out is not None and out[0].ring)


def kick_all(caps: dict[str, int], *, broker_lost: bool = False) -> int:
    """Every model with dispatch state (and every configured one): ``kick``.  Returns how many doorbells rang."""
    names = sorted(set(caps) | rd.models())
    try:
        # Each model's steps read their own copy of the weights (one hash slot,
        # Redis Cluster): a model that appeared since the last change gets them here.
        rd.copy_weights(names)
    except redis.RedisError as exc:
        log.warning("dispatch weights not copied: %s; the next pass tries again", exc)
    return sum(kick(model, cap=caps.get(model), broker_lost=broker_lost) for model in names)


def bells_waiting(but: str) -> bool:
    """Whether another model's doorbell is out, rung more than a moment ago and not yet answered (no worker had a
    free slot for it): a writer then gives its freed slots back instead of refilling them from ``but``."""
    try:
        found = get_redis().zrangebyscore(keys.bells(), "-inf", time.time() - BELL_PATIENCE_SECONDS)
    except redis.RedisError:
        return False
    return any(m != but for m in found)


# A doorbell rung this recently may be answered by an idle worker at once: no slot needs to be given back for it.
BELL_PATIENCE_SECONDS = 0.05
