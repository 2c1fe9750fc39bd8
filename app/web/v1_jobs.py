"""v1 jobs: the async-jobs wire contract of seed 000 (docs/api.md, "Jobs").

The seed-000 routes (app/web/seed000.py) answer through the same renderers
(``answer_submit``, ``status_body``, ``answer_wait``, ``result_response``),
given their own URLs: one rendering of each answer for both."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from app.contract import dump
from app.config import get_settings
from app.infra import parking
from app.infra.serving import client_watch
from app.infra.wakeups import GONE, Snapshot, hub
from app.jobs import batch as batches, estimates, events as job_events, output_stream, schemas, service as jobs, \
    submission, waiting
from app.jobs.requests import (BATCH_MAX_JOBS, BatchSubmit, CallerHeaders, EventHeaders, FailRequest, JobListQuery,
                               SubmitHeaders, TenantEventsQuery, WaitQuery)
from app.jobs.schemas import (BatchAccepted, BatchItemResult, JobAccepted, JobList, JobListEntry, JobStatus, JobSync,
                              WaitingOn)
from app.tenancy.identity import creator_for, oss_passthrough
from app.web.auth import current_principal, gateway_oss_authorization, trusted_user_info
from app.web.contract import JOB_ID_PATH, Ok, endpoint
from app.web.errors import domain_answer

bp = Blueprint("v1_jobs", __name__, url_prefix="/v1")

_MODEL = {"model": {"description": "model_name"}}
_JOB_PATH = {**_MODEL, **JOB_ID_PATH}
_PAYLOAD = {"type": "object", "description": "the JSON object forwarded to the model service"}


def job_urls(row) -> dict:
    return {"poll_url": url_for("v1_jobs.job_status", model=row.model_name, job_id=row.id),
            "result_url": url_for("v1_jobs.job_result", model=row.model_name, job_id=row.id)}


def caller(headers, creator: str | None = None) -> dict:
    """The options a request derives: its creator (``creator`` or X-Creator;
    X-User-Info only when a proven gateway vouches for it) and the headers for
    the OSS file service.  Our own Authorization (the API key) never leaves:
    the caller's credential is X-Oss-Authorization, or a gateway request's own
    Authorization, unchanged."""
    trusted = trusted_user_info()
    return {"creator": creator_for(creator or headers.creator, trusted),
            "passthrough": oss_passthrough(headers.oss_authorization or gateway_oss_authorization(), trusted)}


def prefer_wait(prefer: str | None) -> int | None:
    """The ``wait`` preference of a Prefer header (RFC 7240: comma-separated
    ``token[=value]`` with ``;`` parameters), in whole seconds; None when it
    is absent or not a positive number (an unusable preference is ignored)."""
    for pref in (prefer or "").split(","):
        name, _, value = pref.split(";", 1)[0].partition("=")
        if name.strip().lower() == "wait":
            value = value.strip().strip('"')
            return int(value) if value.isdigit() and 0 < int(value) < 10**9 else None
    return None


@bp.post("/models/<model>/jobs")
@endpoint("Submit a job", tag="jobs", body=_PAYLOAD, nul_allowed=("",), headers=SubmitHeaders, errors=(422, 429),
          path=_MODEL, ok={202: Ok(JobAccepted, "admitted", {"Location": "the poll_url",
                                                             "Idempotent-Replayed": "true on a replay",
                                                             "Preference-Applied": "wait=N when a Prefer: wait was "
                                                                                   "honoured"}),
              200: Ok(JobSync, "sync mode (Prefer: wait=N): the job ended within N seconds",
                      {"Location": "the poll_url", "Preference-Applied": "wait=N",
                       "Idempotent-Replayed": "true on a replay"})},
          description="Checks run in order: key, body size, JSON, model (404 unknown or disabled), form (422), "
                      "idempotency, gate (429). Nothing before the gate takes a slot. With `Prefer: wait=N` "
                      "(seconds, capped by ASYNCH_WAIT_MAX_MS) the answer waits on the long-poll path, under the "
                      "waiter caps: 200 with the terminal job (and a small JSON result inline) if it ends "
                      "within N s, else 202 as without it. Caps full: 202 at once, no Preference-Applied.")
def submit_job(model: str, body: dict, headers: SubmitHeaders):
    return answer_submit(model, body, headers)


def answer_submit(model: str, body: dict, headers: SubmitHeaders, urls=job_urls):
    """A submit's answer (202, or 200 in sync mode), its job's URLs from ``urls(row)``."""
    opts = submission.given(headers, **caller(headers))
    wait_s = prefer_wait(headers.prefer)
    if wait_s is None:
        return _accepted(jobs.submit(current_principal(), model, body, opts), None, urls=urls)
    out = jobs.submit_and_wait(current_principal(), model, body, opts, wait_s, watch=client_watch(request.environ))
    if not out.finished:
        return _accepted(out.submitted, out.waited_s, out.row, urls)
    values = {**JobStatus.values_of(out.row), **urls(out.row)}
    if out.has_result:
        values["result"] = out.result
    return JobSync.model_construct(**values), 200, _headers(out.row, out.submitted.replayed, out.waited_s, urls)


def _headers(row, replayed: bool, waited_s: int | None, urls=job_urls) -> dict:
    return {"Location": urls(row)["poll_url"], **({"Idempotent-Replayed": "true"} if replayed else {}),
            **({"Preference-Applied": f"wait={waited_s}"} if waited_s is not None else {})}


def _accepted(out: jobs.Submitted, waited_s: int | None, seen=None, urls=job_urls):
    """The 202: ``seen`` is a newer copy than the admitted row (after a
    sync-mode wait that ran out), ``waited_s`` the wait honoured."""
    state = "pending" if seen is None and not out.replayed else JobStatus.from_row(
        out.row if seen is None else seen).state
    est = out.estimate.fields() if out.estimate is not None and state == "pending" else {}
    live = schemas.stream_url(out.row.model_name, out.row.id)
    return (JobAccepted.model_construct(job_id=out.row.id, state=state, **urls(out.row), **est,
                                        **({"stream_url": live} if live else {})), 202,
            _headers(out.row, out.replayed, waited_s, urls))


@bp.post("/models/<model>/jobs:batch")
@endpoint("Submit a batch of jobs", tag="jobs", body=BatchSubmit, nul_allowed=("/jobs",), headers=CallerHeaders,
          errors=(422,), path=_MODEL, ok={207: Ok(BatchAccepted, "every item's own answer, in order")},
          description=f"1 to {BATCH_MAX_JOBS} jobs of one model. Each item is judged as a submit of it alone would "
                      "be (202 admitted or replayed, 422 with pointers under /jobs/{index}, 429 with retry_after) "
                      "and does not affect the others; the valid ones pass one gate step and one INSERT. A bad "
                      "key, body or model refuses the whole batch as for a submit.")
def submit_batch(model: str, body: BatchSubmit, headers: CallerHeaders):
    results = []
    for o in batches.submit_batch(current_principal(), model, body.jobs, **caller(headers)):
        if o.submitted is not None:
            row, replayed = o.submitted.row, o.submitted.replayed
            values = dict(status=202, job_id=row.id, state=JobStatus.from_row(row).state if replayed else "pending",
                          **job_urls(row), **({"replayed": True} if replayed else {}))
        else:
            status, err, hdrs = domain_answer(o.error)
            values = dict(status=status, **err)
            if "Retry-After" in hdrs:
                values["retry_after"] = int(hdrs["Retry-After"])
        results.append(BatchItemResult.model_construct(index=o.index, **values))
    admitted = sum(r.status == 202 for r in results)
    return BatchAccepted.model_construct(admitted=admitted, refused=len(results) - admitted, results=results), 207


def _list(model: str | None, query: JobListQuery) -> JobList:
    rows, nxt = jobs.list_jobs(current_principal(), query, model_name=model)
    return JobList.model_construct(jobs=[JobListEntry.model_construct(**JobStatus.values_of(r), **job_urls(r),
                                                                      tenant=r.tenant_id) for r in rows],
                                   next_cursor=nxt)


@bp.get("/models/<model>/jobs")
@endpoint("List a model's jobs, newest first", tag="jobs", query=JobListQuery, path=_MODEL, ok=Ok(JobList, "a page"))
def list_model_jobs(model: str, query: JobListQuery):
    return _list(model, query)


@bp.get("/jobs")
@endpoint("List jobs, newest first", tag="jobs", query=JobListQuery, ok=Ok(JobList, "a page"))
def list_all_jobs(query: JobListQuery):
    return _list(None, query)


@bp.get("/models/<model>/jobs/<job_id>")
@endpoint("Poll a job", tag="jobs", path=_JOB_PATH, ok=Ok(JobStatus, "the poll body"))
def job_status(model: str, job_id: str):
    return status_body(jobs.get_job(current_principal(), job_id, model))


def status_body(row) -> JobStatus:
    est = estimates.of_job(row)  # pending: where it stands in line
    held = waiting.of_job(row)  # pending: what holds it
    return JobStatus.model_construct(**JobStatus.values_of(row), **(est.fields() if est else {}),
                                     **({"waiting_on": WaitingOn.model_construct(**held)} if held else {}))


@bp.get("/models/<model>/jobs/<job_id>/wait")
@endpoint("Long-poll a job until it is terminal or the budget ends", tag="jobs", path=_JOB_PATH, query=WaitQuery,
          ok=Ok(JobStatus, "the poll body"), errors=(429,),
          description="Served without holding a thread (gevent). At most ASYNCH_WAITERS_PER_TENANT concurrent waits "
                      "per tenant and ASYNCH_WAITERS_MAX in total per API process: past either, 429 with "
                      "Retry-After and the cap in the error text.")
def job_wait(model: str, job_id: str, query: WaitQuery):
    return answer_wait(job_id, model, query)


def answer_wait(job_id: str, model: str | None, query: WaitQuery):
    """A long-poll's answer (``model`` None: the caller's job of any model)."""
    budget_ms = query.budget_ms()
    if budget_ms > 0 and parking.can_park(request.environ) and get_settings().wait_parking:
        # Under gunicorn's gevent worker a wait that must sleep is parked
        # (app/infra/parking.py): this response carries its headers, and the
        # hub sends the body it renders with _wait_answer when the wait ends.
        global _answering_app
        _answering_app = current_app._get_current_object()
        row, waiter = jobs.begin_wait(current_principal(), job_id, model)
        if waiter is not None:
            parking.park(request.environ, waiter, row, budget_ms / 1000.0, _wait_answer, hub.unregister)
        return JobStatus.from_row(row)
    # The client's socket is watched while it waits: a client that hangs up
    # gives its place under the caps back at once, not at its budget's end.
    row = jobs.wait_job(current_principal(), job_id, budget_ms, model, watch=client_watch(request.environ))
    if isinstance(row, Snapshot):
        return Response(_v1_body(row), status=200, mimetype="application/json")
    return JobStatus.from_row(row)


def _v1_body(row) -> bytes:
    # A terminal wake-up (a Snapshot): its many waiters send the bytes rendered
    # for the first one (the same declaration renders them; see wakeups.py).
    body = getattr(row, "v1_body", None) or jsonify(dump(JobStatus.from_row(row))).get_data()
    if isinstance(row, Snapshot):
        row.v1_body = body
    return body


# The app parked waits are answered with (one per process): they end
# outside any request, and jsonify needs an app context.
_answering_app = None


def _wait_answer(row, job_id: str) -> tuple[str, bytes]:
    """A parked wait's answer (status line, body): the poll body of ``row``,
    or the 404 the job's deletion meanwhile gives (as NotFound would)."""
    if isinstance(row, Snapshot) and row.v1_body is not None:
        return "200 OK", row.v1_body
    with _answering_app.app_context():
        if row is GONE:
            return "404 NOT FOUND", jsonify({"error": f"job not found: {job_id}"}).get_data()
        return "200 OK", _v1_body(row)


@bp.get("/models/<model>/jobs/<job_id>/result")
@endpoint("The model's stored response", tag="jobs", path=_JOB_PATH, errors=(409, 410),
          ok={200: Ok({}, "the response bytes with their Content-Type (streamed from storage)", media_type="*/*"),
              307: Ok(None, "ASYNCH_RESULT_REDIRECT_SECONDS > 0 with S3 storage: a presigned URL of the object",
                      {"Location": "the presigned URL"})})
def job_result(model: str, job_id: str):
    return result_response(jobs.result_body(current_principal(), job_id, model))


def result_response(out: jobs.ResultBody) -> Response:
    """A done job's result as served: its bytes with their type (or a redirect), made inert."""
    if out.redirect:
        resp = Response(status=307, headers={"Location": out.redirect})
    else:
        # A model's bytes are not ours: a text/html (or SVG, XML ...) result opened in
        # a browser must not run as a page of the API's origin, where it could call
        # the API with the console's key.  sandbox: no script, a unique origin;
        # attachment: a download, except for the types a browser shows inertly.
        resp = Response(out.data, status=200, content_type=out.content_type)
        resp.headers["Content-Security-Policy"] = "sandbox; default-src 'none'"
        mime = out.content_type.split(";", 1)[0].strip().lower()
        if not (mime in ("application/json", "text/plain") or mime.endswith("+json")
                or (mime.startswith("image/") and mime != "image/svg+xml")):
            resp.headers["Content-Disposition"] = "attachment"
    resp.headers["X-Job-Id"] = out.row.id
    return resp


@bp.post("/models/<model>/jobs/<job_id>/cancel")
@endpoint("Cancel a job", tag="jobs", path=_JOB_PATH, errors=(409,), ok=Ok(JobStatus, "the poll body"))
def job_cancel(model: str, job_id: str):
    return JobStatus.from_row(jobs.cancel_job(current_principal(), job_id, model))


@bp.post("/models/<model>/jobs/<job_id>/fail")
@endpoint("Fail a job (admins): pending, running or waiting to retry -> failed", tag="jobs", auth="admin",
          path=_JOB_PATH, body=FailRequest, body_required=False, errors=(409,), ok=Ok(JobStatus, "the poll body"))
def job_fail(model: str, job_id: str, body: FailRequest):
    return JobStatus.from_row(jobs.fail_job(current_principal(), job_id, body.reason, model))


# The schema of one event (what an SSE parser yields per event), not of the stream's text.
_SSE = Ok({"type": "object", "description": "one server-sent event: `id`, `event` (the v1 state), `data` (JSON)",
           "properties": {"id": {"type": "string"}, "event": {"type": "string"}, "data": {"type": "string"},
                          "retry": {"type": "integer"}}},
          "the event stream", {"Cache-Control": "no-cache"}, media_type="text/event-stream")
_SSE_TEXT = ("Counts against the waiter caps (429 as /wait) while open; `: keep-alive` comments every "
             "ASYNCH_EVENTS_KEEPALIVE_SECONDS; closed after ASYNCH_EVENTS_MAX_SECONDS (resume with Last-Event-ID).")


def _stream(stream: job_events.Stream) -> Response:
    def body():
        yield "retry: 1000\n\n"  # sent at once: the client has its headers without waiting for an event
        for ev in stream:
            yield job_events.render(ev)

    resp = Response(body(), status=200, mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    resp.call_on_close(stream.close)  # the place under the caps comes back however the response ends
    return resp


@bp.get("/models/<model>/jobs/<job_id>/events")
@endpoint("A job's state changes as server-sent events, until its terminal state", tag="jobs", path=_JOB_PATH,
          headers=EventHeaders, ok=_SSE, errors=(422, 429),
          description="Events `pending` / `running` (id: the place on the job's line, data: job_id, model, state, "
                      "attempt) and the terminal one (id `end`, data: the poll body), after which the stream ends. "
                      "A resumed stream (Last-Event-ID) sends every state passed since, in order. " + _SSE_TEXT)
def job_event_stream(model: str, job_id: str, headers: EventHeaders):
    return _stream(job_events.job_events(current_principal(), job_id, model, headers.last_event_id,
                                         watch=client_watch(request.environ)))


@bp.get("/models/<model>/jobs/<job_id>/stream")
@endpoint("A job's output as server-sent events: live while it runs, then replayed from its stored result",
          tag="jobs", path=_JOB_PATH, headers=EventHeaders, ok=_SSE, errors=(422, 429),
          description="Events `attempt` (id `<attempt>-0`, data: {attempt, content_type}) when an attempt starts its "
                      "output, `output` (id `<attempt>-<offset>`, data: one event or line of the upstream's stream, "
                      "as text), and at the end `done` or `error` (id `end`, data: the poll body). A streaming "
                      "model's (`streaming`: true) output comes as the upstream sends it; any other job's comes whole "
                      "when it is done. Last-Event-ID resumes after that event; after the job ends the same URL "
                      "replays the output for as long as the result is kept. " + _SSE_TEXT)
def job_output_stream(model: str, job_id: str, headers: EventHeaders):
    return _stream(output_stream.job_output(current_principal(), job_id, model, headers.last_event_id,
                                            watch=client_watch(request.environ)))


@bp.get("/events")
@endpoint("The caller tenant's job changes as server-sent events", tag="jobs", query=TenantEventsQuery,
          headers=EventHeaders, ok=_SSE, errors=(422, 429),
          description="One event per job change (id `<updated_at µs>.<job_id>`, event: the v1 state, data: the poll "
                      "body), from now or after Last-Event-ID; at-least-once (dedupe by id). " + _SSE_TEXT)
def tenant_event_stream(query: TenantEventsQuery, headers: EventHeaders):
    return _stream(job_events.tenant_events(current_principal(), query.model, headers.last_event_id, query.tenant,
                                            watch=client_watch(request.environ)))
