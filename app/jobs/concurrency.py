"""maxConcurrency (seed 002): a Redis semaphore per tenant+model.

A permit is a lease in a sorted set (app/semaphore.SEM_ACQUIRE) that
expires on its own after the attempt's lease time (model timeout + grace, the
same bound as the running row's lease), so a worker killed while holding one
cannot leak it.  No renewal is needed: an attempt that outlives its lease is
treated as dead by recovery anyway.

A job that finds no permit is not an attempt: its row stays pending with the
same attempt number, and its message re-publishes itself a little later
instead of holding a worker process while it waits.
"""
from __future__ import annotations

import logging
import random
import secrets
from dataclasses import dataclass

import redis

from app.config import get_settings
from app.infra.redis import semaphore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Permit:
    model: str
    tenant: str
    lease_id: str


def acquire(model: str, tenant: str, cap: int, job_id: str, attempt: int, ttl_seconds: float) -> Permit | None:
    # Unique per call: a duplicate delivery racing for the same attempt must
    # not be able to release the winner's permit.
    lease_id = f"{job_id}:{attempt}:{secrets.token_hex(4)}"
    try:
        d = semaphore.semaphore_acquire(model, tenant, lease_id, cap, ttl_seconds)
    except redis.RedisError:
        log.warning("semaphore unavailable; the job waits", extra={"job_id": job_id})
        return None
    return Permit(model, tenant, lease_id) if d.acquired else None


def release(permit: Permit) -> None:
    try:
        semaphore.semaphore_release(permit.model, permit.tenant, permit.lease_id)
    except redis.RedisError:
        # The lease expires by itself.
        log.warning("permit release failed; it expires with its lease")


def keep_waiting(job_id: str, attempt: int, chain_token: str | None) -> bool:
    """Should this message re-deliver itself?  False when another message for
    the same attempt is already waiting its turn (at most one chain per
    attempt, so recovery's re-publishes cannot multiply the polling)."""
    if not chain_token:
        return True
    ttl = max(60.0, 20 * get_settings().permit_retry_seconds)
    try:
        return semaphore.permit_wait_hold(job_id, attempt, chain_token, ttl)
    except redis.RedisError:
        return True


def retry_countdown() -> float:
    """Seconds until a permit-less job tries again; jittered so waiting jobs
    do not come back in lockstep."""
    return get_settings().permit_retry_seconds * random.uniform(0.5, 1.5)
