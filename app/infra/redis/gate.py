"""The admission gate: a model's pending + running jobs, one slot per job id
(docs/architecture.md, invariants 3 and 4).  Admission is one Lua step;
release is idempotent (members are job ids); reconcile makes the set equal
the database's rows."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from app.infra.redis import keys
from app.infra.redis.client import get_redis, script

# Admission gate: check the model's limit and the tenant's share of it, and
# take a slot in both, in one step.  Every key carries the model's hash tag (one slot).
# KEYS[1] gate sorted set (member job id, score admission time)
# KEYS[2] runtime queue_limit override (optional integer string)
# KEYS[3] the tenant's gate sorted set (its slots of this model)
# KEYS[4] runtime per-tenant queue cap override (optional integer string)
# ARGV[1] job id  ARGV[2] configured queue_limit (cap)  ARGV[3] now (unix s)
# ARGV[4] the tenant's cap on this model
# Returns {admitted 0|1, effective limit, depth after, 'model' | 'tenant' (who refused; '' when admitted)}:
# on a tenant refusal the limit and depth are the tenant's.
# Each limit is its runtime override if present, never above its cap; a limit
# <= 0 rejects everything.  Re-admitting a member is a no-op success.
GATE_ADMIT = """
local limit = tonumber(ARGV[2])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local depth = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, limit, depth, ''} end
if limit <= 0 or depth >= limit then return {0, limit, depth, 'model'} end
local share = tonumber(ARGV[4])
local trt = tonumber(redis.call('GET', KEYS[4]) or '')
if trt and trt < share then share = trt end
local held = redis.call('ZCARD', KEYS[3])
if share <= 0 or held >= share then return {0, share, held, 'tenant'} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return {1, limit, depth + 1, ''}
"""

# Admission of a list, for ONE model: GATE_ADMIT's checks for each item in
# order, each seeing the slots the items before it took (group commit,
# app/jobs/admission.py).
# KEYS[1] gate sorted set  KEYS[2] runtime queue_limit override
# KEYS[3] runtime per-tenant queue cap override  KEYS[4..] the tenants' gate sorted sets
# ARGV[1] configured queue_limit (cap)  ARGV[2] now (unix s)
# ARGV[3..] triples: job id, index of its tenant's key in KEYS (4..), the tenant's cap
# Returns one {admitted 0|1, limit, depth, 'model' | 'tenant' | ''} per item, as GATE_ADMIT.
GATE_ADMIT_MANY = """
local limit = tonumber(ARGV[1])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local trt = tonumber(redis.call('GET', KEYS[3]) or '')
local depth = redis.call('ZCARD', KEYS[1])
local out = {}
for i = 3, #ARGV, 3 do
  local job, tkey, share = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if trt and trt < share then share = trt end
  if redis.call('ZSCORE', KEYS[1], job) then
    out[#out + 1] = {1, limit, depth, ''}
  elseif limit <= 0 or depth >= limit then
    out[#out + 1] = {0, limit, depth, 'model'}
  else
    local held = redis.call('ZCARD', tkey)
    if share <= 0 or held >= share then
      out[#out + 1] = {0, share, held, 'tenant'}
    else
      redis.call('ZADD', KEYS[1], ARGV[2], job)
      redis.call('ZADD', tkey, ARGV[2], job)
      depth = depth + 1
      out[#out + 1] = {1, limit, depth, ''}
    end
  end
end
return out
"""

# Reconcile a gate with the database.
# KEYS[1] gate sorted set
# ARGV[1] now  ARGV[2] cutoff: only members admitted before it may be removed
#               (a younger one may belong to a row that is about to commit)
# ARGV[3..] ids of the model's pending/running rows
# Returns {added ids, removed ids}.
GATE_RECONCILE = """
local want = {}
local added = {}
for i = 3, #ARGV do
  want[ARGV[i]] = true
  if redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[i]) == 1 then
    added[#added + 1] = ARGV[i]
  end
end
local removed = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])) do
  if not want[id] then
    redis.call('ZREM', KEYS[1], id)
    removed[#removed + 1] = id
  end
end
return {added, removed}
"""


@dataclass(frozen=True)
class GateDecision:
    admitted: bool
    limit: int
    depth: int
    refused_by: str = ""  # 'model' (the queue is full) or 'tenant' (the tenant is at its share)


def gate_admit(model: str, tenant: str, job_id: str, cap: int, tenant_cap: int | None = None) -> GateDecision:
    """``tenant_cap``: the tenant's share of the model's queue (None: the whole queue)."""
    admitted, limit, depth, by = script(GATE_ADMIT)(
        keys=[keys.gate(model), keys.runtime_queue_limit(model), keys.tenant_gate(model, tenant),
              keys.runtime_tenant_queue_limit(model)],
        args=[job_id, int(cap), f"{time.time():.6f}", int(cap if tenant_cap is None else tenant_cap)],
    )
    return GateDecision(bool(admitted), int(limit), int(depth), by or "")


def gate_admit_many(items: list[tuple[str, str, str, int, int]]) -> list[GateDecision]:
    """(model, tenant, job_id, cap, tenant_cap) items, decided in order: one
    GATE_ADMIT_MANY step per model, all in one round trip (a pipeline)."""
    by_model: dict[str, list[int]] = {}
    for i, (model, *_rest) in enumerate(items):
        by_model.setdefault(model, []).append(i)
    now = f"{time.time():.6f}"
    run = script(GATE_ADMIT_MANY)
    # One model (the usual batch): one EVALSHA.  Several: a pipeline (redis-py
    # checks SCRIPT EXISTS first, so two round trips for the whole batch).
    pipe = get_redis().pipeline(transaction=False) if len(by_model) > 1 else None
    results = []
    for model, idx in by_model.items():
        tenant_keys: dict[str, int] = {}
        args: list = [int(items[idx[0]][3]), now]
        for i in idx:
            _m, tenant, job_id, _cap, tenant_cap = items[i]
            pos = tenant_keys.setdefault(tenant, 4 + len(tenant_keys))
            args += [job_id, pos, int(tenant_cap)]
        keys_ = [keys.gate(model), keys.runtime_queue_limit(model), keys.runtime_tenant_queue_limit(model),
                 *[keys.tenant_gate(model, t) for t in tenant_keys]]
        if pipe is None:
            results.append(run(keys=keys_, args=args))
        else:
            run(keys=keys_, args=args, client=pipe)
    if pipe is not None:
        results = pipe.execute()
    out: list[GateDecision | None] = [None] * len(items)
    for (model, idx), res in zip(by_model.items(), results):
        for i, (admitted, limit, depth, by) in zip(idx, res):
            out[i] = GateDecision(bool(admitted), int(limit), int(depth), by or "")
    return out  # type: ignore[return-value]


def gate_release(model: str, tenant: str, job_id: str) -> bool:
    """Give a slot back (the model's and the tenant's).  Idempotent:
    releasing twice removes nothing more."""
    pipe = get_redis().pipeline(transaction=True)  # one slot: both keys carry the model's tag
    pipe.zrem(keys.gate(model), job_id)
    pipe.zrem(keys.tenant_gate(model, tenant), job_id)
    removed, _ = pipe.execute()
    return bool(removed)


def tenant_depth(model: str, tenant: str) -> int:
    return int(get_redis().zcard(keys.tenant_gate(model, tenant)))


def tenant_gates(model: str) -> dict[str, str]:
    """tenant -> its gate key, for every tenant with a gate set on ``model``."""
    prefix = keys.tenant_gate(model, "")
    return {k[len(prefix):]: k for k in get_redis().scan_iter(match=prefix + "*", count=500)}


def gate_depth(model: str) -> int:
    return int(get_redis().zcard(keys.gate(model)))


def gate_members(model: str) -> set[str]:
    return set(get_redis().zrange(keys.gate(model), 0, -1))


def gate_reconcile(model: str, active_ids: Iterable[str], grace_seconds: float,
                   key: str | None = None) -> tuple[list[str], list[str]]:
    """Make the model's gate (or ``key``, one tenant's gate of it) hold
    exactly ``active_ids``, sparing members younger than the grace."""
    now = time.time()
    added, removed = script(GATE_RECONCILE)(
        keys=[key or keys.gate(model)],
        args=[f"{now:.6f}", f"{now - grace_seconds:.6f}", *active_ids],
    )
    return list(added), list(removed)


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
    out = {}
    for i, n in enumerate(names):
        depth, ql, mc = res[3 * i:3 * i + 3]
        out[n] = (int(depth), int(ql) if ql is not None else None, int(mc) if mc is not None else None)
    return out
