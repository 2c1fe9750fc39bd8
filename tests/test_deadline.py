"""app/infra/http/deadline.py against real sockets: a request finishes or
fails within its deadline (+ SLACK) whatever the peer does: never answer,
trickle the status line, the headers, the body or a TLS handshake; connect
never completing.  Also: the pre-resolved address with the URL's Host and
TLS name, no redirects, the response cap, ``reached``, keep-alive reuse."""
from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme
from tarpit import Tarpit

from app.infra.http import deadline

SLACK = 0.3


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    try:
        out = fn(*a, **kw)
    except deadline.RequestError as exc:
        out = exc
    return out, time.monotonic() - t0


@pytest.fixture
def tarpit(request):
    pits = []

    def make(mode, interval=0.5):
        pits.append(Tarpit(mode, interval))
        return pits[-1]

    yield make
    for p in pits:
        p.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []
    connections: set = set()

    def log_message(self, *_a):
        pass

    def _answer(self):
        type(self).connections.add(self.client_address)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        type(self).seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                                "body": body})
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/big"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(20):
                self.wfile.write(b"400\r\n" + b"y" * 1024 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        out = json.dumps({"path": self.path, "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer


@pytest.fixture
def server():
    _Handler.seen, _Handler.connections = [], set()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.redirect_to = "http://127.0.0.1:9/"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = f"http://127.0.0.1:{srv.server_port}"
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_normal_get_and_post(server):
    resp, took = timed(deadline.request, "GET", server.url + "/q?a=1", params={"b": "x y", "c": "é"},
                       headers={"X-Key": "v"}, timeout=2, max_bytes=10_000)
    assert resp.status == 200 and took < 1
    assert json.loads(resp.body)["path"] == "/q?a=1&b=x+y&c=%C3%A9"
    h = _Handler.seen[-1]["headers"]
    assert h["X-Key"] == "v" and h["Host"] == f"127.0.0.1:{server.server_port}" and h["Connection"] == "close"
    resp = deadline.request("POST", server.url + "/p", json={"q": [1, "二"]}, timeout=2, max_bytes=10_000)
    assert resp.status == 200 and resp.header("Content-Type") == "application/json"
    assert json.loads(_Handler.seen[-1]["body"]) == {"q": [1, "二"]}
    assert _Handler.seen[-1]["headers"]["Content-Type"] == "application/json"


@pytest.mark.parametrize("mode", ["silent", "status", "headers", "body"])
def test_a_tarpit_costs_at_most_the_deadline(tarpit, mode):
    pit = tarpit(mode)
    err, took = timed(deadline.request, "GET", pit.url + "/cb", timeout=1.5, max_bytes=10_000)
    assert isinstance(err, deadline.DeadlineExceeded), err
    assert err.reached  # the request went out: it counts as a call
    assert 1.5 <= took <= 1.5 + SLACK, took
    # Without a deadline the same peer answers, much later (that is the point).
    assert mode == "silent" or len(pit._script()[1]) * pit.interval > 10


def test_a_trickled_tls_handshake_costs_at_most_the_deadline(tarpit):
    pit = tarpit("tls", interval=0.2)
    err, took = timed(deadline.request, "GET", f"https://127.0.0.1:{pit.port}/", timeout=1.2, max_bytes=100)
    assert isinstance(err, deadline.DeadlineExceeded) and not err.reached, err
    assert 1.2 <= took <= 1.2 + SLACK, took
    assert len(pit.accepted) == 1


def test_a_connect_that_never_completes_costs_at_most_the_deadline():
    # A listener whose accept queue is full and that never accepts: the
    # kernel drops further SYNs, so connect() hangs.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.1)
        err, took = timed(deadline.request, "GET", f"http://127.0.0.1:{port}/", timeout=1.0, max_bytes=100)
        assert isinstance(err, deadline.DeadlineExceeded) and not err.reached, err
        assert 1.0 <= took <= 1.0 + SLACK, took
        # A connect timeout below the deadline is a connect failure, not a deadline.
        err, took = timed(deadline.request, "GET", f"http://127.0.0.1:{port}/", timeout=5, connect_timeout=0.3,
                          max_bytes=100)
        assert isinstance(err, deadline.ConnectFailed) and not err.reached and took < 1, err
    finally:
        for s in fillers:
            s.close()
        lsock.close()


def test_refused_connections_did_not_reach():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err, took = timed(deadline.request, "GET", f"http://127.0.0.1:{port}/", timeout=2, max_bytes=100)
    assert isinstance(err, deadline.ConnectFailed) and not err.reached and took < 1


def test_oversize_answers_fail_without_reading_everything(server):
    # A Content-Length above the cap fails at the headers ...
    err = timed(deadline.request, "GET", server.url + "/q", timeout=2, max_bytes=10)[0]
    assert isinstance(err, deadline.ResponseTooLarge) and err.reached
    # ... a chunked body as soon as the count passes it.
    err = timed(deadline.request, "GET", server.url + "/big", timeout=2, max_bytes=4000)[0]
    assert isinstance(err, deadline.ResponseTooLarge) and "4000" in str(err)
    assert deadline.request("GET", server.url + "/big", timeout=2, max_bytes=30_000).body == b"y" * 20 * 1024
    # truncate=True: the first max_bytes, and the connection is not reused.
    before = len(_Handler.connections)
    resp = deadline.request("GET", server.url + "/big", timeout=2, max_bytes=1500, truncate=True, keep_alive=True)
    assert resp.status == 200 and resp.body == b"y" * 1500
    resp = deadline.request("GET", server.url + "/q", timeout=2, max_bytes=5, truncate=True, keep_alive=True)
    assert resp.body == b'{"pat' and len(_Handler.connections) == before + 2


def test_redirects_are_returned_not_followed(server):
    spy = socket.socket()
    spy.bind(("127.0.0.1", 0))
    spy.listen(4)
    spy.settimeout(0.3)
    server.redirect_to = f"http://127.0.0.1:{spy.getsockname()[1]}/stolen"
    try:
        resp = deadline.request("GET", server.url + "/redirect", timeout=2, max_bytes=100)
        assert resp.status == 302 and resp.header("location") == server.redirect_to
        with pytest.raises(socket.timeout):
            spy.accept()
    finally:
        spy.close()


@pytest.fixture(scope="module")
def tls_server():
    """An HTTPS server on 127.0.0.1 whose certificate names only callback.test."""
    ca = trustme.CA()
    cert = ca.issue_cert("callback.test")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(sctx)
    srv.socket = sctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cctx = ssl.create_default_context()
    ca.configure_trust(cctx)
    yield srv, cctx
    srv.shutdown()
    srv.server_close()


def test_tls_to_a_pre_resolved_address_verifies_the_url_host(tls_server):
    srv, cctx = tls_server
    _Handler.seen = []
    port = srv.server_port
    # callback.test does not resolve: only the given address is ever used.
    resp = deadline.request("GET", f"https://callback.test:{port}/hook?x=1", address="127.0.0.1", timeout=3,
                            max_bytes=1000, tls_context=cctx)
    assert resp.status == 200
    assert _Handler.seen[-1]["headers"]["Host"] == f"callback.test:{port}"
    assert _Handler.seen[-1]["path"] == "/hook?x=1"
    # The certificate must be valid for the URL's host, not the address.
    for host in ("other.test", "127.0.0.1"):
        err = timed(deadline.request, "GET", f"https://{host}:{port}/", address="127.0.0.1", timeout=3,
                    max_bytes=1000, tls_context=cctx)[0]
        assert isinstance(err, deadline.ConnectFailed) and not err.reached and "certificate" in str(err).lower()
    # And the default trust store does not know the test CA.
    err = timed(deadline.request, "GET", f"https://callback.test:{port}/", address="127.0.0.1", timeout=3,
                max_bytes=1000)[0]
    assert isinstance(err, deadline.ConnectFailed)


def test_keep_alive_reuses_a_connection_in_this_process_only(server):
    for _ in range(3):
        assert deadline.request("GET", server.url + "/k", timeout=2, max_bytes=1000, keep_alive=True).status == 200
    assert len(_Handler.connections) == 1
    assert "Connection" not in _Handler.seen[-1]["headers"]
    pid = os.fork()
    if pid == 0:  # the child must open its own connection, not share the parent's
        try:
            deadline.request("GET", server.url + "/child", timeout=2, max_bytes=1000, keep_alive=True)
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(_Handler.connections) == 2
    assert deadline.request("GET", server.url + "/k", timeout=2, max_bytes=1000, keep_alive=True).status == 200
    assert len(_Handler.connections) == 2  # the parent's connection still works
    # An idle connection past POOL_IDLE_SECONDS is not reused (the peer may be closing it).
    time.sleep(deadline.POOL_IDLE_SECONDS + 0.1)
    deadline.request("GET", server.url + "/k", timeout=2, max_bytes=1000, keep_alive=True)
    assert len(_Handler.connections) == 3


def test_invalid_requests_never_reach():
    for url in ("ftp://x/", "http:///nohost", "http://[::1/"):
        err = timed(deadline.request, "GET", url, timeout=1, max_bytes=10)[0]
        assert isinstance(err, deadline.InvalidRequest) and not err.reached, url
    err = timed(deadline.request, "GET", "http://127.0.0.1:9/", headers={"X": "a\r\nB: c"}, timeout=1,
                max_bytes=10)[0]
    assert isinstance(err, deadline.InvalidRequest)


# --- model calls (app/infra/http/model_client.py) ----------------------------------------

def _call(url, **kw):
    from app.infra.http.model_client import call_model

    args = dict(base_url=url, route="/v1/m", http_method="POST", head_msg="", model_key=None, payload={},
                timeout_seconds=1.5, max_bytes=10_000)
    args.update(kw)
    return timed(call_model, **args)


@pytest.mark.parametrize("mode", ["silent", "status", "headers", "body"])
def test_a_model_call_timeout_is_a_total_deadline_header_phase_included(tarpit, mode):
    from app.infra.http.model_client import ModelCallError

    pit = tarpit(mode)
    t0 = time.monotonic()
    with pytest.raises(ModelCallError) as ei:
        _call(pit.url)
    took = time.monotonic() - t0
    assert 1.5 <= took <= 1.5 + SLACK, took
    assert "timed out after 1.5s" in str(ei.value) and not ei.value.permanent and ei.value.called


def test_model_call_contract(model_server):
    from app.infra.http.model_client import ModelCallError, call_model

    base = dict(base_url=model_server.url, route="/v1/m", head_msg="API_KEY:a,X-Stub-Tenant:t",
                model_key="API_KEY:b", timeout_seconds=5, max_bytes=10_000, model_key_headers="API_KEY")
    resp = call_model(http_method="GET", payload={"p": "x y", "n": 2, "b": True, "o": {"k": 1}, "z": None}, **base)
    call = model_server.state.calls[-1]
    assert resp.status == 200 and resp.content_type == "application/json"
    assert call["method"] == "GET" and call["payload"] == {"p": "x y", "n": "2", "b": "true", "o": '{"k":1}'}
    assert call["headers"]["API_KEY"] == "b" and call["headers"]["X-Stub-Tenant"] == "t"
    call_model(http_method="POST", payload={"q": [1, 2]}, **base)
    assert model_server.state.calls[-1]["payload"] == {"q": [1, 2]}
    for status, permanent in ((404, True), (301, True), (400, True), (500, False), (503, False), (408, False),
                              (429, False)):
        with pytest.raises(ModelCallError) as ei:
            call_model(http_method="POST", payload={"status": status}, **base)
        assert (ei.value.permanent, ei.value.called) == (permanent, True), status
    with pytest.raises(ModelCallError) as ei:
        call_model(http_method="POST", payload={"size": 20_000}, **base)
    assert ei.value.permanent and ei.value.called and "exceeds 10000 bytes" in str(ei.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ModelCallError) as ei:
        call_model(http_method="POST", payload={}, **{**base, "base_url": dead})
    assert not ei.value.permanent and not ei.value.called and "unreachable" in str(ei.value)
