-- A finished attempt's run time joins the model's EWMA (app/jobs/estimates.py).
-- KEYS[1] the model's run-time hash (s: EWMA seconds, n: samples)
-- ARGV[1] the attempt's seconds  ARGV[2] alpha (0-1, the new sample's weight; the first sample is taken whole)
-- Returns the new EWMA (string).
local x, a = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = tonumber(redis.call('HGET', KEYS[1], 's') or '')
if s then s = a * x + (1 - a) * s else s = x end
redis.call('HSET', KEYS[1], 's', tostring(s))
redis.call('HINCRBY', KEYS[1], 'n', 1)
return tostring(s)
