"""Seed-002 maintenance triggers (admins): /task/runWork, /task/cleanWork,
/model/autoTune, in the seed's envelope {"code": 0, "message": "ok", "data"}.
Their bodies are optional; runWork's may name ``maxTasks`` (the pending
jobs it claims and runs itself, app/maintenance/run_once.py), cleanWork's
is ignored."""
from __future__ import annotations

from flask import Blueprint

from app.contract import Int, Loose, rule
from app.maintenance import autotune, passes
from app.maintenance.schemas import AutotuneReport, AutotuneRequest, Report
from app.web.contract import Ok, endpoint

bp = Blueprint("seed_maintenance", __name__)
SEED = {"face": "seed", "tag": "seed", "auth": "admin", "body_required": False, "nul_allowed": ("",)}


class Ignored(Loose):
    """An optional body whose fields are ignored."""


class RunWorkRequest(Loose):
    """runWork's optional body; other fields are ignored."""

    max_tasks: Int(0, 10000) | None = rule(
        "pending jobs to claim and run in this call, 0-10000 (absent: ASYNCH_RUN_WORK_MAX_TASKS)", None)


@bp.post("/task/runWork")
@endpoint("Run the worker pass now: the retry pass (as POST /v1/maintenance/retry), then up to maxTasks "
          "pending jobs claimed and run by this call", body=RunWorkRequest, ok=Ok(Report, "its report"), **SEED)
def run_work(body: RunWorkRequest):
    return passes.run_work(body.max_tasks).as_dict()


@bp.post("/task/cleanWork")
@endpoint("Run cleanup, due retries, then recovery, now", body=Ignored, ok=Ok(Report, "{cleanup: {...}, recover: {...}}"), **SEED)
def clean_work(body: Ignored):
    return passes.clean_work().as_dict()


@bp.post("/model/autoTune")
@endpoint("Run autotune now", body=AutotuneRequest, ok=Ok(AutotuneReport, "the decisions"), **SEED)
def auto_tune(body: AutotuneRequest):
    return autotune.autotune(body.window, body.dry_run).as_dict()
