"""Parked long-polls: a ``/wait`` that must sleep is kept as a small record (its socket, its waiter, a timer) instead
of a request greenlet, and is answered by the wake-up hub with bytes rendered once per job.

Why (docs/architecture.md, "Serving"): a waiting greenlet keeps ~60 objects in the heap, and at 10,000 waits the
collector's pauses were another tenant's submit p99; a parked wait is ~6.

How, under gunicorn's gevent worker (app/web/gunicorn_conf.py installs ``ParkingMiddleware``):
the route does the first half (auth, caps, the first read: app/infra/wakeups.py ``begin_wait``), renders its
response through every after-request hook and, if the job is not terminal, calls ``park``.  The middleware keeps the
headers, duplicates the client socket, returns ``PARKED``. The record is answered once by the first of: a delivered
terminal row (``Waiter.on_wake``), its budget's end (a libev timer: the last row seen), a row gone (404, rendered by
the route), the server draining (``drain``), or the client hanging up (a libev io watcher: no answer).

Invariants:
- No lost wake-up: the waiter was registered before the first read, and a row delivered between that read and
  ``park`` is in ``waiter.row``, settled right after ``on_wake`` is hooked.
- Every parked wait gives its place under the caps back exactly once (``_close``).
- Nothing here blocks the hub: libev callbacks only spawn a greenlet.
"""
from __future__ import annotations

import logging
from contextlib import suppress
from email.utils import formatdate
from typing import Callable

from app.infra import metrics
from app.infra.serving import ClientWatch, stop_watcher
from app.states import is_terminal

log = logging.getLogger(__name__)

ENVIRON_KEY = "asynch.park"
CAN_PARK_KEY = "asynch.can_park"


class _Parked(tuple):
    """The sentinel a parked request's WSGI call returns: an empty body that may be closed."""

    def close(self) -> None:
        pass


PARKED = _Parked()

_open: set["ParkedWait"] = set()  # every open parked wait of this process (drain answers them all)


def can_park(environ: dict) -> bool:
    return bool(environ.get(CAN_PARK_KEY))


def park(environ: dict, waiter, row, budget_seconds: float, render: Callable, release: Callable) -> None:
    """Park this request once the app has rendered its response.  ``render(row, job_id)`` -> (status line, body
    bytes) for a row or GONE, outside any request; ``release(waiter)`` gives the place back."""
    environ[ENVIRON_KEY] = (waiter, row, budget_seconds, render, release)


class ParkedWait:
    __slots__ = ("waiter", "sock", "head", "row", "render", "release", "timer", "watch", "done", "__weakref__")

    def __init__(self, waiter, sock, head: bytes, row, render, release, budget_seconds: float) -> None:
        import gevent

        self.waiter, self.sock, self.head, self.row = waiter, sock, head, row
        self.render, self.release = render, release
        self.done = False
        loop = gevent.get_hub().loop
        _open.add(self)
        # libev callbacks run in the hub, which must never block: each hands over to a greenlet.
        self.timer = loop.timer(max(0.0, budget_seconds))
        self.timer.start(gevent.spawn, self._expired)
        self.watch = ClientWatch(self.sock)
        self.watch.arm(lambda: gevent.spawn(self._client_readable))
        self.waiter.on_wake = self._woken
        if self.waiter.row is not None:  # delivered between the first read and now
            self._woken(self.waiter)

    def _woken(self, waiter) -> None:
        from app.infra.wakeups import GONE, hub

        got = waiter.take()
        if self.done or (got is None and not hub.draining):  # draining: answer with what we have
            return
        if got is not None and got is not GONE:
            self.row = got
            if not is_terminal(got.state):
                return
        self._answer(self.render(GONE if got is GONE else self.row, self.waiter.job_id))

    def _expired(self) -> None:
        if not self.done:
            self._answer(self.render(self.row, self.waiter.job_id))

    def _client_readable(self) -> None:
        # A pipelined next request stops the watch (it is answered, with Connection: close, as any other).
        if not self.done and self.watch.gone():
            self._close()  # the client hung up: its place comes back now

    def _answer(self, rendered: tuple[str, bytes]) -> None:
        if self.done:
            return
        status, body = rendered
        date = formatdate(usegmt=True).encode("ascii")
        data = b"".join((b"HTTP/1.1 ", status.encode("latin-1"), b"\r\nDate: ", date, b"\r\n", self.head,
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body), body))
        try:
            with suppress(OSError):  # the client left meanwhile
                self.sock.sendall(data)
        finally:
            self._close()

    def _close(self) -> None:
        if self.done:
            return
        self.done = True
        _open.discard(self)
        self.waiter.on_wake = None
        self.watch.close()
        stop_watcher(self, "timer")
        with suppress(OSError):
            self.sock.close()
        self.release(self.waiter)


def drain() -> None:
    """Answer every parked wait now with the row it has (the server stops)."""
    for p in list(_open):
        try:
            p._answer(p.render(p.row, p.waiter.job_id))
        except Exception:  # one bad socket must not keep the others waiting
            log.exception("answering a parked wait at drain failed")
            p._close()


_OWN_HEADERS = {"content-length", "connection", "transfer-encoding", "date", "server"}  # the answer sets them


class ParkingMiddleware:
    """WSGI middleware of a gevent worker: a request the app asked to ``park`` is not answered
    now; its socket is kept, and ``PARKED`` tells the worker to write nothing."""

    def __init__(self, app, server: str = "") -> None:
        self.app = app
        self.server_header = b"Server: %s\r\n" % server.encode("latin-1") if server else b""  # as the server's own

    def __call__(self, environ: dict, start_response):
        environ[CAN_PARK_KEY] = "gunicorn.socket" in environ
        captured: list = []

        def capture(status, headers, exc_info=None):
            if ENVIRON_KEY in environ:
                captured[:] = [status, headers]
                return lambda _data: None
            return start_response(status, headers, exc_info)

        try:
            result = self.app(environ, capture)
        except BaseException:
            spec = environ.pop(ENVIRON_KEY, None)
            if spec is not None:
                spec[4](spec[0])  # the place comes back
            raise
        spec = environ.pop(ENVIRON_KEY, None)
        if spec is None:
            return result
        waiter, row, budget, render, release = spec
        if not captured or not captured[0].startswith("200"):
            # An after-request hook turned the answer into an error: send that as it is, and wait for nothing.
            release(waiter)
            if captured:
                start_response(*captured)
            return result
        if hasattr(result, "close"):
            result.close()  # the app's teardown (request log, metrics) runs now
        try:
            sock = environ["gunicorn.socket"].dup()
        except (KeyError, OSError):
            release(waiter)
            raise
        head = self.server_header + b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
                                             for k, v in captured[1] if k.lower() not in _OWN_HEADERS)
        ParkedWait(waiter, sock, head, row, render, release, budget)
        metrics.wait_parked()
        return PARKED
