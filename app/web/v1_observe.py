"""v1 read-only views for operators and the console: live numbers per model,
throughput/P90 series, and one job with its timeline."""
from __future__ import annotations

from flask import Blueprint

from app.jobs import service as jobs
from app.jobs.schemas import JobDetail
from app.observe import live
from app.observe.schemas import Overview, Series, SeriesQuery
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint
from app.web.v1_jobs import job_urls

bp = Blueprint("v1_observe", __name__, url_prefix="/v1")


@bp.get("/overview")
@endpoint("Live numbers per model: queue depth vs limit, running vs concurrency, runtime overrides",
          tag="observe", ok=Ok(Overview, "models (users: enabled ones, with their own tenant's jobs only)"))
def overview():
    p = current_principal()
    return {"models": live.model_live(include_disabled=p.is_admin, tenant_id=None if p.is_admin else p.tenant_id)}


@bp.get("/overview/series")
@endpoint("Done jobs and P90 created->finished seconds per model, in 12 buckets over the window", tag="observe",
          query=SeriesQuery, ok=Ok(Series, "series (users: their own jobs)"))
def overview_series(query: SeriesQuery):
    p = current_principal()
    return live.throughput_series(query.minutes, max(1, query.minutes // 12), None if p.is_admin else p.tenant_id)


@bp.get("/jobs/<job_id>")
@endpoint("A job with its timeline (the console's job page)", tag="jobs", ok=Ok(JobDetail, "the job"),
          path={"job_id": {"description": "job id (job_...)"}},
          description="The row keeps the latest attempt only: earlier attempts' errors are not kept.")
def job_detail(job_id: str):
    p = current_principal()
    row = jobs.get_job(p, job_id)
    return JobDetail.from_row(row, job_urls(row), admin=p.is_admin)
