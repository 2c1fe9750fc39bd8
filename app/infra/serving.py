"""What the API's serving model needs below the web layer: knowing whether this process runs on gevent, making psycopg2
cooperative there, the collector and descriptor limits, and noticing that a long-polling client went away.

Invariants:
- Under gevent (the API's default worker class) nothing may block the hub: sockets, locks, sleeps and threads are
  gevent's (patched first: app/web/gunicorn_gevent.py), and psycopg2, whose C code talks to libpq's socket directly,
  waits through psycogreen's callback (``make_green``), installed before the process's first connection.
- ``ClientWatch`` never reads a byte of the request stream: it only peeks, and a pipelined next request disarms it
  (the wait goes on unwatched).
- Outside gevent (gthread, werkzeug in tests) the watch is polled by the waiting thread.
"""
from __future__ import annotations

import gc
import logging
import resource
import select
import socket
import sys
from typing import Callable

log = logging.getLogger(__name__)

# Outside gevent a waiting thread checks its client this often.
POLL_CLIENT_SECONDS = 1.0


def is_green() -> bool:
    if "gevent" not in sys.modules:
        return False
    from gevent import monkey

    return bool(monkey.is_module_patched("socket"))


def make_green() -> bool:
    """Install psycogreen's wait callback when this process is green (a query yields to the hub
    while PostgreSQL works).  Idempotent; False (nothing done) outside gevent."""
    if not is_green():
        return False
    from psycogreen.gevent import patch_psycopg

    patch_psycopg()
    return True


# Collector thresholds of an API worker (CPython's defaults: 700, 10, 10).
GC_THRESHOLDS = (10_000, 2, 100)


def tune_gc() -> None:
    """Make full collections rare and young ones short in an API worker, after its app is loaded:
    10,000 waits are hundreds of thousands of long-lived objects, and CPython's defaults ran a
    full collection (0.2-0.5 s, no greenlet runs) at each 25% growth.  ``gc.freeze()`` hides what
    is loaded; the young threshold is a pause length: at 10,000 under 10 ms, at 50,000 30-120 ms,
    another tenant's submit p99 (bench/bench_waiters.py, docs/architecture.md "Serving")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never above the hard limit, never lowered): every
    waiting client holds a socket, and the usual soft default is 1,024. Returns (soft, hard) as set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < wanted:
        log.warning("RLIMIT_NOFILE is %s (hard %s), below the %s descriptors this process may need: raise the "
                    "hard limit (ulimit -Hn, compose ulimits) or lower --worker-connections", soft, hard, wanted)
    return soft, hard


def stop_watcher(owner, attr: str) -> None:
    """Stop and close the libev watcher or timer at ``owner.<attr>`` once (None from then on)."""
    w = getattr(owner, attr)
    setattr(owner, attr, None)
    if w is not None:
        w.stop()
        w.close()


class ClientWatch:
    """Notices that the client of a waiting request closed its connection.  ``arm(wake)``: under gevent the hub
    calls ``wake()`` once the socket turns readable (one libev io watcher); ``gone()`` then tells EOF or a reset
    from a pipelined next request.  Outside gevent the waiter polls ``gone()`` every ``poll_seconds``."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._watcher = None
        self._wake: Callable[[], None] | None = None
        self._readable = self._disarmed = False
        self.poll_seconds: float | None = POLL_CLIENT_SECONDS

    def arm(self, wake: Callable[[], None]) -> None:
        if not is_green():
            return
        from gevent import get_hub

        self._wake = wake
        self._watcher = get_hub().loop.io(self._fd, 1)
        self._watcher.start(self._on_readable)
        self.poll_seconds = None

    def _on_readable(self) -> None:
        self._readable = True
        stop_watcher(self, "_watcher")  # level-triggered: once is enough until gone() looked
        if self._wake is not None:
            self._wake()

    def gone(self) -> bool:
        if self._disarmed or (self.poll_seconds is None and not self._readable):
            return False  # disarmed, or the hub has reported nothing: still connected
        if self.poll_seconds is not None:
            p = select.poll()  # not select(): descriptors above 1023 are normal here
            p.register(self._fd, select.POLLIN)
            if not p.poll(0):
                return False
        self._readable = False
        # A peek, never a read.  gevent's socket object waits for readiness inside recv() even with
        # MSG_DONTWAIT; the real socket it wraps never blocks.
        try:  # True: a pipelined request (it is there); False: EOF (it is gone)
            there = bool(getattr(self._sock, "_sock", self._sock).recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            there = None  # nothing yet: a spurious wake-up
        except OSError:
            there = False  # a reset: gone
        if there is None and self._wake is not None:  # a spurious report: watch again
            self.arm(self._wake)
        elif there:  # a pipelined request: the client is there; stop watching
            self._disarmed = True
            stop_watcher(self, "_watcher")
        return there is False

    def close(self) -> None:
        self._wake = None
        stop_watcher(self, "_watcher")


def client_watch(environ: dict) -> ClientWatch | None:
    """A watch on the request's client socket, when the server exposes it (gunicorn, werkzeug)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    try:
        return None if sock is None else ClientWatch(sock)
    except (OSError, ValueError):  # closed already
        return None

