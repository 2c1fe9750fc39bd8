"""A hostile HTTP peer on a real socket, for the deadline tests: it accepts,
reads the request head, then (``mode``)
  silent    never answers (holds the connection open)
  status    trickles the whole response from the status line on
  headers   sends the status line at once, then trickles the headers
  body      sends status + headers (Content-Length) at once, trickles the body
  tls       trickles a TLS handshake record (header first) to a TLS client
one byte every ``interval`` seconds.  Trickled responses are valid and
complete (200, empty or padded body) if the client waits ``len * interval``:
a client without a total deadline succeeds, late.  It records when each
connection was accepted and when the client went away."""
from __future__ import annotations

import socket
import threading
import time

PAD = "x" * 80
STATUS = b"HTTP/1.1 200 OK\r\n"
HEADERS = f"X-Pad: {PAD}\r\nContent-Length: 0\r\n\r\n".encode()


class Tarpit:
    def __init__(self, mode: str = "status", interval: float = 0.5, host: str = "127.0.0.1") -> None:
        self.mode, self.interval = mode, interval
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.accepted: list[float] = []
        self.gone: list[float] = []       # client closed (or reset) the connection
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted.append(time.monotonic())
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _script(self) -> tuple[bytes, bytes]:
        """(sent at once, trickled)"""
        if self.mode == "status":
            return b"", STATUS + HEADERS
        if self.mode == "headers":
            return STATUS, HEADERS
        if self.mode == "body":
            body = PAD.encode() * 2
            return STATUS + f"Content-Length: {len(body)}\r\n\r\n".encode(), body
        if self.mode == "tls":
            # A TLS handshake record announcing 16 KiB, then its bytes one by one.
            return b"", b"\x16\x03\x03\x40\x00" + b"\x02" * 200
        return b"", b""

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if self.mode != "tls":
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
            first, trickle = self._script()
            if first:
                conn.sendall(first)
            conn.settimeout(self.interval)
            for i in range(len(trickle)):
                if self._client_left(conn):
                    return
                conn.sendall(trickle[i:i + 1])
            while not self.stopped.is_set() and not self._client_left(conn):
                pass  # silent (or done trickling): hold the connection open
        except OSError:
            pass
        finally:
            with self.lock:
                self.gone.append(time.monotonic())
            conn.close()

    def _client_left(self, conn: socket.socket) -> bool:
        """Waits one interval; True once the client closed its side."""
        try:
            data = conn.recv(65536)
        except socket.timeout:
            return self.stopped.is_set()
        except OSError:
            return True
        return not data

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()
