-- Where jobs stand in the dispatcher's order (app/jobs/estimates.py), read only:
-- stride scheduling as dispatch_lib.lua's dispatch() runs it, projected forward.
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.  KEYS 10 the model's gate (zset)  11 its run-time hash
-- ARGV 7 tenant  8 job id ('' : jobs not queued yet)  9.. order scores (for a queued job: its own wins)
-- Returns {cap, running (slots held but not ready: dispatched or running), the tenant's permits held,
--   tenants with ready work (the tenant included), EWMA seconds ('' none), samples,
--   then per score: its tenant's jobs ahead, every tenant's jobs ahead (-1 -1: dispatched already)}.
-- The tenant's k-th next turn comes at pass p + k/w; another tenant U (pass pU, weight wU, nU
-- ready) gets min(nU, ceil((p + k/w - pU) * wU)) turns before it.
--@include dispatch_lib.lua
local t, job = ARGV[7], ARGV[8]
local cap = limit()
local vt = tonumber(redis.call('HGET', K_PASS, '') or '0')
local function pass_of(u)
  local p = redis.call('ZSCORE', K_RING, u)
  if p then return tonumber(p) end
  return math.max(tonumber(redis.call('HGET', K_PASS, u) or '0'), vt)
end
local function weight(u) return math.max(1, tonumber(redis.call('HGET', K_W, u) or '1') or 1) end
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
local running = math.max(own_running, redis.call('ZCARD', KEYS[10]) - ready)
local rt = redis.call('HMGET', KEYS[11], 's', 'n')
local out = {cap, running, own_running, tenants, rt[1] or '', tonumber(rt[2] or '0')}
local dispatched = job ~= '' and (redis.call('ZSCORE', K_INF, job) or redis.call('ZSCORE', SEM .. t, job))
local pt, wt = pass_of(t), weight(t)
for i = 9, #ARGV do
  if dispatched then
    out[#out + 1] = -1; out[#out + 1] = -1
  else
    local score = (job ~= '' and redis.call('ZSCORE', READY .. t, job)) or ARGV[i]
    local k = redis.call('ZCOUNT', READY .. t, '-inf', '(' .. score)
    local target, ahead = pt + k / wt, k
    for j, u in ipairs(others) do
      local pu = pass_of(u)
      if u ~= t and counts[j] > 0 and target > pu then
        ahead = ahead + math.min(counts[j], math.ceil((target - pu) * weight(u)))
      end
    end
    out[#out + 1] = k; out[#out + 1] = ahead
  end
end
return out
