"""The Python client (issue 16 item 6), against a live stack: the API on a
real socket, Celery worker processes, PostgreSQL, Redis and the stub model.
Both clients, their typed errors, retries honouring Retry-After, the
automatic Idempotency-Key, and the ``asynch submit`` / ``wait`` /
``result`` / ``cancel`` commands as subprocesses (a job named by its id
alone, or MODEL JOB_ID; errors in one line)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, job_row, wait_until

import model_asynch
from model_asynch import AsyncClient, Client, NotFinished, NotFound, RateLimited, ValidationError

pytestmark = pytest.mark.e2e


def test_the_client_package_is_independent_of_the_server():
    for f in Path(ROOT, "model_asynch").glob("*.py"):
        text = f.read_text()
        assert "from app" not in text and "import app" not in text, f


def test_submit_wait_result_events_cancel_batch(api_url, workers, make_model, user_key, model_server):
    make_model("cl")
    with Client(api_url, user_key) as c:
        job = c.submit("cl", {"x": 1})
        assert job.state == "pending" and job.job_id.startswith("job_")
        assert job_row(job.job_id).idempotency_key.startswith("client-")  # made by the client, for its retries
        done = c.wait("cl", job.job_id, timeout=30)
        assert done.state == "done" and done.finished
        assert c.result("cl", job.job_id).json() == {"model": "demo-echo", "echo": {"x": 1}}
        assert c.get("cl", job.job_id).state == "done"
        # sync mode
        sync = c.submit("cl", {"y": 2}, wait=20)
        assert sync.state == "done" and sync.has_result and sync.result["echo"] == {"y": 2}
        assert c.run("cl", {"z": 3}).state == "done"
        # the same key returns the same job
        a = c.submit("cl", {"k": 1}, idempotency_key="same")
        b = c.submit("cl", {"k": 1}, idempotency_key="same")
        assert a.job_id == b.job_id and b.replayed
        # events
        ev_job = c.submit("cl", {"sleep_ms": 500})
        events = [(e.id, e.event) for e in c.events("cl", ev_job.job_id)]
        assert events[-1] == ("end", "done") and events[0][1] in ("pending", "running"), events
        # cancel
        held = c.submit("cl", {"hold": "cl"})
        assert c.cancel("cl", held.job_id).state == "canceled"
        model_server.state.release("cl")
        # batch
        res = c.batch("cl", [{"n": 1}, {"payload": "bad"}, {"payload": {"n": 3}, "priority": 9}])
        assert res.admitted == 2 and [i.status for i in res.items] == [202, 422, 202]
        assert isinstance(res.items[1].error, ValidationError)
        assert res.items[1].error.errors[0]["pointer"] == "/jobs/1/payload"


def test_typed_errors_carry_the_api_text(api_url, make_model, user_key, model_server):
    make_model("cle")
    with Client(api_url, user_key, retries=0) as c:
        with pytest.raises(NotFound) as e:
            c.submit("nope", {})
        assert e.value.status == 404 and e.value.message == "model not found: nope"
        with pytest.raises(ValidationError) as e:
            c.submit("cle", {}, priority=12)
        assert e.value.errors[0]["pointer"] == "/priority"
        # Held at the stub: the module's workers (started by an earlier test) must not finish it first.
        job = c.submit("cle", {"hold": "cle"})
        try:
            with pytest.raises(NotFinished) as e:
                c.result("cle", job.job_id)
            assert e.value.status == 409 and e.value.message.startswith("job not finished")
        finally:
            model_server.state.release("cle")


def test_retries_on_429_honour_retry_after(api_url, workers, make_model, user_key, model_server):
    """The model's queue holds one job: a second submit is 429 with
    Retry-After 1 until the first ends; the client waits it out, and
    without retries it raises RateLimited with the API's text."""
    make_model("clr", queue_limit=1, max_concurrency=1, expected_seconds=1)
    with Client(api_url, user_key, retries=0) as c:
        first = c.submit("clr", {"hold": "clr"})
        wait_until(lambda: job_row(first.job_id).state == 1, what="running")
        with pytest.raises(RateLimited) as e:
            c.submit("clr", {"n": 2})
        assert e.value.retry_after == 1 and e.value.message == "async queue full (max 1)"
    threading.Timer(1.5, model_server.state.release, args=("clr",)).start()
    t0 = time.monotonic()
    with Client(api_url, user_key, retries=10) as c:
        second = c.submit("clr", {"n": 2})
    took = time.monotonic() - t0
    assert second.state == "pending" and 1.0 <= took < 15, took


def test_a_retried_full_queue_says_what_it_waits_for(api_url, workers, make_model, user_key, model_server, caplog):
    """Issue 32 item 4: every wait is told before it -- ``on_retry`` gets the
    notice (by default an INFO line on the model_asynch logger), and the CLI
    says it on stderr, one line per wait, before its error line."""
    make_model("clw", queue_limit=1, max_concurrency=1, expected_seconds=1)
    with Client(api_url, user_key, retries=0) as c:
        first = c.submit("clw", {"hold": "clw"})
    try:
        wait_until(lambda: job_row(first.job_id).state == 1, what="running")
        told = []
        with Client(api_url, user_key, retries=1, on_retry=told.append) as c, pytest.raises(RateLimited):
            c.submit("clw", {"n": 2})
        assert [(t.request, t.model, t.attempt, t.retry_after, t.delay) for t in told] == [
            ("POST /v1/models/clw/jobs", "clw", 1, 1.0, 1.0)], told
        assert str(told[0]) == "queue full for clw, retrying in 1 s (Retry-After)"
        with caplog.at_level(logging.INFO, logger="model_asynch"), Client(api_url, user_key, retries=1) as c, \
                pytest.raises(RateLimited):
            c.submit("clw", {"n": 3})
        assert [r.getMessage() for r in caplog.records if r.name == "model_asynch"] == [
            "POST /v1/models/clw/jobs: queue full for clw, retrying in 1 s (Retry-After)"]
        out = _cli(api_url, user_key, "submit", "clw", '{"n": 4}')
        assert out.returncode == 1 and out.stderr.splitlines() == [
            "queue full for clw, retrying in 1 s (Retry-After)"] * 2 + [
            "Error: async queue full (max 1) (HTTP 429): retry later (after 1 s)"], out.stderr
    finally:
        model_server.state.release("clw")


def test_the_asyncio_client(api_url, workers, make_model, user_key):
    make_model("cla")

    async def main():
        async with AsyncClient(api_url, user_key) as c:
            job = await c.submit("cla", {"a": 1})
            done = await c.wait("cla", job.job_id, timeout=30)
            assert done.state == "done"
            assert (await c.result("cla", job.job_id)).json()["echo"] == {"a": 1}
            sync = await c.submit("cla", {"b": 2}, wait=20)
            assert sync.state == "done" and sync.result["echo"] == {"b": 2}
            ev_job = await c.submit("cla", {"sleep_ms": 300})
            events = [(e.id, e.event) async for e in c.events("cla", ev_job.job_id)]
            assert events[-1] == ("end", "done"), events
            res = await c.batch("cla", [{"n": i} for i in range(5)])
            assert res.admitted == 5
            with pytest.raises(model_asynch.NotFound):
                await c.get("cla", "job_nope")
            many = await asyncio.gather(*(c.run("cla", {"i": i}) for i in range(5)))
            assert {j.state for j in many} == {"done"}

    asyncio.run(main())


def _cli(api_url, key, *args, stdin=None):
    env = {**os.environ, "ASYNCH_URL": api_url, "ASYNCH_API_KEY": key, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60, input=stdin)


def test_asynch_submit_and_wait_commands(api_url, workers, make_model, user_key, model_server):
    make_model("clc")
    out = _cli(api_url, user_key, "submit", "clc", '{"c": 1}')
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "pending"
    out = _cli(api_url, user_key, "wait", "clc", job["job_id"], "--timeout", "30")
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "done", (out.stdout, out.stderr)
    out = _cli(api_url, user_key, "submit", "clc", "-", "--wait", "20", stdin='{"d": 4}')
    assert out.returncode == 0 and json.loads(out.stdout)["result"]["echo"] == {"d": 4}, out.stderr
    out = _cli(api_url, user_key, "submit", "nope", "{}")
    assert out.returncode == 1 and "Error: model not found: nope" in out.stderr
    # Held at the stub until released: the CLI's own start-up time cannot let it finish.
    slow = json.loads(_cli(api_url, user_key, "submit", "clc", '{"hold": "clc"}').stdout)
    try:
        out = _cli(api_url, user_key, "wait", "clc", slow["job_id"], "--timeout", "0.5")
        assert out.returncode == 2 and json.loads(out.stdout)["state"] in ("pending", "running")
    finally:
        model_server.state.release("clc")


def test_a_job_is_named_by_its_id_alone(api_url, workers, make_model, user_key, model_server):
    """wait, result and cancel with the job id only (its model looked up with
    GET /v1/jobs/{id}), the old MODEL JOB_ID form too; errors in one line."""
    make_model("cli2", form=[{"field": "prompt", "type": "string", "required": True}])
    job = _cli(api_url, user_key, "submit", "cli2", '{"prompt": "p"}', "-q")
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip()
    assert job_id.startswith("job_") and job_id == job_row(job_id).id
    out = _cli(api_url, user_key, "wait", job_id, "--timeout", "30")
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "done", out
    out = _cli(api_url, user_key, "result", job_id)
    assert out.returncode == 0 and json.loads(out.stdout) == {"model": "demo-echo", "echo": {"prompt": "p"}}, out
    assert json.loads(_cli(api_url, user_key, "result", "cli2", job_id).stdout)["echo"] == {"prompt": "p"}
    held = _cli(api_url, user_key, "submit", "cli2", '{"prompt": "h", "hold": "cli2"}', "-q").stdout.strip()
    out = _cli(api_url, user_key, "cancel", held)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "canceled", out
    model_server.state.release("cli2")
    out = _cli(api_url, user_key, "result", held)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"Error: job ended without a result (state: canceled) (HTTP 409): only a done job has one: `asynch wait "
        f"{held}` shows how it ended"], out.stderr
    out = _cli(api_url, user_key, "submit", "cli2", "{}")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "Error: request body does not match the model's form; /prompt: is required (HTTP 422): fix the request "
        "(the model's form: GET /v1/models/MODEL)"], out.stderr
    out = _cli(api_url, "ak_wrong", "wait", job_id)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1 and "(HTTP 401): pass a valid key" in out.stderr
