"""A dead worker node's jobs: how long until they are done elsewhere.

40 jobs (4 s each) in flight on node A (-c 40) of a model with a 10 s
timeout.  The whole node is SIGKILLed (main process and pool) and a
replacement node B of the same size starts (as an orchestrator restarts a
pod; started before the kill, B's slow start on 2 cores let A finish its
jobs first).  Three times are printed, twice in the same run: B's start,
and from the SIGKILL until every job has been claimed again (the goal:
"run again within 30 s") and until all 40 are done:

  heartbeat  today: beat's run-work pass (every ASYNCH_BEAT_RETRY_SECONDS)
             fails the attempts of a node whose liveness key expired
             (3 heartbeats of ASYNCH_WORKER_HEARTBEAT_SECONDS)
  lease      the baseline: ASYNCH_RECOVER_BY_HEARTBEAT=false, the attempts
             wait for their lease (timeout + ASYNCH_LEASE_GRACE_SECONDS)

A real `asynch beat` sends the passes.  The lease baseline takes its whole
lease (130 s with the defaults): BENCH_RECOVERY_GRACE shortens the grace for
both runs alike, BENCH_RECOVERY_PARTS=heartbeat skips it.

    PYTHONPATH=. python -m bench.bench_recovery
"""
from __future__ import annotations

import os
import signal
import sys
import time

from bench import stack

JOBS = 40
GRACE = os.environ.get("BENCH_RECOVERY_GRACE", "120")


def _count(state: int, ids: list[str]) -> int:
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.id.in_(ids), tasks.c.state == state)).scalar_one()


def _reclaimed(ids: list[str]) -> int:
    """Jobs past their first attempt (claimed again) or done."""
    from sqlalchemy import func, or_, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.id.in_(ids), or_(tasks.c.attempt >= 2, tasks.c.state == 2))).scalar_one()


def run(mode: str, mport: int) -> tuple[float, float]:
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    stack.truncate_jobs()
    stack.flush_redis()
    extra = {"ASYNCH_RECOVER_BY_HEARTBEAT": "true" if mode == "heartbeat" else "false",
             "ASYNCH_LEASE_GRACE_SECONDS": GRACE, "ASYNCH_WORKER_METRICS_PORT": "0"}
    os.environ.update(extra)
    from app.config import load_settings, set_settings

    set_settings(load_settings())
    beat = stack.Proc(f"rec-beat-{mode}", [sys.executable, "-m", "app.cli", "beat"], extra)
    a = stack.celery_worker(f"rec-a-{mode}", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"], 40, extra)
    b = None
    try:
        p = Principal("bench", "user", None)
        ids = [jobs.submit(p, "rec", {"sleep_ms": 4000, "i": i}).row.id for i in range(JOBS)]
        deadline = time.monotonic() + 60
        while _count(1, ids) < JOBS and time.monotonic() < deadline:  # all 40 running on A
            time.sleep(0.2)
        running = _count(1, ids)
        os.killpg(a.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        b = stack.celery_worker(f"rec-b-{mode}", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"], JOBS, extra)
        started = time.monotonic() - t0
        again = None
        while _count(2, ids) < JOBS and time.monotonic() - t0 < 600:
            if again is None and _reclaimed(ids) == JOBS:
                again = time.monotonic() - t0
            time.sleep(0.25)
        took = time.monotonic() - t0
        again = took if again is None else again
        print(f"  {mode:9s}: {running} of {JOBS} jobs running on the killed node; node B ready after "
              f"{started:.1f} s; all claimed again "
              f"{again:.1f} s and all {_count(2, ids)} done {took:.1f} s after the SIGKILL", flush=True)
        return again, took
    finally:
        for proc in (b, a, beat):
            if proc is not None:
                proc.stop()


def main(parts: list[str]) -> dict:
    stack.fresh()

    mport = stack.free_port()
    model = stack.stub_model(mport)
    try:
        stack.create_model("rec", f"http://127.0.0.1:{mport}", timeout_seconds=10, retry_times=3,
                           max_concurrency=64, queue_limit=1000)
        out = {m: run(m, mport) for m in parts}
    finally:
        model.stop()
    if "heartbeat" in out and "lease" in out:
        (ha, hd), (la, ld) = out["heartbeat"], out["lease"]
        print(f"recovery: 40 jobs of a SIGKILLed node claimed again after {ha:.1f} s by heartbeat against "
              f"{la:.1f} s by lease alone (target <= 30 s); all done after {hd:.1f} s against {ld:.1f} s")
    return out


if __name__ == "__main__":
    main(os.environ.get("BENCH_RECOVERY_PARTS", "heartbeat,lease").split(","))
