"""Priorities (issue 16 item 4): a job's priority (0-9, default 5, 9 first)
orders dispatch among its tenant's own jobs; fairness between tenants comes
first.  Real API, workers, PostgreSQL, Redis and the stub model."""
from __future__ import annotations

import pytest
import requests
from helpers import auth, job_row, submit, wait_until

from app.jobs.dispatch import order_score

pytestmark = pytest.mark.e2e


def _submit(api_url, key, model, body, priority=None):
    headers = {**auth(key)}
    if priority is not None:
        headers["X-Priority"] = str(priority)
    r = requests.post(f"{api_url}/v1/models/{model}/jobs", json=body, headers=headers, timeout=10)
    assert r.status_code == 202, r.text
    return r.json()["job_id"]


def test_order_score_bands():
    from datetime import datetime, timedelta, timezone

    t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    later = t + timedelta(days=300)
    assert order_score(later, 9) < order_score(t, 8) < order_score(t, 5) < order_score(t, 0)
    assert order_score(t, 5) < order_score(t + timedelta(microseconds=20), 5)  # time still orders a band
    assert order_score(t) == order_score(t, 5) == order_score(t, None)


def test_priority_orders_a_tenants_jobs_and_fairness_comes_first(api_url, workers, make_model, user_key, other_key,
                                                                model_server):
    make_model("prio", max_concurrency=1, queue_limit=50)
    blocker = _submit(api_url, user_key, "prio", {"hold": "prio"})
    wait_until(lambda: job_row(blocker).state == 1, what="the blocker running")
    a = {"p1": _submit(api_url, user_key, "prio", {"n": 1}, 1),
         "p5": _submit(api_url, user_key, "prio", {"n": 5}),
         "p9": _submit(api_url, user_key, "prio", {"n": 9}, 9),
         "p9b": _submit(api_url, user_key, "prio", {"n": 99}, 9)}
    b = _submit(api_url, other_key, "prio", {"n": 0}, 0)
    assert job_row(a["p5"]).priority == 5
    # Tenant B's lowest-priority job is not held behind A's higher ones (fairness first): it
    # runs on B's own permit while A's four wait behind A's blocker.
    wait_until(lambda: job_row(b).state == 2, timeout=30, what="B's job done while A's are held")
    assert all(job_row(j).state == 0 for j in a.values())
    model_server.state.release("prio")
    everyone = [*a.values(), b]
    wait_until(lambda: all(job_row(j).state == 2 for j in everyone), timeout=60, what="all done")
    started = sorted(everyone, key=lambda j: job_row(j).started_at)
    mine = [j for j in started if j != b]
    assert mine == [a["p9"], a["p9b"], a["p5"], a["p1"]], [job_row(j).request_payload for j in mine]
    poll = requests.get(f"{api_url}/v1/models/prio/jobs/{a['p9']}", headers=auth(user_key), timeout=10).json()
    assert poll["priority"] == 9


def test_priority_is_validated_and_batch_items_carry_it(api_url, make_model, user_key):
    make_model("prio2")
    for bad in ("10", "-1", "high"):
        r = requests.post(f"{api_url}/v1/models/prio2/jobs", json={}, headers={**auth(user_key), "X-Priority": bad},
                          timeout=10)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/priority", r.text
    r = requests.post(f"{api_url}/v1/models/prio2/jobs:batch", headers=auth(user_key), timeout=10,
                      json={"jobs": [{"payload": {}, "priority": 8}, {"payload": {}, "priority": 12}, {"payload": {}}]})
    res = r.json()["results"]
    assert [x["status"] for x in res] == [202, 422, 202], res
    assert res[1]["errors"][0]["pointer"] == "/jobs/1/priority"
    assert job_row(res[0]["job_id"]).priority == 8 and job_row(res[2]["job_id"]).priority == 5
    assert submit(api_url, user_key, "prio2", {}).status_code == 202
