"""Stub HTTP services for the seed-002 tests, each on a real socket:
a callback receiver, a bare TCP listener that only counts connections, and
the OSS file service (``/oss/file/uploadFile``)."""
from __future__ import annotations

import itertools
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


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
