"""Request rate limits at the edge: token buckets in Redis (app/infra/redis/ratelimit.py).

Invariants:
- One take per request, when ``auth.current_principal()`` first establishes it,
  from the key's bucket; the bootstrap admin key has its own (``bootstrap``: a
  full admin credential must not be the one unlimited key), a gateway user its
  tenant's (``gateway:<tenant>``).  No policy (None): no Redis round trip.
- Anonymous requests (``auth="none"``, static files, metrics without a token,
  unmatched paths, a key that fails) pay from ``anon:<address>`` (IPv6 by its
  /64); health routes from ``anon-health:<address>`` with HEALTH_FACTOR times the
  rate and burst, so a flood never starves a kubelet's probes from that address.
- Refused: RateLimited (429, nothing done); the RateLimit fields (all from
  ``header_fields``) go on every answer.  Redis unreachable: fail open (a limit
  protects capacity, not worth refusing service over), stand aside
  BYPASS_SECONDS, warn at most once per WARN_EVERY_SECONDS.
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
HEALTH_FACTOR = 10
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
            # Keeps w and q within Structured Field Integers and the bucket's TTL under the script's cap.
            raise ValueError(f"burst / rate must be at most {MAX_FILL_SECONDS:g} s, and burst at most "
                             f"{MAX_FILL_SECONDS:g}, got {self.burst} / {self.rate}")
        if not _NAME.match(self.name):
            raise ValueError(f"policy name must be 1-64 of A-Z a-z 0-9 _ . -, got {self.name!r}")

    @property
    def window(self) -> int:
        """Seconds an empty bucket takes to fill, rounded up (the advertised
        average never exceeds the real rate)."""
        return max(1, _ceil(self.burst / self.rate))


# A resolver maps a principal to its policy (None: not limited).  It runs on
# every authenticated request: one backed by a table should cache (a TTLCache
# of app/infra/caches.py keyed by the tenant or the frozen principal).
Resolver = Callable[[Principal], Optional[RatePolicy]]


def _default_burst(rate: float) -> int:
    return max(1, _ceil(2 * rate))


def _settings_policy(setting: str, factor: int = 1, name: str = "default") -> RatePolicy | None:
    s = get_settings()
    rate, burst = getattr(s, setting + "_per_second"), getattr(s, setting + "_burst")
    if not rate > 0:
        return None
    try:
        return RatePolicy(rate * factor, (burst if burst > 0 else _default_burst(rate)) * factor, name)
    except ValueError as exc:  # a configuration error: say which variables
        var = "ASYNCH_" + setting.upper()
        raise ValueError(f"{var}_PER_SECOND / {var}_BURST: {exc}") from None


def default_policy(principal: Principal) -> RatePolicy | None:
    """Every key gets ASYNCH_RATE_LIMIT_PER_SECOND / ASYNCH_RATE_LIMIT_BURST."""
    return _settings_policy("rate_limit")


def tenant_policy(principal: Principal) -> RatePolicy | None:
    """The tenant's rate and burst (asynch_tenant_limits, cached), else the settings'."""
    own = limits.limits_of(principal.tenant_id)
    base = default_policy(principal)
    if own.rate_per_second is None and own.burst is None:
        return base
    rate = own.rate_per_second if own.rate_per_second is not None else (base.rate if base else None)
    if rate is None:
        return None
    return RatePolicy(rate, own.burst if own.burst is not None else _default_burst(rate))


_resolver: Resolver = tenant_policy


def set_policy_resolver(fn: Resolver | None) -> None:
    """Install a resolver (tests); None restores tenant_policy."""
    global _resolver
    _resolver = fn or tenant_policy


def bucket_id(principal: Principal) -> str:
    if principal.key_id is not None:
        return str(principal.key_id)
    return "bootstrap" if principal.is_admin else f"gateway:{principal.tenant_id}"


def header_fields(policy: RatePolicy, took: Take) -> dict[str, str]:
    """Response header fields for one take, per draft-ietf-httpapi-ratelimit-headers-11
    (sections 3-4, 6): Structured Field Lists of one String item with Integer parameters.
    ``RateLimit-Policy``: quota ``q`` (burst) per window ``w`` (whole seconds, non-zero).
    ``RateLimit``: ``r`` whole tokens left, ``t`` seconds until the next whole token
    (rounded up; 0 only for a full bucket).  Refused: ``Retry-After`` (at least 1) and
    ``t`` equal to it (Retry-After SHOULD NOT point earlier than the effective window's end)."""
    avail = max(0, math.floor(took.remaining))
    t = max(0, _ceil((min(policy.burst, avail + 1) - took.remaining) / policy.rate))
    out = {"RateLimit-Policy": f'"{policy.name}";q={policy.burst};w={policy.window}'}
    if not took.allowed:
        t = max(1, t, _ceil(took.retry_after))
        out["Retry-After"] = str(t)
    out["RateLimit"] = f'"{policy.name}";r={avail};t={t}'
    return out


def tenant_rate_state(tenant: str, key_ids: list[int]) -> dict:
    """The policy a tenant's keys get and each key's tokens now (read only;
    null while Redis is unreachable, as the limiter then lets requests through)."""
    policy = _resolver(Principal(tenant_id=tenant, role="user", key_id=None))
    if policy is None:
        return {"limited": False, "rate_per_second": None, "burst": None, "keys": []}
    try:
        tokens = [round(peek(str(k), policy.rate, policy.burst), 3) for k in key_ids]
    except redis.RedisError:
        tokens = [None] * len(key_ids)
    return {"limited": True, "rate_per_second": policy.rate, "burst": policy.burst,
            "keys": [{"key_id": k, "tokens": t} for k, t in zip(key_ids, tokens)]}


_lock = threading.Lock()
_bypass_until = 0.0
_warned_at: float | None = None


def reset() -> None:
    """Forget a recent Redis failure (tests)."""
    global _bypass_until, _warned_at
    with _lock:
        _bypass_until, _warned_at = 0.0, None


def _charge(bucket: str, policy: RatePolicy | None, who: str) -> None:
    global _bypass_until, _warned_at
    if policy is None or time.monotonic() < _bypass_until:
        return
    try:
        took = take(bucket, policy.rate, policy.burst)
    except redis.RedisError as exc:
        now = time.monotonic()
        with _lock:
            _bypass_until = now + BYPASS_SECONDS
            warn = _warned_at is None or now - _warned_at >= WARN_EVERY_SECONDS
            if warn:
                _warned_at = now
        if warn:
            log.warning("rate limiter cannot reach Redis (%s): requests pass unlimited, next try in %.0f s",
                        exc, BYPASS_SECONDS)
        return
    fields = header_fields(policy, took)
    if not took.allowed:
        raise RateLimited(f"rate limit exceeded for {who}: {policy.rate:g} requests/s, bursts of {policy.burst}; "
                          f"retry after {fields['Retry-After']} s", fields)

    @after_this_request
    def _add_fields(resp):
        resp.headers.update(fields)
        return resp


def check(principal: Principal) -> None:
    """One token from the principal's bucket (inside a request); RateLimited when empty."""
    _charge(bucket_id(principal), _resolver(principal), "this key")


def client_address() -> str:
    """The peer address this request came from (an IPv6 one as its /64)."""
    raw = request.remote_addr or "unknown"
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError:
        return raw[:64]
    if addr.version == 4:
        return str(addr)
    return str(addr.ipv4_mapped or ipaddress.ip_network(f"{addr}/64", strict=False))


def check_anonymous(health: bool = False) -> None:
    """One token from this client address's anonymous bucket; RateLimited when empty."""
    name = "anon-health" if health else "anon"
    policy = _settings_policy("anon_rate_limit", HEALTH_FACTOR if health else 1, name)
    _charge(f"{name}:{client_address()}", policy, "anonymous requests from this address")


def register(app: Flask) -> None:
    @app.before_request
    def _anonymous_limit():
        # Routes that authenticate pay from their key's bucket (a failed key
        # through check_anonymous, app/web/auth.py); no declaration: no route
        # matched (404 / 405), or a static file.
        spec = getattr(current_app.view_functions.get(request.endpoint), "endpoint", None)
        if spec is None or spec.auth == "none" or (spec.auth == "metrics" and not get_settings().metrics_token):
            return check_anonymous(health=spec is not None and spec.tag == "health")
