"""Job event streams (server-sent events): one job's state changes, or every
job of a tenant, resumable with Last-Event-ID.

Invariants:
- The row is the truth: events are derived from job rows, never kept
  elsewhere, so nothing a stream shows can disagree with a poll.
- A job's stream: its states form one line, pending (attempt 0) -> running
  (1) -> [pending (1) -> running (2) ...] -> a terminal state; an event's id
  is its place on that line (pending of attempt a: 2a, running: 2a-1; the
  terminal one ``end``, with the full poll body, ending the stream).  A stream
  sends every place after the last id up to the row's, so a state passed
  while the client was away is still sent; resuming after ``end`` answers it again.
- A tenant's stream: an event per job change (the poll body and ``tenant``),
  id ``<updated_at µs>.<job_id>``, in (updated_at, id) order, read in pages
  keyed by that pair, so rows sharing one timestamp are all sent and a
  Last-Event-ID among them resumes right after its row.  It subscribes to its
  (tenant, model) feed first, then catches up from its cursor with reads of its
  own; from then on the feed's passes (re-reading from ``LATE_SECONDS`` before
  the previous one began: a commit can land a little behind a newer one) bring
  its rows: at-least-once, a client dedupes by id.
- No stream reads on its own per tick: a job stream's rows come from the job
  poller, a tenant stream's from its feed (app/jobs/event_feeds.py), one read
  per process and tick whatever the number of streams.
- Tenant-scoped: a caller sees only its own tenant's jobs (admins: any).
- Every open stream holds one place under the waiter caps (app/jobs/service.py)
  and under ASYNCH_EVENTS_STREAMS_PER_TENANT for its whole life, checked before
  anything is read or sent (429), given back (with its place at a reader) in a
  ``finally``.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Callable, Iterator

from app.clock import now as clock_now
from app.config import get_settings
from app.contract import dump
from app.errors import NotFound
from app.infra.wakeups import GONE, begin_wait, holding, hub
from app.jobs import service as jobs
from app.jobs.event_feeds import EPOCH, LATE_SECONDS, Subscription, pages, readers
from app.jobs.schemas import JobStatus
from app.states import JobState, is_terminal, v1_name
from app.tenancy.keys import Principal


@dataclass(frozen=True)
class Event:
    id: str | None      # None: a keep-alive
    event: str = ""
    data: dict | str | None = None  # str: text sent as it is (render)


KEEPALIVE = Event(None)


class Stream:
    """An open stream: its events, and ``close`` (idempotent), which gives
    its place under the caps and at its reader back even if it was never iterated."""

    def __init__(self, events: Iterator[Event], waiter, leave: Callable[[], None]) -> None:
        self._events, self._waiter, self._leave = events, waiter, leave

    def __iter__(self) -> Iterator[Event]:
        return self._events

    def close(self) -> None:
        self._events.close()
        self._leave()
        hub.unregister(self._waiter)


def place(row) -> int:
    """The row's place on its job's line; a terminal row's is the last non-terminal
    place it passed: running of its last attempt (or pending, if it never ran)."""
    if is_terminal(row.state):
        return 2 * row.attempt - 1 if row.attempt >= 1 else 0
    return 2 * row.attempt - 1 if row.state == JobState.RUNNING else 2 * row.attempt  # retry_wait shows as pending


def parse_job_id(last: str | None) -> int | str:
    """A job stream's Last-Event-ID: -1 (none, or junk: from the start), a place, or "end"."""
    last = (last or "").strip()
    if last == "end":
        return "end"
    # isascii: "²" is a digit to str.isdigit but not to int().
    return int(last) if last.isascii() and last.isdigit() else -1


def _since(row, after: int) -> list[Event]:
    """The events after place ``after`` up to the row's current state."""
    out = []
    for k in range(after + 1, place(row) + 1):
        name, attempt = ("running", (k + 1) // 2) if k % 2 else ("pending", k // 2)
        out.append(Event(str(k), name, {"job_id": row.id, "model": row.model_name, "state": name, "attempt": attempt}))
    if is_terminal(row.state):
        out.append(Event("end", v1_name(row.state), dump(JobStatus.from_row(row))))
    return out


def job_events(principal: Principal, job_id: str, model_name: str | None, last_id: str | None, watch=None) -> Stream:
    """One job's events after ``last_id``; the caps are checked and the job
    read (404) before this returns, the rest as the iterator is consumed."""
    read = partial(jobs.get_job, principal, job_id, model_name)
    last = parse_job_id(last_id)  # before the place is taken: nothing may raise between the two
    row, w = begin_wait(job_id, read, principal.tenant_id, jobs.waiter_cap(principal), keep=True, stream=True)
    readers.get().watch_job(w)  # last: nothing between taking the places and handing them to the Stream may raise
    leave = partial(readers.get().unwatch_job, w)
    return Stream(follow(w, watch, _job_passes(w, row, read, last), leave), w, leave)


def _job_passes(w, row, read, last) -> Iterator[Event | None]:
    """The job's events since ``last``, then None (the pass is over) and the row the job poller
    or a wake-up delivered meanwhile (the same row if none: nothing new)."""
    if last == "end":
        last = place(row) if is_terminal(row.state) else -1
    while True:
        for ev in _since(row, last):
            yield ev
            if ev.id != "end":
                last = int(ev.id)
        yield None
        got = w.take()
        if got is GONE:
            row = read()  # deleted (its own read says 404, which ends the stream)
        elif got is not None:
            row = got


def follow(w, watch, passes: Iterator[Event | None], leave: Callable[[], None]) -> Iterator[Event]:
    """A stream's life: the events of ``passes`` (None ends a pass: a keep-alive
    when due, a pause until woken) up to ``end``, the client gone (``watch``), ASYNCH_EVENTS_MAX_SECONDS
    or a drain; its places under the caps and at its reader back at the end."""
    s = get_settings()
    with holding(w, watch):
        try:
            t0 = quiet_since = time.monotonic()
            for ev in passes:
                if ev is not None:
                    yield ev
                    quiet_since = time.monotonic()
                    if ev.id == "end":
                        return
                    continue
                if _ending(t0, s):
                    return
                if time.monotonic() - quiet_since >= s.events_keepalive_seconds:
                    yield KEEPALIVE
                    quiet_since = time.monotonic()
                if not w.sleep(min(s.events_poll_seconds, s.events_keepalive_seconds), watch):
                    return
        except NotFound:
            return  # deleted meanwhile (cleanup): nothing more will happen
        finally:
            leave()


def _ending(t0: float, s) -> bool:
    return time.monotonic() - t0 >= s.events_max_seconds or hub.draining


# --- a tenant's stream -------------------------------------------------------------------


def parse_tenant_cursor(last: str | None) -> tuple[datetime, str] | None:
    """A tenant stream's Last-Event-ID: ``<updated_at µs>.<job_id>``, or
    ``<updated_at µs>`` alone (from that instant's first row); None (junk: from now)."""
    micros, _, job_id = (last or "").strip().partition(".")
    if not (micros.isascii() and micros.isdigit()) or len(micros) > 18:
        return None
    try:  # integer microseconds: a float would round a cursor onto its neighbour
        return EPOCH + timedelta(microseconds=int(micros)), job_id
    except OverflowError:
        return None


def tenant_events(principal: Principal, model_name: str | None, last_id: str | None,
                  tenant: str | None = None, watch=None) -> Stream:
    """The events of the tenant's jobs (of ``model_name`` if given) changed
    after ``last_id`` (none: from now); caps checked before this returns."""
    scope = tenant if principal.is_admin else principal.tenant_id
    cursor = parse_tenant_cursor(last_id) or (clock_now(), "")
    w = hub.register(f"tenant-stream:{principal.tenant_id}", principal.tenant_id, jobs.waiter_cap(principal),
                     stream=True)
    # Subscribed before its catch-up read (event_feeds' invariant); last: nothing between taking the
    # places and handing them to the Stream may raise.
    sub = readers.get().subscribe(scope, model_name, w)
    leave = partial(readers.get().unsubscribe, sub)
    return Stream(follow(w, watch, _tenant_passes(scope, model_name, cursor, sub), leave), w, leave)


def _tenant_passes(scope, model_name, cursor, sub: Subscription) -> Iterator[Event | None]:
    s = get_settings()
    sent: dict[str, datetime] = {}  # event id -> its time, within the late window

    def fresh(changes) -> Iterator[Event]:
        for ev_id, key, name, data in changes:
            if ev_id in sent or key <= cursor:
                continue  # sent already, or before the client's own cursor
            sent[ev_id] = key[0]
            yield Event(ev_id, name, data)

    # The catch-up: from LATE_SECONDS before the cursor to the newest row, on reads of its own.
    t0 = time.monotonic()
    for page in pages(scope, model_name, cursor[0] - timedelta(seconds=LATE_SECONDS), lambda: _ending(t0, s)):
        yield from fresh(page)
    while True:
        for changes, next_start in sub.take():
            yield from fresh(changes)
            if next_start is not None:  # no later pass reads before it
                sent = {k: t for k, t in sent.items() if t >= next_start}
        if sub.cut:
            return  # too far behind its feed: the client resumes with Last-Event-ID
        yield None


def render(ev: Event) -> str:
    """One event in text/event-stream form."""
    if ev.id is None:
        return ": keep-alive\n\n"
    if isinstance(ev.data, str):  # text (a job's output): a data line per line, the client joins them with \n
        lines = "".join(f"data: {line}\n" for line in _LINES.split(ev.data))
        return f"id: {ev.id}\nevent: {ev.event}\n{lines}\n"
    return f"id: {ev.id}\nevent: {ev.event}\ndata: {json.dumps(ev.data, separators=(',', ':'))}\n\n"


_LINES = re.compile(r"\r\n|\r|\n")
