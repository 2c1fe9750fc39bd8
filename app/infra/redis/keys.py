"""Every Redis key name, under ASYNCH_REDIS_PREFIX (default ``asynch``).
The runtime override keys are the ones seed 002 documents
(``asynch:runtime:queue_limit:{model}``, ``...:max_concurrency:{model}``)."""
from __future__ import annotations

from app.config import get_settings


def _p() -> str:
    return get_settings().redis_prefix


def gate(model: str) -> str:
    """Sorted set: the job ids holding a slot (pending + running), scored by admission time."""
    return f"{_p()}:gate:{model}"


def runtime_queue_limit(model: str) -> str:
    return f"{_p()}:runtime:queue_limit:{model}"


def runtime_max_concurrency(model: str) -> str:
    return f"{_p()}:runtime:max_concurrency:{model}"


def terminal_channel() -> str:
    """Pub/sub: a job id, published after its terminal commit (long-poll wake-ups)."""
    return f"{_p()}:events:terminal"


def invalidate_channel() -> str:
    """Pub/sub: drop your cached keys/models now."""
    return f"{_p()}:events:invalidate"


def epoch() -> str:
    """Present while this Redis has not lost its data since recovery last
    looked; absent after a wipe (or on first start)."""
    return f"{_p()}:epoch"


def beat_lock() -> str:
    return f"{_p()}:beat:leader"


def beat_token() -> str:
    """Monotonic fencing counter: every new leadership gets a larger token."""
    return f"{_p()}:beat:token"


def beat_history() -> str:
    return f"{_p()}:beat:history"


def tenant_gate(model: str, tenant: str) -> str:
    """Sorted set: the slots of ``model``'s gate that ``tenant`` holds (its share)."""
    return f"{_p()}:tgate:{model}:{tenant}"


def runtime_tenant_queue_limit(model: str) -> str:
    """Runtime override of the per-tenant queue cap, like queue_limit's."""
    return f"{_p()}:runtime:tenant_queue_limit:{model}"


def semaphore(model: str, tenant: str) -> str:
    """Sorted set: the tenant's permits on the model (job id -> lease expiry, Redis time)."""
    return f"{_p()}:sem:{model}:{tenant}"


# --- dispatch (app/infra/redis/dispatch.py): the model's name last, then the tenant's.

def dispatch_ready(model: str, tenant: str) -> str:
    """Sorted set: a tenant's pending jobs waiting for dispatch, by queue order."""
    return f"{_p()}:dq:ready:{model}:{tenant}"


def dispatch_ring(model: str) -> str:
    return f"{_p()}:dq:ring:{model}"


def dispatch_blocked(model: str) -> str:
    return f"{_p()}:dq:blocked:{model}"


def dispatch_pass(model: str) -> str:
    return f"{_p()}:dq:pass:{model}"


def dispatch_inflight(model: str) -> str:
    return f"{_p()}:dq:inflight:{model}"


def dispatch_inflight_info(model: str) -> str:
    return f"{_p()}:dq:info:{model}"


def dispatch_attempts(model: str) -> str:
    """Hash: job -> the attempt it is queued for (the run_job message carries it)."""
    return f"{_p()}:dq:attempt:{model}"


def dispatch_conf(model: str) -> str:
    return f"{_p()}:dq:conf:{model}"


def tenant_weights() -> str:
    """Hash: tenant -> dispatch weight (from asynch_tenant_limits)."""
    return f"{_p()}:tenant:weights"


def worker(node: str) -> str:
    """Hash: a Celery node's liveness fields (heartbeat, consumed)."""
    return f"{_p()}:worker:{node}"


def ratelimit(bucket_id: str) -> str:
    return f"{_p()}:ratelimit:{bucket_id}"


def lost_job_cursor() -> str:
    """Where the lost-job scan of pending rows stopped (app/maintenance/recovery.py)."""
    return f"{_p()}:maint:lost_cursor"
