-- A job left pending/running (terminal, or retry_wait): its gate slots, its
-- place in the queue and its permit all go back, in one step, and the next
-- job is dispatched (app/infra/redis/dispatch.py).
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.
-- KEYS 10 the model's gate (zset)  11 the model's run-time hash (s: EWMA seconds, n: samples; app/jobs/estimates.py)
-- ARGV 7 tenant  8 job  9 tenant-gate key prefix ("...:tgate:{model}:")  10 terminal channel ('' = no wake-up)
--   11 the wake-up message ('' = the job id alone).  A channel is not a key: under Redis Cluster the
--   PUBLISH reaches the subscribers on every node.
--   12 a done attempt's run time, seconds ('' = none: nothing measured)  13 the EWMA's alpha (the first sample
--   is taken whole)
-- Returns {1 if the model's gate slot was still held (0: released before), dispatched triples...}.
--@include dispatch_lib.lua
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
if ARGV[12] ~= '' then
  local x, a = tonumber(ARGV[12]), tonumber(ARGV[13])
  local s = tonumber(redis.call('HGET', KEYS[11], 's') or '')
  redis.call('HSET', KEYS[11], 's', tostring(s and a * x + (1 - a) * s or x))
  redis.call('HINCRBY', KEYS[11], 'n', 1)
end
local out = dispatch()
table.insert(out, 1, released)
return out
