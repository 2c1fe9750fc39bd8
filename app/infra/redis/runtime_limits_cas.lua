-- Autotune writes both runtime limits only if nobody changed them since it
-- read them (two autotune runs at once must not halve twice; app/infra/redis/runtime.py).
-- KEYS[1] max_concurrency override  KEYS[2] queue_limit override
-- ARGV[1] expected max_concurrency ('' = absent)  ARGV[2] expected queue_limit ('' = absent)
-- ARGV[3] new max_concurrency  ARGV[4] new queue_limit  ARGV[5] ttl in ms
-- Returns 1 if written, 0 if the values had moved.
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
return 1
