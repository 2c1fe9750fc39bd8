"""Periodic repairs that keep Redis and the broker derived from the rows
(docs/architecture.md, invariant 1), and the cleanup that ends a job's life.

Each function is safe to run from several beat instances or a manual trigger
at once: rows are taken in SKIP LOCKED batches and every change is a
transition CAS (or guarded DELETE), so a row is processed by one caller.
Jobs moved to pending are queued for dispatch after the commit, or a worker
could read the row before it is pending and drop the message.

The passes (beat, the CLI and the HTTP triggers call them) are below, each
the list of its parts; the parts live in retries.py, recovery.py and
run_once.py.  Cleanup, the pass at the end of a job's life, is here: what
retention (app/jobs/retention.py, its invariants) deletes, for every model --
submits to a capped model evict first, this is the backstop -- then jobs past
their budget (pending, running, retry_wait) time out.
"""
from __future__ import annotations

from sqlalchemy import select

from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.tables import models
from app.jobs import retention
from app.maintenance.recovery import (expire_past_deadline, kick_dispatch, reconcile_gates, recover_dead_workers,
                                      recover_expired_leases, repair_after_wipe, republish_stale_pending,
                                      requeue_all_pending, time_out_overdue)
from app.maintenance.report import Report, batch_size, compose
from app.maintenance.retries import promote_waiting_retries, retry_due
from app.maintenance.run_once import run_once

__all__ = ["Report", "clean_work", "cleanup", "expire_past_deadline", "kick_dispatch", "promote_waiting_retries",
           "recover", "recover_dead_workers", "recover_expired_leases", "reconcile_gates", "repair_after_wipe",
           "republish_stale_pending", "requeue_all_pending", "retry_due", "run_once", "run_work", "time_out_overdue"]


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
