-- A worker's express slot (app/jobs/slots.py, app/jobs/express.py) takes one job of a tenant holding no permit
-- on the model: the lowest-pass such tenant's next job, its permit taken and charged as any pull's
-- (dispatch_lib.lua take with ONLY_IDLE).  Not a doorbell's answer: the doorbell's state is left as it is.
-- KEYS 1..16 and ARGV 1..9: as dispatch_lib.lua (ARGV 7, MOST: 1).
-- Returns {ring, high, express, pulled triples...}, as dispatch_lib.lua finish_step.
--@include dispatch_lib.lua
ONLY_IDLE = true
return finish_step()
