"""The shared readers behind the event streams (app/jobs/events.py): per API process, one tenant feed for
each (tenant scope, model) with open tenant streams, and one job poller for every open job stream.  An open
stream reads nothing of its own per tick: before, each read its rows every ASYNCH_EVENTS_POLL_SECONDS, and
200 streams of one tenant (200 SELECTs a second) raised another tenant's GET /v1/jobs p95 from 13-22 ms to
55-186 ms (issue 32 item 8).

Invariants:
- A tenant feed's pass reads, page after page (in (updated_at, id) order), the rows changed since its start
  -- LATE_SECONDS before its previous pass began, as a commit can land a little behind a newer one --
  renders each row once, and offers every page to the streams subscribed when the pass began; a stream keeps
  what is after its own cursor and not sent yet.  A row that commits at t is read by the first pass that
  begins after t (that pass starts LATE_SECONDS before its predecessor began, and the predecessor began
  before t), so a stream that subscribes before its own catch-up read (events.py) misses nothing in between.
- A stream whose unsent changes pass MAX_BEHIND is cut off (it ends; its client resumes with Last-Event-ID and
  catches up on reads of its own): a slow client never makes the process buffer without bound.
- The job poller reads every streamed job once a tick, FETCH_BATCH ids per SELECT, by id (a stream checked
  that its caller may see the job when it opened; a row's tenant and model never change), and hands each row
  to its streams' waiters under the wake-up hub's lock, never over a terminal row a wake-up delivered.
- A reader runs while it has subscribers and ends after the last one leaves; a failed read is logged and tried
  again the next tick (the streams send keep-alives meanwhile).
- Per process: a forked child starts with no reader (app/infra/process.py).
- A tenant feed's pass also reads what holds the scope's waiting jobs (the WAITING_TRACK first in queue order,
  app/jobs/waiting.py) and offers a ``waiting`` event for each whose reason changed since its previous pass
  (or that it sees for the first time): id ``<now µs>.<job_id>``, not replayed on a resume (a poll has the
  current one).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterator

from sqlalchemy import select, tuple_

from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.contract import dump
from app.infra.db import single_statement
from app.infra.process import PerProcess
from app.infra.tables import read_at, tasks
from app.infra.wakeups import FETCH_BATCH, GONE, Waiter, hub
from app.jobs import service as jobs, waiting
from app.jobs.schemas import JobStatus, WaitingOn
from app.states import JobState, is_terminal, v1_name

log = logging.getLogger(__name__)

LATE_SECONDS = 2.0
TENANT_PAGE = 500  # rows per SELECT of a tenant's changes
MAX_BEHIND = 20 * TENANT_PAGE  # changes a stream may have offered and not yet sent
WAITING_TRACK = 200  # a feed's waiting jobs whose reason it follows (the first in queue order)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# What a job event and a poll body show: never the payload.
_COLUMNS = [tasks.c[n] for n in ("id", "model_name", "tenant_id", "state", "attempt", "retry_count", "error",
                                 "result_size", "result_content_type", "priority", "created_at", "started_at",
                                 "finished_at", "updated_at")]

Change = tuple[str, tuple[datetime, str], str, dict]  # (event id, its (updated_at, job id) key, event, data)


def changed_page(scope: str | None, model_name: str | None, after: tuple[datetime, str]) -> list:
    """The next page of rows after the pair ``after`` in (updated_at, id) order: a page boundary inside one
    timestamp loses nothing."""
    q = jobs.scoped(select(*_COLUMNS, read_at()), scope, model_name or None)
    at, job_id = after
    # The plain bound is the index range (tenant_id, updated_at); the row value orders within one timestamp.
    q = q.where(tasks.c.updated_at >= at, tuple_(tasks.c.updated_at, tasks.c.id) > tuple_(at, job_id))
    with single_statement() as conn:
        return conn.execute(q.order_by(tasks.c.updated_at, tasks.c.id).limit(TENANT_PAGE)).all()


def change(row) -> Change:
    """A tenant stream's event of a row: id ``<updated_at µs>.<job_id>``, the poll body and the tenant."""
    at = as_utc(row.updated_at)
    micros = (at - EPOCH) // timedelta(microseconds=1)
    return (f"{micros}.{row.id}", (at, row.id), v1_name(row.state),
            {**dump(JobStatus.from_row(row)), "tenant": row.tenant_id})


def pages(scope: str | None, model_name: str | None, start: datetime,
          stop: Callable[[], bool] = lambda: False) -> Iterator[list[Change]]:
    """The changes from ``start`` to the newest row, a page at a time (read lazily), until ``stop()``."""
    pos = (start, "")
    while True:
        rows = changed_page(scope, model_name, pos)
        yield [change(r) for r in rows]
        if len(rows) < TENANT_PAGE or stop():
            return
        pos = (as_utc(rows[-1].updated_at), rows[-1].id)  # a full page: on from the pair


def waiting_changes(scope: str | None, model_name: str | None, last: dict[str, str]) -> list[Change]:
    """``waiting`` events of the scope's waiting jobs whose reason differs from ``last`` (job -> reason), which
    becomes what was seen now."""
    c = tasks.c
    q = jobs.scoped(select(c.id, c.model_name, c.tenant_id, c.state, c.error, c.updated_at, c.next_retry_at),
                    scope, model_name or None)
    with single_statement() as conn:
        rows = conn.execute(q.where(c.state.in_([int(JobState.PENDING), int(JobState.RETRY_WAIT)]))
                            .order_by(c.enqueue_at, c.id).limit(WAITING_TRACK)).all()
    held = waiting.of_rows(rows) if rows else {}
    at = clock_now()
    micros = (at - EPOCH) // timedelta(microseconds=1)
    out, seen = [], {}
    for r in rows:
        w = held.get(r.id)
        if w is None:
            continue
        seen[r.id] = w["reason"]
        if last.get(r.id) != w["reason"]:
            out.append((f"{micros}.{r.id}", (at, r.id), "waiting",
                        {"job_id": r.id, "model": r.model_name, "state": v1_name(r.state), "tenant": r.tenant_id,
                         "waiting_on": dump(WaitingOn.model_construct(**w))}))
    last.clear()
    last.update(seen)
    return out


class Subscription:
    """One tenant stream's place at its feed: the pages offered and not yet taken."""

    def __init__(self, waiter: Waiter) -> None:
        self.waiter, self.feed = waiter, None
        self.lock = threading.Lock()
        self.pending: deque[tuple[list[Change], datetime | None]] = deque()
        self.behind = 0
        self.cut = False  # fell MAX_BEHIND behind: the stream ends

    def offer(self, changes: list[Change], next_start: datetime | None) -> None:
        """``changes`` of a pass; ``next_start``: the pass ended, and no later pass reads before it."""
        with self.lock:
            if self.cut:
                return
            self.behind += len(changes)
            if self.behind > MAX_BEHIND:
                self.cut, self.behind = True, 0
                self.pending.clear()
            else:
                self.pending.append((changes, next_start))
        self.waiter.event.set()

    def take(self) -> list[tuple[list[Change], datetime | None]]:
        with self.lock:
            out, self.behind = list(self.pending), 0
            self.pending.clear()
        return out


class _TenantFeed:
    def __init__(self, readers: "_Readers", key: tuple[str | None, str | None]) -> None:
        self.readers, self.key = readers, key
        self.subs: set[Subscription] = set()
        self.wake = threading.Event()
        self.start = clock_now() - timedelta(seconds=LATE_SECONDS)
        self.reasons: dict[str, str] = {}  # waiting job -> its reason at the previous pass

    def run(self) -> None:
        late = timedelta(seconds=LATE_SECONDS)
        while True:
            with self.readers.lock:
                if not self.subs:
                    if self.readers.feeds.get(self.key) is self:
                        del self.readers.feeds[self.key]
                    return
                subs = list(self.subs)
            began = clock_now()
            try:
                for page in pages(*self.key, self.start):
                    if page:
                        for sub in subs:
                            sub.offer(page, None)
                if held := waiting_changes(*self.key, self.reasons):
                    for sub in subs:
                        sub.offer(held, None)
            except Exception as exc:  # the database away: the streams keep their places, the next tick retries
                log.warning("event feed could not read: %s", str(exc).splitlines()[0][:200])
            else:
                self.start = max(self.start, began - late)  # never back: a clock that moved back re-sends nothing
                for sub in subs:
                    sub.offer([], self.start)
            self.wake.wait(get_settings().events_poll_seconds)
            self.wake.clear()


class _Readers:
    """This process's feeds and job poller."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.feeds: dict[tuple[str | None, str | None], _TenantFeed] = {}
        self.jobs: dict[str, set[Waiter]] = {}
        self.polling = False
        self.poll_wake = threading.Event()

    def subscribe(self, scope: str | None, model_name: str | None, waiter: Waiter) -> Subscription:
        """A place at the feed of (scope, model), started if there is none."""
        sub, key = Subscription(waiter), (scope, model_name or None)
        with self.lock:
            feed = self.feeds.get(key)
            if feed is None:
                feed = self.feeds[key] = _TenantFeed(self, key)
                threading.Thread(target=feed.run, name="asynch-events-feed", daemon=True).start()
            feed.subs.add(sub)
            sub.feed = feed
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            sub.feed.subs.discard(sub)
            if not sub.feed.subs:
                sub.feed.wake.set()  # it ends now rather than after its next pass

    def watch_job(self, w: Waiter) -> None:
        with self.lock:
            self.jobs.setdefault(w.job_id, set()).add(w)
            if not self.polling:
                self.polling = True
                threading.Thread(target=self._poll_jobs, name="asynch-events-jobs", daemon=True).start()

    def unwatch_job(self, w: Waiter) -> None:
        with self.lock:
            ws = self.jobs.get(w.job_id)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self.jobs[w.job_id]

    def _poll_jobs(self) -> None:
        while True:
            self.poll_wake.wait(get_settings().events_poll_seconds)
            self.poll_wake.clear()
            with self.lock:
                if not self.jobs:
                    self.polling = False
                    return
                ids = sorted(self.jobs)
            try:
                rows = read_jobs(ids)
            except Exception as exc:
                log.warning("event job poller could not read %d job(s): %s", len(ids), str(exc).splitlines()[0][:200])
                continue
            with self.lock:
                targets = [(w, rows.get(job_id, GONE)) for job_id in ids for w in self.jobs.get(job_id, ())]
            with hub.lock:  # as the hub delivers: a terminal row it handed over stays
                for w, row in targets:
                    if not (w.row is not None and w.row is not GONE and is_terminal(w.row.state)):
                        w.row = row
            for w, _row in targets:
                w.event.set()


def read_jobs(ids: list[str]) -> dict[str, object]:
    """The job streams' rows by id, FETCH_BATCH ids per SELECT."""
    out = {}
    with single_statement() as conn:
        for i in range(0, len(ids), FETCH_BATCH):
            out.update((r.id, r) for r in conn.execute(select(*_COLUMNS, read_at())
                                                       .where(tasks.c.id.in_(ids[i:i + FETCH_BATCH]))))
    return out


readers: PerProcess[_Readers] = PerProcess(_Readers)
