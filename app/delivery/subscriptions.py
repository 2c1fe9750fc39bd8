"""A tenant's webhook subscriptions: a URL, an event filter, a secret.

Each signs its deliveries with its own ``whsec_`` secret, stored encrypted
(app/infra/secretbox.py), shown to the tenant's own keys and admins only.
The URL passes the SSRF guard at creation (and at every attempt).  At most
MAX_PER_TENANT per tenant.  A deleted subscription's pending deliveries fail.
"""
from __future__ import annotations

from sqlalchemy import delete, func, insert, select

from app.clock import now as clock_now
from app.delivery import signing_secrets as tenant_secrets
from app.errors import NotFound, ValidationFailed
from app.infra.db import transaction
from app.infra.http.netguard import Lookups, callback_url_problem
from app.infra.delivery_rows import EVENTS, bits_of, events_of
from app.infra.tables import webhook_subscriptions
from app.tenancy.keys import Principal

MAX_PER_TENANT = 10
W = webhook_subscriptions.c


def _view(row) -> dict:
    return {"id": row.id, "tenant": row.tenant_id, "url": row.url, "events": events_of(row.events),
            "secret": tenant_secrets.plain(row.secret), "created_at": row.created_at}


def create(principal: Principal, tenant_id: str, url: str, events: list[str] | None) -> dict:
    principal.check_tenant_access(tenant_id)
    if problem := callback_url_problem(url, Lookups(tenant_id)):
        raise ValidationFailed("invalid webhook", [{"pointer": "/url", "message": problem}])
    with transaction() as conn:
        # One creator at a time per tenant, so the cap holds under races.
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext("asynch-webhooks:" + tenant_id))))
        n = conn.execute(select(func.count()).select_from(webhook_subscriptions)
                         .where(W.tenant_id == tenant_id)).scalar_one()
        if n >= MAX_PER_TENANT:
            raise ValidationFailed("invalid webhook", [{"pointer": "/url", "message":
                                                        f"a tenant has at most {MAX_PER_TENANT} webhooks"}])
        row = conn.execute(insert(webhook_subscriptions).values(
            tenant_id=tenant_id, url=url, events=bits_of(events or EVENTS),
            secret=tenant_secrets.new_secret(), created_at=clock_now())
            .returning(*webhook_subscriptions.c)).one()
    return _view(row)


def list_for(principal: Principal, tenant_id: str) -> list[dict]:
    principal.check_tenant_access(tenant_id)
    with transaction() as conn:
        rows = conn.execute(select(webhook_subscriptions).where(W.tenant_id == tenant_id)
                            .order_by(W.created_at, W.id)).all()
    return [_view(r) for r in rows]


def remove(principal: Principal, tenant_id: str, subscription_id: int) -> None:
    principal.check_tenant_access(tenant_id)
    if not 0 <= subscription_id <= 2 ** 63 - 1:
        raise NotFound("no such webhook")
    with transaction() as conn:
        gone = conn.execute(delete(webhook_subscriptions).where(
            W.id == subscription_id, W.tenant_id == tenant_id).returning(W.id)).first()
    if gone is None:
        raise NotFound("no such webhook")
