"""HTTP/1.1 requests with a HARD wall-clock deadline over the whole exchange (resolution, connect, TLS, sending, status
line, headers, body): a peer that never answers, or trickles a byte every half second, costs at most ``timeout``,
never ``n_bytes * read_timeout`` (urllib3's timeouts are per read: issue "Capacity isolation"). Mechanism: h11 on a
socket we own, and EVERY blocking socket call gets the time left as its timeout (``_Clock.left`` raises once it is
gone): ``recv`` returns on any byte and is re-armed with the remainder, the send loop re-arms before every ``send``,
CPython's SSL handshake and recv take one deadline for all their WANT_READ/WANT_WRITE waits (Modules/_ssl.c
``_PyDeadline_Init``), and ``getaddrinfo`` (no timeout of its own) runs on a daemon thread waited for at most the
time left.  No watchdog thread, so nothing to restart after a fork and no race with the pool.

Invariants:
  * ``request`` raises or returns by the deadline; failures are ``RequestError``s whose ``reached`` says whether a
    byte was sent (False for resolution, connect and TLS failures).
  * ``address=`` connects to that (checked) IP only, never resolving the URL's host, while Host and TLS (SNI,
    certificate name) use the URL's host: a DNS answer that changes after the check cannot redirect it.
  * Redirects are never followed; a body over ``max_bytes`` (or such a Content-Length) fails, or with
    ``truncate=True`` is cut there and the connection closed; h11 caps header blocks (``MAX_HEADER_BYTES``).
  * ``abort=`` (an ``Abort``) lets another thread end the exchange at any point: the socket is shut down both
    ways, the peer sees the connection close, and ``request`` raises ``Stopped`` (never a pooled connection).
  * ``keep_alive=True`` reuses connections from a per-thread, per-process pool (a forked child never touches its
    parent's sockets: app/infra/process.py), dropping one idle too long or readable (closed by the peer).
"""
from __future__ import annotations

import contextlib
import functools
import json as jsonlib
import select
import socket
import ssl
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

import h11

from app.infra.process import PerProcess

MAX_HEADER_BYTES = 64 * 1024
POOL_IDLE_SECONDS = 1.0      # below common server keep-alive timeouts (gunicorn 2 s, uvicorn 5 s)
POOL_MAX_IDLE_PER_HOST = 2
_SAFE_URL_CHARS = "/?#[]@!$&'()*+,;=%:-._~"  # RFC 3986 reserved + unreserved + "%": valid URLs pass unchanged


class RequestError(Exception):
    """The exchange failed.  ``reached``: a byte of the request was sent."""

    def __init__(self, message: str, *, reached: bool):
        super().__init__(message)
        self.reached = reached


class DeadlineExceeded(RequestError):
    pass


class ConnectFailed(RequestError):
    """Resolution, connect or TLS failed: nothing was sent."""


class ResponseTooLarge(RequestError):
    pass


class BrokenResponse(RequestError):
    """The connection broke or the answer was not HTTP after the request was sent."""


class InvalidRequest(RequestError):
    """Our side: a URL or header that cannot be sent.  Never reached."""


class Stopped(RequestError):
    """``Abort.stop()`` ended the exchange: its socket was shut down (the peer sees the connection close)."""


class Abort:
    """A handle that ends one exchange from another thread, at any point: ``stop()`` shuts its socket down
    (both ways, so a blocked recv or send returns at once and the peer sees FIN: an upstream that aborts on
    disconnect, as vLLM does, stops computing), and the request raises ``Stopped``.  Stopped before the
    connect, the request never connects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.stopped = False
        self.reason = ""

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if self.stopped and sock is not None:
                _shutdown(sock)

    def stop(self, reason: str = "stopped") -> bool:
        """End the exchange (idempotent); False if it was stopped already."""
        with self._lock:
            if self.stopped:
                return False
            self.stopped, self.reason = True, reason
            if self._sock is not None:
                _shutdown(self._sock)
            return True

    def check(self, reached: bool) -> None:
        if self.stopped:
            raise Stopped(f"stopped: {self.reason}", reached=reached)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]   # names lower-cased, values latin-1 decoded
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


class _Clock:
    def __init__(self, timeout: float):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout

    def exceeded(self, reached: bool, where: str = "") -> DeadlineExceeded:
        return DeadlineExceeded(f"deadline of {self.timeout:g}s exceeded{where}", reached=reached)

    def left(self, reached: bool) -> float:
        rest = self.deadline - time.monotonic()
        if rest <= 0:
            raise self.exceeded(reached)
        return rest


class _Target(NamedTuple):
    scheme: str
    host: str
    port: int
    target: str        # path?query as sent
    host_header: str


def _target(url: str, params: Mapping[str, str] | None) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"invalid URL: {exc}", reached=False) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"not an http(s) URL with a host: {url[:200]!r}", reached=False)
    default = 443 if parts.scheme == "https" else 80
    port, host = port or default, parts.hostname
    shown = f"[{host}]" if ":" in host else host
    query = "&".join(filter(None, (parts.query, urlencode(params or {}))))
    target = quote((parts.path or "/") + (f"?{query}" if query else ""), safe=_SAFE_URL_CHARS)
    return _Target(parts.scheme, host, port, target, shown if port == default else f"{shown}:{port}")


def request_target(url: str) -> str:
    """The request target (path and query) ``request`` sends for ``url``: what a
    callback's signature covers.  Raises InvalidRequest where ``request`` would."""
    return _target(url, None).target


@functools.cache
def _default_tls_context() -> ssl.SSLContext:
    """The system's trust store plus certifi's (what requests trusted)."""
    ctx = ssl.create_default_context()
    with contextlib.suppress(ImportError, OSError):
        import certifi

        ctx.load_verify_locations(certifi.where())
    return ctx


def _resolve(host: str, port: int, clock: _Clock) -> list[str]:
    """getaddrinfo on a daemon thread, waited for at most the time left: a
    stuck resolver costs the deadline, never more (the thread ends on its own)."""
    box: futures.Future = futures.Future()

    def run():
        try:
            box.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            box.set_exception(exc)

    threading.Thread(target=run, name="asynch-resolve", daemon=True).start()
    try:
        infos = box.result(clock.left(False))
    except futures.TimeoutError:
        raise clock.exceeded(False, f" resolving {host}") from None
    except OSError as exc:
        raise ConnectFailed(f"{host} does not resolve: {exc}", reached=False) from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


def _connect(t: _Target, address: str | None, clock: _Clock, connect_timeout: float | None,
             tls: ssl.SSLContext | None) -> socket.socket:
    addresses = [address] if address else [t.host] if _is_ip(t.host) else _resolve(t.host, t.port, clock)
    sock, last = None, None
    for ip in addresses:
        left = clock.left(False)
        try:
            sock = socket.create_connection((ip, t.port), timeout=min(left, connect_timeout or left))
            break
        except OSError as exc:
            last = exc
    if sock is None:
        clock.left(False)  # a connect timeout that used up the deadline is a DeadlineExceeded
        raise ConnectFailed(f"cannot connect to {t.host}:{t.port}: {type(last).__name__}: {last}", reached=False)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if t.scheme == "https":
            ctx = tls or _default_tls_context()  # the first call loads the trust store: before the timer is armed
            sock.settimeout(clock.left(False))
            # SNI and certificate name from the URL, whatever address we connected to.
            sock = ctx.wrap_socket(sock, server_hostname=t.host)
        return sock
    except socket.timeout:
        sock.close()
        raise clock.exceeded(False, " in the TLS handshake") from None
    except OSError as exc:  # ssl.SSLError (certificate, protocol) included
        sock.close()
        raise ConnectFailed(f"TLS with {t.host} failed: {type(exc).__name__}: {exc}", reached=False) from exc
    except BaseException:
        sock.close()
        raise


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.idle_since = 0.0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def dropped(self) -> bool:
        """Readable while idle means the peer closed it (or sent garbage)."""
        if time.monotonic() - self.idle_since > POOL_IDLE_SECONDS:
            return True
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def send_all(self, data: bytes, clock: _Clock) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(clock.left(True))
            n = self.sock.send(view[:256 * 1024])
            view = view[n:]

    def next_event(self, clock: _Clock):
        while True:
            ev = self.h11.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            self.sock.settimeout(clock.left(True))
            self.h11.receive_data(self.sock.recv(65536))


class _Pool(threading.local):
    def __init__(self):
        self.idle: dict[tuple, list[_Conn]] = {}

    def take(self, key: tuple) -> _Conn | None:
        conns = self.idle.get(key) or []
        while conns:
            c = conns.pop()
            if not c.dropped():
                return c
            c.close()
        return None

    def put(self, key: tuple, conn: _Conn) -> None:
        conns = self.idle.setdefault(key, [])
        conn.idle_since = time.monotonic()
        conns.append(conn)
        while len(conns) > POOL_MAX_IDLE_PER_HOST:
            conns.pop(0).close()


_pool = PerProcess(_Pool)  # a forked child forgets its parent's sockets (they are the parent's) unclosed


class StreamBody:
    """A request body sent as it is read: ``length`` bytes from ``chunks`` (a stored payload, streamed)."""

    def __init__(self, length: int, chunks) -> None:
        self.length, self.chunks = length, chunks

    def __len__(self) -> int:
        return self.length


def _header_list(t: _Target, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes | None,
                 content_type: str | None, keep_alive: bool) -> list[tuple[bytes, bytes]]:
    given = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    names = {k.lower() for k, _ in given}
    out = ([] if "host" in names else [("Host", t.host_header)]) + given
    if "accept-encoding" not in names:
        out.append(("Accept-Encoding", "identity"))  # the cap counts the bytes we store; no decompression bombs
    if content_type and "content-type" not in names:
        out.append(("Content-Type", content_type))
    if body is not None:
        out.append(("Content-Length", str(len(body))))
    if not keep_alive:
        out.append(("Connection", "close"))
    try:
        return [(k.encode("ascii"), str(v).encode("latin-1")) for k, v in out]
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"header not encodable: {exc}", reached=False) from exc


def request(method: str, url: str, *, timeout: float, max_bytes: int,
            headers: Mapping[str, str] | Iterable[tuple[str, str]] = (), params: Mapping[str, str] | None = None,
            json: Any = None, body: bytes | None = None, address: str | None = None,
            connect_timeout: float | None = None, keep_alive: bool = False, truncate: bool = False,
            tls_context: ssl.SSLContext | None = None, abort: Abort | None = None,
            on_body: Callable[[tuple[tuple[str, str], ...]], Callable[[bytes], None] | None] | None = None) -> Response:
    """One exchange, finished or failed within ``timeout`` seconds of the call; ``abort``: a handle another
    thread may end it with (``Stopped``); ``on_body``: given a 2xx answer's headers, returns a sink that sees
    each piece of its body as it arrives (the body is still returned whole)."""
    clock, t = _Clock(timeout), _target(url, params)
    ctype = None
    if json is not None:
        body, ctype = jsonlib.dumps(json, allow_nan=False).encode(), "application/json"
    hdrs = _header_list(t, headers, body, ctype, keep_alive)
    key = (t.scheme, t.host.lower(), t.port, address, id(tls_context))
    try:
        req = h11.Request(method=method.upper(), target=t.target.encode("ascii"), headers=hdrs)
    except (h11.LocalProtocolError, UnicodeEncodeError) as exc:
        raise InvalidRequest(f"cannot send this request: {exc}", reached=False) from exc
    pool = _pool.get()
    if abort is not None:
        abort.check(False)
    conn = (pool.take(key) if keep_alive else None) or _Conn(_connect(t, address, clock, connect_timeout, tls_context))
    try:
        if abort is not None:
            abort.attach(conn.sock)
        resp = _exchange(conn, req, body, clock, max_bytes, truncate, on_body)
    except BaseException as exc:
        conn.close()
        if abort is not None and abort.stopped and isinstance(exc, (RequestError, OSError)):
            raise Stopped(f"stopped: {abort.reason}", reached=getattr(exc, "reached", True)) from exc
        raise
    finally:
        if abort is not None:
            abort.attach(None)
    if abort is not None and abort.stopped:  # stopped just as it ended: the caller asked for it to end
        conn.close()
        raise Stopped(f"stopped: {abort.reason}", reached=True)
    if keep_alive and conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
        conn.h11.start_next_cycle()
        pool.put(key, conn)
    else:
        conn.close()
    return resp


def _exchange(conn: _Conn, req: h11.Request, body: bytes | None, clock: _Clock, max_bytes: int,
              truncate: bool, on_body=None) -> Response:
    try:
        if isinstance(body, StreamBody):  # sent as it is read
            conn.send_all(conn.h11.send(req), clock)
            for chunk in body.chunks:
                conn.send_all(conn.h11.send(h11.Data(data=chunk)), clock)
            conn.send_all(conn.h11.send(h11.EndOfMessage()), clock)
        else:
            data = conn.h11.send(req) + (conn.h11.send(h11.Data(data=body)) if body else b"") \
                + conn.h11.send(h11.EndOfMessage())
            conn.send_all(data, clock)
        ev = conn.next_event(clock)
        while isinstance(ev, h11.InformationalResponse):  # 100 Continue and friends
            ev = conn.next_event(clock)
        if not isinstance(ev, h11.Response):
            raise BrokenResponse("connection closed before a response", reached=True)
        headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in ev.headers)
        length = next((v for k, v in headers if k == "content-length"), None)
        if not truncate and length is not None and length.isdigit() and int(length) > max_bytes:
            raise ResponseTooLarge(f"response of {length} bytes exceeds {max_bytes} bytes", reached=True)
        got = bytearray()
        sink = on_body(headers) if on_body is not None and 200 <= ev.status_code < 300 else None
        while not isinstance(part := conn.next_event(clock), h11.EndOfMessage):
            if not isinstance(part, h11.Data):  # ConnectionClosed before the framing said the body ended
                raise BrokenResponse("connection closed mid-response", reached=True)
            got += part.data
            if sink is not None and len(got) <= max_bytes:
                sink(part.data)
            if len(got) > max_bytes:
                if not truncate:
                    raise ResponseTooLarge(f"response exceeds {max_bytes} bytes", reached=True)
                del got[max_bytes:]
                break  # the connection is not at a message boundary: request() closes it
        return Response(ev.status_code, headers, bytes(got))
    except socket.timeout:
        raise clock.exceeded(True) from None
    except h11.RemoteProtocolError as exc:
        raise BrokenResponse(f"not a valid HTTP response: {exc}", reached=True) from exc
    except OSError as exc:  # reset, broken pipe, ssl.SSLError
        raise BrokenResponse(f"connection broken: {type(exc).__name__}: {exc}", reached=True) from exc
