"""A judged submission as the row and gate step admission takes (app/jobs/admission.py): the one place a
job's row values are made, for the API's submits and for a batch's lines (app/batches/feed.py, which runs in
workers and may not import the HTTP-facing job service).

Invariants: a new job is pending, attempt 0, its budget ``job_deadline`` from its model; a caller's deadline
(``deadline_seconds``) becomes caller_deadline_at; nothing here writes: admission does.
"""
from __future__ import annotations

import json
import math
import secrets
from datetime import timedelta

from app.clock import now as clock_now
from app.config import get_settings
from app.infra import delivery_rows, tracing
from app.jobs import admission, submission
from app.states import JobState
from app.tenancy import limits
from app.tenancy.keys import Principal


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def retry_after_seconds(model_row) -> int:
    """A full queue's Retry-After from the configuration alone (one job's turn at the model's concurrency):
    only when the estimator cannot say; app/jobs/estimates.py ``retry_after`` caps it."""
    return max(1, math.ceil(model_row.expected_seconds / max(1, model_row.max_concurrency)))


def job_deadline(model_row, created):
    """The job's whole budget: every allowed attempt at its full model timeout
    plus lease grace, plus the queue allowance.  Past it: timeout."""
    s = get_settings()
    return created + timedelta(seconds=(model_row.retry_times + 1) * (model_row.timeout_seconds + s.lease_grace_seconds)
                               + s.job_queue_budget_seconds)


def new_submission(principal: Principal, sub: submission.Checked, want_estimate: bool = True) -> admission.Submission:
    """The row and gate step of a judged submission (app/jobs/admission.py); ``want_estimate``:
    its place in line is asked for (a job with a deadline is estimated anyway)."""
    model, payload, opts, digest = sub.model, sub.payload, sub.options, sub.digest
    now, job_id = clock_now(), new_job_id()
    return admission.Submission(
        values=dict(id=job_id, tenant_id=principal.tenant_id, creator=opts.creator, model_name=model.model_name,
                    biz_name=opts.biz_name, callback_url=opts.callback_url, model_key=opts.model_key,
                    request_payload=json.dumps(payload, ensure_ascii=False), request_hash=digest,
                    passthrough_headers=json.dumps(opts.passthrough) if opts.passthrough else None,
                    idempotency_key=opts.idempotency_key, state=int(JobState.PENDING), attempt=0, retry_count=0,
                    created_at=now, enqueue_at=now, updated_at=now, deadline_at=job_deadline(model, now),
                    priority=opts.priority, webhook_url=opts.webhook_url, payload_file_id=opts.payload_file_id,
                    caller_deadline_at=(now + timedelta(seconds=opts.deadline_seconds)
                                        if opts.deadline_seconds is not None else None),
                    webhook_events=(delivery_rows.bits_of(opts.webhook_events or delivery_rows.EVENTS)
                                    if opts.webhook_url else None),
                    **tracing.for_new_job(job_id, model.model_name, principal.tenant_id)),
        queue_limit=model.queue_limit, tenant_cap=limits.tenant_queue_cap(principal.tenant_id, model),
        retry_after=retry_after_seconds(model), max_completed=getattr(model, "max_completed", 0) or 0,
        model_row=model, want_estimate=want_estimate)
