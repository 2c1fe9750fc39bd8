"""v1 read-only views for operators and the console: live numbers per model,
throughput/P90 series, one job with its timeline and attempts, the workers,
the maintenance state, and a tenant's queue share and rate-limit state."""
from __future__ import annotations

from flask import Blueprint

from app.jobs.schemas import JobDetail
from app.observe import live, ops
from app.observe.schemas import MaintenanceState, Overview, Series, SeriesQuery, TenantList, TenantState, Workers
from app.tenancy import keys
from app.web import ratelimit
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, Ok, TENANT_PATH, endpoint
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
@endpoint("A job with its timeline and its ended attempts (the console's job page)", tag="jobs",
          ok=Ok(JobDetail, "the job"), path=JOB_ID_PATH,
          description="The row keeps the latest attempt; `attempts` lists every attempt that ended, with its error.")
def job_detail(job_id: str):
    p = current_principal()
    row, attempts = ops.job_with_attempts(p, job_id)
    return JobDetail.from_row(row, job_urls(row), admin=p.is_admin, attempts=attempts)


@bp.get("/workers")
@endpoint("The Celery nodes: liveness, heartbeat age, queues and the jobs each runs", tag="observe", auth="admin",
          ok=Ok(Workers, "the nodes"))
def workers():
    return ops.workers()


@bp.get("/maintenance/state")
@endpoint("The beat leader, the latest run of each periodic task, and each gate against its rows", tag="maintenance",
          auth="admin", ok=Ok(MaintenanceState, "the state"))
def maintenance_state():
    return ops.maintenance_state()


@bp.get("/tenants")
@endpoint("The tenants the caller may look at (admins: every tenant with a key or limits; users: their own)",
          tag="tenants", ok=Ok(TenantList, "tenant ids"))
def tenant_list():
    p = current_principal()
    return {"tenants": ops.tenants(p), "caller": p.tenant_id}


@bp.get("/tenants/<tenant>/state")
@endpoint("A tenant's queue share in use per model and its keys' rate-limit buckets (its own keys, or an admin)",
          tag="tenants", path=TENANT_PATH, errors=(403, 422), ok=Ok(TenantState, "the state"))
def tenant_state(tenant: str):
    out = ops.tenant_state(current_principal(), tenant)
    key_ids = [k.id for k in keys.list_keys(tenant) if k.revoked_at is None]
    out["rate"] = ratelimit.tenant_rate_state(tenant, key_ids)
    return out
