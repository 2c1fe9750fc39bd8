"""Periodic repairs that keep Redis and the broker derived from the rows
(DESIGN.md invariant 1).  Each function is safe to run from several beat
instances or a manual trigger at once: rows are taken in SKIP LOCKED batches
and every change is a transition CAS, so a row is processed by one caller.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

import redis
from sqlalchemy import select

from app import redis_scripts, transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.db import is_postgres, transaction
from app.models import models, tasks
from app.publisher import publish_run_job
from app.services.execution import backoff_seconds
from app.services.jobs import after_terminal, release_slot
from app.states import JobState, SLOT_STATES

log = logging.getLogger(__name__)
BATCH = 500


def _locked(conn, q):
    """SELECT ... FOR UPDATE OF asynch_task SKIP LOCKED where the database has it."""
    return q.with_for_update(skip_locked=True, of=tasks) if is_postgres(conn) else q


@dataclass
class Report:
    processed: int = 0
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"processed": self.processed, **self.details}


def reconcile_gates() -> Report:
    """Make every gate's slot set equal the model's pending/running rows."""
    s = get_settings()
    rep = Report(details={"added": 0, "removed": 0, "models": 0})
    with transaction() as conn:
        names = {r.model_name for r in conn.execute(select(models.c.model_name))}
    names |= set(redis_scripts.gate_models())
    for name in sorted(names):
        with transaction() as conn:
            ids = [r.id for r in conn.execute(select(tasks.c.id).where(
                tasks.c.model_name == name, tasks.c.state.in_([int(x) for x in SLOT_STATES])))]
        added, removed = redis_scripts.gate_reconcile(name, ids, s.reconcile_grace_seconds)
        if added:
            # A job may have left pending/running between our read and the
            # script; give such slots straight back.
            with transaction() as conn:
                still = {r.id for r in conn.execute(select(tasks.c.id).where(
                    tasks.c.id.in_(added), tasks.c.state.in_([int(x) for x in SLOT_STATES])))}
            for jid in set(added) - still:
                redis_scripts.gate_release(name, jid)
        rep.details["added"] += len(added)
        rep.details["removed"] += len(removed)
        rep.details["models"] += 1
        rep.processed += len(added) + len(removed)
    return rep


def retry_due(limit: int = BATCH, only: list[str] | None = None) -> Report:
    """retry_wait jobs whose backoff has passed go back to pending through
    the gate.  A full gate leaves them waiting; they are never dropped.
    retry_queue_max_seconds = 0: the retry goes to the head of the queue.
    ``only``: these jobs, now, whatever their backoff (operator requeue)."""
    now = clock_now()
    due = tasks.c.id.in_(only) if only is not None else tasks.c.next_retry_at <= now
    rep = Report(details={"gate_full": 0})
    published: list[tuple[str, int, int | None]] = []
    taken: list[tuple[str, str]] = []
    try:
        with transaction() as conn:
            rows = conn.execute(_locked(conn, select(
                tasks.c.id, tasks.c.model_name, tasks.c.attempt, tasks.c.created_at,
                models.c.queue_limit, models.c.retry_queue_max_seconds,
            ).join(models, models.c.model_name == tasks.c.model_name, isouter=True).where(
                tasks.c.state == int(JobState.RETRY_WAIT), due,
            ).order_by(tasks.c.next_retry_at).limit(limit))).all()
            full: set[str] = set()
            for r in rows:
                if r.model_name in full:
                    continue
                cap = r.queue_limit if r.queue_limit is not None else 0
                if not redis_scripts.gate_admit(r.model_name, r.id, cap).admitted:
                    full.add(r.model_name)
                    rep.details["gate_full"] += 1
                    continue
                taken.append((r.model_name, r.id))
                head = (r.retry_queue_max_seconds or 0) == 0
                won = transitions.readmit(conn, r.id, r.attempt, r.created_at if head else now)
                if won is None:
                    release_slot(r.model_name, r.id)
                    continue
                published.append((r.id, r.attempt, 0 if head else None))
    except BaseException:
        for model, jid in taken:
            release_slot(model, jid)
        raise
    for jid, attempt, prio in published:
        publish_run_job(jid, attempt, priority=prio)
    rep.processed = len(published)
    return rep


def recover_expired_leases(limit: int = BATCH) -> Report:
    """A running job whose lease ran out lost its worker: that attempt failed."""
    now = clock_now()
    rep = Report(details={"retry_wait": 0, "failed": 0})
    with transaction() as conn:
        rows = conn.execute(_locked(conn, select(
            tasks.c.id, tasks.c.attempt, models.c.retry_times,
        ).join(models, models.c.model_name == tasks.c.model_name, isouter=True).where(
            tasks.c.state == int(JobState.RUNNING), tasks.c.lease_expires_at < now,
        ).limit(limit))).all()
        results = []
        for r in rows:
            retry = r.attempt <= (r.retry_times or 0)
            retry_at = now + timedelta(seconds=backoff_seconds(r.attempt)) if retry else None
            won = transitions.fail_attempt(conn, r.id, r.attempt, "worker lost (lease expired)",
                                           retry_at=retry_at, lease_expired_before=now)
            if won is not None:
                results.append(won)
    for won in results:
        if won.state == JobState.RETRY_WAIT:
            release_slot(won.model_name, won.id)
            rep.details["retry_wait"] += 1
        else:
            after_terminal(won)
            rep.details["failed"] += 1
    rep.processed = len(results)
    return rep


def time_out_overdue(limit: int = BATCH) -> Report:
    """pending/running past the job's budget become timeout (slot released)."""
    now = clock_now()
    with transaction() as conn:
        rows = conn.execute(_locked(conn, select(tasks.c.id).where(
            tasks.c.state.in_([int(x) for x in SLOT_STATES]), tasks.c.deadline_at < now,
        ).limit(limit))).all()
        won = [w for w in (transitions.time_out(conn, r.id, now=now) for r in rows) if w is not None]
    for w in won:
        after_terminal(w)
    return Report(processed=len(won))


def republish_stale_pending(older_than_seconds: float | None = None, limit: int = BATCH) -> Report:
    """Pending jobs waiting longer than expected may have lost their message
    (broker wiped, publish failed).  A duplicate message is harmless: the
    claim CAS lets one through."""
    s = get_settings()
    age = s.republish_after_seconds if older_than_seconds is None else older_than_seconds
    cutoff = clock_now() - timedelta(seconds=age)
    with transaction() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.attempt).where(
            tasks.c.state == int(JobState.PENDING), tasks.c.updated_at < cutoff,
        ).order_by(tasks.c.enqueue_at).limit(limit)).all()
    n = sum(1 for r in rows if publish_run_job(r.id, r.attempt))
    return Report(processed=n)


def recover() -> Report:
    """The recovery pass: dead leases, overdue jobs, lost messages, gates."""
    out = Report()
    for name, fn in (("leases", recover_expired_leases), ("timeouts", time_out_overdue),
                     ("republished", republish_stale_pending)):
        r = fn()
        out.details[name] = r.as_dict()
        out.processed += r.processed
    try:
        out.details["reconcile"] = reconcile_gates().as_dict()
    except redis.RedisError as exc:
        out.details["reconcile"] = {"error": str(exc)}
    return out
