"""Beat leadership and the wrapper every periodic task runs through.

Several beats may run; exactly one sends the schedule.  Each tick
``Leadership.refresh()`` takes the Redis lock or renews it if ours, in one
Lua step, so a standby takes over at most ASYNCH_BEAT_LOCK_TTL_SECONDS after
the leader stops.  Every leadership gets a larger fencing token, stamped on
each message it sends; a worker runs a stamped task only while the stamp is
the current leadership (``run_periodic``), so a beat that lost the lock
unawares (paused, partitioned) gets nothing done behind the new leader.
Manual triggers call the services directly: the passes are safe to overlap.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from contextlib import suppress
from typing import Callable

import redis

from app.config import get_settings
from app.infra.redis import leader

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, owner: str | None = None, ttl_seconds: float | None = None):
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.ttl = ttl_seconds if ttl_seconds is not None else get_settings().beat_lock_ttl_seconds
        self.token = 0
        self._checked = float("-inf")

    @property
    def renew_every(self) -> float:
        # Three renewals per TTL: one slow tick does not lose the lock.
        return max(0.2, self.ttl / 3)

    def refresh(self, force: bool = False) -> int:
        """Take or renew the lock (at most every renew_every unless forced).
        Returns the fencing token while leading, else 0."""
        if not force and time.monotonic() - self._checked < self.renew_every:
            return self.token
        before = self.token
        try:
            self.token = leader.leader_acquire(self.owner, self.ttl)
        except redis.RedisError as exc:
            # Leadership cannot be proven without Redis: stand by.
            log.warning("beat lock unavailable, standing by: %s", exc)
            self.token = 0
        self._checked = time.monotonic()
        if self.token != before:
            # Taking the lead is routine (every start); losing it is worth a WARNING.
            log.log(logging.INFO if self.token else logging.WARNING, "beat %s %s", self.owner,
                    f"leads (fencing token {self.token})" if self.token else "stands by")
        return self.token

    def fence(self) -> dict | None:
        """The stamp for a message about to be sent, or None if not leading.
        Renewed right before sending, so the stamp is as fresh as it can be."""
        token = self.refresh(force=True)
        return {"owner": self.owner, "token": token, "sent_at": time.time()} if token else None

    def release(self) -> None:
        with suppress(redis.RedisError):
            if leader.leader_release(self.owner):
                log.info("beat %s released leadership", self.owner)
        self.token = 0


def fence_holds(fence: dict) -> bool:
    return leader.leader_current() == (int(fence.get("token", 0)), str(fence.get("owner")))


def run_periodic(name: str, fence: dict | None, fn: Callable[[], object]) -> dict:
    """One periodic pass, skipped if ``fence`` (the sending beat's stamp; None:
    a direct call) is no longer the leadership; each run is recorded."""
    if fence is not None and not fence_holds(fence):
        log.warning("periodic %s skipped: sent by a beat that no longer leads (token %s)",
                    name, fence.get("token"))
        return {"skipped": "fenced"}
    started = time.time()
    out = fn()
    out = out.as_dict() if hasattr(out, "as_dict") else out
    entry = {"task": name, "ran_at": started, "took": round(time.time() - started, 4),
             "processed": out.get("processed") if isinstance(out, dict) else None}
    if fence is not None:
        entry.update(owner=fence.get("owner"), token=fence.get("token"), sent_at=fence.get("sent_at"))
    with suppress(redis.RedisError):  # the history is for operators: the pass itself ran
        leader.record_beat_run(json.dumps(entry), get_settings().beat_history_size)
    if entry["processed"]:
        # The one INFO line of a routine pass, and only when it did something: celery's own
        # lines for these tasks are DEBUG (app/infra/logs.py quiet_routine_tasks).
        log.info("periodic %s: %s", name, json.dumps(out, default=str))
    else:
        log.debug("periodic %s: nothing to do", name)
    return out


def recent_runs(limit: int = 100) -> list[dict]:
    return [json.loads(x) for x in leader.beat_history(limit)]
