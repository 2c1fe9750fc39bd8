"""SSRF guard: which client-supplied URLs (callbacks, webhooks) may be called.  Every face that takes one (v1 submit
headers, batch items, seed createTask, webhook subscriptions) and every delivery attempt checks it here.

A URL is judged on the addresses its host resolves to (resolver.py turns every spelling, ``0x7f000001``,
``0177.0.0.1``, ``[::ffff:127.0.0.1]``, a DNS name, into the address the kernel would connect to).  Only globally
routable unicast passes: loopback, private, link-local (169.254.169.254, the metadata service), CGNAT, unspecified,
multicast and reserved ranges are refused, also wrapped in IPv6 (mapped, translated ``::ffff:0:a.b.c.d``, compatible
``::a.b.c.d``, 6to4, Teredo, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``), as is IPv6 outside ``2000::/3``, unless
on ``ASYNCH_DELIVERY_ALLOW_HOSTS`` (IPs, CIDRs or host names).  Every address must pass, and the caller connects to
a checked one instead of resolving again (no DNS rebinding). Ports: 80, 443 and 1024-65535, another only for an
allowlisted target (its name, or each address in a listed network); ``:0`` never.

The refusal never names the resolved address (only the log line does).  A lookup costs at most
``ASYNCH_RESOLVE_TIMEOUT_SECONDS``; a request's lookups go through one ``Lookups`` (its tenant's cap on lookups in
flight; a batch's hosts looked up once, under one deadline, at most ``ASYNCH_BATCH_MAX_URL_HOSTS`` names).
"""
from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from app.config import get_settings
from app.infra.http import resolver
from app.infra.http.resolver import IPAddress

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")   # ::ffff:0:a.b.c.d (SIIT)
_COMPATIBLE = ipaddress.ip_network("::/96")             # ::a.b.c.d (deprecated)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
log = logging.getLogger(__name__)
MAX_URL_LENGTH = 2048


class UrlRefused(ValueError):
    """``transient``: resolution failed, a later try may succeed; else the target itself is refused."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str            # as written in the URL (for Host and TLS)
    port: int
    path_and_query: str
    addresses: tuple[IPAddress, ...]  # checked; connect to these only


@lru_cache(maxsize=16)
def _allowlist(raw: str) -> tuple[tuple, frozenset]:
    nets, names = [], set()
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(resolver.normal(entry))
    return tuple(nets), frozenset(names)


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """The address and every IPv4 address an IPv6 address carries."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return [ip]
    n = int(ip)
    out = [ip, ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    if ip in _NAT64 or ip in _TRANSLATED or ip in _COMPATIBLE:
        out.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
    if ip in _NAT64_LOCAL:  # RFC 6052 /48: the IPv4 address is split around the u octet (bits 64-71)
        out.append(ipaddress.IPv4Address(((n >> 64) & 0xFFFF) << 16 | ((n >> 40) & 0xFFFF)))
    return [a for a in out if a is not None]


def address_refused(ip: IPAddress) -> bool:
    return (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None and ip not in _GLOBAL_UNICAST) \
        or any(not a.is_global or a.is_multicast for a in _embedded(ip))


def _resolve(host: str, tenant: str | None = None, deadline: float | None = None) -> list[IPAddress]:
    try:
        return resolver.lookup(host, tenant, deadline)
    except resolver.NotResolved as exc:
        raise UrlRefused(str(exc), transient=True) from None


class Lookups:
    """The URL checks of one request: each host looked up once, all under one deadline, and at most
    ``max_names`` distinct host names (IP literals are free); the names past it are refused, not looked up."""

    def __init__(self, tenant: str | None = None, max_names: int | None = None) -> None:
        self.tenant, self.max_names = tenant, max_names
        self.deadline = time.monotonic() + get_settings().resolve_timeout_seconds
        self._seen: dict[str, list[IPAddress] | UrlRefused] = {}

    def resolve(self, host: str) -> list[IPAddress]:
        got, key = resolver.literal(host), resolver.normal(host)
        if got is not None:
            return got
        if key not in self._seen:
            if self.max_names is not None and len(self._seen) >= self.max_names:
                raise UrlRefused(f"a batch may name at most {self.max_names} distinct callback/webhook "
                                 f"host names (IP addresses do not count)")
            try:
                self._seen[key] = _resolve(host, self.tenant, self.deadline)
            except UrlRefused as exc:
                self._seen[key] = exc
        got = self._seen[key]
        if isinstance(got, UrlRefused):
            raise UrlRefused(str(got), got.transient)
        return list(got)


def _parse(url: str) -> tuple[str, str, int, str]:
    if not isinstance(url, str) or not url:
        raise UrlRefused("must be an http(s) URL")
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"must be at most {MAX_URL_LENGTH} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise UrlRefused("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"is not a valid URL: {exc}") from exc
    if port == 0:
        raise UrlRefused("port 0 is not a port: name the receiver's port (80, 443 or 1024-65535)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("must be an http(s) URL with a host")
    if "@" in parts.netloc:
        raise UrlRefused("must not carry credentials")
    if parts.fragment:
        raise UrlRefused("must not have a #fragment")
    port = port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _allowed(ip: IPAddress, nets: tuple) -> bool:
    """On the operator's allowlist (an IPv4-mapped address as the IPv4 address the kernel connects to)."""
    candidates = [ip] + ([ip.ipv4_mapped] if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else [])
    return any(c in n for c in candidates for n in nets if n.version == c.version)


def check_url(url: str, lookups: Lookups | None = None) -> Target:
    """Parse, resolve and judge ``url`` (with the request's ``lookups``); raises UrlRefused."""
    scheme, host, port, pq = _parse(url)
    nets, names = _allowlist(get_settings().delivery_allow_hosts)
    addresses = lookups.resolve(host) if lookups is not None else _resolve(host)
    listed = resolver.normal(host) in names
    if not listed:
        for ip in addresses:
            if address_refused(ip) and not _allowed(ip, nets):
                log.info("callback target refused: %s resolves to %s", host, ip)
                raise UrlRefused("resolves to a refused address: loopback, private, link-local, metadata "
                                 "and other non-public targets are not allowed")
    # The web's ports and the unprivileged range (urlsplit refuses > 65535): never SSH, SMTP and the like.
    if port < 1024 and port not in (80, 443) and not (listed or all(_allowed(ip, nets) for ip in addresses)):
        raise UrlRefused(f"port {port} is not allowed: use 80, 443 or 1024-65535 "
                         "(other ports only for hosts on the operator's ASYNCH_DELIVERY_ALLOW_HOSTS)")
    return Target(scheme, host, port, pq, tuple(addresses))


def callback_url_problem(url: str, lookups: Lookups | None = None) -> str | None:
    """Why a callback or webhook URL is refused at submit, or None."""
    try:
        check_url(url, lookups)
    except UrlRefused as exc:
        return str(exc)
    return None
