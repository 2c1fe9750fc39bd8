-- Queue jobs (admitted, re-admitted, recovered) and dispatch (app/infra/redis/dispatch.py).
-- KEYS 1..9 and ARGV 1..6: as dispatch_lib.lua.
-- ARGV 7: mode: '' (add or move), 'NX' (only if not queued: recovery), 'XXLT'
--   (only move an already queued job ahead: promotion);  ARGV 8..: tenant, job, score, attempt quads.
-- Returns the jobs dispatched, as dispatch_lib.lua.
-- A job that holds a live permit (dispatched or running) is never queued again.
--@include dispatch_lib.lua
local mode = ARGV[7]
for i = 8, #ARGV, 4 do
  local t, job, score = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if mode ~= 'XXLT' or redis.call('ZSCORE', READY .. t, job) then redis.call('HSET', K_ATT, job, ARGV[i + 3]) end
  local held = tonumber(redis.call('ZSCORE', SEM .. t, job) or '-1')
  if held <= NOW then
    if held >= 0 then redis.call('ZREM', SEM .. t, job) end  -- a permit that expired with its worker
    if mode == 'NX' then redis.call('ZADD', READY .. t, 'NX', score, job)
    elseif mode == 'XXLT' then redis.call('ZADD', READY .. t, 'XX', 'LT', score, job)
    else redis.call('ZADD', READY .. t, score, job) end
    activate(t)
  end
end
return dispatch()
