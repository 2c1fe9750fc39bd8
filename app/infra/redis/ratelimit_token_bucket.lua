-- Take `cost` tokens from a bucket if it holds them (app/infra/redis/ratelimit.py).
-- KEYS[1] bucket hash (fields tk = tokens left, ts = Redis time of the last take, unix s)
-- ARGV[1] rate (tokens per second, > 0)  ARGV[2] burst (capacity, >= 1)  ARGV[3] cost (tokens, 0..burst)
-- Returns {allowed 0|1, tokens left, seconds until `cost` tokens are there (0: now),
--          seconds until the bucket is full}; the last three as strings (a Lua
-- number would come back truncated to an integer).
-- A missing bucket is full.  The hash expires (PEXPIRE) 1 s after it would be
-- full again, capped at 1e9 s (passed as an integer string: Redis turns a
-- large Lua number into text with an exponent, which PEXPIRE refuses).  A
-- refused take writes too (the refill up to now); that changes nothing but
-- the TTL.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local st = redis.call('HMGET', KEYS[1], 'tk', 'ts')
local tokens = tonumber(st[1])
local ts = tonumber(st[2])
if tokens == nil or ts == nil then
  tokens = burst
else
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  tokens = math.min(burst, tokens + elapsed * rate)
end
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
local wait = 0
if tokens < cost then wait = (cost - tokens) / rate end
local full = (burst - tokens) / rate
redis.call('HSET', KEYS[1], 'tk', string.format('%.6f', tokens), 'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.min(math.ceil(full * 1000) + 1000, 1e12)))
return {allowed, string.format('%.6f', tokens), string.format('%.6f', wait), string.format('%.6f', full)}
