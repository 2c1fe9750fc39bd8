"""A small HTTP model service: the demo model of ``asynch dev`` and the stub
the tests call over real HTTP.

It answers any path.  POST bodies (JSON) and GET query strings are read as
the payload; a few payload fields steer it so tests can make it slow, fail,
or answer with other bytes:
  sleep_ms      wait this long before answering
  status        answer with this HTTP status
  content_type  answer with this Content-Type and ``body`` (text) as bytes
  body          the body to send (with content_type); default: JSON echo
  size          answer with this many bytes of b"x" (application/octet-stream)
  fail_first    fail (HTTP 500, or ``status_first``) the first N calls that carry this ``tag``
  hang          never answer (until the client gives up)
  hold          wait until the test calls state.release(<hold>) (at most 60 s):
                a call the test can keep in flight as long as it needs
  room          an upstream with room for this many calls at once (per
                ``room_tag``): beyond it, 429 with ``retry_after`` (sent as
                the Retry-After header, if given) -- a full inference server
  crowd_ms      add this many ms per other call of the ``room_tag`` in
                flight: an upstream whose latency grows with its load
Every call is recorded (path, method, headers -- also as the raw list of
(name, value) lines, repeats kept --, payload, time) for tests,
and calls in flight are counted in total and per value of the
``X-Stub-Tenant`` request header (tests send it through head_msg/modelKey),
with the maximum each count reached.

With ``webhook_secrets`` (a function giving the secrets to try; `asynch dev`
passes its stack's) the service is also a webhook receiver at ``/webhooks``:
a POST (a webhook) or a signed GET (a callback, ``/webhooks/{bizName}?...``)
is verified the Standard Webhooks way (app/delivery/signing.py: the body,
or the raw request target), recorded, and answered 204, or 401 when no
secret verifies it; a plain ``GET /webhooks`` lists what came, newest first:
``{"received": [{"webhook_id", "type", "job_id", "verified", "error", "at"}]}``.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


class ModelState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holds: dict[str, threading.Event] = {}
        self.received: list[dict] = []  # the webhook receiver's deliveries (kept by reset)
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


RECEIVER = "/webhooks"


def _verified(secrets, headers, payload: bytes | str) -> str | None:
    """None when one of ``secrets()`` verifies the delivery, else why not."""
    from app.delivery.signing import SignatureInvalid, verify

    why = "no signing secret known"
    try:
        for secret in secrets():
            try:
                verify(secret, headers, payload)
                return None
            except SignatureInvalid as exc:
                why = str(exc)
    except Exception as exc:  # the secrets' source is down: say so, still record it
        why = f"secrets unavailable: {type(exc).__name__}"
    return why


def _handler(state: ModelState, webhook_secrets=None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY a
        # keep-alive client waits for the delayed ACK (~40 ms) on every call.
        disable_nagle_algorithm = True

        def log_message(self, *_a):  # quiet
            pass

        def _payload(self, raw: bytes) -> dict:
            if self.command == "GET":
                return dict(parse_qsl(urlsplit(self.path).query))
            try:
                data = json.loads(raw) if raw else {}
            except ValueError:
                data = {"_raw": raw.decode("utf-8", "replace")}
            return data if isinstance(data, dict) else {"_body": data}

        def _send(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
            self.send_response(status)
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n and self.command != "GET" else b""
            path = urlsplit(self.path).path
            if webhook_secrets is not None and (path == RECEIVER or path.startswith(RECEIVER + "/")):
                return self._receive(raw)
            payload = self._payload(raw)
            call = {"path": path, "method": self.command,
                    "headers": dict(self.headers.items()), "header_lines": list(self.headers.items()),
                    "payload": payload, "t": time.time(), "peer": self.client_address}
            group = self.headers.get("X-Stub-Tenant", "")
            with state.lock:
                gen = state.generation
                state.calls.append(call)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                n = state.in_flight_by[group] = state.in_flight_by.get(group, 0) + 1
                state.max_in_flight_by[group] = max(state.max_in_flight_by.get(group, 0), n)
            try:
                answer = self._respond(payload)
            finally:
                # Out of flight before the answer is written: once the caller
                # has the answer, its next call must not overlap this one.
                with state.lock:
                    if gen == state.generation:
                        state.in_flight -= 1
                        state.in_flight_by[group] -= 1
            self._send(*answer)

        def _receive(self, raw: bytes) -> None:
            if self.command == "GET" and "webhook-signature" not in self.headers:
                with state.lock:
                    listed = list(reversed(state.received))
                return self._send(200, json.dumps({"received": listed}).encode(), "application/json")
            why = _verified(webhook_secrets, self.headers, raw if self.command == "POST" else self.path)
            try:  # a webhook's body; a callback's fields are in its query
                body = json.loads(raw) if raw else {"data": dict(parse_qsl(urlsplit(self.path).query))}
            except ValueError:
                body = {}
            data = body.get("data") if isinstance(body.get("data"), dict) else {}
            with state.lock:
                state.received.append({"webhook_id": self.headers.get("webhook-id"),
                                       "type": body.get("type", "callback"),
                                       "job_id": data.get("job_id") or data.get("task_id"),
                                       "verified": why is None, "error": why, "at": time.time()})
            if why is None:
                return self._send(204, b"", "application/json")
            self._send(401, json.dumps({"error": why}).encode(), "application/json")

        def _respond(self, p: dict) -> tuple:
            room, crowd = int(p.get("room") or 0), float(p.get("crowd_ms") or 0)
            if not (room or crowd):
                return self._answer(p)
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
                return self._answer(p)
            finally:
                with state.lock:
                    if gen == state.generation:
                        state.room_used[tag] -= 1

        def _answer(self, p: dict) -> tuple[int, bytes, str]:
            if p.get("hang"):
                time.sleep(3600)
            if p.get("hold"):
                state.hold(str(p["hold"])).wait(60)
            sleep_ms = float(p.get("sleep_ms") or 0)
            if sleep_ms:
                time.sleep(sleep_ms / 1000.0)
            tag, fail_first = p.get("tag"), int(p.get("fail_first") or 0)
            if tag and fail_first:
                with state.lock:
                    n = state.fail_counts.get(tag, 0)
                    state.fail_counts[tag] = n + 1
                if n < fail_first:
                    return int(p.get("status_first") or 500), b'{"error":"warming up"}', "application/json"
            status = int(p.get("status") or 200)
            if p.get("size"):
                return status, b"x" * int(p["size"]), "application/octet-stream"
            if p.get("content_type"):
                return status, str(p.get("body", "")).encode(), str(p["content_type"])
            body = json.dumps({"model": "demo-echo", "echo": p}, ensure_ascii=False).encode()
            return status, body, "application/json"

        do_GET = do_POST = _handle

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that gave up (timeout, killed worker) is normal here.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class DemoModelServer:
    """Run the model service on a background thread: ``with DemoModelServer() as m: m.url``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, webhook_secrets=None) -> None:
        self.state = ModelState()
        self.httpd = _Server((host, port), _handler(self.state, webhook_secrets))
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="demo-model", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "DemoModelServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "DemoModelServer":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()
