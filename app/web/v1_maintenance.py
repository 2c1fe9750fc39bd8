"""v1 maintenance triggers (admins): run a pass now and get its report."""
from __future__ import annotations

from flask import Blueprint

from app.maintenance import autotune, passes, periodic
from app.maintenance.schemas import (
    AutotuneReport,
    AutotuneRequest,
    BeatRuns,
    Report,
    RunsQuery,
)
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_maintenance", __name__, url_prefix="/v1/maintenance")

_PASSES = {"retry": passes.run_work, "recover": passes.recover, "cleanup": passes.cleanup,
           "reconcile": passes.reconcile_gates}


@bp.post("/<any(retry, recover, cleanup, reconcile):name>")
@endpoint("Run a pass now: retry (due retries re-admitted, long-waiting retries promoted, lost messages re-sent), "
          "recover (wiped Redis repaired, expired leases, overdue jobs, lost messages, gates, permits), cleanup "
          "(expired claimed jobs and old terminal jobs deleted with their results; overdue jobs timed out), "
          "reconcile (gate slot sets made equal to the pending/running rows)", tag="maintenance", auth="admin",
          ok=Ok(Report, "its report"))
def run_pass(name: str):
    return _PASSES[name]().as_dict()


@bp.post("/autotune")
@endpoint("Run autotune now", tag="maintenance", auth="admin", body=AutotuneRequest, body_required=False,
          nul_allowed=("",), ok=Ok(AutotuneReport, "the decisions"))
def run_autotune(body: AutotuneRequest):
    return autotune.autotune(body.window, body.dry_run).as_dict()


@bp.get("/runs")
@endpoint("The last periodic runs beat got done", tag="maintenance", auth="admin", query=RunsQuery,
          ok=Ok(BeatRuns, "newest last"))
def recent_runs(query: RunsQuery):
    return {"runs": periodic.recent_runs(query.limit)}
