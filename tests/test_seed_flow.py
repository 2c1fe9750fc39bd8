"""The seed-002 business flow (docs/api.md, "Seed-002 routes"), end to end over HTTP, exactly as
an integrating business service runs it: create the model -> createTask ->
poll getTaskBatch until done (the claiming call shows it as 2 with its oss_file and
expire_at) -> the signed callback arrives -> fetch oss_file.

Real pieces: the API on a socket, PostgreSQL, Redis, a Celery worker process
storing results in the OSS file service stub, the stub model service and a
callback receiver."""
from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
import requests
from helpers import WorkerProcess, auth, job_row, seed_signature_ok, wait_until

from app.config import set_settings
from app.infra.storage import ObjectMissing, OssStorage, StorageError, get_storage

pytestmark = pytest.mark.e2e

SEED_MODEL = {
    "modelName": "model-service", "modelsType": "1,2,3", "baseUrl": "http://127.0.0.1:8000",
    "route": "/api/v1/chat", "httpMethod": "POST", "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123",
    "enabled": 1, "maxConcurrency": 5, "queueLimit": 20, "timeoutSeconds": 1800, "expectedSeconds": 600,
    "retryTimes": 3, "retryQueueMaxSeconds": 600, "autoCleanSeconds": 3600, "remark": "Model-Service 模型服务",
    "modelKeyHeaders": "X-API-Key",
}
USER_TOKEN = "Bearer business-user-token-7f3a"
USER_INFO = '{"userId": 7, "username": "zhang.san"}'


@pytest.fixture(scope="module")
def seed_worker(request, test_env, oss, tmp_path_factory):
    # A module's SEED_WORKER_ENV: settings its deployment gives the workers as well as the API.
    env = {**test_env, "ASYNCH_STORAGE_URL": f"oss+{oss.base}", "ASYNCH_CALLBACK_ALLOW_HOSTS": "127.0.0.1",
           **getattr(request.module, "SEED_WORKER_ENV", {})}
    w = WorkerProcess(env, log_path=tmp_path_factory.mktemp("seedw") / "worker.log", name="seed").start()
    # Callbacks go to their own queue and worker (`asynch callback-worker`).
    cb = WorkerProcess(env, concurrency=1, log_path=tmp_path_factory.mktemp("seedcb") / "worker.log", name="seedcb",
                       callbacks=True).start()
    yield w
    cb.stop()
    w.stop()


@pytest.fixture(autouse=True)
def _api_settings(settings, oss, receiver):
    # The API (in this process) reads results from the same OSS service and
    # admits the loopback receiver as a callback target.
    set_settings(settings.with_overrides(storage_url=f"oss+{oss.base}", callback_allow_hosts="127.0.0.1"))
    receiver.reset()
    oss.uploads.clear()
    oss.fail_next = 0


def call(method: str, url: str, key: str, **kw) -> dict:
    resp = requests.request(method, url, headers={**auth(key), **kw.pop("headers", {})}, timeout=30, **kw)
    body = resp.json()
    assert resp.status_code == 200 and body["code"] == 0 and body["message"] == "ok", body
    return body["data"]


def test_the_seeds_business_flow_end_to_end(api_url, seed_worker, oss, receiver, model_server, admin_key,
                                            user_key):
    # Operations: the model types the seed example links, then the model itself.
    for i in (1, 2, 3):
        call("POST", f"{api_url}/modelType/create", admin_key, json={"typeId": i, "typeName": f"type-{i}"})
    created = call("POST", f"{api_url}/model/createModel", admin_key,
                   json={**SEED_MODEL, "baseUrl": model_server.url})
    assert created["modelName"] == "model-service" and created["headMsg"] == "API_KEY:***,API_STATE:***,API_NUM:***"

    # Step two: the business service creates a task and keeps its task_id.
    task_id = call("POST", f"{api_url}/task/createTask", user_key,
                   headers={"X-Oss-Authorization": USER_TOKEN, "X-User-Info": USER_INFO},
                   json={"modelName": "model-service", "requestPayload": {"prompt": "你好", "n": 1},
                         "bizName": "order", "callbackUrl": f"{receiver.url}/notify",
                         "modelKey": "X-API-Key:per-request"})["task_id"]

    # Step three: poll getTaskBatch until the task is no longer queued/running.
    def settled():
        (item,) = call("POST", f"{api_url}/task/getTaskBatch", user_key, json={"taskIds": [task_id]})
        return item if item["state"] not in (0, 1) else None

    item = wait_until(settled, timeout=30, interval=0.2, what="task settled")
    assert item["state"] == 2 and item["claimed"] is True  # done, and claimed by this very call
    assert item["oss_file"].startswith(f"{oss.url}/files/") and item["file_type"] == "application/json"
    expire_at = datetime.fromisoformat(item["expire_at"].replace("Z", "+00:00"))
    assert abs(expire_at - (datetime.now(timezone.utc) + timedelta(seconds=3600))) < timedelta(seconds=60)
    again = call("POST", f"{api_url}/task/getTaskBatch", user_key, json={"taskIds": [task_id]})
    assert again[0]["state"] == 4 and again[0]["claimed"] is False and again[0]["expire_at"] == item["expire_at"]
    single = call("GET", f"{api_url}/task/getTaskResult?taskId={task_id}", user_key)
    assert single["state"] == 4 and single["oss_file"] == item["oss_file"]

    # The business side takes the file straight from the OSS service.
    got = requests.get(item["oss_file"], timeout=10)
    assert got.status_code == 200
    assert json.loads(got.content) == {"model": "demo-echo", "echo": {"prompt": "你好", "n": 1}}

    # The callback: GET {callbackUrl}/{bizName} with exactly the seed's fields, signed.
    wait_until(lambda: receiver.requests, timeout=20, what="the callback")
    (cb,) = receiver.requests
    assert cb["path"] == "/notify/order"
    assert cb["query"] == [("task_id", task_id), ("state", "2"), ("oss_file", item["oss_file"]),
                           ("file_type", "application/json")]
    secret = requests.get(f"{api_url}/v1/tenants/tenant-a/callback-secret", headers=auth(user_key),
                          timeout=10).json()["secret"]
    h = cb["headers"]
    assert abs(int(h["X-Asynch-Timestamp"]) - time.time()) < 60
    assert seed_signature_ok(secret, task_id, h["X-Asynch-Timestamp"],
                                   f"{receiver.url}{cb['path']}?{cb['raw_query']}", h["X-Asynch-Signature"])

    # The model got head_msg (values as strings) merged with this task's modelKey.
    (model_call,) = model_server.state.calls
    mh = {k.lower(): v for k, v in model_call["headers"].items()}
    assert (mh["api_key"], mh["api_state"], mh["api_num"], mh["x-api-key"]) == \
        ("model-key", "true", "123", "per-request")
    assert model_call["path"] == "/api/v1/chat" and model_call["payload"] == {"prompt": "你好", "n": 1}

    # The OSS service got the business user's credentials, never our API key;
    # X-User-Info only from a trusted gateway (ASYNCH_TRUSTED_GATEWAY is off here).
    (upload,) = oss.uploads
    assert upload["headers"]["Authorization"] == USER_TOKEN and "X-User-Info" not in upload["headers"]
    assert user_key not in json.dumps(upload["headers"]) and upload["filename"].endswith(".json")
    row = job_row(task_id)
    assert row.creator == "" and row.passthrough_headers is None  # secrets dropped once the job is finished
    for url in (f"{api_url}/task/getTaskResult?taskId={task_id}", f"{api_url}/v1/models/model-service/jobs/{task_id}"):
        assert "business-user-token" not in requests.get(url, headers=auth(user_key), timeout=10).text

    # One call to the model service, counted for the tenant.
    assert call("GET", f"{api_url}/stat/getModelStat?model=model-service", user_key)["total"] == 1
    # The v1 face serves the same result through the OSS backend.
    res = requests.get(f"{api_url}/v1/models/model-service/jobs/{task_id}/result", headers=auth(user_key), timeout=10)
    assert res.status_code == 200 and res.content == got.content


def test_an_oss_refusal_is_retried_without_calling_the_model_again(api_url, seed_worker, oss, make_model,
                                                                   model_server, user_key):
    make_model("m")
    oss.fail_next = 1  # the file service refuses the first upload ({"code": 500})
    task_id = call("POST", f"{api_url}/task/createTask", user_key,
                   json={"modelName": "m", "requestPayload": {"x": 1}})["task_id"]
    wait_until(lambda: job_row(task_id).state == 2, timeout=30, what="done")
    assert len(oss.uploads) == 2 and len(model_server.state.calls) == 1
    assert job_row(task_id).result_location.startswith(f"{oss.url}/files/")


def test_oss_storage_interface(oss, settings):
    st = get_storage()
    assert isinstance(st, OssStorage)
    loc = st.put("2026/01/01/job_x/1", b"\x00bytes", "image/png", context={"Authorization": "Bearer t"})
    assert loc.startswith(f"{oss.url}/files/") and loc.endswith(".png")
    assert oss.uploads[-1]["headers"]["Authorization"] == "Bearer t" and "X-User-Info" not in oss.uploads[-1]["headers"]
    assert st.get(loc) == b"\x00bytes"
    st.delete(loc)  # the service has no delete: a logged no-op
    with pytest.raises(ObjectMissing):
        st.get(f"{oss.url}/files/nope")
    oss.fail_next = 1
    with pytest.raises(StorageError):
        st.put("k", b"x", "text/plain")
    OssStorage(oss.base, settings.with_overrides(oss_authorization="Bearer service")).put("k2", b"x", "text/plain")
    assert oss.uploads[-1]["headers"]["Authorization"] == "Bearer service"  # the operator's fallback
    for body, expect in (({"code": 0, "data": "http://f/1"}, "http://f/1"),
                         ({"code": 200, "data": {"fileUrl": "http://f/2"}}, "http://f/2"),
                         ({"url": "http://f/3"}, "http://f/3"),
                         ({"code": 500, "data": {"url": "http://f/4"}}, None),
                         ({"success": False, "data": "http://f/5"}, None), ([], None)):
        assert OssStorage._file_url(body) == expect, body
