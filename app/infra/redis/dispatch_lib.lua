-- The functions every dispatch step shares (app/infra/redis/dispatch.py); each
-- dispatch_*.lua script includes this file first.
-- KEYS (every dispatch script; all of one model, one hash slot): 1 ring (zset tenant -> pass)  2 blocked (set)
--   3 pass (hash tenant -> saved pass; field "" the virtual time)
--   4 inflight (zset job -> dispatch time)  5 inflight info (hash job -> "tenant score")
--   6 conf (hash: mc = the model's max_concurrency; the upstream controller's fields, upstream_lib.lua)  7 runtime max_concurrency override
--   8 the model's copy of the weights (hash tenant -> weight)  9 attempts (hash job -> the attempt it is pending at)
-- ARGV (every dispatch script): 1 ready key prefix ("...:dq:ready:{model}:")  2 permit key prefix ("...:sem:{model}:")
--   3 cap (max_concurrency; '' = the stored conf)  4 window  5 dispatch lease (s)  6 most jobs to dispatch
-- Each script returns {tenant1, job1, attempt1, tenant2, ...}: the jobs dispatched
-- (their permits taken): publish one run_job(job, attempt) message for each.
local READY, SEM = ARGV[1], ARGV[2]
local K_RING, K_BLOCKED, K_PASS, K_INF, K_INFO, K_CONF, K_RTMC, K_W, K_ATT = KEYS[1], KEYS[2], KEYS[3],
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local t0 = redis.call('TIME')
local NOW = tonumber(t0[1]) + tonumber(t0[2]) / 1000000

local function limit()
  local cap = tonumber(ARGV[3])
  if cap then redis.call('HSET', K_CONF, 'mc', cap) else cap = tonumber(redis.call('HGET', K_CONF, 'mc')) or 1 end
  local rt = tonumber(redis.call('GET', K_RTMC) or '')
  if rt and rt < cap then cap = rt end
  -- The upstream controller's limit under that ceiling, 0 while paused (upstream_lib.lua).
  local up = redis.call('HMGET', K_CONF, 'ul', 'pause')
  if (tonumber(up[2] or '') or 0) > NOW then return 0, cap end
  local ul = tonumber(up[1] or '')
  if ul and ul < cap then return math.max(1, math.floor(ul)), cap end
  return cap, cap
end

local function activate(t)
  if redis.call('ZSCORE', K_RING, t) or redis.call('SISMEMBER', K_BLOCKED, t) == 1 then return end
  if redis.call('ZCARD', READY .. t) == 0 then return end
  local saved = tonumber(redis.call('HGET', K_PASS, t) or '0')
  local vt = tonumber(redis.call('HGET', K_PASS, '') or '0')
  redis.call('ZADD', K_RING, math.max(saved, vt), t)
end

local function unblock(t)
  redis.call('SREM', K_BLOCKED, t)
  activate(t)
end

-- Dispatched jobs nobody claimed before 'older_than': back to the head of
-- their tenant's queue, permit returned (the message was lost).
local function requeue_unclaimed(older_than)
  for _, job in ipairs(redis.call('ZRANGEBYSCORE', K_INF, '-inf', older_than)) do
    local info = redis.call('HGET', K_INFO, job)
    redis.call('ZREM', K_INF, job)
    redis.call('HDEL', K_INFO, job)
    if info then
      local t, score = string.match(info, '^(%S+) (%S+)$')
      redis.call('ZREM', SEM .. t, job)
      redis.call('ZADD', READY .. t, 'NX', score, job)
      unblock(t)
    end
  end
end

local function dispatch()
  local window, lease, most = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  requeue_unclaimed(NOW - lease)
  local cap = limit()
  local out = {}
  while cap > 0 and #out < 3 * most and redis.call('ZCARD', K_INF) < window do
    local picked, pass = nil, 0
    local ring = redis.call('ZRANGE', K_RING, 0, -1, 'WITHSCORES')
    for i = 1, #ring, 2 do
      local t, p = ring[i], tonumber(ring[i + 1])
      if redis.call('ZCARD', READY .. t) == 0 then
        redis.call('ZREM', K_RING, t)
        redis.call('HSET', K_PASS, t, p)
      else
        redis.call('ZREMRANGEBYSCORE', SEM .. t, '-inf', NOW)  -- a dead worker's permits
        if redis.call('ZCARD', SEM .. t) < cap then
          picked, pass = t, p
          break
        end
        redis.call('ZREM', K_RING, t)
        redis.call('HSET', K_PASS, t, p)
        redis.call('SADD', K_BLOCKED, t)
      end
    end
    if not picked then break end
    local popped = redis.call('ZPOPMIN', READY .. picked)
    local job, score = popped[1], popped[2]
    redis.call('ZADD', SEM .. picked, NOW + lease, job)
    redis.call('ZADD', K_INF, NOW, job)
    redis.call('HSET', K_INFO, job, picked .. ' ' .. score)
    local w = tonumber(redis.call('HGET', K_W, picked) or '1') or 1
    if w < 1 then w = 1 end
    redis.call('HSET', K_PASS, '', pass)
    if redis.call('ZCARD', READY .. picked) > 0 then
      redis.call('ZADD', K_RING, pass + 1.0 / w, picked)
    else
      redis.call('ZREM', K_RING, picked)
      redis.call('HSET', K_PASS, picked, pass + 1.0 / w)
    end
    out[#out + 1] = picked
    out[#out + 1] = job
    out[#out + 1] = redis.call('HGET', K_ATT, job) or '-1'
  end
  return out
end
