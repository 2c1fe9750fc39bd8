-- What holds pending jobs of a model now (app/jobs/waiting.py), read only: one job's reason, or the count of
-- the model's waiting jobs by reason.  The rules are take()'s and pick()'s (dispatch_lib.lua), read, not run.
-- KEYS 1 conf (hash: mc, ul, pause, bell)  2 runtime max_concurrency override  3 shares (tenant -> "min burst")
--   4 scopes (scope -> "limit cut pause streak")  5 delayed (zset job -> when it may run again)
--   6 job scopes (job -> its credential scope)  7 attempts (job -> attempt: the jobs the dispatcher holds)
-- ARGV 1 ready key prefix  2 permit key prefix  3 parked key prefix  4 cap ('' = the stored conf)
--   5 mode: 'job' then 6 tenant  7 job id
--         'counts' then 6.. tenants with a ready queue, '|', then credential scopes with parked jobs
-- Returns (job) {reason, n1, n2, n3}: 'none' (not held by the dispatcher yet) | 'pulled' (a free slot took it;
--   its claim follows) | 'upstream_paused' until scope ('model', 'tenant' or 'job': its own busy backoff) |
--   'tenant_limit' running limit ceiling ('max_concurrency', 'burst', 'upstream' or 'model_key') |
--   'behind_own_jobs' ahead | 'no_worker' doorbell-rung-at ('' none out)
-- (counts) {behind_own_jobs, tenant_limit, upstream_paused, no_worker}.
local READY, SEM, PARKED = ARGV[1], ARGV[2], ARGV[3]
local t0 = redis.call('TIME')
local NOW = tonumber(t0[1]) + tonumber(t0[2]) / 1000000

local function scope_of(s)  -- (limit or nil, paused until or 0)
  local v = redis.call('HGET', KEYS[4], s)
  if not v then return nil, 0 end
  local a, _, c = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
  return tonumber(a), tonumber(c) or 0
end

local conf = redis.call('HMGET', KEYS[1], 'mc', 'ul', 'pause', 'bell')
local cap = tonumber(ARGV[4]) or tonumber(conf[1]) or 1
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < cap then cap = rt end
local why = 'max_concurrency'
local mul = tonumber(conf[2] or '')
if mul and math.max(1, math.floor(mul)) < cap then cap, why = math.max(1, math.floor(mul)), 'upstream' end
local model_pause = tonumber(conf[3] or '') or 0

-- The permits tenant t may hold now and the rule that sets it, its live permits, its pause end (0: none).
local function room(t)
  local r, w = cap, why
  local sh = redis.call('HGET', KEYS[3], t)
  if sh then
    local hi = tonumber(string.match(sh, '^%S* (%S*)$') or '')
    if hi and hi < r then r, w = hi, 'burst' end
  end
  local ul, pause = scope_of(t)
  if ul and math.max(1, math.floor(ul)) < r then r, w = math.max(1, math.floor(ul)), 'upstream' end
  return r, w, redis.call('ZCOUNT', SEM .. t, '(' .. NOW, '+inf'), pause
end

if ARGV[5] == 'job' then
  local t, job = ARGV[6], ARGV[7]
  if redis.call('HEXISTS', KEYS[7], job) == 0 then return {'none'} end
  local permit = redis.call('ZSCORE', SEM .. t, job)
  if permit and tonumber(permit) > NOW then return {'pulled', permit} end
  if model_pause > NOW then return {'upstream_paused', tostring(model_pause), 'model'} end
  local d = tonumber(redis.call('ZSCORE', KEYS[5], job) or '')
  if d and d > NOW then return {'upstream_paused', tostring(d), 'job'} end
  local r, w, held, pause = room(t)
  if pause > NOW then return {'upstream_paused', tostring(pause), 'tenant'} end
  local k = redis.call('HGET', KEYS[6], job)
  if k and redis.call('ZSCORE', PARKED .. k, job) then
    return {'tenant_limit', redis.call('ZCOUNT', SEM .. k, '(' .. NOW, '+inf'), '', 'model_key'}
  end
  if held >= r then return {'tenant_limit', held, r, w} end
  local score = redis.call('ZSCORE', READY .. t, job)
  local ahead = score and redis.call('ZCOUNT', READY .. t, '-inf', '(' .. score) or 0
  if ahead > 0 then return {'behind_own_jobs', ahead} end
  return {'no_worker', conf[4] or ''}
end

local behind, limited, paused, idle = 0, 0, 0, 0
local i = 6
while i <= #ARGV and ARGV[i] ~= '|' do
  local t = ARGV[i]
  local n = redis.call('ZCARD', READY .. t)
  if n > 0 then
    local r, _, held, pause = room(t)
    if model_pause > NOW or pause > NOW then paused = paused + n
    elseif held >= r then limited = limited + n
    else idle, behind = idle + 1, behind + n - 1 end
  end
  i = i + 1
end
for j = i + 1, #ARGV do limited = limited + redis.call('ZCARD', PARKED .. ARGV[j]) end
paused = paused + redis.call('ZCOUNT', KEYS[5], '(' .. NOW, '+inf')
return {behind, limited, paused, idle}
