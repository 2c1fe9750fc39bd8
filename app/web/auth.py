"""Bearer API keys at the edge; the principal lives in flask.g.  Which
routes need a key (or an admin key) is part of each route's declaration
(app/web/contract.py)."""
from __future__ import annotations

from flask import g, request

from app.errors import Unauthorized
from app.infra import metrics
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
    """The metrics endpoints need no API key; with ASYNCH_METRICS_TOKEN set,
    the scraper must send it as a Bearer token (one rule, app/infra/metrics.py,
    shared with the worker nodes' metrics port)."""
    problem = metrics.token_problem(request.headers.get("Authorization", ""))
    if problem:
        raise Unauthorized(problem)
