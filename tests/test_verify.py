"""The ledger's self-check (app/maintenance/verify.py, `asynch verify`): clean on a healthy stack, and each
guarantee broken on purpose (a result object deleted, a slot or a permit held by nobody, a second terminal
record forged, a queue entry lost, a lease run out, an outbox row lost or abandoned, a deadline passed) is
reported with its job id; the beat pass sets asynch_ledger_violations."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import requests
from click.testing import CliRunner
from helpers import WorkerProcess, auth, job_row, samples, submit, submit_job, value, wait_until
from sqlalchemy import delete, insert, select

from app.clock import now, set_clock
from app.config import set_settings
from app.infra.db import transaction
from app.infra.storage import get_storage
from app.infra.tables import deliveries, task_attempts
from app.jobs import execution, handoff
from app.maintenance import verify
from app.states import JobState


def found(rep) -> set[tuple[str, str]]:
    return {(v.check, v.job_id) for v in rep.violations}


def check(**kw):
    return verify.verify(grace_seconds=0, **kw)


@pytest.fixture
def done_job(make_model):
    make_model("m")
    job_id = submit_job("m", {"a": 1})
    assert execution.run_attempt(job_id) == "done"
    return job_id


def pending_job(model: str = "m") -> str:
    job_id = submit_job(model, {"a": 2})
    assert handoff.flush()
    return job_id


def test_clean_in_process_then_a_deleted_result_object_is_reported(done_job):
    waiting = pending_job()
    assert check().violations == []
    get_storage().delete(job_row(done_job).result_location)
    rep = check()
    assert found(rep) == {("result_missing", done_job)}
    assert waiting not in {v.job_id for v in rep.violations}


def test_a_slot_or_a_permit_nobody_holds_and_a_row_without_its_slot(make_model, r):
    make_model("m")
    job_id = pending_job()
    r.zadd("asynch:gate:{m}", {"ghost-slot": time.time() - 5})
    r.zadd("asynch:tgate:{m}:tenant-a", {"ghost-slot": time.time() - 5})
    r.zadd("asynch:sem:{m}:tenant-b", {"ghost-permit": time.time() + 600})
    r.zadd("asynch:sem:{m}:tenant-b", {"ghost-permit#3": time.time() + 600})  # a call still ending: allowed
    rep = check()
    assert found(rep) == {("gate_mismatch", "ghost-slot"), ("gate_mismatch", "ghost-permit")}
    r.zrem("asynch:gate:{m}", job_id)
    assert ("gate_mismatch", job_id) in found(check())


def test_a_forged_second_terminal_record(done_job):
    at = now()
    with transaction() as conn:
        conn.execute(insert(task_attempts).values(job_id=done_job, attempt=2, ended_at=at, outcome=int(JobState.FAILED)))
    assert found(check()) == {("terminal_twice", done_job)}


def test_a_terminal_record_of_a_job_still_pending(make_model):
    make_model("m")
    job_id = pending_job()
    with transaction() as conn:
        conn.execute(insert(task_attempts).values(job_id=job_id, attempt=1, ended_at=now(), outcome=int(JobState.DONE)))
    assert found(check()) == {("terminal_twice", job_id)}


def test_a_lost_queue_place_an_ended_lease_and_a_passed_deadline(make_model, r, settings):
    make_model("m", timeout_seconds=5)
    lost, held = pending_job(), pending_job()
    assert r.hdel("asynch:dq:attempt:{m}", lost) == 1  # the dispatcher forgot it (its entry lost)
    for key in r.scan_iter("asynch:dq:ready:{m}:*"):
        r.zrem(key, lost)
    assert found(check()) == {("orphaned", lost)}
    running = pending_job()
    attempts, _ = execution.claim_given([(running, execution.CURRENT)], None)
    assert [a.row.id for a in attempts] == [running]
    assert job_row(running).state == JobState.RUNNING
    assert ("orphaned", running) not in found(check())
    later = now() + timedelta(seconds=5 + settings.lease_grace_seconds + 1)
    set_clock(lambda: later)
    assert ("orphaned", running) in found(check())
    past = now() + timedelta(seconds=settings.job_queue_budget_seconds + 10)
    set_clock(lambda: past)
    assert {("past_deadline", held), ("past_deadline", running)} <= found(check())


def test_a_lost_outbox_row_and_an_abandoned_one(make_model, settings):
    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1"))
    make_model("m")
    lost = submit_job("m", {"a": 1}, callback_url="http://127.0.0.1:9/hook")
    stuck = submit_job("m", {"a": 2}, webhook_url="http://127.0.0.1:9/hook")
    assert execution.run_group([(lost, execution.CURRENT), (stuck, execution.CURRENT)]) == ["done", "done"]
    assert check().violations == []  # both rows pending, just due: the sweep will take them
    with transaction() as conn:
        conn.execute(delete(deliveries).where(deliveries.c.job_id == lost))
    assert found(check()) == {("delivery_stuck", lost)}
    later = now() + timedelta(hours=1)  # nobody sent the other one for an hour
    set_clock(lambda: later)
    assert found(check()) == {("delivery_stuck", lost), ("delivery_stuck", stuck)}


def test_cli_exit_status_lists_the_job_ids(done_job, test_env):
    from app.cli import main

    runner = CliRunner()
    out = runner.invoke(main, ["verify", "--grace", "0"], prog_name="asynch")
    assert out.exit_code == 0, out.output
    get_storage().delete(job_row(done_job).result_location)
    out = runner.invoke(main, ["verify", "--grace", "0", "--json"], prog_name="asynch")
    assert out.exit_code == 1
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [(x["check"], x["job_id"]) for x in lines] == [("result_missing", done_job)]


def test_the_beat_pass_sets_the_gauge(done_job, client, settings):
    from app.infra.redis import ledger

    assert ledger.last_counts() == ({}, None)
    set_settings(settings.with_overrides(verify_grace_seconds=0))
    get_storage().delete(job_row(done_job).result_location)
    out = verify.run_sampled()
    assert out["processed"] == 1 and out["jobs"] == [done_job]
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    assert value(sm, "asynch_ledger_violations", check="result_missing") == 1
    assert value(sm, "asynch_ledger_violations", check="orphaned") == 0
    assert ("asynch_ledger_violations", frozenset({("check", "gate_mismatch")})) in sm


def test_the_beat_schedule_has_the_pass(settings):
    from beat_schedule import build_schedule

    assert build_schedule(settings)["verify"]["task"] == "asynch.verify"
    assert "verify" not in build_schedule(settings.with_overrides(beat_verify_seconds=0))


@pytest.mark.e2e
def test_clean_on_a_healthy_stack_with_workers(make_model, api_url, user_key, test_env, tmp_path, r):
    """Real Celery workers run jobs to their ends (done, failed, canceled, still pending behind a slow one):
    the whole check, with no grace, finds nothing once the stack is at rest."""
    make_model("m", max_concurrency=1)
    w = WorkerProcess(test_env, concurrency=2, log_path=tmp_path / "w.log").start()
    try:
        ids = [submit(api_url, user_key, "m", {"n": i}).json()["job_id"] for i in range(6)]
        bad = submit(api_url, user_key, "m", {"status": 400}).json()["job_id"]
        slow = submit(api_url, user_key, "m", {"sleep_ms": 30000}).json()["job_id"]
        behind = submit(api_url, user_key, "m", {"n": 99}).json()["job_id"]
        wait_until(lambda: all(job_row(j).state == JobState.DONE for j in ids), 60, what="jobs done")
        wait_until(lambda: job_row(bad).state == JobState.FAILED, 30, what="the failed job")
        wait_until(lambda: job_row(slow).state == JobState.RUNNING, 30, what="the slow job running")
        assert job_row(behind).state == JobState.PENDING  # max_concurrency 1: behind the slow one
        gone = submit(api_url, user_key, "m", {"n": 100}).json()["job_id"]
        assert requests.post(f"{api_url}/v1/models/m/jobs/{gone}/cancel", headers=auth(user_key),
                             timeout=10).json()["state"] == "canceled"
        wait_until(lambda: r.zcard("asynch:gate:{m}") == 2, 30, what="only the slow and the waiting job hold slots")
        assert check().violations == []
    finally:
        w.stop()
