-- Reconcile a gate with the database (app/infra/redis/gate.py).
-- KEYS[1] gate sorted set
-- ARGV[1] now  ARGV[2] cutoff: only members admitted before it may be removed
--               (a younger one may belong to a row that is about to commit)
-- ARGV[3..] ids of the model's pending/running rows
-- Returns {added ids, removed ids}.
local want = {}
local added = {}
for i = 3, #ARGV do
  want[ARGV[i]] = true
  if redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[i]) == 1 then
    added[#added + 1] = ARGV[i]
  end
end
local removed = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])) do
  if not want[id] then
    redis.call('ZREM', KEYS[1], id)
    removed[#removed + 1] = id
  end
end
return {added, removed}
