"""The admission gate: a model's pending + running jobs, one slot per job id (docs/architecture.md, invariants 3
and 4, "Fair share at admission"). Admission is one Lua step (gate_admit.lua: one rule, for one job or a list:
the model's limit, the tenant's static cap, its weighted fair share among the tenants holding slots, a reserve
for newcomers); release is idempotent (members are job ids); reconcile makes the sets equal the database's
rows. The set of tenants holding slots (``keys.gate_tenants``) is an index the admission step prunes itself
and reconcile re-fills after a wipe."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys, scripts
from app.infra.redis.client import get_redis


@dataclass(frozen=True)
class GateDecision:
    admitted: bool
    limit: int
    depth: int
    refused_by: str = ""  # 'model' (the queue is full) or 'tenant' (the tenant is at its share)


def gate_admit(model: str, tenant: str, job_id: str, cap: int, tenant_cap: int | None = None) -> GateDecision:
    """One job: a batch of one.  ``tenant_cap``: the tenant's share of the model's queue (None: all of it)."""
    return gate_admit_many([(model, tenant, job_id, cap, cap if tenant_cap is None else tenant_cap)])[0]


def gate_admit_many(items: list[tuple[str, str, str, int, int]]) -> list[GateDecision]:
    """(model, tenant, job_id, cap, tenant_cap) items, decided in order: one step per model, one round trip."""
    by_model: dict[str, list[int]] = {}
    for i, (model, *_rest) in enumerate(items):
        by_model.setdefault(model, []).append(i)
    now = f"{time.time():.6f}"
    s = get_settings()
    reserve = s.queue_newcomer_reserve if s.queue_fair_share else -1
    steps = []
    for model, idx in by_model.items():
        tenant_keys: dict[str, int] = {}  # tenant -> its gate's KEYS index
        args: list = [int(items[idx[0]][3]), now, reserve, keys.tenant_gate(model, "")]
        for i in idx:
            _m, tenant, job_id, _cap, tenant_cap = items[i]
            args += [job_id, tenant_keys.setdefault(tenant, 6 + len(tenant_keys)), int(tenant_cap)]
        steps.append(([keys.gate(model), keys.runtime_queue_limit(model), keys.runtime_tenant_queue_limit(model),
                       keys.gate_tenants(model), keys.dispatch_weights(model),
                       *[keys.tenant_gate(model, t) for t in tenant_keys]], args))
    # One model (the usual batch): one EVALSHA.  Several: a pipeline (redis-py
    # checks SCRIPT EXISTS first, so two round trips for the whole batch).
    pipe = get_redis().pipeline(transaction=False) if len(steps) > 1 else None
    results = [scripts.get("gate_admit")(keys=k, args=a, client=pipe) for k, a in steps]
    results = pipe.execute() if pipe is not None else results
    decided = {i: GateDecision(bool(admitted), int(limit), int(depth), by or "")
               for idx, res in zip(by_model.values(), results) for i, (admitted, limit, depth, by) in zip(idx, res)}
    return [decided[i] for i in range(len(items))]


def gate_release(model: str, tenant: str, job_id: str) -> bool:
    """Give a slot back (the model's and the tenant's); idempotent."""
    pipe = get_redis().pipeline(transaction=True)  # one slot: both keys carry the model's tag
    pipe.zrem(keys.gate(model), job_id)
    pipe.zrem(keys.tenant_gate(model, tenant), job_id)
    removed, _ = pipe.execute()
    return bool(removed)


def tenant_gates(model: str) -> dict[str, str]:
    """tenant -> its gate key, for every tenant with a gate set on ``model``."""
    prefix = keys.tenant_gate(model, "")
    return {k[len(prefix):]: k for k in get_redis().scan_iter(match=prefix + "*", count=500)}


def gate_reconcile(model: str, active_ids: Iterable[str], grace_seconds: float,
                   key: str | None = None) -> tuple[list[str], list[str]]:
    """Make the model's gate (or ``key``, a tenant's) hold exactly ``active_ids``, sparing younger members."""
    now = time.time()
    added, removed = scripts.get("gate_reconcile")(keys=[key or keys.gate(model)],
                                                   args=[f"{now:.6f}", f"{now - grace_seconds:.6f}", *active_ids])
    return list(added), list(removed)


def note_holders(model: str, tenants: Iterable[str]) -> None:
    """Put tenants that hold slots of ``model`` into its index (reconcile, after a wipe)."""
    if found := list(tenants):
        get_redis().sadd(keys.gate_tenants(model), *found)


def gate_models() -> list[str]:
    """Models that have a gate key in Redis (including deleted models)."""
    found = (keys.model_of(k, "gate") for k in get_redis().scan_iter(match=keys.model_pattern("gate"), count=500))
    return [m for m in found if m]


def gate_snapshot(model_names: Iterable[str]) -> dict[str, tuple[int, int | None, int | None]]:
    """model -> (gate depth, runtime queue_limit, runtime max_concurrency) in one round trip."""
    names = list(model_names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.zcard(keys.gate(n))
        pipe.get(keys.runtime_queue_limit(n))
        pipe.get(keys.runtime_max_concurrency(n))
    res = pipe.execute()
    return {n: (int(depth), None if ql is None else int(ql), None if mc is None else int(mc))
            for n, depth, ql, mc in zip(names, res[0::3], res[1::3], res[2::3])}


def slot_split(model_names: Iterable[str], tenant: str | None = None) -> dict[str, tuple[int, int]]:
    """model -> (pending, running) among the slots of its gate (of ``tenant``'s gate set with ``tenant``).
    Running: the live permits the dispatcher holds for the model's jobs (taken when a worker's free slot pulls a
    job, kept for the call's lease: dispatch.py); every other slot is pending.  Two round trips (one with
    ``tenant``)."""
    names = list(model_names)
    r = get_redis()
    pipe = r.pipeline(transaction=False)
    now = time.time()
    for m in names:
        if tenant is None:
            pipe.zcard(keys.gate(m))
            pipe.smembers(keys.gate_tenants(m))
        else:
            pipe.zcard(keys.tenant_gate(m, tenant))
            pipe.zcount(keys.semaphore(m, tenant), now, "+inf")
    res = pipe.execute()
    if tenant is None:
        # The permits of every tenant holding slots (the admission step's index of them).
        holders = [(m, t) for m, held in zip(names, res[1::2]) for t in held]
        pipe = r.pipeline(transaction=False)
        for m, t in holders:
            pipe.zcount(keys.semaphore(m, t), now, "+inf")
        permits = dict.fromkeys(names, 0)
        for (m, _t), n in zip(holders, pipe.execute() if holders else []):
            permits[m] += int(n)
        pairs = [(int(d), permits[m]) for m, d in zip(names, res[0::2])]
    else:
        pairs = [(int(d), int(p)) for d, p in zip(res[0::2], res[1::2])]
    return {m: (depth - min(depth, held), min(depth, held)) for m, (depth, held) in zip(names, pairs)}
