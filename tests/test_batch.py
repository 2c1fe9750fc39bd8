"""Batch submit (issue 16 item 3): POST /v1/models/{m}/jobs:batch judges
every item on its own (202/422/429 in a 207 body), passes the valid ones
through one gate step and one INSERT (one LPUSH for what may run), and keeps
Idempotency-Keys per item.  Over HTTP on the real API, PostgreSQL, Redis and
Celery workers."""
from __future__ import annotations

import pytest
import requests
from helpers import Count, WorkerProcess, auth, gate_depth, wait_until
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import handoff

pytestmark = pytest.mark.e2e


def _batch(api_url, key, model, jobs, **headers):
    return requests.post(f"{api_url}/v1/models/{model}/jobs:batch", json={"jobs": jobs},
                         headers={**auth(key), **headers}, timeout=60)


def _rows(model: str) -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.model_name == model)).scalar_one()


def test_each_item_is_admitted_or_refused_on_its_own(api_url, make_model, user_key):
    make_model("bm", queue_limit=3, max_concurrency=1)
    jobs = [{"payload": {"i": 0}}, {"payload": "not an object"}, {"payload": {"i": 2}, "callback_url": "http://10.0.0.1/x"},
            {"payload": {"i": 3}, "bogus": 1}, {"payload": {"i": 4}}, {"payload": {"i": 5}}, {"payload": {"i": 6}}]
    r = _batch(api_url, user_key, "bm", jobs)
    assert r.status_code == 207, r.text
    body = r.json()
    res = body["results"]
    assert [x["index"] for x in res] == list(range(7))
    assert [x["status"] for x in res] == [202, 422, 422, 422, 202, 202, 429], res
    assert body["admitted"] == 3 and body["refused"] == 4
    assert res[1]["errors"][0]["pointer"] == "/jobs/1/payload"
    assert res[2]["errors"][0]["pointer"] == "/jobs/2/callback_url"
    assert res[3]["errors"][0]["pointer"] == "/jobs/3/bogus"
    assert res[6]["error"].startswith("async queue full (max 3)") and res[6]["retry_after"] >= 1
    for x in (res[0], res[4], res[5]):
        assert x["job_id"].startswith("job_") and x["state"] == "pending" and x["poll_url"].endswith(x["job_id"])
    # Refused items took nothing: 3 rows, 3 slots.
    assert _rows("bm") == 3 and gate_depth("bm") == 3
    got = requests.get(api_url + res[0]["poll_url"], headers=auth(user_key), timeout=10)
    assert got.status_code == 200 and got.json()["state"] in ("pending", "running")


def test_the_whole_batch_is_refused_only_for_what_concerns_it_all(api_url, make_model, user_key):
    make_model("bm2")
    assert _batch(api_url, user_key, "nope", [{"payload": {}}]).status_code == 404
    assert _batch(api_url, user_key, "bm2", []).status_code == 422
    r = _batch(api_url, user_key, "bm2", [{"payload": {}}] * 1001)
    assert r.status_code in (413, 422), r.status_code
    assert requests.post(f"{api_url}/v1/models/bm2/jobs:batch", data="[]", headers=auth(user_key),
                         timeout=10).status_code == 400
    assert _rows("bm2") == 0


def test_idempotency_keys_per_item(api_url, make_model, user_key, other_key):
    make_model("bmi", queue_limit=50)
    first = _batch(api_url, user_key, "bmi", [{"payload": {"a": 1}, "idempotency_key": "k1"},
                                               {"payload": {"a": 2}, "idempotency_key": "k2"},
                                               {"payload": {"a": 1}, "idempotency_key": "k1"},
                                               {"payload": {"a": 9}, "idempotency_key": "k2"}]).json()["results"]
    assert [x["status"] for x in first] == [202, 202, 202, 422], first
    assert first[2]["job_id"] == first[0]["job_id"] and first[2]["replayed"] is True
    assert first[3]["errors"][0]["pointer"] == "/jobs/3/idempotency_key"
    again = _batch(api_url, user_key, "bmi", [{"payload": {"a": 2}, "idempotency_key": "k2"},
                                               {"payload": {"a": 3}, "idempotency_key": "k3"}]).json()["results"]
    assert again[0]["status"] == 202 and again[0]["replayed"] is True and again[0]["job_id"] == first[1]["job_id"]
    assert again[1]["status"] == 202 and "replayed" not in again[1]
    # A single submit with the same key replays the batch's job; another tenant's key is its own.
    r = requests.post(f"{api_url}/v1/models/bmi/jobs", json={"a": 3}, headers={**auth(user_key), "Idempotency-Key": "k3"},
                      timeout=10)
    assert r.status_code == 202 and r.json()["job_id"] == again[1]["job_id"]
    other = _batch(api_url, other_key, "bmi", [{"payload": {"a": 1}, "idempotency_key": "k1"}]).json()["results"]
    assert other[0]["status"] == 202 and other[0]["job_id"] != first[0]["job_id"]
    assert _rows("bmi") == 4


@pytest.fixture
def own_workers(test_env, tmp_path):
    """Workers for one test: the module's (conftest ``workers``) would live on into the tests after it
    and run their jobs, so their "the slot is still held" checks raced it (a red CI run)."""
    w = WorkerProcess(test_env, concurrency=2, log_path=tmp_path / "worker.log").start()
    yield w
    w.stop()


def test_a_batch_of_1000_is_one_insert_one_gate_step_and_one_lpush(api_url, make_model, user_key, own_workers):
    make_model("bulk", queue_limit=5000, max_concurrency=50)
    _batch(api_url, user_key, "bulk", [{"payload": {"warm": 1}}])  # scripts loaded, connections open
    assert handoff.flush(5)
    jobs = [{"payload": {"i": i}} for i in range(1000)]
    with Count() as c:
        r = _batch(api_url, user_key, "bulk", jobs)
        assert handoff.flush(10)
    assert r.status_code == 207 and r.json()["admitted"] == 1000, r.text[:500]
    assert c.sql.count("INSERT") == 1, c.sql
    assert c.redis.count("EVALSHA") == 2, c.redis  # the gate step, then the outbox's one dispatch step
    assert c.redis.count("LPUSH") == 1, c.redis  # every message that may run now, in one LPUSH
    assert _rows("bulk") == 1001
    # and they run: all done through the real workers
    wait_until(lambda: _done("bulk") == 1001, timeout=120, what="the batch done")


def _done(model: str) -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.model_name == model,
                                                                          tasks.c.state == 2)).scalar_one()


def test_nul_is_data_in_a_payload_and_a_422_anywhere_else(api_url, make_model, user_key):
    make_model("bmn", queue_limit=10)
    raw = ('{"jobs": [{"payload": {"t": "a\\u0000b"}}, {"payload": {}, "callback_url": "http://example.com/\\u0000"},'
           ' {"payload": {}, "biz_name": "x\\u0000"}, {"payload": {}, "idempotency_key": "k\\u0000"},'
           ' {"payload": {}, "model_key": "A:\\u0000"}]}')
    r = requests.post(f"{api_url}/v1/models/bmn/jobs:batch", data=raw, timeout=10,
                      headers={**auth(user_key), "Content-Type": "application/json"})
    assert r.status_code == 207, r.text
    assert [x["status"] for x in r.json()["results"]] == [202, 422, 422, 422, 422], r.text
    assert _rows("bmn") == 1


def test_an_item_whose_model_key_the_model_refuses_is_that_items_422(api_url, make_model, user_key, r):
    """The batch runs the single submit's rule (app/jobs/submission.py): a
    model_key setting a header the model does not allow (Host) is refused at
    submit -- before, the item got 202, took a slot and then failed
    permanently with "model call not sent"."""
    make_model("bmk", model_key_headers="X-Custom")
    res = _batch(api_url, user_key, "bmk", [{"payload": {"i": 0}, "model_key": "Host:admin.internal"},
                                             {"payload": {"i": 1}, "model_key": "X-Custom:1"}]).json()["results"]
    assert [x["status"] for x in res] == [422, 202], res
    assert [e["pointer"] for e in res[0]["errors"]] == ["/jobs/0/model_key"]
    assert "may not be set" in res[0]["errors"][0]["message"]
    assert _rows("bmk") == 1 and gate_depth("bmk") == 1
