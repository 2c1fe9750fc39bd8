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


@dataclass(frozen=True)
class GateDecision:
    admitted: bool
    limit: int
    depth: int


def gate_admit(model: str, job_id: str, cap: int) -> GateDecision:
    admitted, limit, depth = script(GATE_ADMIT)(
        keys=[keys.gate(model), keys.runtime_queue_limit(model)],
        args=[job_id, int(cap), f"{time.time():.6f}"],
    )
    return GateDecision(bool(admitted), int(limit), int(depth))


def gate_release(model: str, job_id: str) -> bool:
    """Give a slot back.  Idempotent: releasing twice removes nothing more."""
    return bool(get_redis().zrem(keys.gate(model), job_id))


def gate_depth(model: str) -> int:
    return int(get_redis().zcard(keys.gate(model)))


def gate_members(model: str) -> set[str]:
    return set(get_redis().zrange(keys.gate(model), 0, -1))


def gate_reconcile(model: str, active_ids: Iterable[str], grace_seconds: float) -> tuple[list[str], list[str]]:
    now = time.time()
    added, removed = script(GATE_RECONCILE)(
        keys=[keys.gate(model)],
        args=[f"{now:.6f}", f"{now - grace_seconds:.6f}", *active_ids],
    )
    return list(added), list(removed)


def gate_models() -> list[str]:
    """Models that have a gate key in Redis (including deleted models)."""
    prefix = keys.gate("")
    return [k[len(prefix):] for k in get_redis().scan_iter(match=prefix + "*", count=500)]


def release_and_wake(model: str, job_id: str) -> bool:
    """Release the slot and publish the terminal wake-up in one round trip
    (release first).  True if the slot was still held."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.zrem(keys.gate(model), job_id)
    pipe.publish(keys.terminal_channel(), job_id)
    removed, _ = pipe.execute()
    return bool(removed)


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
