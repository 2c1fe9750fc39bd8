-- Queue jobs (admitted, re-admitted, recovered) (app/infra/redis/dispatch.py); the doorbell rings if a free
-- slot could take one now.
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- ARGV 10: mode: '' (add or move), 'NX' (only if not queued: recovery), 'XXLT'
--   (only move an already queued job ahead: promotion);  ARGV 11..: tenant, job, score, attempt, scope quints
--   (scope: the job's credential scope "~k:<hash>" when it carries its own model key, else '').
-- Returns {ring, high, express, pulled triples...}, as dispatch_lib.lua finish_step; express '1' when a job was
-- queued for a tenant holding no permit on the model (its express slot may take it: app/jobs/express.py).
-- A job that holds a live permit (pulled or running), or waits aside (delayed, parked), is never queued again.
--@include dispatch_lib.lua
local mode = ARGV[10]
for i = 11, #ARGV, 5 do
  local t, job, score, scope = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 4]
  if mode ~= 'XXLT' or redis.call('ZSCORE', READY .. t, job) then redis.call('HSET', K_ATT, job, ARGV[i + 3]) end
  if scope ~= '' then redis.call('HSET', K_JSCOPE, job, scope) end
  local k = redis.call('HGET', K_JSCOPE, job)
  local aside = redis.call('ZSCORE', K_DELAY, job) or (k and redis.call('ZSCORE', PARKED .. k, job))
  local held = tonumber(redis.call('ZSCORE', SEM .. t, job) or '-1')
  if held <= NOW and not aside then
    if held >= 0 then redis.call('ZREM', SEM .. t, job) end  -- a permit that expired with its worker
    if mode == 'NX' then redis.call('ZADD', READY .. t, 'NX', score, job)
    elseif mode == 'XXLT' then redis.call('ZADD', READY .. t, 'XX', 'LT', score, job)
    else redis.call('ZADD', READY .. t, score, job) end
    activate(t)
    if mode ~= 'XXLT' and redis.call('ZCARD', SEM .. t) == 0 then EXPRESS = '1' end
  end
end
return finish_step()
