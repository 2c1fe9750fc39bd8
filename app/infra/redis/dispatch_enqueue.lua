-- Queue jobs (admitted, re-admitted, recovered) and dispatch (app/infra/redis/dispatch.py).
-- KEYS 1..12 and ARGV 1..7: as dispatch_lib.lua.
-- ARGV 8: mode: '' (add or move), 'NX' (only if not queued: recovery), 'XXLT'
--   (only move an already queued job ahead: promotion);  ARGV 9..: tenant, job, score, attempt quads.
-- Returns the jobs dispatched, as dispatch_lib.lua.
-- A job that holds a live permit (dispatched or running) is never queued again.
--@include dispatch_lib.lua
local mode = ARGV[8]
for i = 9, #ARGV, 4 do
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
