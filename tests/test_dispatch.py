"""Fair dispatch (app/infra/redis/dispatch.py, app/jobs/dispatch.py).

The Lua steps on real Redis: a job is dispatched only with its tenant's
permit (max_concurrency, runtime override, never above the cap), tenants
take turns by weight, a tenant at its limit steps aside, a newcomer is not
stuck behind another tenant's backlog, at most ``window`` messages wait
unclaimed, an unclaimed (lost) message's job goes back to the head of its
queue.  The worker path in-process: every way out of an attempt gives the
permit back.  Celery worker processes: 3 tenants x 100 jobs never exceed
their limit, a job at its tenant's limit holds no worker process, and a
SIGKILLed worker's permit comes back when its lease ends.
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
from app.jobs import execution, outbox
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal


def _submit(tenant: str, model: str, payload: dict | None = None) -> str:
    opts = jobs.SubmitOptions(model_key=f"X-Stub-Tenant:{tenant}")
    return jobs.submit(Principal(tenant, "user", None), model, payload or {}, opts).row.id


def _pairs(sent):
    return [(t, j) for t, j, _attempt in sent]


def enq(model, entries, **kw):
    """rd.enqueue of (tenant, job, score) entries at attempt 0; the (tenant, job) dispatched."""
    return _pairs(rd.enqueue(model, [(t, j, score, 0, "") for t, j, score in entries], **kw))


def kick(model, **kw):
    return _pairs(rd.kick(model, **kw))


def claimed(model, tenant, job, lease, **kw):
    return _pairs(rd.claimed(model, [(tenant, job)], lease, **kw))


def finish(model, tenant, job, *, wake, message="", cap=None):
    return _pairs(rd.finish(model, [(tenant, job, message if wake else None, None, None)], cap=cap)[1])


def _queue(model: str, tenant: str, n: int, start: float = 0.0, cap: int = 100) -> list:
    return enq(model, [(tenant, f"{tenant}-{i}", start + i) for i in range(n)], cap=cap, most=0)


@pytest.fixture
def window(settings):
    def _set(n: int, lease: float = 60.0, group: int | None = None):
        set_settings(settings.with_overrides(dispatch_window=n, dispatch_lease_seconds=lease,
                                             dispatch_group=group or settings.dispatch_group))
    return _set


# --- the Lua steps --------------------------------------------------------------------

def test_a_job_is_dispatched_only_with_its_tenants_permit(window, r):
    window(100)
    got = enq("m", [("a", f"a{i}", i) for i in range(5)], cap=2)
    assert got == [("a", "a0"), ("a", "a1")]  # queue order, two permits
    assert sorted(permits("m", "a")) == ["a0", "a1"] and rd.ready_counts("m") == {"a": 3}
    assert enq("m", [("b", "b0", 0)], cap=2) == [("b", "b0")]  # per tenant
    assert finish("m", "a", "a0", wake=False, cap=2) == [("a", "a2")]  # a permit back: the next goes
    r.set("asynch:runtime:max_concurrency:{m}", 1)  # the runtime value wins...
    assert finish("m", "a", "a1", wake=False, cap=2) == []
    r.set("asynch:runtime:max_concurrency:{m}", 50)  # ...but never above the cap
    assert finish("m", "a", "a2", wake=False, cap=2) == [("a", "a3"), ("a", "a4")]
    r.set("asynch:runtime:max_concurrency:{m}", 0)  # <= 0 admits nobody
    assert enq("m", [("c", "c0", 0)], cap=2) == [] and rd.ready_counts("m") == {"c": 1}


def test_tenants_take_turns_by_weight(window, r):
    window(1000)
    for t in ("a", "b", "c"):
        _queue("m", t, 300)
    rd.set_weight("b", 2)
    got = kick("m", cap=1000)[:400]
    share = Counter(t for t, _ in got)
    assert share == {"a": 100, "b": 200, "c": 100}, share  # stride scheduling: b twice a and c
    # Within a tenant, queue order.
    assert [j for t, j in got if t == "a"][:3] == ["a-0", "a-1", "a-2"]


def test_a_newcomer_goes_next_not_behind_the_backlog(window, r):
    window(4, group=1)  # groups of one: every claim refills its own place
    _queue("m", "big", 500)
    first = kick("m", cap=100)
    assert len(first) == 4 and {t for t, _ in first} == {"big"}  # the window is full
    assert enq("m", [("small", "s0", 10**9)], cap=100) == []  # queued; no room in the broker
    # A worker takes one of big's: the free place goes to small, ahead of big's 496 others.
    assert claimed("m", "big", first[0][1], 60, cap=100) == [("small", "s0")]
    assert claimed("m", "big", first[1][1], 60, cap=100) == [("big", "big-4")]


def test_a_backlog_refills_in_groups_and_a_newcomer_still_goes_next(window, r):
    window(8)  # groups of 8 (the default) in a window of 8: refills in whole steps of 4
    _queue("m", "big", 500)
    first = kick("m", cap=100)
    assert len(first) == 8
    assert enq("m", [("small", "s0", 10**9)], cap=100) == []
    # Claims of one job each (a trickle's messages): fewer than four places free, nothing refills...
    assert [claimed("m", "big", first[i][1], 60, cap=100) for i in range(3)] == [[], [], []]
    # ...then four places go at once, as one group: small first, ahead of big's 492 others.
    assert claimed("m", "big", first[3][1], 60, cap=100) == [("small", "s0"), ("big", "big-8"), ("big", "big-9"),
                                                             ("big", "big-10")]
    # The steady state: four always wait for the workers, and every fourth claim sends a group of four.
    assert [len(claimed("m", "big", first[i][1], 60, cap=100)) for i in range(4, 8)] == [0, 0, 0, 4]
    assert len(rd.inflight("m")) == 8


def test_a_refill_takes_whole_groups_of_the_free_places(window, r):
    window(16)  # groups of 8 (the defaults)
    _queue("m", "big", 500)
    first = kick("m", cap=100)
    assert len(first) == 16
    # A claim of ten frees ten places: eight go, as one group (ten would leave as two messages of five,
    # and a window of fives would refill in fives for ever).
    assert len(_pairs(rd.claimed("m", [("big", j) for _, j in first[:10]], 60, cap=100))) == 8
    assert len(rd.inflight("m")) == 14
    assert len(_pairs(rd.claimed("m", [("big", j) for _, j in first[10:12]], 60, cap=100))) == 0  # 4 free
    assert len(_pairs(rd.claimed("m", [("big", j) for _, j in first[12:16]], 60, cap=100))) == 8  # 8 free


def test_a_backlog_never_holds_back_a_guaranteed_minimum(window, r):
    window(8)
    _queue("m", "big", 500)
    first = kick("m", cap=100)
    rd.set_shares("m", {"vip": (1, None)})
    assert enq("m", [("vip", "v0", 10**9)], cap=100) == []  # the window is full
    # One place free, seven waiting: an ordinary refill would wait; the minimum goes at once.
    assert claimed("m", "big", first[0][1], 60, cap=100) == [("vip", "v0")]


def test_a_tenant_at_its_limit_steps_aside_and_returns_when_a_job_ends(window, r):
    window(100)
    assert len(_queue("m", "a", 10, cap=2)) == 0  # most=0: queued, not dispatched
    assert kick("m", cap=2) == [("a", "a-0"), ("a", "a-1")]
    assert kick("m", cap=2) == []
    assert r.sismember("asynch:dq:blocked:{m}", "a")
    assert enq("m", [("b", "b0", 0)], cap=2) == [("b", "b0")]  # b is not held back by a
    assert finish("m", "a", "a-0", wake=False, cap=2) == [("a", "a-2")]
    assert sorted(permits("m", "a")) == ["a-1", "a-2"]  # at its limit again: aside again


def test_at_most_window_messages_wait_unclaimed(window, r):
    window(3)
    assert len(_queue("m", "a", 50) + kick("m", cap=100)) == 3
    assert kick("m", cap=100) == [] and len(rd.inflight("m")) == 3
    job = rd.inflight("m")[0]
    assert len(claimed("m", "a", job, 60, cap=100)) == 1  # claimed: no longer waiting in the broker
    assert len(rd.inflight("m")) == 3 and job not in rd.inflight("m")


def test_an_unclaimed_dispatch_goes_back_to_the_head_of_its_queue(window, r):
    window(1, lease=0.3)
    assert enq("m", [("a", "first", 1), ("a", "second", 2)], cap=5) == [("a", "first")]
    time.sleep(0.4)  # its message was lost: nobody claimed it within the lease
    assert kick("m", cap=5) == [("a", "first")]  # dispatched again, ahead of "second"
    assert permits("m", "a") == ["first"]


def test_nothing_holding_a_live_permit_is_queued_twice(window, r):
    window(10)
    assert enq("m", [("a", "j", 1)], cap=1) == [("a", "j")]
    claimed("m", "a", "j", 60, cap=1)
    assert enq("m", [("a", "j", 1)], cap=1, mode="NX") == []  # recovery's re-queue: a no-op
    assert rd.ready_counts("m") == {}
    enq("m", [("a", "dead", 1)], cap=5)
    r.zadd("asynch:sem:{m}:a", {"dead": 1.0})  # a permit whose lease ended long ago
    assert enq("m", [("a", "dead", 1)], cap=5, mode="NX") == [("a", "dead")]


# --- the worker path, in-process --------------------------------------------------------

@pytest.mark.parametrize("payload,outcome", [({}, "done"), ({"status": 400}, "failed"),
                                             ({"status": 500}, "retry_wait")])
def test_the_permit_is_released_on_every_exit_path(make_model, r, payload, outcome):
    make_model("m", max_concurrency=1, retry_times=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m", payload)
    assert outbox.flush()
    assert permits("m", "t") == [job_id]  # dispatched with its permit
    assert execution.run_attempt(job_id) == outcome
    assert permits("m", "t") == [] and r.zcard("asynch:gate:{m}") == (0 if outcome != "retry_wait" else 0)


def test_the_permit_is_released_when_the_attempt_crashes(make_model, r, monkeypatch):
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    monkeypatch.setattr(execution, "_upload", lambda *a, **k: 1 / 0)
    assert execution.run_attempt(job_id) == "failed"
    assert permits("m", "t") == []


def test_a_stale_message_changes_nothing(make_model, r):
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    assert execution.run_attempt(job_id) == "done"
    second = _submit("t", "m")
    assert outbox.flush() and permits("m", "t") == [second]
    assert execution.run_attempt(job_id) == "stale" and permits("m", "t") == [second]


def test_a_dispatch_of_an_ended_job_gives_its_permit_back(make_model, r):
    """A queue entry that came back after a slow message (requeue_unclaimed)
    may be dispatched once more after its job ended: the stale message's
    worker returns the permit and the in-flight entry (under 50 ms latency and
    1% loss they stayed until the dispatch lease, and cycled again)."""
    make_model("m", max_concurrency=1, model_key_headers="X-Stub-Tenant")
    job_id = _submit("t", "m")
    assert execution.run_attempt(job_id) == "done"
    assert enq("m", [("t", job_id, 1)], cap=1) == [("t", job_id)]  # dispatched again: permit + in flight
    assert permits("m", "t") == [job_id] and rd.inflight("m") == [job_id]
    assert execution.run_attempt(job_id) == "stale"
    assert permits("m", "t") == [] and rd.inflight("m") == []


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
    assert r.zcard("asynch:gate:{fair}") == 0 and rd.inflight("fair") == []


@pytest.mark.e2e
def test_a_job_at_its_tenants_limit_holds_no_worker_process(one_node, make_model, model_server):
    make_model("one", max_concurrency=1, timeout_seconds=10, model_key_headers="X-Stub-Tenant")
    slow = _submit("a", "one", {"sleep_ms": 4000})
    wait_until(lambda: len(model_server.state.calls) == 1, what="the slow call started")
    blocked = _submit("a", "one", {"n": 2})
    other = _submit("b", "one", {"n": 3})
    # Two worker processes: one is in the slow call; tenant b's job runs on
    # the other while tenant a's second job waits in a's queue (no message).
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
    # Nobody releases the dead worker's permit; the periodic kick (beat's
    # run_work) dispatches the next job once its lease (timeout 4 s + grace 1 s) is over.
    def done():
        passes.kick_dispatch()
        return job_row(waiting).state == JobState.DONE
    wait_until(done, timeout=30, interval=0.5, what="the next job done")
    started = model_server.state.calls[-1]
    assert started["payload"] == {"n": 2}
    assert expiry - 0.5 <= started["t"] <= expiry + 5
    assert job_row(victim).state == JobState.RUNNING  # its row waits for lease recovery
