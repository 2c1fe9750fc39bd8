"""Every Redis key name, under ASYNCH_REDIS_PREFIX (default ``asynch``).

Layout (Redis Cluster, docs/operations.md "Redis topologies"): every key of a model carries its name as a hash
tag, ``{model}``, so all of them (gates, ready queues, permits, dispatch state, runtime overrides, a copy of
the tenant weights) live in ONE slot and a Lua script over them runs on one node; keys a script builds from an
ARGV prefix carry the same tag.  Global keys are single-key or share their own tag (``{beat}``).  Model names
never contain a brace (app/catalog/schemas.py).  The runtime overrides are seed 002's
``asynch:runtime:queue_limit:{model}`` (and max_concurrency), the braces now literal.  The older untagged
layout is ignored: the epoch key was renamed with it, so the first pass after an upgrade sees a "wiped" Redis
and rebuilds from the rows (app/maintenance/recovery.py repair_after_wipe).
"""
from __future__ import annotations

from functools import partial

from app.config import get_settings

# Bumped with every change of the layout: a new epoch key name makes the
# first pass after an upgrade rebuild the derived state under the new names.
LAYOUT = 3  # 3: pulled by free slots (no dispatched window, job info renamed), 2026-12-07


def _p() -> str:
    return get_settings().redis_prefix


def _m(kind: str, model: str) -> str:
    return f"{_p()}:{kind}:{{{model}}}"


def _mt(kind: str, model: str, tenant: str) -> str:
    return f"{_m(kind, model)}:{tenant}"


def _g(name: str, *tail: str) -> str:
    return ":".join((_p(), name, *tail))


def model_of(key: str, kind: str) -> str | None:
    """The model in ``<prefix>:<kind>:{model}...`` (a SCAN hit), else None."""
    head = f"{_p()}:{kind}:{{"
    model, brace, _ = key[len(head):].partition("}")
    return model if key.startswith(head) and brace else None


def model_pattern(kind: str) -> str:
    """SCAN pattern of every model's ``<prefix>:<kind>:{model}`` key."""
    return f"{_p()}:{kind}:{{*}}"


def epoch(tag: str = "") -> str:
    """Present while this Redis (under Redis Cluster: the node ``tag`` hashes into) has kept its data since
    recovery last looked; absent after a wipe, on first start, and after a layout change."""
    return f"{_p()}:epoch:{LAYOUT}" + (f":{{{tag}}}" if tag else "")


# Per model (``_m``: f(model)) and per model and tenant (``_mt``: f(model, tenant)), in the model's slot.
gate = partial(_m, "gate")  # sorted set: the job ids holding a slot (pending + running), by admission time
gate_tenants = partial(_m, "gtenants")  # set: the tenants holding slots (gate_admit.lua's index for the fair share)
tenant_gate = partial(_mt, "tgate")  # sorted set: the slots of the model's gate the tenant holds (its share)
semaphore = partial(_mt, "sem")  # sorted set: the tenant's permits on the model (job id -> lease expiry, Redis time)
# Runtime overrides (autotune); the per-tenant queue cap's is like queue_limit's.
runtime_queue_limit = partial(_m, "runtime:queue_limit")
runtime_max_concurrency = partial(_m, "runtime:max_concurrency")
runtime_tenant_queue_limit = partial(_m, "runtime:tenant_queue_limit")
# Fair dispatch (app/infra/redis/dispatch.py).
dispatch_ready = partial(_mt, "dq:ready")  # sorted set: a tenant's pending jobs waiting for dispatch, by queue order
dispatch_ring = partial(_m, "dq:ring")
dispatch_blocked = partial(_m, "dq:blocked")
dispatch_pass = partial(_m, "dq:pass")
dispatch_job_info = partial(_m, "dq:info")  # hash: job -> "tenant score", a job pulled or set aside (its way back)
dispatch_conf = partial(_m, "dq:conf")  # hash: the model's cap, expected seconds, doorbell, upstream controller
dispatch_attempts = partial(_m, "dq:attempt")  # hash: job -> the attempt it is queued for (its run_job message's)
dispatch_cost = partial(_m, "dq:cost")  # hash: tenant -> EWMA of its attempts' run seconds (dispatch by cost)
dispatch_charges = partial(_m, "dq:charge")  # hash: job -> "estimate charge [claim time]" added to the pass
dispatch_shares = partial(_m, "dq:shares")  # hash: tenant -> "min burst" concurrent jobs (per-model tenant limits)
# Hash: tenant -> weight, the model's copy of ``tenant_weights()`` its steps read (refreshed on changes and kicks).
dispatch_weights = partial(_m, "dq:weights")
dispatch_run_time = partial(_m, "dq:runtime")  # hash: s (EWMA run seconds), n (samples): app/jobs/estimates.py
# The upstream controller's scopes (app/infra/redis/upstream.py): a tenant's, or a credential's ("~k:<hash>").
dispatch_scopes = partial(_m, "dq:scopes")  # hash: scope -> "limit cut pause streak" (upstream_lib.lua)
dispatch_job_scopes = partial(_m, "dq:jscope")  # hash: job -> its credential scope (a job with its own model key)
dispatch_delayed = partial(_m, "dq:delayed")  # sorted set: job -> when it may be dispatched again (busy backoff)
dispatch_parked = partial(_mt, "dq:parked")  # sorted set per credential scope: its jobs waiting for its permits
dispatch_congested = partial(_m, "dq:congested")  # sorted set: tenant -> when its scope was last congested
dispatch_busy_budget = partial(_m, "dq:budget")  # hash: tenant -> free busy answers spent (upstream_budget.lua)

# Global keys.
terminal_channel = partial(_g, "events:terminal")  # pub/sub: a job id, after its terminal commit (wake-ups)
invalidate_channel = partial(_g, "events:invalidate")  # pub/sub: drop your cached keys/models now
bells = partial(_g, "bells")  # sorted set: model -> when its doorbell was rung, while no pull has answered it
output_channel = partial(_g, "events:output")  # pub/sub: a batch of live output entries (app/jobs/output.py)
express_channel = partial(_g, "events:express")  # pub/sub: a model whose queue got a job of a tenant with none running
stop_channel = partial(_g, "events:stop")  # pub/sub: "<job id> <attempt>": stop that attempt's call now
beat_lock = partial(_g, "{beat}:leader")
beat_token = partial(_g, "{beat}:token")  # fencing counter, larger for every new leadership (leader_acquire.lua)
beat_history = partial(_g, "{beat}:history")
tenant_weights = partial(_g, "tenant:weights")  # hash: tenant -> dispatch weight, the source of every model's copy
liveness_since = partial(_g, "liveness:since")  # Redis time from which this Redis has held worker liveness
worker = partial(_g, "worker")  # worker(node): hash of a Celery node's liveness fields (heartbeat, consumed)
ratelimit = partial(_g, "ratelimit")  # ratelimit(bucket_id)
ledger_violations = partial(_g, "ledger:violations")  # hash: check -> violations of the last verify run
lost_job_cursor = partial(_g, "maint:lost_cursor")  # where the lost-job scan stopped (app/maintenance/recovery.py)


def job_output(job_id: str) -> str:
    """Stream: a job's live output (app/jobs/output.py), entry ids ``<attempt>-<end offset>``; in the job's own slot."""
    return f"{_p()}:out:{{{job_id}}}"
