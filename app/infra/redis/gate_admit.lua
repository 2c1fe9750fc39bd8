-- Admission (app/infra/redis/gate.py), for ONE model: a list of jobs, decided
-- in order, each seeing the slots the items before it took (a single job is a
-- list of one; group commit: app/jobs/admission.py).  For each item: check the
-- model's limit, the tenant's static cap and its fair share, and take a slot in
-- both sets.  Every key carries the model's hash tag (one slot); the tenants'
-- gate keys named in KEYS[4] are built from ARGV[4], with the same tag.
-- KEYS[1] gate sorted set (member job id, score admission time)
-- KEYS[2] runtime queue_limit override (optional integer string)
-- KEYS[3] runtime per-tenant queue cap override (optional integer string)
-- KEYS[4] set: the tenants that hold slots of this model (pruned here when empty)
-- KEYS[5] the model's copy of the dispatch weights (hash tenant -> weight, default 1)
-- KEYS[6..] the submitting tenants' gate sorted sets (their slots of this model)
-- ARGV[1] configured queue_limit (cap)  ARGV[2] now (unix s)
-- ARGV[3] newcomer reserve, a share of the limit (< 0: fair share off)  ARGV[4] tenant gate key prefix
-- ARGV[5..] triples: job id, index of its tenant's key in KEYS (6..), the tenant's static cap on this model
-- Returns one {admitted 0|1, effective limit, depth after, 'model' | 'tenant' (who refused; '' when
-- admitted)} per item: on a tenant refusal the limit and depth are the tenant's.
-- The rule (docs/architecture.md "Fair share at admission"), L the limit, R = ceil(L x reserve) (0 with
-- fair share off): a tenant holding h > 0 slots is admitted while depth < L and, when another tenant
-- holds slots too, h < ceil(L x w / W), W the weights of the tenants holding slots and its own (refused
-- by 'tenant', its share, only then); a tenant holding none (a newcomer) is admitted while depth < L + R,
-- so the first job of a tenant arriving at a queue another filled still gets in.  A tenant alone fills L.
local limit = tonumber(ARGV[1])
local rt = tonumber(redis.call('GET', KEYS[2]) or '')
if rt and rt < limit then limit = rt end
local trt = tonumber(redis.call('GET', KEYS[3]) or '')
local reserve, prefix = tonumber(ARGV[3]), ARGV[4]
local fair = reserve >= 0
local depth = redis.call('ZCARD', KEYS[1])
local held, weight, wsum = {}, {}, 0
local function weight_of(t) return tonumber(redis.call('HGET', KEYS[5], t) or '') or 1 end
if fair then
  for _, t in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    local n = redis.call('ZCARD', prefix .. t)
    if n == 0 then
      redis.call('SREM', KEYS[4], t)
    else
      held[t], weight[t] = n, weight_of(t)
      wsum = wsum + weight[t]
    end
  end
end
local room = limit  -- what a newcomer may reach: the limit and the reserve above it
if fair and limit > 0 then room = limit + math.ceil(limit * reserve) end
local out = {}
for i = 5, #ARGV, 3 do
  local job, tkey, share = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  local t = string.sub(tkey, #prefix + 1)
  if trt and trt < share then share = trt end
  if redis.call('ZSCORE', KEYS[1], job) then
    out[#out + 1] = {1, limit, depth, ''}
  else
    local h = held[t] or redis.call('ZCARD', tkey)
    local w = weight[t] or weight_of(t)
    local fs = math.ceil(limit * w / (wsum + (weight[t] and 0 or w)))
    if limit <= 0 or depth >= room or (h > 0 and depth >= limit) then
      out[#out + 1] = {0, limit, depth, 'model'}
    elseif share <= 0 or h >= share then
      out[#out + 1] = {0, share, h, 'tenant'}
    elseif fair and h > 0 and wsum > (weight[t] or 0) and h >= fs then
      out[#out + 1] = {0, fs, h, 'tenant'}
    else
      redis.call('ZADD', KEYS[1], ARGV[2], job)
      redis.call('ZADD', tkey, ARGV[2], job)
      depth, held[t] = depth + 1, h + 1
      if fair then
        redis.call('SADD', KEYS[4], t)
        if not weight[t] then weight[t], wsum = w, wsum + w end
      end
      out[#out + 1] = {1, limit, depth, ''}
    end
  end
end
return out
