"""Periodic repairs that keep Redis and the broker derived from the rows
(docs/architecture.md, invariant 1), and the cleanup that ends a job's life.

Each function is safe to run from several beat instances or a manual trigger
at once: rows are taken in SKIP LOCKED batches and every change is a
transition CAS (or guarded DELETE), so a row is processed by one caller.
Jobs moved to pending are queued for dispatch after the commit, or a worker
could read the row before it is pending and drop the message.

The passes (beat, the CLI and the HTTP triggers call them) are below, each
the list of its parts; the parts live in gates.py, retries.py, recovery.py,
cleanup.py and run_once.py.
"""
from __future__ import annotations

from app.maintenance.cleanup import cleanup
from app.maintenance.gates import kick_dispatch, reconcile_gates
from app.maintenance.recovery import (expire_past_deadline, recover_dead_workers, recover_expired_leases,
                                      repair_after_wipe, republish_stale_pending, requeue_all_pending, time_out_overdue)
from app.maintenance.report import Report, compose
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
