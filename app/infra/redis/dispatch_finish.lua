-- A job left pending/running (terminal, or retry_wait): its gate slots, its
-- place in the queue and its permit all go back, in one step, and the next
-- job is dispatched (app/infra/redis/dispatch.py).
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.
-- KEYS 10 the model's gate (zset)
-- ARGV 7 tenant  8 job  9 tenant-gate key prefix ("...:tgate:{model}:")  10 terminal channel ('' = no wake-up)
--   11 the wake-up message ('' = the job id alone)  12 a done job's run time (s) for the upstream
--   controller ('' = none, '-' = the controller is off: forget its state)  13 its parameters (upstream_lib.lua).  A channel is not a key: under Redis Cluster the
--   PUBLISH reaches the subscribers on every node.
-- Returns {1 if the model's gate slot was still held (0: released before), dispatched triples...}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local t, job = ARGV[7], ARGV[8]
local released = redis.call('ZREM', KEYS[10], job)
redis.call('ZREM', ARGV[9] .. t, job)
redis.call('ZREM', READY .. t, job)
redis.call('ZREM', SEM .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('HDEL', K_ATT, job)
unblock(t)
if ARGV[10] ~= '' then redis.call('PUBLISH', ARGV[10], ARGV[11] ~= '' and ARGV[11] or job) end
if ARGV[12] ~= '' then up_done(ARGV[12], ARGV[13]) end
local out = dispatch()
table.insert(out, 1, released)
return out
