"""Per-tenant limits (table asynch_tenant_limits): the dispatch weight, the
request rate per key, the long-poll cap per API process (the tenant-wide
row, model_name ''), and the tenant's queue cap per model (a row per model).

The rows are the truth.  Readers on hot paths (every request's rate limit,
every submission's queue cap, every wait) go through a per-process cache
(ASYNCH_AUTH_CACHE_SECONDS, dropped on the invalidation message); the
dispatcher reads the weights from a Redis hash that every change rewrites
and the maintenance rebuild restores (``sync_weights``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from cachetools import TTLCache
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.clock import now as clock_now
from app.config import get_settings
from app.errors import Forbidden, ValidationFailed
from app.infra import caches
from app.infra.db import transaction
from app.infra.redis import dispatch as redis_dispatch
from app.infra.redis.events import publish_invalidate
from app.infra.tables import models, tenant_limits
from app.tenancy.keys import Principal
from app.tenancy.schemas import TenantLimits, TenantLimitsInput, is_tenant_name

_TENANT_FIELDS = ("weight", "rate_per_second", "burst", "max_waiters")


@dataclass(frozen=True)
class Limits:
    """A tenant's configured limits (None: the default)."""

    weight: int | None = None
    rate_per_second: float | None = None
    burst: int | None = None
    max_waiters: int | None = None
    queue_limits: dict[str, int] = field(default_factory=dict)
    updated_at: object = None


_cache = caches.register(lambda: TTLCache(maxsize=10_000, ttl=max(1e-6, get_settings().auth_cache_seconds)),
                         enabled=lambda: get_settings().auth_cache_seconds > 0)


def _load(tenant: str) -> Limits:
    with transaction() as conn:
        rows = conn.execute(select(tenant_limits).where(tenant_limits.c.tenant_id == tenant)).all()
    base = next((r for r in rows if r.model_name == ""), None)
    return Limits(**({k: getattr(base, k) for k in _TENANT_FIELDS} if base else {}),
                  queue_limits={r.model_name: r.queue_limit for r in rows
                                if r.model_name and r.queue_limit is not None},
                  updated_at=max((r.updated_at for r in rows), default=None))


def limits_of(tenant: str) -> Limits:
    """The tenant's limits, through the per-process cache."""
    found = _cache.get(tenant)
    if found is caches.MISSING:
        found = _load(tenant)
        _cache.set(tenant, found)
    return found


def tenant_queue_cap(tenant: str, model) -> int:
    """How many of ``model``'s queue slots ``tenant`` may hold: its own row
    for the model, else the model's tenant_queue_limit, else
    ASYNCH_TENANT_QUEUE_SHARE of queue_limit (rounded up); never above the
    model's queue_limit.  (A runtime override, asynch:runtime:
    tenant_queue_limit:{model}, lowers it further inside the gate step.)"""
    own = limits_of(tenant).queue_limits.get(model.model_name)
    if own is not None:
        cap = own
    elif getattr(model, "tenant_queue_limit", None) is not None:
        cap = model.tenant_queue_limit
    else:
        cap = math.ceil(model.queue_limit * get_settings().tenant_queue_share)
    return max(0, min(cap, model.queue_limit))


def _check_tenant(tenant: str) -> None:
    if not is_tenant_name(tenant):
        raise ValidationFailed("invalid tenant", [{"pointer": "/tenant",
                                                   "message": "must be 1-64 letters, digits, _ . -"}])


def read(principal: Principal, tenant: str) -> TenantLimits:
    """A tenant's limits for its own keys or an admin (else 403)."""
    _check_tenant(tenant)
    if not principal.is_admin and principal.tenant_id != tenant:
        raise Forbidden("admin key required")
    return _view(tenant, _load(tenant))


def _view(tenant: str, lim: Limits) -> TenantLimits:
    return TenantLimits.model_construct(tenant=tenant, **{k: getattr(lim, k) for k in _TENANT_FIELDS},
                                        queue_limits=dict(lim.queue_limits), updated_at=lim.updated_at)


def update(tenant: str, change: TenantLimitsInput) -> TenantLimits:
    """Admins: write the fields the change gives (null: back to the default)."""
    _check_tenant(tenant)
    given = change.model_dump(exclude_unset=True)
    now = clock_now()
    with transaction() as conn:
        tenant_wide = {k: given[k] for k in _TENANT_FIELDS if k in given}
        if tenant_wide:
            stmt = pg_insert(tenant_limits).values(tenant_id=tenant, model_name="", updated_at=now,
                                                   **tenant_wide)
            conn.execute(stmt.on_conflict_do_update(index_elements=["tenant_id", "model_name"],
                                                    set_={**tenant_wide, "updated_at": now}))
        for model, cap in (given.get("queue_limits") or {}).items():
            if cap is None:
                conn.execute(delete(tenant_limits).where(tenant_limits.c.tenant_id == tenant,
                                                         tenant_limits.c.model_name == model))
                continue
            stmt = pg_insert(tenant_limits).values(tenant_id=tenant, model_name=model, queue_limit=cap,
                                                   updated_at=now)
            conn.execute(stmt.on_conflict_do_update(index_elements=["tenant_id", "model_name"],
                                                    set_={"queue_limit": cap, "updated_at": now}))
    _cache.pop(tenant)
    publish_invalidate("tenants")
    lim = _load(tenant)
    redis_dispatch.set_weight(tenant, lim.weight or 1, _model_names())
    return _view(tenant, lim)


def _model_names() -> list[str]:
    """Every configured model: each keeps its own copy of the weights (one
    hash slot with its dispatch state, app/infra/redis/keys.py)."""
    with transaction() as conn:
        return [r.model_name for r in conn.execute(select(models.c.model_name))]


def sync_weights() -> int:
    """Rewrite every configured weight into Redis (after a wipe)."""
    with transaction() as conn:
        rows = conn.execute(select(tenant_limits.c.tenant_id, tenant_limits.c.weight).where(
            tenant_limits.c.model_name == "", tenant_limits.c.weight.is_not(None))).all()
    redis_dispatch.replace_weights({r.tenant_id: r.weight for r in rows}, _model_names())
    return len(rows)

