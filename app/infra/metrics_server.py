"""A worker node's metrics port, served from threads of the node's main process: ``GET /metrics`` (app/infra/metrics.py
``render``, behind ASYNCH_METRICS_TOKEN) and ``GET /healthz`` (``ok``, no token, no data: for probes).

Invariants:
- It binds ASYNCH_WORKER_METRICS_BIND, 127.0.0.1 unless a deployment says otherwise (plain HTTP).
- At most ASYNCH_WORKER_METRICS_MAX_CONNECTIONS at once: one beyond is closed on accept.
- A connection has ASYNCH_WORKER_METRICS_TIMEOUT_SECONDS in all to send its request head (one deadline: a client
  dribbling a byte at a time is cut too), then as long for each write of the answer; an incomplete head is dropped
  unanswered.  One GET per connection (HTTP/1.0).
- Never fatal: a port in use is logged; the node works, unscraped.
"""
from __future__ import annotations

import io
import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from app.config import get_settings
from app.infra.metrics import render, token_problem

log = logging.getLogger(__name__)

# A scrape's head is a few hundred bytes; anything longer is not Prometheus.
MAX_HEAD_BYTES = 16 * 1024


def _node_app(environ, start_response):
    path = environ.get("PATH_INFO")
    if path == "/healthz":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok\n"]
    if path != "/metrics":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics\n"]
    problem = token_problem(environ.get("HTTP_AUTHORIZATION", ""))
    if problem:
        start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
        return [problem.encode() + b"\n"]
    body, ctype = render("node")
    start_response("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]


def _read_head(sock: socket.socket, timeout: float) -> bytes:
    """The request head, read under one deadline; b"" if incomplete in time, too long or gone."""
    deadline = time.monotonic() + timeout
    head = b""
    while b"\r\n\r\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0 or len(head) > MAX_HEAD_BYTES:
            return b""
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except OSError:  # socket.timeout included
            return b""
        if not chunk:
            return b""
        head += chunk
    return head


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    # Connections over the cap are accepted and closed at once: a deep backlog keeps a burst from stalling SYNs.
    request_queue_size = 128

    def __init__(self, address, max_connections: int, timeout: float):
        self.read_timeout = timeout
        self._slots = threading.BoundedSemaphore(max(1, max_connections))
        self.refused = 0  # connections closed over the cap (tests read it)
        super().__init__(address, _Handler)
        self.set_app(_node_app)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(WSGIRequestHandler):
    def setup(self):
        super().setup()
        head = _read_head(self.connection, self.server.read_timeout)
        self.connection.settimeout(self.server.read_timeout)  # bounds each write of the answer
        # The head is all a GET has; an empty one ends the connection unanswered (an empty request line).
        self.rfile.close()
        self.rfile = io.BufferedReader(io.BytesIO(head))

    def log_message(self, format, *args):  # noqa: A002 - a scrape every 15 s is not news
        pass


_node_server: _Server | None = None


def serve_node(port: int) -> _Server | None:
    """Serve the node's port on ASYNCH_WORKER_METRICS_BIND from a thread of this process."""
    global _node_server
    if port <= 0:
        return None
    s = get_settings()
    host = s.worker_metrics_bind
    try:
        _node_server = _Server((host, port), s.worker_metrics_max_connections, s.worker_metrics_timeout_seconds)
    except OSError as exc:
        log.warning("metrics: cannot serve on %s:%s: %s", host, port, exc)
        return None
    threading.Thread(target=_node_server.serve_forever, name="asynch-metrics-http", daemon=True).start()
    return _node_server


def forget_inherited_server() -> None:
    """In a forked child: close the inherited listening socket (its thread did not survive the
    fork), so the port is free as soon as the main process exits."""
    global _node_server
    if _node_server is not None:
        _node_server.socket.close()
        _node_server = None
