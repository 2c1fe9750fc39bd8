"""Per-tenant callback signing secrets (and the legacy signature).

A secret is ``whsec_`` + standard base64 of 24 random bytes, stored as
``enc1:`` + the bytes encrypted with the application key
(app/infra/secretbox.py); a legacy plaintext ``whsec_...`` row reads as
itself.  Created on a tenant's first use; an admin rotates it, and the
previous one, kept in a row ``~prev:<sha256(tenant)[:40]>`` (created_at: the
rotation time), signs too for ASYNCH_DELIVERY_SECRET_OVERLAP_SECONDS.  "~"
and ":" are no tenant characters (TENANT_PATTERN, app/tenancy/schemas.py):
no tenant can own such a row or read it as its own secret.

The legacy header, for receivers built on the seed: ``X-Asynch-Signature:
sha256=<hex HMAC-SHA256(secret, "{task_id}.{timestamp}.{url}")>``, ``url``
the exact URL requested, ``timestamp`` the ``X-Asynch-Timestamp`` header.
Standard Webhooks signatures: app/delivery/signing.py.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.delivery.signing import PREFIX as WHSEC
from app.infra import secretbox
from app.infra.db import transaction
from app.infra.tables import tenant_secrets
from app.tenancy.keys import Principal
from app.tenancy.schemas import check_tenant


SECRET_BYTES = 24  # the Standard Webhooks size; its encrypted form fits the column (128)


def new_secret() -> str:
    """The stored form of a fresh secret (encrypted): tenants' and webhook subscriptions'."""
    return secretbox.encrypt_bytes(secrets.token_bytes(SECRET_BYTES))


def plain(stored: str) -> str:
    """The ``whsec_`` secret of a stored value (encrypted or a legacy plaintext row)."""
    if secretbox.is_encrypted(stored):
        return WHSEC + base64.b64encode(secretbox.decrypt_bytes(stored)).decode()
    return stored


def previous_id(tenant_id: str) -> str:
    """The previous secret's row: never a tenant name ("~", ":")."""
    return "~prev:" + hashlib.sha256(tenant_id.encode()).hexdigest()[:40]


def read_secret(principal: Principal, tenant_id: str) -> dict:
    """A tenant's secret for its own keys or an admin (else 403)."""
    principal.check_access(tenant_id)
    with transaction() as conn:
        return tenant_secret(conn, tenant_id)


def tenant_secret(conn: Connection, tenant_id: str) -> dict:
    """The tenant's secret, created on first use (racing creators agree)."""
    check_tenant(tenant_id)
    conn.execute(pg_insert(tenant_secrets).values(tenant_id=tenant_id, secret=new_secret(), created_at=clock_now())
                 .on_conflict_do_nothing(index_elements=["tenant_id"]))
    return _view(conn.execute(select(tenant_secrets).where(tenant_secrets.c.tenant_id == tenant_id)).one())


def rotate(tenant_id: str) -> dict:
    """A new secret (admins); deliveries are signed with it from now on, and
    with the previous one too during the overlap window."""
    now = clock_now()
    with transaction() as conn:
        tenant_secret(conn, tenant_id)
        old = conn.execute(select(tenant_secrets.c.secret).where(tenant_secrets.c.tenant_id == tenant_id)
                           .with_for_update()).scalar_one()
        prev = pg_insert(tenant_secrets).values(tenant_id=previous_id(tenant_id), secret=old, created_at=now)
        conn.execute(prev.on_conflict_do_update(index_elements=["tenant_id"],
                                                set_={"secret": old, "created_at": now}))
        return _view(conn.execute(update(tenant_secrets).where(tenant_secrets.c.tenant_id == tenant_id)
                                  .values(secret=new_secret(), rotated_at=now).returning(*tenant_secrets.c)).one())


def signing_secrets(conn: Connection, tenant_id: str, stored: str | None, rotated_at) -> list[str]:
    """The current secret, and the previous one within the overlap window;
    ``stored``/``rotated_at`` are the claim's (None before first use)."""
    if stored is None:
        return [tenant_secret(conn, tenant_id)["secret"]]
    out = [plain(stored)]
    overlap = get_settings().delivery_secret_overlap_seconds
    if rotated_at is not None and overlap > 0 and as_utc(rotated_at) > clock_now() - timedelta(seconds=overlap):
        prev = conn.execute(select(tenant_secrets.c.secret).where(
            tenant_secrets.c.tenant_id == previous_id(tenant_id))).scalar()
        if prev is not None:
            out.append(plain(prev))
    return out


def stored_of(tenant_id_column) -> list:
    """The tenant's ``secret`` and ``secret_rotated_at`` as correlated
    subqueries, for the delivery claim's own statement."""
    return [select(tenant_secrets.c[col]).where(tenant_secrets.c.tenant_id == tenant_id_column)
            .correlate(tenant_id_column.table).scalar_subquery().label(label)
            for col, label in (("secret", "secret"), ("rotated_at", "secret_rotated_at"))]


def reencrypt(conn: Connection, key) -> tuple[int, int]:
    """Every encrypted secret of ``key``'s table re-encrypted with the first
    key; returns (rewritten, left in plaintext: a legacy tenant secret is too
    long to encrypt in its column, until an admin rotates it)."""
    done = left = 0
    for row_key, secret in conn.execute(select(key, key.table.c.secret)).all():
        if not secretbox.is_encrypted(secret):
            left += 1
            continue
        conn.execute(update(key.table).where(key == row_key).values(secret=secretbox.rotate(secret)))
        done += 1
    return done, left


def _view(row) -> dict:
    return {"tenant": row.tenant_id, "secret": plain(row.secret), "created_at": row.created_at,
            "rotated_at": row.rotated_at}


def sign(secret: str, task_id: str, timestamp: int, url: str) -> str:
    msg = f"{task_id}.{timestamp}.{url}".encode()
    return "sha256=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()
