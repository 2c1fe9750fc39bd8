"""Retention: terminal jobs hard-deleted with their stored results -- by
time (claimed past expire_at, done after ASYNCH_DONE_RETENTION_SECONDS, the
other ends after ASYNCH_FAILED_RETENTION_SECONDS) and, for a model with
max_completed > 0, its least recently read done/claimed jobs beyond that
many.  The periodic cleanup (app/maintenance/passes.py) runs it for
everything; a submit to a capped model runs it for that model first.

Invariants:
- Objects first, rows after, under the rows' locks (SKIP LOCKED): a row
  whose object could not be deleted stays for the next pass; a row goes only
  while still what it was judged (``transitions.purge_many``'s guard).
- The cap is counted and evicted under the model's advisory lock: never the
  same excess twice; a submit that finds the lock taken skips.
- At admission the work is bounded (``AT_ADMISSION`` rows per kind), found
  through indexes, never a scan; the periodic pass does the rest.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Iterable, Sequence

from sqlalchemy import func, select

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.storage import get_storage
from app.infra.tables import tasks
from app.jobs.execution import INLINE
from app.states import RESULT_STATES, JobState

log = logging.getLogger(__name__)

AT_ADMISSION = 64  # rows per kind one batch of submissions may evict for a model
_LAST_READ = func.coalesce(tasks.c.last_read_at, tasks.c.finished_at)
_EVICT_LOCK = "asynch-evict:"  # + model: pg advisory lock (hashtext) held while a cap is counted and evicted


def expiry_kinds(now) -> tuple:
    """(name, states, time column, before): what has served its time."""
    s = get_settings()
    return (
        ("claimed", [JobState.CLAIMED], tasks.c.expire_at, now),
        ("failed", [JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED, JobState.EXPIRED], tasks.c.finished_at,
         now - timedelta(seconds=s.failed_retention_seconds)),
        ("done", [JobState.DONE], tasks.c.finished_at, now - timedelta(seconds=s.done_retention_seconds)),
    )


def purge_batch(states: Sequence[JobState], older_than, before, limit: int, where: Sequence = (),
                conn=None) -> tuple[int, int, int, int]:
    """Delete one SKIP LOCKED batch, oldest ``older_than`` first: the objects
    (in bulk), then the rows whose object is gone, in ``conn``'s transaction or a new one.
    Returns (rows seen, rows deleted, objects deleted, object errors)."""
    if conn is None:
        with transaction() as conn:
            return purge_batch(states, older_than, before, limit, where, conn)
    rows = conn.execute(select(tasks.c.id, tasks.c.result_location).where(
        tasks.c.state.in_([int(x) for x in states]), older_than < before, *where,
    ).order_by(older_than).limit(limit).with_for_update(skip_locked=True, of=tasks)).all()
    # A result kept in its row (location "inline:") goes with the row.
    locations = [r.result_location for r in rows if r.result_location and r.result_location != INLINE]
    failed = get_storage().delete_many(locations) if locations else {}
    for r in rows:
        if r.result_location in failed:
            log.warning("result not deleted, keeping the job for the next pass: %s",
                        failed[r.result_location], extra={"job_id": r.id})
    ids = [r.id for r in rows if r.result_location not in failed]
    deleted = len(transitions.purge_many(conn, ids, states, older_than, before)) if ids else 0
    return len(rows), deleted, len(locations) - len(failed), len(failed)


def evict_over_cap(model: str, cap: int, limit: int, wait: bool = True) -> tuple[int, int, int, int]:
    """One round of ``model``'s max_completed: the least recently read done
    and claimed jobs beyond ``cap``, at most ``limit``, under the model's
    advisory lock (``wait`` False: skip when another holds it)."""
    with transaction() as conn:
        key = func.hashtext(_EVICT_LOCK + model)
        lock = func.pg_advisory_xact_lock(key) if wait else func.pg_try_advisory_xact_lock(key)
        if conn.execute(select(lock)).scalar() is False:
            return 0, 0, 0, 0
        mine = tasks.c.model_name == model
        done = tasks.c.state.in_([int(x) for x in RESULT_STATES])
        kept = conn.execute(select(func.count()).where(mine, done)).scalar_one()
        if kept <= cap:
            return 0, 0, 0, 0
        # now + 1 s: every completed row qualifies for the guard; the order is the least recently read.
        return purge_batch(RESULT_STATES, _LAST_READ, clock_now() + timedelta(seconds=1), min(kept - cap, limit),
                           where=[mine], conn=conn)


def at_admission(caps: Iterable[tuple[str, int]]) -> None:
    """Before a batch's gate step: each capped model's expired jobs, then its
    excess, bounded; best effort (logged, the submissions go on)."""
    for model, cap in caps:
        try:
            for _name, states, col, before in expiry_kinds(clock_now()):
                purge_batch(states, col, before, AT_ADMISSION, where=[tasks.c.model_name == model])
            evict_over_cap(model, cap, AT_ADMISSION, wait=False)
        except Exception as exc:  # noqa: BLE001 (never fail a submission for its eviction)
            log.warning("eviction at admission failed (the periodic cleanup will do it): %s", exc,
                        extra={"model": model})
