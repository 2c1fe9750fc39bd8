-- The functions every dispatch step shares (app/infra/redis/dispatch.py); each
-- dispatch_*.lua script includes this file first.
-- KEYS (every dispatch script; all of one model, one hash slot): 1 ring (zset tenant -> pass)  2 blocked (set)
--   3 pass (hash tenant -> saved pass; field "" the virtual time)
--   4 job info (hash job -> "tenant score": a job pulled, delayed or parked, for its way back to its queue)
--   5 conf (hash: mc = the model's max_concurrency, es = its expected_seconds, bell = when its doorbell was
--     rung and not yet answered by a pull, pulled = when a step last pulled a job; the model-wide upstream
--     controller's fields, upstream_lib.lua)  6 runtime max_concurrency override
--   7 the model's copy of the weights (hash tenant -> weight)  8 attempts (hash job -> the attempt it is pending at)
--   9 cost (hash tenant -> EWMA of its attempts' run seconds)
--   10 charges (hash job -> "estimate charge dispatch-time [claim time]": what its dispatch added to its
--     tenant's pass, and when)
--   11 shares (hash tenant -> "min burst": its guaranteed and its most concurrent jobs; '' = none)
--   12 scopes (hash scope -> "limit cut pause streak": a tenant's or a credential's own upstream state,
--     upstream_lib.lua)  13 job scopes (hash job -> the credential scope "~k:<hash>" of a job that carries its
--     own model key)  14 delayed (zset job -> when it may be dispatched again: a busy answer's backoff, a paused
--     credential)  15 congested tenants (zset tenant -> when its scope last ran into busy answers in a row)
--   16 busy budget (hash tenant -> free busy answers spent, earned back one per done answer)
-- ARGV (every dispatch script): 1 ready key prefix ("...:dq:ready:{model}:")  2 permit key prefix
--   ("...:sem:{model}:"; a credential scope's permits are the prefix .. "~k:<hash>")  3 parked key prefix
--   ("...:dq:parked:{model}:", .. scope: a credential's jobs waiting for one of its permits)
--   4 cap (max_concurrency; '' = the stored conf)  5 the doorbell's lease (s)  6 a pulled job's permit lease
--   (s: its call's lease)  7 most jobs this step pulls for its caller (0: none)
--   8 fairness: 'turns' (every job costs 1: the baseline) or 'cost' (model time)
--   9 the upstream controller's parameters "decrease tolerance max_pause backoff window" ('-' = off)
-- Each step ends with finish_step(): it returns {ring, high, express, tenant1, job1, attempt1, tenant2, ...}:
-- ring '1' when the caller must ring the model's doorbell (publish one asynch.pull; high '1': at high
-- priority), express '1' when a job of a tenant with nothing running on the model was queued by this step
-- (the caller notifies the workers' express slots, app/jobs/express.py), then the jobs this step pulled for
-- its caller (permits taken, claim time noted): claim and call each.
local READY, SEM, PARKED = ARGV[1], ARGV[2], ARGV[3]
local K_RING, K_BLOCKED, K_PASS, K_INFO, K_CONF, K_RTMC, K_W, K_ATT = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_COST, K_CHARGE, K_SHARE = KEYS[9], KEYS[10], KEYS[11]
local K_SCOPES, K_JSCOPE, K_DELAY, K_CONGESTED, K_BUDGET = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local BELL_LEASE, RUN_LEASE, MOST = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local BY_COST = ARGV[8] ~= 'turns'
local UP_ON, UP = ARGV[9] ~= '-', {}
if UP_ON then for x in string.gmatch(ARGV[9], '%S+') do UP[#UP + 1] = tonumber(x) end end
local EWMA = 0.3  -- the weight of the newest sample in a tenant's run-time average
-- Set by the step's own script after the include: take() picks only tenants holding no permit (an express
-- slot's pull, dispatch_express.lua); finish_step() answers express '1' (dispatch_enqueue.lua).
local ONLY_IDLE, EXPRESS = false, '0'
local t0 = redis.call('TIME')
local NOW = tonumber(t0[1]) + tonumber(t0[2]) / 1000000

-- The model's permit cap for one tenant now (0 while the model is paused), and its ceiling.
local function limit()
  local cap = tonumber(ARGV[4])
  if cap then redis.call('HSET', K_CONF, 'mc', cap) else cap = tonumber(redis.call('HGET', K_CONF, 'mc')) or 1 end
  local rt = tonumber(redis.call('GET', K_RTMC) or '')
  if rt and rt < cap then cap = rt end
  -- The model-wide upstream controller's limit under that ceiling, 0 while paused (upstream_lib.lua).
  local up = redis.call('HMGET', K_CONF, 'ul', 'pause')
  if (tonumber(up[2] or '') or 0) > NOW then return 0, cap end
  local ul = tonumber(up[1] or '')
  if ul and ul < cap then return math.max(1, math.floor(ul)), cap end
  return cap, cap
end

-- A scope's own upstream state (a tenant, or a credential "~k:<hash>"): its limit (nil: at its ceiling), when
-- it was last cut, paused until, busy answers in a row.  Absent: nothing to remember.
local function scope_get(s)
  local v = redis.call('HGET', K_SCOPES, s)
  if not v then return nil, 0, 0, 0 end
  local a, b, c, d = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end

local function scope_put(s, ul, cut, pause, streak, ceiling)
  if ul and ul >= ceiling then ul = nil end
  if not ul and pause <= NOW and streak == 0 then redis.call('HDEL', K_SCOPES, s) return end
  redis.call('HSET', K_SCOPES, s, (ul or '-') .. ' ' .. cut .. ' ' .. pause .. ' ' .. streak)
end

-- The permits scope s may hold now under 'ceiling', and the end of its pause (0: not paused; room 0).
local function scope_room(s, ceiling)
  if not UP_ON then return ceiling, 0 end
  local ul, _, pause = scope_get(s)
  if pause > NOW then return 0, pause end
  if ul and ul < ceiling then return math.max(1, math.floor(ul)), 0 end
  return ceiling, 0
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

-- A job back into its tenant's queue at its score (given back by a puller, or from the delayed or parked sets).
local function back_to_queue(job, info)
  local t, score = string.match(info, '^(%S+) (%S+)$')
  redis.call('HDEL', K_INFO, job)
  redis.call('ZADD', READY .. t, 'NX', score, job)
  unblock(t)
  return t
end

-- Add d to the tenant's pass, wherever it is kept (the ring, or saved).
local function charge(t, d)
  if d == 0 then return end
  if redis.call('ZSCORE', K_RING, t) then redis.call('ZINCRBY', K_RING, d, t)
  else redis.call('HINCRBYFLOAT', K_PASS, t, d) end
end

-- The job's call is over (or its dispatch void): its charge becomes what it
-- really cost, run seconds from its claim to now (0 if never claimed, or
-- 'void'), and a measured run joins the tenant's average.
local function settle(t, job, void)
  local c = redis.call('HGET', K_CHARGE, job)
  if not c then return end
  redis.call('HDEL', K_CHARGE, job)
  local est, d, _, since = string.match(c, '^(%S+) (%S+) (%S+) ?(%S*)$')
  local ran = (since ~= '' and not void) and math.max(0, NOW - tonumber(since)) or 0
  if ran > 0 then
    local avg = tonumber(redis.call('HGET', K_COST, t) or '')
    redis.call('HSET', K_COST, t, avg and (EWMA * ran + (1 - EWMA) * avg) or ran)
  end
  if BY_COST or ran == 0 then charge(t, tonumber(d) * (ran / tonumber(est) - 1)) end
end

-- The pass a dispatch of t's job costs: its estimated run seconds (the
-- tenant's average on this model, else the model's expected_seconds, else 1;
-- 1 in turns mode) over its weight; 0 within its guaranteed minimum (free).
-- Noted with the job, for settle().
local function take_charge(t, job, free)
  settle(t, job, false)  -- an earlier call of the job whose end was never reported (its worker died)
  local est = 1
  if BY_COST then
    est = tonumber(redis.call('HGET', K_COST, t) or '') or tonumber(redis.call('HGET', K_CONF, 'es') or '') or 1
  end
  local w = tonumber(redis.call('HGET', K_W, t) or '1') or 1
  if w < 1 then w = 1 end
  local d = free and 0 or est / w
  redis.call('HSET', K_CHARGE, job, est .. ' ' .. d .. ' ' .. NOW)
  return d
end

-- When the job's current dispatch was decided (its charge's), else 'otherwise'.
local function dispatched_at(job, otherwise)
  local c = redis.call('HGET', K_CHARGE, job)
  return tonumber(c and string.match(c, '^%S+ %S+ (%S+)') or '') or otherwise
end

-- Whether the job's call is under way (claimed: its charge has a claim time).
local function claimed(job)
  local c = redis.call('HGET', K_CHARGE, job)
  return c ~= false and c ~= nil and string.match(c, '^%S+ %S+ %S+ %S+$') ~= nil
end

-- A scope's live permits.  A permit outlived by its call (a dead worker's, or one kept after its job was
-- ended by someone else, released at the call's end) expires here, its charge settled up to now.
local function held(s)
  local gone = redis.call('ZRANGEBYSCORE', SEM .. s, '-inf', NOW)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', SEM .. s, '-inf', NOW)
    local credential = string.sub(s, 1, 1) == '~'
    for _, job in ipairs(gone) do
      if credential then redis.call('HDEL', K_JSCOPE, job) else settle(s, job, false) end
    end
  end
  return redis.call('ZCARD', SEM .. s)
end

-- A shares entry ("min burst") as (guaranteed minimum, ceiling), the ceiling never above the model's cap.
local function bounds(s, cap)
  if not s then return 0, cap end
  local lo, hi = string.match(s, '^(%S*) (%S*)$')
  return tonumber(lo) or 0, math.min(cap, tonumber(hi) or cap)
end

-- The permits tenant t may hold now: its burst ceiling under the cap, under its own upstream limit
-- (0 while its scope is paused).
local function tenant_room(t, cap)
  local _, hi = bounds(redis.call('HGET', K_SHARE, t), cap)
  return (scope_room(t, hi)), hi
end

-- Parked jobs of credential scope k (waiting for one of its permits) back to their queues, as many as it
-- has room for now.
local function unpark(k, cap)
  local n = scope_room(k, cap) - held(k)
  if n <= 0 then return end
  for _, job in ipairs(redis.call('ZRANGE', PARKED .. k, 0, n - 1)) do
    redis.call('ZREM', PARKED .. k, job)
    local info = redis.call('HGET', K_INFO, job)
    if info then back_to_queue(job, info) end
  end
end

-- Delayed jobs whose time came (a busy answer's backoff, a credential's pause): back to their queues.
local function release_delayed()
  for _, job in ipairs(redis.call('ZRANGEBYSCORE', K_DELAY, '-inf', NOW, 'LIMIT', 0, 512)) do
    redis.call('ZREM', K_DELAY, job)
    local info = redis.call('HGET', K_INFO, job)
    if info then back_to_queue(job, info) end
  end
end

-- The tenant that goes next: one with work below its guaranteed minimum
-- (lowest pass first; true as the third value), else the lowest pass below
-- its ceiling.  Tenants without work leave the ring, those at their ceiling are blocked; a tenant whose
-- own upstream paused it stays in the ring, passed over until the pause ends.
local function pick(cap)
  local best, best_pass
  local shares = redis.call('HGETALL', K_SHARE)
  for i = 1, #shares, 2 do
    local t = shares[i]
    local p = tonumber(redis.call('ZSCORE', K_RING, t) or '')
    if p and (not best or p < best_pass) and redis.call('ZCARD', READY .. t) > 0 then
      local lo, hi = bounds(shares[i + 1], cap)
      local n = held(t)
      if n < lo and n < scope_room(t, hi) then best, best_pass = t, p end
    end
  end
  if best then return best, best_pass, true end
  local ring = redis.call('ZRANGE', K_RING, 0, -1, 'WITHSCORES')
  for i = 1, #ring, 2 do
    local t, p = ring[i], tonumber(ring[i + 1])
    local work = redis.call('ZCARD', READY .. t) > 0
    local room, hi = tenant_room(t, cap)
    if work and held(t) < room then return t, p, false end
    if not (work and room == 0 and hi > 0) then  -- paused: stays in the ring
      redis.call('ZREM', K_RING, t)
      redis.call('HSET', K_PASS, t, p)
      if work then redis.call('SADD', K_BLOCKED, t) end
    end
  end
end

-- The lowest-pass tenant with work that holds no permit on the model and may hold one now (an express slot's
-- pick: a tenant with nothing running need not wait for a busy tenant's call to end).
local function pick_idle(cap)
  local ring = redis.call('ZRANGE', K_RING, 0, -1, 'WITHSCORES')
  for i = 1, #ring, 2 do
    local t = ring[i]
    if redis.call('ZCARD', READY .. t) > 0 and held(t) == 0 and tenant_room(t, cap) > 0 then
      return t, tonumber(ring[i + 1]), false
    end
  end
end

-- A job picked for dispatch whose credential scope cannot take it now waits aside: delayed until its
-- scope's pause ends, or parked until one of its permits frees.  Returns true if it was set aside.
local function set_aside(t, job, score, cap)
  local k = redis.call('HGET', K_JSCOPE, job)
  if not k then return false end
  local room, till = scope_room(k, cap)
  if till > 0 then redis.call('ZADD', K_DELAY, till, job)
  elseif held(k) >= room then redis.call('ZADD', PARKED .. k, score, job)
  else return false end
  redis.call('HSET', K_INFO, job, t .. ' ' .. score)
  return true
end

-- Up to MOST jobs for the caller, each the one the ring picks now (a worker's free call slots: the decision is
-- taken when a slot is free, not when a message entered a broker): the tenant's permit (and its credential's)
-- taken for RUN_LEASE, its charge noted with its claim time (its claim statement follows at once).
local function take()
  release_delayed()
  local cap = limit()
  local out, tries = {}, 0
  while cap > 0 and #out < 3 * MOST and tries < 4 * MOST + 64 do
    tries = tries + 1
    local picked, pass, reserved
    if ONLY_IDLE then picked, pass, reserved = pick_idle(cap) else picked, pass, reserved = pick(cap) end
    if not picked then break end
    local popped = redis.call('ZPOPMIN', READY .. picked)
    local job, score = popped[1], popped[2]
    if not set_aside(picked, job, score, cap) then
      redis.call('ZADD', SEM .. picked, NOW + RUN_LEASE, job)
      local k = redis.call('HGET', K_JSCOPE, job)
      if k then redis.call('ZADD', SEM .. k, NOW + RUN_LEASE, job) end
      redis.call('HSET', K_INFO, job, picked .. ' ' .. score)
      if not reserved then redis.call('HSET', K_PASS, '', pass) end
      pass = pass + take_charge(picked, job, reserved)
      redis.call('HSET', K_CHARGE, job, redis.call('HGET', K_CHARGE, job) .. ' ' .. NOW)
      out[#out + 1] = picked
      out[#out + 1] = job
      out[#out + 1] = redis.call('HGET', K_ATT, job) or '-1'
    end
    if redis.call('ZCARD', READY .. picked) > 0 then
      redis.call('ZADD', K_RING, pass, picked)
    else
      redis.call('ZREM', K_RING, picked)
      redis.call('HSET', K_PASS, picked, pass)
    end
  end
  if #out > 0 then redis.call('HSET', K_CONF, 'pulled', NOW) end
  return out
end

-- Whether the caller must ring the model's doorbell: it has work a free slot could take now, and no doorbell
-- is out (one rung and not answered, while the model was being pulled from within the lease: a doorbell whose
-- message was lost is rung again).  At most one doorbell per model is out: workers with free slots answer it,
-- and a pull that leaves work behind rings the next.  High: a tenant below its guaranteed minimum waits.
local function ring()
  release_delayed()
  local cap = limit()
  if cap <= 0 then return '0', '0' end
  local t, _, reserved = pick(cap)
  if not t then return '0', '0' end
  local f = redis.call('HMGET', K_CONF, 'bell', 'pulled')
  local bell, pulled = tonumber(f[1] or '') or 0, tonumber(f[2] or '') or 0
  if bell > 0 and NOW - math.max(bell, pulled) < BELL_LEASE then return '0', '0' end
  redis.call('HSET', K_CONF, 'bell', NOW)
  return '1', reserved and '1' or '0'
end

-- Every step's end: the jobs pulled for its caller (MOST, 0: none), then whether to ring.
local function finish_step()
  local out = MOST > 0 and take() or {}
  local r, high = ring()
  table.insert(out, 1, EXPRESS)
  table.insert(out, 1, high)
  table.insert(out, 1, r)
  return out
end
