"""Sync mode (issue 16 item 2): ``Prefer: wait=N`` on a submit answers 200
with the terminal job when it ends within N seconds, else 202 as without
it; the wait runs on the long-poll path (no thread parked under gevent) and
under the waiter caps (tests/test_sync_serving.py, on a gevent server)."""
from __future__ import annotations

import time

import pytest
import requests
from helpers import auth

from app.config import set_settings
from app.web.v1_jobs import prefer_wait

pytestmark = pytest.mark.e2e


def _sync(base, key, model, body, prefer="wait=10", **headers):
    t0 = time.monotonic()
    r = requests.post(f"{base}/v1/models/{model}/jobs", json=body, timeout=60,
                      headers={**auth(key), "Prefer": prefer, **headers})
    return r, time.monotonic() - t0


def test_prefer_header_parsing():
    assert prefer_wait(None) is None
    assert prefer_wait("wait=5") == 5
    assert prefer_wait("respond-async, wait=7") == 7
    assert prefer_wait('WAIT="3"; foo=bar') == 3
    assert prefer_wait("handling=lenient") is None
    assert prefer_wait("wait=soon") is None and prefer_wait("wait=0") is None and prefer_wait("wait=-1") is None


def test_a_job_that_ends_in_time_answers_200_with_its_result_inline(api_url, workers, make_model, user_key):
    make_model("sync-echo")
    r, took = _sync(api_url, user_key, "sync-echo", {"sleep_ms": 200, "x": 1})
    assert r.status_code == 200, r.text
    assert r.headers["Preference-Applied"] == "wait=10"
    body = r.json()
    assert body["state"] == "done" and body["job_id"].startswith("job_")
    assert body["result"] == {"model": "demo-echo", "echo": {"sleep_ms": 200, "x": 1}}
    assert body["result_url"].endswith("/result") and r.headers["Location"] == body["poll_url"]
    assert took < 8
    # The same Idempotency-Key replays the finished job at once, with its result.
    r1, _ = _sync(api_url, user_key, "sync-echo", {"v": 2}, **{"Idempotency-Key": "k1"})
    r2, took2 = _sync(api_url, user_key, "sync-echo", {"v": 2}, **{"Idempotency-Key": "k1"})
    assert r1.status_code == r2.status_code == 200
    assert r2.headers["Idempotent-Replayed"] == "true" and r2.json()["job_id"] == r1.json()["job_id"]
    assert r2.json()["result"] == r1.json()["result"]


def test_a_failed_job_answers_200_with_its_error(api_url, workers, make_model, user_key):
    make_model("sync-fail")
    r, _ = _sync(api_url, user_key, "sync-fail", {"status": 400})
    assert r.status_code == 200 and r.json()["state"] == "failed" and r.json()["error"]
    assert "result" not in r.json()


def test_a_large_or_binary_result_is_left_at_result_url(api_url, workers, make_model, user_key, settings):
    make_model("sync-big")
    set_settings(settings.with_overrides(sync_result_max_bytes=10))
    r, _ = _sync(api_url, user_key, "sync-big", {"pad": "y" * 100})
    assert r.status_code == 200 and r.json()["state"] == "done" and "result" not in r.json()
    assert requests.get(api_url + r.json()["result_url"], headers=auth(user_key), timeout=10).json()["echo"]["pad"]
    set_settings(settings)
    r, _ = _sync(api_url, user_key, "sync-big", {"size": 50})
    assert r.status_code == 200 and "result" not in r.json()
    assert r.json()["content_type"] == "application/octet-stream"


def test_a_job_still_running_at_the_budget_answers_202(api_url, workers, make_model, user_key):
    make_model("sync-slow")
    r, took = _sync(api_url, user_key, "sync-slow", {"sleep_ms": 4000}, prefer="wait=1")
    assert r.status_code == 202, r.text
    assert r.headers["Preference-Applied"] == "wait=1"
    assert r.json()["state"] in ("pending", "running")
    assert 1.0 <= took < 3.5, took
    # Without the preference: 202 at once, no Preference-Applied.
    r = requests.post(f"{api_url}/v1/models/sync-slow/jobs", json={}, headers=auth(user_key), timeout=10)
    assert r.status_code == 202 and "Preference-Applied" not in r.headers
