"""runWork without resident workers (issue 13 item 4, app/maintenance/passes.py run_once):
POST /task/runWork claims pending jobs FOR UPDATE SKIP LOCKED and runs them
in the calling process; alone it drives every job to done, and beside
resident Celery workers each attempt still runs exactly once.  The CLI
(`asynch work run-once`, `asynch work clean-once`) is the same service call.

Real pieces: PostgreSQL, Redis, the stub model service over HTTP, Celery
worker processes (the second test)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from helpers import ROOT, WorkerProcess, auth
from sqlalchemy import select

from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal


def _submit(model: str, n: int, **payload) -> list[str]:
    p = Principal("tenant-a", "user", None)
    return [jobs.submit(p, model, {"i": i, **payload}).row.id for i in range(n)]


def _rows(ids):
    with transaction() as conn:
        return conn.execute(select(tasks).where(tasks.c.id.in_(ids))).all()


def _calls_per_job(model_server) -> Counter:
    return Counter(c["payload"]["i"] for c in model_server.state.calls)


def test_run_work_alone_drives_100_tasks_to_done_exactly_once(client, make_model, model_server, admin_key):
    make_model("rw", queue_limit=200, max_concurrency=100)
    ids = _submit("rw", 100)
    reports = []
    for _ in range(10):
        body = client.post("/task/runWork", json={"maxTasks": 30}, headers=auth(admin_key)).get_json()
        assert body["code"] == 0, body
        reports.append(body["data"]["ran"])
        if all(r.state == JobState.DONE for r in _rows(ids)):
            break
    rows = _rows(ids)
    assert sorted(r.state for r in rows) == [JobState.DONE] * 100
    assert all(r.attempt == 1 and r.worker is None for r in rows)  # one attempt each, run by runWork
    calls = _calls_per_job(model_server)
    assert sorted(calls) == list(range(100)) and set(calls.values()) == {1}, calls
    assert reports[0]["claimed"] == 30 and reports[0]["outcomes"] == {"done": 30}
    assert sum(r["claimed"] for r in reports) == 100
    # Nothing left: a further call claims none.
    again = client.post("/task/runWork", json={"maxTasks": 30}, headers=auth(admin_key)).get_json()["data"]
    assert again["ran"]["claimed"] == 0


def test_run_work_without_max_tasks_runs_none_by_default(client, make_model, model_server, admin_key):
    make_model("rw")
    ids = _submit("rw", 3)
    body = client.post("/task/runWork", headers=auth(admin_key)).get_json()
    assert body["code"] == 0 and body["data"]["ran"]["claimed"] == 0
    assert {r.state for r in _rows(ids)} == {JobState.PENDING}
    bad = client.post("/task/runWork", json={"maxTasks": -1}, headers=auth(admin_key))
    assert bad.status_code == 422


def test_run_work_respects_the_tenants_max_concurrency(client, make_model, model_server, admin_key):
    make_model("narrow", max_concurrency=2)
    ids = _submit("narrow", 4, hold="h")
    with transaction() as conn:  # two already running elsewhere (a resident worker, say)
        conn.execute(tasks.update().where(tasks.c.id.in_(ids[:2])).values(state=int(JobState.RUNNING)))
    ran = client.post("/task/runWork", json={"maxTasks": 10}, headers=auth(admin_key)).get_json()["data"]["ran"]
    assert ran["claimed"] == 0
    assert {r.id: r.state for r in _rows(ids)}[ids[2]] == JobState.PENDING


def test_run_work_beside_two_celery_workers_runs_each_attempt_once(test_env, tmp_path, make_model, model_server,
                                                                   admin_key, api_url):
    make_model("both", queue_limit=200, max_concurrency=8)
    # One call slot a process: the workers' 4 slots leave room under the 8 permits for the passes (with the
    # default 8 slots, the workers' refills would take every permit the moment it frees).
    ws = [WorkerProcess({**test_env, "ASYNCH_WORKER_SLOTS": "1"}, concurrency=2, log_path=tmp_path / f"w{i}.log",
                        name=f"w{i}").start() for i in range(2)]
    try:
        ids = _submit("both", 100, sleep_ms=30)
        deadline = time.time() + 120

        def pass_loop(_):
            import requests

            ran = 0
            while time.time() < deadline:
                data = requests.post(f"{api_url}/task/runWork", json={"maxTasks": 5}, headers=auth(admin_key),
                                     timeout=60).json()["data"]
                ran += data["ran"]["claimed"]
                if all(r.state == JobState.DONE for r in _rows(ids)):
                    return ran
            return ran

        with ThreadPoolExecutor(2) as ex:
            by_passes = sum(ex.map(pass_loop, range(2)))
    finally:
        for w in ws:
            w.stop()
    rows = _rows(ids)
    assert sorted(r.state for r in rows) == [JobState.DONE] * 100
    assert all(r.attempt == 1 for r in rows)
    calls = _calls_per_job(model_server)
    assert sorted(calls) == list(range(100)) and set(calls.values()) == {1}, calls
    by_workers = sum(1 for r in rows if r.worker is not None)
    assert by_passes == 100 - by_workers
    assert by_passes > 0 and by_workers > 0, (by_passes, by_workers)


def test_cli_run_once_and_clean_once(test_env, make_model, model_server):
    make_model("cli")
    ids = _submit("cli", 3)
    env = {**test_env, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "app.cli", "work", "run-once", "--max", "2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ran"]["claimed"] == 2
    assert sorted(r.state for r in _rows(ids)) == [JobState.PENDING, JobState.DONE, JobState.DONE]
    out = subprocess.run([sys.executable, "-m", "app.cli", "work", "clean-once"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) >= {"cleanup", "retry", "recover"}


def test_clean_work_does_what_the_seed_lists_under_it(client, make_model, model_server, admin_key, settings):
    """Expired claims, exhausted retries, timeouts, and the retries that are due, in one cleanWork."""
    from datetime import timedelta

    from app import transitions
    from app.clock import now
    from app.config import set_settings
    from app.jobs import execution

    set_settings(settings.with_overrides(failed_retention_seconds=0))
    make_model("cw", retry_times=3, queue_limit=20)
    p = Principal("tenant-a", "user", None)
    claimed, failed, overdue, due, lost = (jobs.submit(p, "cw", {"i": i}).row.id for i in range(5))
    assert execution.run_attempt(claimed, 0) == "done"
    with transaction() as conn:
        assert transitions.claim_results(conn, [claimed], None)
        conn.execute(tasks.update().where(tasks.c.id == claimed).values(expire_at=now() - timedelta(seconds=1)))
        # Retries exhausted: failed for good.
        assert transitions.claim(conn, failed, 0, now() + timedelta(minutes=5)) is not None
        assert transitions.fail_attempt(conn, failed, 1, "boom", retry_at=None) is not None
        conn.execute(tasks.update().where(tasks.c.id == overdue).values(deadline_at=now() - timedelta(seconds=1)))
        assert transitions.claim(conn, due, 0, now() + timedelta(minutes=5)) is not None
        assert transitions.fail_attempt(conn, due, 1, "boom", retry_at=now() - timedelta(seconds=1)) is not None
        # A claim whose lease ran out (its worker is gone).
        assert transitions.claim(conn, lost, 0, now() - timedelta(seconds=1)) is not None
    body = client.post("/task/cleanWork", headers=auth(admin_key)).get_json()
    assert body["code"] == 0, body
    data = body["data"]
    assert data["cleanup"]["claimed"] == 1 and data["cleanup"]["failed"] == 1 and data["cleanup"]["timeouts"] == 1
    assert data["retry"]["processed"] >= 1
    assert data["recover"]["leases"]["processed"] == 1
    states = {r.id: r.state for r in _rows([claimed, failed, overdue, due, lost])}
    assert claimed not in states and failed not in states  # hard-deleted
    assert states[overdue] == JobState.TIMEOUT
    assert states[due] == JobState.PENDING  # re-admitted, at the tail
    assert states[lost] == JobState.RETRY_WAIT  # the lost attempt failed; retries remain


def test_run_work_respects_autotunes_runtime_max_concurrency(client, make_model, model_server, admin_key, r):
    from app.infra.redis import keys

    make_model("tuned", max_concurrency=4)
    ids = _submit("tuned", 3, sleep_ms=1)
    with transaction() as conn:  # one already running elsewhere
        conn.execute(tasks.update().where(tasks.c.id == ids[0]).values(state=int(JobState.RUNNING)))
    r.set(keys.runtime_max_concurrency("tuned"), "1", px=60_000)
    ran = client.post("/task/runWork", json={"maxTasks": 10}, headers=auth(admin_key)).get_json()["data"]["ran"]
    assert ran["claimed"] == 0
