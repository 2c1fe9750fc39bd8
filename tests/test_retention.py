"""Retention at admission (issue 23 item 6; app/jobs/retention.py): seed 000
evicts at the next submit, not at a periodic pass -- expired terminal jobs
first, then the least recently read completed jobs beyond a model's
max_completed -- and concurrent submits evict the excess once.

Real pieces: PostgreSQL, Redis, the API's routes in process, the stub model
service (each job run here, by execution.run_attempt); no worker process,
so nothing completes behind the test's back."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from helpers import auth, job_row, wait_until
from sqlalchemy import update

from app.clock import now
from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import batch, execution
from app.jobs import service as jobs
from app.maintenance import passes
from app.states import JobState
from app.tenancy.keys import Principal

USER = Principal("tenant-a", "user", None)


def completed_jobs(make_model, name: str, n: int, cap: int) -> list[str]:
    """``n`` done jobs of a model capped at ``cap``, finished a minute apart,
    never read: submitted first (fewer than the cap were completed at each
    submit, so nothing was evicted yet), then run."""
    make_model(name, max_completed=cap, queue_limit=n + 20)
    ids = [jobs.submit(USER, name, {"i": i}).row.id for i in range(n)]
    for jid in ids:  # run here, or by the worker of a module that started one (tests/test_seed000_contract.py)
        execution.run_attempt(jid, 0)
        wait_until(lambda j=jid: job_row(j).state == JobState.DONE, timeout=30, what="done")
    base = now() - timedelta(hours=1)
    with transaction() as conn:
        for i, jid in enumerate(ids):
            conn.execute(update(tasks).where(tasks.c.id == jid).values(finished_at=base + timedelta(minutes=i)))
    return ids


def test_the_next_submit_keeps_exactly_the_most_recently_read_beyond_max_completed(client, make_model, model_server,
                                                                                     user_key):
    """Issue 23 item 6: a cap of 2 and 5 completed jobs; the next submit
    (no periodic pass) leaves exactly the 2 most recently read readable."""
    ids = completed_jobs(make_model, "capped", 5, 2)
    for jid in (ids[3], ids[1]):  # read in this order: ids[1] is the most recently read, then ids[3]
        assert client.get(f"/v1/models/capped/jobs/{jid}/result", headers=auth(user_key)).status_code == 200
    with transaction() as conn:  # the reads a minute apart (the clock's resolution is not the point)
        conn.execute(update(tasks).where(tasks.c.id == ids[3]).values(last_read_at=now() - timedelta(minutes=1)))

    def readable() -> set[str]:
        return {j for j in ids
                if client.get(f"/v1/models/capped/jobs/{j}/result", headers=auth(user_key)).status_code == 200}

    assert len({j for j in ids if job_row(j) is not None}) == 5  # nothing evicted before the submit
    resp = client.post("/v1/models/capped/jobs", json={"payload": {"next": 1}}, headers=auth(user_key))
    assert resp.status_code == 202, resp.text
    assert {j for j in ids if job_row(j) is not None} == {ids[1], ids[3]}
    assert readable() == {ids[1], ids[3]}
    assert passes.cleanup().details["evicted"] == 0  # the periodic pass finds nothing left to do


def test_concurrent_submits_evict_the_excess_once(make_model, model_server):
    """8 batch submits at once to a model capped at 2 with 30 completed jobs:
    each runs the eviction, and exactly the 2 most recently finished remain
    (two counters both evicting "the 28 over" would leave none)."""
    ids = completed_jobs(make_model, "capped3", 30, 2)
    start = threading.Barrier(8)

    def one(i):
        start.wait()
        return batch.submit_batch(USER, "capped3", [{"payload": {"b": i}}])[0].error

    with ThreadPoolExecutor(8) as ex:
        assert list(ex.map(one, range(8))) == [None] * 8
    assert {j for j in ids if job_row(j) is not None} == set(ids[-2:])


def test_expired_jobs_go_first_at_the_next_submit(make_model, model_server):
    """By TTL first: an expired claimed job is deleted by the submit and does
    not count against the cap, so both unexpired ones stay."""
    ids = completed_jobs(make_model, "capped4", 3, 2)
    with transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.id == ids[2]).values(
            state=int(JobState.CLAIMED), claimed_at=now(), expire_at=now() - timedelta(seconds=1)))
    jobs.submit(USER, "capped4", {"next": 1})
    assert {j for j in ids if job_row(j) is not None} == {ids[0], ids[1]}
