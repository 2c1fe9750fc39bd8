"""Long-poll wake-ups: one Redis pub/sub listener per API process.

The same listener also carries cache invalidations (revoked keys, changed
models) so every API process drops its per-process caches at once.

A waiter registers (the "subscribe") before it reads the job, so a terminal
commit is either visible to that read or its wake-up arrives afterwards
(DESIGN.md invariant 7).  Workers publish only after the terminal commit.
When the listener's connection drops, everything published meanwhile may be
lost, so on every (re)subscribe all waiters are woken to read again, and
while the listener is not subscribed waiters re-read on a short interval.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import redis

from app.config import get_settings
from app.infra.caches import clear_all as clear_caches
from app.infra.redis.keys import invalidate_channel as invalidate_channel
from app.infra.redis.keys import terminal_channel as terminal_channel
from app.states import is_terminal

log = logging.getLogger(__name__)

# While the listener is down, waiters re-read the row this often.
DEGRADED_POLL_SECONDS = 0.5


class WaitHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._subscribed = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stop = threading.Event()

    # -- listener ---------------------------------------------------------
    def ensure_started(self, ready_timeout: float = 2.0) -> None:
        pid = os.getpid()
        if self._thread is None or self._pid != pid or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or self._pid != pid or not self._thread.is_alive():
                    # After fork the parent's thread does not exist here.
                    self._subscribed = threading.Event()
                    self._stop = threading.Event()
                    self._pid = pid
                    self._thread = threading.Thread(target=self._run, name="asynch-wait-listener", daemon=True)
                    self._thread.start()
        self._subscribed.wait(ready_timeout)

    @property
    def healthy(self) -> bool:
        return self._subscribed.is_set()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        settings = get_settings()
        inval = invalidate_channel()
        backoff = 0.1
        while not self._stop.is_set():
            client = None
            try:
                client = redis.Redis.from_url(settings.redis_url, decode_responses=True,
                                              socket_connect_timeout=5, health_check_interval=15)
                ps = client.pubsub()
                ps.subscribe(terminal_channel(), invalidate_channel())
                # Confirm the subscription before declaring ourselves healthy.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    m = ps.get_message(timeout=0.5)
                    if m and m["type"] == "subscribe" and m["data"] == 2:
                        break
                else:
                    raise redis.ConnectionError("subscribe not confirmed")
                self._subscribed.set()
                clear_caches()  # invalidations may have been missed while away
                self._wake_all()  # and so may wake-ups
                backoff = 0.1
                while not self._stop.is_set():
                    m = ps.get_message(timeout=1.0)
                    if m and m["type"] == "message":
                        if m["channel"] == inval:
                            clear_caches()
                        else:
                            self._wake(m["data"])
            except Exception as exc:  # connection lost: degrade, then reconnect
                if self._subscribed.is_set():
                    log.warning("wait listener lost Redis: %s", exc)
                self._subscribed.clear()
                self._wake_all()
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception:
                        pass

    # -- waiters ----------------------------------------------------------
    def register(self, job_id: str) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(ev)
        return ev

    def unregister(self, job_id: str, ev: threading.Event) -> None:
        with self._lock:
            s = self._waiters.get(job_id)
            if s is not None:
                s.discard(ev)
                if not s:
                    del self._waiters[job_id]

    def waiter_count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._waiters.values())

    def _wake(self, job_id: str) -> None:
        with self._lock:
            evs = list(self._waiters.get(job_id, ()))
        for ev in evs:
            ev.set()

    def _wake_all(self) -> None:
        with self._lock:
            evs = [ev for s in self._waiters.values() for ev in s]
        for ev in evs:
            ev.set()


hub = WaitHub()


def wait_for_terminal(job_id: str, budget_seconds: float, read: Callable[[], object]):
    """Block until ``read()`` returns a terminal row or the budget ends.

    ``read`` loads the job row (raising if it is gone); its last result is
    returned.  The order register -> clear -> read -> wait is what makes a
    wake-up impossible to lose.
    """
    deadline = time.monotonic() + max(0.0, budget_seconds)
    hub.ensure_started()
    ev = hub.register(job_id)
    try:
        while True:
            ev.clear()
            row = read()
            if row is None or is_terminal(row.state):
                return row
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return row
            ev.wait(remaining if hub.healthy else min(remaining, DEGRADED_POLL_SECONDS))
    finally:
        hub.unregister(job_id, ev)
