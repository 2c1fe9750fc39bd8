"""v1 routes for the seed-002 features: usage stats, model types, a job's
callback delivery log, the tenants' callback signing secrets, and webhooks
(a tenant's subscriptions, a job's deliveries -- its webhooks, or both kinds
in one list --, the replay of a failed one).
Parse and render only: the work is app/delivery/, app/catalog/, app/jobs/."""
from __future__ import annotations

from flask import Blueprint

from app.delivery import outbox, signing_secrets as tenant_secrets, subscriptions
from app.delivery.schemas import (CallbackDelivery, JobDelivery, JobDeliveryList, TenantSecret, WebhookDelivery,
                                  WebhookDeliveryList, WebhookInput, WebhookList, WebhookView)
from app.catalog import model_types
from app.catalog.schemas import ModelTypeInput, ModelTypeList, ModelTypePatch, ModelTypeView
from app.errors import NotFound
from app.jobs import service as jobs, stats
from app.jobs.stats import Usage, UsageQuery
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, Ok, TENANT_PATH, endpoint

bp = Blueprint("v1_business", __name__, url_prefix="/v1")

_TYPE_ID = {"type_id": {"schema": {"type": "integer", "minimum": 0}}}
_ID = {"schema": {"type": "integer", "minimum": 0, "maximum": outbox.MAX_ID}}


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


@bp.get("/jobs/<job_id>/callback")
@endpoint("A job's callback and its delivery log", tag="callbacks", ok=Ok(CallbackDelivery, "the callback"),
          path=JOB_ID_PATH, description="404 for unknown jobs, other tenants' jobs and jobs without a callback.")
def job_callback(job_id: str):
    principal = current_principal()
    jobs.get_job(principal, job_id)  # 404 for unknown and other tenants' jobs
    if (view := outbox.callback_view(principal, job_id)) is None:
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


@bp.get("/tenants/<tenant>/webhooks")
@endpoint("A tenant's webhooks", tag="webhooks", path=TENANT_PATH, errors=(403, 422),
          ok=Ok(WebhookList, "the webhooks"),
          description="A user key only for its own tenant (else 403); 422: not a tenant id.")
def list_webhooks(tenant: str):
    return WebhookList.model_construct(
        webhooks=[WebhookView.model_construct(**v) for v in subscriptions.list_for(current_principal(), tenant)])


@bp.post("/tenants/<tenant>/webhooks")
@endpoint("Subscribe a URL to the tenant's terminal job states", tag="webhooks", path=TENANT_PATH, body=WebhookInput,
          errors=(403, 422), ok={201: Ok(WebhookView, "created, with its signing secret")},
          description="Each job of the tenant that reaches a state of `events` is POSTed to `url` "
                      "(Standard Webhooks, signed with the webhook's secret). 422: a URL the SSRF guard "
                      f"refuses, or more than {subscriptions.MAX_PER_TENANT} webhooks.")
def create_webhook(tenant: str, body: WebhookInput):
    return WebhookView.model_construct(**subscriptions.create(current_principal(), tenant, body.url, body.events)), 201


@bp.delete("/tenants/<tenant>/webhooks/<int:webhook_id>")
@endpoint("Delete a tenant webhook", tag="webhooks", path={**TENANT_PATH, "webhook_id": _ID}, errors=(403, 422),
          ok={204: Ok(description="deleted")})
def delete_webhook(tenant: str, webhook_id: int):
    subscriptions.remove(current_principal(), tenant, webhook_id)


@bp.get("/jobs/<job_id>/webhooks")
@endpoint("A job's webhook deliveries and their logs", tag="webhooks", ok=Ok(WebhookDeliveryList, "the deliveries"),
          path=JOB_ID_PATH,
          description="404 for unknown jobs and other tenants' jobs; an empty list before a terminal state.")
def job_webhooks(job_id: str):
    if (views := outbox.job_deliveries(current_principal(), job_id)) is None:
        raise NotFound(f"job not found: {job_id}")
    return WebhookDeliveryList.model_construct(deliveries=[WebhookDelivery.of(v) for v in views])


@bp.get("/jobs/<job_id>/deliveries")
@endpoint("A job's deliveries of both kinds (its callback, its webhooks) and their logs", tag="webhooks",
          ok=Ok(JobDeliveryList, "the deliveries, oldest first"), path=JOB_ID_PATH,
          description="404 for unknown jobs and other tenants' jobs; an empty list when the job has none (yet): "
                      "a job without a callback is not an error here, as it is for GET /v1/jobs/{id}/callback.")
def job_all_deliveries(job_id: str):
    if (views := outbox.job_deliveries(current_principal(), job_id, kind=None)) is None:
        raise NotFound(f"job not found: {job_id}")
    return JobDeliveryList.model_construct(deliveries=[JobDelivery.of(v) for v in views])


@bp.post("/webhook-deliveries/<int:delivery_id>/replay")
@endpoint("Re-send a failed webhook delivery", tag="webhooks", path={"delivery_id": _ID}, errors=(409,),
          ok=Ok(WebhookDelivery, "the delivery, pending again"),
          description="The same webhook-id and body, a fresh attempt budget. 404: no such delivery (or another "
                      "tenant's); 409: not failed.")
def replay_delivery(delivery_id: int):
    return WebhookDelivery.of(outbox.replay(current_principal(), delivery_id))
