"""Per-tenant limits (table asynch_tenant_limits): the dispatch weight, the
request rate per key, the long-poll cap and the busy budget (the tenant-wide row, model_name
''), and per model its queue cap, guaranteed minimum and burst ceiling of
concurrent jobs (a row with none is deleted; a minimum above the ceiling is
refused).

The rows are the truth.  Hot paths read through a per-process cache
(ASYNCH_AUTH_CACHE_SECONDS, dropped on the invalidation message); the
dispatcher reads the weights, and each model's minimums and ceilings, from
Redis hashes every change rewrites and the wipe repair restores.
"""
from __future__ import annotations

import math

from cachetools import TTLCache
from sqlalchemy import delete, exists, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.clock import now as clock_now
from app.config import get_settings
from app.errors import NotFound, ValidationFailed
from app.infra import caches
from app.infra.db import transaction
from app.infra.redis import dispatch as redis_dispatch
from app.infra.redis.events import publish_invalidate
from app.infra.tables import api_keys, models, tenant_limits
from app.tenancy.keys import Principal
from app.tenancy.schemas import TenantLimits, TenantLimitsInput, check_tenant

_TENANT_FIELDS = ("weight", "rate_per_second", "burst", "max_waiters", "busy_budget")
# The per-model fields (model_name -> value) and their column.
_MODEL_FIELDS = {"queue_limits": "queue_limit", "min_concurrency": "min_concurrency",
                 "burst_concurrency": "burst_concurrency"}


_cache = caches.register(lambda: TTLCache(maxsize=10_000, ttl=max(1e-6, get_settings().auth_cache_seconds)),
                         enabled=lambda: get_settings().auth_cache_seconds > 0)


def _load(tenant: str) -> TenantLimits:
    """A tenant's configured limits (None: the default)."""
    with transaction() as conn:
        rows = conn.execute(select(tenant_limits).where(tenant_limits.c.tenant_id == tenant)).all()
    base = next((r for r in rows if r.model_name == ""), None)
    return TenantLimits.model_construct(
        tenant=tenant, **{k: getattr(base, k) if base else None for k in _TENANT_FIELDS},
        **{f: {r.model_name: getattr(r, c) for r in rows if r.model_name and getattr(r, c) is not None}
           for f, c in _MODEL_FIELDS.items()},
        updated_at=max((r.updated_at for r in rows), default=None))


def limits_of(tenant: str) -> TenantLimits:
    """The tenant's limits, through the per-process cache (callers only read it)."""
    found = _cache.get(tenant)
    if found is caches.MISSING:
        found = _load(tenant)
        _cache.set(tenant, found)
    return found


def tenant_queue_cap(tenant: str, model) -> int:
    """``model``'s queue slots ``tenant`` may hold: its own row, else the model's
    tenant_queue_limit, else ASYNCH_TENANT_QUEUE_SHARE of queue_limit (rounded
    up), never above queue_limit (a runtime override lowers it in the gate)."""
    cap = limits_of(tenant).queue_limits.get(model.model_name)
    if cap is None:
        cap = getattr(model, "tenant_queue_limit", None)
    if cap is None:
        cap = math.ceil(model.queue_limit * get_settings().tenant_queue_share)
    return max(0, min(cap, model.queue_limit))


def read(principal: Principal, tenant: str, must_exist: bool = False) -> TenantLimits:
    """A tenant's limits for its own keys or an admin (else 403).  With
    ``must_exist`` (`asynch tenants limits T`), a tenant with no API key and no
    limits row is NotFound: its defaults would hide a typo."""
    principal.check_tenant_access(tenant)
    if must_exist and not known(tenant):
        raise NotFound(f"tenant not found: {tenant} (no API key, no limits)")
    return _load(tenant)


def known(tenant: str) -> bool:
    """Has ``tenant`` an API key (revoked ones count) or a limits row?  (What
    GET /v1/tenants lists: app/observe/ops.py tenants.)"""
    with transaction() as conn:
        return bool(conn.execute(select(or_(exists().where(api_keys.c.tenant_id == tenant),
                                            exists().where(tenant_limits.c.tenant_id == tenant)))).scalar())


def update(tenant: str, change: TenantLimitsInput) -> TenantLimits:
    """Admins: write the fields the change gives (null: back to the default)."""
    check_tenant(tenant)
    given = change.model_dump(exclude_unset=True)
    now = clock_now()
    with transaction() as conn:
        # model_name "" is the tenant-wide row (no model is named "").
        rows: dict[str, dict] = {"": {k: given[k] for k in _TENANT_FIELDS if k in given}}
        for f, col in _MODEL_FIELDS.items():
            for model, value in (given.get(f) or {}).items():
                rows.setdefault(model, {})[col] = value
        for model, vals in rows.items():
            if vals:
                stmt = pg_insert(tenant_limits).values(tenant_id=tenant, model_name=model, updated_at=now, **vals)
                conn.execute(stmt.on_conflict_do_update(index_elements=["tenant_id", "model_name"],
                                                        set_={**vals, "updated_at": now}))
        c = tenant_limits.c
        conn.execute(delete(tenant_limits).where(c.tenant_id == tenant, c.model_name != "", c.queue_limit.is_(None),
                                                 c.min_concurrency.is_(None), c.burst_concurrency.is_(None)))
        over = conn.execute(select(c.model_name).where(c.tenant_id == tenant, c.min_concurrency > c.burst_concurrency)
                            ).scalars().all()
        if over:  # the transaction rolls back: nothing changed
            raise ValidationFailed("invalid tenant limits", [
                {"pointer": f"/min_concurrency/{m}", "message": "must not be above burst_concurrency"} for m in over])
    _cache.pop(tenant)
    publish_invalidate("tenants")
    lim = _load(tenant)
    redis_dispatch.set_weight(tenant, lim.weight or 1, _model_names())
    sync_shares({m for f in ("min_concurrency", "burst_concurrency") for m in (given.get(f) or {})})
    return lim


def _model_names() -> list[str]:
    """Every configured model: each keeps its own copy of the weights (its hash slot)."""
    with transaction() as conn:
        return [r.model_name for r in conn.execute(select(models.c.model_name))]


def sync_weights() -> int:
    """Rewrite every configured weight into Redis (after a wipe)."""
    with transaction() as conn:
        rows = conn.execute(select(tenant_limits.c.tenant_id, tenant_limits.c.weight).where(
            tenant_limits.c.model_name == "", tenant_limits.c.weight.is_not(None))).all()
    redis_dispatch.replace_weights({r.tenant_id: r.weight for r in rows}, _model_names())
    return len(rows)


def sync_shares(model_names=None) -> int:
    """Rewrite each model's map of tenant minimums and ceilings into Redis
    (``model_names``: those changed; None: every configured model, after a wipe)."""
    names = set(_model_names() if model_names is None else model_names)
    if not names:
        return 0
    c = tenant_limits.c
    with transaction() as conn:
        rows = conn.execute(select(c.tenant_id, c.model_name, c.min_concurrency, c.burst_concurrency).where(
            c.model_name.in_(names), or_(c.min_concurrency.is_not(None), c.burst_concurrency.is_not(None)))).all()
    for m in sorted(names):
        redis_dispatch.set_shares(m, {r.tenant_id: (r.min_concurrency, r.burst_concurrency)
                                      for r in rows if r.model_name == m})
    return len(rows)
