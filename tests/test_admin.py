"""Model CRUD and API keys over v1: admins only, validated, secrets redacted."""
from __future__ import annotations

import pytest
from helpers import auth
from sqlalchemy import select

from app.catalog import model_types
from app.catalog.schemas import ModelTypeInput
from app.infra import secretbox
from app.infra.db import transaction
from app.infra.tables import api_keys, models

MODEL = {"model_name": "chat", "base_url": "http://127.0.0.1:9/", "route": "/api/v1/chat",
         "http_method": "post", "head_msg": "API_KEY:model-key,API_STATE:true,API_NUM:123",
         "max_concurrency": 5, "queue_limit": 20, "timeout_seconds": 1800, "expected_seconds": 600,
         "retry_times": 3, "retry_queue_max_seconds": 600, "auto_clean_seconds": 3600,
         "models_type": "1, 2,3", "remark": "chat model",
         "form": [{"field": "prompt", "label": "Prompt", "type": "text", "required": True}]}


@pytest.fixture(autouse=True)
def _types():
    # MODEL's models_type names these; unknown type ids are refused.
    for i in (1, 2, 3):
        model_types.create_type(ModelTypeInput(type_id=i, type_name=f"type {i}"))


def test_admin_creates_reads_updates_deletes_a_model(client, admin_key):
    resp = client.post("/v1/models", json=MODEL, headers=auth(admin_key))
    assert resp.status_code == 201, resp.get_json()
    m = resp.get_json()
    assert m["head_msg"] == "API_KEY:***,API_STATE:***,API_NUM:***"
    assert m["http_method"] == "POST" and m["base_url"] == "http://127.0.0.1:9" and m["models_type"] == "1,2,3"
    with transaction() as conn:
        assert secretbox.decrypt(conn.execute(select(models.c.head_msg)).scalar_one()) == MODEL["head_msg"]
    assert client.post("/v1/models", json=MODEL, headers=auth(admin_key)).status_code == 409
    resp = client.patch("/v1/models/chat", json={"queue_limit": 3, "enabled": 0}, headers=auth(admin_key))
    assert resp.status_code == 200 and resp.get_json()["queue_limit"] == 3 and resp.get_json()["enabled"] is False
    assert client.get("/v1/models/chat", headers=auth(admin_key)).get_json()["queue_limit"] == 3
    assert client.delete("/v1/models/chat", headers=auth(admin_key)).status_code == 204
    assert client.get("/v1/models/chat", headers=auth(admin_key)).status_code == 404


def test_model_validation_lists_every_field_and_changes_nothing(client, admin_key):
    bad = {"model_name": "bad name!", "base_url": "ftp://x", "http_method": "PUT", "queue_limit": -1,
           "timeout_seconds": 0, "head_msg": "X-A:1\r\nInjected: yes", "form": [{"type": "nope"}],
           "surprise": 1}
    resp = client.post("/v1/models", json=bad, headers=auth(admin_key))
    assert resp.status_code == 422
    pointers = {e["pointer"] for e in resp.get_json()["errors"]}
    assert {"/model_name", "/base_url", "/http_method", "/queue_limit", "/timeout_seconds", "/head_msg",
            "/form/0/field", "/form/0/type", "/surprise"} <= pointers
    with transaction() as conn:
        assert conn.execute(select(models)).first() is None


def test_header_injection_is_refused_on_update_and_model_unchanged(client, admin_key):
    client.post("/v1/models", json=MODEL, headers=auth(admin_key))
    for evil in ("A:1\r\nB:2", "A:1\nB:2", "A:1\x00"):
        resp = client.patch("/v1/models/chat", json={"head_msg": evil}, headers=auth(admin_key))
        assert resp.status_code == 422
        assert resp.get_json()["errors"][0]["pointer"] == "/head_msg"
    with transaction() as conn:
        assert secretbox.decrypt(conn.execute(select(models.c.head_msg)).scalar_one()) == MODEL["head_msg"]


def test_users_cannot_administer(client, user_key, admin_key):
    client.post("/v1/models", json=MODEL, headers=auth(admin_key))
    for method, url, body in (("post", "/v1/models", MODEL), ("patch", "/v1/models/chat", {"queue_limit": 1}),
                              ("delete", "/v1/models/chat", None), ("post", "/v1/keys", {"tenant": "x"}),
                              ("get", "/v1/keys", None), ("delete", "/v1/keys/1", None)):
        resp = getattr(client, method)(url, json=body, headers=auth(user_key))
        assert resp.status_code == 403, url
        assert resp.get_json() == {"error": "admin key required"}
    # Users see enabled models without their secrets or endpoints.
    seen = client.get("/v1/models", headers=auth(user_key)).get_json()["models"]
    assert [m["model_name"] for m in seen] == ["chat"]
    assert "head_msg" not in seen[0] and "base_url" not in seen[0]


def test_keys_are_shown_once_and_stored_hashed(client, admin_key):
    resp = client.post("/v1/keys", json={"tenant": "acme", "name": "ci"}, headers=auth(admin_key))
    assert resp.status_code == 201
    key = resp.get_json()["key"]
    assert key.startswith("ak_")
    with transaction() as conn:
        rows = conn.execute(select(api_keys)).all()
    assert all(key not in "|".join(map(str, row)) for row in rows)
    listed = client.get("/v1/keys?tenant=acme", headers=auth(admin_key)).get_json()["keys"]
    assert len(listed) == 1 and "key" not in listed[0] and listed[0]["role"] == "user"
    assert client.get("/v1/jobs", headers=auth(key)).status_code == 200
    bad = client.post("/v1/keys", json={"tenant": "bad tenant"}, headers=auth(admin_key))
    assert bad.status_code == 422


def test_a_sole_key_is_kept_while_valid_and_every_other_of_its_name_is_revoked(client):
    """`asynch dev`'s admin key (issue 32, item 7): reused at every start, and
    one live key of its name whatever came before (earlier starts minted one each)."""
    from app.tenancy import keys

    def live() -> list[str]:
        with transaction() as conn:
            return [r.prefix for r in conn.execute(select(api_keys).where(
                api_keys.c.name == "asynch dev", api_keys.c.revoked_at.is_(None)))]

    older = [keys.create_key("demo", "admin", "asynch dev")[0] for _ in range(3)]
    other = keys.create_key("demo", "admin", "ci")[0]
    first = keys.sole_key("demo", "admin", "asynch dev", None)
    assert first not in older and live() == [first.split("_")[1]]
    assert keys.sole_key("demo", "admin", "asynch dev", first) == first  # kept
    # A revoked one (`asynch keys revoke`) is not revived: a new one replaces it and every other.
    again = keys.sole_key("demo", "admin", "asynch dev", older[0])
    assert again not in (first, *older) and live() == [again.split("_")[1]]
    for k in (*older, first):
        assert client.get("/v1/jobs", headers=auth(k)).status_code == 401
    for k in (again, other):  # the key of another name is untouched
        assert client.get("/v1/jobs", headers=auth(k)).status_code == 200


@pytest.mark.parametrize("method", ["patch", "put"])
def test_null_text_fields_mean_empty_on_a_change(client, admin_key, method):
    """null for a text field is "none" on a change, also for model_key_headers,
    whose default comes from a setting (schemathesis found a 500 here: the
    NOT NULL column got None)."""
    client.post("/v1/models", json={**MODEL, "model_key_headers": "X-Trace"}, headers=auth(admin_key))
    body = {"model_key_headers": None, "remark": None, "route": None}
    if method == "put":
        body = {**MODEL, **body}
    resp = getattr(client, method)("/v1/models/chat", json=body, headers=auth(admin_key))
    assert resp.status_code == 200, resp.get_json()
    view = resp.get_json()
    assert (view["model_key_headers"], view["remark"], view["route"]) == ("", "", "")
    with transaction() as conn:
        assert conn.execute(select(models.c.model_key_headers)).scalar_one() == ""
