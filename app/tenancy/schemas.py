"""Tenancy contracts: API keys."""
from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from app.contract import NO_NUL, Int, Params, Shape, StrictBool, Text, Timestamp, rule
from app.errors import ValidationFailed

# Every tenant name, whatever names it (a key, a limits row, the gateway's
# X-User-Info): no "~" and no ":", so a tenant can never be an internal row
# (a callback secret's "~prev:" row, app/delivery/signing_secrets.py) nor add a
# separator to a Redis key built from it (app/infra/redis/keys.py).
TENANT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TENANT_RULE = "1-64 letters, digits, _ . - (starting with a letter or digit)"
TenantId = Annotated[str, Field(pattern=TENANT_PATTERN)]
_TENANT = re.compile(TENANT_PATTERN.replace("$", "\\Z"))  # \Z: "$" also matches before a final newline


def is_tenant_name(name: object) -> bool:
    return isinstance(name, str) and _TENANT.match(name) is not None


def check_tenant(name: str) -> None:
    if not is_tenant_name(name):
        raise ValidationFailed("invalid tenant", [{"pointer": "/tenant",
                                                   "message": "must be 1-64 letters, digits, _ . -"}])


Role = Literal["admin", "user"]


class ApiKeyInput(Shape):
    invalid: ClassVar[str] = "invalid API key request"
    tenant: TenantId = rule("1-64 letters, digits, _ . -")
    role: Role = Field("user", description="admin or user")
    admin: StrictBool | None = Field(None, description="true: the same as role admin")
    name: Annotated[str, Field(max_length=128, pattern=NO_NUL)] = rule("a string of at most 128 characters", "")

    @property
    def effective_role(self) -> Role:
        return "admin" if self.admin else self.role


class ApiKeyView(Shape):
    id: int
    tenant: str
    role: Role
    name: str
    prefix: str
    created_at: Timestamp
    revoked_at: Timestamp | None

    @classmethod
    def from_row(cls, row, **extra) -> "ApiKeyView":
        return cls.model_construct(id=row.id, tenant=row.tenant_id, role=row.role, name=row.name, prefix=row.prefix,
                                   created_at=row.created_at, revoked_at=row.revoked_at, **extra)


class ApiKeyCreated(ApiKeyView):
    key: str = Field(description="the key itself, shown once")


class ApiKeyList(Shape):
    keys: list[ApiKeyView]


class KeysQuery(Params):
    tenant: Text | None = None


# --- limits ----------------------------------------------------------------------------

ModelNameKey = Annotated[str, Field(pattern="^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]


# model_name -> a count; keys that are no model name are refused (the schema says so too).
PerModel = Annotated[dict[ModelNameKey, Int(0, 1_000_000) | None],
                      Field(json_schema_extra={"additionalProperties": False})]


class TenantLimitsInput(Shape):
    """A tenant's limits; a field left out keeps its value, null restores the default."""

    invalid: ClassVar[str] = "invalid tenant limits"

    weight: Int(1, 1000) | None = rule(
        "an integer from 1 to 1000: the tenant's share of model time when tenants compete for a model's workers "
        "(default 1)", None)
    # At least 0.01/s: a bucket of the largest burst then refills within
    # the rate limiter's 1e9 s bound (a smaller rate made every request of
    # the tenant a 500, found by schemathesis).
    rate_per_second: Annotated[float, Field(ge=0.01, le=1_000_000)] | None = rule(
        "requests per second per API key of this tenant, 0.01 to 1000000 (default ASYNCH_RATE_LIMIT_PER_SECOND)",
        None)
    burst: Int(1, 10_000_000) | None = rule("the token bucket's size (default twice the rate)", None)
    max_waiters: Int(0, 1_000_000) | None = rule(
        "concurrent long-polls per API process (default ASYNCH_WAITERS_PER_TENANT)", None)
    busy_budget: Int(0, 1_000_000) | None = rule(
        "free busy answers (429/503) this tenant has in hand per model: each returns its job to the queue "
        "without spending a retry, earned back one per done answer (default ASYNCH_UPSTREAM_BUSY_BUDGET)", None)
    queue_limits: PerModel | None = Field(
        None, description="model_name -> how many of the model's queue slots this tenant may hold "
                          "(null: the model's tenant_queue_limit)")
    min_concurrency: PerModel | None = Field(
        None, description="model_name -> concurrent jobs reserved for this tenant on the model whenever it has "
                          "work: it is dispatched first while below it (null: none)")
    burst_concurrency: PerModel | None = Field(
        None, description="model_name -> the most concurrent jobs this tenant may run on the model, at least its "
                          "min_concurrency (null: the model's max_concurrency, which also bounds it)")


class TenantLimits(Shape):
    tenant: str
    weight: int | None
    rate_per_second: float | None
    burst: int | None
    max_waiters: int | None
    busy_budget: int | None
    queue_limits: dict[str, int]
    min_concurrency: dict[str, int]
    burst_concurrency: dict[str, int]
    updated_at: Timestamp | None
