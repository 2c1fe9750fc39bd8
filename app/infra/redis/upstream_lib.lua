-- The upstream controller (app/infra/redis/upstream.py): a model's effective
-- concurrency under its ceiling, kept in the model's dispatch conf hash
-- (dispatch_lib.lua KEYS[6]) and read there by limit(); included after
-- dispatch_lib.lua by the steps that update it (dispatch_finish.lua: a done
-- job's run time; dispatch_return.lua: a busy answer), so an update is part
-- of the step that releases or re-queues the job: no extra round trip.
-- Fields: ul the limit (a float; absent = the ceiling), ud when it last fell
--   (busy), pause dispatch paused until (unix s), lb / lr the baseline and
--   recent run time (EWMAs of ~50 and ~5 jobs), ln samples seen.
-- Parameters (one ARGV string): "decrease tolerance retry_after_max".
local function up_params(s)
  local p = {}
  for x in string.gmatch(s, '%S+') do p[#p + 1] = tonumber(x) end
  return p
end

local function up_store(l, ceiling)
  if l >= ceiling then redis.call('HDEL', K_CONF, 'ul') else redis.call('HSET', K_CONF, 'ul', l) end
end

-- A done job that ran 'rt' seconds: the latency gradient lowers the limit
-- (limit x min(1, tolerance x baseline / recent), smoothed by 0.2); without
-- latency pressure a lowered limit climbs by 1 per limit's worth of jobs.
local function up_done(rt, params)
  if rt == '-' then redis.call('HDEL', K_CONF, 'ul', 'ud', 'pause', 'lb', 'lr', 'ln') return end
  rt = tonumber(rt)
  local p, _, ceiling = up_params(params), limit()
  local f = redis.call('HMGET', K_CONF, 'ul', 'lb', 'lr', 'ln')
  local l, lb, lr, n = tonumber(f[1] or '') or ceiling, tonumber(f[2] or ''), tonumber(f[3] or ''), tonumber(f[4] or '0')
  lr = lr and lr + 0.2 * (rt - lr) or rt
  lb = lb and lb + 0.02 * (rt - lb) or rt
  n = n + 1
  local g = 1
  if p[2] > 0 and n >= 10 and lr > 0 then g = math.min(1, p[2] * lb / lr) end
  if g < 1 then l = l * (1 - 0.2 * (1 - g)) elseif l < ceiling then l = l + 1 / l end
  up_store(math.max(1, math.min(l, ceiling)), ceiling)
  redis.call('HSET', K_CONF, 'lb', lb, 'lr', lr, 'ln', math.min(n, 1000))
end

-- A busy answer to a call that started at 'started' (unix s): the limit is
-- multiplied by the decrease (floor 1) unless the call went out before the
-- last decrease (one decrease per round of calls); 'retry_after' > 0 pauses
-- the model's dispatch that long (capped).  Returns the pause's end if this
-- answer moved it, else 0.
local function up_busy(started, retry_after, params)
  local p, _, ceiling = up_params(params), limit()
  local f = redis.call('HMGET', K_CONF, 'ul', 'ud', 'pause')
  if started >= (tonumber(f[2] or '') or 0) then
    up_store(math.max(1, math.floor((tonumber(f[1] or '') or ceiling) * p[1])), ceiling)
    redis.call('HSET', K_CONF, 'ud', NOW)
  end
  local till = NOW + math.min(retry_after, p[3])
  if retry_after > 0 and till > (tonumber(f[3] or '') or 0) then
    redis.call('HSET', K_CONF, 'pause', till)
    return till
  end
  return 0
end
