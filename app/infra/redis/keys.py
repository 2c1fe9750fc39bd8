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


def semaphore(model: str, tenant: str) -> str:
    return f"{_p()}:sem:{model}:{tenant}"


def permit_wait(job_id: str, attempt: int) -> str:
    return f"{_p()}:permit_wait:{job_id}:{attempt}"


def worker(node: str) -> str:
    """Hash: a Celery node's liveness fields (heartbeat, consumed)."""
    return f"{_p()}:worker:{node}"


def ratelimit(bucket_id: str) -> str:
    return f"{_p()}:ratelimit:{bucket_id}"
