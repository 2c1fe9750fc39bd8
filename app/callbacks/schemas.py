"""Callback contracts: a job's delivery with its log, and a tenant's signing secret."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.contract import Shape, Timestamp


class DeliveryAttempt(Shape):
    attempt: int
    at: Timestamp | None
    duration_ms: int | None
    address: str | None
    http_status: int | None
    error: str | None


class CallbackDelivery(Shape):
    job_id: str
    url: str
    status: Literal["pending", "sending", "delivered", "failed"]
    attempts: int
    next_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    last_error: str | None
    log: list[DeliveryAttempt]


class TenantSecret(Shape):
    tenant: str
    secret: Annotated[str, Field(pattern="^whsec_")]
    created_at: Timestamp
    rotated_at: Timestamp | None

    @classmethod
    def from_row(cls, row) -> "TenantSecret":
        return cls.model_construct(tenant=row.tenant_id, secret=row.secret, created_at=row.created_at,
                                   rotated_at=row.rotated_at)
