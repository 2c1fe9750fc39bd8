"""Long-poll (DESIGN.md invariant 7): wakes on a terminal state or at its
budget, never on pending -> running, and no wake-up can be lost."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from conftest import auth, job_row, submit, wait_until

from app import transitions
from app.clock import now
from app.infra import wakeups as waiters
from app.infra.db import transaction
from app.jobs import service as jobs
from app.jobs.schemas import WaitQuery
from app.tenancy.keys import Principal

pytestmark = pytest.mark.e2e


def _wait(api_url, key, model, job_id, ms):
    t0 = time.monotonic()
    resp = requests.get(f"{api_url}/v1/models/{model}/jobs/{job_id}/wait?timeout={ms}", headers=auth(key), timeout=60)
    return resp, time.monotonic() - t0


def test_budget_ends_the_wait_while_the_job_still_runs(api_url, workers, make_model, user_key):
    make_model("slow")
    job_id = submit(api_url, user_key, "slow", {"sleep_ms": 2000}).json()["job_id"]
    resp, took = _wait(api_url, user_key, "slow", job_id, 200)
    assert resp.status_code == 200
    assert resp.json()["state"] in ("pending", "running")
    assert 0.2 <= took < 1.5, took  # returned at its budget, not at the job's end


def test_waiter_wakes_on_done_long_before_its_budget(api_url, workers, make_model, user_key):
    make_model("quick")
    job_id = submit(api_url, user_key, "quick", {"sleep_ms": 300}).json()["job_id"]
    resp, took = _wait(api_url, user_key, "quick", job_id, 5000)
    assert resp.json()["state"] == "done"
    assert took < 4.0, took


def test_two_waiters_both_wake(api_url, workers, make_model, user_key):
    make_model("pair")
    job_id = submit(api_url, user_key, "pair", {"sleep_ms": 500}).json()["job_id"]
    with ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(lambda _: _wait(api_url, user_key, "pair", job_id, 8000), range(2)))
    for resp, took in outs:
        assert resp.json()["state"] == "done" and took < 7.0


def test_running_does_not_wake_a_waiter(api_url, workers, make_model, user_key):
    make_model("steps")
    job_id = submit(api_url, user_key, "steps", {"sleep_ms": 1500}).json()["job_id"]
    wait_until(lambda: job_row(job_id).state == 1, what="running")
    resp, took = _wait(api_url, user_key, "steps", job_id, 600)
    assert resp.json()["state"] == "running" and took >= 0.6


def test_wait_default_and_cap(settings):
    def budget(raw):
        return WaitQuery(timeout=raw).budget_ms()

    assert budget(None) == 30000
    assert budget("0") == 30000
    assert budget("-5") == 30000
    assert budget("soon") == 30000
    assert budget("1500") == 1500
    assert budget("999999999") == 300000


def test_finish_between_read_and_wait_is_not_lost(make_model):
    """The lost-wake-up window: the job finishes (commit + publish) after the
    waiter read it as running and before it blocks.  The wake-up must still
    arrive, so the wait ends long before its 5 s budget."""
    make_model("window")
    p = Principal("tenant-a", "user", None)
    job_id = jobs.submit(p, "window", {}).row.id
    with transaction() as conn:
        transitions.claim(conn, job_id, 0, now() + timedelta(minutes=1))
    waiters.hub.ensure_started()
    assert waiters.hub.healthy
    reads = []

    def read():
        with transaction() as conn:
            row = jobs.load_job(conn, p, job_id)
        reads.append(row.state)
        if len(reads) == 1:
            # Finish the job inside the window, as a worker would.
            with transaction() as conn:
                won = transitions.complete(conn, job_id, 1, location="x", content_type="t", size=0)
            jobs.after_terminal(won)
            time.sleep(0.2)  # let the listener deliver before the waiter blocks
        return row

    t0 = time.monotonic()
    row = waiters.wait_for_terminal(job_id, 5.0, read)
    took = time.monotonic() - t0
    assert reads[0] == 1 and row.state == 2
    assert took < 2.0, took


def test_finish_before_the_read_is_seen_by_the_read(make_model):
    make_model("early")
    p = Principal("tenant-a", "user", None)
    job_id = jobs.submit(p, "early", {}).row.id
    jobs.cancel_job(p, job_id)
    calls = []

    def read():
        with transaction() as conn:
            calls.append(1)
            return jobs.load_job(conn, p, job_id)

    row = waiters.wait_for_terminal(job_id, 5.0, read)
    assert row.state == 6 and len(calls) == 1


def test_many_waiters_share_one_listener(api_url, workers, make_model, user_key):
    make_model("crowd", queue_limit=50)
    ids = [submit(api_url, user_key, "crowd", {"sleep_ms": 400}).json()["job_id"] for _ in range(5)]
    before = threading.active_count()
    with ThreadPoolExecutor(40) as ex:
        outs = list(ex.map(lambda i: _wait(api_url, user_key, "crowd", ids[i % 5], 15000), range(40)))
    assert all(resp.json()["state"] == "done" for resp, _ in outs)
    assert waiters.hub.waiter_count() == 0
    assert threading.active_count() <= before + 1


def test_a_woken_job_is_read_once_for_all_its_waiters(make_model):
    """Single flight: 60 waiters of one job, one terminal commit, and the
    process reads that job's row once -- not once per waiter."""
    from sqlalchemy import event

    from app.infra.db import get_engine

    make_model("flight")
    p = Principal("tenant-a", "user", None)
    job_id = jobs.submit(p, "flight", {}).row.id
    with transaction() as conn:
        transitions.claim(conn, job_id, 0, now() + timedelta(minutes=1))
    waiters.hub.ensure_started()
    reads: list[str] = []

    def count(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "asynch_task" in statement:
            reads.append(statement)

    with ThreadPoolExecutor(60) as ex:
        futs = [ex.submit(jobs.wait_job, p, job_id, 10000) for _ in range(60)]
        wait_until(lambda: waiters.hub.waiter_count() == 60, what="60 waiters registered")
        time.sleep(0.2)  # their first reads are done (they read right after registering)
        engine = get_engine(autocommit=True)
        event.listen(engine, "before_cursor_execute", count)
        try:
            t0 = time.monotonic()
            with transaction() as conn:
                won = transitions.complete(conn, job_id, 1, location="x", content_type="t", size=0)
            jobs.after_terminal(won)
            rows = [f.result(10) for f in futs]
            took = time.monotonic() - t0
        finally:
            event.remove(engine, "before_cursor_execute", count)
    assert all(r.state == 2 for r in rows)
    assert took < 2.0, took
    assert len(reads) == 1, f"{len(reads)} reads of the job after its wake-up"


def test_no_wakeup_lost_while_the_listener_reconnects(test_env, tmp_path, make_model):
    """240 waits on 40 jobs on a real gevent server (2 workers); the jobs
    finish over 4 s while the servers' listener connections are cut every
    0.3 s.  Every wait answers done, within 2.5 s of its job's end (not at
    its 12 s budget)."""
    import asyncio

    import aiohttp
    from api_process import ApiProcess, finish_by_hand, run_by_hand
    from conftest import make_key

    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=2).start()
    try:
        make_model("reconnect", queue_limit=100)
        key = make_key("tenant-a")
        ids = [submit(api.base, key, "reconnect", {}).json()["job_id"] for _ in range(40)]
        for j in ids:
            run_by_hand(j)
        answers: list[tuple[str, float, str]] = []

        async def all_waits() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                async def one(job: str) -> None:
                    url = f"{api.base}/v1/models/reconnect/jobs/{job}/wait?timeout=12000"
                    async with s.get(url, headers=auth(key)) as r:
                        body = await r.json()
                    answers.append((job, time.monotonic(), body.get("state", str(r.status))))

                await asyncio.gather(*(one(j) for j in ids for _ in range(6)))

        t = threading.Thread(target=asyncio.run, args=(all_waits(),))
        t.start()
        time.sleep(1.5)  # parked
        finished: dict[str, float] = {}
        stop = threading.Event()
        kills = []

        def cut() -> None:
            while not stop.wait(0.3):
                kills.append(api.kill_listeners(test_env["ASYNCH_REDIS_URL"]))

        killer = threading.Thread(target=cut)
        killer.start()
        for j in ids:
            finish_by_hand(j)
            finished[j] = time.monotonic()
            time.sleep(0.1)
        t.join(30)
        stop.set()
        killer.join()
    finally:
        api.stop()
    assert sum(kills) >= 10, kills
    assert len(answers) == 240
    not_done = [(j, state) for j, _, state in answers if state != "done"]
    assert not not_done, f"{len(not_done)} waits ended without their wake-up: {not_done[:5]}"
    late = sorted(round(at - finished[j], 2) for j, at, _ in answers)[-5:]
    assert late[-1] < 2.5, f"slowest answers after the job's end (s): {late}"
