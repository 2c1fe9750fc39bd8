"""A slot per call (issue 31 item 3; app/jobs/slots.py), on real PostgreSQL, Redis, the stub model over HTTP, a
process's slots in this process (threads) and, for the kill and the shutdown, real worker processes.

Behaviour, counted, not timed:
- a doorbell's pull is ONE pull step and ONE claim statement for as many jobs as the process has free slots;
- the writer turns a batch of ended calls into ONE done statement and ONE dispatch step per model, which also
  takes, for the freed slots, the jobs the ring picks then (the refill);
- a slot is freed per call: while one call is held, the other slots keep taking jobs;
- a freed slot is given back, not refilled, while another model's doorbell waits for one.
Invariants under faults: SIGKILL of the pool process with calls in flight loses no job and runs none twice (one
model call per attempt, one terminal record); the node's warm shutdown ends its held doorbell and its calls end
and are written (each job done at its first attempt).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest
from helpers import Count, P, WorkerProcess, job_row, wait_until
from sqlalchemy import select
from stress_util import called_with, maintenance_loop, model_payloads

from app.config import set_settings
from app.infra.db import transaction
from app.infra.redis import keys
from app.infra.tables import task_attempts
from app.jobs import dispatch, handoff, slots
from app.jobs import service as jobs
from app.states import JobState


@pytest.fixture
def here(settings):
    """A process's call slots, in this process (4 of them), small results kept in the row."""
    set_settings(settings.with_overrides(inline_result_bytes=-1, worker_slots=4))
    s = slots.Slots()
    yield s
    s.drain(30)


def _submit(model: str, payloads: list[dict]) -> list[str]:
    ids = [jobs.submit(P, model, p).row.id for p in payloads]
    assert handoff.flush()
    return ids


def _bell(here: slots.Slots, model: str) -> list:
    """Answer ``model``'s doorbell on a thread of its own (a Celery task's, which holds while every slot is
    taken); what it answered (the calls it started) lands in the list."""
    out: list = []
    threading.Thread(target=lambda: out.append(here.answer_bell(model, "w#1")), daemon=True).start()
    return out


def _done(ids) -> bool:
    return all(job_row(j).state == JobState.DONE for j in ids)


def _attempt_rows(ids) -> dict[str, list]:
    with transaction() as conn:
        rows = conn.execute(select(task_attempts).where(task_attempts.c.job_id.in_(ids))
                            .order_by(task_attempts.c.job_id, task_attempts.c.attempt)).all()
    out: dict[str, list] = {j: [] for j in ids}
    for row in rows:
        out[row.job_id].append(row)
    return out


def _is_claim(sql: str) -> bool:
    """A claim statement (transitions.claim_pulled: the claim's UPDATE as a CTE joined to the model's row)."""
    return " ".join(sql.split()).upper().startswith("WITH CLAIMED AS (UPDATE")


def test_a_pull_is_one_pull_step_and_one_claim_statement(make_model, model_server, here):
    make_model("grp", max_concurrency=8)
    warm = _submit("grp", [{"hold": "warm"}])
    here.answer_bell("grp", "w1#abc")  # warm: statements built, scripts loaded (one slot of four: no hold)
    model_server.state.release("warm")
    wait_until(lambda: _done(warm) and here.active == 0, what="the warm-up")
    ids = _submit("grp", [{"hold": "h", "i": i} for i in range(6)])
    counted = {}

    def bell():  # a doorbell's task: this thread's statements and steps alone are counted
        with Count(this_thread=True) as c:
            counted["started"] = here.answer_bell("grp", "w1#abc")
        counted["c"] = c

    t = threading.Thread(target=bell)
    t.start()
    wait_until(lambda: sum(called_with(model_server, "i", i) for i in range(6)) == 4, what="four calls held")
    rows = [job_row(j) for j in ids]
    model_server.state.release("h")
    t.join(30)  # it held its process while every slot was taken
    c = counted["c"]
    assert counted["started"] == 4  # its four free slots
    claims = [s for s in c.statements if _is_claim(s)]
    assert c.redis.count("EVALSHA") == 1 and len(claims) == 1, (c.redis, c.sql)  # (and the next doorbell)
    running = [r for r in rows if r.state == JobState.RUNNING]
    assert len(running) == 4 and len({r.started_at for r in running}) == 1  # claimed by one statement
    assert all(r.worker == "w1#abc" for r in running)
    wait_until(lambda: _done(ids) and here.active == 0, what="all six done, the last two by refills")


def test_the_writer_writes_a_batch_in_one_statement_and_refills_its_slots_in_the_same_step(
        make_model, model_server, here):
    make_model("wr", max_concurrency=8)
    ids = _submit("wr", [{"hold": "gate", "i": i} for i in range(8)])
    _bell(here, "wr")
    wait_until(lambda: sum(called_with(model_server, "i", i) for i in range(8)) == 4, what="four calls in flight")
    with Count() as c:
        model_server.state.release("gate")  # the four end together (and the next four, refilled, too)
        wait_until(lambda: _done(ids) and here.active == 0, what="all eight done")
    # Two batches of four (or a few more, smaller): one done statement each, one dispatch step each (the
    # release and the refill together), one claim statement per refill.
    done_writes = [s for s in c.statements if s.lstrip().upper().startswith("WITH") and not _is_claim(s)]
    claims = [s for s in c.statements if _is_claim(s)]
    assert 2 <= len(done_writes) <= 4 and len(claims) <= len(done_writes), (c.sql, c.redis)
    assert c.redis.count("EVALSHA") == len(done_writes), c.redis  # no step of its own for the refill
    assert all(job_row(j).attempt == 1 for j in ids)


def test_a_slot_is_freed_per_call_whatever_the_others_are_doing(make_model, model_server, here):
    make_model("mix", max_concurrency=8, timeout_seconds=30, queue_limit=100)
    slow = _submit("mix", [{"hold": "late"}])
    fast = _submit("mix", [{"sleep_ms": 20, "i": i} for i in range(30)])
    _bell(here, "mix")
    try:
        # One slot holds the slow call; the three others take the thirty fast jobs, one after another.
        wait_until(lambda: _done(fast), timeout=30, what="the thirty fast jobs done")
        assert job_row(slow[0]).state == JobState.RUNNING
    finally:
        model_server.state.release("late")
    wait_until(lambda: _done(slow) and here.active == 0, what="the slow job done")


def test_a_freed_slot_is_given_back_while_another_models_doorbell_waits(make_model, model_server, here, r):
    make_model("busy", max_concurrency=8, queue_limit=100)
    ids = _submit("busy", [{"sleep_ms": 30, "i": i} for i in range(40)])
    r.zadd(keys.bells(), {"other": time.time() - 1})  # another model's doorbell, unanswered a while
    assert dispatch.bells_waiting("busy")
    _bell(here, "busy")
    wait_until(lambda: here.active == 0, timeout=10, what="the first four calls ended")
    time.sleep(0.2)
    # Their slots went back (for the other doorbell), not to "busy"'s next jobs.
    assert sum(job_row(j).state == JobState.DONE for j in ids) == 4
    r.zrem(keys.bells(), "other")
    _bell(here, "busy")
    wait_until(lambda: _done(ids), timeout=30, what="the rest done once nothing else waits")


@pytest.mark.slow
@pytest.mark.e2e
def test_sigkill_with_calls_in_flight_loses_no_job_and_runs_none_twice(test_env, tmp_path, make_model,
                                                                       model_server, r):
    """One pool process: two answers written, two calls held.  SIGKILL it: the held attempts' leases run out
    and recovery retries them (on the node's new pool process).  Nothing lost, nothing run twice."""
    make_model("killgrp", max_concurrency=8, timeout_seconds=5, retry_times=2)
    env = {**test_env, "ASYNCH_LEASE_GRACE_SECONDS": "1"}
    w = WorkerProcess(env, concurrency=1, log_path=tmp_path / "w.log", name="grp").start()
    try:
        ids = _submit("killgrp", [{"n": i} for i in range(2)] + [{"hold": "kill", "n": i} for i in range(2, 4)])
        fast, held = ids[:2], ids[2:]
        wait_until(lambda: _done(fast), timeout=30, what="two answers")
        wait_until(lambda: sum(called_with(model_server, "n", i) for i in (2, 3)) == 2, what="two calls in flight")
        assert all(job_row(j).state == JobState.RUNNING for j in held)
        (pid,) = w.pool_pids()
        os.kill(pid, signal.SIGKILL)
        model_server.state.release("kill")  # the retries' calls answer at once
        with maintenance_loop():
            wait_until(lambda: _done(ids), timeout=60, what="every job done after the kill")
    finally:
        model_server.state.release("kill")
        w.stop()
    rows = {j: job_row(j) for j in ids}
    assert [rows[j].attempt for j in fast] == [1, 1]
    assert [rows[j].attempt for j in held] == [2, 2]  # their killed attempt recovered, retried once
    logged = _attempt_rows(ids)
    for j in ids:  # exactly one terminal record: one attempt ended done
        assert [a.outcome for a in logged[j]].count(JobState.DONE) == 1, logged[j]
    calls = Counter((c["headers"].get("X-Asynch-Job-Id"), c["headers"].get("X-Asynch-Attempt"))
                    for c in model_server.state.calls)
    assert all(n == 1 for n in calls.values()), calls  # no attempt called the model twice
    assert {k for k in calls if k[0] in ids} == {(j, "1") for j in ids} | {(j, "2") for j in held}
    assert r.zcard("asynch:gate:{killgrp}") == 0


@pytest.mark.slow
@pytest.mark.e2e
def test_a_warm_shutdown_lets_the_held_doorbell_go_and_writes_the_calls_in_flight(test_env, tmp_path, make_model,
                                                                                  model_server):
    make_model("stopping", max_concurrency=16, timeout_seconds=30)
    w = WorkerProcess({**test_env, "ASYNCH_WORKER_SLOTS": "2"}, concurrency=1, log_path=tmp_path / "w.log",
                      name="stop").start()
    try:
        ids = _submit("stopping", [{"hold": "s", "i": i} for i in range(2)])  # both slots held: the task holds
        wait_until(lambda: sum(called_with(model_server, "i", i) for i in range(2)) == 2, what="both calls")
        os.kill(w.proc.pid, signal.SIGTERM)  # the node alone (warm shutdown), not its pool process
        time.sleep(1.0)
        assert w.proc.poll() is None  # it waits for its calls...
        model_server.state.release("s")
        w.proc.wait(30)  # ...and then stops
    finally:
        model_server.state.release("s")
        w.stop()
    assert [job_row(j).state for j in ids] == [JobState.DONE] * 2
    assert [job_row(j).attempt for j in ids] == [1, 1]  # written by the stopping process, not recovered


@pytest.mark.e2e
def test_a_backlog_built_one_job_at_a_time_is_claimed_in_groups(test_env, tmp_path, make_model, model_server):
    """Forty jobs admitted one at a time while the only pool process's slots are busy: as calls end, the
    freed slots take several jobs per claim statement (the refill), not one message per job."""
    make_model("trickle", max_concurrency=64, queue_limit=100, timeout_seconds=30)
    w = WorkerProcess(test_env, concurrency=1, log_path=tmp_path / "w.log", name="trickle").start()
    try:
        first = _submit("trickle", [{"hold": "busy", "i": i} for i in range(8)])
        wait_until(lambda: sum(called_with(model_server, "i", i) for i in range(8)) == 8,
                   what="every slot busy")
        ids = []
        for i in range(40):
            ids.extend(_submit("trickle", [{"n": i}]))  # one dispatch step per job: a trickle's shape
        model_server.state.release("busy")
        wait_until(lambda: _done(first + ids), timeout=60, what="every job done")
    finally:
        model_server.state.release("busy")
        w.stop()
    rows = [job_row(j) for j in ids]
    claims = Counter(r.started_at for r in rows)  # jobs per claim statement
    assert len(claims) <= 20 and max(claims.values()) >= 4, claims
    assert all(r.attempt == 1 for r in rows)
    calls = Counter(p["n"] for p in model_payloads(model_server) if "n" in p)
    assert calls == {i: 1 for i in range(40)}  # each job called once
