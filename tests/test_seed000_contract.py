"""Seed 000's remaining contract (issue 13 item 5): a job waiting to retry
can time out; an admin can fail any non-terminal job (beside cancel); a
model's max_completed caps its retained completed jobs, evicting the least
recently read; a submit answers before the model has.

Real pieces: PostgreSQL, Redis, the API on a socket, the stub model service,
a Celery worker process (the last test)."""
from __future__ import annotations

from datetime import timedelta

import requests
from helpers import auth, job_row, submit, wait_until
from test_retention import completed_jobs
from sqlalchemy import update

from app import transitions
from app.clock import now
from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import passes
from app.states import JobState
from app.tenancy.keys import Principal

USER = Principal("tenant-a", "user", None)


def _retry_waiting(make_model, r) -> str:
    make_model("flaky", retry_times=3)
    job_id = jobs.submit(USER, "flaky", {"x": 1}).row.id
    with transaction() as conn:
        assert transitions.claim(conn, job_id, 0, now() + timedelta(minutes=5)) is not None
        assert transitions.fail_attempt(conn, job_id, 1, "boom", retry_at=now() + timedelta(hours=1)) is not None
    return job_id


def test_a_job_waiting_to_retry_times_out_at_its_budget(make_model, r):
    job_id = _retry_waiting(make_model, r)
    assert passes.time_out_overdue().processed == 0  # within budget: left alone
    with transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.id == job_id).values(deadline_at=now() - timedelta(seconds=1)))
    rep = passes.cleanup()
    assert rep.details["timeouts"] == 1
    row = job_row(job_id)
    assert row.state == JobState.TIMEOUT and row.finished_at is not None and row.error == "job_timeout: job budget exceeded"
    # It never comes back to life: the retry pass finds nothing to re-admit.
    assert passes.retry_due().processed == 0


def test_an_admin_fails_pending_running_and_retry_wait_jobs_users_cannot(api_url, make_model, model_server,
                                                                          admin_key, user_key, r):
    make_model("slow")
    pending = jobs.submit(USER, "slow", {"x": 1}).row.id
    running = jobs.submit(USER, "slow", {"x": 2}).row.id
    with transaction() as conn:
        assert transitions.claim(conn, running, 0, now() + timedelta(minutes=5)) is not None
    waiting = _retry_waiting(make_model, r)
    url = f"{api_url}/v1/models/{{m}}/jobs/{{j}}/fail"
    denied = requests.post(url.format(m="slow", j=pending), headers=auth(user_key), timeout=10)
    assert denied.status_code == 403 and job_row(pending).state == JobState.PENDING
    for model, jid in (("slow", pending), ("slow", running), ("flaky", waiting)):
        resp = requests.post(url.format(m=model, j=jid), json={"reason": "poisoned payload"}, headers=auth(admin_key),
                             timeout=10)
        assert resp.status_code == 200, resp.text
        assert resp.json()["state"] == "failed"
        row = job_row(jid)
        assert row.state == JobState.FAILED and row.error == "failed by admin: poisoned payload", jid
        assert r.zscore("asynch:gate:{%s}" % model, jid) is None  # its slot went back
    # Terminal: a second fail (or a late write of the running attempt) changes nothing.
    again = requests.post(url.format(m="slow", j=pending), headers=auth(admin_key), timeout=10)
    assert again.status_code == 409
    with transaction() as conn:
        assert transitions.complete(conn, running, 1, location="x", content_type="a/b", size=1) is None
    assert requests.post(url.format(m="slow", j="job_nope"), headers=auth(admin_key), timeout=10).status_code == 404
    bad = requests.post(url.format(m="slow", j=running), json={"reason": 5}, headers=auth(admin_key), timeout=10)
    assert bad.status_code == 422


def test_max_completed_evicts_the_least_recently_read_beside_time_retention(client, make_model, model_server,
                                                                            user_key):
    # Submitted before any finished (a submit evicts too: the test after), finished in order a minute apart.
    ids = completed_jobs(make_model, "capped", 5, 3)
    # The oldest two are read now (one through each read route): they become the most recently read.
    assert client.get(f"/task/getTaskResult?taskId={ids[0]}", headers=auth(user_key)).status_code == 200
    assert client.get(f"/v1/models/capped/jobs/{ids[1]}/result", headers=auth(user_key)).status_code == 200
    rep = passes.cleanup()
    assert rep.details["evicted"] == 2
    left = {jid for jid in ids if job_row(jid) is not None}
    assert left == {ids[0], ids[1], ids[4]}  # ids[2], ids[3]: finished earliest among the unread
    assert passes.cleanup().details["evicted"] == 0  # at the cap: nothing more
    # A model without a cap keeps everything (time retention only).
    make_model("free")
    for i in range(4):
        assert execution.run_attempt(jobs.submit(USER, "free", {"i": i}).row.id, 0) == "done"
    assert passes.cleanup().details["evicted"] == 0


def test_a_submit_returns_before_the_model_has_answered(api_url, make_model, model_server, user_key, workers):
    """Seed 000: a submit never waits for the model.  The model holds the
    call until the test releases it, so the 202 can only come first (no
    timing asserted: the order is the proof)."""
    make_model("held", timeout_seconds=30)
    resp = submit(api_url, user_key, "held", {"hold": "submit-first"})
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job_id"]
    wait_until(lambda: job_row(job_id).state == JobState.RUNNING and model_server.state.in_flight == 1,
               timeout=30, what="the model call in flight")
    model_server.state.release("submit-first")
    wait_until(lambda: job_row(job_id).state == JobState.DONE, timeout=60, interval=0.1, what="done")


def test_a_later_batch_read_counts_as_a_read_for_eviction(client, make_model, model_server, user_key):
    make_model("capped2", max_completed=1)
    a, b = (jobs.submit(USER, "capped2", {"i": i}).row.id for i in range(2))
    for jid in (a, b):  # run here, or by the module's worker (the test before starts one)
        execution.run_attempt(jid, 0)
        wait_until(lambda j=jid: job_row(j).state == JobState.DONE, timeout=30, what="done")
    ok = client.post("/task/getTaskBatch", json={"taskIds": [a, b]}, headers=auth(user_key))
    assert [d["claimed"] for d in ok.get_json()["data"]] == [True, True]
    old = now() - timedelta(hours=1)
    with transaction() as conn:  # both claimed an hour ago
        conn.execute(update(tasks).where(tasks.c.id.in_([a, b])).values(last_read_at=old))
    # a is read again (already claimed: claimed false): it is now the more recently read.
    again = client.post("/task/getTaskBatch", json={"taskIds": [a]}, headers=auth(user_key)).get_json()["data"]
    assert again[0]["claimed"] is False and again[0]["state"] == 4
    assert passes.cleanup().details["evicted"] == 1
    assert job_row(a) is not None and job_row(b) is None

