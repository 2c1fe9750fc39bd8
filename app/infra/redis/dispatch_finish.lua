-- Jobs that left pending/running (terminal, or retry_wait), and calls that ended: each job's gate slots, its
-- place in the queue and its permits all go back, in one step for the group; then the freed slots of the
-- caller (a worker's writer) take the jobs the ring picks now (MOST), and the doorbell rings if work is left
-- for other slots (app/infra/redis/dispatch.py).  Each charge is settled to the run seconds the call really
-- took (dispatch_lib.lua settle); a done job ends its scopes' busy streaks and earns its tenant back a free
-- busy answer (upstream_lib.lua up_done).
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- KEYS 17 the model's gate (zset)  18 the model's run-time hash (s: EWMA seconds, n: samples; app/jobs/estimates.py)
-- ARGV 10 tenant-gate key prefix ("...:tgate:{model}:")  11 terminal channel.  A channel is not a key: under
--   Redis Cluster the PUBLISH reaches the subscribers on every node.  12 the EWMA's alpha (the first sample is
--   taken whole)
-- ARGV 13.. five per job: tenant, job, its wake-up ('-' = none; '' = the job id alone; else the message),
--   a done attempt's run time in seconds ('' = none: nothing measured), and keep:
--   ''  release everything (a job its worker ended, a call that ended: "<job>#<attempt>", a dispatch void);
--   "<seconds> <attempt>"  the job was ended by someone else while that attempt's call may still run (a
--     cancel, a timeout, a lost lease): its permits stay, as "<job>#<attempt>", until the call really ends (its
--     worker's finish of "<job>#<attempt>") and at most this long (a dead worker's); the charge settles then;
--   'back'  a pulled job its puller could not claim (the database away): back to the head of its queue, its
--     permits and charge given back.
-- Returns {n, then for each of the n jobs 1 if the model's gate slot was still held (0: released before),
--   then ring, high, express and the jobs pulled for the caller (dispatch_lib.lua finish_step)}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local released = {}
local _, ceiling = limit()
for i = 13, #ARGV, 5 do
  local t, job, wake, ran, keep = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local k = redis.call('HGET', K_JSCOPE, job) or ''
  if keep == 'back' then
    table.insert(released, 0)
    redis.call('ZREM', SEM .. t, job)
    if k ~= '' then redis.call('ZREM', SEM .. k, job) end
    settle(t, job, true)
    local info = redis.call('HGET', K_INFO, job)
    if info then back_to_queue(job, info) end
  else
    table.insert(released, redis.call('ZREM', KEYS[17], job))
    redis.call('ZREM', ARGV[10] .. t, job)
    redis.call('ZREM', READY .. t, job)
    redis.call('ZREM', K_DELAY, job)
    redis.call('HDEL', K_INFO, job)
    redis.call('HDEL', K_ATT, job)
    if keep ~= '' and claimed(job) then
      -- Its call may still run: its permits and charge pass to "<job>#<attempt>" (the job itself may be queued
      -- again, a retry, under its own id), for at most 'keep' seconds more; the call's end (its worker's finish
      -- of "<job>#<attempt>", keep '') gives them back and settles the charge then.
      local secs, attempt = string.match(keep, '^(%S+) (%S+)$')
      local tag, until_ = job .. '#' .. attempt, NOW + tonumber(secs)
      for _, s in ipairs(k ~= '' and {t, k} or {t}) do
        local held_until = tonumber(redis.call('ZSCORE', SEM .. s, job) or '')
        redis.call('ZREM', SEM .. s, job)
        if held_until then redis.call('ZADD', SEM .. s, math.min(held_until, until_), tag) end
      end
      redis.call('HSET', K_CHARGE, tag, redis.call('HGET', K_CHARGE, job))
      redis.call('HDEL', K_CHARGE, job)
      if k ~= '' then
        redis.call('HSET', K_JSCOPE, tag, k)
        redis.call('HDEL', K_JSCOPE, job)
      end
    else
      redis.call('ZREM', SEM .. t, job)
      if k ~= '' then
        redis.call('HDEL', K_JSCOPE, job)
        redis.call('ZREM', SEM .. k, job)
        redis.call('ZREM', PARKED .. k, job)
      end
      settle(t, job, false)
    end
  end
  unblock(t)
  if wake ~= '-' then redis.call('PUBLISH', ARGV[11], wake ~= '' and wake or job) end
  if ran ~= '' then
    local x, a = tonumber(ran), tonumber(ARGV[12])
    local s = tonumber(redis.call('HGET', KEYS[18], 's') or '')
    redis.call('HSET', KEYS[18], 's', tostring(s and a * x + (1 - a) * s or x))
    redis.call('HINCRBY', KEYS[18], 'n', 1)
    up_done(t, k, tonumber(ran))
  elseif not UP_ON then
    up_done(t, k, nil)
  end
  if k ~= '' then unpark(k, ceiling) end
end
local out = finish_step()
for i = #released, 1, -1 do table.insert(out, 1, released[i]) end
table.insert(out, 1, #released)
return out
