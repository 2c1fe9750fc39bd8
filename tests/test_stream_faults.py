"""Streamed output under faults (issue 31 item 4's invariants): SIGKILL of the worker process mid-stream and a
cancel mid-stream.  A job that ends done has its stored result equal to the output its stream delivered for
its last attempt; no permit stays held and no upstream connection stays open.  Real worker processes, the
stub model streaming over HTTP, the API on a real socket."""
from __future__ import annotations

import os
import signal
import time

import pytest
import requests
from helpers import WorkerProcess, auth, job_row, permits, submit, wait_until
from stress_util import maintenance_loop
from test_call_stops import _hung_up_within
from test_stream_output import OutputStream, _stored, _text, _url

from app.states import JobState

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _calls_of(model_server, job):
    return [c for c in model_server.state.calls if c["headers"].get("X-Asynch-Job-Id") == job]


def test_sigkill_mid_stream_loses_no_chunk_of_the_job_that_ends_done(test_env, tmp_path, make_model, model_server,
                                                                     api_url, user_key):
    make_model("killstream", streaming=True, timeout_seconds=5, retry_times=2)
    w = WorkerProcess({**test_env, "ASYNCH_LEASE_GRACE_SECONDS": "1"}, concurrency=1,
                      log_path=tmp_path / "w.log", name="ks").start()
    try:
        job = submit(api_url, user_key, "killstream", {"stream": True, "chunks": 8, "chunk_ms": 5,
                                                       "stream_hold": "kill", "hold_at": 4}).json()["job_id"]
        s = OutputStream(_url(api_url, "killstream", job), user_key)
        first = [s.next() for _ in range(5)]  # attempt 1 and four chunks, the fifth held
        assert first[0][:2] == ("1-0", "attempt") and all(e == "output" for _i, e, _d in first[1:])
        (pid,) = w.pool_pids()
        os.kill(pid, signal.SIGKILL)
        model_server.state.release("kill")  # the retry's call streams at once
        with maintenance_loop():  # the killed attempt's lease runs out; recovery retries it
            rest = s.all()
        s.close()
    finally:
        model_server.state.release("kill")
        w.stop()
    assert rest[-1][1] == "done", rest
    events = first + rest
    row = job_row(job)
    assert row.state == JobState.DONE and row.attempt >= 2
    stored = _stored(api_url, user_key, "killstream", job)
    assert _text(events, attempt=row.attempt).encode() == stored  # every chunk of the attempt that ended done
    assert any(e == "attempt" and i == f"{row.attempt}-0" for i, e, _d in events)
    assert permits("killstream", "tenant-a") == []
    wait_until(lambda: model_server.state.in_flight == 0, what="no upstream call open")


def test_cancel_mid_stream_ends_the_stream_and_closes_the_upstream_within_a_second(workers, make_model,
                                                                                  model_server, api_url, user_key):
    make_model("cancelstream", streaming=True, timeout_seconds=30)
    job = submit(api_url, user_key, "cancelstream", {"stream": True, "chunks": 8, "chunk_ms": 5,
                                                     "stream_hold": "cancel", "hold_at": 3}).json()["job_id"]
    s = OutputStream(_url(api_url, "cancelstream", job), user_key)
    try:
        got = [s.next() for _ in range(4)]
        assert [e for _i, e, _d in got] == ["attempt", "output", "output", "output"]
        t0 = time.time()
        resp = requests.post(f"{api_url}/v1/models/cancelstream/jobs/{job}/cancel", headers=auth(user_key),
                             timeout=10)
        assert resp.status_code == 200 and resp.json()["state"] == "canceled", resp.text
        rest = s.all()
    finally:
        s.close()
        model_server.state.release("cancel")
    assert rest[-1][:2] == ("end", "error") and '"state":"canceled"' in rest[-1][2].replace(" ", "")
    _hung_up_within(model_server, job, t0)  # the line: the upstream sees the close within 1 s
    assert len(_calls_of(model_server, job)) == 1
    wait_until(lambda: permits("cancelstream", "tenant-a") == [], what="the permit back")
    wait_until(lambda: model_server.state.in_flight == 0, what="no upstream call open")
