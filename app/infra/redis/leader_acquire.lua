-- Beat leadership (app/infra/redis/leader.py): take the lock if free, renew it if it is ours.
-- KEYS[1] lock (value "<token> <owner>")  KEYS[2] fencing counter
-- ARGV[1] owner id  ARGV[2] ttl in ms
-- Returns the fencing token (> 0) while the caller leads, else 0.  A new
-- leadership always gets a larger token than any before it (INCR), so work
-- stamped with an old token can be recognised and refused.
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
