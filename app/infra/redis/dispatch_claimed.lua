-- A worker claimed a dispatched job (its row is running now), or the worker-less
-- runWork pass claimed a job straight from its row (it may still sit in its
-- tenant's ready queue: it leaves it, so it is not dispatched while it runs).
-- (app/infra/redis/dispatch.py)
-- KEYS 1..12 and ARGV 1..7: as dispatch_lib.lua.
-- ARGV 8 tenant  9 job  10 run lease (s): the permit lasts as long as the row's lease.
-- The claim time is noted with the job's charge (taken now if it was not dispatched): its run is measured from here.
-- Returns the jobs dispatched, as dispatch_lib.lua.
--@include dispatch_lib.lua
local t, job = ARGV[8], ARGV[9]
redis.call('ZREM', READY .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('ZADD', SEM .. t, NOW + tonumber(ARGV[10]), job)
if redis.call('HEXISTS', K_CHARGE, job) == 0 then charge(t, take(t, job, false)) end
redis.call('HSET', K_CHARGE, job, string.match(redis.call('HGET', K_CHARGE, job), '^%S+ %S+') .. ' ' .. NOW)
return dispatch()
