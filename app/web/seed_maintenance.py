"""Seed-002 maintenance triggers (admins): /task/runWork, /task/cleanWork,
/model/autoTune, in the seed's envelope {"code": 0, "message": "ok", "data"}."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.web.auth import require_admin
from app.web.body import json_object
from app.maintenance import autotune
from app.maintenance import passes as maintenance

bp = Blueprint("seed_maintenance", __name__)


def _ok(data):
    return jsonify({"code": 0, "message": "ok", "data": data})


def _optional_object() -> dict:
    # The seed's bodies here are optional: nothing (or an empty body) means defaults.
    return json_object(nul_allowed=("",)) if request.get_data(cache=True).strip() else {}


@bp.post("/task/runWork")
@require_admin
def run_work():
    _optional_object()
    return _ok(maintenance.run_work().as_dict())


@bp.post("/task/cleanWork")
@require_admin
def clean_work():
    _optional_object()
    return _ok(maintenance.clean_work().as_dict())


@bp.post("/model/autoTune")
@require_admin
def auto_tune():
    window, dry_run = autotune.parse_request(_optional_object(), "windowSeconds", "dryRun")
    return _ok(autotune.autotune(window, dry_run).as_dict())
