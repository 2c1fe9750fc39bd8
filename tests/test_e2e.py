"""End to end over HTTP: API socket -> gate -> PostgreSQL -> broker -> Celery
worker process -> stub model over HTTP -> storage -> result read back."""
from __future__ import annotations

import json

import pytest
import requests
from helpers import auth, job_row, submit, wait_until

pytestmark = pytest.mark.e2e


def test_job_reaches_done_and_result_reads_back(api_url, workers, make_model, user_key, model_server, r):
    make_model("echo")
    resp = submit(api_url, user_key, "echo", {"prompt": "hello", "n": 3})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    job_id = body["job_id"]
    assert job_id.startswith("job_") and body["state"] == "pending"
    assert resp.headers["Location"] == body["poll_url"]

    waited = requests.get(f"{api_url}{body['poll_url']}/wait?timeout=20000", headers=auth(user_key), timeout=30)
    assert waited.status_code == 200
    assert waited.json()["state"] == "done", waited.json()

    res = requests.get(f"{api_url}{body['result_url']}", headers=auth(user_key), timeout=10)
    assert res.status_code == 200
    assert res.headers["Content-Type"] == "application/json"
    assert json.loads(res.content) == {"model": "demo-echo", "echo": {"prompt": "hello", "n": 3}}
    # Repeatable.
    assert requests.get(f"{api_url}{body['result_url']}", headers=auth(user_key), timeout=10).content == res.content

    assert len(model_server.state.calls) == 1
    call = model_server.state.calls[0]
    assert call["method"] == "POST" and call["path"] == "/v1/echo"
    row = job_row(job_id)
    assert row.state == 2 and row.attempt == 1 and row.finished_at is not None
    assert r.zcard("asynch:gate:{echo}") == 0


def test_binary_result_keeps_bytes_and_content_type(api_url, workers, make_model, user_key):
    make_model("png")
    raw = "\x89PNG-not-really\x00\x01"
    resp = submit(api_url, user_key, "png", {"content_type": "image/png", "body": raw})
    job = resp.json()
    wait_until(lambda: job_row(job["job_id"]).state == 2, what="done")
    res = requests.get(f"{api_url}{job['result_url']}", headers=auth(user_key), timeout=10)
    assert res.headers["Content-Type"] == "image/png"
    assert res.content == raw.encode()


def test_get_model_sends_query_and_headers(api_url, workers, make_model, user_key, model_server):
    # A job may override API_KEY (a head_msg header) and add X-Extra only because the model names them.
    make_model("getter", http_method="GET", route="/q", head_msg="API_KEY:secret-1,API_NUM:123,API_STATE:true",
               model_key_headers="API_KEY,X-Extra")
    resp = requests.post(f"{api_url}/v1/models/getter/jobs", json={"a": 1, "b": True, "c": "x"},
                         headers={**auth(user_key), "X-Model-Key": "API_KEY:override,X-Extra:e"}, timeout=10)
    assert resp.status_code == 202, resp.text
    wait_until(lambda: job_row(resp.json()["job_id"]).state == 2, what="done")
    call = model_server.state.calls[0]
    assert call["method"] == "GET" and call["path"] == "/q"
    assert call["payload"] == {"a": "1", "b": "true", "c": "x"}
    h = {k.lower(): v for k, v in call["headers"].items()}
    assert h["api_key"] == "override" and h["api_num"] == "123" and h["api_state"] == "true"
    assert h["x-extra"] == "e"
    # The job and its attempt, so a model can deduplicate (docs/api.md, "What a model receives").
    assert h["x-asynch-job-id"] == resp.json()["job_id"] and h["x-asynch-attempt"] == "1"
