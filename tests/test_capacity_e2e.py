"""Capacity isolation: a tenant whose callback receiver is a tarpit (it
accepts, then sends one byte every 0.5 s) must not slow down another
tenant's jobs.  Real processes: a job worker (`asynch worker`, -c 2) and a
callback worker (`asynch callback-worker`, -c 3) on the real broker, the
stub model over HTTP, the tarpit on a socket.

Tenant B's 20 jobs are timed twice in the same test: idle, then while
tenant A's 8 callbacks stall the callback processes; the second run must
finish within 3x the first + 2 s.  Every tarpit attempt must have cost at
most ASYNCH_DELIVERY_TIMEOUT_SECONDS + SLACK (asynch_delivery_attempt.duration_ms).
With callbacks on the job queue, or with a per-read timeout instead of a
deadline, this test fails."""
from __future__ import annotations

import time

import pytest
from helpers import WorkerProcess, wait_until
from sqlalchemy import func, select
from tarpit import Tarpit

from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import deliveries as callbacks_table
from app.infra.tables import delivery_attempts as callback_attempts
from app.infra.tables import tasks
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEADLINE = 2.0
SLACK = 0.3
A, B = Principal("tenant-a", "user", None), Principal("tenant-b", "user", None)


@pytest.fixture(scope="module")
def tarpit():
    pit = Tarpit("status", interval=0.5)
    yield pit
    pit.stop()


@pytest.fixture(scope="module")
def processes(test_env, tmp_path_factory):
    env = {**test_env, "ASYNCH_CALLBACK_ALLOW_HOSTS": "127.0.0.1",
           "ASYNCH_CALLBACK_TIMEOUT_SECONDS": str(DEADLINE),
           # Retries come back quickly: the callback processes stay busy with the tarpit.
           "ASYNCH_CALLBACK_BACKOFF_SECONDS": "0.2", "ASYNCH_CALLBACK_BACKOFF_MAX_SECONDS": "1"}
    logs = tmp_path_factory.mktemp("capacity")
    w = WorkerProcess(env, concurrency=2, log_path=logs / "jobs.log", name="jobs").start()
    cb = WorkerProcess(env, concurrency=3, log_path=logs / "callbacks.log", name="cbs", callbacks=True).start()
    yield w, cb
    cb.stop()
    w.stop()


def _done(ids: list[str]) -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.id.in_(ids), tasks.c.state == int(JobState.DONE))).scalar_one()


def _run_b(n: int = 20, give_up: float = 60) -> float:
    """Submit tenant B's jobs; the seconds until all are done (inf after ``give_up``)."""
    t0 = time.monotonic()
    ids = [jobs.submit(B, "m", {"sleep_ms": 50, "i": i}).row.id for i in range(n)]
    while _done(ids) < n:
        if time.monotonic() - t0 > give_up:
            return float("inf")
        time.sleep(0.02)
    return time.monotonic() - t0


def _attempts() -> list:
    with transaction() as conn:
        return conn.execute(select(callback_attempts.c.duration_ms, callback_attempts.c.error)).all()


def test_a_tarpit_receiver_does_not_slow_another_tenants_jobs(settings, make_model, processes, tarpit):
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1"))
    make_model("m", max_concurrency=8, queue_limit=100)
    _run_b(4)  # warm up: connections, imports, caches
    idle = _run_b()

    a_jobs = [jobs.submit(A, "m", {"i": i}, jobs.SubmitOptions(callback_url=f"{tarpit.url}/cb", biz_name="x")).row.id
              for i in range(8)]
    # Two deliveries are stuck in the tarpit (all A may hold of the 3 callback processes) before B starts.
    wait_until(lambda: len(tarpit.accepted) >= 2, timeout=30, what="deliveries into the tarpit")
    loaded = _run_b()
    assert loaded <= 3 * idle + 2, f"tenant B took {loaded:.2f}s (inf: over 60 s) with a tarpit around, " \
                                   f"{idle:.2f}s idle"

    # Every callback was tried and every attempt was cut at the deadline.
    wait_until(lambda: _done(a_jobs) == 8, timeout=30, what="tenant A's jobs")
    wait_until(lambda: len(_attempts()) >= 8, timeout=60, what="8 recorded attempts")
    rows = _attempts()
    assert all(r.duration_ms <= (DEADLINE + SLACK) * 1000 for r in rows), [r.duration_ms for r in rows]
    assert all(r.duration_ms >= DEADLINE * 1000 for r in rows), [r.duration_ms for r in rows]
    assert all(r.error and "DeadlineExceeded" in r.error for r in rows), {r.error for r in rows}
    with transaction() as conn:
        statuses = set(conn.execute(select(callbacks_table.c.status)).scalars())
    assert "delivered" not in statuses
