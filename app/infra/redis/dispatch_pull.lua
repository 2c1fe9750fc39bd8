-- A worker with free call slots answers the model's doorbell (app/infra/redis/dispatch.py pull): the doorbell
-- is answered, and up to MOST jobs the ring picks now are its (permits taken, claim time noted); the doorbell
-- rings again if work is left for other slots.
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua.
-- Returns {ring, high, express, pulled triples...}, as dispatch_lib.lua finish_step.
--@include dispatch_lib.lua
redis.call('HDEL', K_CONF, 'bell')
return finish_step()
