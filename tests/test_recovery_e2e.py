"""Recovery with real Celery worker processes, the stub model over HTTP,
PostgreSQL and Redis: a Redis wipe in the middle of a 500-job run and a
worker SIGKILLed during a model call.

The stub model's ``hold`` keeps a call in flight until the test releases
it, so "while the worker is busy" is a state the test controls, not a
timing it hopes for.  Time-dependent steps (lease expiry, backoff, the
promotion threshold) move this process's clock; nothing sleeps them out."""
from __future__ import annotations

import json

import os
import signal
import time
from datetime import timedelta

import pytest
import redis as redis_lib
from helpers import WorkerProcess, gate_depth, gate_members, job_row, submit_job as _submit, wait_until
from sqlalchemy import func, select
from stress_util import called_with, model_payloads

from app.clock import set_clock
from app.infra.db import transaction
from app.infra.redis import keys
from app.infra.storage import get_storage
from app.infra.tables import tasks
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.states import SLOT_STATES, JobState

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def purge_queue(b, queue: str) -> None:
    from app.jobs import handoff

    handoff.flush()  # a submission's message leaves after its 202: lose it for real
    b.delete(queue, *[f"{queue}:{i}" for i in range(1, 10)])


@pytest.fixture
def broker(settings):
    """The broker's Redis database, with this session's queue emptied."""
    b = redis_lib.Redis.from_url(settings.effective_broker_url, decode_responses=True)
    purge_queue(b, settings.queue_name)
    return b


def _states(ids) -> dict[str, int]:
    with transaction() as conn:
        return {r.id: r.state for r in conn.execute(select(tasks.c.id, tasks.c.state).where(tasks.c.id.in_(list(ids))))}


def _all_done(ids) -> bool:
    states = _states(ids)
    return len(states) == len(ids) and all(s == JobState.DONE for s in states.values())


# --- a worker SIGKILLed during a model call ---------------------------------------------------

def test_sigkilled_worker_job_is_retried_on_another_worker_and_ends_once(
        test_env, tmp_path, make_model, model_server, broker, r):
    make_model("victim", retry_times=2, timeout_seconds=30)
    a = WorkerProcess(test_env, concurrency=1, log_path=tmp_path / "a.log", name="a").start()
    b = None
    events = r.pubsub(ignore_subscribe_messages=True)
    events.subscribe(keys.terminal_channel())
    try:
        job_id = _submit("victim", {"hold": "kill-me"})
        wait_until(lambda: called_with(model_server, "hold", "kill-me"), what="the call in flight on worker a")
        assert job_row(job_id).state == JobState.RUNNING
        b = WorkerProcess(test_env, concurrency=1, log_path=tmp_path / "b.log", name="b").start()
        os.killpg(a.proc.pid, signal.SIGKILL)  # the whole worker: main process and its pool
        a.proc.wait(10)
        model_server.state.release("kill-me")  # the dead worker's call may now end; nobody hears it

        row = job_row(job_id)
        assert row.state == JobState.RUNNING and row.attempt == 1  # nothing noticed yet
        t = row.lease_expires_at + timedelta(seconds=1)
        set_clock(lambda: t)
        assert maintenance.recover_expired_leases().details == {"retry_wait": 1, "failed": 0}
        t2 = job_row(job_id).next_retry_at + timedelta(seconds=1)
        set_clock(lambda: t2)
        assert maintenance.retry_due().processed == 1
        set_clock(None)
        wait_until(lambda: job_row(job_id).state == JobState.DONE, timeout=60, what="done on worker b")

        row = job_row(job_id)
        assert row.attempt == 2 and row.retry_count == 1 and row.error is None
        assert row.result_location.endswith(f"{job_id}/2")
        assert "asynch.run_job" in (tmp_path / "b.log").read_text()
        assert [p.get("hold") for p in model_payloads(model_server)] == ["kill-me", "kill-me"]
        # Exactly one terminal record: one wake-up, one stored result, slot given back.
        wakeups, drain_until = [], time.time() + 1.0  # a second wake-up would be buffered by now
        while time.time() < drain_until:
            msg = events.get_message(timeout=0.2)
            if msg is not None:
                wakeups.append(msg["data"])
        # (Pub/sub channels are server-wide, not per database: other test runs share the name.)
        # A wake-up carries the terminal row's snapshot (JSON with its id), or a bare id.
        ids = [json.loads(w)["id"] if w.startswith("{") else w for w in wakeups]
        assert [w for w in ids if w == job_id] == [job_id]
        assert len([p for p in get_storage().root.rglob("*") if p.is_file() and job_id in str(p)]) == 1
        assert r.zcard("asynch:gate:{victim}") == 0
    finally:
        events.close()
        a.stop()
        if b is not None:
            b.stop()


# --- Redis and broker wiped in the middle of a 500-job run -----------------------------------

def test_wipe_in_the_middle_of_a_500_job_run_loses_no_job(test_env, tmp_path, make_model, model_server,
                                                          broker, r, settings):
    make_model("bulk", queue_limit=1000, retry_times=2, timeout_seconds=30, max_concurrency=4)
    w = WorkerProcess(test_env, concurrency=2, log_path=tmp_path / "w.log", name="bulk").start()
    try:
        maintenance.repair_after_wipe()  # the deployment's epoch marks exist before the wipe
        first = [_submit("bulk", {"i": i}) for i in range(100)]
        wait_until(lambda: _all_done(first), timeout=90, what="the first 100 jobs")
        assert maintenance.recover().details["wipe"]["wiped"] == []  # no false alarm

        # The tenant's four permits each hold a call; 396 more queue up behind them.
        slots = 4
        held = [_submit("bulk", {"i": 100 + i, "hold": "mid-run"}) for i in range(slots)]
        wait_until(lambda: sum(1 for p in model_payloads(model_server) if p.get("hold")) == slots,
                   what=f"{slots} held")
        rest = [_submit("bulk", {"i": 100 + slots + i}) for i in range(400 - slots)]
        every = first + held + rest

        r.flushdb()
        broker.flushdb()  # gate slots and every queued (and unacked) message: gone
        assert r.zcard("asynch:gate:{bulk}") == 0
        model_server.state.release("mid-run")
        wait_until(lambda: _all_done(held), what="the in-flight jobs finish on their own")
        assert all(s == JobState.PENDING for s in _states(rest).values())  # stuck: their queue entries are gone

        rep = maintenance.recover()
        assert set(rep.details["wipe"]["wiped"]) == {"redis", "broker"}
        assert rep.details["wipe"]["requeued"] == len(rest)
        passes = []

        def finished() -> bool:
            passes.append(maintenance.recover())
            return _all_done(every)

        wait_until(finished, timeout=120, interval=0.5, what="every admitted job done")

        with transaction() as conn:
            active = {x.id for x in conn.execute(select(tasks.c.id).where(
                tasks.c.model_name == "bulk", tasks.c.state.in_([int(s) for s in SLOT_STATES])))}
            attempts = conn.execute(select(func.max(tasks.c.attempt), func.count()).where(
                tasks.c.model_name == "bulk")).one()
        assert active == set() and gate_members("bulk") == active
        assert gate_depth("bulk") == 0
        assert tuple(attempts) == (1, 500)  # each job ran one attempt
        calls = [p["i"] for p in model_payloads(model_server)]
        assert sorted(calls) == list(range(500))  # each exactly once: duplicates were no-ops
    finally:
        model_server.state.release("mid-run")
        w.stop()
