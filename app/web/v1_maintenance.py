"""v1 maintenance triggers (admins): run a pass now and get its report."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.web.auth import require_admin
from app.web.body import json_object
from app.errors import ValidationFailed
from app.maintenance import autotune
from app.maintenance import passes as maintenance
from app.maintenance import periodic

bp = Blueprint("v1_maintenance", __name__, url_prefix="/v1/maintenance")

_PASSES = {
    "retry": maintenance.run_work,
    "recover": maintenance.recover,
    "cleanup": maintenance.cleanup,
    "reconcile": maintenance.reconcile_gates,
}


@bp.post("/<any(retry, recover, cleanup, reconcile):name>")
@require_admin
def run_pass(name: str):
    return jsonify(_PASSES[name]().as_dict())


@bp.post("/autotune")
@require_admin
def run_autotune():
    body = json_object(nul_allowed=("",)) if request.get_data(cache=True).strip() else {}
    window, dry_run = autotune.parse_request(body, "window_seconds", "dry_run")
    return jsonify(autotune.autotune(window, dry_run).as_dict())


@bp.get("/runs")
@require_admin
def recent_runs():
    raw = request.args.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise ValidationFailed("invalid query", [{"pointer": "/limit", "message": "must be from 1 to 1000"}])
    return jsonify({"runs": periodic.recent_runs(int(raw))})
