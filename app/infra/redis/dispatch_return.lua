-- A running job whose model's upstream answered busy (429/503) went back to
-- pending (app/infra/redis/dispatch.py returned): the upstream controller
-- lowers the model's limit and pauses its dispatch for Retry-After
-- (upstream_lib.lua), the job's permit goes back and it is queued at the
-- head of its tenant's queue (its gate slot stays), then dispatch, under the
-- new limit and pause.
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.
-- ARGV 7 tenant  8 job  9 its order score  10 the attempt its message carries ("<n>h")
--   11 when the busy call started (unix s)  12 Retry-After (s; 0 = none)  13 the controller's parameters.
-- Returns {the pause's end if this answer moved it (unix s, a string; "0": not), dispatched triples...}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local t, job = ARGV[7], ARGV[8]
local till = up_busy(tonumber(ARGV[11]), tonumber(ARGV[12]) or 0, ARGV[13])
redis.call('ZREM', SEM .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('HSET', K_ATT, job, ARGV[10])
redis.call('ZADD', READY .. t, ARGV[9], job)
unblock(t)
local out = dispatch()
table.insert(out, 1, tostring(till))
return out
