"""One attempt of a job, on a worker: claim -> call the model -> store the
response -> done, or a failed attempt (retry_wait / failed).

Every state change goes through app.transitions with the attempt this
worker claimed, so a worker that lost its row (lease expired, canceled,
timed out) has its late writes refused and only cleans up after itself.
An upstream that answers busy (429/503) sends the attempt back to pending
("busy") after a backoff, spending no retry while its tenant has free busy
answers in hand (ASYNCH_UPSTREAM_BUSY_BUDGET, earned back one per done answer):
retries count ``attempt - busy_count``.
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta

import redis
from sqlalchemy import String, any_, bindparam, cast, select
from sqlalchemy.dialects.postgresql import ARRAY

from app import transitions
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.infra import metrics, secretbox
from app.infra.db import atomic_statement, single_statement
from app.infra.http.model_client import ModelCallError, call_model
from app.infra.process import PerProcess
from app.infra.redis import upstream
from app.infra.storage import StorageError, get_storage
from app.infra.tables import models, tasks
from app.jobs import calls, dispatch, effects, stats
from app.jobs.dispatch import CURRENT
from app.states import JobState, is_terminal, job_error
from app.tenancy import limits

log = logging.getLogger(__name__)


def backoff_seconds(attempt: int) -> float:
    s = get_settings()
    return min(s.retry_backoff_max_seconds, s.retry_backoff_seconds * (2 ** max(0, attempt - 1)))


INLINE = "inline:"  # the location of a result kept in its row


def run_attempt(job_id: str, attempt: int = CURRENT, worker: str | None = None) -> str:
    """A group of one (run_group): what came of the attempt a run_job(job_id, attempt) message stands for."""
    return run_group([(job_id, attempt)], worker)[0]


def run_group(jobs: list[tuple[str, int]], worker: str | None = None) -> list[str]:
    """Run the attempts a run_jobs message stands for, (job_id, attempt) each (``CURRENT``: whatever attempt
    the row is pending at).  Returns what came of each, in order ("stale", "expired", "done", "retry_wait",
    "failed", "lost", "busy"); a duplicate or outdated message's job is "stale", refused by the claim CAS.
    ``worker``: this Celery node (recovery watches its heartbeat).

    One read of the jobs with their models, then per model ONE claim statement for all of them and ONE
    dispatch step (each claim durable before any call); the calls run concurrently and their answers are
    written as they come, each batch of finished calls in ONE statement (``run_claimed_group``)."""
    jobs = list(dict(jobs).items())  # a job named twice runs once
    with single_statement() as conn:
        found = {r.id: r for r in conn.execute(_JOBS_WITH_MODEL, {"ids": [j for j, _ in jobs]})}
    out: dict[str, str] = {}
    claimable: dict[str, list] = {}
    for job_id, attempt in jobs:
        job = found.get(job_id)
        if job is None or job.state != JobState.PENDING or attempt not in (CURRENT, job.attempt):
            if job is not None and is_terminal(job.state):
                # Its queue entry came back after a slow or lost message
                # (requeue_unclaimed): nobody will claim it.
                effects.call_ended(job.task_model, job.tenant_id, job_id)
            out[job_id] = "stale"
        elif job.caller_deadline_at is not None and job.caller_deadline_at < clock_now():
            # Its caller's deadline passed while it waited: it ends expired, the model is never called.
            with effects.collecting() as due, single_statement() as conn:
                won = due.add(transitions.expire(conn, job_id, now=clock_now()))
            out[job_id] = "expired" if won is not None else "stale"
        else:
            claimable.setdefault(job.task_model, []).append(job)
    runnable = []
    for group in claimable.values():
        model = group[0] if group[0].model_id is not None else None
        lease_seconds = (model.timeout_seconds if model is not None else 60) + get_settings().lease_grace_seconds
        with single_statement() as conn:
            rows = transitions.claim_group(conn, [(j.id, j.attempt) for j in group],
                                           clock_now() + timedelta(seconds=lease_seconds), worker)
        out.update((j.id, "stale") for j in group)
        if rows:
            dispatch.claimed(rows[0].model_name, [(r.tenant_id, r.id) for r in rows], lease_seconds,
                             cap=model.max_concurrency if model is not None else 1)
            runnable += [(row, model, row.attempt) for row in rows]
    out.update(run_claimed_group(runnable))
    return [out[j] for j, _ in jobs]


# The jobs' pending-check fields and their model's whole row in one round trip
# (an outer join: a deleted model leaves model_id NULL).
_JOBS_WITH_MODEL = (
    select(tasks.c.id, tasks.c.state, tasks.c.attempt, tasks.c.tenant_id, tasks.c.model_name.label("task_model"),
           tasks.c.caller_deadline_at, models.c.id.label("model_id"),
           *[c for c in models.c if c.name not in ("id", "model_name")], models.c.model_name)
    .select_from(tasks.outerjoin(models, models.c.model_name == tasks.c.model_name))
    .where(tasks.c.id == any_(cast(bindparam("ids"), ARRAY(String))))
)


@dataclass(frozen=True)
class _Answer:
    """A call that answered, its result stored (or inline): what the writer turns into done."""
    row: object
    model: object
    done: transitions.Done
    ctx: dict


# The threads a pool process runs a group's calls on, kept (their keep-alive connections with them,
# app/infra/http/deadline.py: one pool per thread), started as a group first needs them: as many as
# its largest group, never a call queued behind another (the setting's ceiling, 64, bounds them).
# A group of one runs on the task's own thread.
# How long the writer waits, after a call of its group answers, for the others to answer too.  An instant
# model's answers arrive within ~1 ms of each other and took ~2 done statements per group without it
# (bench_e2e prints the count); a slow call holds back the others' ends by at most this.
_LINGER_SECONDS = 0.002
_calls = PerProcess(lambda: ThreadPoolExecutor(64, "asynch-call"), on_reset=lambda pool: pool.shutdown(wait=False))


def run_claimed_group(runnable: list[tuple]) -> dict[str, str]:
    """Run attempts this caller just claimed, (row, model: its model's row or None if gone, attempt) each:
    run_group above and the worker-less runWork pass (app/maintenance/passes.py run_once) share it.  The
    calls run at once; one writer (this thread) records the answers as they come, each batch of calls
    that finished together in ONE done statement, so no job's end waits for a slower one's."""
    if len(runnable) == 1:
        result = _call(*runnable[0])
        return result if isinstance(result, dict) else _write([result])
    out: dict[str, str] = {}
    pending = {_calls.get().submit(_call, *job) for job in runnable}
    while pending:
        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
        if pending:  # calls that end together are written together: one done statement, not one each
            more, pending = wait(pending, timeout=_LINGER_SECONDS)
            finished |= more
        results = [f.result() for f in finished]
        for r in results:
            if isinstance(r, dict):
                out.update(r)
        out.update(_write([r for r in results if isinstance(r, _Answer)]))
    return out


def _call(row, model, mine: int) -> _Answer | dict[str, str]:
    """Attempt ``mine`` of a claimed row: the model call and the result's upload.  An answer is returned for
    the writer; a failure is recorded here and its outcome returned ({job_id: outcome})."""
    settings = get_settings()
    ctx = {"job_id": row.id, "model": row.model_name, "tenant": row.tenant_id, "attempt": mine}
    if model is None:
        return {row.id: _fail(row, mine, job_error("model_not_configured", "model is no longer configured"), ctx,
                              None, permanent=True)}
    try:
        t0 = time.monotonic()
        # The call's deadline: the model's timeout, or the job's whole budget if that ends first.
        budget = (as_utc(row.deadline_at) - clock_now()).total_seconds() if row.deadline_at is not None else None
        timeout = model.timeout_seconds if budget is None else max(0.001, min(model.timeout_seconds, budget))
        try:
            with calls.running(row.id, mine) as abort:
                resp = call_model(base_url=model.base_url, route=model.route, http_method=model.http_method,
                                  head_msg=secretbox.decrypt(model.head_msg), model_key=row.model_key,
                                  payload=json.loads(row.request_payload),
                                  timeout_seconds=timeout, max_bytes=settings.max_result_bytes,
                                  job=(row.id, mine), model_key_headers=model.model_key_headers, abort=abort)
        except ModelCallError as exc:
            if exc.called:
                metrics.model_call(row.model_name, time.monotonic() - t0, False)
            if exc.stopped:  # its job was ended by someone else: nothing to write, the call's end to report
                log.info("attempt stopped: %s", exc, extra=ctx)
                if exc.called:  # it reached the model: counted, whoever owns the row
                    with atomic_statement() as conn:
                        conn.execute(*_call_counted(conn, row))
                effects.call_ended(row.model_name, row.tenant_id, row.id, mine)
                return {row.id: "stopped"}
            if exc.code == "model_timeout" and timeout < model.timeout_seconds and _out_of_budget(row, ctx):
                return {row.id: "timeout"}
            if exc.busy and settings.upstream_control and _busy_is_free(row, exc):
                return {row.id: _busy(row, mine, exc, model, ctx)}
            return {row.id: _fail(row, mine, job_error(exc.code, exc.public), ctx, model, permanent=exc.permanent,
                                  counted=exc.called, detail=str(exc))}
        metrics.model_call(row.model_name, time.monotonic() - t0, True)
        inline = resp.body if len(resp.body) <= settings.inline_result_limit else None
        location = INLINE  # kept in the row by the done write itself
        if inline is None:
            try:
                passthrough = json.loads(row.passthrough_headers) if getattr(row, "passthrough_headers", None) else None
                location = _upload(row.id, mine, resp.body, resp.content_type, passthrough, ctx)
            except StorageError as exc:
                return {row.id: _fail(row, mine, job_error("storage_error", "result upload failed"), ctx, model,
                                      counted=True, detail=f"result upload failed: {exc}")}
        return _Answer(row, model, transitions.Done(row.id, mine, location, resp.content_type, len(resp.body),
                                                    inline), ctx)
    except Exception as exc:
        return {row.id: _crashed(row, mine, model, ctx, exc)}


def _write(answers: list[_Answer]) -> dict[str, str]:
    """The writer: answered calls -> done, in ONE statement with their usage counts, attempt logs and outbox
    rows; the calls are counted whether or not each job is still ours (the model did the work)."""
    if not answers:
        return {}
    try:
        with effects.collecting() as due, atomic_statement() as conn:
            counts = Counter((a.row.tenant_id, a.row.creator, a.row.model_name) for a in answers)
            won = due.add_all(transitions.complete_group(conn, [a.done for a in answers],
                                                         alongside=stats.calls_counted(conn, clock_now().date(), counts)),
                              caps={a.row.model_name: a.model.max_concurrency for a in answers})
    except Exception as exc:
        return {a.row.id: _crashed(a.row, a.done.attempt, a.model, a.ctx, exc) for a in answers}
    ours = {m.row.id for m in won}
    out = {}
    for a in answers:
        if a.row.id in ours:
            log.info("job done", extra=a.ctx)
            out[a.row.id] = "done"
            continue
        # Canceled, timed out or recovered while we worked: not ours any more; the call's end frees its permit.
        effects.call_ended(a.row.model_name, a.row.tenant_id, a.row.id, a.done.attempt)
        if a.done.inline is None:
            try:
                get_storage().delete(a.done.location)
            except StorageError:
                log.warning("orphan result not deleted: %s", a.done.location)
        log.info("attempt lost its job before completing", extra=a.ctx)
        out[a.row.id] = "lost"
    return out


def _out_of_budget(row, ctx: dict) -> bool:
    """The call ran into its job's whole budget (deadline_at): the job ends timeout, as the cleanup pass would
    end it a moment later (False: not past it yet, or not ours: an ordinary timed-out attempt then)."""
    with effects.collecting() as due, atomic_statement() as conn:
        won = due.add(transitions.time_out(conn, row.id, now=clock_now()))
    if won is None:
        return False
    effects.call_ended(row.model_name, row.tenant_id, row.id, row.attempt)  # the call is over: its permit back
    log.info("job out of budget during its call", extra=ctx)
    return True


def _crashed(row, mine: int, model, ctx: dict, exc: Exception) -> str:
    """A bug or an outage in our own bookkeeping: fail the attempt (retryable)
    rather than leave it running until its lease runs out."""
    log.error("attempt crashed", extra=ctx, exc_info=exc)
    try:
        return _fail(row, mine, job_error("internal_error", "internal error"), ctx, model,
                     detail=f"{type(exc).__name__}: {exc}")
    except Exception:
        log.exception("could not record the crashed attempt; recovery will", extra=ctx)
        return "lost"


def _call_counted(conn, row) -> tuple:
    """One real call to the model service (asynch_model_stat), for the transition to carry."""
    return stats.call_counted(conn, clock_now().date(), row.tenant_id, row.creator, row.model_name)


def _upload(job_id: str, attempt: int, body: bytes, content_type: str, passthrough: dict | None, ctx: dict) -> str:
    """Store the response, retried here so the model is never called twice for
    one response.  ``passthrough``: the job's OSS headers (secrets: never logged)."""
    storage, tries = get_storage(), max(1, get_settings().upload_attempts)
    key = f"{clock_now():%Y/%m/%d}/{job_id}/{attempt}"
    for i in range(tries):
        try:
            return storage.put(key, body, content_type, context=passthrough)
        except StorageError as exc:
            log.warning("upload try %d failed: %s", i + 1, exc, extra=ctx)
            if i + 1 == tries:
                raise
            time.sleep(min(2.0, 0.2 * (2 ** i)))


def _fail(row, attempt: int, error: str, ctx: dict, model, *, permanent: bool = False, counted: bool = False,
          detail: str | None = None) -> str:
    """A failed attempt; ``counted``: the model was called (counted with the
    transition).  ``error``: what the tenant sees; ``detail``: the internals (logs, admin views)."""
    spent = attempt - row.busy_count  # busy answers that came back unspent are no retries
    retry = not permanent and spent <= model.retry_times  # permanent when the model is gone
    retry_at = clock_now() + timedelta(seconds=backoff_seconds(spent)) if retry else None
    with effects.collecting() as due, atomic_statement() as conn:
        won = due.add(transitions.fail_attempt(conn, row.id, attempt, error, retry_at=retry_at, detail=detail,
                                               alongside=_call_counted(conn, row) if counted else None))
    if won is None:
        log.info("attempt lost its job before failing", extra=ctx)
        effects.call_ended(row.model_name, row.tenant_id, row.id, attempt)
        return "lost"
    retrying = won.state == JobState.RETRY_WAIT  # not terminal: the slot goes back, waiters keep waiting
    log.info("attempt failed, will retry: %s" if retrying else "job failed: %s", detail or error, extra=ctx)
    return "retry_wait" if retrying else "failed"


def _busy_is_free(row, exc: ModelCallError) -> bool:
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


def _busy(row, attempt: int, exc: ModelCallError, model, ctx: dict) -> str:
    """The upstream answered busy: back to pending, at its tenant's head after a backoff (the answer's
    Retry-After, capped, else exponential with jitter); the effects tell the scope that received it (its
    credential, else its tenant) and charge the call's time to its tenant."""
    busy = dispatch.Busy(retry_after=upstream.capped(exc.retry_after),
                         delay=upstream.job_delay(exc.retry_after, row.busy_count + 1))
    with effects.collecting() as due, atomic_statement() as conn:
        error = job_error("model_busy", exc.public + ", queued again")
        won = due.add(transitions.return_busy(conn, row.id, attempt, error, busy_count=row.busy_count + 1,
                                              detail=str(exc), alongside=_call_counted(conn, row)),
                      cap=model.max_concurrency, busy=busy)
    if won is None:
        log.info("attempt lost its job before going back to the queue", extra=ctx)
        effects.call_ended(row.model_name, row.tenant_id, row.id, attempt)
        return "lost"
    log.info("model busy, back in the queue in %.1fs: %s", busy.delay, exc, extra=ctx)
    return "busy"
