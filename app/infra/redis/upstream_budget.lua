-- A busy answer asks whether it may be free (app/infra/redis/upstream.py take_busy): each tenant has
-- ASYNCH_UPSTREAM_BUSY_BUDGET free busy answers in hand per model (its own override in its limits), spent
-- one per busy answer that returns its job to the queue unspent and earned back one per done answer
-- (upstream_lib.lua up_done).  Spent out, a busy answer is an ordinary failed attempt (it spends a retry).
-- KEYS 1 the model's busy budget (hash tenant -> free busy answers spent; dispatch_lib.lua KEYS[17])
-- ARGV 1 tenant  2 its budget
-- Returns 1 (free: one spent) or 0 (spent out).
local spent = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if spent >= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
