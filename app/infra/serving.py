"""What the API's serving model needs below the web layer: knowing whether
this process runs on gevent, making psycopg2 cooperative there, the file
descriptor limit, and noticing that a long-polling client went away.

Invariants:
- Under gevent (the API's default worker class) nothing may block the hub:
  sockets, locks, queues, sleeps and threads are gevent's (monkey-patched
  before anything else is imported: app/web/gunicorn_gevent.py), and
  psycopg2, whose C code talks to libpq's socket directly, waits through
  psycogreen's callback (``make_green``), installed before the first
  connection of the process.
- ``ClientWatch`` never reads a byte of the request stream: it only peeks,
  and a pipelined next request disarms it (the wait goes on unwatched).
- Outside gevent (gthread, werkzeug's threaded server in tests) the same
  code runs on OS threads; the watch is then polled by the waiter.
"""
from __future__ import annotations

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
    """True when this process runs on gevent with the socket module patched
    (a gunicorn gevent worker; the gevent config patches its master too)."""
    if "gevent" not in sys.modules:
        return False
    from gevent import monkey

    return bool(monkey.is_module_patched("socket"))


def make_green() -> bool:
    """Install psycogreen's wait callback when this process is green, so a
    query yields to the hub while PostgreSQL works.  Idempotent; False (and
    nothing done) outside gevent."""
    if not is_green():
        return False
    from psycogreen.gevent import patch_psycopg

    patch_psycopg()
    return True


# Collector thresholds of an API worker (CPython's defaults: 700, 10, 10).
GC_THRESHOLDS = (10_000, 2, 100)


def tune_gc() -> None:
    """Make full collections rare and young ones short in an API worker,
    after its app is loaded.

    A parked long-poll keeps its request's objects (environ, request, frames,
    watchers: ~60 per wait) alive for its whole budget: 10,000 waits are
    hundreds of thousands of long-lived objects per process.  With the
    default thresholds CPython ran a full collection at each 25% growth of
    them, 0.2-0.5 s each in which no greenlet runs.  ``gc.freeze()`` moves
    everything loaded so far (modules, the app) out of the collector's
    sight; full collections follow only every 200 young ones.  The young
    threshold is a pause length: at 50,000 each gen-0 collection took 30-120
    ms on a 2-core host and was another tenant's submit p99; at 10,000 with
    gen 1 every 2 they take under 10 ms, gen-1 ones 30-100 ms every ~0.7 s
    (bench/bench_waiters.py, docs/architecture.md "Serving").  Cycles are
    still collected.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never above the hard
    limit; never lowered).  Every waiting client holds a socket: 10,000
    waiters need 10,000 descriptors in one process, and the usual soft
    default is 1,024.  Returns (soft, hard) as set."""
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
    """Stop and close the libev io watcher at ``owner.<attr>`` once: the
    attribute is None from then on (parked answers share it)."""
    w = getattr(owner, attr)
    setattr(owner, attr, None)
    if w is not None:
        w.stop()
        w.close()


class ClientWatch:
    """Notices that the client of a waiting request closed its connection.

    ``arm(wake)`` makes the hub call ``wake()`` as soon as the socket turns
    readable (under gevent: one libev io watcher, no greenlet); ``gone()``
    then tells EOF or a reset from a pipelined next request.  Outside gevent
    nothing calls ``wake``: the waiter polls ``gone()`` every
    ``poll_seconds``.
    """

    def __init__(self, sock) -> None:
        # gevent's socket object waits for readiness inside recv() even with
        # MSG_DONTWAIT; peek on the real socket it wraps, which never blocks.
        self._sock = getattr(sock, "_sock", sock)
        self._fd = sock.fileno()
        self._watcher = None
        self._wake: Callable[[], None] | None = None
        self._readable = False
        self._disarmed = False
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
        if self._disarmed:
            return False
        if self.poll_seconds is None:
            if not self._readable:
                return False  # the hub has reported nothing: still connected
        else:
            p = select.poll()  # not select(): descriptors above 1023 are normal here
            p.register(self._fd, select.POLLIN)
            if not p.poll(0):
                return False
        self._readable = False
        try:
            data = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            if self._wake is not None:  # a spurious report: watch again
                self.arm(self._wake)
            return False
        except OSError:
            return True  # reset by the peer
        if data:
            # A pipelined request: the client is there; stop watching.
            self._disarmed = True
            stop_watcher(self, "_watcher")
            return False
        return True

    def close(self) -> None:
        self._wake = None
        stop_watcher(self, "_watcher")


def client_watch(environ: dict) -> ClientWatch | None:
    """A watch on the request's client socket, when the server exposes it
    (gunicorn: ``gunicorn.socket``; werkzeug's server: ``werkzeug.socket``)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None:
        return None
    try:
        sock.fileno()
    except (OSError, ValueError):
        return None
    return ClientWatch(sock)

