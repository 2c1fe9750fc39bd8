"""The worker path's spans of a job (app/infra/tracing.py has the contexts and the SDK): its queue wait and
its claim, recorded after the claim statement; its terminal write, after the statement that made it.  Kept
here, beside app/jobs/execution.py, so the worker path calls one function per step and pays one boolean
when tracing is off.

Invariants: only reads the rows it is given (the claim's and the write's RETURNING rows, which carry the
job's trace context); never raises (tracing.record swallows and logs).
"""
from __future__ import annotations

from datetime import datetime

from app.clock import as_utc
from app.infra import tracing


def wait_reasons(row) -> list[str]:
    """What the row says held this attempt in the queue (app/jobs/waiting.py's names): a retry's backoff, the
    upstream's busy answers; always, at the end, a worker's free slot."""
    return ([*(["retry_backoff"] if row.retry_count else []), *(["upstream_paused"] if row.busy_count else []),
             "no_worker"])


def claimed(rows, began: float, ended: float) -> None:
    """Each claimed attempt's queue wait (from its admission, or for a later attempt from its queue time, to
    its claim) and its claim statement."""
    if not tracing.enabled():
        return
    for row in rows:
        start = as_utc(row.created_at if row.attempt <= 1 else row.enqueue_at)
        at = as_utc(row.started_at) if row.started_at is not None else datetime.fromtimestamp(began).astimezone()
        tracing.record("asynch.queue_wait", row, min(start, at), at, {
            "asynch.wait.reasons": wait_reasons(row), "asynch.wait.seconds": max(0.0, (at - start).total_seconds()),
            "asynch.retries": row.retry_count, "asynch.busy_answers": row.busy_count, "asynch.priority": row.priority,
            "asynch.worker": row.worker})
        tracing.record("asynch.claim", row, began, ended, {"asynch.worker": row.worker})


def written(rows, began: float, ended: float, state: str) -> None:
    """The terminal write of each row (the statement that moved it to ``state``)."""
    tracing.record_many("asynch.terminal_write", rows, began, ended, {"asynch.state": state})
