"""Long-poll wake-ups: one Redis pub/sub listener and one row fetcher per API process, shared by every waiter of the
process.  The same listener carries cache invalidations (revoked keys, changed models): every API process drops its
per-process caches at once.

Invariants (docs/architecture.md invariant 7, "no lost wake-ups"):
- A waiter registers before its first read, then sleeps: a terminal commit is either visible to that read or its
  message (published only after the commit) arrives while it is registered.
- A terminal wake-up carries the committed row's snapshot (``snapshot_message``, published by the transition's
  winner after its commit): only what a poll body and a job event show (``SNAPSHOT_FIELDS``), never the payload, the
  modelKey, the callback URL or a secret.  Only a terminal state is taken (absorbing, so final): it is handed to
  every waiter of the job at once, with no read, and its v1 body is rendered once for all (``Snapshot.v1_body``).
- Single flight, for a bare job id (an older publisher) and after a reconnect: the fetcher reads the fetch set
  (``FETCH_BATCH`` ids per SELECT, started after the message arrived) and hands each row to every waiter of that
  job, by id only (tenant and model never change on a row); a job gone is handed over as GONE and the waiter
  re-reads it itself (its own read says 404).
- On every (re)subscribe all waited jobs are fetched; while unsubscribed, and after a failed fetch, the fetcher
  re-reads them every ``DEGRADED_POLL_SECONDS``, on its own connection.
- Caps: a register past the tenant's or the process's cap (or, for an event stream, the tenant's streams cap)
  raises ``TooManyWaiters`` and counts nothing; every register is matched by one unregister (``finally``), a
  client gone included.
- Live output (app/jobs/output.py): the same listener hands each notice's entries to the job's output waiters
  (registered before their first read of the job's Redis stream, so an entry is in that read or in a notice they
  get); a notice is not even parsed while no waiter of the process watches output.
- Fork: the whole state is per process (app/infra/process.py).
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import Counter
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Callable, Iterator

import redis
from sqlalchemy import select

from app.config import get_settings
from app.errors import TooManyWaiters
from app.infra import metrics
from app.infra.caches import clear_all as clear_caches
from app.infra.db import make_engine
from app.infra.process import PerProcess
from app.infra.redis.client import pubsub_client
from app.infra.redis.keys import invalidate_channel, output_channel, terminal_channel
from app.infra.tables import read_at, tasks
from app.states import is_terminal

log = logging.getLogger(__name__)

DEGRADED_POLL_SECONDS = 0.5  # while the listener is down, the fetcher re-reads every waited job this often
FETCH_BATCH = 500  # job ids per SELECT ... WHERE id IN (...)
RETRY_AFTER_SECONDS = 1  # a 429's Retry-After at a waiter cap: waits end when jobs end, unpredictable
LISTENER_NAME = "asynch-wait-listener"

GONE = object()  # the job's row no longer exists: the waiter re-reads it itself

SNAPSHOT_FIELDS = ("id", "model_name", "tenant_id", "state", "attempt", "retry_count", "error", "result_size",
                   "result_content_type", "priority")
SNAPSHOT_TIMES = ("created_at", "started_at", "finished_at", "updated_at")


def snapshot_message(row) -> str:
    """The wake-up message (JSON) for a row that just became terminal, after its commit."""
    out = {f: getattr(row, f, None) for f in (*SNAPSHOT_FIELDS, *SNAPSHOT_TIMES)}
    out.update((f, out[f].isoformat()) for f in SNAPSHOT_TIMES if out[f] is not None)
    return json.dumps(out, separators=(",", ":"))


class Snapshot:
    """A terminal row as a wake-up carried it.  ``v1_body`` memoises the rendered poll body: every
    waiter of the job sends the same bytes."""

    __slots__ = (*SNAPSHOT_FIELDS, *SNAPSHOT_TIMES, "v1_body")

    def __init__(self, data: dict) -> None:
        for f in SNAPSHOT_FIELDS:
            setattr(self, f, data.get(f))
        for f in SNAPSHOT_TIMES:
            setattr(self, f, datetime.fromisoformat(data[f]) if data.get(f) else None)
        self.v1_body = None


def parse_snapshot(data: str) -> Snapshot | None:
    """The snapshot in a wake-up message, or None (a bare job id, or junk)."""
    if not data.startswith("{"):
        return None
    try:
        snap = Snapshot(json.loads(data))
    except (ValueError, TypeError, AttributeError):
        return None
    return snap if isinstance(snap.id, str) and is_terminal(snap.state) else None


# Wake-ups never queue behind the process's requests (a burst of new waits, submits) for a
# connection: one more connection per API process.
fetch_engine = PerProcess(lambda: make_engine(get_settings().database_url, autocommit=True, pool_size=1),
                          on_fork=lambda e: e.dispose(close=False))


def read_rows(ids: list[str]) -> dict[str, object]:
    """The rows of ``ids`` by id, FETCH_BATCH ids per SELECT, on the fetcher's connection."""
    out = {}
    with fetch_engine.get().connect() as conn:
        for i in range(0, len(ids), FETCH_BATCH):
            out.update((r.id, r) for r in conn.execute(select(tasks, read_at())
                                                       .where(tasks.c.id.in_(ids[i:i + FETCH_BATCH]))))
    return out


class Waiter:
    """One waiting request.  ``row``: the newest delivered copy (or GONE), None if none since ``take``."""

    __slots__ = ("job_id", "tenant", "seq", "event", "row", "on_wake", "stream", "out")

    def __init__(self, job_id: str, tenant: str, seq: int, stream: bool = False, output: bool = False) -> None:
        self.job_id, self.tenant, self.stream = job_id, tenant, stream
        self.out: list | None = [] if output else None  # a job's live output entries delivered (app/jobs/output.py)
        self.seq = seq  # registration order: a fetch started before it is not delivered to it
        self.event, self.row = threading.Event(), None
        # A parked wait (app/infra/parking.py) blocks nothing on ``event``: this is called instead.
        self.on_wake: Callable[["Waiter"], None] | None = None

    def take(self):
        row, self.row = self.row, None
        return row

    def sleep(self, seconds: float, watch=None) -> bool:
        """Until a wake-up or ``seconds`` (a polled ``watch``: at most its period); False: the client has gone."""
        poll = None if watch is None else watch.poll_seconds
        self.event.wait(seconds if poll is None else min(seconds, poll))
        self.event.clear()
        return watch is None or not watch.gone()

    def wake(self) -> None:
        self.event.set()
        if self.on_wake is not None:
            self.on_wake(self)


class _State:
    """The hub of one process: waiters, caps' counts, the listener and the fetcher."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, set[Waiter]] = {}
        self.per_tenant: Counter[str] = Counter()  # a tenant's count may stay at 0
        self.streams: Counter[str] = Counter()  # the event streams among them
        self.outputs = 0  # the waiters watching a job's live output: none, and output notices are not even parsed
        self.total = 0
        self.seq = 0  # registrations so far
        self.to_fetch: set[str] = set()
        self.fetch_now, self.subscribed = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []
        self.draining = False  # the server is stopping: every wait answers now

    def ensure_started(self, ready_timeout: float = 2.0) -> None:
        with self.lock:
            if not (self.threads and all(t.is_alive() for t in self.threads)):
                self.threads = [threading.Thread(target=self._listen, name=LISTENER_NAME, daemon=True),
                                threading.Thread(target=self._fetch_forever, name="asynch-wait-fetcher", daemon=True)]
                for t in self.threads:
                    t.start()
        self.subscribed.wait(ready_timeout)

    def _listen(self) -> None:
        inval = invalidate_channel()
        backoff = 0.1
        while True:
            client = None
            try:
                client = pubsub_client(f"{LISTENER_NAME}-{os.getpid()}")  # under a cluster: the next node each time
                ps = client.pubsub()
                out = output_channel()
                ps.subscribe(terminal_channel(), inval, out)
                # Confirm the subscription before declaring ourselves healthy.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    m = ps.get_message(timeout=0.5)
                    if m and m["type"] == "subscribe" and m["data"] == 3:
                        break
                else:
                    raise redis.ConnectionError("subscribe not confirmed")
                # Invalidations may have been missed while away: dropped before the hub calls itself
                # healthy, so nothing cached after ensure_started() returns is lost to them.
                clear_caches()
                self.subscribed.set()
                with self.lock:  # wake-ups may have been missed too
                    self.to_fetch.update(self.jobs)
                self.fetch_now.set()
                backoff = 0.1
                while True:
                    m = ps.get_message(timeout=1.0)
                    if m and m["type"] == "message":
                        if m["channel"] == inval:
                            clear_caches()
                        elif m["channel"] == out:
                            self.output(m["data"])
                        else:
                            self.wake(m["data"])
            except Exception as exc:  # connection lost: degrade, then reconnect
                if self.subscribed.is_set():
                    log.warning("wait listener lost Redis: %s", exc)
                self.subscribed.clear()
                self.fetch_now.set()  # the fetcher starts polling
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if client is not None:
                    with suppress(Exception):
                        client.close()

    def wake(self, data: str) -> None:
        """A terminal message: its snapshot goes to the job's waiters now; a bare job id is fetched."""
        snap = parse_snapshot(data)
        if snap is not None:  # final: for every waiter, whenever it registered
            self._deliver({snap.id}, {snap.id: snap}, math.inf)
            return
        with self.lock:
            if data not in self.jobs:
                return  # nobody here waits for it
            self.to_fetch.add(data)
        self.fetch_now.set()

    def output(self, data: str) -> None:
        """Live output entries (app/jobs/output.py notice): appended to the output waiters of their jobs."""
        if not self.outputs:
            return
        try:
            batch = json.loads(data)
        except ValueError:
            return
        woken = []
        with self.lock:
            for job_id, entries in batch.items() if isinstance(batch, dict) else ():
                for w in self.jobs.get(job_id, ()):
                    if w.out is not None:
                        w.out.extend(entries)
                        woken.append(w)
        for w in woken:
            w.wake()

    def _fetch_forever(self) -> None:
        while True:
            self.fetch_now.wait(None if self.subscribed.is_set() else DEGRADED_POLL_SECONDS)
            # Cleared before the ids are taken: a later message's id is in this batch or the next.
            self.fetch_now.clear()
            with self.lock:
                ids = set(self.jobs) if not self.subscribed.is_set() else self.to_fetch & self.jobs.keys()
                self.to_fetch = set()
                seq = self.seq
            if not ids:
                continue
            try:
                rows = read_rows(sorted(ids))
            except Exception as exc:
                log.warning("wait fetcher could not read %d job(s): %s", len(ids), exc)
                with self.lock:
                    self.to_fetch |= ids
                time.sleep(DEGRADED_POLL_SECONDS)
                self.fetch_now.set()
                continue
            self._deliver(ids, rows, seq)

    def _deliver(self, ids: set[str], rows: dict[str, object], seq: float) -> None:
        """Each row to the waiters registered before the read began (a later one read newer)."""
        woken = []
        with self.lock:
            for job_id in ids:
                row = rows.get(job_id, GONE)
                for w in self.jobs.get(job_id, ()):
                    if w.seq <= seq:
                        w.row = row
                        woken.append(w)
        for w in woken:
            w.wake()

    def register(self, job_id: str, tenant: str, tenant_cap: int | None = None, stream: bool = False,
                 output: bool = False) -> Waiter:
        """The hub started, then a place under the caps (the tenant's: None for the settings'), TooManyWaiters past
        them.  Also for an event stream (app/jobs/events.py, ``stream``: also under ASYNCH_EVENTS_STREAMS_PER_TENANT),
        which must ``unregister`` in a ``finally``; ``job_id`` may name no job (a tenant's stream): it is then only
        counted."""
        settings = get_settings()
        self.ensure_started()
        tenant_cap = settings.waiters_per_tenant if tenant_cap is None else tenant_cap
        with self.lock:
            n = self.per_tenant[tenant]
            if stream and self.streams[tenant] >= settings.events_streams_per_tenant:
                limit = settings.events_streams_per_tenant
                metrics.wait_refused("streams")
                raise TooManyWaiters(f"too many open event streams for this tenant on this API process (per-tenant "
                                     f"streams cap {limit}); retry after {RETRY_AFTER_SECONDS} s",
                                     cap="streams", limit=limit, retry_after=RETRY_AFTER_SECONDS)
            for cap, used, limit, whose in (("tenant", n, tenant_cap, "for this tenant "),
                                            ("process", self.total, settings.waiters_max, "")):
                if used >= limit:
                    metrics.wait_refused(cap)
                    raise TooManyWaiters(f"too many concurrent waits {whose}on this API process (per-{cap} cap "
                                         f"{limit}); retry after {RETRY_AFTER_SECONDS} s",
                                         cap=cap, limit=limit, retry_after=RETRY_AFTER_SECONDS)
            self.seq += 1
            w = Waiter(job_id, tenant, self.seq, stream, output)
            self.outputs += output
            self.jobs.setdefault(job_id, set()).add(w)
            self.per_tenant[tenant] = n + 1
            self.streams[tenant] += stream
            self.total += 1
        metrics.waiters(1)
        return w

    def unregister(self, w: Waiter) -> None:
        with self.lock:
            s = self.jobs.get(w.job_id)
            if s is None or w not in s:
                return
            s.discard(w)
            if not s:
                del self.jobs[w.job_id]
            self.per_tenant[w.tenant] -= 1
            self.streams[w.tenant] -= w.stream
            self.outputs -= w.out is not None
            self.total -= 1
        metrics.waiters(-1)

    def take_output(self, w: Waiter) -> list:
        """The output entries delivered to ``w`` since the last take."""
        with self.lock:
            got, w.out = w.out or [], []
        return got

    def drain(self) -> None:
        """The server stops: every current and later wait answers at once with what it has."""
        self.draining = True
        with self.lock:
            woken = [w for ws in self.jobs.values() for w in ws]
        for w in woken:
            w.wake()


class WaitHub:
    """The process's hub: every attribute is this process's ``_State``'s (a forked child has neither the parent's
    threads nor its waiters)."""

    _state: PerProcess[_State] = PerProcess(_State)

    def __getattr__(self, name: str):
        return getattr(self._state.get(), name)


hub = WaitHub()


def wait_for_terminal(job_id: str, budget_seconds: float, read: Callable[[], object], tenant: str = "",
                      tenant_cap: int | None = None, watch=None):
    """Block until the job is terminal or the budget ends; returns the last row seen. ``read`` loads the row as
    the caller may see it.  Order: register (caps) -> read -> sleep; a delivered row replaces a read.  ``watch``
    (app.infra.serving.ClientWatch) ends the wait early when the client has gone."""
    deadline = time.monotonic() + max(0.0, budget_seconds)
    row, w = begin_wait(job_id, read, tenant, tenant_cap)
    if w is None:
        return row
    with holding(w, watch):
        while row is not None and not is_terminal(row.state):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or hub.draining or not w.sleep(remaining, watch):
                break
            got = w.take()
            if got is GONE:
                row = read()
            elif got is not None:
                row = got
    return row


@contextmanager
def holding(w: Waiter, watch=None) -> Iterator[Waiter]:
    """``w``'s place under the caps for the block, given back at its end whatever happens; ``watch``
    (app.infra.serving.ClientWatch) wakes it when the client leaves."""
    if watch is not None:
        watch.arm(w.event.set)
    try:
        yield w
    finally:
        if watch is not None:
            watch.close()
        hub.unregister(w)


def begin_wait(job_id: str, read: Callable[[], object], tenant: str = "", tenant_cap: int | None = None,
               keep: bool = False, stream: bool = False, output: bool = False):
    """The first half of a wait (``wait_for_terminal``'s, a parked one's: app/infra/parking.py, an event stream's):
    register -> read.  ``(row, waiter)``; waiter is None when there is nothing to wait for (terminal, gone, draining;
    never with ``keep``), else the caller owns it (a wake-up from now on is in ``waiter.row``)."""
    w = hub.register(job_id, tenant, tenant_cap, stream, output)
    try:
        row = read()
    except BaseException:
        hub.unregister(w)
        raise
    if not keep and (row is None or is_terminal(row.state) or hub.draining):
        hub.unregister(w)
        return row, None
    return row, w
