"""Which client-supplied URLs the middleware may call (callbacks): SSRF guard.

A URL is checked on the addresses its host resolves to, not on its text:
``socket.getaddrinfo`` turns every spelling of an address (``0x7f000001``,
``2130706433``, ``0177.0.0.1``, ``[::ffff:127.0.0.1]``, a DNS name) into the
address the kernel would connect to, and ``ipaddress`` judges that.  Only
globally routable unicast addresses pass; loopback, private, link-local
(169.254.169.254, the cloud metadata service), CGNAT, unspecified,
multicast and reserved ranges are refused, also when wrapped in IPv6
(IPv4-mapped ``::ffff:a.b.c.d``, IPv4-translated ``::ffff:0:a.b.c.d``,
IPv4-compatible ``::a.b.c.d``, 6to4, Teredo, NAT64 ``64:ff9b::/96`` and
``64:ff9b:1::/48``); and any IPv6 address outside global unicast
``2000::/3`` (site-local ``fec0::/10``, ULA, NAT64 ...) is refused unless
allowlisted.  Every resolved address must pass, and
the caller connects to one of the checked addresses rather than resolving
again, so a DNS answer that changes between check and connect (rebinding)
cannot redirect the request.

``ASYNCH_CALLBACK_ALLOW_HOSTS`` (comma list of IPs, CIDRs or host names) lets
an operator admit internal receivers.

The refusal text never names the resolved address (a caller must not learn
what an internal name resolves to); the log line does.  Resolution runs on
a small shared pool and is waited for at most
``ASYNCH_RESOLVE_TIMEOUT_SECONDS``: a slow DNS server costs the request
thread that long, not the resolver's own (unbounded) retries.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from app.config import get_settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")   # ::ffff:0:a.b.c.d (SIIT)
_COMPATIBLE = ipaddress.ip_network("::/96")             # ::a.b.c.d (deprecated)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
log = logging.getLogger(__name__)
MAX_URL_LENGTH = 2048


class UrlRefused(ValueError):
    """The URL may not be called.  ``transient``: resolution failed, a later
    try may succeed; otherwise the target itself is refused."""

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
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return tuple(nets), frozenset(names)


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """The address and every IPv4 address an IPv6 address carries."""
    out: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            out.append(ip.ipv4_mapped)
        if ip.sixtofour:
            out.append(ip.sixtofour)
        if ip.teredo:
            out.extend(ip.teredo)
        if ip in _NAT64 or ip in _TRANSLATED or ip in _COMPATIBLE:
            out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip in _NAT64_LOCAL:
            # RFC 6052 /48: the IPv4 address is split around the u octet (bits 64-71).
            n = int(ip)
            out.append(ipaddress.IPv4Address(((n >> 64) & 0xFFFF) << 16 | ((n >> 40) & 0xFFFF)))
    return out


def address_refused(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None and ip not in _GLOBAL_UNICAST:
        return True
    return any(not a.is_global or a.is_multicast for a in _embedded(ip))


_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="asynch-resolve")


def _getaddrinfo(host: str, port: int):
    timeout = get_settings().resolve_timeout_seconds
    future = _POOL.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        future.cancel()
        raise UrlRefused(f"host {host!r} did not resolve within {timeout:g}s", transient=True) from None


def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = _getaddrinfo(host, port)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise UrlRefused(f"host {host!r} does not resolve", transient=True) from exc
    out: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if ip not in out:
            out.append(ip)
    if not out:
        raise UrlRefused(f"host {host!r} does not resolve", transient=True)
    return out


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
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("must be an http(s) URL with a host")
    if "@" in parts.netloc:
        raise UrlRefused("must not carry credentials")
    if parts.fragment:
        raise UrlRefused("must not have a #fragment")
    port = port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    return parts.scheme, parts.hostname, port, path + (f"?{parts.query}" if parts.query else "")


def _allowed(ip: IPAddress, nets: tuple) -> bool:
    """On the operator's allowlist; an IPv4-mapped address is judged as the
    IPv4 address the kernel connects to."""
    candidates = [ip] + ([ip.ipv4_mapped] if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else [])
    return any(c in n for c in candidates for n in nets if n.version == c.version)


def check_url(url: str) -> Target:
    """Parse, resolve and judge ``url``; raises UrlRefused."""
    scheme, host, port, pq = _parse(url)
    nets, names = _allowlist(get_settings().callback_allow_hosts)
    addresses = resolve(host, port)
    if host.lower().rstrip(".") not in names:
        for ip in addresses:
            if address_refused(ip) and not _allowed(ip, nets):
                log.info("callback target refused: %s resolves to %s", host, ip)
                raise UrlRefused("resolves to a refused address: loopback, private, link-local, metadata "
                                 "and other non-public targets are not allowed")
    return Target(scheme, host, port, pq, tuple(addresses))


def callback_url_problem(url: str) -> str | None:
    """Why a callbackUrl is refused at submit, or None."""
    try:
        check_url(url)
    except UrlRefused as exc:
        return str(exc)
    return None
