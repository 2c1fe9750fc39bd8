"""Long-poll wake-ups: one Redis pub/sub listener and one row fetcher per API process, shared by
every waiter of the process.

The same listener also carries cache invalidations (revoked keys, changed models) so every API
process drops its per-process caches at once.

Invariants (docs/architecture.md invariant 7, "no lost wake-ups"):
- A waiter registers before its first read, then sleeps: a terminal commit is either visible to
  that read or its message (workers publish only after the commit) arrives while the waiter is
  registered.
- A terminal wake-up carries the committed terminal row's snapshot (the fields a poll shows;
  never the payload or a secret), published by the transition's winner after its commit
  (``snapshot_message``).  Terminal states are absorbing, so that snapshot is final: it is
  handed to every waiter of the job at once, with no read.  One JSON decode per job per process,
  and the v1 body is rendered once for all its waiters (``Snapshot.v1_body``; the snapshot
  itself: app/infra/wakeup_snapshot.py).
- Single flight, for a message that carries only a job id (an older publisher) and after a
  reconnect: a message for job J puts J in the fetch set; the fetcher reads every job of the set
  in one SELECT per ``FETCH_BATCH`` ids and hands each row to every waiter of that job.  A
  delivered row always comes from a read that started after the message arrived, so it is at
  least as new as the commit that sent it.  10,000 waiters on one job cost one read. The row is
  read by id only: tenant and model never change on a row, so a waiter whose own first read
  could see the job may see every later copy; a job gone meanwhile is handed over as GONE and
  the waiter re-reads it itself (its own read says 404).
- On every (re)subscribe all waited jobs are fetched (messages may have been lost while away);
  while the listener is not subscribed the fetcher re-reads all waited jobs every
  ``DEGRADED_POLL_SECONDS``, batched.  A fetch that fails keeps its ids and is retried after the
  same interval.
- Caps: a register past the tenant's cap or the process's cap raises ``TooManyWaiters`` and
  counts nothing; every register is matched by one unregister (``finally``), including a client
  that went away mid-wait (its ``ClientWatch`` wakes the waiter, which returns at once).
- The fetcher reads on a connection of its own (app/infra/wakeup_snapshot.py ``fetch_engine``),
  so a wake-up never waits for a pooled connection behind the process's requests.
- Fork: the whole state is per process (app/infra/process.py); a child starts with no waiters
  and its own threads.
"""
from __future__ import annotations

import logging
import os
from contextlib import suppress
import threading
import time
from typing import Callable

import redis

from app.config import get_settings, is_cluster_url
from app.errors import TooManyWaiters
from app.infra import metrics
from app.infra.caches import clear_all as clear_caches
from app.infra.process import PerProcess
from app.infra.redis.client import pubsub_client
from app.infra.redis.keys import invalidate_channel as invalidate_channel
from app.infra.redis.keys import terminal_channel as terminal_channel
from app.infra.wakeup_snapshot import fetch_engine, parse_snapshot, read_rows
from app.states import is_terminal

log = logging.getLogger(__name__)

# While the listener is down, the fetcher re-reads every waited job this often.
DEGRADED_POLL_SECONDS = 0.5
# Job ids per SELECT ... WHERE id IN (...).
FETCH_BATCH = 500
# What a 429 for too many waiters tells the client to wait (seconds): waits
# end when jobs end, which is not something we can predict per tenant.
RETRY_AFTER_SECONDS = 1
LISTENER_NAME = "asynch-wait-listener"

GONE = object()  # the job's row no longer exists: the waiter re-reads it itself


class Waiter:
    """One waiting request.  ``row`` is the newest delivered copy (or GONE),
    ``None`` when nothing was delivered since the waiter last took it."""

    __slots__ = ("job_id", "tenant", "seq", "event", "row", "on_wake")

    def __init__(self, job_id: str, tenant: str, seq: int) -> None:
        self.job_id = job_id
        self.tenant = tenant
        self.seq = seq  # registration order: a fetch started before it is not delivered to it
        self.event = threading.Event()
        self.row = None
        # A parked wait (app/infra/parking.py) has no thread or greenlet
        # blocked on ``event``: it is called instead, after ``row`` is set.
        self.on_wake: Callable[["Waiter"], None] | None = None

    def take(self):
        row, self.row = self.row, None
        return row

    def wake(self) -> None:
        self.event.set()
        if self.on_wake is not None:
            self.on_wake(self)


class _State:
    """The hub of one process: waiters, caps' counts, the listener and the fetcher."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.jobs: dict[str, set[Waiter]] = {}
        self.per_tenant: dict[str, int] = {}
        self.total = 0
        self.seq = 0  # registrations so far
        self.to_fetch: set[str] = set()
        self.fetch_now = threading.Event()
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.fetches = 0  # SELECTs the fetcher issued (tests, benchmarks)
        self.draining = False  # the server is stopping: every wait answers now

    def start(self) -> None:
        with self.lock:
            if self.threads and all(t.is_alive() for t in self.threads):
                return
            self.threads = [threading.Thread(target=self._listen, name=LISTENER_NAME, daemon=True),
                            threading.Thread(target=self._fetch_forever, name="asynch-wait-fetcher", daemon=True)]
            for t in self.threads:
                t.start()

    # -- listener ---------------------------------------------------------
    def _listen(self) -> None:
        inval = invalidate_channel()
        backoff = 0.1
        while not self.stop.is_set():
            client = None
            try:
                settings = get_settings()
                if is_cluster_url(settings.redis_url):
                    # A node of its own: the next master on each reconnect.
                    client = pubsub_client(f"{LISTENER_NAME}-{os.getpid()}")
                else:
                    client = redis.Redis.from_url(settings.redis_url, decode_responses=True,
                                                  socket_connect_timeout=5, health_check_interval=15,
                                                  client_name=f"{LISTENER_NAME}-{os.getpid()}")
                ps = client.pubsub()
                ps.subscribe(terminal_channel(), inval)
                # Confirm the subscription before declaring ourselves healthy.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    m = ps.get_message(timeout=0.5)
                    if m and m["type"] == "subscribe" and m["data"] == 2:
                        break
                else:
                    raise redis.ConnectionError("subscribe not confirmed")
                # Invalidations may have been missed while away: caches are
                # dropped before the hub calls itself healthy, so nothing
                # cached after ensure_started() returns is dropped by it.
                clear_caches()
                self.subscribed.set()
                self.fetch_all()  # wake-ups may have been missed too
                backoff = 0.1
                while not self.stop.is_set():
                    m = ps.get_message(timeout=1.0)
                    if m and m["type"] == "message":
                        if m["channel"] == inval:
                            clear_caches()
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
        """A terminal message: its snapshot goes to the job's waiters now;
        a bare job id is fetched."""
        snap = parse_snapshot(data)
        if snap is None:
            self.fetch(data)
            return
        with self.lock:
            woken = list(self.jobs.get(snap.id, ()))
            for w in woken:
                w.row = snap
        for w in woken:
            w.wake()

    # -- fetcher ----------------------------------------------------------
    def fetch(self, job_id: str) -> None:
        with self.lock:
            if job_id not in self.jobs:
                return  # nobody here waits for it
            self.to_fetch.add(job_id)
        self.fetch_now.set()

    def fetch_all(self) -> None:
        with self.lock:
            self.to_fetch.update(self.jobs)
        self.fetch_now.set()

    def _fetch_forever(self) -> None:
        while not self.stop.is_set():
            healthy = self.subscribed.is_set()
            self.fetch_now.wait(None if healthy else DEGRADED_POLL_SECONDS)
            # Cleared before the ids are taken: a message after this line sets
            # it again and its id is either in this batch or the next one.
            self.fetch_now.clear()
            with self.lock:
                ids = set(self.jobs) if not self.subscribed.is_set() else self.to_fetch & self.jobs.keys()
                self.to_fetch = set()
                seq = self.seq
            if not ids:
                continue
            try:
                rows = read_rows(sorted(ids), FETCH_BATCH)
                self.fetches += 1
            except Exception as exc:
                log.warning("wait fetcher could not read %d job(s): %s", len(ids), exc)
                with self.lock:
                    self.to_fetch |= ids
                time.sleep(DEGRADED_POLL_SECONDS)
                self.fetch_now.set()
                continue
            self._deliver(ids, rows, seq)

    def _deliver(self, ids: set[str], rows: dict[str, object], seq: int) -> None:
        """Hand each row to the waiters that registered before the read began
        (a later waiter's own first read is newer than this copy)."""
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

    # -- waiters ----------------------------------------------------------
    def register(self, job_id: str, tenant: str, tenant_cap: int, process_cap: int) -> Waiter:
        with self.lock:
            n = self.per_tenant.get(tenant, 0)
            for cap, used, limit, whose in (("tenant", n, tenant_cap, "for this tenant "),
                                            ("process", self.total, process_cap, "")):
                if used >= limit:
                    metrics.wait_refused(cap)
                    raise TooManyWaiters(f"too many concurrent waits {whose}on this API process (per-{cap} cap "
                                         f"{limit}); retry after {RETRY_AFTER_SECONDS} s",
                                         cap=cap, limit=limit, retry_after=RETRY_AFTER_SECONDS)
            self.seq += 1
            w = Waiter(job_id, tenant, self.seq)
            self.jobs.setdefault(job_id, set()).add(w)
            self.per_tenant[tenant] = n + 1
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
            if not self.per_tenant[w.tenant]:
                del self.per_tenant[w.tenant]
            self.total -= 1
        metrics.waiters(-1)


def _stop_state(state: _State) -> None:
    state.stop.set()
    state.fetch_now.set()


# A forked child has neither the parent's threads nor its waiters.
_state: PerProcess[_State] = PerProcess(_State, on_reset=_stop_state)


class WaitHub:
    """The process's hub (a facade over its per-process state)."""

    def ensure_started(self, ready_timeout: float = 2.0) -> None:
        s = _state.get()
        s.start()
        s.subscribed.wait(ready_timeout)

    @property
    def healthy(self) -> bool:
        return _state.get().subscribed.is_set()

    def waiter_count(self, tenant: str | None = None) -> int:
        s = _state.get()
        with s.lock:
            return s.total if tenant is None else s.per_tenant.get(tenant, 0)

    def fetches(self) -> int:  # SELECTs the fetcher issued (tests, benchmarks)
        return _state.get().fetches

    def register(self, job_id: str, tenant: str, tenant_cap: int, process_cap: int | None = None) -> Waiter:
        """Hold a place under the caps (TooManyWaiters past them) and be woken
        with ``job_id``'s terminal row: an event stream (app/jobs/events.py),
        which must ``unregister`` in a ``finally``.  ``job_id`` may name no
        job (a tenant's stream): it is then only counted."""
        return _register(job_id, tenant, tenant_cap, process_cap)[1]

    def unregister(self, w: Waiter) -> None:
        _state.get().unregister(w)

    @property
    def draining(self) -> bool:
        return _state.get().draining

    def drain(self) -> None:
        """The server is shutting down: every current and later wait of this
        process answers at once with the state it has (as at its budget's
        end), so a graceful stop is not held up by long-polls."""
        s = _state.get()
        s.draining = True
        with s.lock:
            woken = [w for ws in s.jobs.values() for w in ws]
        for w in woken:
            w.wake()

    def reset(self) -> None:
        """Stop this process's listener and fetcher and forget every waiter
        (tests: a fresh hub on the next use)."""
        _state.reset()
        fetch_engine.reset()


hub = WaitHub()


def _register(job_id: str, tenant: str, tenant_cap: int | None, process_cap: int | None) -> tuple[_State, Waiter]:
    """The hub started, then a place under the caps (None: the settings')."""
    settings = get_settings()
    hub.ensure_started()
    s = _state.get()
    return s, s.register(job_id, tenant, settings.waiters_per_tenant if tenant_cap is None else tenant_cap,
                         settings.waiters_max if process_cap is None else process_cap)


def wait_for_terminal(job_id: str, budget_seconds: float, read: Callable[[], object], tenant: str = "",
                      tenant_cap: int | None = None, process_cap: int | None = None, watch=None):
    """Block until the job is terminal or the budget ends; returns the last
    row seen (it may then still be pending/running).

    ``read`` loads the job row as the caller may see it (raising if it is
    not there).  Order: register (the caps are checked here, before any
    read) -> read -> sleep; a delivered row replaces a read.  ``watch`` (an
    app.infra.serving.ClientWatch) ends the wait early when the client has
    gone; the row read so far is returned to nobody.
    """
    deadline = time.monotonic() + max(0.0, budget_seconds)
    s, w = _register(job_id, tenant, tenant_cap, process_cap)
    try:
        if watch is not None:
            watch.arm(w.event.set)
        row = read()
        while True:
            if row is None or is_terminal(row.state):
                return row
            remaining = deadline - time.monotonic()
            if remaining <= 0 or s.draining:
                return row
            poll = watch.poll_seconds if watch is not None else None
            w.event.wait(remaining if poll is None else min(remaining, poll))
            w.event.clear()
            if watch is not None and watch.gone():
                return row
            got = w.take()
            if got is GONE:
                row = read()
            elif got is not None:
                row = got
    finally:
        if watch is not None:
            watch.close()
        s.unregister(w)


def begin_wait(job_id: str, read: Callable[[], object], tenant: str = "", tenant_cap: int | None = None,
               process_cap: int | None = None):
    """The first half of a wait, for a server that parks it
    (app/infra/parking.py): register (caps) -> read, as ``wait_for_terminal``
    does.  Returns ``(row, waiter)``: ``waiter`` is None when there is nothing
    to wait for (terminal, gone, draining); otherwise it stays registered and
    the caller owns it (a wake-up from now on is in ``waiter.row``)."""
    s, w = _register(job_id, tenant, tenant_cap, process_cap)
    try:
        row = read()
    except BaseException:
        s.unregister(w)
        raise
    if row is None or is_terminal(row.state) or s.draining:
        s.unregister(w)
        return row, None
    return row, w
