-- A job left pending/running (terminal, or retry_wait): its gate slots, its
-- place in the queue and its permit all go back, in one step, and the next
-- job is dispatched (app/infra/redis/dispatch.py).
-- Its charge is settled to the run seconds it really took (dispatch_lib.lua settle).
-- KEYS 1..12 and ARGV 1..7: as dispatch_lib.lua.
-- KEYS 13 the model's gate (zset)  14 the model's run-time hash (s: EWMA seconds, n: samples; app/jobs/estimates.py)
-- ARGV 8 tenant  9 job  10 tenant-gate key prefix ("...:tgate:{model}:")  11 terminal channel ('' = no wake-up)
--   12 the wake-up message ('' = the job id alone).  A channel is not a key: under Redis Cluster the
--   PUBLISH reaches the subscribers on every node.
--   13 a done attempt's run time, seconds ('' = none: nothing measured)  14 the EWMA's alpha (the first sample
--   is taken whole)  15 the upstream controller's parameters ('-' = the controller is off: forget its state)
-- Returns {1 if the model's gate slot was still held (0: released before), dispatched triples...}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local t, job = ARGV[8], ARGV[9]
local released = redis.call('ZREM', KEYS[13], job)
redis.call('ZREM', ARGV[10] .. t, job)
redis.call('ZREM', READY .. t, job)
redis.call('ZREM', SEM .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('HDEL', K_ATT, job)
settle(t, job, false)
unblock(t)
if ARGV[11] ~= '' then redis.call('PUBLISH', ARGV[11], ARGV[12] ~= '' and ARGV[12] or job) end
if ARGV[13] ~= '' then
  local x, a = tonumber(ARGV[13]), tonumber(ARGV[14])
  local s = tonumber(redis.call('HGET', KEYS[14], 's') or '')
  redis.call('HSET', KEYS[14], 's', tostring(s and a * x + (1 - a) * s or x))
  redis.call('HINCRBY', KEYS[14], 'n', 1)
end
if ARGV[15] == '-' then up_done('-', '') elseif ARGV[13] ~= '' then up_done(ARGV[13], ARGV[15]) end
local out = dispatch()
table.insert(out, 1, released)
return out
