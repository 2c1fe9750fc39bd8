"""Seed-002 maintenance triggers (admins): /task/runWork, /task/cleanWork,
/model/autoTune, in the seed's envelope {"code": 0, "message": "ok", "data"}.
Their bodies are optional; runWork's and cleanWork's are ignored."""
from __future__ import annotations

from flask import Blueprint

from app.contract import Loose
from app.maintenance import autotune, passes
from app.maintenance.schemas import AutotuneReport, AutotuneRequest, Report
from app.web.contract import Ok, endpoint

bp = Blueprint("seed_maintenance", __name__)
SEED = {"face": "seed", "tag": "seed", "auth": "admin", "body_required": False, "nul_allowed": ("",)}


class Ignored(Loose):
    """An optional body whose fields are ignored."""


@bp.post("/task/runWork")
@endpoint("Run the retry pass now (as POST /v1/maintenance/retry)", body=Ignored, ok=Ok(Report, "its report"), **SEED)
def run_work(body: Ignored):
    return passes.run_work().as_dict()


@bp.post("/task/cleanWork")
@endpoint("Run cleanup, then recovery, now", body=Ignored, ok=Ok(Report, "{cleanup: {...}, recover: {...}}"), **SEED)
def clean_work(body: Ignored):
    return passes.clean_work().as_dict()


@bp.post("/model/autoTune")
@endpoint("Run autotune now", body=AutotuneRequest, ok=Ok(AutotuneReport, "the decisions"), **SEED)
def auto_tune(body: AutotuneRequest):
    return autotune.autotune(body.window, body.dry_run).as_dict()
