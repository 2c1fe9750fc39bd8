"""Retries (seed 002: retryTimes, retryQueueMaxSeconds): re-admitted through
the gate after their backoff, at the head or the tail of their tenant's
queue, and lifted to the head once they waited too long at the tail."""
from __future__ import annotations

from datetime import timedelta

import redis
from sqlalchemy import select

from app import transitions
from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.redis import gate
from app.infra.tables import models, tasks
from app.jobs import dispatch
from app.jobs.admission import release_slot
from app.maintenance.report import Report, batch_size, locked
from app.states import JobState
from app.tenancy import limits


def retry_due(limit: int | None = None, only: list[str] | None = None) -> Report:
    """retry_wait jobs past their backoff go back to pending through the gate
    (a full gate leaves them waiting, never dropped): with the model's
    retry_queue_max_seconds 0 at the head of the tenant's queue (queue time
    backdated to creation), else at the tail until promote_waiting_retries
    lifts them.  ``only``: these jobs, now, whatever their backoff (requeue)."""
    now = clock_now()
    due = tasks.c.id.in_(only) if only is not None else tasks.c.next_retry_at <= now
    rep = Report(details={"gate_full": 0, "head": 0, "tail": 0})
    queued: dict[str, list[tuple[str, str, float, int | str]]] = {}
    taken: list[tuple[str, str, str]] = []
    try:
        with transaction() as conn:
            rows = conn.execute(locked(conn, select(
                tasks.c.id, tasks.c.model_name, tasks.c.tenant_id, tasks.c.attempt, tasks.c.busy_count, tasks.c.created_at,
                tasks.c.priority, models.c.queue_limit, models.c.tenant_queue_limit, models.c.retry_queue_max_seconds,
            ).join(models, models.c.model_name == tasks.c.model_name, isouter=True).where(
                tasks.c.state == int(JobState.RETRY_WAIT), due,
            ).order_by(tasks.c.next_retry_at).limit(batch_size(limit)))).all()
            full: set[tuple[str, str]] = set()
            for r in rows:
                if (r.model_name, "") in full or (r.model_name, r.tenant_id) in full:
                    continue
                cap = r.queue_limit if r.queue_limit is not None else 0
                share = limits.tenant_queue_cap(r.tenant_id, r) if r.queue_limit is not None else 0
                decision = gate.gate_admit(r.model_name, r.tenant_id, r.id, cap, share)
                if not decision.admitted:
                    full.add((r.model_name, r.tenant_id if decision.refused_by == "tenant" else ""))
                    rep.details["gate_full"] += 1
                    continue
                taken.append((r.model_name, r.tenant_id, r.id))
                head = (r.retry_queue_max_seconds or 0) == 0
                won = transitions.readmit(conn, r.id, r.attempt, r.created_at if head else now,
                                          retries=r.attempt - r.busy_count, promoted_at=now if head else None)
                if won is None:
                    release_slot(r.model_name, r.tenant_id, r.id)
                    continue
                queued.setdefault(r.model_name, []).append(
                    (r.tenant_id, r.id, dispatch.order_score(r.created_at if head else now, r.priority),
                     dispatch.head(r.attempt) if head else r.attempt))
                rep.details["head" if head else "tail"] += 1
    except BaseException:
        for model, tenant, jid in taken:
            release_slot(model, tenant, jid)
        raise
    # After the commit: a worker must find the row pending when the message comes.
    for model, entries in queued.items():
        dispatch.requeue(model, entries)
    rep.processed = sum(len(e) for e in queued.values())
    return rep


def promote_waiting_retries(limit: int | None = None) -> Report:
    """Retries waiting at the tail longer than their model's
    retry_queue_max_seconds move to the head of their tenant's queue, once
    (promoted_at).  One already dispatched is left alone: its message is out."""
    now = clock_now()
    with transaction() as conn:
        waits = conn.execute(select(models.c.model_name, models.c.retry_queue_max_seconds)
                             .where(models.c.retry_queue_max_seconds > 0)).all()
    n = 0
    for m in waits:
        cutoff = now - timedelta(seconds=m.retry_queue_max_seconds)
        with transaction() as conn:
            rows = conn.execute(locked(conn, select(
                tasks.c.id, tasks.c.tenant_id, tasks.c.attempt, tasks.c.created_at, tasks.c.priority).where(
                tasks.c.model_name == m.model_name, tasks.c.state == int(JobState.PENDING),
                tasks.c.retry_count > 0, tasks.c.promoted_at.is_(None), tasks.c.enqueue_at < cutoff,
            ).order_by(tasks.c.enqueue_at).limit(batch_size(limit)))).all()
            if not rows:
                continue
            try:
                # Move first, mark after: a failed move leaves it unmarked for the next pass.
                dispatch.requeue(m.model_name, [(r.tenant_id, r.id, dispatch.order_score(r.created_at, r.priority),
                                                 dispatch.head(r.attempt)) for r in rows], mode="XXLT")
            except redis.RedisError:
                continue
            for r in rows:
                transitions.mark_republished(conn, r.id, r.attempt, now=now)
                n += 1
    return Report(processed=n)
