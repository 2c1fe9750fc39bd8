-- The upstream controller (app/infra/redis/upstream.py): who backs off when the upstream answers busy, and
-- how far.  Included after dispatch_lib.lua by the steps that see answers (dispatch_finish.lua: a done
-- job's run time; dispatch_return.lua: a busy answer), so an update is part of the step that releases or
-- re-queues the job: no extra round trip.  Parameters: dispatch_lib.lua's UP (ARGV 9):
--   1 decrease  2 latency tolerance  3 longest pause (s)  4 backoff base (s)  5 the congestion window (s).
-- A busy answer belongs to the scope that received it: the job's credential ("~k:<hash>") when it carried
-- its own model key, else its tenant.  Each busy answer delays its own job (upstream.py job_delay).  A
-- scope's second busy round in a row (no done answer between; a round: the calls dispatched since the scope's last
-- cut) is congestion: the scope's own limit is cut and it is paused (Retry-After, else a backoff with jitter
-- that doubles each round).  The model as a whole backs off only when two tenants' scopes are congested on
-- the model's own credential within the window: real overload.
-- Model-wide fields of the conf hash (KEYS[6]): ul the limit (a float; absent = the ceiling), ud when it
--   last fell, pause dispatch paused until (unix s), lb / lr the baseline and recent run time (EWMAs of ~50
--   and ~5 jobs), ln samples seen.

-- Busy rounds in a row (no done answer between) that make a scope congested.  Three, not two: an upstream
-- that refuses a tenth of its calls at random (a flaky one, or a quota's odd refusal) answers two busy in a row
-- without a done between about once in eight busy answers at 8 calls in flight, and each false congestion cut
-- the scope's limit and paused it: bench_busy's flaky run then swung from 1x to 30x its median.  A full
-- upstream refuses nearly every call, so three come as fast as two did.
local CONGESTED_ROUNDS = 3

local function up_store(l, ceiling)
  if l >= ceiling then redis.call('HDEL', K_CONF, 'ul') else redis.call('HSET', K_CONF, 'ul', l) end
end

-- A pause of the n-th busy round in a row without a usable Retry-After: base x 2^(n-1), capped, with
-- equal jitter (u in [0, 1) from the caller: scripts have no randomness of their own).
local function backoff(n, u)
  local x = math.min(UP[3], UP[4] * 2 ^ math.max(0, n - 1))
  return x / 2 + u * x / 2
end

-- A done job that ran 'rt' seconds (nil: not measured) in scopes t and k ('' none): each scope's streak
-- ends and a lowered scope limit climbs by 1 per limit's worth of jobs; the tenant earns back one free
-- busy answer.  Model-wide: the latency gradient lowers the limit (limit x min(1, tolerance x baseline /
-- recent), smoothed by 0.2); without latency pressure a lowered limit climbs by 1 per limit's worth of jobs.
local function up_done(t, k, rt)
  if not UP_ON then
    redis.call('HDEL', K_CONF, 'ul', 'ud', 'pause', 'lb', 'lr', 'ln')
    redis.call('DEL', K_SCOPES, K_CONGESTED, K_BUDGET)
    return
  end
  local _, ceiling = limit()
  for _, s in ipairs(k ~= '' and {t, k} or {t}) do
    local ul, cut, pause, streak = scope_get(s)
    if ul or streak > 0 then
      if ul then ul = ul + 1 / ul end
      scope_put(s, ul, cut, pause, 0, ceiling)
    end
  end
  redis.call('ZREM', K_CONGESTED, t)
  local spent = tonumber(redis.call('HGET', K_BUDGET, t) or '0')
  if spent > 1 then redis.call('HINCRBY', K_BUDGET, t, -1) elseif spent > 0 then redis.call('HDEL', K_BUDGET, t) end
  if not rt then return end
  local f = redis.call('HMGET', K_CONF, 'ul', 'lb', 'lr', 'ln')
  local l, lb, lr, n = tonumber(f[1] or '') or ceiling, tonumber(f[2] or ''), tonumber(f[3] or ''), tonumber(f[4] or '0')
  lr = lr and lr + 0.2 * (rt - lr) or rt
  lb = lb and lb + 0.02 * (rt - lb) or rt
  n = n + 1
  local g = 1
  if UP[2] > 0 and n >= 10 and lr > 0 then g = math.min(1, UP[2] * lb / lr) end
  if g < 1 then l = l * (1 - 0.2 * (1 - g)) elseif l < ceiling then l = l + 1 / l end
  up_store(math.max(1, math.min(l, ceiling)), ceiling)
  redis.call('HSET', K_CONF, 'lb', lb, 'lr', lr, 'ln', math.min(n, 1000))
end

-- A busy answer to tenant t's call in scope k ('' : the model's own credential) dispatched at 'started'
-- (unix s); 'retry_after' in seconds (< 0: none usable), capped.  Returns when what it paused resumes
-- (unix s; 0: it paused nothing).
local function up_busy(t, k, started, retry_after, u)
  if not UP_ON then return 0 end
  local _, ceiling = limit()
  local s = k ~= '' and k or t
  local sc = k ~= '' and ceiling or select(2, tenant_room(t, ceiling))
  local ul, cut, pause, streak = scope_get(s)
  local till = 0
  -- Rounds, not answers: a call dispatched before the scope's last cut answers for a round already counted (8
  -- calls refused together are one refusal of the scope, not eight, however their starts are spread).
  if started >= cut then
    streak = streak + 1
    if streak >= CONGESTED_ROUNDS then
      ul, cut = math.max(1, math.floor((ul or sc) * UP[1])), NOW
      local len = math.min(retry_after >= 0 and retry_after or backoff(streak - CONGESTED_ROUNDS + 1, u), UP[3])
      if NOW + len > pause then pause, till = NOW + len, NOW + len end
      if k == '' then redis.call('ZADD', K_CONGESTED, NOW, t) end
    end
  end
  scope_put(s, ul, cut, pause, streak, sc)
  if k ~= '' then return till end
  redis.call('ZREMRANGEBYSCORE', K_CONGESTED, '-inf', NOW - UP[5])
  if redis.call('ZCARD', K_CONGESTED) < 2 then return till end
  -- Two tenants congested on the model's own credential: the model backs off as a whole.
  local f = redis.call('HMGET', K_CONF, 'ul', 'ud', 'pause')
  if started >= (tonumber(f[2] or '') or 0) then
    up_store(math.max(1, math.floor((tonumber(f[1] or '') or ceiling) * UP[1])), ceiling)
    redis.call('HSET', K_CONF, 'ud', NOW)
  end
  local len = math.min(retry_after >= 0 and retry_after or backoff(1, u), UP[3])
  if NOW + len > (tonumber(f[3] or '') or 0) then
    redis.call('HSET', K_CONF, 'pause', NOW + len)
    till = math.max(till, NOW + len)
  end
  return till
end
