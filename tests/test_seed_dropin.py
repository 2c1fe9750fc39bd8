"""Acceptance of the seed-002 drop-in (issue 13): a client written only from
the seed document (examples/seed_flow.py) completes the seed's section-2
flow -- createModel as given, createTask, getTaskBatch downloading on state
2, getTaskResult, the GET callback -- with no code change, in both auth
modes; and gateway auth mode end to end against the OSS storage backend.

Real pieces: the API on a socket, a gateway (a reverse proxy that adds the
shared secret and the user's identity, as the business gateway does),
PostgreSQL, Redis, Celery worker processes storing results in the OSS file
service stub, the stub model service, a callback receiver; the client runs
as its own process."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import requests
from helpers import ROOT, auth, job_row, wait_until
from test_seed_flow import _api_settings, seed_worker  # noqa: F401 (fixtures)

from app.clock import now
from app.config import get_settings, set_settings
from app.infra.db import transaction
from app.infra.tables import model_types

SECRET = "gw-shared-secret-5b1e"
USER_TOKEN = "Bearer business-user-token-9c2d"
IDENTITY = '{"tenantId": "tenant-g", "userId": 7, "username": "zhang.san"}'
# The seed's createModel has no modelKeyHeaders: a seed deployment names the header its clients' modelKey
# sets, on the workers (who check it again when they call the model) as on the API (docs/migrating.md).
KEY_HEADERS = "X-API-Key"
SEED_WORKER_ENV = {"ASYNCH_MODEL_KEY_HEADERS_DEFAULT": KEY_HEADERS}


class Gateway:
    """The business gateway: authenticates the user (here: anyone), then
    forwards to the middleware with the shared secret and X-User-Info;
    Authorization goes through unchanged."""

    def __init__(self, upstream: str, secret: str = SECRET) -> None:
        from flask import Flask, Response, request
        from werkzeug.serving import make_server

        app = Flask("gateway")

        @app.route("/<path:path>", methods=["GET", "POST"])
        def forward(path):
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            headers.update({"X-Gateway-Secret": secret, "X-User-Info": IDENTITY})
            up = requests.request(request.method, f"{upstream}/{path}", params=request.args, data=request.get_data(),
                                  headers=headers, timeout=60)
            return Response(up.content, status=up.status_code, content_type=up.headers.get("Content-Type"))

        self.httpd = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def stop(self) -> None:
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def gateway(api_url):
    gw = Gateway(api_url)
    yield gw
    gw.stop()


def _fresh_install_types() -> None:
    # What migration 0012_seed_dropin puts in (the test tables are emptied between tests).
    with transaction() as conn:
        for i in (1, 2, 3):
            conn.execute(model_types.insert().values(type_id=i, type_name=f"seed type {i}", remark="", created_at=now()))


def _run_client(base: str, auth_value: str, admin_key: str, model_url: str, callback_url: str) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "seed_flow.py"), "--base", base,
                          "--auth", auth_value, "--admin-auth", f"Bearer {admin_key}", "--model-url", model_url,
                          "--callback-url", callback_url, "--timeout", "60"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    return json.loads(out.stdout)


@pytest.mark.parametrize("mode", ["key", "gateway"])
def test_a_seed_client_completes_its_flow_unchanged_in_both_auth_modes(mode, api_url, gateway, seed_worker, oss,
                                                                       receiver, model_server, admin_key, user_key):
    _fresh_install_types()
    set_settings(get_settings().with_overrides(model_key_headers_default=KEY_HEADERS))
    if mode == "gateway":
        set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_secret=SECRET))
        base, credential, tenant = gateway.url, USER_TOKEN, "tenant-g"
    else:
        base, credential, tenant = api_url, f"Bearer {user_key}", "tenant-a"
    got = _run_client(base, credential, admin_key, model_server.url, f"{receiver.url}/notify")

    # Step three as the seed says: the batch call that marks it 4 shows it as 2 with its file.
    assert got["states_seen"][-1] == 2 and got["batch_item"]["claimed"] is True
    assert json.loads(got["content"]) == {"model": "demo-echo", "echo": {"prompt": "你好"}}
    assert got["result_state"] == 4 and got["oss_file"] == got["batch_item"]["oss_file"]
    assert got["oss_file"].startswith(f"{oss.url}/files/")
    # The GET callback: {callbackUrl}/{bizName} with the seed's four query fields.
    wait_until(lambda: receiver.requests, timeout=20, what="the callback")
    (cb,) = receiver.requests
    assert cb["path"] == "/notify/order"
    assert cb["query"] == [("task_id", got["task_id"]), ("state", "2"), ("oss_file", got["oss_file"]),
                           ("file_type", "application/json")]
    row = job_row(got["task_id"])
    assert row.tenant_id == tenant
    (upload,) = oss.uploads
    if mode == "gateway":
        # The user's own Authorization and the gateway's identity reached the OSS service unchanged.
        assert upload["headers"]["Authorization"] == USER_TOKEN and upload["headers"]["X-User-Info"] == IDENTITY
        assert row.creator == "zhang.san"
    else:
        assert user_key not in json.dumps(upload["headers"])  # our API key never leaves


def test_gateway_mode_accepts_only_the_proven_gateway(api_url, gateway, oss, model_server, make_model, admin_key,
                                                      user_key, settings):
    make_model("m")
    set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_secret=SECRET))
    body = {"modelName": "m", "requestPayload": {"x": 1}}
    url = f"{api_url}/task/createTask"
    direct = {"Authorization": USER_TOKEN, "X-User-Info": IDENTITY}
    for headers in (direct, {**direct, "X-Gateway-Secret": "wrong"}, {**direct, "X-Gateway-Secret": SECRET[:-1]}):
        resp = requests.post(url, json=body, headers=headers, timeout=10)
        assert resp.status_code == 401 and resp.json()["code"] != 0, resp.text
    # Proven, but X-User-Info names no tenant (and no default is configured).
    resp = requests.post(url, json=body, headers={**direct, "X-Gateway-Secret": SECRET, "X-User-Info": '{"userId": 7}'},
                         timeout=10)
    assert resp.status_code == 401 and "names no tenant" in resp.text
    # Through the gateway: a user of tenant-g, never an admin.
    assert requests.post(f"{gateway.url}/task/createTask", json=body, headers={"Authorization": USER_TOKEN},
                         timeout=10).json()["code"] == 0
    denied = requests.post(f"{gateway.url}/model/createModel", json={"modelName": "x", "baseUrl": "http://h"},
                           headers={"Authorization": USER_TOKEN}, timeout=10)
    assert denied.status_code == 403
    # Our API keys still authenticate as keys: admin routes with an admin key, through the gateway too.
    assert requests.get(f"{gateway.url}/v1/keys", headers=auth(admin_key), timeout=10).status_code == 200
    assert requests.get(f"{api_url}/v1/keys", headers=auth(user_key), timeout=10).status_code == 403
    # Source CIDRs: the loopback gateway is inside 127.0.0.0/8, not inside 10.0.0.0/8.
    set_settings(get_settings().with_overrides(gateway_secret="", gateway_cidrs="127.0.0.0/8"))
    assert requests.post(url, json=body, headers=direct, timeout=10).json()["code"] == 0
    set_settings(get_settings().with_overrides(gateway_cidrs="10.0.0.0/8"))
    assert requests.post(url, json=body, headers=direct, timeout=10).status_code == 401
    # Both set: both must hold.
    set_settings(get_settings().with_overrides(gateway_secret=SECRET, gateway_cidrs="127.0.0.0/8"))
    assert requests.post(url, json=body, headers=direct, timeout=10).status_code == 401
    assert requests.post(url, json=body, headers={**direct, "X-Gateway-Secret": SECRET}, timeout=10).json()["code"] == 0


def test_gateway_mode_must_name_a_proof():
    from app.config import load_settings

    with pytest.raises(ValueError, match="ASYNCH_GATEWAY_SECRET"):
        load_settings({"ASYNCH_AUTH_MODE": "gateway"})
    with pytest.raises(ValueError, match="key or gateway"):
        load_settings({"ASYNCH_AUTH_MODE": "open"})
    assert load_settings({"ASYNCH_AUTH_MODE": "gateway", "ASYNCH_GATEWAY_CIDRS": "10.0.0.0/8"}).auth_mode == "gateway"


def test_seed_errors_can_answer_http_200_with_the_status_in_code(client, user_key, settings):
    resp = client.post("/task/createTask", json={"modelName": "nope"}, headers=auth(user_key))
    assert resp.status_code == 404 and resp.get_json()["code"] == 404
    set_settings(settings.with_overrides(seed_errors_http_200=True))
    resp = client.post("/task/createTask", json={"modelName": "nope"}, headers=auth(user_key))
    assert resp.status_code == 200 and resp.get_json()["code"] == 404 and resp.get_json()["data"] is None
    # The v1 face keeps its real statuses.
    assert client.post("/v1/models/nope/jobs", json={}, headers=auth(user_key)).status_code == 404


def test_gateway_requests_are_rate_limited_per_tenant_not_with_the_bootstrap_key():
    from app.tenancy.keys import Principal
    from app.web.ratelimit import bucket_id

    assert bucket_id(Principal("tenant-g", "user", None)) == "gateway:tenant-g"
    assert bucket_id(Principal("tenant-h", "user", None)) == "gateway:tenant-h"
    assert bucket_id(Principal("admin", "admin", None)) == "bootstrap"
    assert bucket_id(Principal("tenant-a", "user", 12)) == "12"
