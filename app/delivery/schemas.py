"""Delivery contracts: a job's callback and its webhook deliveries with their
attempt logs (apart, or both in one list), a tenant's signing secret, and its webhook subscriptions (in
and out).  One outbox row shape underneath (app/delivery/outbox.py); the two
views keep the wire shapes they always had."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.contract import Shape, Timestamp

Status = Literal["pending", "sending", "delivered", "failed"]
WebhookEvent = Literal["done", "failed", "timeout", "canceled"]
WebhookUrl = Annotated[str, Field(min_length=1, max_length=2048,
                                  description="http(s) to a public address (the callbacks' SSRF guard)")]


class DeliveryAttempt(Shape):
    attempt: int
    at: Timestamp | None
    duration_ms: int | None
    address: str | None = Field(description="admins: the IP address connected to; a tenant: the host of its URL "
                                            "(null: the attempt connected nowhere)")
    http_status: int | None
    error: str | None


class _Delivery(Shape):
    status: Status
    attempts: int
    next_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    last_error: str | None
    log: list[DeliveryAttempt]

    @classmethod
    def of(cls, view: dict):
        """The shape of a service view (app/delivery/outbox.py ``view``)."""
        return cls.model_construct(**{**view, "log": [DeliveryAttempt.model_construct(**a) for a in view["log"]]})


class CallbackDelivery(_Delivery):
    job_id: str
    url: str


class WebhookDelivery(_Delivery):
    id: int
    job_id: str
    tenant: str
    event: WebhookEvent
    url: str
    subscription_id: int | None = Field(description="the tenant webhook; null: the job's own (X-Webhook-Url)")


class WebhookDeliveryList(Shape):
    deliveries: list[WebhookDelivery]


class JobDelivery(_Delivery):
    """One of a job's deliveries, either kind: what the console's job page lists."""
    id: int
    kind: Literal["callback", "webhook"] = Field(description="callback: the seed's signed GET on done; webhook: a "
                                                             "Standard Webhooks POST")
    job_id: str
    event: WebhookEvent = Field(description="the terminal state it was sent for")
    url: str
    subscription_id: int | None = Field(description="webhooks: the tenant webhook; null: the job's own "
                                                    "(X-Webhook-Url), and every callback")


class JobDeliveryList(Shape):
    deliveries: list[JobDelivery]


class TenantSecret(Shape):
    tenant: str
    secret: Annotated[str, Field(pattern="^whsec_")]
    created_at: Timestamp
    rotated_at: Timestamp | None


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
