"""Retry ordering (seed: retryQueueMaxSeconds) on a real single-process
Celery worker with one call slot: a retried job overtakes a queue of waiting jobs when the
threshold is 0, waits behind them before a threshold > 0, and jumps ahead
once it has waited that long.  The assertion is the ORDER in which the stub
model received the calls, not timings: the stub's ``hold`` keeps the worker
busy while the queue is built, and the test's clock moves the backoff and
the threshold."""
from __future__ import annotations

from datetime import timedelta

import pytest
import redis as redis_lib
from helpers import WorkerProcess, job_row, submit_job as _submit, wait_until
from sqlalchemy import select
from stress_util import called_with, model_payloads

from app.clock import set_clock
from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.states import JobState

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _all_done(ids) -> bool:
    with transaction() as conn:
        states = [r.state for r in conn.execute(select(tasks.c.state).where(tasks.c.id.in_(list(ids))))]
    return len(states) == len(ids) and all(s == JobState.DONE for s in states)


@pytest.fixture(scope="module")
def single_worker(test_env, tmp_path_factory, settings):
    q = settings.queue_name  # leftovers of earlier modules would be taken first
    redis_lib.Redis.from_url(settings.effective_broker_url).delete(q, *[f"{q}:{i}" for i in range(1, 10)])
    # One process with one call slot: the calls' order is the queue's.
    w = WorkerProcess({**test_env, "ASYNCH_WORKER_SLOTS": "1"}, concurrency=1,
                      log_path=tmp_path_factory.mktemp("w1") / "worker.log", name="single").start()
    yield w
    w.stop()


def _ordering_run(model_server, threshold: int, promote_after_threshold: bool) -> tuple[list[str], object]:
    """A worker (concurrency 1) is kept busy on a held call while F fails its
    first attempt and four jobs W0..W3 queue up; F is re-admitted (and, if
    asked, promoted); then the worker is let go.  Returns the order in which
    the model received the calls after that, and what the promotion passes did."""
    blocker = _submit("ord", {"k": "blocker", "hold": "busy"})
    wait_until(lambda: called_with(model_server, "k", "blocker"), what="the worker holding the blocker")
    failed = _submit("ord", {"k": "F", "tag": "F", "fail_first": 1})
    assert execution.run_attempt(failed, 0) == "retry_wait"  # F's first try, in this process
    waiting = [_submit("ord", {"k": f"W{i}"}) for i in range(4)]
    t0 = job_row(failed).next_retry_at + timedelta(seconds=1)
    set_clock(lambda: t0)
    assert maintenance.retry_due().processed == 1
    promoted = maintenance.promote_waiting_retries().processed  # before any threshold
    if promote_after_threshold:
        t1 = t0 + timedelta(seconds=threshold + 1)
        set_clock(lambda: t1)
        promoted = (promoted, maintenance.promote_waiting_retries().processed)
    set_clock(None)
    model_server.state.release("busy")
    ids = [blocker, failed, *waiting]
    wait_until(lambda: _all_done(ids), timeout=60, what="all jobs done")
    order = [p["k"] for p in model_payloads(model_server)]
    assert order[:2] == ["blocker", "F"]  # the held call, then F's failed first try
    row = job_row(failed)
    assert row.attempt == 2 and row.retry_count == 1
    return order[2:], promoted


def test_retry_with_threshold_zero_overtakes_the_waiting_jobs(single_worker, make_model, model_server):
    make_model("ord", retry_times=1, retry_queue_max_seconds=0, queue_limit=50)
    order, promoted = _ordering_run(model_server, 0, False)
    assert order == ["F", "W0", "W1", "W2", "W3"]
    assert promoted == 0  # already at the head: nothing to promote


def test_retry_with_threshold_waits_at_the_tail_before_it(single_worker, make_model, model_server):
    make_model("ord", retry_times=1, retry_queue_max_seconds=60, queue_limit=50)
    order, promoted = _ordering_run(model_server, 60, False)
    assert promoted == 0
    assert order == ["W0", "W1", "W2", "W3", "F"]


def test_retry_with_threshold_jumps_ahead_once_it_has_waited(single_worker, make_model, model_server):
    make_model("ord", retry_times=1, retry_queue_max_seconds=60, queue_limit=50)
    order, promoted = _ordering_run(model_server, 60, True)
    assert promoted == (0, 1)
    # Two messages for F's second attempt (tail and head): the model saw it once.
    assert order == ["F", "W0", "W1", "W2", "W3"]
