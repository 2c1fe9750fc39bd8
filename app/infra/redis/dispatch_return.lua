-- A running job whose upstream answered busy (429/503) went back to pending (app/infra/redis/dispatch.py
-- returned).  The answer belongs to its scope (upstream_lib.lua up_busy: the job's credential, else its
-- tenant): that scope is cut and paused when busy answers come in a row, the model only when two tenants'
-- scopes are congested.  The job's permits go back and its charge is settled to the time the call held
-- (a busy attempt is model time its tenant used); the job waits out its own delay (the answer's
-- Retry-After, else a backoff), then returns to the head of its tenant's queue (its gate slot stays);
-- then the doorbell rings if a free slot could take a job now, under the new limits and pauses.
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- ARGV 10 tenant  11 job  12 its order score  13 the attempt its next message carries ("<n>h")
--   14 when the busy call started (unix s; its dispatch time, from its charge, is preferred)  15 Retry-After (s, capped; < 0: none usable)
--   16 the job's own delay (s)  17 a uniform random number in [0, 1) (the pauses' jitter)
-- Returns {when the job may run again (unix s, a string), when a pause this answer moved ends ("0":
--   none), ring, high, express}: the caller schedules a kick at each time, and rings as dispatch_lib.lua finish_step.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local t, job, score = ARGV[10], ARGV[11], ARGV[12]
local k = redis.call('HGET', K_JSCOPE, job) or ''
local till = up_busy(t, k, dispatched_at(job, tonumber(ARGV[14])), tonumber(ARGV[15]) or -1,
                     tonumber(ARGV[17]) or 0.5)
settle(t, job, false)
redis.call('ZREM', SEM .. t, job)
redis.call('HSET', K_ATT, job, ARGV[13])
local due = NOW + math.max(0, tonumber(ARGV[16]) or 0)
redis.call('ZADD', K_DELAY, due, job)
redis.call('HSET', K_INFO, job, t .. ' ' .. score)
unblock(t)
if k ~= '' then
  redis.call('ZREM', SEM .. k, job)
  unpark(k, select(2, limit()))
end
local out = finish_step()
table.insert(out, 1, tostring(till))
table.insert(out, 1, tostring(due))
return out
