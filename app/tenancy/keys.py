"""API keys: ``ak_<prefix>_<secret>``.  Only HMAC-SHA256(pepper, key) is
stored; the key is shown once, at creation.  Lookup goes by the public
prefix, then the hashes are compared in constant time."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from app.clock import now as clock_now
from app.config import get_settings
from app.errors import NotFound, Unauthorized, ValidationFailed
from app.infra.tables import api_keys
from app.infra.redis_scripts import publish_invalidate
from app.infra.caches import MISSING, TTLCache

ROLES = ("admin", "user")
TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "$" also matches before a final newline
_KEY = re.compile(r"^ak_([a-z0-9]{12})_([A-Za-z0-9_-]{20,128})$")
# Presented-key hash -> Principal, for keys that authenticated.
_cache = TTLCache(lambda: get_settings().auth_cache_seconds)


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    role: str
    key_id: int | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def hash_key(key: str) -> str:
    pepper = get_settings().key_pepper.encode()
    return hmac.new(pepper, key.encode(), hashlib.sha256).hexdigest()


def create_key(conn: Connection, tenant_id: str, role: str = "user", name: str = "") -> tuple[str, dict]:
    errs = []
    if not isinstance(tenant_id, str) or not TENANT.match(tenant_id):
        errs.append({"pointer": "/tenant", "message": "must be 1-64 letters, digits, _ . -"})
    if role not in ROLES:
        errs.append({"pointer": "/role", "message": f"must be one of {list(ROLES)}"})
    if not isinstance(name, str) or len(name) > 128:
        errs.append({"pointer": "/name", "message": "must be a string of at most 128 characters"})
    if errs:
        raise ValidationFailed("invalid API key request", errs)
    prefix = secrets.token_hex(6)
    key = f"ak_{prefix}_{secrets.token_urlsafe(32)}"
    row = conn.execute(insert(api_keys).values(
        tenant_id=tenant_id, role=role, name=name, prefix=prefix,
        key_hash=hash_key(key), created_at=clock_now(),
    ).returning(*api_keys.c)).one()
    return key, key_view(row)


def key_view(row) -> dict:
    return {"id": row.id, "tenant": row.tenant_id, "role": row.role, "name": row.name,
            "prefix": row.prefix, "created_at": row.created_at.isoformat(),
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None}


def list_keys(conn: Connection, tenant_id: str | None = None) -> list[dict]:
    q = select(api_keys).order_by(api_keys.c.id)
    if tenant_id:
        q = q.where(api_keys.c.tenant_id == tenant_id)
    return [key_view(r) for r in conn.execute(q)]


def revoke_key(conn: Connection, key_id: int) -> dict:
    row = conn.execute(update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                       .values(revoked_at=clock_now()).returning(*api_keys.c)).first()
    _cache.invalidate()
    publish_invalidate("keys")
    if row is None:
        row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).first()
        if row is None:
            raise NotFound(f"api key not found: {key_id}")
    return key_view(row)


def authenticate(conn: Connection, key: str | None) -> Principal:
    """The principal behind a presented key, or Unauthorized."""
    if not key:
        raise Unauthorized("missing API key")
    settings = get_settings()
    if settings.bootstrap_admin_key and hmac.compare_digest(
            key.encode(), settings.bootstrap_admin_key.encode()):
        return Principal(tenant_id="admin", role="admin", key_id=None)
    m = _KEY.match(key)
    if not m:
        raise Unauthorized("invalid API key")
    row = conn.execute(select(api_keys).where(api_keys.c.prefix == m.group(1))).first()
    presented = hash_key(key)
    # Compare even when no row matched so timing says nothing about prefixes.
    stored = row.key_hash if row is not None else "0" * 64
    if not hmac.compare_digest(presented, stored) or row is None or row.revoked_at is not None:
        raise Unauthorized("invalid API key")
    return Principal(tenant_id=row.tenant_id, role=row.role, key_id=row.id)


def authenticate_cached(key: str | None, load: Callable[[str | None], Principal]) -> Principal:
    """authenticate() through the per-process cache; ``load`` runs the
    database lookup (in its own transaction) on a miss.  Failures are never
    cached, so a new key works at once."""
    if not key:
        return load(key)
    h = hash_key(key)
    p = _cache.get(h)
    if p is MISSING:
        p = load(key)
        _cache.set(h, p)
    return p
