"""Why a job waits (issue 34 item 2): a pending job's poll body says which rule holds it now
(app/jobs/waiting.py).  Each test puts a job behind one rule -- no worker yet, its own tenant's earlier jobs,
its tenant's max_concurrency or burst ceiling, an upstream's busy answer, a retry's backoff -- and reads the
reason over HTTP; the gauge counts them and the tenant's event stream says when a reason changes.  Real
PostgreSQL, Redis, the stub upstream over HTTP; the dispatcher's pulls are a worker's own calls, made here."""
from __future__ import annotations

import time
from datetime import datetime

import pytest
from helpers import auth, job_row, samples, value, wait_until

from app.infra.redis import dispatch as rd
from app.jobs import execution, handoff
from app.states import JobState


def post(client, key: str, model: str, payload: dict) -> str:
    resp = client.post(f"/v1/models/{model}/jobs", json=payload, headers=auth(key))
    assert resp.status_code == 202, resp.get_json()
    assert handoff.flush()
    return resp.get_json()["job_id"]


def waiting_on(client, key: str, model: str, job_id: str) -> dict | None:
    body = client.get(f"/v1/models/{model}/jobs/{job_id}", headers=auth(key)).get_json()
    return body.get("waiting_on")


def when(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_no_worker_then_behind_its_own_jobs(make_model, client, user_key, other_key):
    make_model("m")
    first = post(client, user_key, "m", {"n": 1})
    w = waiting_on(client, user_key, "m", first)
    assert w["reason"] == "no_worker" and abs(when(w["since"]) - time.time()) < 30
    second, third = post(client, user_key, "m", {"n": 2}), post(client, user_key, "m", {"n": 3})
    assert waiting_on(client, user_key, "m", second) == {"reason": "behind_own_jobs", "ahead": 1}
    assert waiting_on(client, user_key, "m", third) == {"reason": "behind_own_jobs", "ahead": 2}
    # Another tenant's first job is behind nothing of its own: it waits for a worker.
    assert waiting_on(client, other_key, "m", post(client, other_key, "m", {"n": 4}))["reason"] == "no_worker"
    # A pulled job (a free slot took it) waits on nothing; once run, neither does it.
    pulled = rd.pull("m", 1, 60.0)
    assert [j for _t, j, _a in pulled.pulled] == [first]
    assert waiting_on(client, user_key, "m", first) is None
    assert waiting_on(client, user_key, "m", second)["reason"] == "no_worker"


def test_its_tenant_at_max_concurrency_or_its_burst_ceiling(make_model, client, user_key):
    make_model("m", max_concurrency=1)
    running = post(client, user_key, "m", {"n": 1})
    waiting = post(client, user_key, "m", {"n": 2})
    assert [j for _t, j, _a in rd.pull("m", 4, 60.0).pulled] == [running]  # one: its cap
    assert waiting_on(client, user_key, "m", waiting) == {
        "reason": "tenant_limit", "running": 1, "limit": 1, "ceiling": "max_concurrency"}
    make_model("b", max_concurrency=4)
    rd.set_shares("b", {"tenant-a": (None, 2)})
    held = [post(client, user_key, "b", {"n": i}) for i in range(3)]
    assert len(rd.pull("b", 4, 60.0).pulled) == 2
    assert waiting_on(client, user_key, "b", held[2]) == {
        "reason": "tenant_limit", "running": 2, "limit": 2, "ceiling": "burst"}


def test_the_upstream_paused_it(make_model, client, user_key):
    make_model("m")
    job = post(client, user_key, "m", {"busy_until": time.time() + 120, "retry_after": 60})
    assert execution.run_attempt(job) == "busy"
    assert job_row(job).state == JobState.PENDING
    w = waiting_on(client, user_key, "m", job)
    assert w["reason"] == "upstream_paused" and w["answer"] == 429 and w["scope"] in ("model", "tenant", "job")
    assert 5 < when(w["until"]) - time.time() <= 61  # Retry-After, capped by the longest pause


def test_a_retry_in_its_backoff(make_model, client, user_key):
    make_model("m", retry_times=2, retry_queue_max_seconds=60)
    job = post(client, user_key, "m", {"tag": "w1", "fail_first": 1})
    assert execution.run_attempt(job) == "retry_wait"
    w = waiting_on(client, user_key, "m", job)
    assert w["reason"] == "retry_backoff"
    assert when(w["until"]) == pytest.approx(job_row(job).next_retry_at.timestamp(), abs=0.001)


def test_a_running_or_ended_job_waits_on_nothing(make_model, client, user_key):
    make_model("m")
    job = post(client, user_key, "m", {"n": 1})
    assert execution.run_attempt(job) == "done"
    assert waiting_on(client, user_key, "m", job) is None


def test_the_gauge_counts_waiting_jobs_by_reason(make_model, client, user_key, other_key):
    make_model("m", max_concurrency=1, retry_times=2, retry_queue_max_seconds=60)
    for i in range(3):
        post(client, user_key, "m", {"n": i})
    post(client, other_key, "m", {"n": 9})
    rd.pull("m", 1, 60.0)  # tenant-a's first: the others of tenant-a now wait on its cap
    retry = post(client, other_key, "m", {"tag": "g1", "fail_first": 1})
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))

    def n(reason: str) -> float:
        return value(sm, "asynch_jobs_waiting", model="m", reason=reason)
    assert (n("tenant_limit"), n("no_worker"), n("behind_own_jobs"), n("upstream_paused")) == (2, 1, 1, 0)
    assert n("retry_backoff") == 0
    attempts, _ = execution.claim_given([(retry, execution.CURRENT)], None)
    assert execution.run_claimed(attempts) == {retry: "retry_wait"}
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    assert value(sm, "asynch_jobs_waiting", model="m", reason="retry_backoff") == 1


@pytest.mark.e2e
def test_the_tenant_stream_says_when_a_reason_changes(make_model, api_url, user_key, settings):
    from test_events import SSE

    from app.config import set_settings

    set_settings(settings.with_overrides(events_poll_seconds=0.2))
    make_model("m", max_concurrency=1)
    s = SSE(f"{api_url}/v1/events?model=m", user_key)
    try:
        import requests

        ids = [requests.post(f"{api_url}/v1/models/m/jobs", json={"n": i}, headers=auth(user_key),
                             timeout=10).json()["job_id"] for i in range(2)]
        seen: dict[str, list[str]] = {}

        def until(job: str, reason: str) -> bool:
            while reason not in seen.get(job, []):
                ev = s.next()
                assert ev is not None
                _id, name, data = ev
                if name == "waiting":
                    seen.setdefault(data["job_id"], []).append(data["waiting_on"]["reason"])
            return True

        assert until(ids[0], "no_worker") and until(ids[1], "behind_own_jobs")
        # A later job's event: the feed made another pass, which repeated nothing unchanged.
        third = requests.post(f"{api_url}/v1/models/m/jobs", json={"n": 3}, headers=auth(user_key),
                              timeout=10).json()["job_id"]
        assert until(third, "behind_own_jobs")
        wait_until(lambda: rd.pull("m", 1, 60.0).pulled, what="the first job pulled")
        assert until(ids[1], "tenant_limit")  # its tenant now holds its one call
        assert seen[ids[1]] == ["behind_own_jobs", "tenant_limit"]  # once per change, not per pass
    finally:
        s.close()
