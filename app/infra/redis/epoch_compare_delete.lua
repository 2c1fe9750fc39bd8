-- Delete a key only if it still holds our value (epoch rollback, app/infra/redis/epoch.py).
-- KEYS[1] key  ARGV[1] expected value.  Returns 1 if deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
