"""Jobs as callers see them: submit, status, wait, result, cancel, list.

Submit order matters (invariants 1, 3, 4): validate everything first (bad
input never touches the gate), take a gate slot, insert the row, commit, and
only then publish the doorbell.  Any failure between the gate and the commit
gives the slot back.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import and_, insert, or_, select
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from app import transitions
from app.catalog.forms import validate_payload
from app.catalog.registry import enabled_model
from app.clock import now as clock_now
from app.config import get_settings
from app.errors import (
    BadRequest,
    Conflict,
    DomainError,
    Gone,
    JobNotFinished,
    NotFound,
    QueueFull,
    TenantQueueFull,
    Unavailable,
    ValidationFailed,
)
from app.infra import metrics
from app.infra import wakeups as waiters
from app.infra.db import single_statement, transaction
from app.infra.http.netguard import callback_url_problem
from app.infra.redis import gate
from app.infra.storage import ObjectMissing, get_storage
from app.infra.tables import tasks
from app.jobs import dispatch, outbox
from app.jobs.schemas import JobListQuery, SubmitOptions
from app.jobs.waitcaps import waiter_cap
from app.states import JobState, parse_v1_filter, v1_name
from app.tenancy import limits
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)


# Built once: values arrive as parameters, so each admission skips building
# and cache-keying a 20-value statement (bench/bench_admission.py).
_INSERT_JOB = insert(tasks).returning(*tasks.c)


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Submitted:
    row: Row
    replayed: bool


def request_hash(model: str, payload: Any, opts: SubmitOptions) -> str:
    canon = json.dumps([model, payload, opts.biz_name, opts.callback_url, opts.model_key],
                       sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def retry_after_seconds(model_row) -> int:
    # About one job's turn at the model's concurrency; bounded to be useful.
    per_slot = model_row.expected_seconds / max(1, model_row.max_concurrency)
    return int(min(300, max(1, math.ceil(per_slot))))


def job_deadline(model_row, created):
    """The job's whole budget: every allowed attempt at its full model timeout
    plus lease grace, plus the queue allowance.  Past it: timeout."""
    s = get_settings()
    attempts = model_row.retry_times + 1
    return created + timedelta(seconds=attempts * (model_row.timeout_seconds + s.lease_grace_seconds)
                               + s.job_queue_budget_seconds)


def _find_idempotent(conn: Connection, tenant_id: str, key: str) -> Row | None:
    return conn.execute(select(tasks).where(tasks.c.tenant_id == tenant_id,
                                            tasks.c.idempotency_key == key)).first()


def _replay(existing: Row, model: str, digest: str) -> Submitted:
    if existing.model_name != model or existing.request_hash != digest:
        raise ValidationFailed("Idempotency-Key was already used with a different request",
                               [{"pointer": "/Idempotency-Key", "message": "reused with a different body"}])
    return Submitted(existing, replayed=True)


def _check_callback(opts: SubmitOptions) -> None:
    """The callback target must be public (the SSRF guard); the rest of the
    options were judged by their declaration (app/jobs/schemas.py)."""
    if opts.callback_url is not None:
        problem = callback_url_problem(opts.callback_url)
        if problem:
            raise ValidationFailed("invalid job options", [{"pointer": "/callbackUrl", "message": problem}])


def submit(principal: Principal, model_name: str, payload: Any, opts: SubmitOptions | None = None) -> Submitted:
    opts = opts if opts is not None else SubmitOptions()
    try:
        out = _submit(principal, model_name, payload, opts)
    except DomainError as exc:
        metrics.job_rejected(model_name, exc)
        log.info("submission refused: %s", exc.message,
                 extra={"model": model_name, "tenant": principal.tenant_id})
        raise
    if not out.replayed:
        metrics.job_admitted(model_name)
        log.info("job admitted", extra={"job_id": out.row.id, "model": model_name, "tenant": principal.tenant_id})
    return out


def _submit(principal: Principal, model_name: str, payload: Any, opts: SubmitOptions) -> Submitted:
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    _check_callback(opts)
    model = enabled_model(model_name)
    validate_payload(model.form, payload, opts.pointer_base)
    digest = request_hash(model_name, payload, opts)
    if opts.idempotency_key:
        with transaction() as conn:
            existing = _find_idempotent(conn, principal.tenant_id, opts.idempotency_key)
        if existing is not None:
            return _replay(existing, model_name, digest)

    job_id = new_job_id()
    tenant = principal.tenant_id
    try:
        decision = gate.gate_admit(model_name, tenant, job_id, model.queue_limit,
                                   limits.tenant_queue_cap(tenant, model))
    except redis.RedisError as exc:
        raise Unavailable("admission gate unavailable") from exc
    if not decision.admitted:
        if decision.refused_by == "tenant":
            raise TenantQueueFull(tenant, decision.limit, retry_after_seconds(model))
        raise QueueFull(decision.limit, retry_after_seconds(model))

    # From here on we hold a slot: every way out but a commit gives it back.
    try:
        now = clock_now()
        # One statement, its own transaction: one round trip (no BEGIN/COMMIT).
        with single_statement() as conn:
            row = conn.execute(_INSERT_JOB, dict(
                id=job_id, tenant_id=principal.tenant_id, creator=opts.creator,
                model_name=model_name, biz_name=opts.biz_name, callback_url=opts.callback_url,
                model_key=opts.model_key, request_payload=json.dumps(payload, ensure_ascii=False), request_hash=digest,
                passthrough_headers=json.dumps(opts.passthrough) if opts.passthrough else None,
                idempotency_key=opts.idempotency_key, state=int(JobState.PENDING),
                attempt=0, retry_count=0, created_at=now, enqueue_at=now, updated_at=now,
                deadline_at=job_deadline(model, now),
            )).one()
    except IntegrityError:
        release_slot(model_name, tenant, job_id)
        if opts.idempotency_key:
            # Lost a race with the same key: answer with the winner's job.
            with transaction() as conn:
                existing = _find_idempotent(conn, principal.tenant_id, opts.idempotency_key)
            if existing is not None:
                return _replay(existing, model_name, digest)
        raise
    except BaseException:
        release_slot(model_name, tenant, job_id)
        raise

    # After the commit: the job joins its tenant's queue; the response does not wait for it.
    outbox.send_soon(model_name, tenant, job_id, dispatch.order_score(now))
    return Submitted(row, replayed=False)


def passthrough_of(row: Row) -> dict[str, str] | None:
    """The job's OSS pass-through headers (never log or return them)."""
    raw = getattr(row, "passthrough_headers", None)
    return json.loads(raw) if raw else None


def release_slot(model: str, tenant: str, job_id: str) -> None:
    """Give back the gate slots of a job that was never committed."""
    try:
        gate.gate_release(model, tenant, job_id)
    except redis.RedisError:
        log.warning("slot release failed; reconcile will repair it", extra={"job_id": job_id})


def load_job(conn: Connection, principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    """A job the principal may see; another tenant's job does not exist."""
    q = select(tasks).where(tasks.c.id == job_id)
    if not principal.is_admin:
        q = q.where(tasks.c.tenant_id == principal.tenant_id)
    if model_name is not None:
        q = q.where(tasks.c.model_name == model_name)
    row = conn.execute(q).first()
    if row is None:
        raise NotFound(f"job not found: {job_id}")
    return row


def get_job(principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    with single_statement() as conn:  # one SELECT: no BEGIN/COMMIT round trips (status polls are hot)
        return load_job(conn, principal, job_id, model_name)


def wait_job(principal: Principal, job_id: str, timeout_ms: int, model_name: str | None = None,
             watch=None) -> Row:
    """Return when the job is terminal or the budget ends (it may then still be
    pending/running).  Never returns early on pending -> running.  The
    waiter caps are checked first (429, no read); then one read (404 for a
    job the principal cannot see); then the wait, woken by the process's
    listener (app/infra/wakeups.py).  ``watch``: the client's
    app.infra.serving.ClientWatch, which ends the wait if the client leaves."""
    def read():
        with single_statement() as conn:
            return load_job(conn, principal, job_id, model_name)

    return waiters.wait_for_terminal(job_id, timeout_ms / 1000.0, read, tenant=principal.tenant_id,
                                     tenant_cap=waiter_cap(principal), watch=watch)


def result_bytes(principal: Principal, job_id: str, model_name: str | None = None) -> tuple[bytes, str, Row]:
    row = get_job(principal, job_id, model_name)
    if JobState(row.state) not in (JobState.DONE, JobState.CLAIMED):
        raise JobNotFinished(f"job not finished (state: {v1_name(row.state)})")
    try:
        data = get_storage().get(row.result_location)
    except ObjectMissing as exc:
        raise Gone(f"result no longer available: {job_id}") from exc
    return data, row.result_content_type or "application/octet-stream", row


def cancel_job(principal: Principal, job_id: str, model_name: str | None = None) -> Row:
    with transaction() as conn:
        row = load_job(conn, principal, job_id, model_name)
        won = transitions.cancel(conn, job_id, None if principal.is_admin else principal.tenant_id)
    if won is None:
        raise Conflict(f"job already finished (state: {v1_name(row.state)})")
    after_terminal(won)
    return won


def after_terminal(row: Row, cap: int | None = None) -> None:
    """Effects that follow a winning move out of pending/running into a
    terminal state: its slots and permit go back (the next job is
    dispatched), waiters wake.  Best effort: if Redis is down, reconcile
    returns the slot and waiters end at their budget.  ``cap``: the model's
    max_concurrency, when the caller has it."""
    metrics.job_finished(row)
    dispatch.finished(row.model_name, row.tenant_id, row.id, wake=True, cap=cap)


def after_retry_wait(row: Row, cap: int | None = None) -> None:
    """A failed attempt that will be retried: not terminal, so waiters keep
    waiting, but the job leaves pending/running: its slots and permit go back."""
    dispatch.finished(row.model_name, row.tenant_id, row.id, wake=False, cap=cap)


def list_jobs(principal: Principal, query: JobListQuery, model_name: str | None = None) -> tuple[list[Row], str | None]:
    """A page of jobs, newest first; ``query`` is the declared listing query
    (state, limit, cursor, tenant for admins, since, until)."""
    q = select(tasks)
    if principal.is_admin:
        if query.tenant:
            q = q.where(tasks.c.tenant_id == query.tenant)
    else:
        q = q.where(tasks.c.tenant_id == principal.tenant_id)
    if model_name:
        q = q.where(tasks.c.model_name == model_name)
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
            aq = select(tasks.c.created_at, tasks.c.id).where(tasks.c.id == query.cursor)
            if not principal.is_admin:
                aq = aq.where(tasks.c.tenant_id == principal.tenant_id)
            anchor = conn.execute(aq).first()
            if anchor is None:
                raise ValidationFailed("invalid query", [{"pointer": "/cursor", "message": "unknown cursor"}])
            q = q.where(or_(tasks.c.created_at < anchor.created_at,
                            and_(tasks.c.created_at == anchor.created_at, tasks.c.id < anchor.id)))
        rows = conn.execute(q.order_by(tasks.c.created_at.desc(), tasks.c.id.desc()).limit(query.limit + 1)).all()
    nxt = rows[query.limit - 1].id if len(rows) > query.limit else None
    return rows[:query.limit], nxt
