"""Periodic repairs that keep Redis and the broker derived from the rows
(docs/architecture.md, invariant 1), and the cleanup that ends a job's life.

Each function is safe to run from several beat instances or a manual trigger
at once: rows are taken in SKIP LOCKED batches and every change is a
transition CAS (or guarded DELETE), so a row is processed by one caller.
Jobs moved to pending are queued for dispatch after the commit, or a worker
could read the row before it is pending and drop the message.

The passes, as beat, the CLI and the HTTP triggers call them:
  run_work()   wipe repair, due retries, promotion of retries that waited
               too long, lost queue entries, dispatch   (seed: /task/runWork)
  recover()    wipe repair, dead leases, overdue jobs, lost queue entries,
               gates, dispatch (dead workers' permits, lost messages)
  cleanup()    expired claimed jobs, retention, overdue jobs
  clean_work() cleanup() + recover()                    (seed: /task/cleanWork)

The parts live in gates.py, retries.py, recovery.py and cleanup.py.
"""
from __future__ import annotations

from app.maintenance.cleanup import cleanup
from app.maintenance.gates import kick_dispatch, reconcile_gates
from app.maintenance.recovery import (
    recover_expired_leases,
    repair_after_wipe,
    republish_stale_pending,
    requeue_all_pending,
    time_out_overdue,
)
from app.maintenance.report import Report, compose
from app.maintenance.retries import promote_waiting_retries, retry_due

__all__ = ["Report", "clean_work", "cleanup", "kick_dispatch", "promote_waiting_retries", "recover",
           "recover_expired_leases", "reconcile_gates", "repair_after_wipe", "republish_stale_pending",
           "requeue_all_pending", "retry_due", "run_work", "time_out_overdue"]


def run_work() -> Report:
    """One worker pass (seed: /task/runWork): jobs are run by Celery
    workers, so a pass makes sure every job that should be queued is, and
    that the dispatcher is moving."""
    return compose([("wipe", repair_after_wipe), ("retry", retry_due),
                    ("promoted", promote_waiting_retries), ("republished", republish_stale_pending),
                    ("dispatched", kick_dispatch)])


def recover() -> Report:
    """The recovery pass: a wiped Redis, dead leases, overdue jobs, lost
    queue entries, gates, and the dispatcher (a dead worker's permits come
    back when their lease ends; dispatched jobs nobody claimed go back to
    their queue)."""
    return compose([("wipe", repair_after_wipe), ("leases", recover_expired_leases),
                    ("timeouts", time_out_overdue), ("republished", republish_stale_pending),
                    ("reconcile", reconcile_gates), ("dispatched", kick_dispatch)])


def clean_work() -> Report:
    """One cleaner pass (seed: /task/cleanWork): cleanup, then recovery."""
    return compose([("cleanup", cleanup), ("recover", recover)])
