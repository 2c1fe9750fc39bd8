"""What docs/migrating.md tells a seed-002 deployment (issue 32 item 3): a
model created from the seed's own createModel example (no modelKeyHeaders)
follows ASYNCH_MODEL_KEY_HEADERS_DEFAULT whenever it is set -- its jobs'
modelKey passes at createTask and is sent to the model -- while a model that
named its own (even none) keeps them; and the differences the document lists:
a second createModel is 409, headMsg reads back masked, a form sent as a JSON
string is 422 while a string requestPayload is accepted.

Real pieces: PostgreSQL, Redis, the stub model over HTTP (it records the
headers of each call); the attempt runs here, as a worker runs it."""
from __future__ import annotations

from helpers import auth

from app.catalog import transfer
from app.clock import now
from app.config import get_settings, set_settings
from app.infra.db import transaction
from app.infra.tables import model_types
from app.jobs import execution


def _seed_example(base_url: str, name: str = "model-service") -> dict:
    """The seed's createModel request example, as printed (only the model's address is the stub's)."""
    return {"modelName": name, "modelsType": "1,2,3", "baseUrl": base_url, "route": "/api/v1/chat",
            "httpMethod": "POST", "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123", "enabled": 1,
            "maxConcurrency": 5, "queueLimit": 20, "timeoutSeconds": 1800, "expectedSeconds": 600, "retryTimes": 3,
            "retryQueueMaxSeconds": 600, "autoCleanSeconds": 3600, "remark": "Model-Service 模型服务"}


def _fresh_install_types() -> None:
    # What migration 0012_seed_dropin puts in (the test tables are emptied between tests).
    with transaction() as conn:
        for i in (1, 2, 3):
            conn.execute(model_types.insert().values(type_id=i, type_name=f"seed type {i}", remark="",
                                                     created_at=now()))


def _create_task(client, key, model: str, model_key: str):
    return client.post("/task/createTask", headers=auth(key), json={
        "modelName": model, "requestPayload": {"prompt": "hi"}, "bizName": "order", "modelKey": model_key})


def test_a_model_from_the_seeds_example_follows_the_default_set_after_it(client, model_server, admin_key, user_key):
    _fresh_install_types()
    made = client.post("/model/createModel", json=_seed_example(model_server.url), headers=auth(admin_key))
    assert made.get_json()["code"] == 0, made.get_json()
    refused = _create_task(client, user_key, "model-service", "X-API-Key:per-task")
    assert refused.status_code == 422 and refused.get_json()["errors"][0]["pointer"] == "/modelKey", refused.get_json()

    # The operator sets the default afterwards: the model, never told otherwise, follows it.
    set_settings(get_settings().with_overrides(model_key_headers_default="X-API-Key"))
    task = _create_task(client, user_key, "model-service", "X-API-Key:per-task").get_json()
    assert task["code"] == 0, task
    assert execution.run_attempt(task["data"]["task_id"], 0) == "done"
    (call,) = model_server.state.calls
    assert call["headers"].get("X-API-Key") == "per-task" and call["headers"].get("API_KEY") == "model-key", call
    shown = client.get("/model/getModel?modelName=model-service", headers=auth(admin_key)).get_json()["data"]
    assert shown["modelKeyHeaders"] == "X-API-Key"  # the names in force
    # Exported without the field: the imported model follows its own deployment's default too.
    assert "model_key_headers" not in transfer.export_models(["model-service"])[0]

    # A model that named its own keeps them: none (empty, or null: "none" on the seed face) stays none.
    for name, own in (("locked", ""), ("locked-null", None)):
        made = client.post("/model/createModel", json={**_seed_example(model_server.url, name),
                                                       "modelKeyHeaders": own}, headers=auth(admin_key))
        assert made.get_json()["data"]["modelKeyHeaders"] == "", made.get_json()
        refused = _create_task(client, user_key, name, "X-API-Key:per-task")
        assert refused.status_code == 422 and refused.get_json()["errors"] == [
            {"pointer": "/modelKey", "message": "header X-API-Key may not be set by a job (not in the model's "
                                                "model_key_headers)"}], refused.get_json()
        assert transfer.export_models([name])[0]["model_key_headers"] == ""


def test_the_seed_002_differences_docs_migrating_names(client, model_server, admin_key, user_key):
    _fresh_install_types()
    example = _seed_example(model_server.url)
    assert client.post("/model/createModel", json=example, headers=auth(admin_key)).get_json()["code"] == 0
    # The seed creates or updates by the unique modelName; here a second create is 409: update with updateModel.
    again = client.post("/model/createModel", json=example, headers=auth(admin_key))
    assert again.status_code == 409 and again.get_json() == {
        "code": 409, "message": "model already exists: model-service", "data": None}
    updated = client.post("/model/updateModel", json={**example, "remark": "changed"}, headers=auth(admin_key))
    assert updated.get_json()["data"]["remark"] == "changed"
    # headMsg is a secret: read back masked; sent back as read, it keeps the stored values.
    shown = client.get("/model/getModel?modelName=model-service", headers=auth(admin_key)).get_json()["data"]
    assert shown["headMsg"] == "API_KEY:***,API_STATE:***,API_NUM:***"
    # form must be a JSON array: a string holding one is refused; requestPayload may be either.
    form = '[{"field": "prompt", "label": "Prompt", "type": "string", "required": true}]'
    bad = client.post("/model/updateModel", json={"modelName": "model-service", "form": form}, headers=auth(admin_key))
    assert bad.status_code == 422 and bad.get_json()["errors"][0]["pointer"] == "/form", bad.get_json()
    as_text = client.post("/task/createTask", headers=auth(user_key), json={
        "modelName": "model-service", "requestPayload": '{"prompt": "as a string"}'})
    assert as_text.get_json()["code"] == 0, as_text.get_json()
