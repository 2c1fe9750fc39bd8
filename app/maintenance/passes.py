"""Periodic repairs that keep Redis and the broker derived from the rows
(docs/architecture.md, invariant 1), and the cleanup that ends a job's life.

Each function is safe to run from several beat instances or a manual trigger
at once: rows are taken in SKIP LOCKED batches and every change is a
transition CAS (or guarded DELETE), so a row is processed by one caller.
Jobs moved to pending are queued for dispatch after the commit, or a worker
could read the row before it is pending and drop the message.

The passes (beat, the CLI and the HTTP triggers call them) are below, each
the list of its parts; recovery.py holds the recovery and gate parts, this
module the others:

- Cleanup, the pass at the end of a job's life: what retention
  (app/jobs/retention.py, its invariants) deletes, for every model -- submits
  to a capped model evict first, this is the backstop -- then jobs past their
  budget (pending, running, retry_wait) time out.
- Retries (seed 002: retryTimes, retryQueueMaxSeconds): re-admitted through
  the gate after their backoff, at the head or the tail of their tenant's
  queue, and lifted to the head once they waited too long at the tail.
- runWork without resident workers (seed 002 ``POST /task/runWork``, also
  ``asynch work run-once``, e.g. from a CronJob): claim up to N pending jobs
  and run them here with a Celery worker's code (execution.run_claimed).
  A job is taken by transitions.claim on rows locked FOR UPDATE SKIP LOCKED:
  concurrent passes take disjoint rows, and a worker's run_job message for
  the same attempt is refused by its claim CAS, so each attempt runs once.
  A tenant's max_concurrency (or autotune's lower override) counts the rows
  running for the model and tenant, whoever runs them: never started past.
  A claimed job takes its permit as a worker's claim does (dispatch.claimed)
  and leaves its ready queue; its lease is the model's timeout +
  ASYNCH_LEASE_GRACE_SECONDS, and a pass that dies mid-run is recovered like
  a dead worker (worker NULL: lease-based).
"""
from __future__ import annotations

from datetime import timedelta

import redis
from sqlalchemy import func, or_, select

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.redis import gate
from app.infra.redis.runtime import runtime_limits_raw
from app.infra.tables import models, tasks
from app.jobs import dispatch, effects, execution, retention
from app.jobs.admission import release_slot
from app.maintenance.autotune import effective
# Re-exported too: beat, the CLI and the HTTP triggers reach every part through this module.
from app.maintenance.recovery import (expire_past_deadline, kick_dispatch, reconcile_gates, recover_dead_workers,
                                      recover_expired_leases, repair_after_wipe, republish_stale_pending,
                                      requeue_all_pending, time_out_overdue)
from app.maintenance.report import Report, batch_size, compose, locked
from app.states import JobState
from app.tenancy import limits

def run_work(max_tasks: int | None = None) -> Report:
    """One worker pass (seed: /task/runWork): every job that should be queued
    is, the dispatcher moves, then up to ``max_tasks`` pending jobs run here
    (None: ASYNCH_RUN_WORK_MAX_TASKS; 0: none, resident workers run them)."""
    return compose([("wipe", repair_after_wipe), ("dead_workers", recover_dead_workers),
                    ("expired", expire_past_deadline), ("retry", retry_due),
                    ("promoted", promote_waiting_retries), ("republished", republish_stale_pending),
                    ("dispatched", kick_dispatch), ("ran", lambda: run_once(max_tasks))])


def recover() -> Report:
    """The recovery pass (a dead worker's permits come back when their lease
    ends; dispatched jobs nobody claimed go back to their queue)."""
    return compose([("wipe", repair_after_wipe), ("dead_workers", recover_dead_workers),
                    ("leases", recover_expired_leases),
                    ("timeouts", time_out_overdue), ("republished", republish_stale_pending),
                    ("reconcile", reconcile_gates), ("dispatched", kick_dispatch)])


def clean_work() -> Report:
    """One cleaner pass (seed: /task/cleanWork)."""
    return compose([("cleanup", cleanup), ("retry", retry_due), ("recover", recover)])


def cleanup(limit: int | None = None) -> Report:
    """Hard-delete what served its time, with its stored result, then each
    capped model's least recently read beyond max_completed; then time out
    the jobs past their budget."""
    n = batch_size(limit)
    rep = Report(details={"claimed": 0, "failed": 0, "done": 0, "objects": 0, "object_errors": 0, "evicted": 0})

    def drain(name: str, step) -> None:
        while True:
            seen, deleted, objects, errors = step()
            rep.details[name] += deleted
            rep.details["objects"] += objects
            rep.details["object_errors"] += errors
            # A short batch is the end; a batch that deleted nothing only has
            # rows whose objects failed to delete: leave them for next time.
            if seen < n or deleted == 0:
                break

    for name, states, col, before in retention.expiry_kinds(clock_now()):
        drain(name, lambda: retention.purge_batch(states, col, before, n))  # noqa: B023 (called at once)
    with transaction() as conn:
        capped = conn.execute(select(models.c.model_name, models.c.max_completed)
                              .where(models.c.max_completed > 0)).all()
    for model_name, cap in capped:
        drain("evicted", lambda: retention.evict_over_cap(model_name, cap, n))  # noqa: B023
    rep.details["timeouts"] = time_out_overdue(limit).processed
    rep.processed = sum(rep.details[k] for k in ("claimed", "failed", "done", "evicted", "timeouts"))
    return rep


def retry_due(limit: int | None = None, only: list[str] | None = None) -> Report:
    """retry_wait jobs past their backoff go back to pending through the gate
    (a full gate leaves them waiting, never dropped): with the model's
    retry_queue_max_seconds 0 at the head of the tenant's queue (queue time
    backdated to creation), else at the tail until promote_waiting_retries
    lifts them.  ``only``: these jobs, now, whatever their backoff (requeue)."""
    now = clock_now()
    due = tasks.c.id.in_(only) if only is not None else tasks.c.next_retry_at <= now
    rep = Report(details={"gate_full": 0, "head": 0, "tail": 0})
    taken: list[tuple[str, str, str]] = []
    try:
        # The effects queue each re-admitted job after the commit: a worker must find the row pending when its
        # message comes (app/jobs/dispatch.py entry: at the head with its creation's queue time, or the tail).
        with effects.collecting() as fx, transaction() as conn:
            rows = conn.execute(locked(select(
                tasks.c.id, tasks.c.model_name, tasks.c.tenant_id, tasks.c.attempt, tasks.c.busy_count,
                tasks.c.created_at, tasks.c.priority, models.c.queue_limit, models.c.tenant_queue_limit,
                models.c.retry_queue_max_seconds,
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
                won = fx.add(transitions.readmit(conn, r.id, r.attempt, r.created_at if head else now,
                                                 retries=r.attempt - r.busy_count, promoted_at=now if head else None))
                if won is None:
                    release_slot(r.model_name, r.tenant_id, r.id)
                    continue
                rep.details["head" if head else "tail"] += 1
    except BaseException:
        for model, tenant, jid in taken:
            release_slot(model, tenant, jid)
        raise
    rep.processed = rep.details["head"] + rep.details["tail"]
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
        try:
            with transaction() as conn:
                rows = conn.execute(locked(select(tasks.c.id, tasks.c.attempt).where(
                    tasks.c.model_name == m.model_name, tasks.c.state == int(JobState.PENDING),
                    tasks.c.retry_count > 0, tasks.c.promoted_at.is_(None), tasks.c.enqueue_at < cutoff,
                ).order_by(tasks.c.enqueue_at).limit(batch_size(limit)))).all()
                moved = [row for r in rows if (row := transitions.mark_promoted(conn, r.id, r.attempt, now=now))]
                # Only a job still queued moves, and only forward (XXLT): one dispatched is left alone.  Inside the
                # transaction: a failed move rolls the marks back, for the next pass (a move whose commit fails is
                # moved again, a no-op).
                dispatch.queue(moved, mode="XXLT", strict=True)
        except redis.RedisError:
            continue
        n += len(moved)
    return Report(processed=n)


def run_once(max_tasks: int | None = None) -> Report:
    """Claim up to ``max_tasks`` (None: ASYNCH_RUN_WORK_MAX_TASKS) pending
    jobs, oldest queue time first, and run each attempt here.  Reports how
    many it claimed, each outcome's count, and the job ids."""
    settings = get_settings()
    n = settings.run_work_max_tasks if max_tasks is None else max_tasks
    out = Report(details={"claimed": 0, "outcomes": {}, "jobs": []})
    if n <= 0:
        return out
    taken: list[tuple] = []
    with transaction() as conn:
        # A few more candidates than wanted: some may be at their tenant's cap.
        q = locked(select(tasks.c.id, tasks.c.attempt, tasks.c.model_name, tasks.c.tenant_id)
                   .where(tasks.c.state == int(JobState.PENDING),  # past their deadline: the expiry pass's
                          or_(tasks.c.caller_deadline_at.is_(None), tasks.c.caller_deadline_at >= clock_now()))
                   .order_by(tasks.c.enqueue_at, tasks.c.id).limit(n * 4))
        candidates = conn.execute(q).all()
        if not candidates:
            return out
        names = sorted({c.model_name for c in candidates})
        conf = {m.model_name: m for m in conn.execute(select(models).where(models.c.model_name.in_(names)))}
        running = {(r.model_name, r.tenant_id): r.n for r in conn.execute(
            select(tasks.c.model_name, tasks.c.tenant_id, func.count().label("n"))
            .where(tasks.c.state == int(JobState.RUNNING), tasks.c.model_name.in_(names))
            .group_by(tasks.c.model_name, tasks.c.tenant_id))}
        now = clock_now()
        caps: dict[str, int] = {}
        for c in candidates:
            if len(taken) >= n:
                break
            model = conf.get(c.model_name)
            cap = caps.setdefault(c.model_name, _cap(c.model_name, model))
            if running.get((c.model_name, c.tenant_id), 0) >= cap:
                continue
            lease = (model.timeout_seconds if model is not None else 60) + settings.lease_grace_seconds
            row = transitions.claim(conn, c.id, c.attempt, now + timedelta(seconds=lease), None)
            if row is not None:
                running[(c.model_name, c.tenant_id)] = running.get((c.model_name, c.tenant_id), 0) + 1
                taken.append((row, model, lease, cap))
    for row, model, lease, cap in taken:
        dispatch.claimed(row.model_name, [(row.tenant_id, row.id)], lease, cap=cap)
        outcome = execution.run_claimed([execution.Attempt(row, model)])[row.id]
        out.details["outcomes"][outcome] = out.details["outcomes"].get(outcome, 0) + 1
        out.details["jobs"].append(row.id)
    out.processed = out.details["claimed"] = len(taken)
    return out


def _cap(model_name: str, model) -> int:
    """The model's max_concurrency, or autotune's runtime override when lower
    (as the dispatcher takes it); Redis away: the configured cap."""
    cap = model.max_concurrency if model is not None else 1
    try:
        return effective(runtime_limits_raw(model_name)[0], cap)
    except redis.RedisError:
        return cap
