"""One attempt of a job, on a worker: claimed (with its model's row) -> call the model -> store the response ->
an outcome the writer records: done, or how the attempt ended otherwise (app/jobs/outcomes.py).

The three steps of the worker path, each for a group (docs/architecture.md, "A slot per call"):
- ``claim``: the jobs a worker's free slots pulled (app/jobs/dispatch.py), ONE guarded statement for the group
  (each claim durable before any call), joined with their model's row; a job past its caller's deadline ends
  expired instead, one that is not pending at the pulled attempt any more is stale (its pulled permit back).
- ``call``: one attempt's call and upload, on a call slot's thread; what is not an answer is recorded at once
  (outcomes.py), its effects noted for the writer.
- ``write``: the answers of a batch of calls that ended together in ONE statement (done, with usage counts,
  attempt logs and outbox rows), then every effect of the batch in ONE dispatch step per model, which also
  takes, for the call slots the batch freed, the jobs the fair dispatcher picks then.

Every state change goes through app.transitions with the attempt the worker claimed, so a worker that lost its
row (lease expired, canceled, timed out) has its late writes refused and only cleans up after itself.
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import SimpleNamespace

from sqlalchemy import select

from app import transitions
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.errors import Unavailable
from app.infra import metrics, secretbox, tracing
from app.infra.db import atomic_statement, single_statement
from app.infra.http.model_client import ModelCallError, call_model, model_url
from app.infra.storage import StorageError, get_storage
from app.infra.tables import models, tasks
from app.jobs import calls, dispatch, effects, outcomes, output, references, stats, traces
from app.jobs.dispatch import CURRENT
from app.states import JobState, job_error

log = logging.getLogger(__name__)

INLINE = "inline:"  # the location of a result kept in its row
backoff_seconds = outcomes.backoff_seconds


@dataclass
class Attempt:
    """A claimed job: its row as the claim left it, its model's row (None: the model is gone), the attempt."""
    row: object
    model: object

    @property
    def number(self) -> int:
        return self.row.attempt

    @property
    def ctx(self) -> dict:
        return {"job_id": self.row.id, "model": self.row.model_name, "tenant": self.row.tenant_id,
                "attempt": self.row.attempt}


@dataclass
class Outcome:
    """What came of a call, for the writer: an answer to write (``done``), or the outcome already recorded
    (``result``) with its effects due (``due``)."""
    attempt: Attempt
    result: str = ""
    done: transitions.Done | None = None
    due: effects.Due = field(default_factory=effects.Due)


# --- claim ----------------------------------------------------------------------------------------------------

def lease_seconds(model) -> float:
    return (model.timeout_seconds if model is not None else 60) + get_settings().lease_grace_seconds


def _model_of(row):
    """The model row a claim_pulled row carries (its ``m_*`` columns), None if the model is gone."""
    if row.m_id is None:
        return None
    return SimpleNamespace(**{c.name: getattr(row, f"m_{c.name}") for c in models.c})


def claim(model_name: str, pulled: list[dispatch.Pulled], worker: str | None) -> tuple[list[Attempt], dict[str, str]]:
    """Claim the jobs free slots pulled, (tenant, job_id, attempt) each, in ONE statement (CAS pending at the
    pulled attempt -> running), with their model's row.  Returns (the attempts to call, what came of the rest:
    "expired", "stale").  The database away: every pulled job goes back to its queue's head, Unavailable."""
    if not pulled:
        return [], {}
    try:
        began = time.time()
        with single_statement() as conn:  # the model's row from the same statement: a model deleted or changed
            rows = transitions.claim_pulled(conn, [(j, a) for _t, j, a in pulled],  # a moment ago is seen so
                                            get_settings().lease_grace_seconds, worker)
        traces.claimed(rows, began, time.time())
    except Unavailable:
        with effects.collecting() as due:
            for tenant, job, _a in pulled:
                due.give_back(model_name, tenant, job)
        raise
    claimed = {r.id for r in rows}
    out, left = {}, [p for p in pulled if p[1] not in claimed]
    if left:
        out = _unclaimed(model_name, left)
    return [Attempt(row, _model_of(row)) for row in rows], out


def claim_given(jobs: list[tuple[str, int]], worker: str | None) -> tuple[list[Attempt], dict[str, str]]:
    """Claim jobs by id, (job_id, attempt or CURRENT) each, outside the queue (runWork, an in-process run): ONE
    statement per model, their permits taken for the lease (dispatch.claimed)."""
    jobs = list(dict(jobs).items())
    with single_statement() as conn:
        found = {r.id: r for r in conn.execute(select(tasks.c.id, tasks.c.attempt, tasks.c.state, tasks.c.model_name)
                                               .where(tasks.c.id.in_([j for j, _ in jobs])))}
    by_model: dict[str, list[tuple[str, str, int]]] = {}
    out: dict[str, str] = {}
    for job_id, attempt in jobs:
        row = found.get(job_id)
        if row is None or row.state != JobState.PENDING or attempt not in (CURRENT, row.attempt):
            out[job_id] = "stale"
        else:
            by_model.setdefault(row.model_name, []).append(("", job_id, row.attempt))
    attempts: list[Attempt] = []
    for model_name, group in by_model.items():
        got, rest = claim(model_name, group, worker)
        out.update(rest)
        if got:
            dispatch.claimed(model_name, [(a.row.tenant_id, a.row.id) for a in got], lease_seconds(got[0].model),
                             cap=got[0].model.max_concurrency if got[0].model is not None else 1)
        attempts += got
    return attempts, out


def _unclaimed(model_name: str, left: list[dispatch.Pulled]) -> dict[str, str]:
    """Pulled jobs the claim refused: past their caller's deadline (-> expired, never run), or no longer pending
    at the pulled attempt (stale: ended meanwhile); their pulled permits go back (also as "<job>#<attempt>": a
    cancel between the pull and the claim kept it for a call that never started)."""
    with single_statement() as conn:
        rows = {r.id: r for r in conn.execute(select(tasks.c.id, tasks.c.state, tasks.c.caller_deadline_at)
                                              .where(tasks.c.id.in_([j for _t, j, _a in left])))}
    out = {}
    with effects.collecting() as due:
        for tenant, job, attempt in left:
            row = rows.get(job)
            won = None
            if row is not None and row.state == JobState.PENDING and row.caller_deadline_at is not None \
                    and as_utc(row.caller_deadline_at) < clock_now():
                # Its caller's deadline passed while it waited: it ends expired, the model is never called.
                with single_statement() as conn:
                    won = due.add(transitions.expire(conn, job, now=clock_now()))
            out[job] = "expired" if won is not None else "stale"
            if won is None:
                due.call_ended(model_name, tenant, job)
            due.call_ended(model_name, tenant, job, attempt)
    return out


def models_of(job_ids: list[str]) -> list[str]:
    """The models of these jobs (a release's run_jobs message answered as its model's doorbell)."""
    with single_statement() as conn:
        return sorted(set(conn.execute(select(tasks.c.model_name).where(tasks.c.id.in_(job_ids))).scalars()))


# --- call -----------------------------------------------------------------------------------------------------

def call(a: Attempt) -> Outcome:
    """Attempt ``a``'s model call and the result's upload (a call slot's thread).  An answer is returned for the
    writer; anything else is recorded here (outcomes.py) and its effects noted in the outcome's ``due``."""
    settings, row, model, mine, ctx = get_settings(), a.row, a.model, a.number, a.ctx
    out = Outcome(a)
    if model is None:
        out.result = outcomes.failed(out.due, row, mine, job_error("model_not_configured", "model is no longer "
                                     "configured"), ctx, None, permanent=True)
        return out
    try:
        t0 = time.monotonic()
        log.debug("calling the model")  # the job's fields: bound by the caller (app/jobs/slots.py)
        # The call's deadline: the model's timeout, or the job's whole budget if that ends first.
        budget = (as_utc(row.deadline_at) - clock_now()).total_seconds() if row.deadline_at is not None else None
        timeout = model.timeout_seconds if budget is None else max(0.001, min(model.timeout_seconds, budget))
        live = output.Forwarder(row.id, mine) if getattr(model, "streaming", False) else None
        complete = False
        try:
            with calls.running(row.id, mine) as abort, tracing.client_call(
                    "asynch.model_call", row, model.http_method, model_url(model)) as traced:
                resp = call_model(base_url=model.base_url, route=model.route, http_method=model.http_method,
                                  head_msg=secretbox.decrypt(model.head_msg), model_key=row.model_key,
                                  **references.call_input(row),
                                  timeout_seconds=timeout, max_bytes=settings.max_result_bytes,
                                  job=(row.id, mine), model_key_headers=model.model_key_headers, abort=abort,
                                  stream=None if live is None else lambda ctype: live.piece if live.start(ctype) else None,
                                  trace_headers=traced.headers)
                traced.answered(resp.status)
            complete = True
        except ModelCallError as exc:
            if exc.called:
                metrics.model_call(row.model_name, time.monotonic() - t0, False)
            if exc.stopped:
                out.result = outcomes.stopped(out.due, row, mine, exc, ctx)
            elif exc.code == "model_timeout" and timeout < model.timeout_seconds and \
                    outcomes.out_of_budget(out.due, row, mine, ctx):
                out.result = "timeout"
            elif exc.busy and settings.upstream_control and outcomes.busy_is_free(row):
                out.result = outcomes.busy(out.due, row, mine, exc, model, ctx)
            else:
                out.result = outcomes.failed(out.due, row, mine, job_error(exc.code, exc.public), ctx, model,
                                             permanent=exc.permanent, counted=exc.called, detail=str(exc))
            return out
        finally:
            if live is not None:
                live.close(complete)
        metrics.model_call(row.model_name, time.monotonic() - t0, True)
        inline = resp.body if len(resp.body) <= settings.inline_result_limit else None
        location = INLINE  # kept in the row by the done write itself
        if inline is None:
            try:
                passthrough = json.loads(row.passthrough_headers) if getattr(row, "passthrough_headers", None) else None
                with tracing.span("asynch.storage", row, {"asynch.result.bytes": len(resp.body)}):
                    location = _upload(row.id, mine, resp.body, resp.content_type, passthrough, ctx)
            except StorageError as exc:
                out.result = outcomes.failed(out.due, row, mine, job_error("storage_error", "result upload failed"),
                                             ctx, model, counted=True, detail=f"result upload failed: {exc}")
                return out
        out.done = transitions.Done(row.id, mine, location, resp.content_type, len(resp.body), inline)
    except Exception as exc:
        out.result = outcomes.crashed(out.due, row, mine, model, ctx, exc)
    return out


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


# --- write ----------------------------------------------------------------------------------------------------

def write(batch: list[Outcome], refill: dict[str, tuple[int, float]] | None = None) -> tuple[dict[str, str], dict]:
    """The writer: a batch of ended calls.  Their answers -> done in ONE statement with their usage counts,
    attempt logs and outbox rows (the calls are counted whether or not each job is still ours: the model did
    the work); then every effect of the batch (the answers', the other outcomes') in ONE dispatch step per model,
    which takes, for ``refill`` (model -> (the call slots this batch freed, their calls' lease)), the jobs the
    ring picks now.
    Returns (job id -> what came of it, model -> the jobs pulled)."""
    out: dict[str, str] = {o.attempt.row.id: o.result for o in batch if o.done is None}
    with effects.collecting(refill=refill) as due:
        for o in batch:
            due.extend(o.due)
            due.ended.extend(o.due.ended)
        answers = [o for o in batch if o.done is not None]
        if answers:
            out.update(_write_answers(answers, due))
    return out, due.pulled


def _write_answers(answers: list[Outcome], due: effects.Due) -> dict[str, str]:
    try:
        began = time.time()
        with atomic_statement() as conn:
            counts = Counter((o.attempt.row.tenant_id, o.attempt.row.creator, o.attempt.row.model_name)
                             for o in answers)
            won = due.add_all(transitions.complete_group(conn, [o.done for o in answers],
                                                         alongside=stats.calls_counted(conn, clock_now().date(), counts)),
                              caps={o.attempt.row.model_name: o.attempt.model.max_concurrency for o in answers})
    except Exception as exc:
        return {o.attempt.row.id: outcomes.crashed(due, o.attempt.row, o.done.attempt, o.attempt.model,
                                                   o.attempt.ctx, exc) for o in answers}
    ours = {m.row.id for m in won}
    traces.written([m.row for m in won], began, time.time(), "done")
    out = {}
    for o in answers:
        row, done = o.attempt.row, o.done
        if row.id in ours:
            log.info("job done", extra=o.attempt.ctx)
            out[row.id] = "done"
            continue
        # Canceled, timed out or recovered while we worked: not ours any more; the call's end frees its permit.
        due.call_ended(row.model_name, row.tenant_id, row.id, done.attempt)
        if done.inline is None:
            try:
                get_storage().delete(done.location)
            except StorageError:
                log.warning("orphan result not deleted: %s", done.location)
        log.info("attempt lost its job before completing", extra=o.attempt.ctx)
        out[row.id] = "lost"
    return out


# --- here and now: runWork, one job in process ----------------------------------------------------------------

# How long the writer waits, after a call of its batch ends, for the others to end too.  An instant
# model's answers arrive within ~1 ms of each other and took ~2 done statements per group without it
# (bench_e2e prints the count); a slow call holds back the others' ends by at most this.
LINGER_SECONDS = 0.002


def run_claimed(attempts: list[Attempt]) -> dict[str, str]:
    """Run attempts this caller claimed, here (the worker-less runWork pass; one job in process): the calls at
    once, on threads of their own; this thread writes the outcomes as they come, each batch of calls that ended
    together in ONE done statement.  No refill: nothing more is pulled.  Returns job id -> what came of it."""
    if len(attempts) <= 1:
        return write([call(a) for a in attempts])[0]
    out: dict[str, str] = {}
    with ThreadPoolExecutor(len(attempts), "asynch-call-here") as pool:
        pending = {pool.submit(call, a) for a in attempts}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            if pending:
                more, pending = wait(pending, timeout=LINGER_SECONDS)
                finished |= more
            out.update(write([f.result() for f in finished])[0])
    return out


def run_group(jobs: list[tuple[str, int]], worker: str | None = None) -> list[str]:
    """Claim jobs by id, (job_id, attempt or CURRENT) each, and run them here (``claim_given``, ``run_claimed``).
    What came of each, in order ("stale", "expired", "done", "retry_wait", "failed", "lost", "busy", "stopped",
    "timeout")."""
    attempts, out = claim_given(jobs, worker)
    out.update(run_claimed(attempts))
    return [out[j] for j, _ in dict(jobs).items()]


def run_attempt(job_id: str, attempt: int = CURRENT, worker: str | None = None) -> str:
    """A group of one (``run_group``)."""
    return run_group([(job_id, attempt)], worker)[0]
