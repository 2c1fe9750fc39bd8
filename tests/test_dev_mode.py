"""Dev-mode parity (issue "restructure", part 5): `asynch dev` on SQLite
serves every route as production does -- through the same gunicorn gevent
path -- with its own job worker, callback worker and beat.

One real `python -m app.cli dev` process (its own SQLite file, Redis
databases, storage directory and queue names): the admin key it prints
runs the v1 flow (submit, wait, result, list, cancel) and the seed-002 flow
(createModel with a form, createTask, getTaskResult until done,
getTaskBatch claims, getTaskResult shows claimed); then every GET route of
its OpenAPI document answers without a 5xx; SIGTERM stops it all."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
from conftest import BROKER_DB, GATE_DB, REDIS_BASE, ROOT, free_port, wait_until

pytestmark = pytest.mark.e2e

KEY_LINE = re.compile(r'Admin key \(tenant "demo"\): (\S+)')


@pytest.fixture
def dev_stack(tmp_path):
    port, model_port = free_port(), free_port()
    log = tmp_path / "dev.log"
    env = {**os.environ,
           "ASYNCH_DATABASE_URL": f"sqlite:///{tmp_path}/asynch.db",
           "ASYNCH_REDIS_URL": f"{REDIS_BASE}/{GATE_DB}",
           "ASYNCH_BROKER_URL": f"{REDIS_BASE}/{BROKER_DB}",
           "ASYNCH_STORAGE_URL": f"file://{tmp_path}/results",
           "ASYNCH_QUEUE_NAME": f"asynch-dev-{os.getpid()}",
           "ASYNCH_CALLBACK_QUEUE_NAME": f"asynch-dev-{os.getpid()}-callbacks",
           "ASYNCH_WORKER_METRICS_PORT": "0",
           "ASYNCH_LOG_LEVEL": "WARNING"}
    env.pop("ASYNCH_METRICS_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "dev", "--port", str(port), "--model-port",
                             str(model_port)], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)

    def key() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"asynch dev exited {proc.returncode}: {log.read_text()[-3000:]}")
        m = KEY_LINE.search(log.read_text(errors="replace"))
        return m.group(1) if m else None

    children: set[int] = set()
    try:
        k = wait_until(key, timeout=120, interval=0.2, what="asynch dev's admin key")
        children |= _descendants({proc.pid})
        assert len(children) >= 4, children  # the API, two worker nodes, beat (and their own children)
        yield {"base": f"http://127.0.0.1:{port}", "key": k, "model_url": f"http://127.0.0.1:{model_port}",
               "proc": proc, "log": log, "children": children}
    finally:
        for pid in {proc.pid} | children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)


def _descendants(roots: set[int]) -> set[int]:
    """Live processes among ``roots`` and all their descendants."""
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if not os.path.exists(f"/proc/{pid}") or "Z" in _state(pid):
            continue
        out.add(pid)
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        todo += [int(k) for k in kids]
    return out


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_every_route_works_under_asynch_dev_on_sqlite(dev_stack):
    base, h = dev_stack["base"], {"Authorization": f"Bearer {dev_stack['key']}"}

    def call(method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, base + path, headers=h, timeout=30, **kw)

    # v1: submit, wait, result, list, cancel.
    r = call("POST", "/v1/models/demo-echo/jobs", json={"prompt": "hello"})
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    w = call("GET", f"/v1/models/demo-echo/jobs/{job}/wait?timeout=30000")
    assert w.status_code == 200 and w.json()["state"] == "done", w.text
    res = call("GET", f"/v1/models/demo-echo/jobs/{job}/result")
    assert res.status_code == 200 and res.json()["echo"]["prompt"] == "hello", res.text
    listed = call("GET", "/v1/models/demo-echo/jobs").json()["jobs"]
    assert job in [j["job_id"] for j in listed]
    slow = call("POST", "/v1/models/demo-echo/jobs", json={"prompt": "slow", "sleep_ms": 20000}).json()["job_id"]
    c = call("POST", f"/v1/models/demo-echo/jobs/{slow}/cancel")
    assert c.status_code == 200 and c.json()["state"] == "canceled", c.text

    # seed 002: createModel (with a form), createTask, getTaskResult, getTaskBatch.
    form = [{"field": "prompt", "label": "Prompt", "type": "string", "required": True}]
    m = call("POST", "/model/createModel", json={
        "modelName": "seed-echo", "baseUrl": dev_stack["model_url"], "route": "/echo", "httpMethod": "POST",
        "enabled": 1, "maxConcurrency": 2, "queueLimit": 20, "timeoutSeconds": 30, "expectedSeconds": 1,
        "retryTimes": 1, "autoCleanSeconds": 3600, "form": form})
    assert m.status_code == 200 and m.json()["code"] == 0, m.text
    bad = call("POST", "/task/createTask", json={"modelName": "seed-echo", "requestPayload": {}})
    assert bad.status_code == 422 and bad.json()["code"] == 422, bad.text
    t = call("POST", "/task/createTask", json={"modelName": "seed-echo", "requestPayload": {"prompt": "p"}})
    assert t.status_code == 200 and t.json()["code"] == 0, t.text
    task = t.json()["data"]["task_id"]

    def state() -> int:
        return call("GET", f"/task/getTaskResult?taskId={task}").json()["data"]["state"]

    wait_until(lambda: state() == 2, timeout=60, what="the seed task done")
    batch = call("POST", "/task/getTaskBatch", json={"taskIds": [task]})
    assert batch.status_code == 200, batch.text
    entry = batch.json()["data"][0]
    assert entry["state"] == 2 and entry["claimed"] is True, entry
    assert state() == 4

    # Every GET route of the OpenAPI document, with the key: no 5xx.
    doc = call("GET", "/openapi.json").json()
    values = {"model": "demo-echo", "job_id": job, "name": "demo-echo", "tenant": "demo"}
    queries = {"/model/getModel": "?modelName=seed-echo", "/task/getTaskResult": f"?taskId={task}",
               "/v1/models/{model}/jobs/{job_id}/wait": "?timeout=1"}
    answered = {}
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        url = re.sub(r"\{(\w+)\}", lambda g: values[g.group(1)], path) + queries.get(path, "")
        # stream=True: an event stream answers its status and headers at
        # once and then stays open (the tenant's stream never ends by itself).
        with call("GET", url, stream=True) as resp:
            answered[path] = resp.status_code
            if resp.ok and resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                assert next(resp.iter_lines(), None) is not None  # its first line came
    assert len(answered) >= 30, answered
    broken = {p: s for p, s in answered.items() if s >= 500}
    assert not broken, f"5xx under asynch dev: {broken}"

    # SIGTERM stops the API, the workers and beat, and asynch dev itself.
    proc = dev_stack["proc"]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(40) == 0
    assert time.monotonic() - t0 < 40
    assert not _descendants(dev_stack["children"]), "processes left behind"
