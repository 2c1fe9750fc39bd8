"""Periodic repairs that keep Redis and the broker derived from the rows
(DESIGN.md invariant 1), and the cleanup that ends a job's life.

Each function is safe to run from several beat instances or a manual trigger
at once: rows are taken in SKIP LOCKED batches and every change is a
transition CAS (or guarded DELETE), so a row is processed by one caller.
Messages for rows that are already pending are sent while the row lock is
held (the claim waits for our commit); messages for rows we move to pending
are sent after the commit, or a worker would find the row not yet pending
and drop the message.

The passes, as beat, the CLI and the HTTP triggers call them:
  run_work()   due retries, promotion of retries that waited too long,
               lost messages                       (seed: /task/runWork)
  recover()    wipe repair, dead leases, overdue jobs, lost messages,
               gates, semaphore permits
  cleanup()    expired claimed jobs, retention, overdue jobs
  clean_work() cleanup() + recover()               (seed: /task/cleanWork)
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Sequence

import redis
from sqlalchemy import and_, or_, select

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import is_postgres, transaction
from app.infra.publisher import Priority, publish_run_job
from app.infra.redis import epoch, gate, semaphore
from app.infra.storage import get_storage
from app.infra.tables import models, tasks
from app.jobs.execution import backoff_seconds
from app.jobs.service import after_terminal, release_slot
from app.states import SLOT_STATES, JobState

log = logging.getLogger(__name__)


def _batch(limit: int | None) -> int:
    return limit if limit is not None else get_settings().maintenance_batch


def _locked(conn, q):
    """SELECT ... FOR UPDATE OF asynch_task SKIP LOCKED where the database has it."""
    return q.with_for_update(skip_locked=True, of=tasks) if is_postgres(conn) else q


@dataclass
class Report:
    processed: int = 0
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"processed": self.processed, **self.details}


def _compose(parts: Sequence[tuple[str, Callable[[], Report]]]) -> Report:
    """Run passes in order; a Redis outage fails only the passes that need
    Redis (leases, timeouts and cleanup are database-only)."""
    out = Report()
    for name, fn in parts:
        try:
            r = fn()
        except redis.RedisError as exc:
            log.warning("maintenance pass %s: redis unavailable: %s", name, exc)
            out.details[name] = {"error": f"redis unavailable: {exc}"}
            continue
        out.details[name] = r.as_dict()
        out.processed += r.processed
    return out


# --- gates ---------------------------------------------------------------------------

def reconcile_gates() -> Report:
    """Make every gate's slot set equal the model's pending/running rows."""
    s = get_settings()
    rep = Report(details={"added": 0, "removed": 0, "models": 0})
    with transaction() as conn:
        names = {r.model_name for r in conn.execute(select(models.c.model_name))}
    names |= set(gate.gate_models())
    for name in sorted(names):
        with transaction() as conn:
            ids = [r.id for r in conn.execute(select(tasks.c.id).where(
                tasks.c.model_name == name, tasks.c.state.in_([int(x) for x in SLOT_STATES])))]
        added, removed = gate.gate_reconcile(name, ids, s.reconcile_grace_seconds)
        if added:
            # A job may have left pending/running between our read and the
            # script; give such slots straight back.
            with transaction() as conn:
                still = {r.id for r in conn.execute(select(tasks.c.id).where(
                    tasks.c.id.in_(added), tasks.c.state.in_([int(x) for x in SLOT_STATES])))}
            for jid in set(added) - still:
                gate.gate_release(name, jid)
        rep.details["added"] += len(added)
        rep.details["removed"] += len(removed)
        rep.details["models"] += 1
        rep.processed += len(added) + len(removed)
    return rep


def reclaim_dead_permits() -> Report:
    """Give back semaphore permits whose lease expired (the worker died
    between taking a permit and releasing it)."""
    return Report(processed=semaphore.semaphore_reap_all())


# --- retries ---------------------------------------------------------------------------

def retry_due(limit: int | None = None, only: list[str] | None = None) -> Report:
    """retry_wait jobs whose backoff has passed go back to pending through
    the gate.  A full gate leaves them waiting; they are never dropped.

    Queue position (seed: retryQueueMaxSeconds): 0 puts the retry at the
    head of the queue (published at high priority, queue time backdated to
    its creation); > 0 puts it at the tail (normal priority) until
    promote_waiting_retries() lifts it after that many seconds.
    ``only``: these jobs, now, whatever their backoff (operator requeue).
    """
    now = clock_now()
    due = tasks.c.id.in_(only) if only is not None else tasks.c.next_retry_at <= now
    rep = Report(details={"gate_full": 0, "head": 0, "tail": 0})
    published: list[tuple[str, int, Priority]] = []
    taken: list[tuple[str, str]] = []
    try:
        with transaction() as conn:
            rows = conn.execute(_locked(conn, select(
                tasks.c.id, tasks.c.model_name, tasks.c.attempt, tasks.c.created_at,
                models.c.queue_limit, models.c.retry_queue_max_seconds,
            ).join(models, models.c.model_name == tasks.c.model_name, isouter=True).where(
                tasks.c.state == int(JobState.RETRY_WAIT), due,
            ).order_by(tasks.c.next_retry_at).limit(_batch(limit)))).all()
            full: set[str] = set()
            for r in rows:
                if r.model_name in full:
                    continue
                cap = r.queue_limit if r.queue_limit is not None else 0
                if not gate.gate_admit(r.model_name, r.id, cap).admitted:
                    full.add(r.model_name)
                    rep.details["gate_full"] += 1
                    continue
                taken.append((r.model_name, r.id))
                head = (r.retry_queue_max_seconds or 0) == 0
                won = transitions.readmit(conn, r.id, r.attempt, r.created_at if head else now,
                                          promoted_at=now if head else None)
                if won is None:
                    release_slot(r.model_name, r.id)
                    continue
                published.append((r.id, r.attempt, Priority.HIGH if head else Priority.NORMAL))
    except BaseException:
        for model, jid in taken:
            release_slot(model, jid)
        raise
    for jid, attempt, prio in published:
        publish_run_job(jid, attempt, prio)
        rep.details["head" if prio is Priority.HIGH else "tail"] += 1
    rep.processed = len(published)
    return rep


def promote_waiting_retries(limit: int | None = None) -> Report:
    """Retries waiting at the tail longer than their model's
    retry_queue_max_seconds jump ahead: a second message for the same
    attempt, at high priority.  Whichever of the two a worker takes first
    runs the attempt; the other one finds the claim taken and does nothing."""
    now = clock_now()
    with transaction() as conn:
        waits = conn.execute(select(models.c.model_name, models.c.retry_queue_max_seconds)
                             .where(models.c.retry_queue_max_seconds > 0)).all()
    n = 0
    for m in waits:
        cutoff = now - timedelta(seconds=m.retry_queue_max_seconds)
        with transaction() as conn:
            rows = conn.execute(_locked(conn, select(tasks.c.id, tasks.c.attempt).where(
                tasks.c.model_name == m.model_name, tasks.c.state == int(JobState.PENDING),
                tasks.c.retry_count > 0, tasks.c.promoted_at.is_(None), tasks.c.enqueue_at < cutoff,
            ).order_by(tasks.c.enqueue_at).limit(_batch(limit)))).all()
            for r in rows:
                # Publish before marking: a failed publish leaves it unmarked for the next pass.
                if publish_run_job(r.id, r.attempt, Priority.HIGH):
                    transitions.mark_republished(conn, r.id, r.attempt, now=now, promote=True)
                    n += 1
    return Report(processed=n)


# --- lost messages and wipes -------------------------------------------------------------

def _republish(where, limit: int, *, ordered_after=None) -> tuple[int, tuple | None]:
    """Re-send the messages of one batch of pending jobs (row locks held, so
    two passes never both send).  Returns (sent, last (enqueue_at, id))."""
    now = clock_now()
    q = select(tasks.c.id, tasks.c.attempt, tasks.c.enqueue_at, tasks.c.promoted_at).where(
        tasks.c.state == int(JobState.PENDING), *where)
    if ordered_after is not None:
        at, jid = ordered_after
        q = q.where(or_(tasks.c.enqueue_at > at, and_(tasks.c.enqueue_at == at, tasks.c.id > jid)))
    with transaction() as conn:
        rows = conn.execute(_locked(conn, q.order_by(tasks.c.enqueue_at, tasks.c.id).limit(limit))).all()
        sent = 0
        for r in rows:
            prio = Priority.HIGH if r.promoted_at is not None else Priority.NORMAL
            if publish_run_job(r.id, r.attempt, prio):
                transitions.mark_republished(conn, r.id, r.attempt, now=now)
                sent += 1
    return sent, ((rows[-1].enqueue_at, rows[-1].id) if rows else None)


def republish_stale_pending(older_than_seconds: float | None = None, limit: int | None = None) -> Report:
    """Pending jobs untouched for longer than expected may have lost their
    message (broker restarted, publish failed).  Each is re-sent at most
    once per period (the send restarts its clock); a duplicate is harmless:
    the claim CAS lets one through."""
    s = get_settings()
    age = s.republish_after_seconds if older_than_seconds is None else older_than_seconds
    cutoff = clock_now() - timedelta(seconds=age)
    sent, _ = _republish([tasks.c.updated_at < cutoff], _batch(limit))
    return Report(processed=sent)


def republish_all_pending(limit: int | None = None) -> Report:
    """Every pending job's message again, in queue order (after a wipe)."""
    total, last = 0, None
    while True:
        sent, last = _republish([], _batch(limit), ordered_after=last)
        total += sent
        if last is None:
            return Report(processed=total)


def repair_after_wipe() -> Report:
    """A Redis (gate or broker) without our epoch mark lost its data: the
    gate slots, and with the broker the queued messages.  Rebuild the gates
    and re-send every pending job at once instead of waiting for the
    lost-message timer.  First start looks the same and costs one round of
    duplicate (no-op) messages."""
    token = secrets.token_hex(8)
    wiped = epoch.claim_epochs(token)
    if not wiped:
        return Report(details={"wiped": []})
    log.warning("redis data lost (%s): rebuilding gates, re-publishing pending jobs", ", ".join(wiped))
    try:
        gates = reconcile_gates()
        sent = republish_all_pending()
    except BaseException:
        # Let the next pass see the wipe again.
        epoch.drop_epochs(token, wiped)
        raise
    return Report(processed=sent.processed, details={"wiped": wiped, "republished": sent.processed,
                                                     "reconcile": gates.as_dict()})


# --- dead workers and budgets ------------------------------------------------------------

def recover_expired_leases(limit: int | None = None) -> Report:
    """A running job whose lease ran out lost its worker: that attempt failed."""
    now = clock_now()
    rep = Report(details={"retry_wait": 0, "failed": 0})
    with transaction() as conn:
        rows = conn.execute(_locked(conn, select(
            tasks.c.id, tasks.c.attempt, models.c.retry_times,
        ).join(models, models.c.model_name == tasks.c.model_name, isouter=True).where(
            tasks.c.state == int(JobState.RUNNING), tasks.c.lease_expires_at < now,
        ).limit(_batch(limit)))).all()
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


def time_out_overdue(limit: int | None = None) -> Report:
    """pending/running past the job's budget become timeout (slot released)."""
    now = clock_now()
    with transaction() as conn:
        rows = conn.execute(_locked(conn, select(tasks.c.id).where(
            tasks.c.state.in_([int(x) for x in SLOT_STATES]), tasks.c.deadline_at < now,
        ).limit(_batch(limit)))).all()
        won = [w for w in (transitions.time_out(conn, r.id, now=now) for r in rows) if w is not None]
    for w in won:
        after_terminal(w)
    return Report(processed=len(won))


# --- cleanup ----------------------------------------------------------------------------

def _purge_batch(states: Sequence[JobState], older_than, before, limit: int) -> tuple[int, int, int, int]:
    """Delete one SKIP LOCKED batch: the stored objects first (in bulk), then
    the rows whose object is gone (one guarded DELETE).  Holding the row locks
    while deleting the objects is what makes two cleanups delete each object
    once.  Returns (rows seen, rows deleted, objects deleted, object errors)."""
    with transaction() as conn:
        rows = conn.execute(_locked(conn, select(tasks.c.id, tasks.c.result_location).where(
            tasks.c.state.in_([int(x) for x in states]), older_than < before,
        ).order_by(older_than).limit(limit))).all()
        locations = [r.result_location for r in rows if r.result_location]
        failed = get_storage().delete_many(locations) if locations else {}
        for r in rows:
            if r.result_location in failed:
                # Keep the row: it still points at the object to delete next time.
                log.warning("result not deleted, keeping the job for the next pass: %s",
                            failed[r.result_location], extra={"job_id": r.id})
        ids = [r.id for r in rows if r.result_location not in failed]
        deleted = len(transitions.purge_many(conn, ids, states, older_than, before))
    return len(rows), deleted, len(locations) - len(failed), len(failed)


def cleanup(limit: int | None = None) -> Report:
    """Hard-delete what has served its time, with its stored result:
    claimed jobs past expire_at (the model's auto_clean_seconds after the
    claim), failed/timeout/canceled jobs after ASYNCH_FAILED_RETENTION_SECONDS,
    done jobs nobody claimed after ASYNCH_DONE_RETENTION_SECONDS.  Then
    pending/running jobs past their budget become timeout."""
    s = get_settings()
    now = clock_now()
    n = _batch(limit)
    rep = Report(details={"claimed": 0, "failed": 0, "done": 0, "objects": 0, "object_errors": 0})
    kinds = (
        ("claimed", [JobState.CLAIMED], tasks.c.expire_at, now),
        ("failed", [JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED], tasks.c.finished_at,
         now - timedelta(seconds=s.failed_retention_seconds)),
        ("done", [JobState.DONE], tasks.c.finished_at, now - timedelta(seconds=s.done_retention_seconds)),
    )
    for name, states, col, before in kinds:
        while True:
            seen, deleted, objects, errors = _purge_batch(states, col, before, n)
            rep.details[name] += deleted
            rep.details["objects"] += objects
            rep.details["object_errors"] += errors
            # A short batch is the end; a batch that deleted nothing only has
            # rows whose objects failed to delete: leave them for next time.
            if seen < n or deleted == 0:
                break
    timeouts = time_out_overdue(limit)
    rep.details["timeouts"] = timeouts.processed
    rep.processed = rep.details["claimed"] + rep.details["failed"] + rep.details["done"] + timeouts.processed
    return rep


# --- the passes ---------------------------------------------------------------------------

def run_work() -> Report:
    """One worker pass (seed: /task/runWork): jobs are run by Celery
    workers, so a pass makes sure every job that should be queued is: due
    retries re-admitted, long-waiting retries promoted, lost messages sent."""
    return _compose([("wipe", repair_after_wipe), ("retry", retry_due),
                     ("promoted", promote_waiting_retries), ("republished", republish_stale_pending)])


def recover() -> Report:
    """The recovery pass: a wiped Redis, dead leases, overdue jobs, lost
    messages, gates, semaphore permits."""
    return _compose([("wipe", repair_after_wipe), ("leases", recover_expired_leases),
                     ("timeouts", time_out_overdue), ("republished", republish_stale_pending),
                     ("reconcile", reconcile_gates), ("permits", reclaim_dead_permits)])


def clean_work() -> Report:
    """One cleaner pass (seed: /task/cleanWork): cleanup, then recovery."""
    return _compose([("cleanup", cleanup), ("recover", recover)])
