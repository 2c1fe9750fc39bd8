"""How many concurrent long-polls a tenant may hold on one API process.

Invariants:
- ``waiter_cap(principal)`` is the only place the per-tenant number is
  decided; app/infra/wakeups.py counts and enforces it (and the process-wide
  ``ASYNCH_WAITERS_MAX``) when a wait registers, before any read.
- The default resolver answers ``ASYNCH_WAITERS_PER_TENANT`` for everyone;
  ``set_waiter_cap_resolver`` replaces it (per-tenant limits), ``None``
  restores the default.  A resolver runs on every wait: keep it in memory
  (a cached lookup), never a network round trip per request.
"""
from __future__ import annotations

from typing import Callable

from app.config import get_settings
from app.tenancy.keys import Principal

Resolver = Callable[[Principal], int]


def default_cap(principal: Principal) -> int:
    return get_settings().waiters_per_tenant


_resolver: Resolver = default_cap


def set_waiter_cap_resolver(fn: Resolver | None) -> None:
    """Install the resolver (per-tenant caps); None restores the default."""
    global _resolver
    _resolver = fn if fn is not None else default_cap


def waiter_cap(principal: Principal) -> int:
    """Concurrent waits ``principal``'s tenant may hold on this API process."""
    return _resolver(principal)
