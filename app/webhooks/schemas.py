"""Webhook contracts: a tenant's subscription (in and out), a delivery with
its attempt log, and the lists of both."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.callbacks.schemas import DeliveryAttempt
from app.contract import Shape, Timestamp

WebhookEvent = Literal["done", "failed", "timeout", "canceled"]
WebhookUrl = Annotated[str, Field(min_length=1, max_length=2048,
                                  description="http(s) to a public address (the callbacks' SSRF guard)")]


class WebhookInput(Shape):
    url: WebhookUrl
    events: Annotated[list[WebhookEvent], Field(min_length=1, max_length=4)] | None = Field(
        None, description="terminal states to POST on (default: all four)")


class WebhookView(Shape):
    id: int
    tenant: str
    url: str
    events: list[WebhookEvent]
    secret: Annotated[str, Field(pattern="^whsec_", description="signs this webhook's deliveries")]
    created_at: Timestamp


class WebhookList(Shape):
    webhooks: list[WebhookView]


class WebhookDelivery(Shape):
    id: int
    job_id: str
    tenant: str
    event: WebhookEvent
    url: str
    subscription_id: int | None = Field(description="the tenant webhook; null: the job's own (X-Webhook-Url)")
    status: Literal["pending", "sending", "delivered", "failed"]
    attempts: int
    next_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    last_error: str | None
    log: list[DeliveryAttempt]

    @classmethod
    def of(cls, view: dict) -> "WebhookDelivery":
        """The shape of a service view (app/webhooks/delivery.py ``_view``)."""
        return cls.model_construct(**{**view, "log": [DeliveryAttempt.model_construct(**a) for a in view["log"]]})


class WebhookDeliveryList(Shape):
    deliveries: list[WebhookDelivery]
