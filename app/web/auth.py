"""Bearer API keys at the edge, or the business gateway (ASYNCH_AUTH_MODE=
gateway); the principal lives in flask.g.  Which routes need a key (or an
admin key) is part of each route's declaration (app/web/contract.py).

Gateway mode invariants: a request without one of our API keys is accepted
only if it proves it comes from the gateway -- the shared secret header,
compared in constant time, and/or a source address in the configured CIDRs
(both, when both are set); it then acts as a *user* of the tenant its
X-User-Info names (never an admin: admin routes still need an admin key),
and its Authorization is the caller's credential for the OSS file service,
passed on unchanged (``gateway_oss_authorization``)."""
from __future__ import annotations

import hmac
import ipaddress
from functools import lru_cache

from flask import g, request

from app.config import get_settings
from app.errors import Unauthorized
from app.infra import metrics
from app.infra.logs import bind
from app.tenancy.identity import tenant_from_info
from app.tenancy.keys import Principal, authenticate, looks_like_key
from app.web import ratelimit


def presented_key() -> str | None:
    h = request.headers.get("Authorization", "")
    if h[:7].lower() == "bearer ":
        return h[7:].strip() or None
    return None


def current_principal() -> Principal:
    p = getattr(g, "principal", None)
    if p is None:
        key = presented_key()
        try:
            if get_settings().auth_mode == "gateway" and not looks_like_key(key):
                p = _gateway_principal()
                g.via_gateway = True
            else:
                p = authenticate(key)
        except Unauthorized:
            # No working key: the client address pays (a wrong key costs a
            # lookup); past its anonymous bucket this is a 429 instead.
            ratelimit.check_anonymous()
            raise
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


@lru_cache(maxsize=8)
def _networks(spec: str) -> tuple:
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in spec.split(",") if c.strip())


def _gateway_principal() -> Principal:
    s = get_settings()
    if s.gateway_secret:
        sent = request.headers.get(s.gateway_secret_header, "")
        if not hmac.compare_digest(sent.encode(), s.gateway_secret.encode()):
            raise Unauthorized("not from the gateway (missing or wrong gateway secret)")
    if s.gateway_cidrs.strip():
        try:
            addr = ipaddress.ip_address(request.remote_addr or "")
        except ValueError:
            raise Unauthorized("not from the gateway (unknown source address)") from None
        if not any(addr in net for net in _networks(s.gateway_cidrs)):
            raise Unauthorized("not from the gateway (source address not allowed)")
    if not (s.gateway_secret or s.gateway_cidrs.strip()):
        raise Unauthorized("gateway auth mode without a gateway secret or CIDRs accepts no request")
    tenant = tenant_from_info(request.headers.get("X-User-Info"))
    if not tenant:
        raise Unauthorized("X-User-Info names no tenant")
    return Principal(tenant_id=tenant, role="user", key_id=None)


def gateway_oss_authorization() -> str | None:
    """The Authorization a gateway request carries: the business user's
    credential for the OSS file service, passed on unchanged (None for a
    request authenticated by our own API key, whose key never leaves)."""
    if getattr(g, "via_gateway", False):
        return request.headers.get("Authorization") or None
    return None
