"""Host -> addresses for the SSRF guard (netguard.py), bounded in time and per tenant.

Invariants:
- An IP literal, in every spelling the C library takes (``0x7f000001``, ``2130706433``, ``0177.0.0.1``,
  ``::ffff:127.0.0.1``), is parsed by the unpatched C ``getaddrinfo`` with ``AI_NUMERICHOST``: no DNS, no thread.
- A name in /etc/hosts is answered from that file (re-read when it changes), as the C library's "files" source goes
  first; dnspython does not read it.
- Other names go to DNS with dnspython (/etc/resolv.conf or ``ASYNCH_RESOLVE_NAMESERVERS``), A and AAAA under one
  lifetime of at most ``ASYNCH_RESOLVE_TIMEOUT_SECONDS``, on the caller's own thread or greenlet (dnspython reads
  ``socket.socket`` and the selector at call time, so under gevent it parks the greenlet): no pool that slow names
  can fill.
- At most ``ASYNCH_RESOLVE_TENANT_INFLIGHT`` DNS lookups per tenant are in flight in this process; one with no place
  before its deadline fails.
- DNS answers and failures are kept ``ASYNCH_RESOLVE_CACHE_SECONDS`` for every tenant; the guard judges cached
  addresses as fresh ones.
"""
from __future__ import annotations

import _socket  # the C module: gevent patches ``socket``, never this
import ipaddress
import os
import socket
import threading
import time
from collections import Counter
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

import dns.exception
import dns.nameserver
import dns.resolver
from cachetools import TTLCache

from app.config import get_settings
from app.infra import caches

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
HOSTS_PATH = "/etc/hosts"
RESOLV_CONF = "/etc/resolv.conf"


class NotResolved(Exception):
    """The host has no usable address (for now: a later try may succeed)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def normal(host: str) -> str:
    return host.lower().rstrip(".")


def literal(host: str) -> list[IPAddress] | None:
    """The address an IP literal spells, or None for a name."""
    try:
        infos = _socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return None
    return _unique(info[4][0] for info in infos)


def _unique(raw) -> list[IPAddress]:
    return list(dict.fromkeys(ipaddress.ip_address(text.split("%", 1)[0]) for text in raw))


def _stamp(path: str) -> tuple:
    """What changes when the file does (an lru_cache key); () if unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return st.st_mtime_ns, st.st_size, st.st_ino


@lru_cache(maxsize=4)
def _hosts_table(path: str, stamp: tuple) -> dict[str, list[IPAddress]]:
    table: dict[str, list[IPAddress]] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return table
    for line in lines:
        ip, *names = line.split("#", 1)[0].split() or ["-"]
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            continue  # blank, a comment, or not an address
        for name in names:
            if addr not in (got := table.setdefault(normal(name), [])):
                got.append(addr)
    return table


def _nameserver(entry: str) -> dns.nameserver.Do53Nameserver:
    """``ip``, ``ip:port``, ``ipv6`` or ``[ipv6]:port``."""
    host, port = entry, 53
    if entry.count(":") < 2 or entry.startswith("["):
        parts = urlsplit("//" + entry)
        host, port = parts.hostname, parts.port or 53  # ValueError for a port that is not one
    ipaddress.ip_address(host)  # ValueError for a name: a nameserver is an address
    return dns.nameserver.Do53Nameserver(host, port)


@lru_cache(maxsize=4)
def _resolver(nameservers: str, _conf_stamp: tuple) -> dns.resolver.Resolver:
    r = dns.resolver.Resolver(configure=not nameservers.strip())  # configured: /etc/resolv.conf, search, ndots
    if nameservers.strip():
        r.nameservers = [_nameserver(e.strip()) for e in nameservers.split(",") if e.strip()]
    r.cache = None  # ours (below) also keeps names that did not resolve
    return r


class _InFlight:
    """Per-tenant count of DNS lookups in flight, with a bounded wait for a place."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.held: Counter[str] = Counter()  # tenant -> its lookups in flight

    def acquire(self, tenant: str, cap: int, deadline: float) -> bool:
        with self._cond:
            free = self._cond.wait_for(lambda: self.held[tenant] < cap, deadline - time.monotonic())
            if not free or deadline <= time.monotonic():
                return False  # no place, or one that would leave no time to look up
            self.held[tenant] += 1
            return True

    def release(self, tenant: str) -> None:
        with self._cond:
            self.held[tenant] -= 1
            if self.held[tenant] <= 0:
                del self.held[tenant]  # an idle tenant keeps no entry
            self._cond.notify_all()


in_flight = _InFlight()
# name -> addresses, or the NotResolved it raised; cleared with the other process caches.
_answers = caches.register(lambda: TTLCache(maxsize=4096, ttl=max(get_settings().resolve_cache_seconds, 0.001)),
                           enabled=lambda: get_settings().resolve_cache_seconds > 0)


def lookup(host: str, tenant: str | None = None, deadline: float | None = None) -> list[IPAddress]:
    """The addresses of ``host`` (literal, hosts file, DNS), A before AAAA; raises NotResolved.
    ``deadline`` (monotonic) may only shorten the ``ASYNCH_RESOLVE_TIMEOUT_SECONDS`` budget."""
    s = get_settings()
    got = literal(host) or _hosts_table(HOSTS_PATH, _stamp(HOSTS_PATH)).get(normal(host))  # never an empty list
    if got:
        return got
    key = normal(host)
    hit = _answers.get(key, None) if s.resolve_cache_seconds > 0 else None
    if isinstance(hit, NotResolved):
        raise NotResolved(str(hit), hit.timed_out)
    if hit is not None:
        return list(hit)
    end = time.monotonic() + s.resolve_timeout_seconds
    shortened = deadline is not None and deadline < end
    end = deadline if shortened else end
    if ":" in host or not key:  # not an address and not a DNS name either
        raise NotResolved(f"host {host!r} does not resolve")
    if tenant is not None and not in_flight.acquire(tenant, max(1, s.resolve_tenant_inflight), end):
        raise NotResolved(f"host {host!r} did not resolve: too many lookups of this tenant in flight")
    try:
        addresses = _ask_dns(host, end, s.resolve_timeout_seconds)
    except NotResolved as exc:
        if not (shortened and exc.timed_out):  # a caller's shorter budget says nothing about the name
            _answers.set(key, exc)
        raise
    finally:
        if tenant is not None:
            in_flight.release(tenant)
    _answers.set(key, tuple(addresses))
    return addresses


def _ask_dns(host: str, end: float, budget: float) -> list[IPAddress]:
    left = end - time.monotonic()
    if left <= 0:
        raise NotResolved(f"host {host!r} did not resolve within {budget:g}s", timed_out=True)
    try:
        r = _resolver(get_settings().resolve_nameservers, _stamp(RESOLV_CONF))
    except (dns.exception.DNSException, ValueError, OSError) as exc:
        raise NotResolved(f"no usable DNS configuration ({type(exc).__name__})") from exc
    try:
        answers = r.resolve_name(host, search=True, lifetime=left)
    except dns.exception.Timeout:
        raise NotResolved(f"host {host!r} did not resolve within {budget:g}s", timed_out=True) from None
    except (dns.exception.DNSException, ValueError, UnicodeError, OSError) as exc:
        raise NotResolved(f"host {host!r} does not resolve") from exc
    out = _unique(sorted(answers.addresses(), key=lambda a: ":" in a))  # A before AAAA, stable
    if not out:
        raise NotResolved(f"host {host!r} does not resolve")
    return out
