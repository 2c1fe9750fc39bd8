"""Bearer API keys at the edge, or the business gateway (ASYNCH_AUTH_MODE=
gateway); the principal lives in flask.g.  Which routes need a key (or an
admin key) is part of each route's declaration (app/web/contract.py).

Invariants:
- A request proves it comes from the gateway (``gateway_proven``) by the
  shared secret header (constant-time compare) and/or a source address in the
  configured CIDRs (both, when both are set); with neither set nothing is proven.
- Gateway mode: a request without one of our keys is accepted only with that
  proof; it acts as a *user* (never an admin) of the tenant its X-User-Info
  names, which must be a tenant name (no ``~`` or ``:``: it can never name an
  internal row or split a Redis key), else a 401 that changes nothing.  Its
  Authorization is the caller's OSS credential, passed on unchanged.
- X-User-Info is trusted only on a proven request, in gateway mode or with
  ASYNCH_TRUSTED_GATEWAY; otherwise it is dropped (``trusted_user_info``)."""
from __future__ import annotations

import hmac
import ipaddress
from functools import lru_cache

from flask import g, request

from app.config import get_settings
from app.errors import Unauthorized
from app.infra.logs import bind
from app.tenancy.identity import tenant_from_info
from app.tenancy.keys import Principal, authenticate, looks_like_key
from app.tenancy.schemas import TENANT_RULE, is_tenant_name
from app.web import ratelimit


def current_principal() -> Principal:
    p = getattr(g, "principal", None)
    if p is None:
        h = request.headers.get("Authorization", "")
        key = (h[7:].strip() or None) if h[:7].lower() == "bearer " else None
        try:
            if get_settings().auth_mode == "gateway" and not looks_like_key(key):
                p = _gateway_principal()
                g.via_gateway = True
            else:
                p = authenticate(key)
        except Unauthorized:
            # No working key: the client address pays (a wrong key costs a lookup).
            ratelimit.check_anonymous()
            raise
        g.principal = p
        bind(tenant=p.tenant_id)
        ratelimit.check(p)  # once per request (g.principal answers later calls)
    return p


@lru_cache(maxsize=8)
def _networks(spec: str) -> tuple:
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in spec.split(",") if c.strip())


def _proof_problem() -> str | None:
    """Why this request does not prove it comes from the gateway, or None."""
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
    if getattr(g, "gateway_proven", None) is None:  # once per request
        g.gateway_proven = _proof_problem() is None
    return g.gateway_proven


def trusted_user_info() -> str | None:
    """X-User-Info if a trusted gateway vouches for it (a key-authenticated request
    too: the key says who pays, the proof whether the header is the gateway's);
    else None: a client cannot name itself someone else, here or at the OSS."""
    info, s = request.headers.get("X-User-Info"), get_settings()
    return info if info and (s.trusted_gateway or s.auth_mode == "gateway") and gateway_proven() else None


def _gateway_principal() -> Principal:
    s = get_settings()
    if not (s.gateway_secret or s.gateway_cidrs.strip()):
        raise Unauthorized("gateway auth mode without a gateway secret or CIDRs accepts no request")
    if problem := _proof_problem():
        raise Unauthorized(f"not from the gateway ({problem})")
    g.gateway_proven = True
    tenant = tenant_from_info(request.headers.get("X-User-Info"))
    if not tenant:
        raise Unauthorized("X-User-Info names no tenant")
    if not is_tenant_name(tenant):
        raise Unauthorized(f"X-User-Info names an invalid tenant (a tenant is {TENANT_RULE})")
    return Principal(tenant_id=tenant, role="user", key_id=None)


def gateway_oss_authorization() -> str | None:
    """A gateway request's Authorization: the user's OSS credential (None with our own key,
    which never leaves)."""
    return (request.headers.get("Authorization") or None) if getattr(g, "via_gateway", False) else None
