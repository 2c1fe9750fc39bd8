"""v1 routes for webhooks: a tenant's subscriptions, a job's deliveries,
and the replay of a failed delivery.  Parse and render only: the work is
app/delivery/."""
from __future__ import annotations

from flask import Blueprint

from app.errors import NotFound
from app.web.auth import current_principal
from app.web.contract import JOB_ID_PATH, Ok, TENANT_PATH, endpoint
from app.delivery import outbox, subscriptions
from app.delivery.schemas import WebhookDelivery, WebhookDeliveryList, WebhookInput, WebhookList, WebhookView

bp = Blueprint("v1_webhooks", __name__, url_prefix="/v1")

_ID = {"schema": {"type": "integer", "minimum": 0, "maximum": outbox.MAX_ID}}


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
    view = subscriptions.create(current_principal(), tenant, body.url, body.events)
    return WebhookView.model_construct(**view), 201


@bp.delete("/tenants/<tenant>/webhooks/<int:webhook_id>")
@endpoint("Delete a tenant webhook", tag="webhooks", path={**TENANT_PATH, "webhook_id": _ID}, errors=(403, 422),
          ok={204: Ok(description="deleted")})
def delete_webhook(tenant: str, webhook_id: int):
    subscriptions.remove(current_principal(), tenant, webhook_id)
    return None, 204


@bp.get("/jobs/<job_id>/webhooks")
@endpoint("A job's webhook deliveries and their logs", tag="webhooks", ok=Ok(WebhookDeliveryList, "the deliveries"),
          path=JOB_ID_PATH,
          description="404 for unknown jobs and other tenants' jobs; an empty list before a terminal state.")
def job_webhooks(job_id: str):
    views = outbox.job_deliveries(current_principal(), job_id)
    if views is None:
        raise NotFound(f"job not found: {job_id}")
    return WebhookDeliveryList.model_construct(deliveries=[WebhookDelivery.of(v) for v in views])


@bp.post("/webhook-deliveries/<int:delivery_id>/replay")
@endpoint("Re-send a failed webhook delivery", tag="webhooks", path={"delivery_id": _ID}, errors=(409,),
          ok=Ok(WebhookDelivery, "the delivery, pending again"),
          description="The same webhook-id and body, a fresh attempt budget. 404: no such delivery (or another "
                      "tenant's); 409: not failed.")
def replay_delivery(delivery_id: int):
    return WebhookDelivery.of(outbox.replay(current_principal(), delivery_id))
