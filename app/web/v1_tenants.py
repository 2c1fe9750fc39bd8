"""v1 tenant limits (docs/api.md, "Tenant limits"): a tenant's dispatch
weight, request rate, long-poll cap and per-model queue caps.  A tenant's
own keys may read them; admins change them."""
from __future__ import annotations

from flask import Blueprint

from app.tenancy import limits
from app.tenancy.schemas import TENANT_PATTERN, TenantLimits, TenantLimitsInput
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_tenants", __name__, url_prefix="/v1")

_TENANT = {"tenant": {"description": "tenant id", "schema": {"type": "string", "pattern": TENANT_PATTERN}}}


@bp.get("/tenants/<tenant>/limits")
@endpoint("A tenant's limits (its own keys, or an admin)", tag="tenants", path=_TENANT, errors=(403, 422),
          ok=Ok(TenantLimits, "the limits; null fields take the defaults"))
def read_limits(tenant: str):
    return limits.read(current_principal(), tenant)


@bp.route("/tenants/<tenant>/limits", methods=["PUT", "PATCH"])
@endpoint("Change a tenant's limits (only the fields given; null restores the default)", tag="tenants",
          auth="admin", path=_TENANT, body=TenantLimitsInput, errors=(422,), ok=Ok(TenantLimits, "the limits"))
def update_limits(tenant: str, body: TenantLimitsInput):
    return limits.update(tenant, body)
