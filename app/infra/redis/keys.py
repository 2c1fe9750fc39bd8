"""Every Redis key name, under ASYNCH_REDIS_PREFIX (default ``asynch``).

Layout (Redis Cluster, docs/operations.md "Redis topologies"): every key
that belongs to a model carries the model's name as a hash tag, ``{model}``,
so all of a model's keys (its gate, its tenants' gates, ready queues and
permits, the dispatcher's state, its runtime overrides and a copy of the
tenant weights) live in ONE hash slot and every Lua script over them runs
on one node.  Keys a script builds from a prefix in ARGV start with the same
``{model}`` tag.  Global keys are single-key (rate-limit buckets, worker
liveness, the lost-job cursor) or share their own tag (the beat's lock and
fencing counter: ``{beat}``).  Model names are letters, digits, ``_ . -``
(app/catalog/schemas.py), so a name never contains a brace.

The runtime override keys are the ones seed 002 documents,
``asynch:runtime:queue_limit:{model}`` and ``...:max_concurrency:{model}``,
now with the braces literal (the hash tag).  The layout before hash tags
(``asynch:gate:echo``) is ignored: the epoch key was renamed with it, so the
first maintenance pass after an upgrade sees a "wiped" Redis and rebuilds
everything from the rows (app/maintenance/recovery.py repair_after_wipe).
"""
from __future__ import annotations

from app.config import get_settings

# Bumped with every change of the layout: a new epoch key name makes the
# first pass after an upgrade rebuild the derived state under the new names.
LAYOUT = 2


def _p() -> str:
    return get_settings().redis_prefix


def _m(kind: str, model: str) -> str:
    return f"{_p()}:{kind}:{{{model}}}"


def model_of(key: str, kind: str) -> str | None:
    """The model in ``<prefix>:<kind>:{model}...`` (a SCAN hit), else None."""
    head = f"{_p()}:{kind}:{{"
    if not key.startswith(head) or "}" not in key[len(head):]:
        return None
    return key[len(head):key.index("}", len(head))]


def model_pattern(kind: str) -> str:
    """SCAN pattern of every model's ``<prefix>:<kind>:{model}`` key."""
    return f"{_p()}:{kind}:{{*}}"


def gate(model: str) -> str:
    """Sorted set: the job ids holding a slot (pending + running), scored by admission time."""
    return _m("gate", model)


def runtime_queue_limit(model: str) -> str:
    return _m("runtime:queue_limit", model)


def runtime_max_concurrency(model: str) -> str:
    return _m("runtime:max_concurrency", model)


def terminal_channel() -> str:
    """Pub/sub: a job id, published after its terminal commit (long-poll wake-ups)."""
    return f"{_p()}:events:terminal"


def invalidate_channel() -> str:
    """Pub/sub: drop your cached keys/models now."""
    return f"{_p()}:events:invalidate"


def epoch(tag: str = "") -> str:
    """Present while this Redis (under Redis Cluster: this node, whose slots
    ``tag`` hashes into) has not lost its data since recovery last looked;
    absent after a wipe, on first start, and after a layout change."""
    return f"{_p()}:epoch:{LAYOUT}" + (f":{{{tag}}}" if tag else "")


def beat_lock() -> str:
    return f"{_p()}:{{beat}}:leader"


def beat_token() -> str:
    """Monotonic fencing counter: every new leadership gets a larger token
    (the lock's slot: leader_acquire.lua touches both)."""
    return f"{_p()}:{{beat}}:token"


def beat_history() -> str:
    return f"{_p()}:{{beat}}:history"


def tenant_gate(model: str, tenant: str) -> str:
    """Sorted set: the slots of ``model``'s gate that ``tenant`` holds (its share)."""
    return f"{_m('tgate', model)}:{tenant}"


def gate_tenants(model: str) -> str:
    """Set: the tenants holding slots of ``model`` (gate_admit.lua's index for the fair share)."""
    return _m("gtenants", model)


def runtime_tenant_queue_limit(model: str) -> str:
    """Runtime override of the per-tenant queue cap, like queue_limit's."""
    return _m("runtime:tenant_queue_limit", model)


def semaphore(model: str, tenant: str) -> str:
    """Sorted set: the tenant's permits on the model (job id -> lease expiry, Redis time)."""
    return f"{_m('sem', model)}:{tenant}"


# --- dispatch (app/infra/redis/dispatch.py): the model's tag, then the tenant.

def dispatch_ready(model: str, tenant: str) -> str:
    """Sorted set: a tenant's pending jobs waiting for dispatch, by queue order."""
    return f"{_m('dq:ready', model)}:{tenant}"


def dispatch_ring(model: str) -> str:
    return _m("dq:ring", model)


def dispatch_blocked(model: str) -> str:
    return _m("dq:blocked", model)


def dispatch_pass(model: str) -> str:
    return _m("dq:pass", model)


def dispatch_inflight(model: str) -> str:
    return _m("dq:inflight", model)


def dispatch_inflight_info(model: str) -> str:
    return _m("dq:info", model)


def dispatch_attempts(model: str) -> str:
    """Hash: job -> the attempt it is queued for (the run_job message carries it)."""
    return _m("dq:attempt", model)


def dispatch_conf(model: str) -> str:
    return _m("dq:conf", model)


def dispatch_cost(model: str) -> str:
    """Hash: tenant -> EWMA of its attempts' run seconds on the model (fair dispatch by cost)."""
    return _m("dq:cost", model)


def dispatch_charges(model: str) -> str:
    """Hash: job -> "estimate charge [claim time]", what its dispatch added to its tenant's pass."""
    return _m("dq:charge", model)


def dispatch_shares(model: str) -> str:
    """Hash: tenant -> "min burst", its guaranteed and most concurrent jobs on the model
    (from asynch_tenant_limits' per-model rows)."""
    return _m("dq:shares", model)


def dispatch_weights(model: str) -> str:
    """Hash: tenant -> dispatch weight, the copy the model's dispatch steps
    read (one slot with the model's other keys); written from
    ``tenant_weights()`` by every change and every periodic kick."""
    return _m("dq:weights", model)


def dispatch_run_time(model: str) -> str:
    """Hash: the model's measured run time (s: EWMA seconds, n: samples; app/jobs/estimates.py)."""
    return _m("dq:runtime", model)


def tenant_weights() -> str:
    """Hash: tenant -> dispatch weight (from asynch_tenant_limits): the
    source of every model's ``dispatch_weights`` copy."""
    return f"{_p()}:tenant:weights"


def liveness_since() -> str:
    """String: Redis time from which this Redis has held worker liveness."""
    return f"{_p()}:liveness:since"


def worker(node: str) -> str:
    """Hash: a Celery node's liveness fields (heartbeat, consumed)."""
    return f"{_p()}:worker:{node}"


def ratelimit(bucket_id: str) -> str:
    return f"{_p()}:ratelimit:{bucket_id}"


def lost_job_cursor() -> str:
    """Where the lost-job scan of pending rows stopped (app/maintenance/recovery.py)."""
    return f"{_p()}:maint:lost_cursor"
