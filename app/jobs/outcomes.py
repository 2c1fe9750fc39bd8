"""How an attempt ends when its call gives no answer to store: a failed attempt (retry_wait / failed), a busy
upstream (back to the queue), a call stopped because its job was ended by someone else, a call that ran into its
job's whole budget, a crash of our own bookkeeping.

Every state change goes through app.transitions with the attempt the worker claimed, each in its own statement;
its effects are not run here but noted in the caller's ``effects.Due`` (the worker's writer runs them with the
rest of its batch, app/jobs/slots.py: one dispatch step per model, which also refills the freed slots).  A
transition that lost its row (the job was canceled, timed out or recovered meanwhile) notes the call's end
instead: its permits, kept by whoever ended the job, go back at the call's real end.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

import redis

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra import metrics
from app.infra.db import atomic_statement
from app.infra.http.model_client import ModelCallError
from app.infra.redis import upstream
from app.jobs import dispatch, effects, stats, traces
from app.states import JobState, job_error
from app.tenancy import limits

log = logging.getLogger(__name__)


def backoff_seconds(attempt: int) -> float:
    s = get_settings()
    return min(s.retry_backoff_max_seconds, s.retry_backoff_seconds * (2 ** max(0, attempt - 1)))


def call_counted(conn, row) -> tuple:
    """One real call to the model service (asynch_model_stat), for the transition to carry."""
    return stats.call_counted(conn, clock_now().date(), row.tenant_id, row.creator, row.model_name)


def failed(due: effects.Due, row, attempt: int, error: str, ctx: dict, model, *, permanent: bool = False,
           counted: bool = False, detail: str | None = None) -> str:
    """A failed attempt; ``counted``: the model was called (counted with the transition).  ``error``: what the
    tenant sees; ``detail``: the internals (logs, admin views)."""
    spent = attempt - row.busy_count  # busy answers that came back unspent are no retries
    retry = not permanent and model is not None and spent <= model.retry_times  # permanent when the model is gone
    retry_at = clock_now() + timedelta(seconds=backoff_seconds(spent)) if retry else None
    began = time.time()
    with atomic_statement() as conn:
        won = due.add(transitions.fail_attempt(conn, row.id, attempt, error, retry_at=retry_at, detail=detail,
                                               alongside=call_counted(conn, row) if counted else None))
    if won is not None:  # retry_wait is no end: its write is a span all the same, and the retry's are new ones
        traces.written([won.row], began, time.time(), JobState(won.state).label)
    if won is None:
        log.info("attempt lost its job before failing", extra=ctx)
        due.call_ended(row.model_name, row.tenant_id, row.id, attempt)
        return "lost"
    retrying = won.state == JobState.RETRY_WAIT  # not terminal: the slot goes back, waiters keep waiting
    log.info("attempt failed, will retry: %s" if retrying else "job failed: %s", detail or error, extra=ctx)
    return "retry_wait" if retrying else "failed"


def busy_is_free(row) -> bool:
    """Whether a busy answer returns its job to the queue unspent: one of its tenant's free busy answers on
    the model (ASYNCH_UPSTREAM_BUSY_BUDGET, or the tenant's own ``busy_budget``), earned back one per done
    answer.  Spent out (or Redis away), it is an ordinary failed attempt: it spends a retry."""
    try:
        budget = limits.limits_of(row.tenant_id).busy_budget
    except Exception:  # the limits unreadable (the database busy): the default budget
        budget = None
    try:
        free = upstream.take_busy(row.model_name, row.tenant_id,
                                  get_settings().upstream_busy_budget if budget is None else budget)
    except redis.RedisError:
        free = False
    metrics.upstream_busy(row.model_name, row.tenant_id, bool(row.model_key), free)
    return free


def busy(due: effects.Due, row, attempt: int, exc: ModelCallError, model, ctx: dict) -> str:
    """The upstream answered busy: back to pending, at its tenant's head after a backoff (the answer's
    Retry-After, capped, else exponential with jitter); the effects tell the scope that received it (its
    credential, else its tenant) and charge the call's time to its tenant."""
    answer = dispatch.Busy(retry_after=upstream.capped(exc.retry_after),
                           delay=upstream.job_delay(exc.retry_after, row.busy_count + 1))
    with atomic_statement() as conn:
        error = job_error("model_busy", exc.public + ", queued again")
        won = due.add(transitions.return_busy(conn, row.id, attempt, error, busy_count=row.busy_count + 1,
                                              detail=str(exc), alongside=call_counted(conn, row)),
                      cap=model.max_concurrency, busy=answer)
    if won is None:
        log.info("attempt lost its job before going back to the queue", extra=ctx)
        due.call_ended(row.model_name, row.tenant_id, row.id, attempt)
        return "lost"
    log.info("model busy, back in the queue in %.1fs: %s", answer.delay, exc, extra=ctx)
    return "busy"


def stopped(due: effects.Due, row, attempt: int, exc: ModelCallError, ctx: dict) -> str:
    """Its job was ended by someone else (canceled, timed out, recovered) and the call stopped: nothing to write
    for the job; a call that reached the model is counted, whoever owns the row; its end is noted."""
    log.info("attempt stopped: %s", exc, extra=ctx)
    if exc.called:
        with atomic_statement() as conn:
            conn.execute(*call_counted(conn, row))
    due.call_ended(row.model_name, row.tenant_id, row.id, attempt)
    return "stopped"


def out_of_budget(due: effects.Due, row, attempt: int, ctx: dict) -> bool:
    """The call ran into its job's whole budget (deadline_at): the job ends timeout, as the cleanup pass would
    end it a moment later (False: not past it yet by the database's clock, or not ours: an ordinary timed-out
    attempt then)."""
    with atomic_statement() as conn:
        won = due.add(transitions.time_out(conn, row.id, now=clock_now()))
    if won is None:
        return False
    due.call_ended(row.model_name, row.tenant_id, row.id, attempt)  # the call is over: its permit back
    log.info("job out of budget during its call", extra=ctx)
    return True


def crashed(due: effects.Due, row, attempt: int, model, ctx: dict, exc: Exception) -> str:
    """A bug or an outage in our own bookkeeping: fail the attempt (retryable) rather than leave it running
    until its lease runs out."""
    log.error("attempt crashed", extra=ctx, exc_info=exc)
    try:
        return failed(due, row, attempt, job_error("internal_error", "internal error"), ctx, model,
                      detail=f"{type(exc).__name__}: {exc}")
    except Exception:
        log.exception("could not record the crashed attempt; recovery will", extra=ctx)
        return "lost"
