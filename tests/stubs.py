"""Stub HTTP services for the tests, each on a real socket: the model
(app/cli/demo_model.py's demo model plus instruments), a callback receiver,
a bare TCP listener that only counts connections, and the OSS file service
(``/oss/file/uploadFile``)."""
from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from app.cli.demo_model import ClientGone, DemoModel, DemoModelServer


class ModelState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holds: dict[str, threading.Event] = {}
        # Calls still running from before a reset() must not touch the new counts.
        self.generation = 0
        self._counts()

    def _counts(self) -> None:
        self.calls: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.in_flight_by: dict[str, int] = {}
        self.max_in_flight_by: dict[str, int] = {}
        self.fail_counts: dict[str, int] = {}
        self.room_used: dict[str, int] = {}
        self.busy_answers = 0  # 429s sent for want of room
        self.hangups: dict[str, float] = {}  # X-Asynch-Job-Id -> when its caller hung up before the answer

    def hold(self, name: str) -> threading.Event:
        with self.lock:
            return self.holds.setdefault(name, threading.Event())

    def release(self, name: str) -> None:
        self.hold(name).set()

    def reset(self) -> None:
        with self.lock:
            self.generation += 1
            self._counts()
            for ev in self.holds.values():
                ev.set()  # nothing stays stuck from the previous test
            self.holds = {}


class StubModel(DemoModel):
    """The demo model plus payload fields that steer it for tests:
      fail_first    fail (HTTP 500, or ``status_first``) the first N calls that carry this ``tag``
      hold          wait until the test calls state.release(<hold>) (at most 60 s):
                    a call the test can keep in flight as long as it needs
      room          an upstream with room for this many calls at once (per
                    ``room_tag``): beyond it, 429 with ``retry_after`` (sent as
                    the Retry-After header, if given) -- a full inference server
      crowd_ms      add this many ms per other call of the ``room_tag`` in
                    flight: an upstream whose latency grows with its load
      busy_until    429 (with ``retry_after`` as Retry-After, verbatim, if given)
                    until this Unix time: an upstream (or a quota) that is full for a while
      busy_key      429 (with ``retry_after``) when the call's X-Stub-Key header
                    is this value: one credential's exhausted quota
      flaky         [fail %, busy %, hang %]: each call at random answers 500, 429
                    (with ``retry_after``), never answers, or as usual: a flaky upstream
      stream_hold   (a streamed answer: ``stream``) wait before chunk ``hold_at`` (default 0) until
                    state.release(<stream_hold>): a stream the test can keep half sent
      break_at      (a streamed answer) close the connection before chunk N (with ``break_once``:
                    only the first call of its ``tag`` breaks): an upstream that dies mid-stream
    A caller that hangs up before its answer (sleep_ms, hold, hang) is recorded in
    ``state.hangups`` (its job id -> when the stub noticed).
    Every call is recorded in ``self.server.state`` (path, method, headers --
    also as the raw list of (name, value) lines, repeats kept --, payload,
    time, peer), and calls in flight are counted in total and per value of
    the ``X-Stub-Tenant`` request header (tests send it through
    head_msg/modelKey), with the maximum each count reached."""

    def respond(self, p: dict) -> tuple:
        gen, group = self._enter(p)
        try:
            return self._in_room(self.server.state, p)
        finally:
            self._leave(gen, group)

    def _stream(self, p: dict) -> None:
        gen, group = self._enter(p)
        try:
            return super()._stream(p)
        finally:
            self._leave(gen, group)

    def _enter(self, p: dict) -> tuple[int, str]:
        state = self.server.state
        call = {"path": urlsplit(self.path).path, "method": self.command,
                "headers": dict(self.headers.items()), "header_lines": list(self.headers.items()),
                "payload": p, "t": time.time(), "peer": self.client_address}
        group = self.headers.get("X-Stub-Tenant", "")
        with state.lock:
            gen = state.generation
            state.calls.append(call)
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            n = state.in_flight_by[group] = state.in_flight_by.get(group, 0) + 1
            state.max_in_flight_by[group] = max(state.max_in_flight_by.get(group, 0), n)
        return gen, group

    def _leave(self, gen: int, group: str) -> None:
        # Out of flight before the answer is written: once the caller
        # has the answer, its next call must not overlap this one.
        state = self.server.state
        with state.lock:
            if gen == state.generation:
                state.in_flight -= 1
                state.in_flight_by[group] -= 1

    def between(self, i: int, p: dict) -> None:
        state = self.server.state
        if p.get("stream_hold") and i == int(p.get("hold_at") or 0):
            ev, deadline = state.hold(str(p["stream_hold"])), time.monotonic() + 60
            while not ev.wait(0.05) and time.monotonic() < deadline:
                self.hold(0.001)  # a caller that hangs up meanwhile ends the hold (ClientGone)
        if p.get("break_at") is not None and i == int(p["break_at"]):
            key = f"break:{p.get('tag', '')}"
            with state.lock:
                n = state.fail_counts[key] = state.fail_counts.get(key, 0) + 1
            if n == 1 or not p.get("break_once"):
                self.connection.shutdown(socket.SHUT_RDWR)
                self.broke = True  # our own break, not the caller's hang-up
                raise ClientGone()

    def hung_up(self) -> None:
        if getattr(self, "broke", False):
            return
        state = self.server.state
        with state.lock:
            state.hangups[self.headers.get("X-Asynch-Job-Id", "")] = time.time()

    def _in_room(self, state: ModelState, p: dict) -> tuple:
        if p.get("flaky"):
            fail, busy, hang = (float(x) for x in p["flaky"])
            roll = random.uniform(0, 100)
            if roll < hang:
                self.hold(3600)  # until the caller gives up and hangs up
            if roll < hang + fail:
                return 500, b'{"error":"flaky"}', "application/json"
            if roll < hang + fail + busy:
                p = {**p, "busy_until": time.time() + 60}
        busy_until, busy_key = float(p.get("busy_until") or 0), p.get("busy_key")
        if time.time() < busy_until or (busy_key and self.headers.get("X-Stub-Key") == busy_key):
            with state.lock:
                state.busy_answers += 1
            ra = p.get("retry_after")
            return 429, b'{"error":"busy"}', "application/json", {"Retry-After": str(ra)} if ra is not None else None
        room, crowd = int(p.get("room") or 0), float(p.get("crowd_ms") or 0)
        if not (room or crowd):
            return self._answer(state, p)
        tag = str(p.get("room_tag", ""))
        with state.lock:
            gen, used = state.generation, state.room_used.get(tag, 0)
            if room and used >= room:
                state.busy_answers += 1
                ra = p.get("retry_after")
                return 429, b'{"error":"busy"}', "application/json", {"Retry-After": str(ra)} if ra else None
            state.room_used[tag] = used + 1
        try:
            time.sleep(crowd * used / 1000.0)
            return self._answer(state, p)
        finally:
            with state.lock:
                if gen == state.generation:
                    state.room_used[tag] -= 1

    def _answer(self, state: ModelState, p: dict) -> tuple:
        if p.get("hold"):
            ev, deadline = state.hold(str(p["hold"])), time.monotonic() + 60
            while not ev.wait(0.05) and time.monotonic() < deadline:
                self.hold(0.001)  # a caller that hangs up meanwhile ends the hold (ClientGone)
        answer = super().respond(p)  # sleep_ms first: a failing call is as slow as the others
        tag, fail_first = p.get("tag"), int(p.get("fail_first") or 0)
        if tag and fail_first:
            with state.lock:
                n = state.fail_counts.get(tag, 0)
                state.fail_counts[tag] = n + 1
            if n < fail_first:
                return int(p.get("status_first") or 500), b'{"error":"warming up"}', "application/json"
        return answer


class StubModelServer(DemoModelServer):
    """The tests' model service: ``state`` is what its calls did (ModelState)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port, handler=StubModel)
        self.state = self.httpd.state = ModelState()


class _Server:
    def _serve(self, httpd) -> None:
        self.httpd = httpd
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class CallbackReceiver(_Server):
    """Records every request.  ``statuses``: answers for the next requests
    (then 200); ``redirect_to``: answer 302 to that URL instead."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.statuses: list[int] = []
        self.redirect_to: str | None = None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                with owner.lock:
                    # target: the request line's target, raw (what a callback signs).
                    owner.requests.append({"path": parts.path, "raw_query": parts.query, "target": self.path,
                                           "query": parse_qsl(parts.query, keep_blank_values=True),
                                           "headers": dict(self.headers.items()), "t": time.time()})
                    status = owner.statuses.pop(0) if owner.statuses else 200
                    redirect = owner.redirect_to
                self.send_response(302 if redirect else status)
                if redirect:
                    self.send_header("Location", redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._serve(ThreadingHTTPServer(("127.0.0.1", 0), Handler))

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.statuses.clear()
            self.redirect_to = None


class ConnectionSpy:
    """A listener that accepts and counts connections and answers nothing:
    proof that nobody connected to an address we refused."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def stop(self) -> None:
        self._stop = True
        self.sock.close()


class OssStub:
    """The seed's OSS file service: multipart upload to /oss/file/uploadFile,
    answering {"code":200,"data":{"url": <download URL>}}; GET on that URL
    returns the file.  Records the headers of every upload."""

    def __init__(self) -> None:
        from flask import Flask, Response, jsonify, request
        from werkzeug.serving import make_server

        self.uploads: list[dict] = []
        self.files: dict[str, tuple[bytes, str]] = {}
        self.fail_next = 0
        ids = itertools.count(1)
        app = Flask("oss-stub")

        @app.post("/base/oss/file/uploadFile")
        def upload():
            f = request.files.get("file")
            self.uploads.append({"headers": dict(request.headers.items()),
                                 "filename": f.filename if f else None})
            if self.fail_next:
                self.fail_next -= 1
                return jsonify({"code": 500, "message": "storage busy"}), 200
            name = f"{next(ids)}-{f.filename}"
            self.files[name] = (f.read(), f.mimetype)
            return jsonify({"code": 200, "message": "success", "data": {"url": f"{self.url}/files/{name}"}})

        @app.get("/files/<name>")
        def download(name):
            if name not in self.files:
                return "", 404
            data, ctype = self.files[name]
            return Response(data, content_type=ctype)

        self._serve_app = make_server("127.0.0.1", 0, app, threaded=True)
        self.httpd = self._serve_app
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    @property
    def base(self) -> str:
        return f"{self.url}/base"

    def stop(self) -> None:
        self.httpd.shutdown()
