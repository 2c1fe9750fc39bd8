"""maxConcurrency: the per tenant+model Redis semaphore with expiring leases.

The script on real Redis; the worker path in-process (a job without a permit
stays pending at the same attempt; every exit path gives its permit back);
and Celery worker processes: 3 tenants x 100 jobs never exceed the limit at
the stub model, a permit-less job does not hold a worker process, and a
SIGKILLed worker's permit comes back when its lease expires."""
from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import WorkerProcess, job_row, wait_until
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.redis import semaphore
from app.infra.tables import tasks
from app.jobs import concurrency, execution
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal


def _submit(tenant: str, model: str, payload: dict | None = None) -> str:
    opts = jobs.SubmitOptions(model_key=f"X-Stub-Tenant:{tenant}")
    return jobs.submit(Principal(tenant, "user", None), model, payload or {}, opts).row.id


# --- the script ------------------------------------------------------------------------

def test_limit_runtime_override_and_cap(settings, r):
    assert semaphore.semaphore_acquire("m", "t", "a", 2, 60).acquired
    assert semaphore.semaphore_acquire("m", "t", "a", 2, 60).acquired  # same lease again: no second permit
    assert semaphore.semaphore_acquire("m", "t", "b", 2, 60).acquired
    d = semaphore.semaphore_acquire("m", "t", "c", 2, 60)
    assert not d.acquired and d.limit == 2 and d.holders == 2
    assert semaphore.semaphore_acquire("m", "other-tenant", "c", 2, 60).acquired  # per tenant
    semaphore.semaphore_release("m", "t", "b")
    r.set("asynch:runtime:max_concurrency:m", 1)  # the runtime value wins ...
    d = semaphore.semaphore_acquire("m", "t", "c", 2, 60)
    assert not d.acquired and d.limit == 1
    r.set("asynch:runtime:max_concurrency:m", 50)  # ... but never above the cap
    assert semaphore.semaphore_acquire("m", "t", "c", 2, 60).acquired
    assert semaphore.semaphore_acquire("m", "t", "d", 2, 60).limit == 2
    r.set("asynch:runtime:max_concurrency:m", 0)
    semaphore.semaphore_release("m", "t", "a")
    assert not semaphore.semaphore_acquire("m", "t", "e", 2, 60).acquired
    assert semaphore.semaphore_release("m", "t", "c") is True and semaphore.semaphore_release("m", "t", "c") is False


def test_an_expired_lease_frees_its_permit(settings, r):
    assert semaphore.semaphore_acquire("m", "t", "dead", 1, 0.3).acquired
    assert not semaphore.semaphore_acquire("m", "t", "next", 1, 60).acquired
    wait_until(lambda: semaphore.semaphore_acquire("m", "t", "next", 1, 60).acquired, timeout=5, what="lease expiry")
    assert semaphore.semaphore_holders("m", "t") == ["next"]
    assert 0 < r.ttl("asynch:sem:m:t") <= 120  # an idle key does not linger


def test_one_waiting_chain_per_attempt(settings):
    assert concurrency.keep_waiting("job_1", 0, "chain-a")
    assert not concurrency.keep_waiting("job_1", 0, "chain-b")  # a duplicate message stops
    assert concurrency.keep_waiting("job_1", 0, "chain-a")
    assert concurrency.keep_waiting("job_1", 1, "chain-b")  # another attempt is another chain
    assert concurrency.keep_waiting("job_1", 0, None)  # in-process callers always wait


# --- the worker path, in-process ---------------------------------------------------------

def test_no_permit_is_not_an_attempt(make_model, model_server, r):
    make_model("one", max_concurrency=1)
    assert semaphore.semaphore_acquire("one", "tenant-a", "someone-else", 1, 60).acquired
    job_id = _submit("tenant-a", "one")
    assert execution.run_attempt(job_id, 0) == "no_permit"
    row = job_row(job_id)
    assert row.state == JobState.PENDING and row.attempt == 0 and row.started_at is None
    assert model_server.state.calls == [] and r.zrange("asynch:gate:one", 0, -1) == [job_id]
    # Another tenant is not held back by tenant-a's permits.
    other = _submit("tenant-b", "one")
    assert execution.run_attempt(other, 0) == "done"
    semaphore.semaphore_release("one", "tenant-a", "someone-else")
    assert execution.run_attempt(job_id, 0) == "done"
    assert job_row(job_id).attempt == 1 and job_row(job_id).retry_count == 0


@pytest.mark.parametrize("payload,outcome", [({}, "done"), ({"status": 400}, "failed"),
                                             ({"status": 503}, "retry_wait")])
def test_the_permit_is_released_on_every_exit_path(make_model, r, payload, outcome):
    make_model("m", max_concurrency=1, retry_times=1)
    job_id = _submit("t", "m", payload)
    assert execution.run_attempt(job_id, 0) == outcome
    assert semaphore.semaphore_holders("m", "t") == []


def test_the_permit_is_released_when_the_attempt_crashes(make_model, r, monkeypatch):
    make_model("m", max_concurrency=1)
    job_id = _submit("t", "m")
    monkeypatch.setattr(execution, "_upload", lambda *a, **k: 1 / 0)
    assert execution.run_attempt(job_id, 0) == "failed"
    assert semaphore.semaphore_holders("m", "t") == []


def test_a_stale_message_takes_no_permit(make_model, r):
    make_model("m", max_concurrency=1)
    job_id = _submit("t", "m")
    assert execution.run_attempt(job_id, 0) == "done"
    assert semaphore.semaphore_acquire("m", "t", "busy", 1, 60).acquired
    assert execution.run_attempt(job_id, 0) == "stale"  # not "no_permit": it never asks


# --- Celery worker processes ------------------------------------------------------------------

@pytest.fixture(scope="module")
def sem_env(test_env):
    return {**test_env, "ASYNCH_PERMIT_RETRY_SECONDS": "0.2", "ASYNCH_LEASE_GRACE_SECONDS": "1"}


# Function scope: each e2e test here needs to know exactly which worker
# processes consume the queue.
@pytest.fixture
def two_nodes(sem_env, tmp_path):
    nodes = [WorkerProcess(sem_env, concurrency=3, log_path=tmp_path / f"w{i}.log", name=f"sem{i}")
             for i in range(2)]
    for n in nodes:
        n.start()
    yield nodes
    for n in nodes:
        n.stop()


@pytest.fixture
def one_node(sem_env, tmp_path):
    w = WorkerProcess(sem_env, concurrency=2, log_path=tmp_path / "w.log", name="sem-one").start()
    yield w
    w.stop()


def _states(ids) -> dict[str, int]:
    with transaction() as conn:
        return {r.id: r.state for r in conn.execute(select(tasks.c.id, tasks.c.state).where(tasks.c.id.in_(ids)))}


@pytest.mark.e2e
@pytest.mark.slow
def test_3_tenants_x_100_jobs_never_exceed_max_concurrency_per_tenant(two_nodes, make_model, model_server, r):
    make_model("fair", max_concurrency=2, queue_limit=400, timeout_seconds=10)
    tenants = ("t1", "t2", "t3")
    # Tenant by tenant: the queue hands the six processes one tenant's jobs
    # at a time, so without the semaphore a tenant would get all six.
    ids = [_submit(t, "fair", {"sleep_ms": 40, "i": i}) for t in tenants for i in range(100)]
    wait_until(lambda: set(_states(ids).values()) == {JobState.DONE}, timeout=150, interval=0.5,
               what="300 jobs done")
    st = model_server.state
    assert len(st.calls) == 300  # each job called the model once: a missing permit is not an attempt
    assert {t: st.max_in_flight_by[t] for t in tenants} == {t: 2 for t in tenants}, st.max_in_flight_by
    # Six worker processes really ran calls side by side, so the per-tenant
    # limit (not a lack of workers) is what kept each tenant at 2.
    assert st.max_in_flight > 2
    with transaction() as conn:
        attempts = conn.execute(select(func.max(tasks.c.attempt), func.max(tasks.c.retry_count))).one()
    assert tuple(attempts) == (1, 0)
    assert all(semaphore.semaphore_holders("fair", t) == [] for t in tenants)
    assert r.zcard("asynch:gate:fair") == 0


@pytest.mark.e2e
def test_a_job_without_a_permit_does_not_hold_a_worker_process(one_node, make_model, model_server):
    make_model("one", max_concurrency=1, timeout_seconds=10)
    slow = _submit("a", "one", {"sleep_ms": 4000})
    wait_until(lambda: len(model_server.state.calls) == 1, what="the slow call started")
    blocked = _submit("a", "one", {"n": 2})
    other = _submit("b", "one", {"n": 3})
    # Two worker processes: one is in the slow call; if the permit-less job
    # sat on the other, tenant b's job could not run before the slow one ends.
    wait_until(lambda: job_row(other).state == JobState.DONE, timeout=15, what="tenant b's job done")
    assert job_row(slow).state == JobState.RUNNING
    row = job_row(blocked)
    assert row.state == JobState.PENDING and row.attempt == 0
    wait_until(lambda: job_row(blocked).state == JobState.DONE, timeout=20, what="the waiting job done")
    assert job_row(blocked).attempt == 1 and job_row(blocked).retry_count == 0
    calls = model_server.state.calls
    assert [c["payload"].get("n") for c in calls] == [None, 3, 2]
    assert calls[2]["t"] >= calls[0]["t"] + 3.9  # not before the slow call freed the permit


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sigkilled_workers_permit_comes_back_when_its_lease_expires(one_node, make_model, model_server, r):
    make_model("sk", max_concurrency=1, timeout_seconds=4, retry_times=0)
    victim = _submit("a", "sk", {"sleep_ms": 8000})
    wait_until(lambda: len(model_server.state.calls) == 1 and semaphore.semaphore_holders("sk", "a"),
               what="the call in flight with its permit")
    (lease, expiry), = r.zrange("asynch:sem:sk:a", 0, -1, withscores=True)
    assert lease.startswith(f"{victim}:0:")
    for pid in one_node.pool_pids():
        os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    waiting = _submit("a", "sk", {"n": 2})
    wait_until(lambda: job_row(waiting).state == JobState.DONE, timeout=30, what="the next job done")
    started = model_server.state.calls[-1]
    assert started["payload"] == {"n": 2}
    # The dead worker's permit was held until its lease ran out (timeout 4 s +
    # grace 1 s), then it came back by itself: nobody released it.
    assert expiry - 0.5 <= started["t"] <= expiry + 5, (killed_at, expiry, started["t"])
    assert lease not in semaphore.semaphore_holders("sk", "a")
    assert job_row(victim).state == JobState.RUNNING  # its row waits for lease recovery (beat)
    assert job_row(waiting).attempt == 1
