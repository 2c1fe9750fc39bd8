"""The cluster's model service (its own host): answers every call with a
JSON echo after the payload's ``sleep_ms``, and counts the calls per (job,
attempt) from the X-Asynch-Job-Id / X-Asynch-Attempt headers every worker
sends, with the calling host's address.  ``GET /_calls`` lists them,
``POST /_reset`` forgets them.

Run:  python model_stub.py HOST PORT
"""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

calls: list[dict] = []
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *_a):
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_calls":
            with lock:
                body = json.dumps(calls).encode()
            return self._send(200, body)
        return self._call({})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.path == "/_reset":
            with lock:
                calls.clear()
            return self._send(200, b"{}")
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {}
        return self._call(payload if isinstance(payload, dict) else {})

    def _call(self, payload: dict) -> None:
        call = {"job": self.headers.get("X-Asynch-Job-Id"), "attempt": self.headers.get("X-Asynch-Attempt"),
                "client": self.client_address[0], "t": time.time()}
        with lock:
            calls.append(call)
        time.sleep(float(payload.get("sleep_ms") or 0) / 1000.0)
        call["answered"] = time.time()
        self._send(200, json.dumps({"echo": payload}).encode())


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # a worker that gave up (partitioned, killed) is normal here


if __name__ == "__main__":
    srv = Server((sys.argv[1], int(sys.argv[2])), Handler)
    print("ready", flush=True)
    srv.serve_forever()
