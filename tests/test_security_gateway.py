"""Issue 21, items 2 and 3: X-User-Info is trusted only on a request that
proved it comes from the gateway (in gateway mode, and in key mode with
ASYNCH_TRUSTED_GATEWAY), and a gateway tenant must be a tenant name, so
no tenant reaches an internal row (a callback secret's ``~prev:`` row) or
splits a Redis key.  Real PostgreSQL, Redis and the stub model service;
the Flask test client's source address is 127.0.0.1."""
from __future__ import annotations

import hashlib
import json

import pytest
from helpers import auth, job_row
from sqlalchemy import func, select

from app.config import get_settings, set_settings
from app.infra.db import transaction
from app.infra.tables import tasks, tenant_secrets

SECRET = "gw-shared-secret-7f3a"
FORGED = '{"username": "ceo@tenant-a", "tenantId": "tenant-a"}'


def _passthrough(job_id: str) -> dict:
    raw = job_row(job_id).passthrough_headers
    return json.loads(raw) if raw else {}


def _submit_all_faces(client, headers: dict) -> list[str]:
    """One job through each face that takes X-User-Info: v1 submit, v1 batch, seed createTask."""
    v1 = client.post("/v1/models/m/jobs", json={}, headers=headers)
    assert v1.status_code == 202, v1.get_json()
    batch = client.post("/v1/models/m/jobs:batch", json={"jobs": [{"payload": {}}]}, headers=headers)
    assert batch.status_code == 207 and batch.get_json()["results"][0]["status"] == 202, batch.get_json()
    seed = client.post("/task/createTask", json={"modelName": "m", "requestPayload": {}, "creator": "own"},
                       headers=headers)
    assert seed.status_code == 200, seed.get_json()
    return [v1.get_json()["job_id"], batch.get_json()["results"][0]["job_id"], seed.get_json()["data"]["task_id"]]


def _assert_forged_dropped(job_ids: list[str]) -> None:
    for job_id in job_ids:
        row = job_row(job_id)
        assert row.creator != "ceo@tenant-a" and row.tenant_id == "tenant-b", (job_id, row.creator)
        assert "X-User-Info" not in _passthrough(job_id), _passthrough(job_id)


def _assert_trusted(job_ids: list[str]) -> None:
    for job_id in job_ids:
        assert job_row(job_id).creator == "ceo@tenant-a"
        assert _passthrough(job_id)["X-User-Info"] == FORGED


# --- 2. X-User-Info only with the gateway's proof -----------------------------------------

def test_gateway_mode_drops_x_user_info_a_keyed_client_sends_without_the_gateway_secret(client, make_model,
                                                                                        other_key):
    make_model("m", queue_limit=100)
    set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_secret=SECRET))
    hdrs = {**auth(other_key), "X-User-Info": FORGED, "X-Oss-Authorization": "Bearer mine"}
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    wrong = _submit_all_faces(client, {**hdrs, "X-Gateway-Secret": SECRET[:-1]})
    _assert_forged_dropped(wrong)
    # The key still says who pays; the gateway's proof says the header is the gateway's.
    _assert_trusted(_submit_all_faces(client, {**hdrs, "X-Gateway-Secret": SECRET}))


def test_gateway_mode_with_cidrs_trusts_x_user_info_only_from_an_allowed_source(client, make_model, other_key):
    make_model("m", queue_limit=100)
    hdrs = {**auth(other_key), "X-User-Info": FORGED}
    set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_cidrs="10.0.0.0/8"))
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    set_settings(get_settings().with_overrides(gateway_cidrs="127.0.0.0/8"))
    _assert_trusted(_submit_all_faces(client, hdrs))
    # Both set: both must hold.
    set_settings(get_settings().with_overrides(gateway_secret=SECRET))
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    _assert_trusted(_submit_all_faces(client, {**hdrs, "X-Gateway-Secret": SECRET}))


def test_a_trusted_gateway_in_key_mode_needs_the_same_proof(client, make_model, other_key):
    make_model("m", queue_limit=100)
    hdrs = {**auth(other_key), "X-User-Info": FORGED}
    # Trusted, but no proof configured: nothing can prove it, the header is always dropped.
    set_settings(get_settings().with_overrides(trusted_gateway=True, gateway_secret="", gateway_cidrs=""))
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    _assert_forged_dropped(_submit_all_faces(client, {**hdrs, "X-Gateway-Secret": ""}))
    set_settings(get_settings().with_overrides(gateway_secret=SECRET))
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    _assert_trusted(_submit_all_faces(client, {**hdrs, "X-Gateway-Secret": SECRET}))
    set_settings(get_settings().with_overrides(gateway_secret="", gateway_cidrs="192.168.0.0/16"))
    _assert_forged_dropped(_submit_all_faces(client, hdrs))
    set_settings(get_settings().with_overrides(gateway_cidrs="127.0.0.1/32"))
    _assert_trusted(_submit_all_faces(client, hdrs))
    # Not trusted at all: proof or not, the header is nobody's word.
    set_settings(get_settings().with_overrides(trusted_gateway=False, gateway_secret=SECRET))
    _assert_forged_dropped(_submit_all_faces(client, {**hdrs, "X-Gateway-Secret": SECRET}))


# --- 3. gateway tenants are tenant names --------------------------------------------------

def _counts(r) -> tuple:
    with transaction() as conn:
        jobs = conn.execute(select(func.count()).select_from(tasks)).scalar()
        secrets = conn.execute(select(tenant_secrets.c.tenant_id).order_by(tenant_secrets.c.tenant_id)).scalars().all()
    # A refused request still takes from its address's anonymous rate-limit
    # bucket (app/web/ratelimit.py): that is the limit working, not a write.
    return jobs, tuple(secrets), tuple(sorted(k for k in r.keys("*") if ":ratelimit:" not in k))


PREV_ROW = "~prev:" + hashlib.sha256(b"tenant-a").hexdigest()[:40]


@pytest.mark.parametrize("tenant", [PREV_ROW, "acme:corp", "a" * 65, "-lead", "sp ace", "{m}", "t\u00e9"])
def test_a_gateway_tenant_that_is_no_tenant_name_is_a_401_that_changes_nothing(client, make_model, admin_key,
                                                                               r, tenant):
    from app.jobs import execution

    make_model("m", queue_limit=100)
    # tenant-a has a previous secret (its "~prev:" row) inside the overlap window.
    assert client.post("/v1/tenants/tenant-a/callback-secret/rotate", headers=auth(admin_key)).status_code == 200
    set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_secret=SECRET,
                                               callback_allow_hosts="127.0.0.1"))
    before = _counts(r)
    gw = {"Authorization": "Bearer business-user", "X-Gateway-Secret": SECRET}
    info = json.dumps({"tenantId": tenant, "username": "u"})
    for resp in (client.post("/v1/models/m/jobs", json={}, headers={**gw, "X-User-Info": info,
                                                                    "X-Callback-Url": "http://127.0.0.1:9/cb"}),
                 client.post("/task/createTask", json={"modelName": "m", "requestPayload": {}},
                             headers={**gw, "X-User-Info": info}),
                 client.get("/v1/jobs", headers={**gw, "X-User-Info": info})):
        assert resp.status_code == 401, resp.get_json()
        assert "invalid tenant" in json.dumps(resp.get_json()), resp.get_json()
    assert _counts(r) == before
    # A valid gateway tenant's job works end to end.
    ok = client.post("/v1/models/m/jobs", json={"x": 1},
                     headers={**gw, "X-User-Info": json.dumps({"tenantId": "tenant-g", "username": "u"})})
    assert ok.status_code == 202, ok.get_json()
    job_id = ok.get_json()["job_id"]
    assert execution.run_attempt(job_id, 0) == "done"
    row = job_row(job_id)
    assert row.tenant_id == "tenant-g" and row.creator == "u" and row.state == 2


def test_an_invalid_default_gateway_tenant_is_refused_too(client, make_model):
    make_model("m", queue_limit=100)
    set_settings(get_settings().with_overrides(auth_mode="gateway", gateway_secret=SECRET,
                                               gateway_default_tenant="acme:corp"))
    resp = client.post("/v1/models/m/jobs", json={}, headers={"X-Gateway-Secret": SECRET,
                                                             "X-User-Info": '{"userId": 7}'})
    assert resp.status_code == 401 and "invalid tenant" in resp.get_json()["error"], resp.get_json()


def test_no_tenant_name_maps_onto_an_internal_row():
    from app.delivery.signing_secrets import previous_id
    from app.infra.redis import keys
    from app.tenancy.schemas import is_tenant_name

    for tenant in ("tenant-a", "a", "A.b_c-9", "x" * 64):
        assert is_tenant_name(tenant)
        assert not is_tenant_name(previous_id(tenant))
        # A tenant's Redis keys end in the tenant: no ":" in it, so no key of one
        # tenant is a prefix-plus-separator of another tenant's or of the model's own.
        assert keys.tenant_gate("m", tenant).rsplit(":", 1)[1] == tenant
    for name in ("~prev:abc", "acme:corp", "a{b}", "", "x" * 65, "tenant-a\n"):
        assert not is_tenant_name(name), name


# --- 9, first bullet: reserved model headers, case-insensitively ---------------------------

@pytest.mark.parametrize("model_key", ["x-asynch-job-id:forged", "X-ASYNCH-ATTEMPT:9", "x-asynch-other:1",
                                       "Forwarded:for=10.0.0.1", "x-forwarded-for:10.0.0.1",
                                       "X-Forwarded-Host:admin.internal", "X-Real-IP:10.0.0.1", "via:1.1 evil",
                                       "Expect:100-continue", "EXPECT:100-continue"])
def test_a_job_cannot_set_a_reserved_or_routing_header_even_under_star(client, make_model, user_key, r, model_key):
    make_model("m", model_key_headers="*")
    for resp in (client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Model-Key": model_key}),
                 client.post("/task/createTask", headers=auth(user_key),
                             json={"modelName": "m", "requestPayload": {}, "modelKey": model_key})):
        body = resp.get_json()
        assert resp.status_code == 422, body
        assert [e["pointer"] for e in body["errors"]] == ["/modelKey"], body
        assert "may not be set" in body["errors"][0]["message"], body
    assert r.zcard("asynch:gate:{m}") == 0


def test_the_middlewares_own_headers_are_reserved_even_when_the_model_names_them(client, make_model, user_key):
    make_model("m", model_key_headers="X-Asynch-Job-Id, x-asynch-attempt")
    resp = client.post("/v1/models/m/jobs", json={}, headers={**auth(user_key), "X-Model-Key": "x-asynch-job-id:f"})
    assert resp.status_code == 422 and "reserved" in resp.get_json()["errors"][0]["message"], resp.get_json()


def test_the_model_receives_each_header_once(client, make_model, user_key, model_server):
    from app.jobs import execution

    # head_msg and modelKey in other cases than the middleware's own names.
    make_model("m", head_msg="user-agent:model-ua,ACCEPT:application/json,x-asynch-job-id:stale",
               model_key_headers="*, user-agent")
    resp = client.post("/v1/models/m/jobs", json={},
                       headers={**auth(user_key), "X-Model-Key": "USER-AGENT:job-ua,x-custom:1"})
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["job_id"]
    assert execution.run_attempt(job_id, 0) == "done"
    lines = model_server.state.calls[-1]["header_lines"]
    names = [k.lower() for k, _ in lines]
    assert len(names) == len(set(names)), lines
    sent = {k.lower(): v for k, v in lines}
    assert sent["user-agent"] == "job-ua" and sent["accept"] == "application/json" and sent["x-custom"] == "1"
    assert sent["x-asynch-job-id"] == job_id and sent["x-asynch-attempt"] == "1"
