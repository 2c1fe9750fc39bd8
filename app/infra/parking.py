"""Parked long-polls: a ``/wait`` that must sleep is kept as a small record
(its socket, its waiter, a timer) instead of a request greenlet, and is
answered by the wake-up hub with bytes rendered once per job.

Why (docs/architecture.md, "Serving"): 10,000 waits that each keep a
request greenlet alive keep ~60 objects each (environ, Flask request,
frames, watchers) in an API worker's heap.  The collector walks them, and
its pauses were another tenant's submit p99; a woken wait cost ~1 ms of
CPU (Flask, two writes, close).  A parked wait is ~6 objects, and its
answer is one ``send`` of prepared bytes.

How, under gunicorn's gevent worker (app/web/gunicorn_conf.py installs it):
- The route does the whole first half as usual: auth, caps, the first read
  (app/infra/wakeups.py ``begin_wait``), and renders the response it would
  send for that row, through every after-request hook.  If the job is not
  terminal it calls ``park`` with the waiter and a ``render`` function.
- ``ParkingMiddleware`` keeps the status line and headers the app gave
  (Content-Length and Connection replaced), duplicates the client socket,
  and tells the worker the request is handled (``PARKED``): gunicorn closes
  its own descriptor and its greenlet ends; the duplicate keeps the
  connection open.
- The record is answered once (``_answer`` is idempotent) by the first of:
  a delivered terminal row (the hub calls ``Waiter.on_wake``), its budget's
  end (a libev timer: the last row seen, as ``wait_for_terminal`` returns
  it), a row that is gone (404, rendered by the route), the server
  draining (``drain``, at SIGTERM and before the worker exits), or the
  client hanging up (a libev io watcher: no answer, the place is freed).

Invariants:
- No lost wake-up: the waiter was registered before the first read, and a
  row delivered between that read and ``park`` is in ``waiter.row``, which
  ``park`` settles right after hooking ``on_wake``.
- Every parked wait gives its place under the caps back exactly once
  (``_close``), whichever way it ends.
- Nothing here blocks the hub: libev callbacks only spawn a greenlet.
"""
from __future__ import annotations

import logging
from email.utils import formatdate
from typing import Callable

from app.infra import metrics
from app.infra.serving import stop_watcher
from app.states import is_terminal

log = logging.getLogger(__name__)

ENVIRON_KEY = "asynch.park"
CAN_PARK_KEY = "asynch.can_park"


class _Parked:
    """The sentinel a parked request's WSGI call returns."""

    def close(self) -> None:  # a WSGI iterable may be closed; nothing to do
        pass

    def __iter__(self):
        return iter(())


PARKED = _Parked()

# Every open parked wait of this process (drain answers them all).
_open: set["ParkedWait"] = set()


def can_park(environ: dict) -> bool:
    return bool(environ.get(CAN_PARK_KEY))


def park(environ: dict, waiter, row, budget_seconds: float, render: Callable, release: Callable) -> None:
    """Ask the server to park this request after the app has rendered its
    response.  ``render(row, job_id)`` -> (status line, body bytes) for a
    row (or ``GONE``), called outside any request; ``release(waiter)`` gives
    the place back."""
    environ[ENVIRON_KEY] = (waiter, row, budget_seconds, render, release)


class ParkedWait:
    __slots__ = ("waiter", "sock", "head", "row", "render", "release", "timer", "watcher", "done", "__weakref__")

    def __init__(self, waiter, sock, head: bytes, row, render, release) -> None:
        self.waiter = waiter
        self.sock = sock
        self.head = head
        self.row = row
        self.render = render
        self.release = release
        self.timer = None
        self.watcher = None
        self.done = False

    # -- the three ways in --------------------------------------------------
    def start(self, budget_seconds: float) -> None:
        from gevent import get_hub

        loop = get_hub().loop
        _open.add(self)
        self.timer = loop.timer(max(0.0, budget_seconds))
        self.timer.start(self._in_hub, self._expired)
        self.watcher = loop.io(self.sock.fileno(), 1)
        self.watcher.start(self._in_hub, self._client_readable)
        self.waiter.on_wake = self._woken
        if self.waiter.row is not None:  # delivered between the first read and now
            self._woken(self.waiter)

    @staticmethod
    def _in_hub(fn: Callable[[], None]) -> None:
        # libev callbacks run in the hub, which must never block: hand over.
        import gevent

        gevent.spawn(fn)

    def _woken(self, waiter) -> None:
        from app.infra.wakeups import GONE

        got = waiter.take()
        if self.done:
            return
        if got is None:
            from app.infra.wakeups import hub

            if hub.draining:  # the server stops: answer with what we have
                self._answer(self.render(self.row, self.waiter.job_id))
            return
        if got is GONE:
            self._answer(self.render(GONE, self.waiter.job_id))
            return
        self.row = got
        if is_terminal(got.state):
            self._answer(self.render(got, self.waiter.job_id))

    def _expired(self) -> None:
        if not self.done:
            self._answer(self.render(self.row, self.waiter.job_id))

    def _client_readable(self) -> None:
        if self.done:
            return
        import socket

        raw = getattr(self.sock, "_sock", self.sock)
        try:
            data = raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return  # spurious; the watcher is level-triggered and still armed
        except OSError:
            data = b""
        if data:
            # A pipelined next request: the client is there.  Stop watching;
            # it is answered (with Connection: close) as any other.
            stop_watcher(self, "watcher")
            return
        self._close()  # the client hung up: its place comes back now

    # -- the one way out ----------------------------------------------------
    def _answer(self, rendered: tuple[str, bytes]) -> None:
        if self.done:
            return
        status, body = rendered
        date = formatdate(usegmt=True).encode("ascii")
        data = b"".join((b"HTTP/1.1 ", status.encode("latin-1"), b"\r\nDate: ", date, b"\r\n", self.head,
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body), body))
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # the client left meanwhile
        finally:
            self._close()

    def _close(self) -> None:
        if self.done:
            return
        self.done = True
        _open.discard(self)
        self.waiter.on_wake = None
        stop_watcher(self, "watcher")
        t, self.timer = self.timer, None
        if t is not None:
            t.stop()
            t.close()
        try:
            self.sock.close()
        except OSError:
            pass
        self.release(self.waiter)


def drain() -> None:
    """Answer every parked wait now with the row it has (the server stops)."""
    for p in list(_open):
        try:
            p._answer(p.render(p.row, p.waiter.job_id))
        except Exception:  # one bad socket must not keep the others waiting
            log.exception("answering a parked wait at drain failed")
            p._close()


def open_count() -> int:
    return len(_open)


# Response headers the parked answer sets itself.
_OWN_HEADERS = {"content-length", "connection", "transfer-encoding", "date", "server"}


class ParkingMiddleware:
    """WSGI middleware of a gevent worker: a request the app asked to park
    (``park``) is not answered now; its socket is kept, and ``PARKED`` tells
    the worker not to write anything (app/web/gunicorn_conf.py)."""

    def __init__(self, app, server: str = "") -> None:
        self.app = app
        # The headers the server adds to every response it writes itself.
        self.server_header = b"Server: %s\r\n" % server.encode("latin-1") if server else b""

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
            # An after-request hook turned the answer into an error: send
            # that as it is, and wait for nothing.
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
        _status, headers = captured
        head = self.server_header + b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in headers if k.lower() not in _OWN_HEADERS)
        ParkedWait(waiter, sock, head, row, render, release).start(budget)
        metrics.wait_parked()
        return PARKED
