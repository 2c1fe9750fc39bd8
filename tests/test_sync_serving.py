"""Sync mode on a real gevent API server (issue 16 item 2): a sync submit's
wait parks no thread and counts against the waiter caps; N is capped by
ASYNCH_WAIT_MAX_MS.  No Celery worker runs in this module: the jobs stay
pending until the test moves them by hand."""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from api_process import ApiProcess, finish_by_hand, run_by_hand
from helpers import auth, make_key, wait_until
from test_sync_mode import _sync

pytestmark = pytest.mark.e2e


def _raw_sync(base: str, key: str, model: str, prefer: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall((f"POST /v1/models/{model}/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
               f"Prefer: {prefer}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}").encode())
    return s


def _parked(base: str) -> int:
    text = requests.get(f"{base}/metrics", timeout=10).text
    return int(float(next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("asynch_waiters ")), "0")))


def test_sync_waits_park_no_thread_under_gevent_and_count_against_the_caps(test_env, tmp_path, make_model):
    """One gevent worker: 6 sync submits stay parked (no worker runs their
    jobs) while other requests are served; the per-tenant cap of 6 is full,
    so a 7th sync submit is admitted at once as a 202 without
    Preference-Applied; N is capped by ASYNCH_WAIT_MAX_MS (2 s here)."""
    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1, threads=1,
                     extra_env={"ASYNCH_WAITERS_PER_TENANT": "6", "ASYNCH_WAIT_MAX_MS": "20000"}).start()
    held = []
    try:
        make_model("gm", queue_limit=100)
        key = make_key("tenant-s")
        for _ in range(6):
            held.append(_raw_sync(api.base, key, "gm", "wait=20"))
        wait_until(lambda: _parked(api.base) == 6, timeout=10, what="6 sync submits parked")
        # One gevent worker with threads=1: still serving while they wait.
        t0 = time.monotonic()
        r = requests.post(f"{api.base}/v1/models/gm/jobs", json={}, headers={**auth(key), "Prefer": "wait=20"},
                          timeout=10)
        assert r.status_code == 202 and "Preference-Applied" not in r.headers, (r.status_code, r.headers)
        assert time.monotonic() - t0 < 2
        # Another tenant waits as usual; a job that ends wakes it: 200.
        other = make_key("tenant-t")
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_sync, api.base, other, "gm", {}, "wait=15")
            wait_until(lambda: _parked(api.base) == 7, timeout=10, what="tenant-t's sync submit parked")
            from sqlalchemy import select

            from app.infra.db import transaction
            from app.infra.tables import tasks
            with transaction() as conn:
                job = conn.execute(select(tasks.c.id).where(tasks.c.tenant_id == "tenant-t")).scalar_one()
            run_by_hand(job)
            finish_by_hand(job)
            r, took = fut.result(timeout=20)
        assert r.status_code == 200 and r.json()["state"] == "done" and r.headers["Preference-Applied"] == "wait=15"
    finally:
        for s in held:
            s.close()
        api.stop()


def test_the_wait_is_capped_by_the_wait_limit(test_env, tmp_path, make_model):
    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1,
                     extra_env={"ASYNCH_WAIT_MAX_MS": "1000"}).start()
    try:
        make_model("cap", queue_limit=10)
        r, took = _sync(api.base, make_key("tenant-c"), "cap", {}, "wait=30")
        assert r.status_code == 202 and r.headers["Preference-Applied"] == "wait=1"
        assert 0.9 <= took < 5, took
    finally:
        api.stop()


def test_event_streams_park_no_thread_under_gevent(test_env, tmp_path, make_model):
    """One gevent worker with one thread: five job streams stay open while
    other requests are served; the job's moves (by hand, as a worker makes
    them) reach every stream in order, and each ends after the terminal event."""
    from test_events import SSE

    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1, threads=1,
                     extra_env={"ASYNCH_EVENTS_POLL_SECONDS": "0.2"}).start()
    streams = []
    try:
        make_model("gs", queue_limit=10)
        key = make_key("tenant-e")
        job = requests.post(f"{api.base}/v1/models/gs/jobs", json={}, headers=auth(key), timeout=10).json()["job_id"]
        url = f"{api.base}/v1/models/gs/jobs/{job}/events"
        streams = [SSE(url, key) for _ in range(5)]
        for s in streams:
            assert s.next()[:2] == ("0", "pending")
        wait_until(lambda: _parked(api.base) == 5, timeout=10, what="5 streams counted as waiters")
        t0 = time.monotonic()
        assert requests.get(f"{api.base}/v1/models/gs/jobs/{job}", headers=auth(key), timeout=5).status_code == 200
        assert time.monotonic() - t0 < 2
        run_by_hand(job)
        for s in streams:
            assert s.next()[:2] == ("1", "running")
        finish_by_hand(job)
        for s in streams:
            assert s.next()[:2] == ("end", "done") and s.next() is None
        wait_until(lambda: _parked(api.base) == 0, timeout=10, what="the streams' places back")
    finally:
        for s in streams:
            s.close()
        api.stop()
