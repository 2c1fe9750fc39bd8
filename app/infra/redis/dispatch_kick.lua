-- Unblock every tenant (limits changed, permits expired, a pause or a delay ended) and ring the doorbell if a
-- free slot could take a job now (app/infra/redis/dispatch.py).
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- ARGV 10: '1' = the broker lost its messages: the doorbell counts as not rung.
-- Returns {ring, high, express, (nothing pulled: MOST is 0), whether a doorbell is out after the step ('1'/'0')}.
--@include dispatch_lib.lua
if ARGV[10] == '1' then redis.call('HDEL', K_CONF, 'bell') end
for _, t in ipairs(redis.call('SMEMBERS', K_BLOCKED)) do
  redis.call('SREM', K_BLOCKED, t)
  activate(t)
end
local out = finish_step()
out[#out + 1] = redis.call('HEXISTS', K_CONF, 'bell') == 1 and '1' or '0'
return out
