"""v1 jobs: the async-jobs wire contract of seed 000 (docs/api.md, "Jobs")."""
from __future__ import annotations

from flask import Blueprint, Response, request, url_for

from app.contract import parse
from app.infra.serving import client_watch
from app.jobs import service as jobs
from app.jobs.schemas import (
    JobAccepted,
    JobList,
    JobListItem,
    JobListQuery,
    JobStatus,
    SubmitHeaders,
    SubmitOptions,
    WaitQuery,
)
from app.tenancy.identity import creator_for
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_jobs", __name__, url_prefix="/v1")

_JOB_PATH = {"model": {"description": "model_name"}, "job_id": {"description": "job id (job_...)"}}
_PAYLOAD = {"type": "object", "description": "the JSON object forwarded to the model service"}


def job_urls(row) -> dict:
    return {"poll_url": url_for("v1_jobs.job_status", model=row.model_name, job_id=row.id),
            "result_url": url_for("v1_jobs.job_result", model=row.model_name, job_id=row.id)}


def passthrough(oss_authorization: str | None, user_info: str | None) -> dict[str, str] | None:
    """Headers for the OSS file service.  Our own Authorization header is the
    middleware's API key and never leaves the middleware: the caller's
    credential for the file service comes as X-Oss-Authorization."""
    out = {}
    if oss_authorization:
        out["Authorization"] = oss_authorization
    if user_info:
        out["X-User-Info"] = user_info
    return out or None


@bp.post("/models/<model>/jobs")
@endpoint("Submit a job", tag="jobs", body=_PAYLOAD, nul_allowed=("",), headers=SubmitHeaders, errors=(422, 429),
          path={"model": {"description": "model_name"}},
          ok={202: Ok(JobAccepted, "admitted", {"Location": "the poll_url",
                                                "Idempotent-Replayed": "true on a replay"})},
          description="Checks run in order: key, body size, JSON, model (404 unknown or disabled), form (422), "
                      "idempotency, gate (429). Nothing before the gate takes a slot.")
def submit_job(model: str, body: dict, headers: SubmitHeaders):
    opts = parse(SubmitOptions, {
        "Idempotency-Key": headers.idempotency_key, "modelKey": headers.model_key, "bizName": headers.biz_name or "",
        "creator": creator_for(headers.creator, headers.user_info), "callbackUrl": headers.callback_url or None,
        "passthrough": passthrough(headers.oss_authorization, headers.user_info)}, face="seed",
        message="invalid job options")
    out = jobs.submit(current_principal(), model, body, opts)
    urls = job_urls(out.row)
    state = JobStatus.from_row(out.row).state if out.replayed else "pending"
    extra = {"Location": urls["poll_url"]}
    if out.replayed:
        extra["Idempotent-Replayed"] = "true"
    return JobAccepted.model_construct(job_id=out.row.id, state=state, **urls), 202, extra


def _list(model: str | None, query: JobListQuery) -> JobList:
    rows, nxt = jobs.list_jobs(current_principal(), query, model_name=model)
    return JobList.model_construct(jobs=[JobListItem.model_construct(**JobStatus.values_of(r), **job_urls(r))
                                         for r in rows], next_cursor=nxt)


@bp.get("/models/<model>/jobs")
@endpoint("List a model's jobs, newest first", tag="jobs", query=JobListQuery, path={"model": _JOB_PATH["model"]},
          ok=Ok(JobList, "a page"))
def list_model_jobs(model: str, query: JobListQuery):
    return _list(model, query)


@bp.get("/jobs")
@endpoint("List jobs, newest first", tag="jobs", query=JobListQuery, ok=Ok(JobList, "a page"))
def list_all_jobs(query: JobListQuery):
    return _list(None, query)


@bp.get("/models/<model>/jobs/<job_id>")
@endpoint("Poll a job", tag="jobs", path=_JOB_PATH, ok=Ok(JobStatus, "the poll body"))
def job_status(model: str, job_id: str):
    return JobStatus.from_row(jobs.get_job(current_principal(), job_id, model))


@bp.get("/models/<model>/jobs/<job_id>/wait")
@endpoint("Long-poll a job until it is terminal or the budget ends", tag="jobs", path=_JOB_PATH, query=WaitQuery,
          ok=Ok(JobStatus, "the poll body"), errors=(429,),
          description="Served without holding a thread (gevent). At most ASYNCH_WAITERS_PER_TENANT concurrent waits "
                      "per tenant and ASYNCH_WAITERS_MAX in total per API process: past either, 429 with "
                      "Retry-After and the cap in the error text.")
def job_wait(model: str, job_id: str, query: WaitQuery):
    # The client's socket is watched while it waits: a client that hangs up
    # gives its place under the caps back at once, not at its budget's end.
    row = jobs.wait_job(current_principal(), job_id, query.budget_ms(), model, watch=client_watch(request.environ))
    return JobStatus.from_row(row)


@bp.get("/models/<model>/jobs/<job_id>/result")
@endpoint("The model's stored response", tag="jobs", path=_JOB_PATH, errors=(409, 410),
          ok=Ok({}, "the response bytes with their Content-Type", media_type="*/*"))
def job_result(model: str, job_id: str):
    data, ctype, row = jobs.result_bytes(current_principal(), job_id, model)
    resp = Response(data, status=200, content_type=ctype)
    resp.headers["X-Job-Id"] = row.id
    return resp


@bp.post("/models/<model>/jobs/<job_id>/cancel")
@endpoint("Cancel a job", tag="jobs", path=_JOB_PATH, errors=(409,), ok=Ok(JobStatus, "the poll body"))
def job_cancel(model: str, job_id: str):
    return JobStatus.from_row(jobs.cancel_job(current_principal(), job_id, model))
