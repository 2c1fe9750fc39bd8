-- Unblock every tenant (limits changed, permits expired, a pause or a delay ended) and dispatch
-- (app/infra/redis/dispatch.py).
-- KEYS 1..17 and ARGV 1..9: as dispatch_lib.lua.
-- ARGV 10: '1' = also re-queue every unclaimed dispatched job (the broker lost its messages).
-- Returns the jobs dispatched, as dispatch_lib.lua.
--@include dispatch_lib.lua
if ARGV[10] == '1' then requeue_unclaimed('+inf') end
for _, t in ipairs(redis.call('SMEMBERS', K_BLOCKED)) do
  redis.call('SREM', K_BLOCKED, t)
  activate(t)
end
return dispatch()
