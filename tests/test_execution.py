"""One attempt on the worker side (app.services.execution), run in-process
against the real database, Redis, stub model over HTTP and local storage.
No Celery worker consumes the queue in this module, so each test drives
attempts itself."""
from __future__ import annotations

import threading
from datetime import timedelta

from helpers import job_row, P, submit_job as _submit
from sqlalchemy import select

from app import transitions
from app.clock import now, set_clock
from app.infra.db import transaction
from app.infra.storage import LocalStorage, StorageError, get_storage
from app.infra.tables import model_stats
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.states import JobState


def stat_total() -> int:
    with transaction() as conn:
        return sum(r.request_count for r in conn.execute(select(model_stats)))


def test_duplicate_delivery_does_not_call_the_model_again(make_model, model_server, r):
    make_model("m")
    job_id = _submit("m", {"a": 1}, creator="alice")
    assert execution.run_attempt(job_id, 0) == "done"
    assert execution.run_attempt(job_id, 0) == "stale"
    assert len(model_server.state.calls) == 1
    row = job_row(job_id)
    assert row.state == JobState.DONE and row.attempt == 1
    assert r.zcard("asynch:gate:{m}") == 0
    assert stat_total() == 1


def test_concurrent_duplicates_run_once(make_model, model_server):
    make_model("m")
    job_id = _submit("m", {"sleep_ms": 200})
    out = []
    ts = [threading.Thread(target=lambda: out.append(execution.run_attempt(job_id, 0))) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(out) == ["done", "stale", "stale", "stale"]
    assert len(model_server.state.calls) == 1


def test_transient_failure_retries_then_succeeds(make_model, model_server, r):
    make_model("flaky", retry_times=2, retry_queue_max_seconds=5)
    job_id = _submit("flaky", {"tag": "t1", "fail_first": 2})
    assert execution.run_attempt(job_id, 0) == "retry_wait"
    row = job_row(job_id)
    assert row.state == JobState.RETRY_WAIT and "HTTP 500" in row.error
    assert r.zcard("asynch:gate:{flaky}") == 0  # retry_wait holds no slot
    # Not due yet: stays put.
    assert maintenance.retry_due().processed == 0
    t1 = row.next_retry_at + timedelta(seconds=1)
    set_clock(lambda: t1)
    assert maintenance.retry_due().processed == 1
    row = job_row(job_id)
    assert row.state == JobState.PENDING and row.retry_count == 1
    assert r.zrange("asynch:gate:{flaky}", 0, -1) == [job_id]
    assert execution.run_attempt(job_id, 1) == "retry_wait"
    t2 = job_row(job_id).next_retry_at + timedelta(seconds=1)
    set_clock(lambda: t2)
    maintenance.retry_due()
    assert execution.run_attempt(job_id, 2) == "done"
    row = job_row(job_id)
    assert row.state == JobState.DONE and row.attempt == 3 and row.retry_count == 2 and row.error is None
    assert len(model_server.state.calls) == 3 and stat_total() == 3


def test_retries_exhausted_fail_the_job(make_model, r):
    make_model("bad", retry_times=0)
    job_id = _submit("bad", {"status": 500})
    assert execution.run_attempt(job_id, 0) == "failed"
    row = job_row(job_id)
    assert row.state == JobState.FAILED and row.finished_at is not None
    assert row.error == "model_http_error: model returned HTTP 500"
    assert r.zcard("asynch:gate:{bad}") == 0


def test_client_error_is_permanent(make_model):
    make_model("strict", retry_times=5)
    job_id = _submit("strict", {"status": 400})
    assert execution.run_attempt(job_id, 0) == "failed"
    assert job_row(job_id).attempt == 1


def test_refused_connection_is_not_counted(make_model, r):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    make_model("down", base_url=f"http://127.0.0.1:{port}", retry_times=0)
    job_id = _submit("down", {})
    assert execution.run_attempt(job_id, 0) == "failed"
    assert "unreachable" in job_row(job_id).error
    assert stat_total() == 0


def test_model_timeout_fails_the_attempt(make_model):
    make_model("hang", timeout_seconds=1, retry_times=0)
    job_id = _submit("hang", {"sleep_ms": 3000})
    assert execution.run_attempt(job_id, 0) == "failed"
    assert "timed out" in job_row(job_id).error
    assert stat_total() == 1  # the request reached the model


def test_oversized_response_is_refused(make_model, settings):
    from app.config import set_settings

    set_settings(settings.with_overrides(max_result_bytes=1000))
    make_model("huge", retry_times=3)
    job_id = _submit("huge", {"size": 5000})
    assert execution.run_attempt(job_id, 0) == "failed"
    assert "exceeds 1000 bytes" in job_row(job_id).error


def test_upload_retry_does_not_call_the_model_again(make_model, model_server, monkeypatch):
    make_model("m")
    storage = get_storage()
    assert isinstance(storage, LocalStorage)
    real_put, fails = storage.put, {"n": 0}

    def flaky_put(key, data, ctype, context=None):
        if fails["n"] < 2:
            fails["n"] += 1
            raise StorageError("injected upload failure")
        return real_put(key, data, ctype, context)

    monkeypatch.setattr(storage, "put", flaky_put)
    job_id = _submit("m", {"x": "y"})
    assert execution.run_attempt(job_id, 0) == "done"
    assert len(model_server.state.calls) == 1 and stat_total() == 1
    data, ctype, _ = jobs.result_bytes(P, job_id)
    assert b'"x": "y"' in data and ctype == "application/json"


def test_stale_worker_cannot_write_after_its_lease_was_recovered(make_model, r):
    make_model("lease", retry_times=1, timeout_seconds=1)
    job_id = _submit("lease", {})
    with transaction() as conn:
        transitions.claim(conn, job_id, 0, now() + timedelta(seconds=2))
    # The worker "dies"; time passes beyond the lease; recovery fails the attempt.
    t = job_row(job_id).lease_expires_at + timedelta(seconds=1)
    set_clock(lambda: t)
    rep = maintenance.recover_expired_leases()
    assert rep.details == {"retry_wait": 1, "failed": 0}
    row = job_row(job_id)
    assert row.state == JobState.RETRY_WAIT and row.error == "worker_lost: worker lost (lease expired)"
    # The old worker wakes up and tries to finish: refused.
    with transaction() as conn:
        assert transitions.complete(conn, job_id, 1, location="late", content_type="t", size=0) is None
    assert r.zcard("asynch:gate:{lease}") == 0


def test_cancel_while_running_discards_the_late_result(make_model, model_server, r):
    make_model("m")
    job_id = _submit("m", {"sleep_ms": 600})
    out = []
    t = threading.Thread(target=lambda: out.append(execution.run_attempt(job_id, 0)))
    t.start()
    from helpers import wait_until

    wait_until(lambda: job_row(job_id).state == JobState.RUNNING, what="running")
    jobs.cancel_job(P, job_id)
    t.join()
    assert out == ["stopped"]  # its call was stopped (app/jobs/calls.py): the model saw it hang up
    wait_until(lambda: job_id in model_server.state.hangups, what="the hang-up")
    row = job_row(job_id)
    assert row.state == JobState.CANCELED and row.result_location is None
    root = get_storage().root
    assert not any(p.is_file() for p in root.rglob(f"*{job_id}*"))
    assert r.zcard("asynch:gate:{m}") == 0


def test_deleted_model_fails_its_pending_jobs(make_model, r):
    make_model("gone")
    job_id = _submit("gone", {})
    from sqlalchemy import delete

    from app.infra.tables import models

    with transaction() as conn:
        conn.execute(delete(models).where(models.c.model_name == "gone"))
    assert execution.run_attempt(job_id, 0) == "failed"
    assert job_row(job_id).error == "model_not_configured: model is no longer configured"
    assert r.zcard("asynch:gate:{gone}") == 0
