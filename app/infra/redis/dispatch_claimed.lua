-- A worker claimed a dispatched job (its row is running now), or the worker-less
-- runWork pass claimed a job straight from its row (it may still sit in its
-- tenant's ready queue: it leaves it, so it is not dispatched while it runs).
-- (app/infra/redis/dispatch.py)
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.
-- ARGV 7 tenant  8 job  9 run lease (s): the permit lasts as long as the row's lease.
-- Returns the jobs dispatched, as dispatch_lib.lua.
--@include dispatch_lib.lua
redis.call('ZREM', READY .. ARGV[7], ARGV[8])
redis.call('ZREM', K_INF, ARGV[8])
redis.call('HDEL', K_INFO, ARGV[8])
redis.call('ZADD', SEM .. ARGV[7], NOW + tonumber(ARGV[9]), ARGV[8])
return dispatch()
