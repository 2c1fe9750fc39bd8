"""Jobs as callers see them: submit, status, wait, result, cancel, list (batch submit: batch.py).

Submit order matters (invariants 1, 3, 4): the submission rule judges
everything first (app/jobs/submission.py: bad input never touches the gate),
then app/jobs/admission.py takes the gate slot, inserts the row (committed)
and only then hands the job to dispatch.  Any failure between the gate and
the commit gives the slot back.

Waiter caps: ``waiter_cap`` is the only place the number of concurrent
long-polls a tenant may hold on one API process is decided
(app/infra/wakeups.py enforces it, and ASYNCH_WAITERS_MAX, before any read).
The default answers the tenant's ``max_waiters`` (the limits cache), else
ASYNCH_WAITERS_PER_TENANT; a resolver runs on every wait, so it stays in memory.

The seed-002 batch status with claim (getTaskBatch): every done task a call
names moves to claimed through transitions.claim_results (one guarded
UPDATE: each task is claimed, its expire_at set, exactly once; ``claimed:
true`` in the one answer that did it).  Another tenant's ids are not found
and never touched.  Every done or claimed task named has its last_read_at
set (max_completed evicts the least recently read).

Reads never need a write: a result read (and a batch status's re-read of
claimed tasks) marks last_read_at at best (``mark_read``): with PostgreSQL
unable to write, the read still answers, and only the eviction order misses it.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import SQLAlchemyError

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.errors import Conflict, DomainError, Gone, NotFound, TooManyWaiters, Unavailable, ValidationFailed
from app.infra import metrics, tracing
from app.infra import wakeups as waiters
from app.infra.db import single_statement, transaction
from app.infra.http.netguard import Lookups
from app.infra.storage import ObjectMissing, StorageError, get_storage
from app.infra.tables import read_at, tasks
from app.jobs import admission, effects, estimates, submission
from app.jobs.requests import JobListQuery
from app.jobs.seed_schemas import SeedTask
from app.jobs.newjob import job_deadline, new_job_id, new_submission, retry_after_seconds  # noqa: F401 (re-exported)
from app.jobs.submission import SubmitOptions
from app.states import RESULT_STATES, JobState, is_terminal, parse_v1_filter, v1_name
from app.tenancy import limits
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)


_resolver: Callable[[Principal], int] | None = None


def set_waiter_cap_resolver(fn: Callable[[Principal], int] | None) -> None:
    """Install the resolver (tests: per-tenant caps); None restores the default."""
    global _resolver
    _resolver = fn


def waiter_cap(principal: Principal) -> int:
    """Concurrent waits ``principal``'s tenant may hold on this API process."""
    if _resolver is not None:
        return _resolver(principal)
    own = limits.limits_of(principal.tenant_id).max_waiters
    return own if own is not None else get_settings().waiters_per_tenant


@dataclass(frozen=True)
class Submitted:
    row: Row
    replayed: bool
    estimate: estimates.Estimate | None = None  # where the job stood in line when admitted


def find_idempotent(tenant_id: str, keys: set[str]) -> dict[str, Row]:
    """The tenant's jobs of these Idempotency-Keys, by key."""
    if not keys:
        return {}
    with transaction() as conn:
        rows = conn.execute(select(tasks).where(tasks.c.tenant_id == tenant_id,
                                                tasks.c.idempotency_key.in_(sorted(keys)))).all()
    return {r.idempotency_key: r for r in rows}


def replay(existing: Row | None, model: str, digest: str, face: submission.Face = submission.V1) -> Submitted:
    """The earlier job of an Idempotency-Key, or 422 for a different request under it
    (None: the winner of a race is unreadable, 503)."""
    if existing is None:
        raise Unavailable("database unavailable")
    if existing.model_name != model or existing.request_hash != digest:
        raise ValidationFailed("Idempotency-Key was already used with a different request", [
            {"pointer": face.pointer("idempotency_key"), "message": "reused with a different body"}])
    return Submitted(existing, replayed=True, estimate=estimates.of_job(existing))


def submit(principal: Principal, model_name: str, payload: Any, opts: SubmitOptions | dict | None = None,
           face: submission.Face = submission.V1) -> Submitted:
    """Judge (``opts``: a face's option values, or the options) and admit one job."""
    try:
        out = _submit(principal, submission.check(face, model_name, payload, opts if opts is not None else {},
                                                         Lookups(principal.tenant_id)), face)
    except DomainError as exc:
        metrics.job_rejected(model_name, exc)
        log.info("submission refused: %s", exc.message, extra={"model": model_name, "tenant": principal.tenant_id})
        raise
    if not out.replayed:
        metrics.job_admitted(model_name)
        log.info("job admitted", extra={"job_id": out.row.id, "model": model_name, "tenant": principal.tenant_id})
    return out


def _submit(principal: Principal, sub: submission.Checked, face: submission.Face) -> Submitted:
    key = sub.options.idempotency_key
    existing = find_idempotent(principal.tenant_id, {key}).get(key) if key else None
    if existing is None:
        pending = new_submission(principal, sub)
        try:
            # Estimate (a deadline judged before the gate: no slot, no row), gate, row and doorbell,
            # shared with whatever else arrives meanwhile (app/jobs/admission.py).
            return Submitted(admission.admit(pending), replayed=False, estimate=pending.estimate)
        except admission.IdempotencyConflict:
            # Lost a race with the same key: answer with the winner's job.
            existing = find_idempotent(principal.tenant_id, {key}).get(key)
    return replay(existing, sub.model.model_name, sub.digest, face)


def scoped(q, tenant: str | None, model_name: str | None = None):
    """``q`` over ``tenant``'s jobs (None: every tenant's), of ``model_name`` if given."""
    if tenant is not None:
        q = q.where(tasks.c.tenant_id == tenant)
    return q if model_name is None else q.where(tasks.c.model_name == model_name)


def load_job(conn: Connection, principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    """A job the principal may see; another tenant's job does not exist."""
    tenant = None if principal.is_admin else principal.tenant_id
    row = conn.execute(scoped(select(tasks, read_at()).where(tasks.c.id == job_id), tenant, model_name)).first()
    if row is None:
        raise NotFound(f"job not found: {job_id}")
    return row


def get_job(principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    with single_statement() as conn:  # one SELECT: no BEGIN/COMMIT round trips (status polls are hot)
        return load_job(conn, principal, job_id, model_name)


def read_result_row(principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    """get_job for a read of the result: a done/claimed job's last_read_at
    is set (a model's max_completed cap evicts the least recently read), at best."""
    row = get_job(principal, job_id, model_name)
    if JobState(row.state) in RESULT_STATES:
        mark_read(row.id)
    return row


def mark_read(*job_ids: str) -> None:
    """Best effort: a read never needs a write to succeed.  With PostgreSQL
    unable to write (its disk full, a read-only replica or transaction mode)
    the result is still served; only the eviction order misses this read."""
    try:
        with single_statement() as conn:
            transitions.mark_read(conn, list(job_ids), now=clock_now())
    except (DomainError, SQLAlchemyError) as exc:
        log.warning("last read of %d result(s) not recorded: %s", len(job_ids), str(exc).splitlines()[0][:200],
                    extra={"job_id": job_ids[0]})


def wait_job(principal: Principal, job_id: str, timeout_ms: int, model_name: str | None = None, watch=None) -> Row:
    """Return when the job is terminal or the budget ends (pending -> running
    does not end it): the waiter caps first (429, no read), one read (404), then the wait.
    ``watch``: the client's app.infra.serving.ClientWatch (ends it if the client leaves)."""
    return waiters.wait_for_terminal(job_id, timeout_ms / 1000.0, partial(get_job, principal, job_id, model_name),
                                     tenant=principal.tenant_id, tenant_cap=waiter_cap(principal), watch=watch)


def begin_wait(principal: Principal, job_id: str, model_name: str | None = None):
    """The first half of ``wait_job`` for a server that parks waits (app/infra/wakeups.py ``begin_wait``)."""
    return waiters.begin_wait(job_id, partial(get_job, principal, job_id, model_name), tenant=principal.tenant_id,
                              tenant_cap=waiter_cap(principal))


@dataclass(frozen=True)
class ResultBody:
    """A done job's result as served: ``data`` (the inline bytes, or chunks
    streamed from storage), or ``redirect`` (a presigned storage URL)."""
    row: Row
    content_type: str
    data: bytes | Iterator[bytes] = b""
    redirect: str | None = None


def result_body(principal: Principal, job_id: str, model_name: str | None = None) -> ResultBody:
    """Never the whole object in memory: a stored result is streamed (or
    redirected to a presigned URL: ASYNCH_RESULT_REDIRECT_SECONDS); a small one comes from the row."""
    row = read_result_row(principal, job_id, model_name)
    if JobState(row.state) not in RESULT_STATES:
        # A job that ended otherwise (failed, timeout, canceled, expired) is finished: it has no result.
        raise Conflict(f"job ended without a result (state: {v1_name(row.state)})" if is_terminal(row.state)
                       else f"job not finished (state: {v1_name(row.state)})")
    ctype = row.result_content_type or "application/octet-stream"
    if row.result_inline is not None:  # a small result kept in the row (app/jobs/execution.py)
        return ResultBody(row, ctype, bytes(row.result_inline))
    storage, seconds = get_storage(), get_settings().result_redirect_seconds
    try:
        url = storage.presign(row.result_location, seconds) if seconds > 0 else None
        if url:
            return ResultBody(row, ctype, redirect=url)
        return ResultBody(row, ctype, storage.stream(row.result_location))
    except ObjectMissing as exc:
        raise Gone(f"result no longer available: {job_id}") from exc
    except StorageError as exc:
        log.warning("result read failed: %s", exc, extra={"job_id": job_id})
        raise Unavailable("result storage unavailable") from exc


def whole(out: ResultBody) -> bytes:
    """All of a result's bytes at once (sync mode's inline result, the seed-000 envelope), a
    redirected one's read from storage: callers bound what they ask for, or accept its size."""
    if not out.redirect:
        return out.data if isinstance(out.data, bytes) else b"".join(out.data)
    try:
        return get_storage().get(out.row.result_location)
    except ObjectMissing as exc:
        raise Gone(f"result no longer available: {out.row.id}") from exc
    except StorageError as exc:
        log.warning("result read failed: %s", exc, extra={"job_id": out.row.id})
        raise Unavailable("result storage unavailable") from exc


def result_bytes(principal: Principal, job_id: str, model_name: str | None = None) -> tuple[bytes, str, Row]:
    """The whole result (callers that need it at once: sync mode, tests)."""
    out = result_body(principal, job_id, model_name)
    return whole(out), out.content_type, out.row


@dataclass(frozen=True)
class SyncOutcome:
    """A submission in sync mode: ``row`` is the newest copy seen (terminal
    when ``finished``); ``waited_s`` the wait honoured (None: not waited, the
    waiter caps were full); ``result`` the inline JSON result, if any."""
    submitted: Submitted
    row: Any
    finished: bool
    waited_s: int | None
    result: Any = None
    has_result: bool = False


def submit_and_wait(principal: Principal, model_name: str, payload: Any, opts: SubmitOptions | dict, wait_s: int,
                    watch=None) -> SyncOutcome:
    """Sync mode (``Prefer: wait=N``): submit, then wait up to ``wait_s`` s
    (capped by ASYNCH_WAIT_MAX_MS) on the long-poll path.  The job is admitted whatever the wait
    does: caps full means no wait (``waited_s`` None), never a refusal."""
    sub = submit(principal, model_name, payload, opts)
    wait_s = max(0, min(wait_s, get_settings().wait_max_ms // 1000))
    try:
        row = wait_job(principal, sub.row.id, wait_s * 1000, model_name, watch=watch) if wait_s > 0 else None
    except TooManyWaiters:
        row = None
    if row is None:
        return SyncOutcome(sub, sub.row, is_terminal(sub.row.state), None)
    if not is_terminal(row.state):
        return SyncOutcome(sub, row, False, wait_s)
    ctype = (row.result_content_type or "").split(";")[0].strip().lower()
    if (JobState(row.state) in RESULT_STATES and (ctype == "application/json" or ctype.endswith("+json"))
            and row.result_size is not None and row.result_size <= get_settings().sync_result_max_bytes):
        try:
            return SyncOutcome(sub, row, True, wait_s, json.loads(result_bytes(principal, row.id, model_name)[0]), True)
        except (DomainError, ValueError, UnicodeDecodeError):
            pass  # gone meanwhile, or not JSON after all: result_url says it
    return SyncOutcome(sub, row, True, wait_s)


def _end(principal: Principal, job_id: str, model_name: str | None, move) -> Row:
    """``move(conn, due)``: one guarded transition of a job the principal may
    see, handed to ``due``; 409 if it already ended."""
    with effects.collecting() as due, transaction() as conn:
        row = load_job(conn, principal, job_id, model_name)
        won = move(conn, due)
    if won is None:
        raise Conflict(f"job already finished (state: {v1_name(row.state)})")
    return won.row


def cancel_job(principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    tenant = None if principal.is_admin else principal.tenant_id
    return _end(principal, job_id, model_name, lambda conn, due: due.add(transitions.cancel(conn, job_id, tenant)))


def fail_job(principal: Principal, job_id: str, reason: str = "", model_name: str | None = None) -> Row:
    """An admin ends a pending, running or waiting-to-retry job as failed
    (seed 000: any non-terminal state can be ended)."""
    return _end(principal, job_id, model_name,
                lambda conn, due: due.add(transitions.fail_by_admin(conn, job_id, reason)))


def list_jobs(principal: Principal, query: JobListQuery, model_name: str | None = None) -> tuple[list[Row], str | None]:
    """A page of jobs, newest first (``query``: state, limit, cursor, tenant for admins, since, until)."""
    tenant = (query.tenant or None) if principal.is_admin else principal.tenant_id
    q = scoped(select(tasks, read_at()), tenant, model_name or None)
    if query.state:
        q = q.where(tasks.c.state.in_([int(x) for x in parse_v1_filter(query.state)]))
    if query.since is not None:
        q = q.where(tasks.c.created_at >= query.since)
    if query.until is not None:
        q = q.where(tasks.c.created_at < query.until)
    with single_statement() as conn:
        if query.cursor:
            # Only the caller's own jobs are cursors: another tenant's id must not
            # answer differently from an unknown one (that would confirm it exists).
            try:
                anchor = load_job(conn, principal, query.cursor)
            except NotFound:
                raise ValidationFailed("invalid query", [{"pointer": "/cursor", "message": "unknown cursor"}]) from None
            q = q.where(tuple_(tasks.c.created_at, tasks.c.id) < tuple_(anchor.created_at, anchor.id))
        rows = conn.execute(q.order_by(tasks.c.created_at.desc(), tasks.c.id.desc()).limit(query.limit + 1)).all()
    return rows[:query.limit], rows[query.limit - 1].id if len(rows) > query.limit else None


# What task_view reads: a batch fetches only these, never the payloads.
VIEW_COLUMNS = tuple(tasks.c[n] for n in ("id", "state", "result_location", "result_content_type", "expire_at",
                                         "model_name", "biz_name", "retry_count", "created_at", "finished_at", "error"))


def get_task_batch(principal: Principal, task_ids: list[str]) -> list[SeedTask]:
    """``task_ids`` as declared by TaskIds (at most ASYNCH_BATCH_MAX_IDS);
    duplicates are answered once, in order."""
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        return []
    tenant = None if principal.is_admin else principal.tenant_id
    with transaction() as conn:
        rows = {r.id: r for r in transitions.claim_results(conn, ids, tenant, returning=VIEW_COLUMNS)}
        claimed = set(rows)
        rest = [i for i in ids if i not in claimed]
        if rest:
            # Read after claiming: rows another call claimed meanwhile show as claimed.
            q = scoped(select(*VIEW_COLUMNS).where(tasks.c.id.in_(rest)), tenant)
            rows.update((r.id, r) for r in conn.execute(q))
            # A task that turned done between the claim and the read (a worker's commit, seen by this read's
            # newer snapshot) is claimed now: an answer never shows a done task this call did not claim.
            late = [i for i in rest if i in rows and rows[i].state == JobState.DONE]
            if late:
                more = {r.id: r for r in transitions.claim_results(conn, late, tenant, returning=VIEW_COLUMNS)}
                rows.update(more)
                claimed |= set(more)
    again = [i for i in ids if i in rows and i not in claimed and rows[i].state in RESULT_STATES]
    if again:
        mark_read(*again)
    return [SeedTask.from_row(rows[tid], tid in claimed) if tid in rows else SeedTask.not_found(tid) for tid in ids]
