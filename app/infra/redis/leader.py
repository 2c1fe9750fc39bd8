"""Beat leadership: one lock, a fencing token per leadership, and a capped
history of the periodic runs that went ahead (app/maintenance/periodic.py)."""
from __future__ import annotations

from app.infra.redis import keys
from app.infra.redis.client import get_redis, script

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


def leader_acquire(owner: str, ttl_seconds: float) -> int:
    """Fencing token (> 0) while ``owner`` holds the beat lock, else 0."""
    return int(script(LEADER_ACQUIRE)(keys=[keys.beat_lock(), keys.beat_token()],
                                      args=[owner, max(1, int(ttl_seconds * 1000))]))


def leader_release(owner: str) -> bool:
    return bool(script(LEADER_RELEASE)(keys=[keys.beat_lock()], args=[owner]))


def leader_current() -> tuple[int, str] | None:
    """(token, owner) of the current beat leader, if any."""
    v = get_redis().get(keys.beat_lock())
    if not v or " " not in v:
        return None
    token, owner = v.split(" ", 1)
    return int(token), owner


def leader_ttl_ms() -> int | None:
    """Milliseconds left on the beat lock (None: no lock)."""
    ms = int(get_redis().pttl(keys.beat_lock()))
    return ms if ms >= 0 else None


def record_beat_run(entry: str, keep: int) -> None:
    if keep <= 0:
        return
    pipe = get_redis().pipeline(transaction=True)
    pipe.rpush(keys.beat_history(), entry)
    pipe.ltrim(keys.beat_history(), -keep, -1)
    pipe.execute()


def beat_history(limit: int = 100) -> list[str]:
    return get_redis().lrange(keys.beat_history(), -max(1, limit), -1)
