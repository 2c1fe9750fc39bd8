"""Every Redis key and Lua script the system uses, in one place.

Redis holds derived state only (DESIGN.md invariant 1): gate slots, runtime
limits and wake-up signals.  Each script is registered once per client and
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
    global _client, _client_pid
    with _lock:
        _client = None
        _client_pid = None
        _scripts.clear()


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

_SOURCES = {"gate_admit": GATE_ADMIT, "gate_reconcile": GATE_RECONCILE}
_scripts: dict[str, object] = {}


def _script(name: str):
    r = get_redis()
    s = _scripts.get(name)
    if s is None:
        s = r.register_script(_SOURCES[name])
        _scripts[name] = s
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


def publish_terminal(job_id: str) -> None:
    """Wake long-poll waiters of ``job_id`` (all API processes)."""
    get_redis().publish(terminal_channel(), job_id)


# --- metrics and worker liveness ---------------------------------------------------
# Counters and histogram buckets live in a few hashes so every API and worker
# process on every host adds to the same totals (app/metrics.py renders them).

def metrics_key(name: str) -> str:
    return f"{_p()}:metrics:{name}"


def worker_key(node: str) -> str:
    return f"{_p()}:worker:{node}"


def metrics_bump(incrs: Iterable[tuple[str, str, float]]) -> None:
    """Add to hash fields in one round trip (MULTI/EXEC, so a scrape never sees
    a histogram bucket without its count).  incrs: (metric name, field, amount)."""
    pipe = get_redis().pipeline(transaction=True)
    for name, field_, amount in incrs:
        if isinstance(amount, int):
            pipe.hincrby(metrics_key(name), field_, amount)
        else:
            pipe.hincrbyfloat(metrics_key(name), field_, amount)
    pipe.execute()


def metrics_read(names: Iterable[str]) -> dict[str, dict[str, str]]:
    names = list(names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.hgetall(metrics_key(n))
    return dict(zip(names, pipe.execute()))


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
