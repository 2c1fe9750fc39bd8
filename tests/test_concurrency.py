"""Concurrency claims, each a test that fails if the invariant breaks:
the gate never over-admits (threads over HTTP, and processes), and a job's
terminal state is won exactly once with its slot released once."""
from __future__ import annotations

import multiprocessing as mp
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from helpers import auth, gate_depth, job_row
from sqlalchemy import func, select

from app import transitions
from app.clock import now
from app.errors import Conflict
from app.infra.db import transaction
from app.infra.redis import dispatch as rd
from app.infra.tables import tasks
from app.jobs import effects
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal


def test_64_threads_at_a_gate_of_8_get_exactly_8(api_url, make_model, user_key, r):
    make_model("narrow", queue_limit=8)
    barrier = threading.Barrier(64)

    def one(i):
        barrier.wait()
        return requests.post(f"{api_url}/v1/models/narrow/jobs", json={"i": i}, headers=auth(user_key), timeout=60)

    with ThreadPoolExecutor(64) as ex:
        results = list(ex.map(one, range(64)))
    codes = [x.status_code for x in results]
    assert codes.count(202) == 8, codes
    assert codes.count(429) == 56, codes
    admitted = {x.json()["job_id"] for x in results if x.status_code == 202}
    assert set(r.zrange("asynch:gate:{narrow}", 0, -1)) == admitted
    with transaction() as conn:
        ids = {row.id for row in conn.execute(select(tasks.c.id).where(tasks.c.model_name == "narrow"))}
    assert ids == admitted  # no 202 without a row, no row without a 202


def _admit_many(args):
    redis_url, prefix, n, tag = args
    from app.config import Settings, set_settings
    from app.infra.redis.client import reset_redis
    from app.infra.redis.gate import gate_admit

    set_settings(Settings(redis_url=redis_url, redis_prefix=prefix))
    reset_redis()
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        return f"{tag}-{i}" if gate_admit("multi", tag, f"{tag}-{i}", 10).admitted else None

    with ThreadPoolExecutor(n) as ex:
        return [x for x in ex.map(one, range(n)) if x]


def test_gate_holds_across_processes(settings, r):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        won = pool.map(_admit_many, [(settings.redis_url, settings.redis_prefix, 16, f"p{i}") for i in range(4)])
    admitted = [x for part in won for x in part]
    # Under the fair share only a newcomer's first job passes the limit, into the reserve (ceil(10 x 0.05)).
    assert 10 <= len(admitted) <= 11 and gate_depth("multi") == len(admitted)
    assert set(r.zrange("asynch:gate:{multi}", 0, -1)) == set(admitted)


def _running_job(make_model, r) -> str:
    make_model("race", queue_limit=4, retry_times=3)
    p = Principal("tenant-a", "user", None)
    job_id = jobs.submit(p, "race", {"x": 1}).row.id
    with transaction() as conn:
        assert transitions.claim(conn, job_id, 0, now() + timedelta(minutes=5)) is not None
    assert r.zcard("asynch:gate:{race}") == 1
    return job_id


def test_16_threads_racing_to_end_a_job_win_once(make_model, r, monkeypatch):
    job_id = _running_job(make_model, r)
    released = []  # every slot release any racer performs, and whether it removed the slot
    real = rd.finish

    def counting(model, jobs, **kw):
        ok, pairs = real(model, jobs, **kw)
        released.extend(ok)
        return ok, pairs

    monkeypatch.setattr(rd, "finish", counting)
    p = Principal("tenant-a", "user", None)
    barrier = threading.Barrier(16)

    def racer(i):
        barrier.wait()
        kind = ("finish", "fail", "cancel")[i % 3]
        if kind == "cancel":
            try:
                jobs.cancel_job(p, job_id)
                return kind
            except Conflict:
                return None
        with transaction() as conn:
            if kind == "finish":
                won = transitions.complete(conn, job_id, 1, location=f"loc-{i}", content_type="x/y", size=i)
            else:
                won = transitions.fail_attempt(conn, job_id, 1, f"err-{i}", retry_at=None)
        if won is not None:
            effects.run(won)
            return kind
        return None

    with ThreadPoolExecutor(16) as ex:
        winners = [w for w in ex.map(racer, range(16)) if w]
    # retry_wait is not terminal: running -> retry_wait -> canceled is two
    # legal wins in a row (a cancel blocked on the row lock re-checks the
    # committed retry_wait row and may take it).  Anything else: one winner.
    assert len(winners) == 1, winners
    row = job_row(job_id)
    assert row.state in (JobState.DONE, JobState.FAILED, JobState.CANCELED)
    assert row.finished_at is not None
    assert r.zcard("asynch:gate:{race}") == 0
    assert released.count(True) == 1  # the slot went back exactly once
    if row.state == JobState.DONE:
        assert row.result_location.startswith("loc-") and row.error is None


def test_retry_wait_can_still_be_canceled_but_only_once(make_model, r):
    """running -> retry_wait is not terminal: a cancel may follow it, once."""
    job_id = _running_job(make_model, r)
    p = Principal("tenant-a", "user", None)
    with transaction() as conn:
        assert transitions.fail_attempt(conn, job_id, 1, "e", retry_at=now()) is not None
    barrier = threading.Barrier(8)

    def cancel(_):
        barrier.wait()
        try:
            return jobs.cancel_job(p, job_id).state
        except Conflict:
            return None

    with ThreadPoolExecutor(8) as ex:
        won = [x for x in ex.map(cancel, range(8)) if x is not None]
    assert won == [JobState.CANCELED]
    assert job_row(job_id).state == JobState.CANCELED


def test_transitions_refuse_wrong_state_and_stale_attempt(make_model, r):
    job_id = _running_job(make_model, r)
    with transaction() as conn:
        # A second claim of the same attempt (duplicate delivery) gets nothing.
        assert transitions.claim(conn, job_id, 0, now()) is None
        # A stale attempt number cannot finish the job.
        assert transitions.complete(conn, job_id, 0, location="l", content_type="t", size=1) is None
        assert transitions.complete(conn, job_id, 2, location="l", content_type="t", size=1) is None
        assert transitions.complete(conn, job_id, 1, location="l", content_type="t", size=1) is not None
        # Terminal states absorb everything.
        assert transitions.fail_attempt(conn, job_id, 1, "late", retry_at=None) is None
        assert transitions.cancel(conn, job_id, None) is None
        assert [x.id for x in transitions.claim_results(conn, [job_id], None)] == [job_id]
        assert transitions.claim_results(conn, [job_id], None) == []
    row = job_row(job_id)
    assert row.state == JobState.CLAIMED and row.result_location == "l"


def test_illegal_transitions_raise_before_touching_the_database():
    from app.errors import IllegalTransition
    from app.states import JobState as S

    legal = transitions.ALLOWED
    for a in S:
        for b in S:
            if (a, b) in legal:
                transitions.check_allowed([a], b)
            else:
                with pytest.raises(IllegalTransition):
                    transitions.check_allowed([a], b)
    assert len(legal) == 16  # + retry_wait -> timeout, pending/retry_wait -> failed (issue 13), running -> pending
    # (busy, issue 24 item 2), pending -> expired (deadlines, issue 24 item 1)


def test_every_state_change_is_in_the_transitions_module():
    """No code outside app/transitions.py writes tasks.state."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    offenders = []
    for path in list((root / "app").rglob("*.py")) + list((root / "workers").rglob("*.py")):
        if path.name == "transitions.py":
            continue
        text = path.read_text()
        if re.search(r"update\(tasks\)", text) or re.search(r"UPDATE\s+asynch_task", text, re.I):
            offenders.append(str(path))
    assert offenders == []


def test_row_count_equals_admissions_after_concurrent_idempotent_submits(make_model, r):
    """32 threads submit with one Idempotency-Key: one row, one slot."""
    make_model("idem", queue_limit=50)
    p = Principal("tenant-a", "user", None)
    barrier = threading.Barrier(32)

    def one(_):
        barrier.wait()
        return jobs.submit(p, "idem", {"q": 1}, jobs.SubmitOptions(idempotency_key="same")).row.id

    with ThreadPoolExecutor(32) as ex:
        ids = set(ex.map(one, range(32)))
    assert len(ids) == 1
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 1
    assert r.zrange("asynch:gate:{idem}", 0, -1) == list(ids)
