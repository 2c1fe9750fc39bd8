"""GET /v1/models/{model}/jobs/{id}/stream: a job's output as server-sent events, live while it runs, replayed
from the stored result once it is done (docs/api.md, "Streamed output"; the cuts: app/jobs/output.py).

Events: ``attempt`` (id ``<a>-0``, data: {"attempt", "content_type"}) when an attempt starts its output (a retry
starts it anew); ``output`` (id ``<a>-<end>``, data: the event's text as the upstream sent it); at the end
``done`` (id ``end``, data: the poll body) or ``error`` (id ``end``, data: the poll body of a job that ended
otherwise).  Last-Event-ID ``<a>-<o>`` resumes after that event, ``end`` answers the end again, anything else
starts from the beginning.

Invariants:
- The stored result is the truth: once the job is done, every output event after the cursor comes from it (cut as
  the live ones were, so the ids line up); a live view that was lost (a Redis wipe, a notice missed) costs delay,
  never a chunk of a job that ends done.
- Live entries are taken in offset order only: an entry whose ``p`` is not the cursor's offset means some were
  missed; they are read back from the job's Redis stream (XRANGE) before it is sent.
- No per-stream polling of Redis: entries come with the process's one listener (app/infra/wakeups.py); the
  stream reads Redis itself at its start and on a gap only.  The job's row comes from the job poller and the
  terminal wake-ups, as an event stream's (app/jobs/events.py).
- Every open stream holds one place under the waiter caps and ASYNCH_EVENTS_STREAMS_PER_TENANT for its life.
"""
from __future__ import annotations

from functools import partial
from typing import Iterator

from app.contract import dump
from app.errors import Gone, Unavailable
from app.infra.redis import keys
from app.infra.redis.client import get_redis
from app.infra.wakeups import GONE, begin_wait, hub
from app.jobs import events, output, service as jobs
from app.jobs.event_feeds import readers
from app.jobs.events import Event, Stream
from app.jobs.schemas import JobStatus
from app.states import RESULT_STATES, JobState, is_terminal
from app.tenancy.keys import Principal


def job_output(principal: Principal, job_id: str, model_name: str | None, last_id: str | None,
               watch=None) -> Stream:
    """The job's output after ``last_id``; the caps are checked and the job read (404) before this returns."""
    read = partial(jobs.get_job, principal, job_id, model_name)
    cursor = _Cursor.parse(last_id)
    row, w = begin_wait(job_id, read, principal.tenant_id, jobs.waiter_cap(principal), keep=True, stream=True,
                        output=True)
    readers.get().watch_job(w)
    leave = partial(readers.get().unwatch_job, w)
    return Stream(events.follow(w, watch, _passes(principal, w, row, read, cursor), leave), w, leave)


class _Cursor:
    """Where the client is: the attempt whose output it follows and the offset it has (``end``: it saw the end)."""

    def __init__(self, attempt: int = 0, offset: int = -1, end: bool = False) -> None:
        self.attempt, self.offset, self.end = attempt, offset, end

    @classmethod
    def parse(cls, last: str | None) -> "_Cursor":
        if (last or "").strip() == "end":
            return cls(end=True)
        got = output.entry_id(last or "")
        return cls(*got) if got else cls()

    def begin(self, attempt: int, content_type: str) -> Iterator[Event]:
        """The ``attempt`` event, unless the client is in that attempt already."""
        if attempt != self.attempt or self.offset < 0:
            self.attempt, self.offset = attempt, 0
            yield Event(f"{attempt}-0", "attempt", {"attempt": attempt, "content_type": content_type})

    def entry(self, eid: str, fields: dict) -> tuple[list[Event], bool]:
        """The events a live entry brings; False: a gap before it (read the stream back from the cursor)."""
        got = output.entry_id(eid)
        if got is None:
            return [], True
        attempt, end = got
        if attempt < self.attempt or (attempt == self.attempt and end <= self.offset):
            return [], True  # older, or sent already
        if "a" in fields:
            return list(self.begin(attempt, fields["a"])), True
        if attempt != self.attempt or str(fields.get("p")) != str(self.offset):
            return [], False
        self.offset = end
        return [Event(eid, "output", fields.get("d", ""))], True


def _live(r, job_id: str, cur: _Cursor, entries: list) -> Iterator[Event]:
    """The events of delivered entries, a gap filled from the job's stream (XRANGE after the cursor)."""
    for eid, fields in entries:
        evs, ok = cur.entry(eid, fields)
        if not ok:
            yield from _read_back(r, job_id, cur)
            evs, _ = cur.entry(eid, fields)
        yield from evs


def _read_back(r, job_id: str, cur: _Cursor) -> Iterator[Event]:
    start = f"({cur.attempt}-{cur.offset}" if cur.offset >= 0 else f"{max(cur.attempt, 0)}-0"
    try:
        got = r.xrange(keys.job_output(job_id), min=start, count=10_000)
    except Exception:
        return  # derived state away: the stored result will do
    for eid, fields in got:
        evs, ok = cur.entry(eid, fields)
        if not ok:
            return
        yield from evs


def _passes(principal: Principal, w, row, read, cur: _Cursor) -> Iterator[Event | None]:
    r = get_redis()
    if cur.end and is_terminal(row.state):
        yield _end(row)
        return
    cur.end = False
    if not (is_terminal(row.state) and JobState(row.state) in RESULT_STATES):
        yield from _read_back(r, row.id, cur)  # a done job's output comes from its stored result
    while not is_terminal(row.state):
        yield from _live(r, row.id, cur, hub.take_output(w))
        yield None
        got = w.take()
        if got is GONE:
            row = read()
        elif got is not None:
            row = got
    yield from _live(r, row.id, cur, hub.take_output(w))
    if JobState(row.state) in RESULT_STATES:
        yield from _replay(principal, row, cur)
    yield _end(row)


def _replay(principal: Principal, row, cur: _Cursor) -> Iterator[Event]:
    """The stored result's events after the cursor (the whole output if the cursor is in another attempt)."""
    try:
        body = jobs.whole(jobs.result_body(principal, row.id, row.model_name))
    except (Gone, Unavailable):
        return  # no longer kept (or storage away): the end event says how the job ended
    ctype = row.result_content_type or "application/octet-stream"
    yield from cur.begin(row.attempt, output.mime(ctype))
    for end, data in output.events_of(body, ctype):
        if end > cur.offset:
            cur.offset = end
            yield Event(f"{row.attempt}-{end}", "output", output.text(data))


def _end(row) -> Event:
    return Event("end", "done" if JobState(row.state) in RESULT_STATES else "error",
                 dump(JobStatus.from_row(row)))
