"""A small HTTP model service: the demo model of ``asynch dev``.  The tests'
stub model (tests/stubs.py) extends its handler, ``DemoModel.respond``.

It answers any path with ``{"model": "demo-echo", "echo": <payload>}``.  POST
bodies (JSON) and GET query strings are read as the payload; a few payload
fields steer it, to try a slow, failing or other-bytes model:
  sleep_ms      wait this long before answering (a caller that hangs up meanwhile
                stops it: nothing more is done for it, as vLLM aborts a request
                whose client disconnected)
  status        answer with this HTTP status
  content_type  answer with this Content-Type and ``body`` (text) as bytes
  body          the body to send (with content_type); default: JSON echo
  size          answer with this many bytes of b"x" (application/octet-stream)
  hang          never answer (until the client gives up and hangs up)
  stream        answer a stream, chunk by chunk (chunked transfer): OpenAI's chat.completion.chunk
                events as text/event-stream ending with ``data: [DONE]`` (as vLLM, TGI, llama.cpp
                and Ollama stream), or with ``ndjson`` one JSON object a line (application/x-ndjson)
  chunks        how many chunks (default 8); chunk_ms: the wait before each (default 50);
                ``stamp``: each chunk carries ``t``, the Unix time it was sent (bench_stream)

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
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

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


class ClientGone(Exception):
    """The caller hung up while its answer was being made."""


class DemoModel(BaseHTTPRequestHandler):
    """One request; ``self.server`` is the ``_Server`` (its webhook secrets and ``received`` list)."""
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
        if self.server.webhook_secrets is not None and (path == RECEIVER or path.startswith(RECEIVER + "/")):
            return self._receive(raw)
        try:
            p = self._payload(raw)
            if p.get("stream") and not p.get("status"):
                return self._stream(p)
            self._send(*self.respond(p))
        except ClientGone:
            self.close_connection = True
            self.hung_up()

    def hung_up(self) -> None:
        """The caller closed the connection before the answer (a canceled job): nothing is sent."""

    def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or until the caller hangs up (ClientGone): as vLLM stops generating for a
        client that went away, the demo stops working for it."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.connection], [], [], min(left, 1.0))[0]:
                continue
            try:
                gone = not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                gone = True
            if gone:
                raise ClientGone()
            time.sleep(min(left, 0.01))  # a pipelined request's bytes, not a hang-up

    do_GET = do_POST = _handle

    def _stream(self, p: dict) -> None:
        """A streamed answer (``stream``): chunk i after ``chunk_ms``, each written as it is made."""
        ndjson, n, wait = bool(p.get("ndjson")), int(p.get("chunks") or 8), float(p.get("chunk_ms") or 50) / 1000
        words = _words(p)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson" if ndjson else "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for i in range(n):
            self.hold(wait)
            self.between(i, p)
            piece = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": "demo-chat", "choices": [{"index": 0, "delta": {"content": words[i % len(words)] + " "},
                                                         "finish_reason": "stop" if i == n - 1 else None}]}
            if p.get("stamp"):
                piece["t"] = time.time()
            line = json.dumps(piece, separators=(",", ":"))
            self._chunk((line + "\n") if ndjson else f"data: {line}\n\n")
        if not ndjson:
            self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def between(self, i: int, p: dict) -> None:
        """Before chunk ``i`` of a stream is sent (the tests' stub holds or breaks it here)."""

    def _receive(self, raw: bytes) -> None:
        srv = self.server
        if self.command == "GET" and "webhook-signature" not in self.headers:
            with srv.lock:
                listed = list(reversed(srv.received))
            return self._send(200, json.dumps({"received": listed}).encode(), "application/json")
        why = _verified(srv.webhook_secrets, self.headers, raw if self.command == "POST" else self.path)
        try:  # a webhook's body; a callback's fields are in its query
            body = json.loads(raw) if raw else {"data": dict(parse_qsl(urlsplit(self.path).query))}
        except ValueError:
            body = {}
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        with srv.lock:
            srv.received.append({"webhook_id": self.headers.get("webhook-id"),
                                 "type": body.get("type", "callback"),
                                 "job_id": data.get("job_id") or data.get("task_id"),
                                 "verified": why is None, "error": why, "at": time.time()})
        if why is None:
            return self._send(204, b"", "application/json")
        self._send(401, json.dumps({"error": why}).encode(), "application/json")

    def respond(self, p: dict) -> tuple:
        """The answer to a model call: (status, body, content type[, extra headers])."""
        if p.get("hang"):
            self.hold(3600)
        sleep_ms = float(p.get("sleep_ms") or 0)
        if sleep_ms:
            self.hold(sleep_ms / 1000.0)
        status = int(p.get("status") or 200)
        if p.get("size"):
            return status, b"x" * int(p["size"]), "application/octet-stream"
        if p.get("content_type"):
            return status, str(p.get("body", "")).encode(), str(p["content_type"])
        body = json.dumps({"model": "demo-echo", "echo": p}, ensure_ascii=False).encode()
        return status, body, "application/json"


def _words(p: dict) -> list[str]:
    """What a streamed answer says: the last chat message's words, or the prompt's, or a greeting."""
    msgs = p.get("messages")
    text = msgs[-1].get("content") if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) else None
    text = text if isinstance(text, str) else p.get("prompt") if isinstance(p.get("prompt"), str) else None
    return (text or "hello from the demo model").split() or ["..."]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, webhook_secrets) -> None:
        super().__init__(address, handler)
        self.webhook_secrets, self.lock, self.received = webhook_secrets, threading.Lock(), []

    def handle_error(self, request, client_address):
        # A client that gave up (timeout, killed worker) is normal here.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class DemoModelServer:
    """Run the model service on a background thread: ``with DemoModelServer() as m: m.url``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, webhook_secrets=None, handler=DemoModel) -> None:
        self.httpd = _Server((host, port), handler, webhook_secrets)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="demo-model", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "DemoModelServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever: one never started would never answer
            self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "DemoModelServer":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()
