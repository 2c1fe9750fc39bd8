"""Bearer API keys at the edge; the principal lives in flask.g."""
from __future__ import annotations

from functools import wraps

from flask import g, request

from app.infra.db import transaction
from app.errors import Forbidden
from app.infra.logs import bind
from app.tenancy.keys import Principal, authenticate, authenticate_cached
from app.web import ratelimit


def _presented_key() -> str | None:
    h = request.headers.get("Authorization", "")
    if h[:7].lower() == "bearer ":
        return h[7:].strip() or None
    return None


def current_principal() -> Principal:
    p = getattr(g, "principal", None)
    if p is None:
        p = authenticate_cached(_presented_key(), _load)
        g.principal = p
        bind(tenant=p.tenant_id)
        # Once per request (g.principal answers every later call); may raise
        # RateLimited.
        ratelimit.check(p)
    return p


def _load(key: str | None) -> Principal:
    with transaction() as conn:
        return authenticate(conn, key)


def require_key(fn):
    @wraps(fn)
    def wrapper(*a, **kw):
        current_principal()
        return fn(*a, **kw)
    return wrapper


def require_admin(fn):
    @wraps(fn)
    def wrapper(*a, **kw):
        if not current_principal().is_admin:
            raise Forbidden("admin key required")
        return fn(*a, **kw)
    return wrapper
