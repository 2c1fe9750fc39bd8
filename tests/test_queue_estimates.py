"""Deadline-aware admission and queue estimates (issue 24 item 1): X-Deadline
(batch: deadline_seconds, seed: deadline) judged against the dispatcher's
estimate at submit, queue_position / estimated_start_at / estimated_done_at
on the 202 and the poll, and a job still pending past its deadline ending
expired without a model call.  Real API, Celery workers, PostgreSQL, Redis
and the stub model (which counts its calls)."""
from __future__ import annotations

import re
import time
from datetime import datetime

import pytest
import requests
from helpers import auth, job_row, wait_until
from sqlalchemy import func, select

from app.config import set_settings
from app.infra.db import transaction
from app.infra.redis import keys
from app.infra.tables import deliveries as webhook_deliveries
from app.infra.tables import tasks
from app.maintenance import passes

pytestmark = pytest.mark.e2e


def _post(api_url, key, model, body, deadline=None, **headers):
    if deadline is not None:
        headers["X-Deadline"] = str(deadline)
    return requests.post(f"{api_url}/v1/models/{model}/jobs", json=body, headers={**auth(key), **headers},
                         timeout=30)


def _at(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _poll(api_url, key, model, job_id) -> dict:
    return requests.get(f"{api_url}/v1/models/{model}/jobs/{job_id}", headers=auth(key), timeout=10).json()


def _rows() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar()


def test_a_bad_deadline_is_a_422_on_every_face_and_writes_nothing(api_url, make_model, user_key):
    make_model("dl")
    for bad in ("0", "-1", "abc", "1e9", "nan", "inf"):
        r = _post(api_url, user_key, "dl", {}, deadline=bad)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/X-Deadline", (bad, r.text)
    r = requests.post(f"{api_url}/v1/models/dl/jobs:batch", headers=auth(user_key), timeout=10,
                      json={"jobs": [{"payload": {}, "deadline_seconds": -2}, {"payload": {}, "deadline_seconds": "x"}]})
    res = r.json()["results"]
    assert [x["status"] for x in res] == [422, 422], res
    assert res[0]["errors"][0]["pointer"] == "/jobs/0/deadline_seconds", res
    r = requests.post(f"{api_url}/task/createTask", headers=auth(user_key), timeout=10,
                      json={"modelName": "dl", "requestPayload": {}, "deadline": 0})
    body = r.json()
    assert body["code"] == 422 and body["errors"][0]["pointer"] == "/deadline", body
    assert _rows() == 0


def test_a_deadline_the_queue_cannot_meet_is_refused_and_one_it_can_is_admitted_with_its_place(
        api_url, workers, make_model, user_key, r, model_server):
    # The acceptance case: a 1 s model at concurrency 1 with 8 jobs queued.
    make_model("slow", max_concurrency=1, queue_limit=50, expected_seconds=1, timeout_seconds=30)
    queued = [_post(api_url, user_key, "slow", {"sleep_ms": 1000, "n": i}) for i in range(8)]
    assert all(x.status_code == 202 for x in queued), [x.text for x in queued]
    wait_until(lambda: job_row(queued[0].json()["job_id"]).state == 1, what="the first job running")
    depth = r.zcard(keys.gate("slow"))

    refused = _post(api_url, user_key, "slow", {"sleep_ms": 1000}, deadline=3)
    assert refused.status_code == 429, refused.text
    body = refused.json()
    assert body["code"] == "deadline_unmeetable" and body["error"].startswith("deadline_unmeetable")
    assert int(refused.headers["Retry-After"]) >= 1
    assert _at(body["estimated_done_at"]) > _at(body["deadline_at"]) and 5 <= body["queue_position"] <= 9, body
    assert _rows() == 8 and r.zcard(keys.gate("slow")) == depth  # nothing written, no slot taken

    sent = time.time()
    ok = _post(api_url, user_key, "slow", {"sleep_ms": 1000, "n": "late"}, deadline=60)
    assert ok.status_code == 202, ok.text
    acc = ok.json()
    assert 5 <= acc["queue_position"] <= 9, acc
    assert _at(acc["estimated_done_at"]) > _at(acc["estimated_start_at"]) >= sent - 1
    job_id = acc["job_id"]
    assert job_row(job_id).caller_deadline_at is not None
    wait_until(lambda: job_row(job_id).started_at is not None, timeout=60, what="the job started")
    real = job_row(job_id).started_at.timestamp() - sent
    estimated = _at(acc["estimated_start_at"]) - sent
    assert abs(estimated - real) <= 0.5 * real + 1, (estimated, real)
    wait_until(lambda: job_row(job_id).state == 2, timeout=30, what="the job done")
    # The model's measured run time now stands in for expected_seconds.
    ewma = r.hgetall(keys.dispatch_run_time("slow"))
    assert int(ewma["n"]) >= 9 and 0.9 <= float(ewma["s"]) <= 3, ewma


def test_estimates_grow_along_the_line_and_fairness_puts_another_tenant_near_the_front(
        api_url, workers, make_model, user_key, other_key, model_server):
    make_model("mono", max_concurrency=1, queue_limit=50, expected_seconds=2)
    blocker = _post(api_url, user_key, "mono", {"hold": "mono"}).json()["job_id"]
    wait_until(lambda: job_row(blocker).state == 1, what="the blocker running")
    accepted = [_post(api_url, user_key, "mono", {"n": i}).json() for i in range(5)]
    ids = [a["job_id"] for a in accepted]
    for seq in (accepted, [_poll(api_url, user_key, "mono", j) for j in ids]):
        positions = [a["queue_position"] for a in seq]
        starts = [_at(a["estimated_start_at"]) for a in seq]
        assert positions == sorted(positions) and len(set(positions)) == 5, positions
        assert starts == sorted(starts) and starts[-1] - starts[0] >= 4 * 2 - 0.5, starts
    assert [a["queue_position"] for a in [_poll(api_url, user_key, "mono", j) for j in ids]] == [0, 1, 2, 3, 4]
    # Tenant B's first job: one turn of A's ahead of it at most (fair share), not all five.
    b = _post(api_url, other_key, "mono", {"n": "b"}).json()
    assert b["queue_position"] <= 1, b
    high = _post(api_url, user_key, "mono", {"n": "p9"}, **{"X-Priority": "9"}).json()
    assert high["queue_position"] <= 1, high  # a priority goes before its tenant's own line
    model_server.state.release("mono")
    everyone = [*ids, b["job_id"], high["job_id"]]
    wait_until(lambda: all(job_row(j).state == 2 for j in everyone), timeout=60, what="all done")
    done = _poll(api_url, user_key, "mono", ids[0])
    assert "queue_position" not in done and "estimated_start_at" not in done  # only a pending job has one


def test_a_job_past_its_deadline_expires_at_claim_and_in_the_pass_without_a_model_call(
        api_url, client, settings, workers, make_model, user_key, model_server, r):
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1"))
    try:
        make_model("exp", max_concurrency=1, queue_limit=50, expected_seconds=1)
        blocker = _post(api_url, user_key, "exp", {"hold": "exp"}).json()["job_id"]
        wait_until(lambda: job_row(blocker).state == 1, what="the blocker running")
        before = client.get("/metrics").get_data(as_text=True)
        at_claim = _post(api_url, user_key, "exp", {"tag": "claim"}, deadline=2).json()["job_id"]
        in_pass = _post(api_url, user_key, "exp", {"tag": "pass"}, deadline=3,
                        **{"X-Webhook-Url": "http://127.0.0.1:9/hook"})
        assert in_pass.status_code == 202, in_pass.text
        in_pass = in_pass.json()["job_id"]
        wait_until(lambda: time.time() > job_row(in_pass).caller_deadline_at.timestamp(), what="the deadlines past")
        # The periodic pass ends both (no worker will reach them while the blocker holds the permit)...
        report = passes.expire_past_deadline()
        assert report.processed == 2
        assert job_row(at_claim).state == job_row(in_pass).state == 8
        poll = _poll(api_url, user_key, "exp", in_pass)
        assert poll["state"] == "expired" and poll["error"].startswith("deadline_expired"), poll
        seed = requests.get(f"{api_url}/task/getTaskResult?taskId={in_pass}", headers=auth(user_key),
                            timeout=10).json()
        assert seed["data"]["state"] == 3, seed
        with transaction() as conn:
            hooks = conn.execute(select(webhook_deliveries).where(webhook_deliveries.c.job_id == in_pass)).all()
        assert [h.event for h in hooks] == ["failed"]  # a terminal state the webhooks treat like failed
        assert r.zscore(keys.gate("exp"), in_pass) is None  # its slot is back
        after = client.get("/metrics").get_data(as_text=True)
        pat = r'asynch_job_duration_seconds_count\{model="exp",state="expired"\} ([0-9.]+)'
        count = lambda text: float((re.search(pat, text) or [0, 0])[1])  # noqa: E731
        assert count(after) - count(before) == 2
        # ...and the worker refuses one the pass has not reached: it expires at claim time.
        late = _post(api_url, user_key, "exp", {"tag": "late"}, deadline=2).json()["job_id"]
        wait_until(lambda: time.time() > job_row(late).caller_deadline_at.timestamp(), what="its deadline past")
        model_server.state.release("exp")
        wait_until(lambda: job_row(late).state == 8, timeout=30, what="expired at claim")
        wait_until(lambda: job_row(blocker).state == 2, what="the blocker done")
        assert job_row(late).started_at is None
        assert [c for c in model_server.state.calls if "hold" not in str(c)] == []  # the model never saw them
        assert r.zcard(keys.gate("exp")) == 0
    finally:
        set_settings(settings)


def test_a_batch_refuses_only_its_late_items(api_url, workers, make_model, user_key, model_server):
    make_model("bd", max_concurrency=1, queue_limit=50, expected_seconds=1)
    blocker = _post(api_url, user_key, "bd", {"hold": "bd"}).json()["job_id"]
    wait_until(lambda: job_row(blocker).state == 1, what="the blocker running")
    jobs = [{"payload": {"n": i}, "deadline_seconds": 3.2} for i in range(4)] + [{"payload": {"n": "free"}}]
    r = requests.post(f"{api_url}/v1/models/bd/jobs:batch", headers=auth(user_key), timeout=10, json={"jobs": jobs})
    res = r.json()["results"]
    # Each item stands behind the batch's earlier ones: at 1 s a job, the first two meet 3.2 s.
    assert [x["status"] for x in res] == [202, 202, 429, 429, 202], res
    assert res[2]["retry_after"] >= 1 and "deadline_unmeetable" in res[2]["error"]
    assert _rows() == 4
    model_server.state.release("bd")


def test_the_position_follows_the_dispatchers_weights_and_priorities(r):
    """dispatch_position.lua alone (no workers): two tenants' queues held
    (max_concurrency 0 at runtime, nothing dispatched), B of weight 2."""
    from app.infra.redis import dispatch as rd
    from app.jobs.dispatch import order_score

    r.set(keys.runtime_max_concurrency("w"), 0)
    rd.set_weight("tb", 2, ["w"])
    now = datetime.now().astimezone()
    for t in ("ta", "tb"):
        rd.enqueue("w", [(t, f"{t}-{i}", order_score(now) + i / 1000, 0, "") for i in range(6)], cap=1)
    last = order_score(now.replace(year=now.year + 1))
    a = rd.position("w", "ta", "", [last, order_score(now, 9)], cap=1)
    b = rd.position("w", "tb", "", [last], cap=1)
    # A's job behind its 6: B's 6 go in the time A takes 6 turns; B's behind its 6: A gets 3 of its turns.
    assert (int(a[6]), int(a[7]), int(b[6]), int(b[7])) == (6, 12, 6, 9), (a, b)
    assert (int(a[8]), int(a[9])) == (0, 0)  # priority 9: before A's own line, and A's turn is next
    assert rd.position("w", "ta", "ta-3", [last], cap=1)[6:8] == [3, 9]  # a queued job's own place wins
    # Ids handed over: the dispatcher holds ta-0 (counted in the ZCOUNT), not the ghost.
    assert rd.position("w", "ta", "", [last], cap=1, handed=["ta-0", "ghost"])[8:] == [1, 0]


def test_a_new_jobs_place_counts_its_tenants_jobs_still_in_this_process_outbox(r, monkeypatch):
    """A job admitted here whose hand-over to the dispatcher has not run yet
    stands ahead of the next submission, once: not again when the
    dispatcher already holds it (the back-to-back submits of the test above)."""
    from types import SimpleNamespace

    from app.infra.redis import dispatch as rd
    from app.jobs import estimates, handoff
    from app.jobs.dispatch import order_score

    r.set(keys.runtime_max_concurrency("w"), 0)
    now = datetime.now().astimezone()
    rd.enqueue("w", [("ta", f"ta-{i}", order_score(now) + i / 1000, 0, "") for i in range(3)], cap=1)
    model = SimpleNamespace(model_name="w", max_concurrency=1, expected_seconds=2)
    new = order_score(now) + 1
    [[base]] = estimates.for_new_many([(model, "ta", [new])])
    assert base.position == 3
    monkeypatch.setattr(handoff, "unsent", lambda m, t: {"ta-1": order_score(now) + 0.001, "ghost": new - 0.5,
                                                        "later": new + 1} if (m, t) == ("w", "ta") else {})
    [[ahead]] = estimates.for_new_many([(model, "ta", [new])])
    assert ahead.position == 4 and (ahead.start_at - base.start_at).total_seconds() >= 2 - 0.01, (base, ahead)
