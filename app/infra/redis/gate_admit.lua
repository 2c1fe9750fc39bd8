-- Admission (app/infra/redis/gate.py), for ONE model: a list of jobs, decided
-- in order, each seeing the slots the items before it took (a single job is a
-- list of one; group commit: app/jobs/admission.py).  For each item: check the
-- model's limit and the tenant's share of it, and take a slot in both.  Every
-- key carries the model's hash tag (one slot).
-- KEYS[1] gate sorted set (member job id, score admission time)
-- KEYS[2] runtime queue_limit override (optional integer string)
-- KEYS[3] runtime per-tenant queue cap override (optional integer string)
-- KEYS[4..] the tenants' gate sorted sets (their slots of this model)
-- ARGV[1] configured queue_limit (cap)  ARGV[2] now (unix s)
-- ARGV[3..] triples: job id, index of its tenant's key in KEYS (4..), the tenant's cap on this model
-- Returns one {admitted 0|1, effective limit, depth after, 'model' | 'tenant' (who refused; '' when
-- admitted)} per item: on a tenant refusal the limit and depth are the tenant's.
-- Each limit is its runtime override if present, never above its cap; a limit
-- <= 0 rejects everything.  Re-admitting a member is a no-op success.
local limit = tonumber(ARGV[1])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local trt = tonumber(redis.call('GET', KEYS[3]) or '')
local depth = redis.call('ZCARD', KEYS[1])
local out = {}
for i = 3, #ARGV, 3 do
  local job, tkey, share = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if trt and trt < share then share = trt end
  if redis.call('ZSCORE', KEYS[1], job) then
    out[#out + 1] = {1, limit, depth, ''}
  elseif limit <= 0 or depth >= limit then
    out[#out + 1] = {0, limit, depth, 'model'}
  else
    local held = redis.call('ZCARD', tkey)
    if share <= 0 or held >= share then
      out[#out + 1] = {0, share, held, 'tenant'}
    else
      redis.call('ZADD', KEYS[1], ARGV[2], job)
      redis.call('ZADD', tkey, ARGV[2], job)
      depth = depth + 1
      out[#out + 1] = {1, limit, depth, ''}
    end
  end
end
return out
