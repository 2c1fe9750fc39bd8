-- Give beat leadership up (clean beat shutdown) so a standby need not wait the TTL
-- (app/infra/redis/leader.py).
-- KEYS[1] lock  ARGV[1] owner id.  Returns 1 if released.
local cur = redis.call('GET', KEYS[1])
if cur and string.match(cur, '^%d+ (.+)$') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
