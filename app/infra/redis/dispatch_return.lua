-- A running job whose model's upstream answered busy (429/503) went back to
-- pending (app/infra/redis/dispatch.py returned): the upstream controller
-- lowers the model's limit and pauses its dispatch for Retry-After
-- (upstream_lib.lua), the job's permit goes back and it is queued at the
-- head of its tenant's queue (its gate slot stays), then dispatch, under the
-- new limit and pause.
-- KEYS 1..12 and ARGV 1..7: as dispatch_lib.lua.
-- ARGV 8 tenant  9 job  10 its order score  11 the attempt its message carries ("<n>h")
--   12 when the busy call started (unix s)  13 Retry-After (s; 0 = none)  14 the controller's parameters.
-- The dispatch's charge is refunded (settle 'void'): a busy answer used no model time.
-- Returns {the pause's end if this answer moved it (unix s, a string; "0": not), dispatched triples...}.
--@include dispatch_lib.lua
--@include upstream_lib.lua
local t, job = ARGV[8], ARGV[9]
local till = up_busy(tonumber(ARGV[12]), tonumber(ARGV[13]) or 0, ARGV[14])
settle(t, job, true)
redis.call('ZREM', SEM .. t, job)
redis.call('ZREM', K_INF, job)
redis.call('HDEL', K_INFO, job)
redis.call('HSET', K_ATT, job, ARGV[11])
redis.call('ZADD', READY .. t, ARGV[10], job)
unblock(t)
local out = dispatch()
table.insert(out, 1, tostring(till))
return out
