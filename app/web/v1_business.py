"""v1 routes for the seed-002 features: usage stats, model types, a job's
callback delivery log, and the tenants' callback signing secrets."""
from __future__ import annotations

from flask import Blueprint

from app.delivery import outbox, secrets as tenant_secrets
from app.delivery.schemas import CallbackDelivery, TenantSecret
from app.catalog import model_types
from app.catalog.schemas import ModelTypeInput, ModelTypeList, ModelTypePatch, ModelTypeView
from app.errors import NotFound
from app.jobs import service as jobs, stats
from app.jobs.usage_schemas import Usage, UsageQuery
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, Ok, TENANT_PATH, endpoint

bp = Blueprint("v1_business", __name__, url_prefix="/v1")

_TYPE_ID = {"type_id": {"schema": {"type": "integer", "minimum": 0}}}


@bp.get("/stats")
@endpoint("Usage: one count per model call, by day, tenant, creator and model", tag="stats", query=UsageQuery,
          errors=(403,), ok=Ok(Usage, "counts"),
          description="Users see their own tenant; another tenant is 403. Bad dates or from after to: 422.")
def usage(query: UsageQuery):
    return stats.usage(current_principal(), query)


@bp.get("/model-types")
@endpoint("Model types", tag="models", ok=Ok(ModelTypeList, "the types"))
def list_types():
    return ModelTypeList.model_construct(model_types=[ModelTypeView.from_row(r) for r in model_types.list_types()])


@bp.post("/model-types")
@endpoint("Create a model type (without type_id: the next free id)", tag="models", auth="admin",
          body=ModelTypeInput, errors=(409,), ok={201: Ok(ModelTypeView, "created")})
def create_type(body: ModelTypeInput):
    return ModelTypeView.from_row(model_types.create_type(body)), 201


@bp.route("/model-types/<int:type_id>", methods=["PUT", "PATCH"])
@endpoint("Update a model type (only the fields given change)", tag="models", auth="admin", body=ModelTypePatch,
          path=_TYPE_ID, ok=Ok(ModelTypeView, "updated"))
def update_type(type_id: int, body: ModelTypePatch):
    return ModelTypeView.from_row(model_types.update_type(type_id, body))


@bp.delete("/model-types/<int:type_id>")
@endpoint("Delete a model type (409 while a model's models_type names it)", tag="models", auth="admin",
          errors=(409,), path=_TYPE_ID, ok={204: Ok(description="deleted")})
def delete_type(type_id: int):
    model_types.delete_type(type_id)
    return None, 204


@bp.get("/jobs/<job_id>/callback")
@endpoint("A job's callback and its delivery log", tag="callbacks", ok=Ok(CallbackDelivery, "the callback"),
          path=JOB_ID_PATH,
          description="404 for unknown jobs, other tenants' jobs and jobs without a callback.")
def job_callback(job_id: str):
    principal = current_principal()
    jobs.get_job(principal, job_id)  # 404 for unknown and other tenants' jobs
    view = outbox.callback_view(principal, job_id)
    if view is None:
        raise NotFound(f"no callback for job: {job_id}")
    return CallbackDelivery.of(view)


@bp.get("/tenants/<tenant>/callback-secret")
@endpoint("A tenant's callback signing secret (created on first use)", tag="callbacks", path=TENANT_PATH,
          errors=(403, 422), ok=Ok(TenantSecret, "the secret"),
          description="A user key only for its own tenant (else 403); 422: not a tenant id.")
def read_secret(tenant: str):
    return TenantSecret.model_construct(**tenant_secrets.read_secret(current_principal(), tenant))


@bp.post("/tenants/<tenant>/callback-secret/rotate")
@endpoint("Rotate a tenant's callback signing secret", tag="callbacks", auth="admin", path=TENANT_PATH, errors=(422,),
          ok=Ok(TenantSecret, "the new secret"))
def rotate_secret(tenant: str):
    return TenantSecret.model_construct(**tenant_secrets.rotate(tenant))
