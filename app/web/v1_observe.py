"""v1 read-only views for operators and the console: live numbers per model,
throughput/P90 series, and one job with its timeline."""
from __future__ import annotations

from flask import Blueprint, jsonify, request, url_for

from app.web.auth import current_principal, require_key
from app.errors import ValidationFailed
from app.jobs import service as jobs
from app.observe import live as observe

bp = Blueprint("v1_observe", __name__, url_prefix="/v1")


@bp.get("/overview")
@require_key
def overview():
    p = current_principal()
    return jsonify({"models": observe.model_live(include_disabled=p.is_admin)})


@bp.get("/overview/series")
@require_key
def overview_series():
    p = current_principal()
    raw = request.args.get("minutes", "60")
    if not raw.isdigit() or not 5 <= int(raw) <= 1440:
        raise ValidationFailed("invalid query", [{"pointer": "/minutes", "message": "must be an integer from 5 to 1440"}])
    minutes = int(raw)
    return jsonify(observe.throughput_series(minutes, max(1, minutes // 12),
                                             None if p.is_admin else p.tenant_id))


@bp.get("/jobs/<job_id>")
@require_key
def job_detail(job_id: str):
    row = jobs.get_job(current_principal(), job_id)
    return jsonify(observe.job_detail(row) | {
        "poll_url": url_for("v1_jobs.job_status", model=row.model_name, job_id=row.id),
        "result_url": url_for("v1_jobs.job_result", model=row.model_name, job_id=row.id)})
