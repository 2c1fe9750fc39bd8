"""The model calls this worker process has in flight, and what stops them (docs/architecture.md, "Calls that
stop").

A call is registered for its whole exchange with its job, its attempt and an ``Abort`` (app/infra/http/deadline.py).
It is stopped as soon as its attempt is no longer its own: a stop notice (app/infra/redis/events.py publish_stop,
published by the effects of a cancel, a timeout, an admin's fail or recovery) reaches the process's one watcher at
once; the same thread re-reads the rows of its calls every ``CHECK_SECONDS`` (a lost notice, a Redis that was away).
Stopping shuts the call's socket down both ways: the upstream sees the connection close, and one that aborts a
request whose client went away (vLLM) stops computing.

Invariants:
- One watcher thread per process, started with its first call (again in a forked child); it never holds a call
  up: a call registers and unregisters under a lock held for a dict operation.
- A call is stopped only when its row is no longer running at its attempt (or it was told so by a notice naming
  that attempt): a call that is still its job's own is never stopped.
- A stopped call writes nothing for its job (the row is not its attempt's); its worker reports the call's end
  (app/jobs/effects.py call_ended), so the permit and the charge settle at the call's real end.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from sqlalchemy import String, any_, bindparam, cast, select
from sqlalchemy.dialects.postgresql import ARRAY

from app.infra.db import single_statement
from app.infra.http.deadline import Abort
from app.infra.process import PerProcess
from app.infra.redis import events, keys
from app.infra.tables import tasks
from app.states import JobState

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5  # a call whose stop notice was lost is stopped within this (plus one read) of its row moving

_ROWS = select(tasks.c.id, tasks.c.state, tasks.c.attempt).where(
    tasks.c.id == any_(cast(bindparam("ids"), ARRAY(String))))


@dataclass
class Call:
    job_id: str
    attempt: int
    abort: Abort = field(default_factory=Abort)
    since: float = field(default_factory=time.monotonic)


class _Calls:
    """This process's calls in flight and the thread that watches them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, Call] = {}
        threading.Thread(target=self._watch, name="asynch-call-stops", daemon=True).start()

    def stop(self, job_id: str, attempt: int | None, reason: str) -> bool:
        with self.lock:
            call = self.calls.get(job_id)
        if call is None or (attempt is not None and call.attempt != attempt):
            return False
        if call.abort.stop(reason):
            log.info("call stopped: %s", reason, extra={"job_id": job_id, "attempt": attempt})
        return True

    def _watch(self) -> None:
        """Stop notices as they come, and the row checks every CHECK_SECONDS (also while Redis is away: they
        still stop what must stop)."""
        last_check = time.monotonic()

        def notice(data: str) -> None:
            job_id, _, attempt = data.partition(" ")
            self.stop(job_id, int(attempt) if attempt.isdigit() else None, "its job was ended")

        def tick() -> None:
            nonlocal last_check
            if time.monotonic() - last_check >= CHECK_SECONDS:
                last_check = time.monotonic()
                self._check_rows()
        events.listen(f"asynch-stops-{os.getpid()}", keys.stop_channel(), notice, "stop notices", CHECK_SECONDS,
                      tick)

    def _check_rows(self) -> None:
        """Stop every call (older than one check) whose row moved on without it."""
        with self.lock:
            old = {c.job_id: c for c in self.calls.values() if time.monotonic() - c.since >= CHECK_SECONDS}
        if not old:
            return
        try:
            with single_statement() as conn:
                rows = {r.id: r for r in conn.execute(_ROWS, {"ids": list(old)})}
        except Exception as exc:  # the database is away: nothing can be known; the next check tries again
            log.warning("could not read the calls' rows: %s", exc)
            return
        for job_id, call in old.items():
            row = rows.get(job_id)
            if row is None or row.state != JobState.RUNNING or row.attempt != call.attempt:
                self.stop(job_id, call.attempt, "its job is no longer running this attempt")


_calls: PerProcess[_Calls] = PerProcess(_Calls)


@contextmanager
def running(job_id: str, attempt: int) -> Iterator[Abort]:
    """Register a call of ``job_id``'s attempt ``attempt`` for as long as the block runs; yields its ``Abort``
    (hand it to the request)."""
    calls = _calls.get()
    call = Call(job_id, attempt)
    with calls.lock:
        calls.calls[job_id] = call
    try:
        yield call.abort
    finally:
        with calls.lock:
            if calls.calls.get(job_id) is call:
                del calls.calls[job_id]


def in_flight() -> dict[str, int]:
    """job id -> attempt of this process's calls in flight (operators' views, tests)."""
    calls = _calls.peek()
    if calls is None:
        return {}
    with calls.lock:
        return {c.job_id: c.attempt for c in calls.calls.values()}
