"""How many concurrent long-polls a tenant may hold on one API process.

Invariants: ``waiter_cap`` is the only place the per-tenant number is
decided (app/infra/wakeups.py enforces it, and ASYNCH_WAITERS_MAX, before
any read).  The default answers the tenant's ``max_waiters`` (the limits
cache), else ASYNCH_WAITERS_PER_TENANT; a resolver runs on every wait, so it
stays in memory.
"""
from __future__ import annotations

from typing import Callable

from app.config import get_settings
from app.tenancy import limits
from app.tenancy.keys import Principal


def tenant_cap(principal: Principal) -> int:
    own = limits.limits_of(principal.tenant_id).max_waiters
    return own if own is not None else get_settings().waiters_per_tenant


_resolver: Callable[[Principal], int] = tenant_cap


def set_waiter_cap_resolver(fn: Callable[[Principal], int] | None) -> None:
    """Install the resolver (tests: per-tenant caps); None restores the default."""
    global _resolver
    _resolver = fn or tenant_cap


def waiter_cap(principal: Principal) -> int:
    """Concurrent waits ``principal``'s tenant may hold on this API process."""
    return _resolver(principal)
