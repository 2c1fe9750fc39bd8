"""Express slots (app/jobs/express.py, app/jobs/slots.py): a tenant with nothing running on a model starts at
once while every call slot of the worker runs another tenant's held calls -- the wait issue 33 measures for
another tenant's job during a batch -- and the express slot never widens a busy tenant's share.

On real PostgreSQL and Redis, the stub model over HTTP and a real worker process (one pool process: 8 slots
and 1 express slot, the defaults).  Counted, not timed: every bulk call is held while the other tenant's call
starts, so without the express slot it could not start at all until they are released.  With calls that stop:
a cancel stops an express call and its slot goes to the next tenant holding nothing.  At the end: every job
called once at attempt 1, done (the canceled one canceled), and no gate slot or permit left.
"""
from __future__ import annotations

import time

import pytest
from helpers import WorkerProcess, job_row, wait_until
from stress_util import called_with, model_payloads

from app.infra.redis import keys
from app.jobs import handoff
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

pytestmark = pytest.mark.e2e


def _submit(tenant: str, model: str, payload: dict) -> str:
    job = jobs.submit(Principal(tenant, "user", None), model, payload).row.id
    assert handoff.flush()
    return job


def _in_flight(model_server) -> int:
    with model_server.state.lock:
        return model_server.state.in_flight


def test_a_tenant_with_nothing_running_starts_while_every_slot_runs_another_tenants_calls(
        test_env, tmp_path, make_model, model_server, r):
    make_model("xp", max_concurrency=64, queue_limit=100, timeout_seconds=30)
    w = WorkerProcess(test_env, concurrency=1, log_path=tmp_path / "w.log", name="xp").start()
    try:
        bulk = [_submit("bulk", "xp", {"hold": "bulk", "i": i}) for i in range(12)]
        wait_until(lambda: _in_flight(model_server) >= 8, timeout=30, what="every slot running a bulk call")
        time.sleep(0.5)
        # The express slot never took a tenant that holds permits.
        assert _in_flight(model_server) == 8, [p.get("i") for p in model_payloads(model_server)]
        # A tenant with nothing running: its job starts while all eight bulk calls are held.
        first = _submit("other", "xp", {"hold": "other", "o": 1})
        wait_until(lambda: called_with(model_server, "o", 1), timeout=10, what="the other tenant's call")
        assert sum(called_with(model_server, "i", i) for i in range(12)) == 8  # no bulk call ended meanwhile
        # Its next job, and a third tenant's, wait: it holds a permit now, and the one express slot is taken.
        second = _submit("other", "xp", {"o": 2})
        third = _submit("third", "xp", {"o": 3})
        time.sleep(1.0)
        assert not called_with(model_server, "o", 2) and not called_with(model_server, "o", 3)
        assert _in_flight(model_server) == 9
        # A cancel stops the express call as any call (the upstream sees the hang-up); the freed express slot
        # takes the third tenant's job (it holds nothing; the other tenant, charged for its call, comes after).
        jobs.cancel_job(Principal("other", "user", None), first)
        wait_until(lambda: called_with(model_server, "o", 3), timeout=10, what="the third tenant's call")
        assert first in model_server.state.hangups
        assert sum(called_with(model_server, "i", i) for i in range(12)) == 8
        model_server.state.release("bulk")
        ids = bulk + [second, third]
        wait_until(lambda: all(job_row(j).state == JobState.DONE for j in ids), timeout=60, what="all done")
    finally:
        model_server.state.release("bulk")
        model_server.state.release("other")
        w.stop()
    assert all(job_row(j).attempt == 1 for j in ids) and job_row(first).state == JobState.CANCELED
    called = [p.get("i", p.get("o")) for p in model_payloads(model_server)]
    assert sorted(called) == sorted([*range(12), 1, 2, 3])  # each job called once
    assert r.zcard(keys.gate("xp")) == 0
    assert not [k for k in r.scan_iter(keys.semaphore("xp", "") + "*") if r.zcard(k)]
