"""A full queue's Retry-After tells the truth (issue 32 item 4): it comes from
what the queue estimates know -- the model's measured run time, the
attempts under way -- capped by ASYNCH_QUEUE_RETRY_AFTER_MAX_SECONDS, and
falls back to expected_seconds only without a measurement.

Real pieces: PostgreSQL, Redis (the gate, the dispatcher's run-time
average), the stub model over HTTP; the attempts that give the model its
measured run time run here (app.jobs.execution), as a worker runs them."""
from __future__ import annotations

from helpers import auth, job_row, permits, wait_until

from app.config import get_settings, set_settings
from app.jobs import execution
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

USER = Principal("tenant-a", "user", None)


def _submit(client, key, model, body):
    return client.post(f"/v1/models/{model}/jobs", json=body, headers=auth(key))


def _fill(client, key, model, n):
    for i in range(n):
        resp = _submit(client, key, model, {"fill": i})
        assert resp.status_code == 202, resp.get_data(as_text=True)


def test_a_model_measured_at_a_fifth_of_a_second_answers_a_small_retry_after(client, make_model, model_server,
                                                                             user_key):
    # expected_seconds left at the seed's default (600): the configuration alone said 300 s.
    make_model("quick", queue_limit=2, max_concurrency=1, expected_seconds=600)
    for i in range(3):  # measured: three done runs of about 0.2 s
        job_id = jobs.submit(USER, "quick", {"sleep_ms": 200, "i": i}).row.id
        assert execution.run_attempt(job_id, 0) == "done"
        assert job_row(job_id).state == JobState.DONE
    _fill(client, user_key, "quick", 2)
    full = _submit(client, user_key, "quick", {"one": "too many"})
    assert full.status_code == 429 and full.get_json()["error"] == "async queue full (max 2)", full.get_data()
    assert 1 <= int(full.headers["Retry-After"]) <= 2, full.headers
    # A batch item refused by the same gate says the same, as its retry_after.
    batch = client.post("/v1/models/quick/jobs:batch", json={"jobs": [{"payload": {"b": 1}}]}, headers=auth(user_key))
    item = batch.get_json()["results"][0]
    assert item["status"] == 429 and 1 <= item["retry_after"] <= 2, item


def test_without_a_measurement_the_retry_after_is_bounded_by_the_cap(client, make_model, user_key):
    make_model("unmeasured", queue_limit=1, max_concurrency=1, expected_seconds=600)
    _fill(client, user_key, "unmeasured", 1)
    full = _submit(client, user_key, "unmeasured", {"x": 1})
    assert full.status_code == 429 and full.headers["Retry-After"] == "60", full.headers  # the default cap
    set_settings(get_settings().with_overrides(queue_retry_after_max_seconds=7))
    full = _submit(client, user_key, "unmeasured", {"x": 2})
    assert full.status_code == 429 and full.headers["Retry-After"] == "7", full.headers
    # The seed face's createTask answers the same header.
    seed = client.post("/task/createTask", json={"modelName": "unmeasured", "requestPayload": {"x": 3}},
                       headers=auth(user_key))
    assert seed.status_code == 429 and seed.headers["Retry-After"] == "7", seed.get_data()


def test_a_tenant_share_refusal_counts_the_tenants_own_slots(client, make_model, user_key, other_key):
    # No measurement: T is expected_seconds (6).  A worker's free slots pulled one job of each tenant
    # (their permits taken): two attempts under way on the model, one of them the refused tenant's.
    make_model("shared", queue_limit=10, tenant_queue_limit=1, max_concurrency=2, expected_seconds=6)
    _fill(client, user_key, "shared", 1)
    _fill(client, other_key, "shared", 1)
    from app.infra.redis import dispatch as rd
    from app.jobs import handoff

    assert handoff.flush()  # both queued in the dispatcher (by the outbox's thread) before the pull
    rd.pull("shared", 2, 60, cap=2)
    assert permits("shared", "tenant-a") and permits("shared", "tenant-b")
    full = _submit(client, user_key, "shared", {"x": 1})
    assert full.status_code == 429 and full.get_json()["error"].startswith("tenant queue share full"), full.get_data()
    # Its own slot frees first: T / (1 + 1) = 3 s (the model's two: T / 3; the configuration alone: 6).
    assert full.headers["Retry-After"] == "3", full.headers
