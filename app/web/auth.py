"""Bearer API keys at the edge, or the business gateway (ASYNCH_AUTH_MODE=
gateway); the principal lives in flask.g.  Which routes need a key (or an
admin key) is part of each route's declaration (app/web/contract.py).

Gateway mode invariants: a request without one of our API keys is accepted
only if it proves it comes from the gateway -- the shared secret header,
compared in constant time, and/or a source address in the configured CIDRs
(both, when both are set); it then acts as a *user* of the tenant its
X-User-Info names (never an admin: admin routes still need an admin key),
and its Authorization is the caller's credential for the OSS file service,
passed on unchanged (``gateway_oss_authorization``).  Its tenant must be a
tenant name (app/tenancy/schemas.py TENANT_PATTERN: no ``~`` or ``:``, so
it can never name an internal row such as a callback secret's ``~prev:``
row or split a Redis key); anything else is a 401 that changes nothing.

X-User-Info (the creator, and the identity passed to the OSS file service)
is trusted only on a request that proves it comes from the gateway, by the
same check (``gateway_proven``): in gateway mode, and in key mode with
ASYNCH_TRUSTED_GATEWAY; on any other request it is dropped
(``trusted_user_info``).  A trusted gateway with neither a secret nor CIDRs
configured proves nothing, so its header is always dropped."""
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
from app.tenancy.schemas import TENANT_RULE, is_tenant_name
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


def _proof_problem() -> str | None:
    """Why this request does not prove it comes from the gateway, or None:
    the shared secret (constant time) and/or a source address in the CIDRs,
    both when both are set; with neither configured nothing is proven."""
    s = get_settings()
    if not (s.gateway_secret or s.gateway_cidrs.strip()):
        return "no gateway secret or CIDRs are configured"
    if s.gateway_secret:
        sent = request.headers.get(s.gateway_secret_header, "")
        if not hmac.compare_digest(sent.encode(), s.gateway_secret.encode()):
            return "missing or wrong gateway secret"
    if s.gateway_cidrs.strip():
        try:
            addr = ipaddress.ip_address(request.remote_addr or "")
        except ValueError:
            return "unknown source address"
        if not any(addr in net for net in _networks(s.gateway_cidrs)):
            return "source address not allowed"
    return None


def gateway_proven() -> bool:
    """This request passed the gateway's proof (once per request)."""
    proven = getattr(g, "gateway_proven", None)
    if proven is None:
        proven = g.gateway_proven = _proof_problem() is None
    return proven


def trusted_user_info() -> str | None:
    """The request's X-User-Info if a trusted gateway vouches for it: gateway
    auth mode or ASYNCH_TRUSTED_GATEWAY, and this request's gateway proof
    passed (a key-authenticated request too: the key says who pays, the
    proof whether the header is the gateway's).  None otherwise: a client
    cannot name itself someone else, here or at the OSS file service."""
    info = request.headers.get("X-User-Info")
    s = get_settings()
    if not info or not (s.trusted_gateway or s.auth_mode == "gateway"):
        return None
    return info if gateway_proven() else None


def _gateway_principal() -> Principal:
    s = get_settings()
    if not (s.gateway_secret or s.gateway_cidrs.strip()):
        raise Unauthorized("gateway auth mode without a gateway secret or CIDRs accepts no request")
    problem = _proof_problem()
    if problem:
        raise Unauthorized(f"not from the gateway ({problem})")
    g.gateway_proven = True
    tenant = tenant_from_info(request.headers.get("X-User-Info"))
    if not tenant:
        raise Unauthorized("X-User-Info names no tenant")
    if not is_tenant_name(tenant):
        raise Unauthorized(f"X-User-Info names an invalid tenant (a tenant is {TENANT_RULE})")
    return Principal(tenant_id=tenant, role="user", key_id=None)


def gateway_oss_authorization() -> str | None:
    """The Authorization a gateway request carries: the business user's
    credential for the OSS file service, passed on unchanged (None for a
    request authenticated by our own API key, whose key never leaves)."""
    if getattr(g, "via_gateway", False):
        return request.headers.get("Authorization") or None
    return None
