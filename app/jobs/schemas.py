"""The jobs' view contracts: how a job is shown (the v1 poll body, a list
page, the operator's detail with its timeline); the requests are
app/jobs/requests.py's.  Views are built from rows here and nowhere else
(``from_row``), with ``model_construct`` (our own rows: no validation), and
serialised with ``exclude_unset``: a field a state does not have (``error``,
``result_size``) is absent rather than null.
"""
from __future__ import annotations

import json
from urllib.parse import quote
from typing import Annotated, Any, Literal

from pydantic import Field

from app.catalog.registry import model_row
from app.clock import as_utc, now as clock_now
from app.contract import Shape, Timestamp, iso_z
from app.errors import Unavailable
from app.states import RESULT_STATES, JobState, v1_name

V1State = Literal["canceled", "done", "expired", "failed", "pending", "running", "timeout"]
JobId = Annotated[str, Field(pattern="^job_")]


class QueueEstimate(Shape):
    """Where a pending job stands (app/jobs/estimates.py): absent in any
    other state, or when the dispatcher cannot say."""
    queue_position: int | None = Field(None, ge=0, description="pending: jobs that start before it on its model, "
                                       "in the dispatcher's order (fair share, weights, priority); 0: next")
    estimated_start_at: Timestamp | None = Field(None, description="pending: when it should start")
    estimated_done_at: Timestamp | None = Field(None, description="pending: when it should be done")


STREAM_URL = Field(None, description="a streaming model's job (`streaming`: true): its output as server-sent "
                                     "events, live and then replayed (docs/api.md, Streamed output)")


def stream_url(model_name: str, job_id: str) -> str | None:
    """The job's output stream, for a job of a streaming model (None otherwise, or the model gone).  The
    database away: None, so a poll answered from a wake-up's snapshot (no read of its own) still answers."""
    try:
        m = model_row(model_name)
    except Unavailable:
        return None
    return f"/v1/models/{quote(model_name, safe='')}/jobs/{job_id}/stream" if m is not None and m.streaming else None
WaitReason = Literal["behind_own_jobs", "tenant_limit", "upstream_paused", "retry_backoff", "no_worker"]


class WaitingOn(Shape):
    """What holds a pending job now (app/jobs/waiting.py; docs/api.md "Why a job waits")."""
    reason: WaitReason
    ahead: int | None = Field(None, ge=0, description="behind_own_jobs: its tenant's jobs ahead of it")
    running: int | None = Field(None, ge=0, description="tenant_limit: the calls its tenant holds on the model")
    limit: int | None = Field(None, ge=0, description="tenant_limit: the most it may hold now")
    ceiling: Literal["max_concurrency", "burst", "upstream", "model_key"] | None = Field(
        None, description="tenant_limit: the rule that sets the limit")
    until: Timestamp | None = Field(None, description="upstream_paused, retry_backoff: when it may go again")
    scope: Literal["model", "tenant", "job"] | None = Field(None, description="upstream_paused: what is paused")
    answer: int | None = Field(None, description="upstream_paused: the HTTP status of the job's last busy answer")
    since: Timestamp | None = Field(None, description="no_worker: since when it has been ready for a worker")


class JobAccepted(QueueEstimate):
    job_id: JobId
    state: V1State
    poll_url: str
    result_url: str
    stream_url: str | None = STREAM_URL


class JobStatus(QueueEstimate):
    """The v1 poll body."""
    job_id: JobId
    model: str
    state: V1State
    elapsed_ms: int = Field(ge=0)
    attempt: int
    retry_count: int
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    error: str | None = Field(None, description="failed, timeout, canceled, expired, or waiting to retry: "
                                                "'<code>: <short message>' (docs/api.md, Job error codes)")
    result_size: int | None = Field(None, description="done")
    content_type: str | None = Field(None, description="done")
    priority: int | None = Field(None, ge=0, le=9, description="0-9 (9 first), as submitted")
    busy_answers: int | None = Field(None, ge=0, description="the model's upstream answered this job busy (429/503) "
                                     "this many times, each sent back to the queue from its tenant's busy budget "
                                     "without spending a retry (absent: none)")
    stream_url: str | None = STREAM_URL
    waiting_on: WaitingOn | None = Field(None, description="pending (polls only): what holds it now, one of a "
                                         "small set of reasons with its numbers (docs/api.md, Why a job waits)")

    @classmethod
    def values_of(cls, row) -> dict:
        # Up to the end, or (not ended) up to the read of this row: a row read earlier and answered later (a
        # long-poll's budget end, an event) must not show more than a later read's done row (issue 32 item 8).
        state = JobState(row.state)
        end = as_utc(row.finished_at) or as_utc(getattr(row, "read_at", None)) or clock_now()
        elapsed_ms = max(0, int((end - as_utc(row.created_at)).total_seconds() * 1000))
        out = {"job_id": row.id, "model": row.model_name, "state": v1_name(row.state), "elapsed_ms": elapsed_ms,
               "attempt": row.attempt, "retry_count": row.retry_count, "created_at": row.created_at,
               "started_at": row.started_at, "finished_at": row.finished_at}
        if row.error and state not in (JobState.PENDING, JobState.RUNNING, JobState.DONE, JobState.CLAIMED):
            out["error"] = row.error
        if getattr(row, "priority", None) is not None:
            out["priority"] = row.priority
        if getattr(row, "busy_count", 0):
            out["busy_answers"] = row.busy_count
        if (url := stream_url(row.model_name, row.id)) is not None:
            out["stream_url"] = url
        if row.result_size is not None and state in RESULT_STATES:
            out["result_size"] = row.result_size
            out["content_type"] = row.result_content_type
        return out

    @classmethod
    def from_row(cls, row) -> "JobStatus":
        return cls.model_construct(**cls.values_of(row))


class JobListItem(JobStatus):
    poll_url: str
    result_url: str


class JobSync(JobListItem):
    """The sync-mode answer (``Prefer: wait=N``): the terminal poll body,
    its urls, and the result itself when it is JSON and small."""
    result: Any = Field(None, description="done, JSON content type, at most ASYNCH_SYNC_RESULT_MAX_BYTES: the "
                                          "result itself; otherwise fetch result_url")


class EnvelopeModel(Shape):
    name: str
    version: str = Field(description="always empty: models have no versions here")


class EnvelopeResult(Shape):
    status: int = Field(description="0: OK")
    data: Any = Field(description="the model's JSON answer, as it sent it")


class ResultEnvelope(Shape):
    """A done job's JSON result in seed 000's "standard envelope" (its unified response):
    ``GET /jobs/{id}/result`` of the seed-000 routes.  One result per job, never partial."""
    status: int = Field(description="0: OK")
    status_str: str
    task_id: JobId = Field(description="the job id")
    model: EnvelopeModel
    results: list[EnvelopeResult] = Field(min_length=1, max_length=1)
    server_time_ms: float = Field(ge=0, description="the model call's attempt, started to done (milliseconds)")
    partial: bool

    @classmethod
    def of(cls, row, data: Any) -> "ResultEnvelope":
        took = (as_utc(row.finished_at) - as_utc(row.started_at)).total_seconds() * 1000 \
            if row.started_at and row.finished_at else 0.0
        return cls.model_construct(
            status=0, status_str="OK", task_id=row.id, model=EnvelopeModel.model_construct(name=row.model_name,
                                                                                           version=""),
            results=[EnvelopeResult.model_construct(status=0, data=data)], server_time_ms=round(max(0.0, took), 3),
            partial=False)


class BatchItemResult(Shape):
    """One item's answer: ``status`` is what a submit of it alone would have
    answered (202 admitted or replayed, 422, 429, 503), with that answer's
    fields."""
    index: int = Field(ge=0, description="the item's position in `jobs`")
    status: int
    job_id: JobId | None = None
    state: V1State | None = None
    poll_url: str | None = None
    result_url: str | None = None
    replayed: bool | None = Field(None, description="true: its Idempotency-Key returned an earlier job")
    error: str | None = None
    errors: list[dict[str, str]] | None = Field(None, description="422: a JSON pointer per problem "
                                                                  "(/jobs/{index}/...)")
    retry_after: int | None = Field(None, description="429/503: seconds, as a Retry-After header")


class BatchAccepted(Shape):
    admitted: int = Field(ge=0, description="items with status 202 (replays included)")
    refused: int = Field(ge=0)
    results: list[BatchItemResult]


class JobListEntry(JobListItem):
    """A job in a listing: the poll body, its urls and its tenant."""
    tenant: str


class JobList(Shape):
    jobs: list[JobListEntry]
    next_cursor: str | None


class TimelineEvent(Shape):
    at: Timestamp | None
    event: str
    detail: str


def timeline(row, attempts=()) -> list[TimelineEvent]:
    """A job's history from the row and each ended attempt.  The row keeps the latest requeue's time
    only (``enqueue_at``; ``promoted_at`` when a head retry backdated ``enqueue_at`` to the creation):
    an earlier requeue's ``at`` is null."""
    state, ended = JobState(row.state), {a.attempt: a for a in attempts}
    requeued_at = row.enqueue_at if as_utc(row.enqueue_at) > as_utc(row.created_at) else row.promoted_at
    ev = [("created", row.created_at, "admitted through the gate")]
    for n in range(1, row.attempt + 1):
        a, last = ended.get(n), n == row.attempt
        if a is not None:
            ev.append(("started", a.started_at, f"attempt {n}"))
            if JobState(a.outcome) == JobState.RETRY_WAIT:
                ev.append(("attempt_failed", a.ended_at, f"attempt {n}: {a.error or ''}".strip()))
            elif JobState(a.outcome) == JobState.PENDING:  # a busy upstream: back to the queue, no retry spent
                ev.append(("model_busy", a.ended_at, f"attempt {n}: {a.error or ''}".strip()))
        elif last:  # running, or a row whose attempts were not read (the CLI)
            ev.append(("started", row.started_at, f"attempt {n}"))
            if state == JobState.RETRY_WAIT:
                ev.append(("attempt_failed", row.updated_at, f"attempt {n}: {row.error or ''}".strip()))
        if n <= row.retry_count:
            ev.append(("requeued", requeued_at if n == row.retry_count else None, f"re-admitted for retry {n}"))
    if not attempts and state == JobState.PENDING and row.busy_count:
        ev.append(("model_busy", row.updated_at, f"attempt {row.attempt}: {row.error or ''}".strip()))
    if state == JobState.RETRY_WAIT and row.next_retry_at:
        ev.append(("retry_due", row.next_retry_at, "next attempt after"))
    if row.finished_at:
        ev.append(("finished", row.finished_at, state.label if not row.error else f"{state.label}: {row.error}"))
    if row.claimed_at:
        ev.append(("claimed", row.claimed_at, f"expires {iso_z(as_utc(row.expire_at))}" if row.expire_at else ""))
    return [TimelineEvent.model_construct(at=at, event=name, detail=detail)
            for name, at, detail in ev if at or name == "requeued"]


class AttemptView(Shape):
    """One ended attempt (asynch_task_attempt): how it ended and why."""
    attempt: int = Field(ge=1)
    outcome: Literal["done", "failed", "retry_wait", "timeout", "canceled", "pending"] = Field(
        description="the state the attempt left the job in (retry_wait: it is retried; pending: the model was "
                    "busy, 429/503, and the job went back to its queue without spending a retry)")
    started_at: Timestamp | None
    ended_at: Timestamp
    error: str | None = Field(None, description="'<code>: <short message>', as the job's error")
    worker: str | None = Field(None, description="admins only: the Celery node that ran it")
    error_detail: str | None = Field(None, description="admins only: the internals behind error")

    @classmethod
    def from_row(cls, row, admin: bool = False) -> "AttemptView":
        out = {"attempt": row.attempt, "outcome": JobState(row.outcome).label, "started_at": row.started_at,
               "ended_at": row.ended_at}
        if row.error and JobState(row.outcome) != JobState.DONE:
            out["error"] = row.error
        if admin:
            out.update({k: getattr(row, k) for k in ("worker", "error_detail") if getattr(row, k)})
        return cls.model_construct(**out)


class JobDetail(JobListEntry):
    """The poll body plus what an operator or the console's job page needs.
    Never the secrets: modelKey and the callback URL stay out."""
    internal_state: Literal["pending", "running", "done", "failed", "claimed", "timeout", "canceled", "retry_wait",
                            "expired"]
    creator: str
    biz_name: str
    enqueue_at: Timestamp | None
    next_retry_at: Timestamp | None
    deadline_at: Timestamp | None
    claimed_at: Timestamp | None
    expire_at: Timestamp | None
    payload: Any
    timeline: list[TimelineEvent]
    attempts: list[AttemptView] = Field(description="the attempts that ended, oldest first (the running one "
                                                    "is the job's own started_at/attempt)")
    error_detail: str | None = Field(None, description="admins only: what lies behind error (exception text, "
                                                       "the model's error body)")

    @classmethod
    def from_row(cls, row, urls: dict, admin: bool = False,  # type: ignore[override]
                 attempts: list | None = None) -> "JobDetail":
        try:
            payload = json.loads(row.request_payload)
        except ValueError:
            payload = None
        values = cls.values_of(row) | ({"error": row.error} if row.error else {})
        if admin and getattr(row, "error_detail", None):
            values["error_detail"] = row.error_detail
        return cls.model_construct(
            **values, **urls, internal_state=JobState(row.state).label, tenant=row.tenant_id, creator=row.creator,
            biz_name=row.biz_name, enqueue_at=row.enqueue_at, next_retry_at=row.next_retry_at,
            deadline_at=row.deadline_at, claimed_at=row.claimed_at, expire_at=row.expire_at, payload=payload,
            timeline=timeline(row, attempts or ()), attempts=[AttemptView.from_row(a, admin) for a in attempts or []])
