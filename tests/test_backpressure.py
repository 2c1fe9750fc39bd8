"""Concurrency that adapts to an upstream that pushes back (issue 24 item 2,
docs/architecture.md "Upstream backpressure").  Real processes: one Celery
node with 8 worker processes on the real broker, the stub model over HTTP
in its "room for N" mode (429 beyond N calls at once), PostgreSQL and Redis.

- a busy answer (429/503) sends the attempt back to the queue without
  spending a retry, up to ASYNCH_UPSTREAM_BUSY_BUDGET;
- the model's effective concurrency drops at once and climbs back;
- a run time above the baseline lowers it (latency gradient);
- a Retry-After pauses the model's dispatch (and no other model's);
- the acceptance: 40 jobs against room for 2 on a model configured for 8
  all end done with at most 40 answers of 429, in at most 3x the ideal
  time + 5 s, and a healthy model beside it is not slowed.
"""
from __future__ import annotations

import time

import pytest
import requests
from helpers import WorkerProcess, job_row, wait_until
from helpers import submit_job as _submit
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.http.model_client import retry_after_seconds
from app.infra.redis import upstream
from app.infra.tables import task_attempts, tasks
from app.states import JobState

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUDGET = 4


@pytest.fixture(scope="module")
def eight(test_env, tmp_path_factory):
    env = {**test_env, "ASYNCH_UPSTREAM_BUSY_BUDGET": str(BUDGET)}
    w = WorkerProcess(env, concurrency=8, log_path=tmp_path_factory.mktemp("bp") / "w.log", name="bp").start()
    yield w
    w.stop()



def _states(ids: list[str]) -> dict[int, int]:
    with transaction() as conn:
        return dict(conn.execute(select(tasks.c.state, func.count()).where(tasks.c.id.in_(ids))
                                 .group_by(tasks.c.state)).all())


def _ended(ids: list[str]) -> bool:
    return sum(n for s, n in _states(ids).items() if s in (JobState.DONE, JobState.FAILED)) == len(ids)


def _run(model: str, payloads: list[dict], give_up: float = 120) -> tuple[list[str], float]:
    t0 = time.monotonic()
    ids = [_submit(model, p) for p in payloads]
    wait_until(lambda: _ended(ids), timeout=give_up, interval=0.02, what=f"{model}'s jobs")
    return ids, time.monotonic() - t0


def test_retry_after_is_seconds_or_an_http_date():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0  # past: now
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None


def test_busy_answers_do_not_spend_retries_up_to_the_budget(make_model, model_server, eight):
    make_model("busy", retry_times=0, max_concurrency=2)
    # 429 for the first 3 calls (room 0 for tag "b3" until the stub's count passes),
    # done on the 4th: no retry was allowed, none was spent.
    ok = _submit("busy", {"status_first": 429, "tag": "b3", "fail_first": 3})
    # Beyond the budget a busy answer is an ordinary failed attempt: with no retry left, failed.
    over = _submit("busy", {"status_first": 503, "tag": "b9", "fail_first": 9})
    wait_until(lambda: _ended([ok, over]), timeout=60, what="both jobs")
    row = job_row(ok)
    assert (row.state, row.attempt, row.busy_count, row.retry_count, row.error) == (JobState.DONE, 4, 3, 0, None)
    row = job_row(over)
    assert (row.state, row.attempt, row.busy_count) == (JobState.FAILED, BUDGET + 1, BUDGET)
    assert row.error.startswith("model_http_error:") and "503" in row.error
    with transaction() as conn:
        log = conn.execute(select(task_attempts.c.attempt, task_attempts.c.outcome, task_attempts.c.error)
                           .where(task_attempts.c.job_id == ok).order_by(task_attempts.c.attempt)).all()
    assert [(a, JobState(o).label) for a, o, _ in log] == [(1, "pending"), (2, "pending"), (3, "pending"), (4, "done")]
    assert all(e.startswith("model_busy:") for _, _, e in log[:3])


def test_concurrency_drops_on_busy_answers_and_climbs_back(make_model, model_server, eight, r, api_url,
                                                           admin_key):
    make_model("full", retry_times=0, max_concurrency=8, queue_limit=100)
    ids, _ = _run("full", [{"sleep_ms": 150, "room": 2, "i": i} for i in range(16)])
    assert _states(ids) == {JobState.DONE: 16}
    dropped, _ = upstream.snapshot(["full"])["full"]
    assert dropped is not None and dropped <= 4, dropped
    metrics = requests.get(f"{api_url}/metrics/cluster", headers={"Authorization": f"Bearer {admin_key}"},
                           timeout=10).text
    assert f'asynch_model_effective_concurrency{{model="full"}} {float(dropped)}' in metrics
    # The upstream has room again: the limit climbs back to the configured 8 (then it is absent).
    # A round is 60 jobs; on a loaded machine the latency rule may take a step back
    # meanwhile (a slow answer is a signal too), so up to four rounds.
    model_server.state.reset()
    for _round in range(4):
        _run("full", [{"sleep_ms": 20, "i": i} for i in range(60)])
        if upstream.snapshot(["full"])["full"][0] is None:
            break
    assert upstream.snapshot(["full"])["full"][0] is None
    assert model_server.state.busy_answers == 0


def test_a_latency_rise_above_the_baseline_lowers_concurrency(make_model, model_server, eight):
    make_model("slowing", retry_times=0, max_concurrency=8, queue_limit=100)
    # +150 ms per other call in flight.  The limit settles where the recent run
    # time is 2x the baseline: at 1.2 + overhead/150 calls, so a loaded machine's
    # per-call overhead (which inflates the baseline) still leaves it under 4.
    payload = {"sleep_ms": 30, "crowd_ms": 150, "room_tag": "s"}
    for i in range(12):  # one at a time: the baseline is ~30 ms
        _run("slowing", [{**payload, "i": i}])
    assert upstream.snapshot(["slowing"])["slowing"][0] is None
    ids = [_submit("slowing", {**payload, "i": i}) for i in range(40)]  # 8 at once: ~1.1 s each
    seen = set()
    while not _ended(ids):
        seen.add(upstream.snapshot(["slowing"])["slowing"][0] or 8)
        time.sleep(0.02)
    assert min(seen) <= 4, seen
    assert model_server.state.busy_answers == 0  # no 429: the run time alone did it


def test_retry_after_pauses_the_models_dispatch_only(make_model, model_server, eight):
    make_model("paused", retry_times=0, max_concurrency=4)
    make_model("other", retry_times=0, max_concurrency=4)
    holder = _submit("paused", {"room": 1, "room_tag": "p", "hold": "h"})
    wait_until(lambda: job_row(holder).state == JobState.RUNNING, timeout=30, what="the holder running")
    busy = _submit("paused", {"room": 1, "room_tag": "p", "retry_after": "2"})
    wait_until(lambda: model_server.state.busy_answers == 1, timeout=30, what="the 429")
    t_busy = time.time()
    wait_until(lambda: job_row(busy).busy_count == 1, timeout=30, what="the busy job back in its queue")
    behind = _submit("paused", {"i": 1})
    # Another model is not paused: it runs at once.
    other_ids, took = _run("other", [{"i": i} for i in range(4)], give_up=30)
    assert took < 2, took
    assert job_row(behind).state == JobState.PENDING  # still paused
    model_server.state.release("h")
    wait_until(lambda: _ended([holder, busy, behind]), timeout=30, what="the paused model's jobs")
    calls = {c["headers"].get("X-Asynch-Job-Id"): c["t"] for c in model_server.state.calls}
    # Dispatched again when the pause ended (the delayed kick), not before, not much after.
    assert t_busy + 1.8 <= calls[behind] <= t_busy + 2 + 3, calls[behind] - t_busy
    assert job_row(busy).state == JobState.DONE


def test_an_upstream_with_room_for_2_gets_40_jobs_done_and_a_healthy_model_is_not_slowed(
        make_model, model_server, eight):
    make_model("room2", retry_times=0, max_concurrency=8, queue_limit=100)
    make_model("healthy", retry_times=0, max_concurrency=4, queue_limit=100)
    healthy = [{"sleep_ms": 100, "i": i} for i in range(20)]
    _run("healthy", healthy[:4])  # warm up
    _, alone = _run("healthy", healthy)

    sleep_s, n = 0.3, 40
    t0 = time.monotonic()
    ids = [_submit("room2", {"sleep_ms": sleep_s * 1000, "room": 2, "i": i}) for i in range(n)]
    _, beside = _run("healthy", healthy)
    wait_until(lambda: _ended(ids), timeout=120, interval=0.02, what="the 40 jobs")
    took = time.monotonic() - t0
    ideal = n / 2 * sleep_s
    assert _states(ids) == {JobState.DONE: n}
    assert model_server.state.busy_answers <= n, model_server.state.busy_answers
    assert took <= 3 * ideal + 5, (took, ideal)
    assert beside <= 2 * alone + 1, (beside, alone)
