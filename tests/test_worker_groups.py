"""A run_jobs message carries a group of one model's jobs (issue 25, goal 1), on real PostgreSQL, Redis,
the stub model over HTTP and, for the kill, a real worker process.

Behaviour, counted, not timed:
- the group's claims are ONE statement (one commit, every claim durable before any call) and ONE
  dispatch step;
- the writer turns a batch of answers into ONE done statement and ONE finish step (slots, permits,
  wake-ups, run times, next jobs);
- a slow call does not hold back its group's other answers.
Invariant under SIGKILL of the pool process mid-group (some answers written, some calls in flight):
no job lost, none run twice (one model call per attempt), exactly one terminal record each.
"""
from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import timedelta

import pytest
from helpers import Count, P, WorkerProcess, job_row, wait_until
from sqlalchemy import select
from stress_util import called_with, maintenance_loop, model_payloads

from app.clock import now as clock_now
from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import model_stats, task_attempts
from app.jobs import batch, execution, outbox
from app.jobs import service as jobs
from app.states import JobState
from app.transitions import Done, claim_group


@pytest.fixture
def inline_default(settings):
    """The product's default: small results kept in the row."""
    set_settings(settings.with_overrides(inline_result_bytes=-1))
    yield
    set_settings(settings)


def _dispatched_group(model: str, items: list[dict]) -> list[str]:
    """Admit ``items`` in one batch (one dispatch step: one run_jobs message of them)."""
    ids = [o.submitted.row.id for o in batch.submit_batch(P, model, items)]
    assert outbox.flush()
    return ids


def _attempt_rows(ids) -> dict[str, list]:
    with transaction() as conn:
        rows = conn.execute(select(task_attempts).where(task_attempts.c.job_id.in_(ids))
                            .order_by(task_attempts.c.job_id, task_attempts.c.attempt)).all()
    out: dict[str, list] = {j: [] for j in ids}
    for row in rows:
        out[row.job_id].append(row)
    return out


def test_a_group_is_one_read_one_claim_statement_and_one_claim_step(make_model, model_server, inline_default):
    make_model("grp", max_concurrency=8)
    warm = _dispatched_group("grp", [{"payload": {"w": 1}}])
    execution.run_group([(warm[0], 0)])  # warm: statements built, scripts loaded
    ids = _dispatched_group("grp", [{"payload": {"i": i}} for i in range(4)])
    with Count() as c:
        assert execution.run_group([(j, 0) for j in ids], worker="w1#abc") == ["done"] * 4
    # The read and the claim, one statement each for the four; then only done statements.
    assert c.sql[:2] == ["SELECT", "UPDATE"] and set(c.sql[2:]) == {"WITH"}, c.sql
    writes = len(c.sql) - 2
    assert 1 <= writes <= 4
    # One claim step, then one finish step per done statement: never one per job within a batch.
    assert c.redis == ["EVALSHA"] * (1 + writes), (c.redis, c.sql)
    rows = [job_row(j) for j in ids]
    assert len({r.started_at for r in rows}) == 1  # claimed by one statement (one clock reading)
    assert all(r.state == JobState.DONE and r.attempt == 1 and r.worker == "w1#abc" for r in rows)


def test_the_writer_turns_a_batch_of_answers_into_one_statement_and_one_finish_step(make_model, model_server,
                                                                                   inline_default):
    make_model("wr", max_concurrency=8)
    ids = _dispatched_group("wr", [{"payload": {"i": i}} for i in range(5)])
    execution.run_group([(ids[0], 0)])  # warm
    ids = ids[1:]
    with transaction() as conn:
        rows = claim_group(conn, [(j, 0) for j in ids], clock_now() + timedelta(minutes=5), "w#1")
        model = conn.execute(execution._JOBS_WITH_MODEL, {"ids": [ids[0]]}).first()  # as the worker reads it
    assert sorted(r.id for r in rows) == sorted(ids)
    answers = [execution._Answer(r, model, Done(r.id, 1, "inline:", "application/json", 2, b"{}"), {"job_id": r.id})
               for r in rows]
    with Count() as c:
        assert execution._write(answers) == {j: "done" for j in ids}
    assert c.sql == ["WITH"] and c.redis == ["EVALSHA"], (c.sql, c.redis)
    assert all(job_row(j).state == JobState.DONE and bytes(job_row(j).result_inline) == b"{}" for j in ids)
    logged = _attempt_rows(ids)
    assert all(len(v) == 1 and v[0].outcome == JobState.DONE for v in logged.values()), logged
    with transaction() as conn:
        counted = sum(r.request_count for r in conn.execute(
            select(model_stats).where(model_stats.c.model_name == "wr")))
    assert counted == 5  # the warm-up's call and the four answers', in the same statement as their ends


def test_a_slow_call_does_not_hold_back_its_groups_other_answers(make_model, model_server, inline_default):
    make_model("slowgrp", max_concurrency=8, timeout_seconds=30)
    ids = _dispatched_group("slowgrp", [{"payload": {"hold": "late"}}] + [{"payload": {"i": i}} for i in range(3)])
    out: list = []
    t = threading.Thread(target=lambda: out.append(execution.run_group([(j, 0) for j in ids])))
    t.start()
    try:
        wait_until(lambda: all(job_row(j).state == JobState.DONE for j in ids[1:]), what="the fast three done")
        assert job_row(ids[0]).state == JobState.RUNNING and called_with(model_server, "hold", "late")
    finally:
        model_server.state.release("late")
        t.join(30)
    assert out == [["done"] * 4]


@pytest.mark.slow
@pytest.mark.e2e
def test_sigkill_mid_group_loses_no_job_and_runs_none_twice(test_env, tmp_path, make_model, model_server, r):
    """One pool process holds a group of four: two answered and written, two calls in flight.  SIGKILL it:
    Celery redelivers the message (acks late), its claims refuse all four (two done, two running a newer
    attempt), and recovery retries the two whose attempt died.  Nothing lost, nothing run twice."""
    make_model("killgrp", max_concurrency=8, timeout_seconds=5, retry_times=2)
    env = {**test_env, "ASYNCH_DISPATCH_GROUP": "4", "ASYNCH_LEASE_GRACE_SECONDS": "1"}
    w = WorkerProcess(env, concurrency=1, log_path=tmp_path / "w.log", name="grp").start()
    try:
        items = [{"payload": {"n": i}} for i in range(2)] + [{"payload": {"hold": "kill-group", "n": i}}
                                                             for i in range(2, 4)]
        ids = _dispatched_group("killgrp", items)
        fast, held = ids[:2], ids[2:]
        wait_until(lambda: all(job_row(j).state == JobState.DONE for j in fast), timeout=30, what="two answers")
        wait_until(lambda: sum(called_with(model_server, "n", i) for i in (2, 3)) == 2, what="two calls in flight")
        rows = {j: job_row(j) for j in ids}
        assert all(rows[j].state == JobState.RUNNING for j in held)
        assert len({x.started_at for x in rows.values()}) == 1  # one group: one claim statement
        (pid,) = w.pool_pids()
        os.kill(pid, signal.SIGKILL)
        model_server.state.release("kill-group")  # the retries' calls answer at once
        with maintenance_loop():
            wait_until(lambda: all(job_row(j).state == JobState.DONE for j in ids), timeout=60,
                       what="every job done after the kill")
    finally:
        model_server.state.release("kill-group")
        w.stop()
    rows = {j: job_row(j) for j in ids}
    assert [rows[j].attempt for j in fast] == [1, 1]  # the redelivered message did not run them again
    assert [rows[j].attempt for j in held] == [2, 2]  # their killed attempt recovered, retried once
    logged = _attempt_rows(ids)
    for j in ids:  # exactly one terminal record: one attempt ended done
        assert [a.outcome for a in logged[j]].count(JobState.DONE) == 1, logged[j]
    calls = Counter((c["headers"].get("X-Asynch-Job-Id"), c["headers"].get("X-Asynch-Attempt"))
                    for c in model_server.state.calls)
    assert all(n == 1 for n in calls.values()), calls  # no attempt called the model twice
    assert {k for k in calls if k[0] in ids} == {(j, "1") for j in ids} | {(j, "2") for j in held}
    assert r.zcard("asynch:gate:{killgrp}") == 0


@pytest.mark.e2e
def test_a_backlog_built_one_job_at_a_time_drains_in_groups(test_env, tmp_path, make_model, model_server):
    """Forty jobs admitted one at a time (forty dispatch steps) while the only pool process is busy:
    the first few go out as single-job messages, and the rest leave as whole groups, because a step
    fills only whole groups of the window's free places (dispatch_lib.lua).  Without that rule every
    claim of one refills one place and all forty run one per message."""
    make_model("trickle", max_concurrency=64, queue_limit=100, timeout_seconds=30)
    w = WorkerProcess(test_env, concurrency=1, log_path=tmp_path / "w.log", name="trickle").start()
    try:
        first = jobs.submit(P, "trickle", {"hold": "busy"}).row.id
        outbox.flush()
        wait_until(lambda: called_with(model_server, "hold", "busy"), what="the pool process busy")
        ids = []
        for i in range(40):
            ids.append(jobs.submit(P, "trickle", {"n": i}).row.id)
            assert outbox.flush()  # one dispatch step per job: a trickle's shape
        model_server.state.release("busy")
        wait_until(lambda: all(job_row(j).state == JobState.DONE for j in [first, *ids]), timeout=60,
                   what="every job done")
    finally:
        model_server.state.release("busy")
        w.stop()
    rows = [job_row(j) for j in ids]
    groups = Counter(Counter(r.started_at for r in rows).values())  # jobs per claim statement -> claims
    grouped = sum(size * n for size, n in groups.items() if size >= 4)
    assert sum(groups.values()) <= 20 and grouped >= 28, groups  # a few ran alone, the rest in groups
    assert all(r.attempt == 1 for r in rows)
    calls = Counter(p["n"] for p in model_payloads(model_server) if "n" in p)
    assert calls == {i: 1 for i in range(40)}  # each job called once
