"""The seed-000 routes: the job ledger's own wire contract, without a model in
the path -- ``POST /jobs``, ``GET /jobs/{id}``, ``GET /jobs/{id}/wait?timeout=ms``,
``GET /jobs/{id}/result`` -- for one configured model, ASYNCH_SEED000_MODEL
(docs/migrating.md, "Coming from seed 000"; docs/api.md, "Seed-000 routes").

Invariants:
- The same services and shapes as the v1 job routes, rendered by their
  renderers (app/web/v1_jobs.py) with these routes' own URLs (``poll_url``,
  ``result_url``, ``Location``: ``/jobs/{id}...``); errors go through the one
  handler (app/web/errors.py) in the v1 form ``{"error": ...}``, as seed 000's.
- Unset, every route answers 404 naming the setting (after authentication),
  never a bare 404; nothing is read or written.
- ``POST /jobs`` submits to the configured model only; the reads take any of
  the caller's jobs by id (a job outlives a change of the setting), another
  tenant's never.
- ``/result`` serves a JSON result (a JSON content type that parses) in seed
  000's standard envelope, read whole; any other result as its bytes, as
  the v1 route does (streamed).
"""
from __future__ import annotations

import dataclasses
import json

from flask import Blueprint, url_for

from app.config import get_settings
from app.errors import NotFound
from app.jobs import service as jobs
from app.jobs.requests import SubmitHeaders, WaitQuery
from app.jobs.schemas import JobAccepted, JobStatus, JobSync, ResultEnvelope
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, Ok, endpoint
from app.web.v1_jobs import answer_submit, answer_wait, result_response, status_body

bp = Blueprint("seed000", __name__)
TAG = "seed000"
_PAYLOAD = {"type": "object", "description": "the JSON object forwarded to ASYNCH_SEED000_MODEL's model service"}
_UNSET = ("the seed-000 routes are off: ASYNCH_SEED000_MODEL is unset (set it to the model they serve, or use "
          "/v1/models/{model}/jobs)")


def served_model() -> str:
    """The model these routes serve, or the 404 that says the setting is unset."""
    name = get_settings().seed000_model
    if not name:
        raise NotFound(_UNSET)
    return name


def _urls(row) -> dict:
    return {"poll_url": url_for("seed000.job_status", job_id=row.id),
            "result_url": url_for("seed000.job_result", job_id=row.id)}


@bp.post("/jobs")
@endpoint("Submit a job to the seed-000 model (ASYNCH_SEED000_MODEL)", tag=TAG, body=_PAYLOAD, nul_allowed=("",),
          headers=SubmitHeaders, errors=(404, 422, 429),
          ok={202: Ok(JobAccepted, "admitted", {"Location": "the poll_url (/jobs/{id})",
                                                "Idempotent-Replayed": "true on a replay"}),
              200: Ok(JobSync, "sync mode (Prefer: wait=N): the job ended within N seconds",
                      {"Location": "the poll_url", "Preference-Applied": "wait=N"})},
          description="POST /v1/models/{ASYNCH_SEED000_MODEL}/jobs with this face's URLs: the same checks, "
                      "headers and answers (429 `async queue full (max N)` with Retry-After). 404 while "
                      "ASYNCH_SEED000_MODEL is unset.")
def submit_job(body: dict, headers: SubmitHeaders):
    return answer_submit(served_model(), body, headers, urls=_urls)


@bp.get("/jobs/<job_id>")
@endpoint("Poll a job (seed-000 routes)", tag=TAG, path=JOB_ID_PATH, errors=(404,), ok=Ok(JobStatus, "the poll body"))
def job_status(job_id: str):
    served_model()
    return status_body(jobs.get_job(current_principal(), job_id))


@bp.get("/jobs/<job_id>/wait")
@endpoint("Long-poll a job until it is terminal or the budget ends (seed-000 routes)", tag=TAG, path=JOB_ID_PATH,
          query=WaitQuery, errors=(404, 429), ok=Ok(JobStatus, "the poll body"),
          description="As GET /v1/models/{model}/jobs/{id}/wait: timeout in ms, default 30000, cap 300000, <=0 or "
                      "unparsable: the default; returns at the terminal state or the budget's end, never because "
                      "the job started running.")
def job_wait(job_id: str, query: WaitQuery):
    served_model()
    return answer_wait(job_id, None, query)


@bp.get("/jobs/<job_id>/result")
@endpoint("A done job's result (seed-000 routes): JSON in seed 000's standard envelope", tag=TAG, path=JOB_ID_PATH,
          errors=(404, 409, 410),
          ok=Ok(ResultEnvelope, "a JSON result in the envelope (the model's answer as results[0].data); any "
                                "other result: its bytes with their Content-Type, as the v1 result route"),
          description="409 `job not finished (state: S)` until done; repeatable until cleanup. A JSON result is read "
                      "whole to wrap it; the v1 route streams any size.")
def job_result(job_id: str):
    served_model()
    out = jobs.result_body(current_principal(), job_id)
    mime = out.content_type.split(";", 1)[0].strip().lower()
    if not (mime == "application/json" or mime.endswith("+json")):
        return result_response(out)
    raw = jobs.whole(out)
    try:
        data = json.loads(raw)
    except ValueError:  # the model called it JSON, but it is not: its bytes, as the v1 route serves them
        return result_response(dataclasses.replace(out, data=raw, redirect=None))
    return ResultEnvelope.of(out.row, data)
