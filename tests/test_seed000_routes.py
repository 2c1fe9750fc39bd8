"""An unchanged seed-000 client (issue 32 item 2): the contract's own routes
-- POST /jobs, GET /jobs/{id}, GET /jobs/{id}/wait?timeout=ms,
GET /jobs/{id}/result -- served for ASYNCH_SEED000_MODEL with the contract's
status codes, error texts and wait semantics, the result in its standard
envelope; unset, a 404 that names the setting.

Real pieces: PostgreSQL, Redis, the API on a socket, the stub model service
(which holds a call until the test releases it), a Celery worker process."""
from __future__ import annotations

import requests
from helpers import auth, job_row, wait_until

from app.config import get_settings, set_settings
from app.states import JobState

ROUTES = (("POST", "/jobs"), ("GET", "/jobs/job_x"), ("GET", "/jobs/job_x/wait"), ("GET", "/jobs/job_x/result"))


def _serve(model: str) -> None:
    set_settings(get_settings().with_overrides(seed000_model=model))


def _get(api_url, key, path, **params):
    return requests.get(api_url + path, params=params, headers=auth(key), timeout=30)


def test_unset_every_route_answers_a_404_that_names_the_setting(api_url, user_key):
    for method, path in ROUTES:
        resp = requests.request(method, api_url + path, json={"x": 1}, headers=auth(user_key), timeout=10)
        assert resp.status_code == 404, (path, resp.text)
        assert "ASYNCH_SEED000_MODEL is unset" in resp.json()["error"], resp.text
    # Authentication still comes first.
    assert requests.post(api_url + "/jobs", json={}, timeout=10).status_code == 401


def test_a_seed_000_client_submits_polls_waits_and_reads_the_envelope(api_url, make_model, model_server, workers,
                                                                      user_key, other_key):
    make_model("echo", timeout_seconds=30)
    _serve("echo")
    resp = requests.post(f"{api_url}/jobs", json={"prompt": "hi", "hold": "s0"}, headers=auth(user_key), timeout=10)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    job_id = body["job_id"]
    assert (body["state"], body["poll_url"], body["result_url"]) == ("pending", f"/jobs/{job_id}",
                                                                     f"/jobs/{job_id}/result")
    assert resp.headers["Location"] == f"/jobs/{job_id}" and job_row(job_id).model_name == "echo"
    try:
        wait_until(lambda: job_row(job_id).state == JobState.RUNNING, timeout=30, what="running")
        polled = _get(api_url, user_key, body["poll_url"]).json()
        assert polled["job_id"] == job_id and polled["state"] == "running" and polled["elapsed_ms"] >= 0
        # The budget ends while it runs: the wait answers running (it never ends just because it started).
        assert _get(api_url, user_key, f"/jobs/{job_id}/wait", timeout="300").json()["state"] == "running"
        early = _get(api_url, user_key, body["result_url"])
        assert early.status_code == 409 and early.json() == {"error": "job not finished (state: running)"}
    finally:
        model_server.state.release("s0")
    done = _get(api_url, user_key, f"/jobs/{job_id}/wait", timeout="30000").json()
    assert done["state"] == "done", done
    for _ in range(2):  # repeatable until cleanup
        result = _get(api_url, user_key, body["result_url"])
        assert result.status_code == 200 and result.headers["Content-Type"] == "application/json", result.text
        envelope = result.json()
        assert envelope["status"] == 0 and envelope["status_str"] == "OK" and envelope["task_id"] == job_id
        assert envelope["model"] == {"name": "echo", "version": ""} and envelope["partial"] is False
        assert envelope["results"] == [{"status": 0, "data": {"model": "demo-echo",
                                                              "echo": {"prompt": "hi", "hold": "s0"}}}]
        assert envelope["server_time_ms"] > 0
    # Another tenant's job does not exist for it; an unknown id is the contract's 404 on every read.
    assert _get(api_url, other_key, f"/jobs/{job_id}").status_code == 404
    for path in ("/jobs/job_nope", "/jobs/job_nope/wait", "/jobs/job_nope/result"):
        missing = _get(api_url, user_key, path)
        assert missing.status_code == 404 and missing.json() == {"error": "job not found: job_nope"}, path
    wrong = requests.post(f"{api_url}/jobs/{job_id}", headers=auth(user_key), timeout=10)
    assert wrong.status_code == 405 and wrong.json() == {"error": "method not allowed"}
    # A result that is not JSON is served as its bytes, as on the v1 route.
    plain = requests.post(f"{api_url}/jobs", json={"content_type": "text/plain", "body": "just text"},
                          headers=auth(user_key), timeout=10).json()
    assert _get(api_url, user_key, f"/jobs/{plain['job_id']}/wait", timeout="30000").json()["state"] == "done"
    raw = _get(api_url, user_key, plain["result_url"])
    assert raw.status_code == 200 and raw.text == "just text" and raw.headers["Content-Type"].startswith("text/plain")


def test_the_wait_budget_default_and_cap_and_a_full_queue(api_url, make_model, model_server, user_key):
    """The job is held at the model (or still queued): each wait ends at its budget."""
    make_model("slow", queue_limit=1, timeout_seconds=30)
    _serve("slow")
    job = requests.post(f"{api_url}/jobs", json={"hold": "w"}, headers=auth(user_key), timeout=10).json()
    try:
        # <= 0 or unparsable: the default budget; past the cap: the cap (both shortened here to end soon).
        set_settings(get_settings().with_overrides(wait_default_ms=200, wait_max_ms=400))
        for timeout in ("0", "-5", "soon", "", "999999999"):
            resp = _get(api_url, user_key, f"/jobs/{job['job_id']}/wait", timeout=timeout)
            assert resp.status_code == 200 and resp.json()["state"] in ("pending", "running"), (timeout, resp.text)
        full = requests.post(f"{api_url}/jobs", json={"n": 2}, headers=auth(user_key), timeout=10)
        assert full.status_code == 429 and full.json() == {"error": "async queue full (max 1)"}, full.text
        assert 1 <= int(full.headers["Retry-After"]) <= get_settings().queue_retry_after_max_seconds
    finally:
        model_server.state.release("w")
    bad = requests.post(f"{api_url}/jobs", data="[1]", headers={**auth(user_key), "Content-Type": "application/json"},
                        timeout=10)
    assert bad.status_code == 400 and bad.json() == {"error": "request body must be a JSON object"}
