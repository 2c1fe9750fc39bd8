"""Per-tenant callback signing secrets and the signature itself.

Signature: ``X-Asynch-Signature: sha256=<hex>`` where hex is
HMAC-SHA256(secret, "{task_id}.{timestamp}.{url}") and ``url`` is the exact
URL requested (callbackUrl/bizName?task_id=...&state=...&oss_file=...&file_type=...),
``timestamp`` the ``X-Asynch-Timestamp`` header (unix seconds).  A secret is
generated on a tenant's first use and can be rotated by an admin.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from app.clock import now as clock_now
from app.errors import Forbidden, ValidationFailed
from app.infra.db import transaction
from app.infra.tables import tenant_secrets
from app.tenancy.keys import Principal
from app.tenancy.schemas import TENANT_PATTERN

TENANT = re.compile(TENANT_PATTERN.replace("$", "\\Z"))  # \Z: "$" also matches before a final newline


def _new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def _check_tenant(tenant_id: str) -> None:
    if not isinstance(tenant_id, str) or not TENANT.match(tenant_id):
        raise ValidationFailed("invalid tenant", [{"pointer": "/tenant", "message": "must be 1-64 letters, digits, _ . -"}])


def read_secret(principal: Principal, tenant_id: str) -> dict:
    """A tenant's secret for its own keys or an admin (else 403)."""
    if not principal.is_admin and principal.tenant_id != tenant_id:
        raise Forbidden("admin key required")
    with transaction() as conn:
        return tenant_secret(conn, tenant_id)


def rotate(tenant_id: str) -> dict:
    """A new secret for ``tenant_id`` (admins): its own unit of work."""
    with transaction() as conn:
        return rotate_secret(conn, tenant_id)


def tenant_secret(conn: Connection, tenant_id: str) -> dict:
    """The tenant's secret, created on first use (racing creators agree)."""
    _check_tenant(tenant_id)
    ins = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(ins(tenant_secrets).values(tenant_id=tenant_id, secret=_new_secret(), created_at=clock_now())
                 .on_conflict_do_nothing(index_elements=["tenant_id"]))
    row = conn.execute(select(tenant_secrets).where(tenant_secrets.c.tenant_id == tenant_id)).one()
    return _view(row)


def rotate_secret(conn: Connection, tenant_id: str) -> dict:
    """A new secret; deliveries signed from now on use it."""
    tenant_secret(conn, tenant_id)
    row = conn.execute(update(tenant_secrets).where(tenant_secrets.c.tenant_id == tenant_id)
                       .values(secret=_new_secret(), rotated_at=clock_now()).returning(*tenant_secrets.c)).one()
    return _view(row)


def secret_of(tenant_id_column):
    """The tenant's secret as a correlated scalar subquery (NULL before its
    first use), labelled ``secret``: the delivery claim reads it in its own
    statement instead of a second query."""
    return (select(tenant_secrets.c.secret).where(tenant_secrets.c.tenant_id == tenant_id_column)
            .correlate(tenant_id_column.table).scalar_subquery().label("secret"))


def _view(row) -> dict:
    return {"tenant": row.tenant_id, "secret": row.secret, "created_at": row.created_at, "rotated_at": row.rotated_at}


def sign(secret: str, task_id: str, timestamp: int, url: str) -> str:
    msg = f"{task_id}.{timestamp}.{url}".encode()
    return "sha256=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def verify(secret: str, task_id: str, timestamp: str, url: str, signature: str) -> bool:
    """What a receiver does (also used by the tests' receiver)."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(sign(secret, task_id, ts, url), signature or "")
