"""Fair dispatch, pulled by free slots (app/infra/redis/dispatch.py, app/jobs/dispatch.py).

The Lua steps on real Redis: a job is pulled only with its tenant's permit (max_concurrency, runtime override,
never above the cap), tenants take turns by weight, a tenant at its limit steps aside, a newcomer goes to the next
free slot ahead of another tenant's backlog, a guaranteed minimum goes first, the freed slots of a finish take the
ring's next picks, a pulled job its puller cannot claim goes back to its queue's head, and the model's doorbell
rings once while work waits for a slot (again when its message was lost).  The worker path in-process: every way
out of an attempt gives the permit back.  Celery worker processes: 3 tenants x 100 jobs never exceed their limit,
a job at its tenant's limit holds no call slot, and a SIGKILLed worker's permit comes back when its lease ends.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
from helpers import WorkerProcess, job_row, permits, wait_until
from sqlalchemy import func, select

from app.config import set_settings
from app.infra.db import transaction
from app.infra.redis import dispatch as rd
from app.infra.tables import tasks
from app.jobs import execution, handoff
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

LEASE = 60.0


def _submit(tenant: str, model: str, payload: dict | None = None) -> str:
    opts = jobs.SubmitOptions(model_key=f"X-Stub-Tenant:{tenant}")
    return jobs.submit(Principal(tenant, "user", None), model, payload or {}, opts).row.id


def _pairs(step) -> list[tuple[str, str]]:
    return [(t, j) for t, j, _attempt in step.pulled]


def enq(model, entries, **kw):
    """rd.enqueue of (tenant, job, score) entries at attempt 0: the step (nothing pulled; its doorbell)."""
    return rd.enqueue(model, [(t, j, score, 0, "") for t, j, score in entries], **kw)


def pull(model, n, **kw):
    return _pairs(rd.pull(model, n, LEASE, **kw))


def finish(model, tenant, job, *, most=0, cap=None, keep=None):
    """A job's end (its permit back) and ``most`` freed slots refilled: the (tenant, job) pulled."""
    return _pairs(rd.finish(model, [(tenant, job, None, None, keep)], cap=cap, most=most, lease=LEASE)[1])


def _queue(model: str, tenant: str, n: int, start: float = 0.0, cap: int = 100):
    return enq(model, [(tenant, f"{tenant}-{i}", start + i) for i in range(n)], cap=cap)


# --- the Lua steps --------------------------------------------------------------------

def test_a_job_is_pulled_only_with_its_tenants_permit(r):
    enq("m", [("a", f"a{i}", i) for i in range(5)], cap=2)
    assert pull("m", 8, cap=2) == [("a", "a0"), ("a", "a1")]  # queue order, two permits
    assert sorted(permits("m", "a")) == ["a0", "a1"] and rd.ready_counts("m") == {"a": 3}
    enq("m", [("b", "b0", 0)], cap=2)
    assert pull("m", 8, cap=2) == [("b", "b0")]  # per tenant
    assert finish("m", "a", "a0", most=1, cap=2) == [("a", "a2")]  # a permit back: the freed slot takes the next
    r.set("asynch:runtime:max_concurrency:{m}", 1)  # the runtime value wins...
    assert finish("m", "a", "a1", most=1, cap=2) == []
    r.set("asynch:runtime:max_concurrency:{m}", 50)  # ...but never above the cap
    assert finish("m", "a", "a2", most=8, cap=2) == [("a", "a3"), ("a", "a4")]
    r.set("asynch:runtime:max_concurrency:{m}", 0)  # <= 0 admits nobody
    enq("m", [("c", "c0", 0)], cap=2)
    assert pull("m", 8, cap=2) == [] and rd.ready_counts("m") == {"c": 1}


def test_tenants_take_turns_by_weight(r):
    for t in ("a", "b", "c"):
        _queue("m", t, 300, cap=1000)
    rd.set_weight("b", 2)
    got = pull("m", 400, cap=1000)
    share = Counter(t for t, _ in got)
    assert share == {"a": 100, "b": 200, "c": 100}, share  # stride scheduling: b twice a and c
    # Within a tenant, queue order.
    assert [j for t, j in got if t == "a"][:3] == ["a-0", "a-1", "a-2"]


def test_a_newcomer_takes_the_next_free_slot_ahead_of_the_backlog(r):
    _queue("m", "big", 500)
    first = pull("m", 4)
    assert len(first) == 4 and {t for t, _ in first} == {"big"}  # every slot busy with big's jobs
    enq("m", [("small", "s0", 10**9)], cap=100)  # queued; no slot free
    # One of big's calls ends: the freed slot goes to small, ahead of big's 496 others.
    assert finish("m", "big", first[0][1], most=1, cap=100) == [("small", "s0")]
    assert finish("m", "big", first[1][1], most=1, cap=100) == [("big", "big-4")]


def test_a_guaranteed_minimum_takes_the_next_free_slot(r):
    _queue("m", "big", 500)
    first = pull("m", 8, cap=100)
    rd.set_shares("m", {"vip": (1, None)})
    enq("m", [("vip", "v0", 10**9)], cap=100)
    assert finish("m", "big", first[0][1], most=1, cap=100) == [("vip", "v0")]


def test_a_tenant_at_its_limit_steps_aside_and_returns_when_a_job_ends(r):
    _queue("m", "a", 10, cap=2)
    assert pull("m", 8, cap=2) == [("a", "a-0"), ("a", "a-1")]
    assert pull("m", 8, cap=2) == []
    assert r.sismember("asynch:dq:blocked:{m}", "a")
    enq("m", [("b", "b0", 0)], cap=2)
    assert pull("m", 8, cap=2) == [("b", "b0")]  # b is not held back by a
    assert finish("m", "a", "a-0", most=8, cap=2) == [("a", "a-2")]
    assert sorted(permits("m", "a")) == ["a-1", "a-2"]  # at its limit again: aside again


def test_a_pulled_job_its_puller_cannot_claim_goes_back_to_the_head_of_its_queue(r):
    enq("m", [("a", "first", 1), ("a", "second", 2)], cap=5)
    assert pull("m", 1, cap=5) == [("a", "first")]
    # The database was away: the puller gives it back, permit and charge with it.
    assert finish("m", "a", "first", keep="back", cap=5) == []
    assert permits("m", "a") == [] and not r.hexists("asynch:dq:charge:{m}", "first")
    assert pull("m", 1, cap=5) == [("a", "first")]  # again, ahead of "second"


def test_nothing_holding_a_live_permit_is_queued_twice(r):
    enq("m", [("a", "j", 1)], cap=1)
    assert pull("m", 1, cap=1) == [("a", "j")]
    enq("m", [("a", "j", 1)], cap=1, mode="NX")  # recovery's re-queue: a no-op
    assert rd.ready_counts("m") == {}
    enq("m", [("a", "dead", 1)], cap=5)
    r.zadd("asynch:sem:{m}:a", {"dead": 1.0})  # a permit whose lease ended long ago
    r.zrem("asynch:dq:ready:{m}:a", "dead")
    enq("m", [("a", "dead", 1)], cap=5, mode="NX")
    assert pull("m", 1, cap=5) == [("a", "dead")]


def test_the_doorbell_rings_once_while_work_waits_for_a_slot(settings, r):
    set_settings(settings.with_overrides(dispatch_bell_seconds=0.3))
    assert enq("m", [("a", "a0", 0)], cap=5).ring  # work and no slot pulling: ring
    assert not enq("m", [("a", "a1", 1)], cap=5).ring  # one doorbell out: not again
    step = rd.pull("m", 1, LEASE, cap=5)  # a worker answers it, one free slot
    assert _pairs(step) == [("a", "a0")] and step.ring  # work is left for another slot: the next doorbell
    step = rd.pull("m", 4, LEASE, cap=5)
    assert _pairs(step) == [("a", "a1")] and not step.ring  # nothing left: no doorbell
    assert not finish("m", "a", "a0") and not enq("m", [], cap=5).ring
    # Paused or at the permit limit: no slot could take the work, no doorbell.
    enq("m", [("a", f"x{i}", 10 + i) for i in range(8)], cap=1)
    assert not rd.kick("m", cap=1)[0].ring  # a's one permit is a1's; the doorbell rung above is still out
    # A doorbell nobody answered while nothing was pulled (its message lost) is rung again after its lease.
    finish("m", "a", "a1", cap=1)
    time.sleep(0.4)
    assert rd.kick("m", cap=1)[0].ring


# --- the worker path, in-process --------------------------------------------------------

@pytest.mark.parametrize("payload,outcome", [({}, "done"), ({"status": 400}, "failed"),
                                             ({"status": 500}, "retry_wait")])
def test_the_permit_is_released_on_every_exit_path(make_model, r, payload, outcome):
    make_model("m", max_concurrency=1, retry_times=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m", payload)
    assert handoff.flush()
    assert execution.run_attempt(job_id) == outcome
    assert permits("m", "t") == [] and r.zcard("asynch:gate:{m}") == (0 if outcome != "retry_wait" else 0)


def test_the_permit_is_released_when_the_attempt_crashes(make_model, r, monkeypatch):
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    monkeypatch.setattr(execution, "_upload", lambda *a, **k: 1 / 0)  # our bookkeeping crashes
    assert execution.run_attempt(job_id) == "failed"
    assert permits("m", "t") == []


def test_a_stale_claim_changes_nothing(make_model, r):
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    assert execution.run_attempt(job_id) == "done"
    second = _submit("t", "m")
    assert handoff.flush()
    assert execution.run_attempt(job_id) == "stale" and permits("m", "t") == [] and rd.ready_counts("m") == {"t": 1}
    assert execution.run_attempt(second) == "done"


def test_a_pull_of_an_ended_job_gives_its_permit_back(make_model, r):
    """A queue entry of a job that already ended (a repair raced its end) may be pulled once more: the claim
    refuses it and its permit goes back at once (it would have waited for the lease)."""
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    assert execution.run_attempt(job_id) == "done"
    enq("m", [("t", job_id, 1)], cap=1)
    pulled = rd.pull("m", 1, LEASE, cap=1).pulled
    assert [j for _t, j, _a in pulled] == [job_id] and permits("m", "t") == [job_id]
    attempts, outcomes = execution.claim("m", pulled, None)
    assert attempts == [] and outcomes == {job_id: "stale"}
    assert permits("m", "t") == []


# --- Celery worker processes ------------------------------------------------------------------

@pytest.fixture
def fast_env(test_env):
    return {**test_env, "ASYNCH_LEASE_GRACE_SECONDS": "1"}


@pytest.fixture
def two_nodes(fast_env, tmp_path):
    nodes = [WorkerProcess(fast_env, concurrency=3, log_path=tmp_path / f"w{i}.log", name=f"dq{i}")
             for i in range(2)]
    for n in nodes:
        n.start()
    yield nodes
    for n in nodes:
        n.stop()


@pytest.fixture
def one_node(fast_env, tmp_path):
    w = WorkerProcess(fast_env, concurrency=2, log_path=tmp_path / "w.log", name="dq-one").start()
    yield w
    w.stop()


def _states(ids) -> dict[str, int]:
    with transaction() as conn:
        return {r.id: r.state for r in conn.execute(select(tasks.c.id, tasks.c.state).where(tasks.c.id.in_(ids)))}


@pytest.mark.e2e
@pytest.mark.slow
def test_3_tenants_x_100_jobs_never_exceed_max_concurrency_per_tenant(two_nodes, make_model, model_server, r):
    make_model("fair", max_concurrency=2, queue_limit=400, timeout_seconds=10, model_key_headers="X-Stub-Tenant")
    tenants = ("t1", "t2", "t3")
    ids = [_submit(t, "fair", {"sleep_ms": 40, "i": i}) for t in tenants for i in range(100)]
    wait_until(lambda: set(_states(ids).values()) == {JobState.DONE}, timeout=150, interval=0.5,
               what="300 jobs done")
    st = model_server.state
    assert len(st.calls) == 300  # each job called the model once
    assert {t: st.max_in_flight_by[t] for t in tenants} == {t: 2 for t in tenants}, st.max_in_flight_by
    assert st.max_in_flight > 2  # six processes really ran calls side by side
    with transaction() as conn:
        attempts = conn.execute(select(func.max(tasks.c.attempt), func.max(tasks.c.retry_count))).one()
    assert tuple(attempts) == (1, 0)
    assert all(permits("fair", t) == [] for t in tenants)
    assert r.zcard("asynch:gate:{fair}") == 0


@pytest.mark.e2e
def test_a_job_at_its_tenants_limit_holds_no_call_slot(one_node, make_model, model_server):
    make_model("one", max_concurrency=1, timeout_seconds=10, model_key_headers="X-Stub-Tenant")
    slow = _submit("a", "one", {"sleep_ms": 4000})
    wait_until(lambda: len(model_server.state.calls) == 1, what="the slow call started")
    blocked = _submit("a", "one", {"n": 2})
    other = _submit("b", "one", {"n": 3})
    # Tenant b's job runs on a free slot while tenant a's second job waits in a's queue, holding nothing.
    wait_until(lambda: job_row(other).state == JobState.DONE, timeout=15, what="tenant b's job done")
    assert job_row(slow).state == JobState.RUNNING
    row = job_row(blocked)
    assert row.state == JobState.PENDING and row.attempt == 0 and rd.ready_counts("one") == {"a": 1}
    wait_until(lambda: job_row(blocked).state == JobState.DONE, timeout=20, what="the waiting job done")
    calls = model_server.state.calls
    assert [c["payload"].get("n") for c in calls] == [None, 3, 2]
    assert calls[2]["t"] >= calls[0]["t"] + 3.9  # not before the slow call freed the permit


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sigkilled_workers_permit_comes_back_when_its_lease_ends(one_node, make_model, model_server, r):
    from app.maintenance import passes

    make_model("sk", max_concurrency=1, timeout_seconds=4, retry_times=0, model_key_headers="X-Stub-Tenant")
    victim = _submit("a", "sk", {"sleep_ms": 8000})
    wait_until(lambda: len(model_server.state.calls) == 1 and permits("sk", "a") == [victim],
               what="the call in flight with its permit")
    (_, expiry), = r.zrange("asynch:sem:{sk}:a", 0, -1, withscores=True)
    for pid in one_node.pool_pids():
        os.kill(pid, signal.SIGKILL)
    waiting = _submit("a", "sk", {"n": 2})
    # Nobody releases the dead worker's permit; once its lease (timeout 4 s + grace 1 s) is over the periodic
    # kick (beat's run_work) rings the doorbell and a free slot takes the next job.
    def done():
        passes.kick_dispatch()
        return job_row(waiting).state == JobState.DONE
    wait_until(done, timeout=30, interval=0.5, what="the next job done")
    started = model_server.state.calls[-1]
    assert started["payload"] == {"n": 2}
    assert expiry - 0.5 <= started["t"] <= expiry + 5
    assert job_row(victim).state == JobState.RUNNING  # its row waits for lease recovery
