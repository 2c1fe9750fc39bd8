"""v1 administration and operator views: models, API keys, tenant limits
(docs/api.md, "Tenant limits"), the maintenance triggers and the console's
read-only views; who may call each is in its declaration."""
from __future__ import annotations

from flask import Blueprint

from app.catalog import registry
from app.catalog.schemas import ModelInput, ModelList, ModelPatch, model_view
from app.jobs import waiting
from app.jobs.schemas import JobDetail, WaitingOn
from app.maintenance import autotune, passes, periodic
from app.maintenance.schemas import AutotuneReport, AutotuneRequest, BeatRuns, Report, RunsQuery
from app.observe import live, ops
from app.observe.schemas import MaintenanceState, Overview, Series, SeriesQuery, TenantList, TenantState, Workers
from app.tenancy import keys, limits
from app.tenancy.schemas import ApiKeyCreated, ApiKeyInput, ApiKeyList, ApiKeyView, KeysQuery, TenantLimits, \
    TenantLimitsInput
from app.web import ratelimit
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, TENANT_PATH, Ok, endpoint
from app.web.v1_jobs import job_urls

bp = Blueprint("v1_admin", __name__, url_prefix="/v1")

_NAME = {"name": {"description": "model_name"}}


@bp.get("/models")
@endpoint("List models (users: enabled ones, fewer fields)", tag="models", ok=Ok(ModelList, "models"))
def list_models():
    p = current_principal()
    return ModelList.model_construct(models=[model_view(r, p.is_admin) for r in registry.visible_models(p)])


@bp.post("/models")
@endpoint("Create a model", tag="models", auth="admin", body=ModelInput, errors=(409,),
          ok={201: Ok(model_view.admin, "created")})
def create_model(body: ModelInput):
    return model_view(registry.create_model(body), True), 201


@bp.get("/models/<name>")
@endpoint("A model (users: enabled ones, fewer fields)", tag="models", path=_NAME, ok=Ok(model_view.any, "the model"))
def get_model(name: str):
    p = current_principal()
    return model_view(registry.get_model(p, name), p.is_admin)


@bp.route("/models/<name>", methods=["PUT", "PATCH"])
@endpoint("Update a model (only the fields given change)", tag="models", auth="admin", body=ModelPatch,
          path=_NAME, ok=Ok(model_view.admin, "updated"))
def update_model(name: str, body: ModelPatch):
    return model_view(registry.update_model(name, body), True)


@bp.delete("/models/<name>")
@endpoint("Delete a model (409 while it has active jobs)", tag="models", auth="admin", errors=(409,), path=_NAME,
          ok={204: Ok(description="deleted")})
def delete_model(name: str):
    registry.delete_model(name)


@bp.post("/keys")
@endpoint("Create an API key; the key is shown once", tag="keys", auth="admin", body=ApiKeyInput,
          ok={201: Ok(ApiKeyCreated, "created")})
def create_key(body: ApiKeyInput):
    key, row = keys.create_key(body.tenant, body.effective_role, body.name)
    return ApiKeyCreated.from_row(row, key=key), 201


@bp.get("/keys")
@endpoint("List API keys (never the secrets)", tag="keys", auth="admin", query=KeysQuery, ok=Ok(ApiKeyList, "keys"))
def list_keys(query: KeysQuery):
    return ApiKeyList.model_construct(keys=[ApiKeyView.from_row(r) for r in keys.list_keys(query.tenant)])


@bp.delete("/keys/<int:key_id>")
@endpoint("Revoke an API key", tag="keys", auth="admin", ok=Ok(ApiKeyView, "revoked"))
def revoke_key(key_id: int):
    return ApiKeyView.from_row(keys.revoke_key(key_id))


@bp.get("/tenants/<tenant>/limits")
@endpoint("A tenant's limits (its own keys, or an admin)", tag="tenants", path=TENANT_PATH, errors=(403, 422),
          ok=Ok(TenantLimits, "the limits; null fields take the defaults"))
def read_limits(tenant: str):
    return limits.read(current_principal(), tenant)


@bp.route("/tenants/<tenant>/limits", methods=["PUT", "PATCH"])
@endpoint("Change a tenant's limits (only the fields given; null restores the default)", tag="tenants",
          auth="admin", path=TENANT_PATH, body=TenantLimitsInput, errors=(422,), ok=Ok(TenantLimits, "the limits"))
def update_limits(tenant: str, body: TenantLimitsInput):
    return limits.update(tenant, body)


@bp.post("/maintenance/<any(retry, recover, cleanup, reconcile):name>")
@endpoint("Run a pass now: retry (due retries re-admitted, long-waiting retries promoted, lost messages re-sent), "
          "recover (wiped Redis repaired, expired leases, overdue jobs, lost messages, gates, permits), cleanup "
          "(expired claimed jobs and old terminal jobs deleted with their results; overdue jobs timed out), "
          "reconcile (gate slot sets made equal to the pending/running rows)", tag="maintenance", auth="admin",
          ok=Ok(Report, "its report"))
def run_pass(name: str):
    return {"retry": passes.run_work, "recover": passes.recover, "cleanup": passes.cleanup,
            "reconcile": passes.reconcile_gates}[name]().as_dict()


@bp.post("/maintenance/autotune")
@endpoint("Run autotune now", tag="maintenance", auth="admin", body=AutotuneRequest, body_required=False,
          nul_allowed=("",), ok=Ok(AutotuneReport, "the decisions"))
def run_autotune(body: AutotuneRequest):
    return autotune.autotune(body.window_seconds, body.dry_run).as_dict()


@bp.get("/maintenance/runs")
@endpoint("The last periodic runs beat got done", tag="maintenance", auth="admin", query=RunsQuery,
          ok=Ok(BeatRuns, "newest last"))
def recent_runs(query: RunsQuery):
    return {"runs": periodic.recent_runs(query.limit)}


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
    detail = JobDetail.from_row(row, job_urls(row), admin=p.is_admin, attempts=attempts)
    if held := waiting.of_job(row):  # pending: what holds it now
        detail.waiting_on = WaitingOn.model_construct(**held)
    return detail


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
    out["rate"] = ratelimit.tenant_rate_state(tenant, [k.id for k in keys.list_keys(tenant) if k.revoked_at is None])
    return out
