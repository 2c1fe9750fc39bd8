"""Fair dispatch: which pending job gets a run_job message next.

Per model, every tenant's ready jobs wait in their own sorted set (scored by
queue order); the tenants that have ready work and a free permit form a
ring scored by a virtual *pass* (stride scheduling: each dispatch advances
the tenant's pass by 1/weight, the lowest pass goes next, so a tenant with
weight 2 gets twice the turns of one with weight 1 when both have work, and
a tenant that comes back after a pause starts at the current virtual time,
not with credit saved up).  Dispatching a job takes its tenant's permit
(maxConcurrency) in the same step, so a message in the broker always has a
permit and a worker never polls for one; a tenant at its limit leaves the
ring (``blocked``) until one of its jobs finishes.  At most ``window``
messages per model wait in the broker unclaimed: fairness is decided here,
where it can be, and not in the broker's FIFO.

Every decision is one Lua step over the model's keys.  The scripts share the
functions of ``_LIB``; per-tenant keys are built inside the script from the
prefixes in ARGV, which start with the model's hash tag like every key in
KEYS, so a step touches one hash slot (Redis Cluster; app/infra/redis/keys.py).
That is why a step reads the model's own copy of the tenant weights, not
the global hash: ``copy_weights`` refreshes the copies from it on every
change and every periodic kick.  Everything here is derived state: the rows
are the truth, and app/maintenance rebuilds these sets from them after a wipe.

Lost messages repair themselves: a dispatched job that no worker claims
within ``lease`` seconds goes back to the head of its tenant's queue with
its permit returned (a duplicate message is harmless: the claim CAS lets one
through).
"""
from __future__ import annotations

from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys
from app.infra.redis.client import get_redis, script

# KEYS (every script; all of one model, one hash slot): 1 ring (zset tenant -> pass)  2 blocked (set)
#   3 pass (hash tenant -> saved pass; field "" the virtual time)
#   4 inflight (zset job -> dispatch time)  5 inflight info (hash job -> "tenant score")
#   6 conf (hash: mc = the model's max_concurrency)  7 runtime max_concurrency override
#   8 the model's copy of the weights (hash tenant -> weight)  9 attempts (hash job -> the attempt it is pending at)
# ARGV (every script): 1 ready key prefix ("...:dq:ready:{model}:")  2 permit key prefix ("...:sem:{model}:")
#   3 cap (max_concurrency; '' = the stored conf)  4 window  5 dispatch lease (s)  6 most jobs to dispatch
# Each script returns {tenant1, job1, attempt1, tenant2, ...}: the jobs dispatched
# (their permits taken): publish one run_job(job, attempt) message for each.
_LIB = """
local READY, SEM = ARGV[1], ARGV[2]
local K_RING, K_BLOCKED, K_PASS, K_INF, K_INFO, K_CONF, K_RTMC, K_W, K_ATT = KEYS[1], KEYS[2], KEYS[3],
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local t0 = redis.call('TIME')
local NOW = tonumber(t0[1]) + tonumber(t0[2]) / 1000000

local function limit()
  local cap = tonumber(ARGV[3])
  if cap then redis.call('HSET', K_CONF, 'mc', cap) else cap = tonumber(redis.call('HGET', K_CONF, 'mc')) or 1 end
  local rt = tonumber(redis.call('GET', K_RTMC) or '')
  if rt and rt < cap then cap = rt end
  return cap
end

local function activate(t)
  if redis.call('ZSCORE', K_RING, t) or redis.call('SISMEMBER', K_BLOCKED, t) == 1 then return end
  if redis.call('ZCARD', READY .. t) == 0 then return end
  local saved = tonumber(redis.call('HGET', K_PASS, t) or '0')
  local vt = tonumber(redis.call('HGET', K_PASS, '') or '0')
  redis.call('ZADD', K_RING, math.max(saved, vt), t)
end

local function unblock(t)
  redis.call('SREM', K_BLOCKED, t)
  activate(t)
end

-- Dispatched jobs nobody claimed before 'older_than': back to the head of
-- their tenant's queue, permit returned (the message was lost).
local function requeue_unclaimed(older_than)
  for _, job in ipairs(redis.call('ZRANGEBYSCORE', K_INF, '-inf', older_than)) do
    local info = redis.call('HGET', K_INFO, job)
    redis.call('ZREM', K_INF, job)
    redis.call('HDEL', K_INFO, job)
    if info then
      local t, score = string.match(info, '^(%S+) (%S+)$')
      redis.call('ZREM', SEM .. t, job)
      redis.call('ZADD', READY .. t, 'NX', score, job)
      unblock(t)
    end
  end
end

local function dispatch()
  local window, lease, most = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  requeue_unclaimed(NOW - lease)
  local cap = limit()
  local out = {}
  while #out < 3 * most and redis.call('ZCARD', K_INF) < window do
    local picked, pass = nil, 0
    local ring = redis.call('ZRANGE', K_RING, 0, -1, 'WITHSCORES')
    for i = 1, #ring, 2 do
      local t, p = ring[i], tonumber(ring[i + 1])
      if redis.call('ZCARD', READY .. t) == 0 then
        redis.call('ZREM', K_RING, t)
        redis.call('HSET', K_PASS, t, p)
      else
        redis.call('ZREMRANGEBYSCORE', SEM .. t, '-inf', NOW)  -- a dead worker's permits
        if redis.call('ZCARD', SEM .. t) < cap then
          picked, pass = t, p
          break
        end
        redis.call('ZREM', K_RING, t)
        redis.call('HSET', K_PASS, t, p)
        redis.call('SADD', K_BLOCKED, t)
      end
    end
    if not picked then break end
    local popped = redis.call('ZPOPMIN', READY .. picked)
    local job, score = popped[1], popped[2]
    redis.call('ZADD', SEM .. picked, NOW + lease, job)
    redis.call('ZADD', K_INF, NOW, job)
    redis.call('HSET', K_INFO, job, picked .. ' ' .. score)
    local w = tonumber(redis.call('HGET', K_W, picked) or '1') or 1
    if w < 1 then w = 1 end
    redis.call('HSET', K_PASS, '', pass)
    if redis.call('ZCARD', READY .. picked) > 0 then
      redis.call('ZADD', K_RING, pass + 1.0 / w, picked)
    else
      redis.call('ZREM', K_RING, picked)
      redis.call('HSET', K_PASS, picked, pass + 1.0 / w)
    end
    out[#out + 1] = picked
    out[#out + 1] = job
    out[#out + 1] = redis.call('HGET', K_ATT, job) or '-1'
  end
  return out
end
"""

# Queue jobs (admitted, re-admitted, recovered) and dispatch.
# ARGV 7: mode: '' (add or move), 'NX' (only if not queued: recovery), 'XXLT'
#   (only move an already queued job ahead: promotion);  ARGV 8..: tenant, job, score, attempt quads.
# A job that holds a live permit (dispatched or running) is never queued again.
ENQUEUE = _LIB + """
local mode = ARGV[7]
for i = 8, #ARGV, 4 do
  local t, job, score = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if mode ~= 'XXLT' or redis.call('ZSCORE', READY .. t, job) then redis.call('HSET', K_ATT, job, ARGV[i + 3]) end
  local held = tonumber(redis.call('ZSCORE', SEM .. t, job) or '-1')
  if held <= NOW then
    if held >= 0 then redis.call('ZREM', SEM .. t, job) end  -- a permit that expired with its worker
    if mode == 'NX' then redis.call('ZADD', READY .. t, 'NX', score, job)
    elseif mode == 'XXLT' then redis.call('ZADD', READY .. t, 'XX', 'LT', score, job)
    else redis.call('ZADD', READY .. t, score, job) end
    activate(t)
  end
end
return dispatch()
"""

# A worker claimed a dispatched job (its row is running now), or the worker-less
# runWork pass claimed a job straight from its row (it may still sit in its
# tenant's ready queue: it leaves it, so it is not dispatched while it runs).
# ARGV 7 tenant  8 job  9 run lease (s): the permit lasts as long as the row's lease.
CLAIMED = _LIB + """
redis.call('ZREM', READY .. ARGV[7], ARGV[8])
redis.call('ZREM', K_INF, ARGV[8])
redis.call('HDEL', K_INFO, ARGV[8])
redis.call('ZADD', SEM .. ARGV[7], NOW + tonumber(ARGV[9]), ARGV[8])
return dispatch()
"""

# A job left pending/running (terminal, or retry_wait): its gate slots, its
# place in the queue and its permit all go back, in one step, and the next
# job is dispatched.
# KEYS 10 the model's gate (zset)
# ARGV 7 tenant  8 job  9 tenant-gate key prefix ("...:tgate:{model}:")  10 terminal channel ('' = no wake-up)
#   11 the wake-up message ('' = the job id alone).  A channel is not a key: under Redis Cluster the
#   PUBLISH reaches the subscribers on every node.
# Returns {1 if the model's gate slot was still held (0: released before), dispatched pairs...}.
FINISH = _LIB + """
local t, job = ARGV[7], ARGV[8]
local released = redis.call('ZREM', KEYS[10], job)
redis.call('ZREM', ARGV[9] .. t, job)
redis.call('ZREM', READY .. t, job)
redis.call('ZREM', SEM .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('HDEL', K_ATT, job)
unblock(t)
if ARGV[10] ~= '' then redis.call('PUBLISH', ARGV[10], ARGV[11] ~= '' and ARGV[11] or job) end
local out = dispatch()
table.insert(out, 1, released)
return out
"""

# Unblock every tenant (limits changed, permits expired) and dispatch.
# ARGV 7: '1' = also re-queue every unclaimed dispatched job (the broker lost its messages).
KICK = _LIB + """
if ARGV[7] == '1' then requeue_unclaimed('+inf') end
for _, t in ipairs(redis.call('SMEMBERS', K_BLOCKED)) do
  redis.call('SREM', K_BLOCKED, t)
  activate(t)
end
return dispatch()
"""


def _keys(model: str) -> list[str]:
    return [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
            keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_conf(model),
            keys.runtime_max_concurrency(model), keys.dispatch_weights(model), keys.dispatch_attempts(model)]


def _args(model: str, cap: int | None, most: int | None) -> list:
    s = get_settings()
    return [keys.dispatch_ready(model, ""), keys.semaphore(model, ""), "" if cap is None else int(cap),
            s.dispatch_window, f"{s.dispatch_lease_seconds:.3f}", most if most is not None else s.dispatch_window]


def _triples(flat: list) -> list[tuple[str, str, str]]:
    """(tenant, job_id, attempt: "<n>" or "<n>h" for a head retry) of each job dispatched."""
    return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def enqueue(model: str, entries: Iterable[tuple[str, str, float, str | int]], *, cap: int | None = None,
            mode: str = "", most: int | None = None) -> list[tuple[str, str, str]]:
    """Queue (tenant, job_id, order score, attempt) entries and dispatch
    (attempt: n, or "<n>h" for a retry at the head); returns the (tenant,
    job_id, attempt) of each job dispatched."""
    flat = [x for t, job, score, attempt in entries for x in (t, job, repr(float(score)), str(attempt))]
    return _triples(script(ENQUEUE)(keys=_keys(model), args=[*_args(model, cap, most), mode, *flat]))


def claimed(model: str, tenant: str, job_id: str, run_lease_seconds: float,
            cap: int | None = None) -> list[tuple[str, str, str]]:
    return _triples(script(CLAIMED)(keys=_keys(model), args=[*_args(model, cap, None), tenant, job_id,
                                                            f"{run_lease_seconds:.3f}"]))


def finish(model: str, tenant: str, job_id: str, *, wake: bool, message: str = "",
           cap: int | None = None) -> tuple[bool, list[tuple[str, str, str]]]:
    """(whether the gate slot was still held, the jobs dispatched).
    ``message``: what the wake-up carries (app/infra/wakeups.py
    snapshot_message); empty, the job id."""
    released, *rest = script(FINISH)(keys=[*_keys(model), keys.gate(model)], args=[
        *_args(model, cap, None), tenant, job_id, keys.tenant_gate(model, ""),
        keys.terminal_channel() if wake else "", message if wake else ""])
    return bool(released), _triples(rest)


def kick(model: str, *, cap: int | None = None, requeue_inflight: bool = False) -> list[tuple[str, str, str]]:
    return _triples(script(KICK)(keys=_keys(model), args=[*_args(model, cap, None), "1" if requeue_inflight else ""]))


def restore_permits(model: str, held: list[tuple[str, str, float]]) -> None:
    """(tenant, job_id, lease expiry as unix time) of running jobs: their
    permits, rebuilt from the rows after a wipe."""
    pipe = get_redis().pipeline(transaction=False)
    for tenant, job_id, until in held:
        pipe.zadd(keys.semaphore(model, tenant), {job_id: until})
    pipe.execute()


def models() -> set[str]:
    """Models with dispatch state in Redis (for the periodic kick)."""
    found = set()
    for kind in ("dq:ring", "dq:inflight", "dq:blocked"):
        for k in get_redis().scan_iter(match=keys.model_pattern(kind), count=500):
            name = keys.model_of(k, kind)
            if name:
                found.add(name)
    return found


def set_cap(model: str, max_concurrency: int) -> None:
    """The model's max_concurrency, for dispatch steps whose caller does not
    know it (a cancel, a timeout); the periodic kick dispatches what a raised
    limit now allows."""
    get_redis().hset(keys.dispatch_conf(model), "mc", int(max_concurrency))


def set_weight(tenant: str, weight: int, models_: Iterable[str] = ()) -> None:
    """The tenant's weight, in the global hash and in the copy of every
    model with dispatch state (and of ``models_``): at once where it matters."""
    get_redis().hset(keys.tenant_weights(), tenant, int(weight))
    copy_weights(set(models_) | models())


def replace_weights(weights: dict[str, int], models_: Iterable[str] = ()) -> None:
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(keys.tenant_weights())
    if weights:
        pipe.hset(keys.tenant_weights(), mapping={t: int(w) for t, w in weights.items()})
    pipe.execute()
    copy_weights(set(models_) | models())


def copy_weights(model_names: Iterable[str]) -> None:
    """Make each model's copy of the weights (what its dispatch steps read)
    equal the global hash.  Each copy is replaced in one MULTI of its own
    slot; a step between two copies sees the old or the new weights whole."""
    names = sorted(set(model_names))
    if not names:
        return
    current = {t: int(w) for t, w in get_redis().hgetall(keys.tenant_weights()).items()}
    pipe = get_redis().pipeline(transaction=False)
    for m in names:
        pipe.delete(keys.dispatch_weights(m))
        if current:
            pipe.hset(keys.dispatch_weights(m), mapping=current)
    pipe.execute()


def weights() -> dict[str, int]:
    return {t: int(w) for t, w in get_redis().hgetall(keys.tenant_weights()).items()}


def ready_counts(model: str) -> dict[str, int]:
    """tenant -> jobs waiting in its ready queue (metrics, tests)."""
    prefix = keys.dispatch_ready(model, "")
    found = list(get_redis().scan_iter(match=prefix + "*", count=500))
    pipe = get_redis().pipeline(transaction=False)
    for k in found:
        pipe.zcard(k)
    return {k[len(prefix):]: int(n) for k, n in zip(found, pipe.execute()) if n}


def inflight(model: str) -> list[str]:
    return list(get_redis().zrange(keys.dispatch_inflight(model), 0, -1))


def permits(model: str, tenant: str) -> list[str]:
    return list(get_redis().zrange(keys.semaphore(model, tenant), 0, -1))


def clear_model(model: str) -> None:
    """Drop a model's whole dispatch state (the rebuild after a wipe starts here)."""
    r = get_redis()
    doomed = [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
              keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_attempts(model)]
    for prefix in (keys.dispatch_ready(model, ""), keys.semaphore(model, "")):
        doomed += list(r.scan_iter(match=prefix + "*", count=500))
    if doomed:
        r.delete(*doomed)
