"""Request rate limits per API key, at the edge.

Invariants:
- One take per request, from ``auth.current_principal()`` the first time a
  request establishes its principal (``g.principal`` short-circuits every
  later call).  Unauthenticated requests are not limited here (they have no
  key to charge).
- The bucket is the key's: ``Principal.key_id``; the bootstrap admin key
  (key_id None, from the environment) has its own bucket ``bootstrap`` under
  the same policy -- it is a full admin credential and must not be the one
  unlimited key.  A resolver may exempt it (or any key) by returning None.
  A gateway request (ASYNCH_AUTH_MODE=gateway: a user without a key) is
  charged to its tenant's bucket ``gateway:<tenant>``.
- A key without a policy (limits off) costs no Redis round trip.
- Refused: ``RateLimited`` (429, nothing else done) with Retry-After and the
  RateLimit fields; the one error handler adds them.  Allowed: the same
  RateLimit fields on whatever the request answers (200s, 4xx, 5xx).
- Redis unreachable: the request passes unlimited (fail open); the limiter
  then stands aside for ``BYPASS_SECONDS`` so an outage does not add a
  connect timeout to every request, and warns at most once per
  ``WARN_EVERY_SECONDS`` per process.  A rate limit protects capacity; it is
  not worth refusing service over.
- Every header string comes from ``header_fields`` (one place).
- Anonymous requests (a route declared ``auth="none"``, static files, the
  metrics routes while ASYNCH_METRICS_TOKEN is empty, a path no route
  matches, and a presented key that fails to authenticate) are charged to
  their client address's bucket ``anon:<address>`` (an IPv6 address by its
  /64: one host holds the whole /64), under ASYNCH_ANON_RATE_LIMIT_PER_SECOND
  / _BURST, by ``check_anonymous`` from a before-request hook.  The health
  routes take from a separate bucket ``anon-health:<address>`` with
  ``HEALTH_FACTOR`` times the rate and burst: one kubelet probes every pod
  of its node from one address, and a flood of other anonymous routes from
  that address never starves its probes.  Same Redis script, same fail open.
"""
from __future__ import annotations

import ipaddress
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import redis
from flask import Flask, after_this_request, current_app, request

from app.config import get_settings
from app.errors import RateLimited
from app.infra.redis.ratelimit import Take, peek, take
from app.tenancy import limits
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)

BYPASS_SECONDS = 5.0
WARN_EVERY_SECONDS = 60.0
MAX_FILL_SECONDS = 1e9  # ~31 years; the Lua script caps a bucket's TTL there too
# Policy names go out as Structured Field Strings; this set needs no escaping.
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


def _ceil(x: float) -> int:
    # Rounded first: 6 / 0.6 is 10.000000000000002 in binary floating point.
    return math.ceil(round(x, 6))


@dataclass(frozen=True)
class RatePolicy:
    """A token bucket: ``rate`` tokens per second, ``burst`` capacity.
    Frozen and hashable, so resolvers can cache and share instances."""

    rate: float
    burst: int
    name: str = "default"

    def __post_init__(self):
        if not (isinstance(self.rate, (int, float)) and self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a finite number > 0, got {self.rate!r}")
        if not (isinstance(self.burst, int) and self.burst >= 1):
            raise ValueError(f"burst must be an integer >= 1, got {self.burst!r}")
        if self.burst / self.rate > MAX_FILL_SECONDS or self.burst > MAX_FILL_SECONDS:
            # Keeps w and q within Structured Field Integers and the bucket's
            # TTL under the script's cap.
            raise ValueError(f"burst / rate must be at most {MAX_FILL_SECONDS:g} s, and burst at most "
                             f"{MAX_FILL_SECONDS:g}, got {self.burst} / {self.rate}")
        if not _NAME.match(self.name):
            raise ValueError(f"policy name must be 1-64 of A-Z a-z 0-9 _ . -, got {self.name!r}")

    @property
    def window(self) -> int:
        """Seconds an empty bucket takes to fill: the policy is advertised as
        ``burst`` requests per ``window`` s (rounded up, so the advertised
        average never exceeds the real rate)."""
        return max(1, _ceil(self.burst / self.rate))


# A resolver maps a principal to its policy (None: not limited).  It runs on
# every authenticated request: one backed by a table should cache, e.g. a
# TTLCache (app/infra/caches.py) keyed by principal.tenant_id or by the
# (frozen, hashable) principal itself.
Resolver = Callable[[Principal], Optional[RatePolicy]]


def default_policy(principal: Principal) -> RatePolicy | None:
    """Every key gets ASYNCH_RATE_LIMIT_PER_SECOND / ASYNCH_RATE_LIMIT_BURST."""
    s = get_settings()
    rate = s.rate_limit_per_second
    if not rate > 0:
        return None
    burst = s.rate_limit_burst if s.rate_limit_burst > 0 else max(1, _ceil(2 * rate))
    try:
        return RatePolicy(rate, burst)
    except ValueError as exc:  # a configuration error: say which variables
        raise ValueError(f"ASYNCH_RATE_LIMIT_PER_SECOND / ASYNCH_RATE_LIMIT_BURST: {exc}") from None


def tenant_policy(principal: Principal) -> RatePolicy | None:
    """A key's policy: its tenant's rate and burst (asynch_tenant_limits,
    through the per-process cache), else the settings' defaults."""
    own = limits.limits_of(principal.tenant_id)
    base = default_policy(principal)
    if own.rate_per_second is None and own.burst is None:
        return base
    rate = own.rate_per_second if own.rate_per_second is not None else (base.rate if base else None)
    if rate is None:
        return None
    burst = own.burst if own.burst is not None else max(1, _ceil(2 * rate))
    return RatePolicy(rate, burst)


_resolver: Resolver = tenant_policy


def set_policy_resolver(fn: Resolver | None) -> None:
    """Install a resolver (tests); None restores the default, tenant_policy."""
    global _resolver
    _resolver = fn if fn is not None else tenant_policy


def policy_for(principal: Principal) -> RatePolicy | None:
    return _resolver(principal)


def bucket_id(principal: Principal) -> str:
    if principal.key_id is not None:
        return str(principal.key_id)
    return "bootstrap" if principal.is_admin else f"gateway:{principal.tenant_id}"


def header_fields(policy: RatePolicy, took: Take) -> dict[str, str]:
    """Response header fields for one take.

    Per draft-ietf-httpapi-ratelimit-headers-11 (23 May 2026), sections 3-4
    and 6: both fields are Structured Field Lists of one String item with
    Integer parameters.
    - ``RateLimit-Policy: "default";q=<burst>;w=<window>`` -- the quota
      ``q`` and the time window ``w`` (whole seconds, non-zero).
    - ``RateLimit: "default";r=<available>;t=<seconds>`` -- ``r`` the whole
      tokens left; ``t`` the effective window: the seconds within which the
      client can use no more than ``r``, i.e. until the next whole token
      (rounded up; 0 only for a full bucket).
    - Refused: ``Retry-After`` (delay-seconds, at least 1) and ``t`` equal to
      it -- section 6: Retry-After SHOULD NOT point earlier than the end of
      the effective window.
    """
    avail = max(0, math.floor(took.remaining))
    nxt = min(policy.burst, avail + 1)
    t = max(0, _ceil((nxt - took.remaining) / policy.rate))
    out = {"RateLimit-Policy": f'"{policy.name}";q={policy.burst};w={policy.window}'}
    if not took.allowed:
        t = max(1, t, _ceil(took.retry_after))
        out["Retry-After"] = str(t)
    out["RateLimit"] = f'"{policy.name}";r={avail};t={t}'
    return out


# --- fail open ---------------------------------------------------------------

_lock = threading.Lock()
_bypass_until = 0.0
_warned_at: float | None = None


def _fail_open(exc: Exception) -> None:
    global _bypass_until, _warned_at
    now = time.monotonic()
    with _lock:
        _bypass_until = now + BYPASS_SECONDS
        warn = _warned_at is None or now - _warned_at >= WARN_EVERY_SECONDS
        if warn:
            _warned_at = now
    if warn:
        log.warning("rate limiter cannot reach Redis (%s): requests pass unlimited, next try in %.0f s",
                    exc, BYPASS_SECONDS)


def tenant_rate_state(tenant: str, key_ids: list[int]) -> dict:
    """The policy a tenant's keys get and each key's bucket now (tokens
    left, refilled to Redis time; read only).  Redis unreachable: buckets
    null, as the limiter then lets requests through."""
    policy = policy_for(Principal(tenant_id=tenant, role="user", key_id=None))
    out: dict = {"limited": policy is not None, "rate_per_second": policy.rate if policy else None,
                 "burst": policy.burst if policy else None, "keys": []}
    if policy is None:
        return out
    try:
        out["keys"] = [{"key_id": k, "tokens": round(peek(str(k), policy.rate, policy.burst), 3)} for k in key_ids]
    except redis.RedisError:
        out["keys"] = [{"key_id": k, "tokens": None} for k in key_ids]
    return out


def reset() -> None:
    """Forget a recent Redis failure (tests)."""
    global _bypass_until, _warned_at
    with _lock:
        _bypass_until = 0.0
        _warned_at = None


# --- the hooks ---------------------------------------------------------------

def check(principal: Principal) -> None:
    """Take one token for this request from the principal's bucket.  Raises
    ``RateLimited`` when the bucket is empty; otherwise the RateLimit fields
    go on this request's response.  Must run inside a request."""
    _charge(bucket_id(principal), policy_for(principal), "this key")


def _charge(bucket: str, policy: RatePolicy | None, who: str) -> None:
    if policy is None or time.monotonic() < _bypass_until:
        return
    try:
        took = take(bucket, policy.rate, policy.burst)
    except redis.RedisError as exc:
        _fail_open(exc)
        return
    fields = header_fields(policy, took)
    if not took.allowed:
        raise RateLimited(f"rate limit exceeded for {who}: {policy.rate:g} requests/s, bursts of {policy.burst}; "
                          f"retry after {fields['Retry-After']} s", fields)

    @after_this_request
    def _add_fields(resp):
        for k, v in fields.items():
            resp.headers[k] = v
        return resp


# --- anonymous requests, per client address ------------------------------------

HEALTH_FACTOR = 10


def anonymous_policy(health: bool = False) -> RatePolicy | None:
    """ASYNCH_ANON_RATE_LIMIT_PER_SECOND / _BURST (None: off); the health
    routes' bucket gets HEALTH_FACTOR times both."""
    s = get_settings()
    rate = s.anon_rate_limit_per_second
    if not rate > 0:
        return None
    burst = s.anon_rate_limit_burst if s.anon_rate_limit_burst > 0 else max(1, _ceil(2 * rate))
    f = HEALTH_FACTOR if health else 1
    try:
        return RatePolicy(rate * f, burst * f, "anon-health" if health else "anon")
    except ValueError as exc:
        raise ValueError(f"ASYNCH_ANON_RATE_LIMIT_PER_SECOND / ASYNCH_ANON_RATE_LIMIT_BURST: {exc}") from None


def client_address() -> str:
    """The peer address this request came from (an IPv6 one as its /64)."""
    raw = request.remote_addr or "unknown"
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError:
        return raw[:64]
    if addr.version == 6:
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)


def check_anonymous(health: bool = False) -> None:
    """Take one token from this client address's anonymous bucket (raises
    ``RateLimited`` when it is empty).  Must run inside a request."""
    name = "anon-health" if health else "anon"
    _charge(f"{name}:{client_address()}", anonymous_policy(health), "anonymous requests from this address")


def _anonymous_kind() -> str | None:
    """"health", "other" or None (the route authenticates: a key's own
    bucket, or a failed key through ``check_anonymous``, app/web/auth.py)."""
    if request.url_rule is None or request.endpoint is None:
        return "other"  # no route matched: 404 / 405
    view = current_app.view_functions.get(request.endpoint)
    spec = getattr(view, "endpoint", None)
    if spec is None or spec.auth == "none":  # static files have no declaration
        return "health" if spec is not None and spec.tag == "health" else "other"
    if spec.auth == "metrics" and not get_settings().metrics_token:
        return "other"
    return None


def register(app: Flask) -> None:
    @app.before_request
    def _anonymous_limit():
        kind = _anonymous_kind()
        if kind is not None:
            check_anonymous(health=kind == "health")
