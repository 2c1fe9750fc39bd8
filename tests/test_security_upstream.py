"""Issue 12 (part A): header overrides, the OSS identity, SSRF edges, what
tenants see of job errors, memory bounds.  Each test failed on the code
before its fix; real PostgreSQL, Redis, stub model and HTTP throughout."""
from __future__ import annotations

import ipaddress
import socket
import time

import pytest
from helpers import auth

from app.config import set_settings
from app.infra.http import netguard

# --- 4. SSRF edges -----------------------------------------------------------------------

EMBEDDED = ["64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1:7f00:0:100::", "64:ff9b:1::1",
            "::ffff:0:7f00:1", "::ffff:0:a00:1", "::127.0.0.1", "::10.0.0.1", "::8.8.8.8",
            "fec0::1", "fec0:1234::1", "100::1", "4000::1"]


@pytest.mark.parametrize("addr", EMBEDDED)
def test_embedded_ipv4_and_non_global_ipv6_are_refused(addr):
    assert netguard.address_refused(ipaddress.ip_address(addr)), addr


def test_public_addresses_still_pass():
    for a in ("8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001::1", "::ffff:8.8.8.8"):
        assert not netguard.address_refused(ipaddress.ip_address(a)), a


def test_the_allowlist_still_admits_an_internal_ipv6_network(settings):
    set_settings(settings.with_overrides(callback_allow_hosts="fec0::/10"))
    assert netguard.check_url("http://[fec0::1]:8080/cb").addresses == (ipaddress.ip_address("fec0::1"),)


@pytest.mark.parametrize("host", ["[64:ff9b::7f00:1]", "[::ffff:0:a00:1]", "[::127.0.0.1]", "[fec0::1]",
                                  "127.0.0.1", "localhost"])
def test_submit_refuses_and_never_echoes_the_resolved_address(client, make_model, user_key, settings, host):
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    make_model("m")
    resp = client.post("/task/createTask", headers=auth(user_key), json={
        "modelName": "m", "requestPayload": {}, "callbackUrl": f"http://{host}:9/cb"})
    body = resp.get_json()
    assert resp.status_code == 422 and body["errors"][0]["pointer"] == "/callbackUrl", body
    message = body["errors"][0]["message"]
    assert "refused address" in message
    for leaked in ("127.0.0.1", "::1", "7f00", "10.0.0", "a00:1", "fec0"):
        assert leaked not in message, message


def test_resolution_is_bounded_by_the_resolve_timeout(settings, monkeypatch):
    """A resolver that hangs costs the caller ASYNCH_RESOLVE_TIMEOUT_SECONDS,
    not the resolver's own retry schedule."""
    from dns_stub import DnsStub

    stub = DnsStub(hang=["example.com"])  # on 127.0.0.1: the check sends nothing off the box
    try:
        set_settings(settings.with_overrides(resolve_timeout_seconds=0.5, resolve_nameservers=stub.address))
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(3) or [])
        t0 = time.monotonic()
        with pytest.raises(netguard.UrlRefused) as exc:
            netguard.check_url("http://slow.example.com/cb")
        assert exc.value.transient and time.monotonic() - t0 < 1.5
        assert stub.count("slow.example.com") >= 1  # it was asked, and never answered
    finally:
        stub.stop()


# --- 3. X-User-Info and the OSS file service -----------------------------------------------

def _passthrough_of(job_id):
    import json

    from helpers import job_row

    raw = job_row(job_id).passthrough_headers
    return json.loads(raw) if raw else {}


@pytest.mark.parametrize("trusted", [False, True])
def test_user_info_is_kept_for_the_oss_service_only_from_a_trusted_gateway(client, make_model, user_key,
                                                                          settings, trusted):
    set_settings(settings.with_overrides(trusted_gateway=trusted, gateway_secret="gw-secret"))
    make_model("m")
    hdrs = {**auth(user_key), "X-User-Info": '{"username": "ceo"}', "X-Oss-Authorization": "Bearer mine",
            "X-Gateway-Secret": "gw-secret"}  # the gateway's proof (issue 21: X-User-Info needs it)
    v1 = client.post("/v1/models/m/jobs", json={}, headers=hdrs).get_json()["job_id"]
    seed = client.post("/task/createTask", json={"modelName": "m", "requestPayload": {}},
                       headers=hdrs).get_json()["data"]["task_id"]
    for job_id in (v1, seed):
        got = _passthrough_of(job_id)
        assert got["Authorization"] == "Bearer mine"
        assert ("X-User-Info" in got) is trusted, got


def test_the_operator_credential_never_travels_with_a_job_identity(oss, settings):
    from app.infra.storage import OssStorage

    st = OssStorage(oss.base, settings.with_overrides(oss_authorization="Bearer operator"))
    st.put("k", b"x", "text/plain", context={"X-User-Info": '{"username": "ceo"}'})
    sent = oss.uploads[-1]["headers"]
    assert sent["Authorization"] == "Bearer operator" and "X-User-Info" not in sent
    st.put("k", b"x", "text/plain", context={"Authorization": "Bearer mine", "X-User-Info": "alice"})
    sent = oss.uploads[-1]["headers"]
    assert sent["Authorization"] == "Bearer mine" and sent["X-User-Info"] == "alice"


# --- 1. X-Model-Key / modelKey ------------------------------------------------------------

SMUGGLE = "Host:admin.internal,Authorization:,Transfer-Encoding:chunked"


def _v1(client, key, model, model_key):
    return client.post(f"/v1/models/{model}/jobs", json={}, headers={**auth(key), "X-Model-Key": model_key})


def _seed(client, key, model, model_key):
    return client.post("/task/createTask", headers=auth(key),
                       json={"modelName": model, "requestPayload": {}, "modelKey": model_key})


@pytest.mark.parametrize("face", [_v1, _seed])
@pytest.mark.parametrize("allowed,model_key", [
    ("", SMUGGLE), ("", "X-Custom:1"), ("*", "Host:admin.internal"), ("*", "Transfer-Encoding:chunked"),
    ("*", "content-length:0"), ("*", "TE:trailers"), ("*", "Connection:close"), ("*", "Upgrade:h2c"),
    ("*", "Proxy-Authorization:x"), ("*", "Cookie:s=1"), ("*", "authorization:"), ("X-Other", "X-Custom:1"),
])
def test_a_job_sets_only_the_headers_its_model_allows(client, make_model, user_key, r, face, allowed, model_key):
    make_model("m", head_msg="Authorization:Bearer admin-secret", model_key_headers=allowed)
    resp = face(client, user_key, "m", model_key)
    body = resp.get_json()
    assert resp.status_code == 422, body
    assert [e["pointer"] for e in body["errors"]] == ["/modelKey"] and "may not be set" in body["errors"][0]["message"]
    assert r.zcard("asynch:gate:{m}") == 0


def test_allowed_and_explicitly_named_headers_reach_the_model(client, make_model, user_key, model_server):
    from helpers import job_row

    from app.jobs import execution

    make_model("m", head_msg="Authorization:Bearer admin-secret,X-Fixed:1", model_key_headers="*, authorization")
    resp = _v1(client, user_key, "m", "X-Custom:é,Authorization:Bearer job")
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["job_id"]
    assert execution.run_attempt(job_id, 0) == "done"
    sent = {k.lower(): v for k, v in model_server.state.calls[-1]["headers"].items()}
    assert sent["x-custom"] == "é" and sent["authorization"] == "Bearer job" and sent["x-fixed"] == "1"
    assert job_row(job_id).state == 2


@pytest.mark.parametrize("value", ["张三", "\u20ac", "\U0001f600"])
def test_a_non_latin1_model_key_is_a_422_not_a_worker_crash(client, make_model, user_key, r, value):
    """(X-Model-Key arrives as Latin-1 bytes; the JSON face is where text beyond
    Latin-1 can come from.)"""
    make_model("m", model_key_headers="*")
    resp = _seed(client, user_key, "m", f"X-Name:{value}")
    body = resp.get_json()
    assert resp.status_code == 422, body
    assert [e["pointer"] for e in body["errors"]] == ["/modelKey"] and "Latin-1" in body["errors"][0]["message"]
    assert r.zcard("asynch:gate:{m}") == 0


def test_head_msg_must_be_latin1_too(client, admin_key):
    resp = client.post("/v1/models", headers=auth(admin_key), json={
        "model_name": "m", "base_url": "http://127.0.0.1:9", "head_msg": "X-Name:张三"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/head_msg"


def test_the_worker_rechecks_the_allowlist_and_never_sends(make_model, model_server, client, admin_key):
    """Allowed at submit, then the model's allowlist shrank: the attempt fails
    permanently without calling the model."""
    from helpers import job_row

    from app.jobs import execution
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    make_model("m", model_key_headers="X-Custom", retry_times=3)
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m", {},
                         jobs.SubmitOptions(model_key="X-Custom:1")).row.id
    assert client.patch("/v1/models/m", headers=auth(admin_key), json={"model_key_headers": ""}).status_code == 200
    assert execution.run_attempt(job_id, 0) == "failed"
    assert model_server.state.calls == [] and job_row(job_id).state == 3


def test_model_key_headers_is_a_declared_model_field(client, admin_key):
    doc = client.get("/openapi.json").get_json()
    props = doc["components"]["schemas"]["ModelInput"]["properties"]
    assert "model_key_headers" in props and props["model_key_headers"].get("default", "") == ""
    resp = client.post("/v1/models", headers=auth(admin_key), json={
        "model_name": "m", "base_url": "http://127.0.0.1:9", "model_key_headers": "X-A:1"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/model_key_headers"
    made = client.post("/v1/models", headers=auth(admin_key),
                       json={"model_name": "m", "base_url": "http://127.0.0.1:9"})
    assert made.status_code == 201 and made.get_json()["model_key_headers"] == ""


# --- 6. what tenants see of job errors -----------------------------------------------------

def _views(client, user_key, admin_key, job_id, model="m"):
    status = client.get(f"/v1/models/{model}/jobs/{job_id}", headers=auth(user_key)).get_json()
    seed = client.get(f"/task/getTaskResult?taskId={job_id}", headers=auth(user_key)).get_json()["data"]
    mine = client.get(f"/v1/jobs/{job_id}", headers=auth(user_key)).get_json()
    admin = client.get(f"/v1/jobs/{job_id}", headers=auth(admin_key)).get_json()
    return status, seed, mine, admin


def test_a_models_error_body_stays_out_of_tenant_views(client, make_model, user_key, admin_key):
    from app.jobs import execution
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    make_model("m", retry_times=0)
    secret_body = "Traceback: /srv/model/app.py db=postgres://model:pw@10.0.0.7"
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m",
                         {"status": 500, "body": secret_body}).row.id
    assert execution.run_attempt(job_id, 0) == "failed"
    status, seed, mine, admin = _views(client, user_key, admin_key, job_id)
    for view in (status, seed, mine):
        assert view["error"] == "model_http_error: model returned HTTP 500", view
        shown = str({k: v for k, v in view.items() if k != "payload"})  # (the payload is the tenant's own)
        assert "error_detail" not in view and "/srv/model" not in shown and "10.0.0.7" not in shown
    assert admin["error"] == status["error"] and admin["error_detail"].startswith("model returned HTTP 500")


def test_storage_internals_stay_out_of_tenant_views(client, make_model, user_key, admin_key, settings, tmp_path):
    from app.jobs import execution
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    blocker = tmp_path / "results-are-a-file"
    blocker.write_text("not a directory")
    set_settings(settings.with_overrides(storage_url=f"file://{blocker}", inline_result_bytes=0, upload_attempts=1))
    make_model("m", retry_times=0)
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m", {"a": 1}).row.id
    assert execution.run_attempt(job_id, 0) == "failed"
    status, seed, mine, admin = _views(client, user_key, admin_key, job_id)
    for view in (status, seed, mine):
        assert view["error"] in ("storage_error: result upload failed", "internal_error: internal error"), view
        assert str(tmp_path) not in str(view)
    assert str(tmp_path) in admin["error_detail"]


def test_an_unreachable_models_address_stays_out_of_tenant_views(client, make_model, user_key, admin_key):
    from app.jobs import execution
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    make_model("m", retry_times=0, base_url=f"http://127.0.0.1:{port}")
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m", {}).row.id
    assert execution.run_attempt(job_id, 0) == "failed"
    status, _, _, admin = _views(client, user_key, admin_key, job_id)
    assert status["error"] == "model_unreachable: model unreachable"
    assert str(port) in admin["error_detail"]


def test_an_s3_location_is_shown_as_the_result_path():
    from app.infra.storage import public_location

    assert public_location("s3://bucket/prefix/2026/01/01/job_x/1", "m", "job_x") == "/v1/models/m/jobs/job_x/result"
    assert public_location("http://oss/files/1.json", "m", "job_x") == "http://oss/files/1.json"
    assert public_location(None, "m", "job_x") is None


# --- 9. memory bounds ----------------------------------------------------------------------

def _done_with_stored_result(make_model, settings, body: bytes) -> str:
    """A done job whose (large) result sits in storage, written there directly."""
    from sqlalchemy import update

    from app import transitions
    from app.infra.db import transaction
    from app.infra.storage import get_storage
    from app.infra.tables import tasks
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    make_model("m")
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m", {}).row.id
    location = get_storage().put(f"big/{job_id}", body, "application/octet-stream")
    with transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.id == job_id).values(state=1, attempt=1))
        assert transitions.complete(conn, job_id, 1, location=location, content_type="application/octet-stream",
                                    size=len(body)) is not None
    return job_id


def test_a_stored_result_is_streamed_not_loaded(client, make_model, settings, user_key, tmp_path):
    import tracemalloc

    set_settings(settings.with_overrides(storage_url=f"file://{tmp_path}/results"))
    size = 8 * 1024 * 1024
    job_id = _done_with_stored_result(make_model, settings, b"\x01" * size)
    tracemalloc.start()
    try:
        resp = client.get(f"/v1/models/m/jobs/{job_id}/result", headers=auth(user_key), buffered=False)
        assert resp.status_code == 200 and resp.is_streamed
        got = sum(len(chunk) for chunk in resp.response)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == size
    assert peak < size // 4, f"peak {peak} bytes while serving {size}"


def test_an_inline_result_is_still_served_from_the_row(client, make_model, user_key):
    from app.jobs import execution
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    make_model("m")
    job_id = jobs.submit(Principal("tenant-a", "user", None), "m", {"x": 1}).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    resp = client.get(f"/v1/models/m/jobs/{job_id}/result", headers=auth(user_key))
    assert resp.status_code == 200 and b'"x": 1' in resp.data.replace(b'"x":1', b'"x": 1')


def test_s3_results_can_be_redirected_to_a_presigned_url(client, make_model, settings, user_key):
    import boto3
    import requests
    from helpers import free_port
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket="asynch-h1-results")
        s3 = settings.with_overrides(storage_url="s3://asynch-h1-results/results", s3_endpoint_url=url,
                                     s3_access_key="test", s3_secret_key="test")
        set_settings(s3)
        job_id = _done_with_stored_result(make_model, s3, b"stream me" * 1000)
        streamed = client.get(f"/v1/models/m/jobs/{job_id}/result", headers=auth(user_key))
        assert streamed.status_code == 200 and streamed.data == b"stream me" * 1000
        set_settings(s3.with_overrides(result_redirect_seconds=60))
        moved = client.get(f"/v1/models/m/jobs/{job_id}/result", headers=auth(user_key))
        assert moved.status_code == 307 and "Expires" in moved.headers["Location"], moved.headers
        assert requests.get(moved.headers["Location"], timeout=10).content == b"stream me" * 1000
        # Seed views never show the bucket.
        seed = client.get(f"/task/getTaskResult?taskId={job_id}", headers=auth(user_key)).get_json()["data"]
        assert seed["oss_file"] == f"/v1/models/m/jobs/{job_id}/result"
    finally:
        server.stop()


def test_an_oss_download_is_capped_and_follows_no_redirect(oss, settings):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from app.infra.storage import OssStorage, StorageError

    oss.files["big.bin"] = (b"z" * 5000, "application/octet-stream")
    st = OssStorage(oss.base, settings.with_overrides(max_result_bytes=4096))
    with pytest.raises(StorageError, match="exceeds 4096 bytes"):
        st.get(f"{oss.url}/files/big.bin")
    with pytest.raises(StorageError, match="exceeds 4096 bytes"):
        b"".join(st.stream(f"{oss.url}/files/big.bin"))
    oss.files["ok.bin"] = (b"z" * 4096, "application/octet-stream")
    assert st.get(f"{oss.url}/files/ok.bin") == b"z" * 4096

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(302)
            self.send_header("Location", f"{oss.url}/files/ok.bin")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(StorageError, match="HTTP 302"):
            st.get(f"http://127.0.0.1:{srv.server_port}/x")
    finally:
        srv.shutdown()


def test_a_form_pattern_runs_in_linear_time():
    """(a+)+$ on 200,000 characters: exponential for a backtracking engine.
    Run in a child process (a backtracking match holds the GIL), 20 s at most."""
    import subprocess
    import sys

    code = ("from app.catalog.forms import payload_errors\n"
            "form = [{'field': 's', 'type': 'string', 'pattern': '^(a+)+$'}]\n"
            "assert payload_errors(form, {'s': 'a' * 200_000 + '!'})[0]['pointer'] == '/s'\n"
            "assert payload_errors(form, {'s': 'a' * 1_000_000}) == []\n")
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the pattern did not finish within 20 s")


def test_a_form_pattern_that_needs_backtracking_is_refused(client, admin_key):
    resp = client.post("/v1/models", headers=auth(admin_key), json={
        "model_name": "m", "base_url": "http://127.0.0.1:9",
        "form": [{"field": "s", "type": "string", "pattern": "^(a)\\1$"}]})
    body = resp.get_json()
    assert resp.status_code == 422 and body["errors"][0]["pointer"] == "/form/0/pattern", body
