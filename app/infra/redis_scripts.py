"""Every Redis key and Lua script the system uses, in one place.

Redis holds derived state only (DESIGN.md invariant 1): gate slots, runtime
limits, wake-up signals, the epoch marks that reveal a wipe, the beat leader
lock and a short history of periodic runs.  Each script is registered once per client and
wrapped in a typed function; its KEYS/ARGV contract is written above it.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Iterable

import redis

from app.config import get_settings

_lock = threading.Lock()
_client: redis.Redis | None = None
_client_pid: int | None = None


def get_redis() -> redis.Redis:
    """One client (and pool) per process; redis-py itself re-creates pooled
    connections after fork, we re-create the client to be explicit."""
    global _client, _client_pid
    pid = os.getpid()
    if _client is None or _client_pid != pid:
        with _lock:
            if _client is None or _client_pid != pid:
                _client = redis.Redis.from_url(
                    get_settings().redis_url,
                    decode_responses=True,
                    health_check_interval=30,
                    socket_connect_timeout=5,
                    socket_timeout=10,
                    retry_on_timeout=True,
                )
                _client_pid = pid
                _scripts.clear()
    return _client


def reset_redis() -> None:
    global _client, _client_pid, _broker, _broker_pid
    with _lock:
        _client = None
        _client_pid = None
        _broker = None
        _broker_pid = None
        _scripts.clear()


_broker: redis.Redis | None = None
_broker_pid: int | None = None


def broker_redis() -> redis.Redis | None:
    """A client on the broker's own Redis database when the broker is Redis
    and not the same database as the gate (else None): a wipe of either one
    must be noticed (see the epoch below)."""
    global _broker, _broker_pid
    s = get_settings()
    url = s.effective_broker_url
    if url == s.redis_url or url.split("://", 1)[0] not in ("redis", "rediss"):
        return None
    pid = os.getpid()
    if _broker is None or _broker_pid != pid:
        with _lock:
            if _broker is None or _broker_pid != pid:
                _broker = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5,
                                               socket_timeout=10, retry_on_timeout=True)
                _broker_pid = pid
    return _broker


# --- key names ---------------------------------------------------------------

def _p() -> str:
    return get_settings().redis_prefix


def gate_key(model: str) -> str:
    return f"{_p()}:gate:{model}"


def runtime_queue_limit_key(model: str) -> str:
    return f"{_p()}:runtime:queue_limit:{model}"


def runtime_max_concurrency_key(model: str) -> str:
    return f"{_p()}:runtime:max_concurrency:{model}"


def terminal_channel() -> str:
    return f"{_p()}:events:terminal"


def invalidate_channel() -> str:
    return f"{_p()}:events:invalidate"


def epoch_key() -> str:
    # Present while this Redis has not lost its data since recovery last
    # looked; absent after a wipe (or on first start).
    return f"{_p()}:epoch"


def beat_lock_key() -> str:
    return f"{_p()}:beat:leader"


def beat_token_key() -> str:
    # Monotonic fencing counter: every new leadership gets a larger token.
    return f"{_p()}:beat:token"


def beat_history_key() -> str:
    return f"{_p()}:beat:history"


def semaphore_key(model: str, tenant: str) -> str:
    return f"{_p()}:sem:{model}:{tenant}"


def permit_wait_key(job_id: str, attempt: int) -> str:
    return f"{_p()}:permit_wait:{job_id}:{attempt}"


# --- scripts -----------------------------------------------------------------

# Admission gate: check the limit and take a slot in one step.
# KEYS[1] gate sorted set (member job id, score admission time)
# KEYS[2] runtime queue_limit override (optional integer string)
# ARGV[1] job id  ARGV[2] configured queue_limit (cap)  ARGV[3] now (unix s)
# Returns {admitted 0|1, effective limit, depth after}.
# The limit is the runtime override if present, never above the cap; a limit
# <= 0 rejects everything.  Re-admitting a member is a no-op success.
GATE_ADMIT = """
local limit = tonumber(ARGV[2])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local depth = redis.call('ZCARD', KEYS[1])
if limit <= 0 then return {0, limit, depth} end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, limit, depth} end
if depth >= limit then return {0, limit, depth} end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return {1, limit, depth + 1}
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

# Delete a key only if it still holds our value (epoch rollback).
# KEYS[1] key  ARGV[1] expected value.  Returns 1 if deleted.
COMPARE_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Beat leadership: take the lock if free, renew it if it is ours.
# KEYS[1] lock (value "<token> <owner>")  KEYS[2] fencing counter
# ARGV[1] owner id  ARGV[2] ttl in ms
# Returns the fencing token (> 0) while the caller leads, else 0.  A new
# leadership always gets a larger token than any before it (INCR), so work
# stamped with an old token can be recognised and refused.
LEADER_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local token, owner = string.match(cur, '^(%d+) (.+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(token)
  end
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"""

# Give leadership up (clean beat shutdown) so a standby need not wait the TTL.
# KEYS[1] lock  ARGV[1] owner id.  Returns 1 if released.
LEADER_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and string.match(cur, '^%d+ (.+)$') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Autotune writes both runtime limits only if nobody changed them since it
# read them (two autotune runs at once must not halve twice).
# KEYS[1] max_concurrency override  KEYS[2] queue_limit override
# ARGV[1] expected max_concurrency ('' = absent)  ARGV[2] expected queue_limit ('' = absent)
# ARGV[3] new max_concurrency  ARGV[4] new queue_limit  ARGV[5] ttl in ms
# Returns 1 if written, 0 if the values had moved.
RUNTIME_LIMITS_CAS = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
return 1
"""

# Per tenant+model concurrency semaphore with expiring leases.
# KEYS[1] semaphore sorted set (member lease id, score expiry in Redis time)
# KEYS[2] runtime max_concurrency override (optional integer string)
# ARGV[1] lease id  ARGV[2] configured max_concurrency (cap)  ARGV[3] lease ttl (s)
# Returns {acquired 0|1, effective limit, holders after}.
# Expiry uses the Redis server's clock, so workers with skewed clocks agree;
# expired leases (a SIGKILLed worker's) are dropped before counting.  The
# limit is the runtime override if present, never above the cap; <= 0 admits
# nobody.
SEM_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local held = redis.call('ZCARD', KEYS[1])
if limit <= 0 then return {0, limit, held} end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if held >= limit then return {0, limit, held} end
  held = held + 1
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 60)
return {1, limit, held}
"""

# One re-delivery chain per waiting job attempt: a job that found no permit
# re-publishes itself; a second message for the same attempt (recovery's
# re-publish, a duplicate) sees another chain holding the key and stops.
# KEYS[1] permit_wait key  ARGV[1] chain token (the Celery task id)  ARGV[2] ttl (ms)
# Returns 1 if this chain holds (or took over) the key, else 0.
# Drop the expired leases of one semaphore (a SIGKILLed worker's permits).
# KEYS[1] semaphore sorted set.  Returns how many were dropped.
SEM_REAP = """
local t = redis.call('TIME')
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) + tonumber(t[2]) / 1000000)
"""

PERMIT_WAIT_HOLD = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_SOURCES = {"gate_admit": GATE_ADMIT, "gate_reconcile": GATE_RECONCILE, "compare_delete": COMPARE_DELETE,
            "leader_acquire": LEADER_ACQUIRE, "leader_release": LEADER_RELEASE,
            "runtime_limits_cas": RUNTIME_LIMITS_CAS, "sem_acquire": SEM_ACQUIRE,
            "permit_wait_hold": PERMIT_WAIT_HOLD, "sem_reap": SEM_REAP}
_scripts: dict[tuple[str, int], object] = {}


def _script(name: str, client: redis.Redis | None = None):
    r = client if client is not None else get_redis()
    s = _scripts.get((name, id(r)))
    if s is None:
        s = r.register_script(_SOURCES[name])
        _scripts[(name, id(r))] = s
    return s


@dataclass(frozen=True)
class GateDecision:
    admitted: bool
    limit: int
    depth: int


def gate_admit(model: str, job_id: str, cap: int) -> GateDecision:
    admitted, limit, depth = _script("gate_admit")(
        keys=[gate_key(model), runtime_queue_limit_key(model)],
        args=[job_id, int(cap), f"{time.time():.6f}"],
    )
    return GateDecision(bool(admitted), int(limit), int(depth))


def gate_release(model: str, job_id: str) -> bool:
    """Give a slot back.  Idempotent: releasing twice removes nothing more."""
    return bool(get_redis().zrem(gate_key(model), job_id))


def gate_depth(model: str) -> int:
    return int(get_redis().zcard(gate_key(model)))


def gate_members(model: str) -> set[str]:
    return set(get_redis().zrange(gate_key(model), 0, -1))


def gate_reconcile(model: str, active_ids: Iterable[str], grace_seconds: float) -> tuple[list[str], list[str]]:
    now = time.time()
    added, removed = _script("gate_reconcile")(
        keys=[gate_key(model)],
        args=[f"{now:.6f}", f"{now - grace_seconds:.6f}", *active_ids],
    )
    return list(added), list(removed)


def gate_models() -> list[str]:
    """Models that have a gate key in Redis (including deleted models)."""
    prefix = gate_key("")
    return [k[len(prefix):] for k in get_redis().scan_iter(match=prefix + "*", count=500)]


def runtime_queue_limit(model: str) -> int | None:
    v = get_redis().get(runtime_queue_limit_key(model))
    return int(v) if v is not None else None


def runtime_max_concurrency(model: str) -> int | None:
    v = get_redis().get(runtime_max_concurrency_key(model))
    return int(v) if v is not None else None


def release_and_wake(model: str, job_id: str) -> bool:
    """gate_release + publish_terminal in one round trip (release first).
    True if the slot was still held."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.zrem(gate_key(model), job_id)
    pipe.publish(terminal_channel(), job_id)
    removed, _ = pipe.execute()
    return bool(removed)


def publish_terminal(job_id: str) -> None:
    """Wake long-poll waiters of ``job_id`` (all API processes)."""
    get_redis().publish(terminal_channel(), job_id)


def publish_invalidate(what: str) -> None:
    """Tell every API process to drop its cached keys/models now (they
    would expire within their TTL anyway).  Best effort."""
    try:
        get_redis().publish(invalidate_channel(), what)
    except redis.RedisError:
        pass


def runtime_limits_raw(model: str) -> tuple[str | None, str | None]:
    """The stored (max_concurrency, queue_limit) overrides as strings."""
    mc, ql = get_redis().mget(runtime_max_concurrency_key(model), runtime_queue_limit_key(model))
    return mc, ql


def runtime_limits_cas(model: str, expected: tuple[str | None, str | None], new_max_concurrency: int,
                       new_queue_limit: int, ttl_seconds: float) -> bool:
    return bool(_script("runtime_limits_cas")(
        keys=[runtime_max_concurrency_key(model), runtime_queue_limit_key(model)],
        args=[expected[0] or "", expected[1] or "", int(new_max_concurrency), int(new_queue_limit),
              max(1, int(ttl_seconds * 1000))],
    ))


# --- wipe detection -------------------------------------------------------------

def _epoch_stores() -> list[tuple[str, redis.Redis]]:
    stores = [("redis", get_redis())]
    b = broker_redis()
    if b is not None:
        stores.append(("broker", b))
    return stores


def claim_epochs(token: str) -> list[str]:
    """Mark every Redis we depend on with ``token`` where no mark is present.
    Returns the names of the stores that had none: they were wiped (or this
    is the first start), so whatever they held derived state for is gone."""
    wiped = []
    for name, client in _epoch_stores():
        if client.set(epoch_key(), token, nx=True):
            wiped.append(name)
    return wiped


def drop_epochs(token: str, names: Iterable[str]) -> None:
    """Undo claim_epochs (the repair failed): the next pass sees the wipe again."""
    for name, client in _epoch_stores():
        if name in names:
            _script("compare_delete", client)(keys=[epoch_key()], args=[token])


# --- beat leadership ---------------------------------------------------------------

def leader_acquire(owner: str, ttl_seconds: float) -> int:
    """Fencing token (> 0) while ``owner`` holds the beat lock, else 0."""
    return int(_script("leader_acquire")(keys=[beat_lock_key(), beat_token_key()],
                                         args=[owner, max(1, int(ttl_seconds * 1000))]))


def leader_release(owner: str) -> bool:
    return bool(_script("leader_release")(keys=[beat_lock_key()], args=[owner]))


def leader_current() -> tuple[int, str] | None:
    """(token, owner) of the current beat leader, if any."""
    v = get_redis().get(beat_lock_key())
    if not v or " " not in v:
        return None
    token, owner = v.split(" ", 1)
    return int(token), owner


def record_beat_run(entry: str, keep: int) -> None:
    if keep <= 0:
        return
    pipe = get_redis().pipeline(transaction=True)
    pipe.rpush(beat_history_key(), entry)
    pipe.ltrim(beat_history_key(), -keep, -1)
    pipe.execute()


def beat_history(limit: int = 100) -> list[str]:
    return get_redis().lrange(beat_history_key(), -max(1, limit), -1)


@dataclass(frozen=True)
class PermitDecision:
    acquired: bool
    limit: int
    holders: int


def semaphore_acquire(model: str, tenant: str, lease_id: str, cap: int, ttl_seconds: float) -> PermitDecision:
    acquired, limit, held = _script("sem_acquire")(
        keys=[semaphore_key(model, tenant), runtime_max_concurrency_key(model)],
        args=[lease_id, int(cap), f"{ttl_seconds:.3f}"],
    )
    return PermitDecision(bool(acquired), int(limit), int(held))


def semaphore_release(model: str, tenant: str, lease_id: str) -> bool:
    """Give a permit back.  Idempotent; an expired lease is simply gone."""
    return bool(get_redis().zrem(semaphore_key(model, tenant), lease_id))


def semaphore_reap_all() -> int:
    """Expired leases dropped across every semaphore.  Acquire drops them
    too; this returns them without waiting for the next acquire."""
    prefix = semaphore_key("", "")[:-1]  # "<prefix>:sem:"
    reap = _script("sem_reap")
    return sum(int(reap(keys=[k])) for k in get_redis().scan_iter(match=prefix + "*", count=500))


def semaphore_holders(model: str, tenant: str) -> list[str]:
    return list(get_redis().zrange(semaphore_key(model, tenant), 0, -1))


def permit_wait_hold(job_id: str, attempt: int, token: str, ttl_seconds: float) -> bool:
    return bool(_script("permit_wait_hold")(keys=[permit_wait_key(job_id, attempt)],
                                            args=[token, int(ttl_seconds * 1000)]))


# --- worker liveness ---------------------------------------------------------------
# One hash per Celery node (app/infra/metrics.py writes it, app/observe/cluster.py
# renders it).

def worker_key(node: str) -> str:
    return f"{_p()}:worker:{node}"


def worker_touch(node: str, fields: dict, ttl_seconds: int) -> None:
    """Record a worker's liveness fields; the key lives ttl_seconds after the
    last touch, so a worker that stops touching it disappears by itself."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(worker_key(node), mapping=fields)
    pipe.expire(worker_key(node), ttl_seconds)
    pipe.execute()


def worker_forget(node: str) -> None:
    get_redis().delete(worker_key(node))


def workers_read() -> dict[str, dict[str, str]]:
    prefix = worker_key("")
    keys = list(get_redis().scan_iter(match=prefix + "*", count=500))
    pipe = get_redis().pipeline(transaction=False)
    for k in keys:
        pipe.hgetall(k)
    return {k[len(prefix):]: v for k, v in zip(keys, pipe.execute()) if v}


def gate_snapshot(model_names: Iterable[str]) -> dict[str, tuple[int, int | None, int | None]]:
    """model -> (gate depth, runtime queue_limit, runtime max_concurrency) in one round trip."""
    names = list(model_names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.zcard(gate_key(n))
        pipe.get(runtime_queue_limit_key(n))
        pipe.get(runtime_max_concurrency_key(n))
    res = pipe.execute()
    out = {}
    for i, n in enumerate(names):
        depth, ql, mc = res[3 * i:3 * i + 3]
        out[n] = (int(depth), int(ql) if ql is not None else None, int(mc) if mc is not None else None)
    return out
