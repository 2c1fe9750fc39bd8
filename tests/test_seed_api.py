"""The seed-002 routes (docs/api.md, "Seed-002 routes") on real PostgreSQL and Redis:
camelCase fields, the {"code","message","data"} envelope for answers and
errors, model and model-type CRUD, createTask validation, getTaskBatch and
its exactly-once claim.  No worker consumes the queue here: done tasks are
produced by running their attempt in-process."""
from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from helpers import auth, job_row
from sqlalchemy import func, select

from app.catalog import model_types
from app.catalog.schemas import ModelTypeInput
from app.clock import as_utc
from app.config import set_settings
from app.infra import secretbox
from app.infra.db import transaction
from app.infra.tables import models, tasks
from app.jobs import execution
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

SEED_MODEL = {
    "modelName": "model-service", "modelsType": "1,2,3", "baseUrl": "http://127.0.0.1:8000",
    "route": "/api/v1/chat", "httpMethod": "POST", "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123",
    "enabled": 1, "maxConcurrency": 5, "queueLimit": 20, "timeoutSeconds": 1800, "expectedSeconds": 600,
    "retryTimes": 3, "retryQueueMaxSeconds": 600, "autoCleanSeconds": 3600, "remark": "Model-Service 模型服务",
}
SEED_MODEL_KEYS = {"modelKeyHeaders": "X-API-Key"}
FORM = [{"field": "prompt", "label": "Prompt", "type": "string", "required": True},
        {"field": "n", "label": "N", "type": "integer", "min": 1, "max": 5}]


@pytest.fixture(autouse=True)
def _types():
    for i in (1, 2, 3):
        model_types.create_type(ModelTypeInput(type_id=i, type_name=f"type {i}"))


def ok(resp) -> dict | list:
    body = resp.get_json()
    assert resp.status_code == 200 and body["code"] == 0 and body["message"] == "ok", body
    return body["data"]


def err(resp, status: int) -> dict:
    body = resp.get_json()
    assert resp.status_code == status, body
    assert body["code"] == status and isinstance(body["message"], str) and body["data"] is None, body
    return body


def pointers(body) -> set[str]:
    return {e["pointer"] for e in body["errors"]}


def stored_model(name: str):
    with transaction() as conn:
        return conn.execute(select(models).where(models.c.model_name == name)).first()


def count_tasks() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar_one()


@pytest.fixture
def seed_model(client, admin_key, model_server):
    def _make(name="model-service", **kw):
        body = {**SEED_MODEL, **SEED_MODEL_KEYS, "modelName": name, "baseUrl": model_server.url, "form": FORM,
                **kw}
        return ok(client.post("/model/createModel", json=body, headers=auth(admin_key)))
    return _make


def done_task(tenant: str, model: str, payload: dict | None = None) -> str:
    job_id = jobs.submit(Principal(tenant, "user", None), model, payload or {"prompt": "x"}).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    return job_id


# --- models --------------------------------------------------------------------------

def test_create_model_with_the_seeds_example_and_read_every_field_back(client, admin_key, user_key):
    data = ok(client.post("/model/createModel", json=SEED_MODEL, headers=auth(admin_key)))
    expected = {**SEED_MODEL, "headMsg": "API_KEY:***,API_STATE:***,API_NUM:***"}
    assert {k: data[k] for k in SEED_MODEL} == expected
    assert set(data) == set(SEED_MODEL) | {"form", "createdAt", "updatedAt", "tenantQueueLimit", "modelKeyHeaders", "maxCompleted",
                                               "streaming"}
    # Stored as given (the secret values included), shown redacted.
    row = stored_model("model-service")
    assert secretbox.decrypt(row.head_msg) == SEED_MODEL["headMsg"] and row.auto_clean_seconds == 3600 and row.enabled is True
    got = ok(client.get("/model/getModel?modelName=model-service", headers=auth(admin_key)))
    assert got == data
    assert [m["modelName"] for m in ok(client.get("/model/listModel", headers=auth(admin_key)))] == ["model-service"]
    # A user key sees what it needs to submit, not endpoints or headers.
    seen = ok(client.get("/model/getModel?modelName=model-service", headers=auth(user_key)))
    assert "headMsg" not in seen and "baseUrl" not in seen and seen["maxConcurrency"] == 5


def test_update_then_delete_a_model(client, admin_key, user_key):
    ok(client.post("/model/createModel", json=SEED_MODEL, headers=auth(admin_key)))
    data = ok(client.post("/model/updateModel", json={"modelName": "model-service", "queueLimit": 3, "enabled": 0,
                                                      "remark": "off"}, headers=auth(admin_key)))
    assert data["queueLimit"] == 3 and data["enabled"] == 0 and data["remark"] == "off"
    assert data["timeoutSeconds"] == 1800  # untouched fields stay
    body = err(client.get("/model/getModel?modelName=model-service", headers=auth(user_key)), 404)
    assert body["message"] == "model not found: model-service"
    ok(client.post("/model/deleteModel", json={"modelName": "model-service"}, headers=auth(admin_key)))
    err(client.get("/model/getModel?modelName=model-service", headers=auth(admin_key)), 404)
    err(client.post("/model/updateModel", json={"modelName": "model-service"}, headers=auth(admin_key)), 404)
    body = err(client.post("/model/updateModel", json={"queueLimit": 3}, headers=auth(admin_key)), 422)
    assert pointers(body) == {"/modelName"}


def test_a_model_view_sent_back_keeps_its_secrets(client, admin_key):
    ok(client.post("/model/createModel", json=SEED_MODEL, headers=auth(admin_key)))
    view = ok(client.get("/model/getModel?modelName=model-service", headers=auth(admin_key)))
    view["remark"] = "edited in a console"
    data = ok(client.post("/model/updateModel", json=view, headers=auth(admin_key)))
    assert data["remark"] == "edited in a console"
    assert secretbox.decrypt(stored_model("model-service").head_msg) == SEED_MODEL["headMsg"]  # not overwritten with ***


@pytest.mark.parametrize("evil", ["API_KEY:x\r\nInjected:1", "API_KEY:x\nB:2", "API_KEY:x\rB:2", "A:1\x00"])
def test_head_msg_with_cr_lf_is_refused_with_422_and_the_model_is_unchanged(client, admin_key, evil):
    ok(client.post("/model/createModel", json=SEED_MODEL, headers=auth(admin_key)))
    before = stored_model("model-service")
    body = err(client.post("/model/updateModel", json={"modelName": "model-service", "headMsg": evil,
                                                       "queueLimit": 7}, headers=auth(admin_key)), 422)
    assert pointers(body) == {"/headMsg"}
    assert stored_model("model-service") == before  # not even queueLimit changed
    body = err(client.post("/model/createModel", json={**SEED_MODEL, "modelName": "other", "headMsg": evil},
                           headers=auth(admin_key)), 422)
    assert pointers(body) == {"/headMsg"}
    assert stored_model("other") is None


def test_validation_lists_every_bad_field_with_camel_case_pointers(client, admin_key):
    bad = {**SEED_MODEL, "modelName": "bad name", "baseUrl": "ftp://x", "httpMethod": "PUT", "maxConcurrency": 0,
           "timeoutSeconds": "10", "modelsType": "1,x", "form": [{"type": "nope"}], "surprise": 1}
    body = err(client.post("/model/createModel", json=bad, headers=auth(admin_key)), 422)
    assert pointers(body) == {"/modelName", "/baseUrl", "/httpMethod", "/maxConcurrency", "/timeoutSeconds",
                              "/modelsType", "/form/0/field", "/form/0/type", "/surprise"}
    assert stored_model("bad name") is None


def test_models_type_ids_must_exist(client, admin_key):
    body = err(client.post("/model/createModel", json={**SEED_MODEL, "modelsType": "1,9,12"},
                           headers=auth(admin_key)), 422)
    assert body["errors"] == [{"pointer": "/modelsType", "message": "unknown model type ids: 9, 12"}]
    assert stored_model("model-service") is None
    ok(client.post("/model/createModel", json=SEED_MODEL, headers=auth(admin_key)))
    body = err(client.post("/model/updateModel", json={"modelName": "model-service", "modelsType": "3,4"},
                           headers=auth(admin_key)), 422)
    assert pointers(body) == {"/modelsType"}
    assert stored_model("model-service").models_type == "1,2,3"


def test_model_types_crud(client, admin_key, user_key):
    created = ok(client.post("/modelType/create", json={"typeName": "chat"}, headers=auth(admin_key)))
    assert created["typeId"] == 4 and created["typeName"] == "chat"  # next free id after 1,2,3
    ok(client.post("/modelType/create", json={"typeId": 10, "typeName": "image", "remark": "r"},
                   headers=auth(admin_key)))
    err(client.post("/modelType/create", json={"typeId": 10, "typeName": "again"}, headers=auth(admin_key)), 409)
    body = err(client.post("/modelType/create", json={"typeName": ""}, headers=auth(admin_key)), 422)
    assert pointers(body) == {"/typeName"}
    upd = ok(client.post("/modelType/update", json={"typeId": 10, "typeName": "images"}, headers=auth(admin_key)))
    assert upd == {**upd, "typeId": 10, "typeName": "images", "remark": "r"}
    listed = ok(client.get("/modelType/list", headers=auth(user_key)))
    assert [t["typeId"] for t in listed] == [1, 2, 3, 4, 10]
    err(client.post("/modelType/create", json={"typeName": "x"}, headers=auth(user_key)), 403)
    ok(client.post("/model/createModel", json={**SEED_MODEL, "modelsType": "10"}, headers=auth(admin_key)))
    body = err(client.post("/modelType/delete", json={"typeId": 10}, headers=auth(admin_key)), 409)
    assert "model-service" in body["message"]
    ok(client.post("/modelType/delete", json={"typeId": 4}, headers=auth(admin_key)))
    err(client.post("/modelType/delete", json={"typeId": 4}, headers=auth(admin_key)), 404)
    assert [t["typeId"] for t in ok(client.get("/modelType/list", headers=auth(user_key)))] == [1, 2, 3, 10]


# --- the envelope for errors ---------------------------------------------------------------

def test_errors_on_seed_routes_use_the_envelope(client, user_key, admin_key):
    resp = client.post("/task/createTask", json={"modelName": "m"})
    assert err(resp, 401)["message"] == "missing API key"
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="asynch"'
    assert err(client.get("/task/noSuchRoute", headers=auth(user_key)), 404)["message"] == "not found"
    resp = client.get("/task/createTask", headers=auth(user_key))
    assert err(resp, 405)["message"] == "method not allowed" and "POST" in resp.headers["Allow"]
    assert err(client.post("/model/createModel", json=SEED_MODEL, headers=auth(user_key)), 403)["message"] == \
        "admin key required"
    resp = client.post("/task/createTask", data=b"{", content_type="application/json", headers=auth(user_key))
    assert err(resp, 400)["message"].startswith("invalid JSON")
    # The v1 face keeps its own error form.
    assert client.get("/v1/nope", headers=auth(user_key)).get_json() == {"error": "not found"}


# --- tasks ---------------------------------------------------------------------------------

def test_create_task_refuses_bad_input_listing_every_field_and_takes_nothing(client, seed_model, user_key, r):
    seed_model("m")
    body = err(client.post("/task/createTask", json={"modelName": "m", "requestPayload": {"n": "three"}},
                           headers=auth(user_key)), 422)
    assert body["message"] == "request body does not match the model's form"
    assert sorted(body["errors"], key=lambda e: e["pointer"]) == [
        {"pointer": "/requestPayload/n", "message": "must be an integer"},
        {"pointer": "/requestPayload/prompt", "message": "is required"},
    ]
    body = err(client.post("/task/createTask", json={"requestPayload": [1], "bizName": 5, "callbackUrl": 7},
                           headers=auth(user_key)), 422)
    assert pointers(body) == {"/modelName", "/requestPayload", "/bizName", "/callbackUrl"}
    for extra, pointer in (({"modelKey": "X-Key:a\r\nEvil:1"}, "/modelKey"),
                           ({"callbackUrl": "ftp://example.com/cb"}, "/callbackUrl"),
                           ({"callbackUrl": "http://127.0.0.1:9/cb"}, "/callbackUrl"),
                           ({"bizName": "x" * 129}, "/bizName")):
        body = err(client.post("/task/createTask", json={"modelName": "m", "requestPayload": {"prompt": "p"},
                                                         **extra}, headers=auth(user_key)), 422)
        assert pointers(body) == {pointer}, extra
    assert err(client.post("/task/createTask", json={"modelName": "nope", "requestPayload": {}},
                           headers=auth(user_key)), 404)["message"] == "model not found: nope"
    ok(client.post("/model/updateModel", json={"modelName": "m", "enabled": 0}, headers=auth(make_admin())))
    err(client.post("/task/createTask", json={"modelName": "m", "requestPayload": {"prompt": "p"}},
                    headers=auth(user_key)), 404)
    assert r.zcard("asynch:gate:{m}") == 0 and count_tasks() == 0


def make_admin() -> str:
    from helpers import make_key

    return make_key("ops2", admin=True)


def test_create_task_then_read_it(client, seed_model, user_key, other_key, r):
    seed_model("m")
    data = ok(client.post("/task/createTask", headers=auth(user_key), json={
        "modelName": "m", "requestPayload": '{"prompt": "hi", "n": 2}', "bizName": "order",
        "modelKey": "X-API-Key:abc", "creator": "alice"}))
    task_id = data["task_id"]
    assert set(data) == {"task_id"} and task_id.startswith("job_")
    assert r.zrange("asynch:gate:{m}", 0, -1) == [task_id]
    row = job_row(task_id)
    assert row.creator == "alice" and row.biz_name == "order" and row.model_key == "X-API-Key:abc"
    res = ok(client.get(f"/task/getTaskResult?taskId={task_id}", headers=auth(user_key)))
    assert res["task_id"] == task_id and res["state"] == 0 and res["oss_file"] is None
    assert "X-API-Key" not in str(res)  # modelKey is a secret
    batch = ok(client.post("/task/getTaskBatch", json={"taskIds": [task_id]}, headers=auth(user_key)))
    assert batch[0]["state"] == 0 and batch[0]["claimed"] is False
    err(client.get(f"/task/getTaskResult?taskId={task_id}", headers=auth(other_key)), 404)
    assert pointers(err(client.get("/task/getTaskResult", headers=auth(user_key)), 422)) == {"/taskId"}


def test_creator_from_x_user_info_only_behind_a_trusted_gateway(client, seed_model, user_key, settings):
    seed_model("m")
    h = {**auth(user_key), "X-User-Info": '{"userId": 42, "username": "zhang.san"}'}
    body = {"modelName": "m", "requestPayload": {"prompt": "p"}, "creator": "claimed-by-client"}
    first = ok(client.post("/task/createTask", json=body, headers=h))["task_id"]
    assert job_row(first).creator == "claimed-by-client"
    # Trusted only with the gateway's proof (issue 21): here its shared secret.
    set_settings(settings.with_overrides(trusted_gateway=True, gateway_secret="gw-secret"))
    assert job_row(ok(client.post("/task/createTask", json=body, headers=h))["task_id"]).creator == "claimed-by-client"
    h["X-Gateway-Secret"] = "gw-secret"
    second = ok(client.post("/task/createTask", json=body, headers=h))["task_id"]
    assert job_row(second).creator == "zhang.san"
    import base64

    h["X-User-Info"] = base64.b64encode(b'{"userName": "li.si"}').decode()
    third = ok(client.post("/task/createTask", json={**body, "creator": None}, headers=h))["task_id"]
    assert job_row(third).creator == "li.si"


def test_get_task_batch_refuses_bad_id_lists(client, user_key, settings):
    set_settings(settings.with_overrides(batch_max_ids=5))
    for body, pointer in (({}, "/taskIds"), ({"taskIds": "job_1"}, "/taskIds"), ({"taskIds": ["a", 5]}, "/taskIds/1"),
                          ({"taskIds": [f"job_{i}" for i in range(6)]}, "/taskIds")):
        assert pointers(err(client.post("/task/getTaskBatch", json=body, headers=auth(user_key)), 422)) == {pointer}
    assert ok(client.post("/task/getTaskBatch", json={"taskIds": []}, headers=auth(user_key))) == []


def test_get_task_batch_claims_only_the_callers_done_tasks(client, seed_model, user_key):
    seed_model("m", autoCleanSeconds=120)
    mine, theirs = done_task("tenant-a", "m"), done_task("tenant-b", "m")
    pending = jobs.submit(Principal("tenant-a", "user", None), "m", {"prompt": "later"}).row.id
    data = ok(client.post("/task/getTaskBatch", json={"taskIds": [mine, theirs, pending, "job_nope", mine]},
                          headers=auth(user_key)))
    assert [d["task_id"] for d in data] == [mine, theirs, pending, "job_nope"]
    # The claiming call shows it as done (2): the seed's client downloads on 2.
    assert data[0]["state"] == 2 and data[0]["claimed"] is True and data[0]["oss_file"].startswith("file:")
    assert data[0]["file_type"] == "application/json"
    for d in (data[1], data[3]):
        assert d == {"task_id": d["task_id"], "state": None, "oss_file": None, "error": "task not found",
                     "claimed": False}
    assert data[2]["state"] == 0 and data[2]["claimed"] is False
    row = job_row(mine)
    assert row.state == JobState.CLAIMED
    assert as_utc(row.expire_at) - as_utc(row.claimed_at) == timedelta(seconds=120)
    assert data[0]["expire_at"] == as_utc(row.expire_at).isoformat().replace("+00:00", "Z")
    assert job_row(theirs).state == JobState.DONE and job_row(theirs).expire_at is None
    again = ok(client.post("/task/getTaskBatch", json={"taskIds": [mine]}, headers=auth(user_key)))
    assert again[0]["state"] == 4 and again[0]["claimed"] is False and again[0]["expire_at"] == data[0]["expire_at"]


def test_get_task_batch_gives_each_task_its_own_models_retention(client, seed_model, user_key):
    seed_model("short", autoCleanSeconds=60)
    seed_model("long", autoCleanSeconds=7200)
    seed_model("gone", autoCleanSeconds=5)
    a, b, c = done_task("tenant-a", "short"), done_task("tenant-a", "long"), done_task("tenant-a", "gone")
    with transaction() as conn:
        conn.execute(models.delete().where(models.c.model_name == "gone"))
    data = ok(client.post("/task/getTaskBatch", json={"taskIds": [a, b, c]}, headers=auth(user_key)))
    assert [d["claimed"] for d in data] == [True, True, True]
    from app.transitions import DEFAULT_KEEP_SECONDS

    for jid, keep in ((a, 60), (b, 7200), (c, DEFAULT_KEEP_SECONDS)):
        row = job_row(jid)
        assert row.state == JobState.CLAIMED
        assert as_utc(row.expire_at) - as_utc(row.claimed_at) == timedelta(seconds=keep), jid


def test_200_concurrent_batch_calls_claim_each_of_50_done_tasks_exactly_once(api_url, client, seed_model, user_key):
    seed_model("m", autoCleanSeconds=900, queueLimit=100)
    ids = [done_task("tenant-a", "m", {"prompt": str(i)}) for i in range(50)]
    barrier = threading.Barrier(200)

    def call(i):
        mine = ids[:]
        random.Random(i).shuffle(mine)  # every order: the locks must not deadlock
        barrier.wait()
        return requests.post(f"{api_url}/task/getTaskBatch", json={"taskIds": mine}, headers=auth(user_key),
                             timeout=120)

    with ThreadPoolExecutor(200) as ex:
        answers = list(ex.map(call, range(200)))
    assert [a.status_code for a in answers] == [200] * 200
    winners: dict[str, list[str]] = {i: [] for i in ids}
    for a in answers:
        body = a.json()
        assert body["code"] == 0
        for d in body["data"]:
            # The one claiming answer shows done (2); every other shows claimed (4).
            assert d["state"] == (2 if d["claimed"] else 4), d
            if d["claimed"]:
                winners[d["task_id"]].append(d["expire_at"])
    assert all(len(w) == 1 for w in winners.values()), {k: len(v) for k, v in winners.items()}
    with transaction() as conn:
        rows = conn.execute(select(tasks).where(tasks.c.id.in_(ids))).all()
    for row in rows:
        assert row.state == JobState.CLAIMED
        # expire_at is the one the winner set, never overwritten by a later call.
        assert as_utc(row.expire_at).isoformat().replace("+00:00", "Z") == winners[row.id][0]
        assert as_utc(row.expire_at) - as_utc(row.claimed_at) == timedelta(seconds=900)


def test_a_batch_call_never_shows_a_done_task_it_did_not_claim(seed_model):
    """A task that turns done while getTaskBatch runs (between its claim and its read) is claimed by that
    call: the seed client downloads on state 2 and counts on the claim (it showed 2 unclaimed, and
    getTaskResult then said 2, not 4: seed_flow.py's gateway run, once)."""
    from app import transitions
    from app.clock import now

    seed_model("race", autoCleanSeconds=120)
    p = Principal("tenant-a", "user", None)
    shown_unclaimed = []
    for _round in range(30):
        ids = [jobs.submit(p, "race", {"prompt": str(i)}).row.id for i in range(8)]
        with transaction() as conn:
            for j in ids:
                transitions.claim(conn, j, 0, now() + timedelta(minutes=1))
        stop = threading.Event()

        def finish_them():
            from app.jobs import effects

            for j in ids:
                with effects.collecting() as due, transaction() as conn:
                    due.add(transitions.complete(conn, j, 1, location="x", content_type="t", size=0))

        t = threading.Thread(target=finish_them)
        t.start()
        while t.is_alive() or not stop.is_set():
            if not t.is_alive():
                stop.set()
            for d in jobs.get_task_batch(p, ids):
                if d.state == 2 and not d.claimed:
                    shown_unclaimed.append(d.task_id)
        t.join()
    assert not shown_unclaimed, shown_unclaimed
