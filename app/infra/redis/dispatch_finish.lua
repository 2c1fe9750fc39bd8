-- Jobs left pending/running (terminal, or retry_wait): each one's gate slots, its place in the queue and its
-- permit all go back, in one step for the group, and the next jobs are dispatched (app/infra/redis/dispatch.py).
-- Each charge is settled to the run seconds the job really took (dispatch_lib.lua settle).
-- KEYS 1..12 and ARGV 1..7: as dispatch_lib.lua.
-- KEYS 13 the model's gate (zset)  14 the model's run-time hash (s: EWMA seconds, n: samples; app/jobs/estimates.py)
-- ARGV 8 tenant-gate key prefix ("...:tgate:{model}:")  9 terminal channel.  A channel is not a key: under
--   Redis Cluster the PUBLISH reaches the subscribers on every node.  10 the EWMA's alpha (the first sample is
--   taken whole)  11 the upstream controller's parameters ('-' = the controller is off: forget its state)
-- ARGV 12.. four per job: tenant, job, its wake-up ('-' = none; '' = the job id alone; else the message),
--   a done attempt's run time in seconds ('' = none: nothing measured).
-- Returns {n, then for each of the n jobs 1 if the model's gate slot was still held (0: released before),
--   then the dispatched triples...}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local released = {}
for i = 12, #ARGV, 4 do
  local t, job, wake, ran = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  table.insert(released, redis.call('ZREM', KEYS[13], job))
  redis.call('ZREM', ARGV[8] .. t, job)
  redis.call('ZREM', READY .. t, job)
  redis.call('ZREM', SEM .. t, job)
  redis.call('ZREM', K_INF, job)
  redis.call('HDEL', K_INFO, job)
  redis.call('HDEL', K_ATT, job)
  settle(t, job, false)
  unblock(t)
  if wake ~= '-' then redis.call('PUBLISH', ARGV[9], wake ~= '' and wake or job) end
  if ran ~= '' then
    local x, a = tonumber(ran), tonumber(ARGV[10])
    local s = tonumber(redis.call('HGET', KEYS[14], 's') or '')
    redis.call('HSET', KEYS[14], 's', tostring(s and a * x + (1 - a) * s or x))
    redis.call('HINCRBY', KEYS[14], 'n', 1)
  end
  if ARGV[11] == '-' then up_done('-', '') elseif ran ~= '' then up_done(ran, ARGV[11]) end
end
local out = dispatch()
for i = #released, 1, -1 do table.insert(out, 1, released[i]) end
table.insert(out, 1, #released)
return out
