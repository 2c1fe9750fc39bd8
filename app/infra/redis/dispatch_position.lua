-- Where jobs stand in the dispatcher's order (app/jobs/estimates.py), read only:
-- the ring as dispatch_lib.lua's take() runs it, projected forward.
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.  KEYS 17 the model's gate (zset)  18 its run-time hash
-- ARGV 10 tenant  11 job id ('' : jobs not queued yet)  12 m  13..12+m order scores (for a queued job: its
--   own wins)  then job ids the caller admitted whose hand-over it has not seen done (app/jobs/outbox.py)
-- Returns {cap, running (slots held but not ready: pulled, running or set aside), the tenant's permits held,
--   tenants with ready work (the tenant included), EWMA seconds ('' none), samples,
--   then per score: its tenant's jobs ahead, every tenant's jobs ahead (-1 -1: pulled already),
--   then per handed-over id: 1 if the dispatcher holds it (counted above), 0 if not yet}.
-- Each dispatch of U's adds step(U) to its pass: its estimated run seconds over its weight
-- (1/weight in turns mode; as take_charge() charges it).  The tenant's k-th next turn comes at pass
-- p + k*step; another tenant U (pass pU, nU ready) gets min(nU, ceil((p + k*step - pU) / step(U)))
-- turns before it.  Guaranteed minimums are not projected (they only move a tenant earlier).
--@include dispatch_lib.lua
local t, job = ARGV[10], ARGV[11]
local cap = limit()
local vt = tonumber(redis.call('HGET', K_PASS, '') or '0')
local function pass_of(u)
  local p = redis.call('ZSCORE', K_RING, u)
  if p then return tonumber(p) end
  return math.max(tonumber(redis.call('HGET', K_PASS, u) or '0'), vt)
end
local function weight(u) return math.max(1, tonumber(redis.call('HGET', K_W, u) or '1') or 1) end
local function step(u)
  local est = 1
  if BY_COST then
    est = tonumber(redis.call('HGET', K_COST, u) or '') or tonumber(redis.call('HGET', K_CONF, 'es') or '') or 1
  end
  return math.max(est, 0.001) / weight(u)
end
redis.call('ZREMRANGEBYSCORE', SEM .. t, '-inf', NOW)
local own_running = redis.call('ZCARD', SEM .. t)
local others, ready = {}, redis.call('ZCARD', READY .. t)
local seen = {[t] = true}
for _, u in ipairs(redis.call('ZRANGE', K_RING, 0, -1)) do seen[u] = true; others[#others + 1] = u end
for _, u in ipairs(redis.call('SMEMBERS', K_BLOCKED)) do
  if not seen[u] then seen[u] = true; others[#others + 1] = u end
end
local counts, tenants = {}, 1
for i, u in ipairs(others) do
  counts[i] = redis.call('ZCARD', READY .. u)
  ready = ready + counts[i]
  if counts[i] > 0 and u ~= t then tenants = tenants + 1 end
end
local running = math.max(own_running, redis.call('ZCARD', KEYS[17]) - ready)
local rt = redis.call('HMGET', KEYS[18], 's', 'n')
local out = {cap, running, own_running, tenants, rt[1] or '', tonumber(rt[2] or '0')}
local dispatched = job ~= '' and redis.call('ZSCORE', SEM .. t, job)
local pt, st = pass_of(t), step(t)
local m = tonumber(ARGV[12])
for i = 13, 12 + m do
  if dispatched then
    out[#out + 1] = -1; out[#out + 1] = -1
  else
    local score = (job ~= '' and redis.call('ZSCORE', READY .. t, job)) or ARGV[i]
    local k = redis.call('ZCOUNT', READY .. t, '-inf', '(' .. score)
    local target, ahead = pt + k * st, k
    for j, u in ipairs(others) do
      local pu = pass_of(u)
      if u ~= t and counts[j] > 0 and target > pu then
        ahead = ahead + math.min(counts[j], math.ceil((target - pu) / step(u)))
      end
    end
    out[#out + 1] = k; out[#out + 1] = ahead
  end
end
for i = 13 + m, #ARGV do out[#out + 1] = redis.call('HEXISTS', K_ATT, ARGV[i]) end
return out
