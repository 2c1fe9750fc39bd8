-- The worker-less runWork pass claimed jobs straight from their rows (they may still sit in their tenants'
-- ready queues, or wait out a delay: they leave them, so they are not pulled while they run)
-- (app/infra/redis/dispatch.py claimed).
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- ARGV 10 run lease (s): each permit lasts as long as its row's lease.  11.. (tenant, job) pairs, one per job.
-- The claim time is noted with each job's charge (taken now if it was not dispatched): its run is measured from here.
-- Returns {ring, high, express}, as dispatch_lib.lua finish_step (MOST 0: nothing pulled; express always 0).
--@include dispatch_lib.lua
local lease = tonumber(ARGV[10])
for i = 11, #ARGV, 2 do
  local t, job = ARGV[i], ARGV[i + 1]
  redis.call('ZREM', READY .. t, job)
  redis.call('ZREM', K_DELAY, job)
  redis.call('HDEL', K_INFO, job)
  redis.call('ZADD', SEM .. t, NOW + lease, job)
  local k = redis.call('HGET', K_JSCOPE, job)
  if k then
    redis.call('ZREM', PARKED .. k, job)
    redis.call('ZADD', SEM .. k, NOW + lease, job)
  end
  if redis.call('HEXISTS', K_CHARGE, job) == 0 then charge(t, take_charge(t, job, false)) end
  redis.call('HSET', K_CHARGE, job, string.match(redis.call('HGET', K_CHARGE, job), '^%S+ %S+ %S+') .. ' ' .. NOW)
end
return finish_step()
