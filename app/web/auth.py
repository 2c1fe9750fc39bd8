"""Bearer API keys at the edge; the principal lives in flask.g.  Which
routes need a key (or an admin key) is part of each route's declaration
(app/web/contract.py)."""
from __future__ import annotations

import hmac

from flask import g, request

from app.config import get_settings
from app.errors import Unauthorized
from app.infra.logs import bind
from app.tenancy.keys import Principal, authenticate
from app.web import ratelimit


def presented_key() -> str | None:
    h = request.headers.get("Authorization", "")
    if h[:7].lower() == "bearer ":
        return h[7:].strip() or None
    return None


def current_principal() -> Principal:
    p = getattr(g, "principal", None)
    if p is None:
        p = authenticate(presented_key())
        g.principal = p
        bind(tenant=p.tenant_id)
        # Once per request (g.principal answers every later call); may raise
        # RateLimited.
        ratelimit.check(p)
    return p


def require_metrics_token() -> None:
    """/metrics needs no API key; with ASYNCH_METRICS_TOKEN set, the scraper
    must send it as a Bearer token."""
    token = get_settings().metrics_token
    if not token:
        return
    given = presented_key() or ""
    if not given:
        raise Unauthorized("missing metrics token")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("invalid metrics token")
