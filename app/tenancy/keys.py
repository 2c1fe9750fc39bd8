"""API keys: ``ak_<prefix>_<secret>``.  Only HMAC-SHA256(pepper, key) is
stored; the key is shown once, at creation.  Lookup goes by the public
prefix, then the hashes are compared in constant time."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from cachetools import TTLCache
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Row

from app.clock import now as clock_now
from app.config import get_settings
from app.contract import parse
from app.errors import Forbidden, NotFound, Unauthorized
from app.infra import caches
from app.infra.caches import MISSING
from app.infra.db import transaction
from app.infra.redis.events import publish_invalidate
from app.infra.tables import api_keys
from app.tenancy.schemas import ApiKeyInput, check_tenant

_KEY = re.compile(r"^ak_([a-z0-9]{12})_([A-Za-z0-9_-]{20,128})$")
# Presented-key hash -> Principal, for keys that authenticated.
_cache = caches.register(lambda: TTLCache(maxsize=10_000, ttl=max(1e-6, get_settings().auth_cache_seconds)),
                         enabled=lambda: get_settings().auth_cache_seconds > 0)


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    role: str
    key_id: int | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def check_access(self, tenant_id: str) -> None:
        """A tenant's own keys or an admin; else 403."""
        if not self.is_admin and self.tenant_id != tenant_id:
            raise Forbidden("admin key required")

    def check_tenant_access(self, tenant_id: str) -> None:
        """A tenant id (else 422) the principal may act for (else 403)."""
        check_tenant(tenant_id)
        self.check_access(tenant_id)


# The operator at the command line: an admin of every tenant.
OPERATOR = Principal(tenant_id="admin", role="admin", key_id=None)


def hash_key(key: str) -> str:
    pepper = get_settings().key_pepper.encode()
    return hmac.new(pepper, key.encode(), hashlib.sha256).hexdigest()


def create_key(tenant_id: str, role: str = "user", name: str = "") -> tuple[str, Row]:
    """A new key for ``tenant_id``; returns (the key, shown once, and its row)."""
    spec = parse(ApiKeyInput, {"tenant": tenant_id, "role": role, "name": name}, message="invalid API key request")
    with transaction() as conn:
        return _insert_key(conn, spec)


def _insert_key(conn, spec: ApiKeyInput) -> tuple[str, Row]:
    prefix = secrets.token_hex(6)
    key = f"ak_{prefix}_{secrets.token_urlsafe(32)}"
    row = conn.execute(insert(api_keys).values(
        tenant_id=spec.tenant, role=spec.effective_role, name=spec.name, prefix=prefix,
        key_hash=hash_key(key), created_at=clock_now(),
    ).returning(*api_keys.c)).one()
    return key, row


def sole_key(tenant_id: str, role: str, name: str, current: str | None) -> str:
    """The one live key named ``name`` of (tenant, role): ``current`` while it
    still authenticates as such a key, else a new one; every other live key of
    that name is revoked in the same transaction (`asynch dev`'s admin key:
    one per data directory however often the stack starts)."""
    spec = parse(ApiKeyInput, {"tenant": tenant_id, "role": role, "name": name}, message="invalid API key request")
    c = api_keys.c
    mine = (c.tenant_id == spec.tenant, c.role == spec.effective_role, c.name == spec.name, c.revoked_at.is_(None))
    with transaction() as conn:
        keep = None
        if current and (m := _KEY.match(current)):
            row = conn.execute(select(api_keys).where(c.prefix == m.group(1), *mine)).first()
            if row is not None and hmac.compare_digest(hash_key(current), row.key_hash):
                keep = row.id
        key = current
        if keep is None:
            key, row = _insert_key(conn, spec)
            keep = row.id
        revoked = conn.execute(update(api_keys).where(*mine, c.id != keep).values(revoked_at=clock_now())).rowcount
    if revoked:  # after the commit, as revoke_key does
        _cache.clear()
        publish_invalidate("keys")
    return key


def list_keys(tenant_id: str | None = None) -> list[Row]:
    q = select(api_keys).order_by(api_keys.c.id)
    if tenant_id:
        q = q.where(api_keys.c.tenant_id == tenant_id)
    with transaction() as conn:
        return list(conn.execute(q).all())


def revoke_key(key_id: int) -> Row:
    with transaction() as conn:
        row = conn.execute(update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                           .values(revoked_at=clock_now()).returning(*api_keys.c)).first()
        if row is None:
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).first()
    # After the commit: a process that re-reads on the message must see the revocation.
    _cache.clear()
    publish_invalidate("keys")
    if row is None:
        raise NotFound(f"api key not found: {key_id}")
    return row


def _is_bootstrap(key: str) -> bool:
    boot = get_settings().bootstrap_admin_key
    return bool(boot) and hmac.compare_digest(key.encode(), boot.encode())


def looks_like_key(key: str | None) -> bool:
    """One of our API keys by its form (or the bootstrap admin key): gateway
    auth mode authenticates such a request by the key, every other one by
    the gateway's proof."""
    return bool(key) and (bool(_KEY.match(key)) or _is_bootstrap(key))


def authenticate(key: str | None) -> Principal:
    """The principal behind a presented key, or Unauthorized; successes are
    cached per process, failures never (a new key works at once)."""
    if not key:
        raise Unauthorized("missing API key")
    h = hash_key(key)
    p = _cache.get(h)
    if p is MISSING:
        token = _cache.token()  # a revocation during the lookup keeps it out of the cache
        p = _lookup(key, h)
        _cache.set(h, p, token)
    return p


def _lookup(key: str, presented: str) -> Principal:
    if _is_bootstrap(key):
        return OPERATOR
    if not (m := _KEY.match(key)):
        raise Unauthorized("invalid API key")
    with transaction() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.prefix == m.group(1))).first()
    # Compare even when no row matched so timing says nothing about prefixes.
    stored = row.key_hash if row is not None else "0" * 64
    if not hmac.compare_digest(presented, stored) or row is None or row.revoked_at is not None:
        raise Unauthorized("invalid API key")
    return Principal(tenant_id=row.tenant_id, role=row.role, key_id=row.id)
