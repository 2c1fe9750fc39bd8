"""The v1 wire contract (docs/api.md): every status code with its exact error
text, on real PostgreSQL and Redis (no worker runs here, so jobs stay pending).
After every refused request the gate and the table are checked unchanged."""
from __future__ import annotations

import pytest
from helpers import auth, make_key
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.tables import tasks


def count_rows() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar_one()


@pytest.fixture
def echo(make_model):
    return make_model("echo", queue_limit=2,
                      form=[{"field": "prompt", "type": "string", "required": True},
                            {"field": "n", "type": "integer", "min": 1, "max": 10},
                            {"field": "mode", "type": "select", "options": ["fast", "slow"]}])


def post(client, key, model, **kw):
    return client.post(f"/v1/models/{model}/jobs", headers={**auth(key), **kw.pop("headers", {})}, **kw)


def assert_nothing_taken(r, model="echo"):
    assert r.zcard(f"asynch:gate:{{{model}}}") == 0
    assert count_rows() == 0


def test_202_with_location(client, echo, user_key, r):
    resp = post(client, user_key, "echo", json={"prompt": "hi"})
    assert resp.status_code == 202
    body = resp.get_json()
    # Where it stands in line (issue 24 item 1): first, so position 0, starting now.
    assert set(body) == {"job_id", "state", "poll_url", "result_url", "queue_position", "estimated_start_at",
                         "estimated_done_at"}
    assert body["queue_position"] == 0 and body["estimated_start_at"] < body["estimated_done_at"]
    assert body["job_id"].startswith("job_") and body["state"] == "pending"
    assert resp.headers["Location"] == body["poll_url"] == f"/v1/models/echo/jobs/{body['job_id']}"
    assert body["result_url"] == body["poll_url"] + "/result"
    assert r.zrange("asynch:gate:{echo}", 0, -1) == [body["job_id"]]


@pytest.mark.parametrize("data,error", [
    (b"", "request body is empty"),
    (b"   ", "request body is empty"),
    (b"[1, 2]", "request body must be a JSON object"),
    (b'"text"', "request body must be a JSON object"),
    (b"null", "request body must be a JSON object"),
])
def test_400_bad_bodies(client, echo, user_key, r, data, error):
    resp = post(client, user_key, "echo", data=data, content_type="application/json")
    assert resp.status_code == 400
    assert resp.get_json() == {"error": error}
    assert_nothing_taken(r)


def test_400_invalid_json(client, echo, user_key, r):
    resp = post(client, user_key, "echo", data=b'{"prompt": ', content_type="application/json")
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith("invalid JSON: ")
    assert_nothing_taken(r)


def test_401_missing_and_bad_keys(client, echo, r, admin_key):
    resp = client.post("/v1/models/echo/jobs", json={"prompt": "x"})
    assert resp.status_code == 401
    assert resp.get_json() == {"error": "missing API key"}
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="asynch"'
    for bad in ("nope", "ak_000000000000_" + "x" * 43, admin_key[:-1] + ("A" if admin_key[-1] != "A" else "B")):
        resp = post(client, bad, "echo", json={"prompt": "x"})
        assert resp.status_code == 401, bad
        assert resp.get_json() == {"error": "invalid API key"}
    assert_nothing_taken(r)


def test_401_revoked_key(client, echo, admin_key, r):
    key = make_key("gone")
    kid = client.get("/v1/keys?tenant=gone", headers=auth(admin_key)).get_json()["keys"][0]["id"]
    assert client.delete(f"/v1/keys/{kid}", headers=auth(admin_key)).status_code == 200
    resp = post(client, key, "echo", json={"prompt": "x"})
    assert resp.status_code == 401 and resp.get_json() == {"error": "invalid API key"}
    assert_nothing_taken(r)


def test_404_unknown_and_disabled_model(client, make_model, user_key, r):
    resp = post(client, user_key, "nope", json={"prompt": "x"})
    assert resp.status_code == 404
    assert resp.get_json() == {"error": "model not found: nope"}
    make_model("off", enabled=False)
    resp = post(client, user_key, "off", json={"prompt": "x"})
    assert resp.status_code == 404
    assert resp.get_json() == {"error": "model disabled: off"}  # the name is right: it says so
    assert_nothing_taken(r, "off")


def test_404_unknown_job_and_other_tenants_job(client, echo, user_key, other_key):
    resp = client.get("/v1/models/echo/jobs/job_doesnotexist", headers=auth(user_key))
    assert resp.status_code == 404
    assert resp.get_json() == {"error": "job not found: job_doesnotexist"}
    job_id = post(client, user_key, "echo", json={"prompt": "x"}).get_json()["job_id"]
    for suffix in ("", "/wait?timeout=10", "/result"):
        resp = client.get(f"/v1/models/echo/jobs/{job_id}{suffix}", headers=auth(other_key))
        assert resp.status_code == 404, suffix
        assert resp.get_json() == {"error": f"job not found: {job_id}"}
    resp = client.post(f"/v1/models/echo/jobs/{job_id}/cancel", headers=auth(other_key))
    assert resp.status_code == 404
    # The owner still sees it, unchanged.
    assert client.get(f"/v1/models/echo/jobs/{job_id}", headers=auth(user_key)).get_json()["state"] == "pending"
    # The job's id under another model's URL is not found either.
    resp = client.get(f"/v1/models/other/jobs/{job_id}", headers=auth(user_key))
    assert resp.status_code == 404


def test_405_with_allow(client, echo, user_key):
    job_id = post(client, user_key, "echo", json={"prompt": "x"}).get_json()["job_id"]
    for method, url in (("put", f"/v1/models/echo/jobs/{job_id}"),
                        ("delete", f"/v1/models/echo/jobs/{job_id}"),
                        ("post", f"/v1/models/echo/jobs/{job_id}/result"),
                        ("post", f"/v1/models/echo/jobs/{job_id}/wait")):
        resp = getattr(client, method)(url, headers=auth(user_key))
        assert resp.status_code == 405, url
        assert resp.get_json() == {"error": "method not allowed"}
        assert "GET" in resp.headers["Allow"]
    resp = client.get(f"/v1/models/echo/jobs/{job_id}/cancel", headers=auth(user_key))
    assert resp.status_code == 405 and "POST" in resp.headers["Allow"]


def test_409_result_before_done(client, echo, user_key):
    job_id = post(client, user_key, "echo", json={"prompt": "x"}).get_json()["job_id"]
    resp = client.get(f"/v1/models/echo/jobs/{job_id}/result", headers=auth(user_key))
    assert resp.status_code == 409
    assert resp.get_json() == {"error": "job not finished (state: pending)"}


def test_413_too_large(client, echo, user_key, r, settings):
    big = b'{"prompt": "' + b"x" * settings.max_body_bytes + b'"}'
    resp = post(client, user_key, "echo", data=big, content_type="application/json")
    assert resp.status_code == 413
    assert resp.get_json() == {"error": f"request body too large (max {settings.max_body_bytes} bytes)"}
    assert_nothing_taken(r)


def test_422_lists_every_problem_with_pointers(client, echo, user_key, r):
    resp = post(client, user_key, "echo", json={"n": "three", "mode": "medium"})
    assert resp.status_code == 422
    body = resp.get_json()
    assert body["error"] == "request body does not match the model's form"
    assert sorted(body["errors"], key=lambda e: e["pointer"]) == [
        {"pointer": "/mode", "message": "must be one of the options: 'fast', 'slow'"},
        {"pointer": "/n", "message": "must be an integer"},
        {"pointer": "/prompt", "message": "is required"},
    ]
    resp = post(client, user_key, "echo", json={"prompt": "ok", "n": 11})
    assert resp.status_code == 422
    assert resp.get_json()["errors"] == [{"pointer": "/n", "message": "must be <= 10"}]
    assert_nothing_taken(r)


def test_422_bad_model_key_header(client, echo, user_key, r):
    resp = post(client, user_key, "echo", json={"prompt": "x"}, headers={"X-Model-Key": "no-colon-here"})
    assert resp.status_code == 422
    assert resp.get_json()["errors"][0]["pointer"] == "/modelKey"
    assert_nothing_taken(r)


def test_429_queue_full_with_retry_after(client, echo, user_key, r):
    ids = [post(client, user_key, "echo", json={"prompt": str(i)}).get_json()["job_id"] for i in range(2)]
    resp = post(client, user_key, "echo", json={"prompt": "third"})
    assert resp.status_code == 429
    assert resp.get_json() == {"error": "async queue full (max 2)"}
    assert int(resp.headers["Retry-After"]) >= 1
    assert set(r.zrange("asynch:gate:{echo}", 0, -1)) == set(ids)
    assert count_rows() == 2
    # Canceling one frees its slot for the next submission.
    assert client.post(f"/v1/models/echo/jobs/{ids[0]}/cancel", headers=auth(user_key)).status_code == 200
    assert post(client, user_key, "echo", json={"prompt": "fourth"}).status_code == 202


def test_limit_zero_rejects_everything(client, make_model, user_key, r):
    make_model("closed", queue_limit=0)
    for _ in range(3):
        resp = post(client, user_key, "closed", json={})
        assert resp.status_code == 429
        assert resp.get_json() == {"error": "async queue full (max 0)"}
    assert_nothing_taken(r, "closed")


def test_runtime_override_takes_precedence_but_never_above_cap(client, make_model, user_key, r):
    make_model("tuned", queue_limit=3)
    r.set("asynch:runtime:queue_limit:{tuned}", 1)
    assert post(client, user_key, "tuned", json={}).status_code == 202
    resp = post(client, user_key, "tuned", json={})
    assert resp.status_code == 429 and resp.get_json() == {"error": "async queue full (max 1)"}
    r.set("asynch:runtime:queue_limit:{tuned}", 50)  # above the cap: the cap wins
    assert [post(client, user_key, "tuned", json={}).status_code for _ in range(3)] == [202, 202, 429]
    r.set("asynch:runtime:queue_limit:{tuned}", 0)
    r.delete("asynch:gate:{tuned}")
    assert post(client, user_key, "tuned", json={}).status_code == 429


def test_idempotency_key(client, echo, user_key, other_key, r):
    h = {"Idempotency-Key": "order-42"}
    first = post(client, user_key, "echo", json={"prompt": "a"}, headers=h)
    again = post(client, user_key, "echo", json={"prompt": "a"}, headers=h)
    assert first.status_code == again.status_code == 202
    assert again.get_json()["job_id"] == first.get_json()["job_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert r.zcard("asynch:gate:{echo}") == 1 and count_rows() == 1
    clash = post(client, user_key, "echo", json={"prompt": "b"}, headers=h)
    assert clash.status_code == 422
    assert clash.get_json()["error"] == "Idempotency-Key was already used with a different request"
    # Keys are per tenant: another tenant's same key is a new job.
    other = post(client, other_key, "echo", json={"prompt": "a"}, headers=h)
    assert other.status_code == 202 and other.get_json()["job_id"] != first.get_json()["job_id"]
    assert r.zcard("asynch:gate:{echo}") == 2 and count_rows() == 2


def test_status_body_and_wait_param(client, echo, user_key):
    job_id = post(client, user_key, "echo", json={"prompt": "x"}).get_json()["job_id"]
    body = client.get(f"/v1/models/echo/jobs/{job_id}", headers=auth(user_key)).get_json()
    assert body["job_id"] == job_id and body["state"] == "pending"
    assert isinstance(body["elapsed_ms"], int) and body["elapsed_ms"] >= 0
    assert "error" not in body
    # A tiny wait budget on a pending job returns the poll body, still pending.
    body = client.get(f"/v1/models/echo/jobs/{job_id}/wait?timeout=50", headers=auth(user_key)).get_json()
    assert body["state"] == "pending"


def test_cancel_then_409_on_second_cancel(client, echo, user_key, r):
    job_id = post(client, user_key, "echo", json={"prompt": "x"}).get_json()["job_id"]
    resp = client.post(f"/v1/models/echo/jobs/{job_id}/cancel", headers=auth(user_key))
    assert resp.status_code == 200 and resp.get_json()["state"] == "canceled"
    assert r.zcard("asynch:gate:{echo}") == 0
    resp = client.post(f"/v1/models/echo/jobs/{job_id}/cancel", headers=auth(user_key))
    assert resp.status_code == 409
    assert resp.get_json() == {"error": "job already finished (state: canceled)"}
    resp = client.get(f"/v1/models/echo/jobs/{job_id}/result", headers=auth(user_key))
    assert resp.status_code == 409
    assert resp.get_json() == {"error": "job ended without a result (state: canceled)"}


def test_job_listing_is_per_tenant_and_paginates(client, make_model, user_key, other_key):
    make_model("echo", queue_limit=50)
    mine = [post(client, user_key, "echo", json={"i": i}).get_json()["job_id"] for i in range(5)]
    post(client, other_key, "echo", json={"i": 99})
    page1 = client.get("/v1/models/echo/jobs?limit=3", headers=auth(user_key)).get_json()
    assert len(page1["jobs"]) == 3 and page1["next_cursor"]
    page2 = client.get(f"/v1/models/echo/jobs?limit=3&cursor={page1['next_cursor']}",
                       headers=auth(user_key)).get_json()
    seen = [j["job_id"] for j in page1["jobs"] + page2["jobs"]]
    assert sorted(seen) == sorted(mine) and page2["next_cursor"] is None
    assert len(client.get("/v1/jobs?state=pending", headers=auth(user_key)).get_json()["jobs"]) == 5
    bad = client.get("/v1/jobs?state=sleeping", headers=auth(user_key))
    assert bad.status_code == 422 and bad.get_json()["errors"][0]["pointer"] == "/state"
    bad = client.get("/v1/jobs?limit=abc", headers=auth(user_key))
    assert bad.status_code == 422


def test_every_error_has_an_error_string(client, user_key):
    for resp in (client.get("/no/such/route"), client.get("/v1/jobs"),
                 client.get("/v1/jobs", headers=auth(user_key + "x"))):
        assert isinstance(resp.get_json()["error"], str)


def test_health_and_ready(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["checks"] == {"database": "ok", "redis": "ok"}
