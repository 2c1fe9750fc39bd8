"""v1 jobs: the async-jobs wire contract of seed 000 (DESIGN.md, v1)."""
from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, Response, jsonify, request, url_for

from app.web import job_context
from app.web.auth import current_principal, require_key
from app.web.body import json_object
from app.errors import ValidationFailed
from app.jobs import service as jobs
from app.jobs.service import SubmitOptions, status_view

bp = Blueprint("v1_jobs", __name__, url_prefix="/v1")


def _urls(row) -> dict:
    poll = url_for("v1_jobs.job_status", model=row.model_name, job_id=row.id)
    return {"poll_url": poll,
            "result_url": url_for("v1_jobs.job_result", model=row.model_name, job_id=row.id)}


@bp.post("/models/<model>/jobs")
@require_key
def submit_job(model: str):
    principal = current_principal()
    payload = json_object(nul_allowed=("",))  # the body is the payload
    opts = SubmitOptions(
        idempotency_key=request.headers.get("Idempotency-Key"),
        model_key=request.headers.get("X-Model-Key"),
        biz_name=request.headers.get("X-Biz-Name", ""),
        creator=job_context.creator(),
        callback_url=request.headers.get("X-Callback-Url") or None,
        passthrough=job_context.passthrough(),
    )
    out = jobs.submit(principal, model, payload, opts)
    body = {"job_id": out.row.id, "state": "pending", **_urls(out.row)}
    if out.replayed:
        body["state"] = status_view(out.row)["state"]
    resp = jsonify(body)
    resp.status_code = 202
    resp.headers["Location"] = body["poll_url"]
    if out.replayed:
        resp.headers["Idempotent-Replayed"] = "true"
    return resp


@bp.get("/models/<model>/jobs")
@require_key
def list_model_jobs(model: str):
    return _list(model)


@bp.get("/jobs")
@require_key
def list_all_jobs():
    return _list(None)


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValidationFailed("invalid query", [{"pointer": "/" + name, "message": "must be an integer"}])


def _time_arg(name: str):
    raw = request.args.get(name)
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw)
        # In UTC: PostgreSQL refuses offsets past +-15:59, which Python takes.
        return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 moved out of range
        raise ValidationFailed("invalid query", [{"pointer": "/" + name, "message": "must be an ISO 8601 time"}])


def _list(model: str | None):
    rows, nxt = jobs.list_jobs(current_principal(), model_name=model, state=request.args.get("state"),
                               limit=_int_arg("limit", 50), cursor=request.args.get("cursor"),
                               tenant=request.args.get("tenant"),
                               since=_time_arg("since"), until=_time_arg("until"))
    return jsonify({"jobs": [status_view(r) | _urls(r) for r in rows], "next_cursor": nxt})


@bp.get("/models/<model>/jobs/<job_id>")
@require_key
def job_status(model: str, job_id: str):
    return jsonify(status_view(jobs.get_job(current_principal(), job_id, model)))


@bp.get("/models/<model>/jobs/<job_id>/wait")
@require_key
def job_wait(model: str, job_id: str):
    ms = jobs.parse_wait_ms(request.args.get("timeout"))
    return jsonify(status_view(jobs.wait_job(current_principal(), job_id, ms, model)))


@bp.get("/models/<model>/jobs/<job_id>/result")
@require_key
def job_result(model: str, job_id: str):
    data, ctype, row = jobs.result_bytes(current_principal(), job_id, model)
    resp = Response(data, status=200, content_type=ctype)
    resp.headers["X-Job-Id"] = row.id
    return resp


@bp.post("/models/<model>/jobs/<job_id>/cancel")
@require_key
def job_cancel(model: str, job_id: str):
    return jsonify(status_view(jobs.cancel_job(current_principal(), job_id, model)))
