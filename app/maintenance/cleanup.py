"""Cleanup: the end of a job's life.  Claimed jobs past expire_at (the
model's auto_clean_seconds after the batch claim), failed/timeout/canceled
jobs after ASYNCH_FAILED_RETENTION_SECONDS and done jobs nobody claimed
after ASYNCH_DONE_RETENTION_SECONDS are hard-deleted with their stored
results; a model with max_completed > 0 keeps at most that many done and
claimed jobs, the least recently read (last_read_at, else finished_at)
deleted first (seed 000's async_max_completed); then jobs past their budget
(pending, running, retry_wait) time out."""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Sequence

from sqlalchemy import func, select

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.storage import get_storage
from app.infra.tables import models, tasks
from app.jobs.execution import INLINE
from app.maintenance.recovery import time_out_overdue
from app.maintenance.report import Report, batch_size, locked
from app.states import JobState

log = logging.getLogger(__name__)


def _purge_batch(states: Sequence[JobState], older_than, before, limit: int,
                 where: Sequence = ()) -> tuple[int, int, int, int]:
    """Delete one SKIP LOCKED batch: the stored objects first (in bulk), then
    the rows whose object is gone (one guarded DELETE).  Holding the row locks
    while deleting the objects is what makes two cleanups delete each object
    once.  Returns (rows seen, rows deleted, objects deleted, object errors)."""
    with transaction() as conn:
        rows = conn.execute(locked(conn, select(tasks.c.id, tasks.c.result_location).where(
            tasks.c.state.in_([int(x) for x in states]), older_than < before, *where,
        ).order_by(older_than).limit(limit))).all()
        # A result kept in its row (location "inline:") goes with the row.
        locations = [r.result_location for r in rows if r.result_location and r.result_location != INLINE]
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
    claim), failed/timeout/canceled/expired jobs after ASYNCH_FAILED_RETENTION_SECONDS,
    done jobs nobody claimed after ASYNCH_DONE_RETENTION_SECONDS.  Then
    pending/running jobs past their budget become timeout."""
    s = get_settings()
    now = clock_now()
    n = batch_size(limit)
    rep = Report(details={"claimed": 0, "failed": 0, "done": 0, "objects": 0, "object_errors": 0})
    kinds = (
        ("claimed", [JobState.CLAIMED], tasks.c.expire_at, now),
        ("failed", [JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED, JobState.EXPIRED], tasks.c.finished_at,
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
    rep.details["evicted"] = 0
    for model_name, cap in _capped_models():
        while True:
            with transaction() as conn:
                kept = conn.execute(select(func.count()).where(
                    tasks.c.model_name == model_name, tasks.c.state.in_(_COMPLETED))).scalar_one()
            over = kept - cap
            if over <= 0:
                break
            # The least recently read first; now + 1 s: every completed row qualifies.
            seen, deleted, objects, errors = _purge_batch(
                [JobState.DONE, JobState.CLAIMED], _LAST_READ, now + timedelta(seconds=1), min(over, n),
                where=[tasks.c.model_name == model_name])
            rep.details["evicted"] += deleted
            rep.details["objects"] += objects
            rep.details["object_errors"] += errors
            if deleted == 0:
                break
    timeouts = time_out_overdue(limit)
    rep.details["timeouts"] = timeouts.processed
    rep.processed = (rep.details["claimed"] + rep.details["failed"] + rep.details["done"] + rep.details["evicted"]
                     + timeouts.processed)
    return rep


_COMPLETED = [int(JobState.DONE), int(JobState.CLAIMED)]
_LAST_READ = func.coalesce(tasks.c.last_read_at, tasks.c.finished_at)


def _capped_models() -> list[tuple[str, int]]:
    with transaction() as conn:
        return [(r.model_name, r.max_completed) for r in conn.execute(
            select(models.c.model_name, models.c.max_completed).where(models.c.max_completed > 0))]
