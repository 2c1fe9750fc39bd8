"""The read-only views behind the console's operator pages, on the real
database, Redis and stub model: a job's attempt log (every ended attempt
with its error, written by the transition's own statement), the workers,
the maintenance state and a tenant's queue share and rate-limit state,
each scoped to who may see it."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from helpers import auth, make_key, submit_job as _submit, wait_until
from sqlalchemy import select

from app import transitions
from app.clock import now as clock_now
from app.clock import set_clock
from app.infra.db import transaction
from app.infra.redis import leader, liveness
from app.infra.tables import task_attempts
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.maintenance import periodic


def test_every_ended_attempt_is_logged_with_its_error(client, make_model, user_key, admin_key, other_key):
    make_model("flaky", retry_times=1, retry_queue_max_seconds=5)
    job_id = _submit("flaky", {"tag": "once", "fail_first": 1})
    assert execution.run_attempt(job_id, 0) == "retry_wait"
    assert execution.run_attempt(job_id, 0) == "stale"  # a duplicate delivery logs nothing
    with transaction() as conn:
        due = conn.execute(select(task_attempts.c.ended_at)).scalar_one()
    set_clock(lambda: due + timedelta(seconds=60))
    assert maintenance.run_work().processed >= 1
    set_clock(None)
    assert execution.run_attempt(job_id, 1) == "done"

    body = client.get(f"/v1/jobs/{job_id}", headers=auth(user_key)).get_json()
    assert body["state"] == "done" and "error" not in body  # the row keeps the latest attempt only...
    first, second = body["attempts"]  # ...the log keeps both
    assert first["attempt"] == 1 and first["outcome"] == "retry_wait"
    assert first["error"].startswith("model_http_error:") and "500" in first["error"]
    assert "error_detail" not in first and "worker" not in first  # admins only
    assert second == {"attempt": 2, "outcome": "done", "started_at": second["started_at"],
                      "ended_at": second["ended_at"]}
    admin = client.get(f"/v1/jobs/{job_id}", headers=auth(admin_key)).get_json()
    assert [a["attempt"] for a in admin["attempts"]] == [1, 2]
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(other_key)).status_code == 404


@pytest.mark.parametrize("queue_max", [0, 5], ids=["head", "tail"])
def test_the_timeline_shows_each_attempt_and_when_the_retry_was_requeued(client, make_model, user_key, queue_max):
    """Each ended attempt's start and failure (from asynch_task_attempt) and the requeue's own time: a head
    retry backdates enqueue_at to the creation, so that is not when it was requeued."""
    make_model("flaky", retry_times=1, retry_queue_max_seconds=queue_max)
    job_id = _submit("flaky", {"tag": f"tl-{queue_max}", "fail_first": 1})
    assert execution.run_attempt(job_id, 0) == "retry_wait"
    with transaction() as conn:
        due = conn.execute(select(task_attempts.c.ended_at)).scalar_one()
    requeue_at = due + timedelta(seconds=60)
    set_clock(lambda: requeue_at)
    assert maintenance.run_work().processed >= 1
    set_clock(None)
    assert execution.run_attempt(job_id, 1) == "done"
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(user_key)).get_json()
    tl, (first, second) = body["timeline"], body["attempts"]
    assert [e["event"] for e in tl] == ["created", "started", "attempt_failed", "requeued", "started", "finished"]
    assert [e["detail"] for e in tl if e["event"] == "started"] == ["attempt 1", "attempt 2"]
    assert tl[1]["at"] == first["started_at"] and tl[4]["at"] == second["started_at"]
    assert tl[2]["at"] == first["ended_at"] and "500" in tl[2]["detail"]
    assert tl[3]["at"] == requeue_at.isoformat().replace("+00:00", "Z") != body["created_at"]


def test_a_failed_job_logs_its_last_attempt(client, make_model, user_key):
    make_model("bad", retry_times=0)
    job_id = _submit("bad", {"status": 500})
    assert execution.run_attempt(job_id, 0) == "failed"
    (only,) = client.get(f"/v1/jobs/{job_id}", headers=auth(user_key)).get_json()["attempts"]
    assert only["outcome"] == "failed" and only["error"] == "model_http_error: model returned HTTP 500"


def test_maintenance_state_shows_leader_latest_runs_and_gate_drift(client, make_model, admin_key, user_key, r):
    make_model("echo")
    assert client.get("/v1/maintenance/state", headers=auth(user_key)).status_code == 403
    body = client.get("/v1/maintenance/state", headers=auth(admin_key)).get_json()
    assert body["leader"] is None and body["latest"] == []
    token = leader.leader_acquire("beat-test:1", 30)
    periodic.run_periodic("asynch.recover", {"owner": "beat-test:1", "token": token, "sent_at": time.time()},
                          lambda: {"processed": 3})
    _submit("echo", {"a": 1})  # a pending row holding its slot
    r.zadd("asynch:gate:{echo}", {"job_ghost": time.time() - 3600})  # a slot with no row
    body = client.get("/v1/maintenance/state", headers=auth(admin_key)).get_json()
    assert body["leader"]["owner"] == "beat-test:1" and body["leader"]["token"] == token
    assert 0 < body["leader"]["ttl_ms"] <= 30000
    (run,) = body["latest"]
    assert run["task"] == "asynch.recover" and run["processed"] == 3 and run["token"] == token
    (g,) = body["gates"]
    assert g == {"model": "echo", "slots": 2, "active_rows": 1, "drift": 1, "configured": True}
    client.post("/v1/maintenance/reconcile", headers=auth(admin_key))
    (g,) = client.get("/v1/maintenance/state", headers=auth(admin_key)).get_json()["gates"]
    assert g["drift"] == 0 and g["slots"] == 1


def test_tenant_state_shows_queue_share_and_rate_buckets(client, make_model, user_key, admin_key):
    make_model("echo", queue_limit=16, tenant_queue_limit=4)
    make_key("tenant-b")
    assert client.get("/v1/tenants", headers=auth(user_key)).get_json() == {"tenants": ["tenant-a"], "caller": "tenant-a"}
    assert client.get("/v1/tenants", headers=auth(admin_key)).get_json() == {"tenants": ["ops", "tenant-a", "tenant-b"],
                                                                            "caller": "ops"}
    assert client.get("/v1/tenants/tenant-b/state", headers=auth(user_key)).status_code == 403
    assert client.get("/v1/tenants/bad%20id/state", headers=auth(admin_key)).status_code == 422
    _submit("echo", {"a": 1})
    _submit("echo", {"a": 2})
    body = client.get("/v1/tenants/tenant-a/state", headers=auth(user_key)).get_json()
    (m,) = body["models"]
    assert m == {"model": "echo", "in_use": 2, "cap": 4, "queue_limit": 16, "pending": 2, "running": 0,
                 "retry_wait": 0}
    assert body["rate"]["limited"] is False and body["rate"]["keys"] == []
    assert client.patch("/v1/tenants/tenant-a/limits", json={"rate_per_second": 0.01, "burst": 10},
                        headers=auth(admin_key)).status_code == 200
    for _ in range(3):
        client.get("/v1/models", headers=auth(user_key))
    rate = client.get("/v1/tenants/tenant-a/state", headers=auth(admin_key)).get_json()["rate"]
    assert rate["limited"] is True and rate["rate_per_second"] == 0.01 and rate["burst"] == 10
    (k,) = rate["keys"]
    assert 7 <= k["tokens"] < 7.3  # ten, less the user's three requests (the admin's read is its own key's)


def test_a_running_attempt_ended_by_cancel_is_logged_once(client, make_model, user_key):
    make_model("m", retry_times=1)
    pending = _submit("m", {"a": 1})
    running = _submit("m", {"a": 2})
    waiting = _submit("m", {"tag": "w", "fail_first": 1})
    assert execution.run_attempt(waiting, 0) == "retry_wait"
    with transaction() as conn:
        assert transitions.claim(conn, running, 0, clock_now() + timedelta(seconds=60), worker="n1#i1") is not None
    for job_id in (pending, running, waiting):
        assert client.post(f"/v1/models/m/jobs/{job_id}/cancel", headers=auth(user_key)).status_code == 200
    assert client.get(f"/v1/jobs/{pending}", headers=auth(user_key)).get_json()["attempts"] == []
    # Waiting to retry: its attempt was logged when it failed, not again by the cancel.
    assert [a["outcome"] for a in client.get(f"/v1/jobs/{waiting}", headers=auth(user_key)).get_json()["attempts"]] \
        == ["retry_wait"]
    (only,) = client.get(f"/v1/jobs/{running}", headers=auth(user_key)).get_json()["attempts"]
    assert only["attempt"] == 1 and only["outcome"] == "canceled" and only["error"].startswith("canceled:")


def test_a_job_of_a_restarted_nodes_old_instance_is_listed_apart_as_dead(client, make_model, admin_key):
    make_model("m")
    old, now_job = _submit("m", {"a": 1}), _submit("m", {"a": 2})
    with transaction() as conn:
        transitions.claim(conn, old, 0, clock_now() + timedelta(seconds=60), worker="n1@h#before")
        transitions.claim(conn, now_job, 0, clock_now() + timedelta(seconds=60), worker="n1@h#after")
    liveness.worker_touch("n1@h", {"heartbeat": f"{time.time():.3f}", "queues": "q", "instance": "after"}, 15)
    body = client.get("/v1/workers", headers=auth(admin_key)).get_json()
    assert [(w["node"], w["alive"], [j["job_id"] for j in w["running"]]) for w in body["workers"]] == [
        ("n1@h", True, [now_job]), ("n1@h#before", False, [old])]
    # A hash that names no instance yet (remade by a consumed message after a Redis wipe) takes the node's jobs.
    liveness.worker_forget("n1@h")
    liveness.worker_touch("n1@h", {"consumed": f"{time.time():.3f}"}, 15)
    (w,) = client.get("/v1/workers", headers=auth(admin_key)).get_json()["workers"]
    assert w["alive"] and w["heartbeat_age_seconds"] is None and {j["job_id"] for j in w["running"]} == {old, now_job}


@pytest.mark.e2e
def test_workers_show_the_live_node_and_what_it_runs(client, make_model, model_server, admin_key, user_key, workers):
    make_model("slow")
    assert client.get("/v1/workers", headers=auth(user_key)).status_code == 403
    # The suite empties Redis between tests; until the node's next beat its hash may hold only
    # a "consumed" stamp written by the previous test's last task, so wait for the beat itself.
    body = wait_until(lambda: (b := client.get("/v1/workers", headers=auth(admin_key)).get_json())["workers"]
                      and b["workers"][0]["heartbeat_age_seconds"] is not None and b, what="a worker heartbeat")
    (w,) = body["workers"]
    assert w["alive"] is True and w["heartbeat_age_seconds"] < body["ttl_seconds"] and w["queues"]
    hold = model_server.state.hold("w1")
    job_id = _submit("slow", {"hold": "w1"})
    try:
        running = wait_until(lambda: client.get("/v1/workers", headers=auth(admin_key)).get_json()["workers"][0]
                             ["running"], what="the job on the node")
        assert running[0]["job_id"] == job_id and running[0]["model"] == "slow" and running[0]["attempt"] == 1
        assert running[0]["started_at"].endswith("Z")
        assert len(client.get("/v1/workers", headers=auth(admin_key)).get_json()["workers"]) == 1  # one node
    finally:
        hold.set()
