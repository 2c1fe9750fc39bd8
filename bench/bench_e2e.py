"""End to end: jobs/s from a filled queue to done with an instant stub model,
versus bare Celery tasks making the same HTTP call, same worker settings
(prefork -c 2, acks_late, prefetch 1).  Both queues are filled while no
worker runs; the clock starts when the worker reports ready and stops when
the last job is done.  Medians of 3.

``BENCH_E2E_GROUPS`` (default "8", the product's ASYNCH_DISPATCH_GROUP): the most jobs one pull takes,
interleaved in each run ("1,4,8": one job per pull, beside pulls of up to 4 and 8).

``BENCH_E2E_LIVE=1``: the worker runs first and the jobs arrive while it drains (one submission at a
time from 8 threads, the bare tasks' ``.delay()`` from 8 threads too): a backlog that builds up one job
at a time, the shape an API under sustained overload gives.  The clock runs from the first submission
to the last job done.  ``BENCH_E2E_RATE=R`` paces the submissions at R a second (open loop), so
a rate between the single-job and the grouped capacity shows whether the pulls group.

Each run prints how ours grouped: the jobs of one claim statement share its ``started_at`` (the
statement's one clock reading), so the rows count the claims; the jobs of one done statement share its
``finished_at``, so they count the writer's statements too."""
from __future__ import annotations

import sys
import time

import redis
from sqlalchemy import func, select

from bench import stack

N = int(__import__("os").environ.get("BENCH_E2E_JOBS", "2000"))
RUNS = int(__import__("os").environ.get("BENCH_RUNS", "3"))
GROUPS = [int(g) for g in __import__("os").environ.get("BENCH_E2E_GROUPS", "8").split(",")]
LIVE = __import__("os").environ.get("BENCH_E2E_LIVE", "") == "1"
RATE = float(__import__("os").environ.get("BENCH_E2E_RATE", "0"))  # live: submissions/s, paced (0: at once)


def _fill_ours(n: int, model: str = "bench-echo") -> None:
    from concurrent.futures import ThreadPoolExecutor

    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    p = Principal("bench", "user", None)
    from app.jobs import handoff

    with ThreadPoolExecutor(8) as ex:
        list(_paced(ex, lambda i: jobs.submit(p, model, {"i": i}), n))
    handoff.flush()  # every message on the broker before the clock starts


def _paced(ex, fn, n: int):
    """fn(0..n-1) on ex: all at once, or (live with BENCH_E2E_RATE) one every 1/RATE s, open loop."""
    if not (LIVE and RATE):
        return ex.map(fn, range(n))
    t0, futures = time.monotonic(), []
    for i in range(n):
        time.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
        futures.append(ex.submit(fn, i))
    return [f.result() for f in futures]


def _groups_ours() -> str:
    """How the drain grouped: claim statements by how many jobs each claimed."""
    from collections import Counter

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        per_claim = conn.execute(select(func.count(), func.count(tasks.c.finished_at.distinct())).where(
            tasks.c.started_at.is_not(None)).group_by(tasks.c.started_at)).all()
    sizes = Counter(n for n, _ in per_claim)
    claims = sum(sizes.values())
    mean = sum(k * v for k, v in sizes.items()) / max(1, claims)
    writes = sum(d for _, d in per_claim)  # a done statement's rows share its finished_at
    return (f"{claims} claims, {mean:.1f} jobs each (" +
            ", ".join(f"{v}x{k}" for k, v in sorted(sizes.items(), reverse=True)[:4]) +
            f"), {writes / max(1, claims):.1f} done statements per claim")


def _delay_naive(url: str, n: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from bench.naive import http_call

    with ThreadPoolExecutor(8) as ex:
        list(_paced(ex, lambda j: http_call.delay(url, {"i": j}), n))


def _done_ours() -> int:
    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.state == 2)).scalar_one()


RSS: dict[str, float] = {}


def _drain(start_worker, done, n: int, fill=None) -> float:
    """jobs/s until ``done()`` reaches n: from the worker's start (a filled queue), or, with ``fill`` (live),
    from the first submission, the worker already running."""
    w = start_worker()
    try:
        t0 = time.monotonic()
        if fill is not None:
            fill()
        while done() < n:
            if time.monotonic() - t0 > 600:
                raise RuntimeError("drain did not finish")
            time.sleep(0.02)
        rate = n / (time.monotonic() - t0)
        RSS[w.name] = max(w.rss_mb() or [0.0])  # largest process of the worker, after the run
        return rate
    finally:
        w.stop()


def main() -> dict:
    stack.fresh()

    model_port = stack.free_port()
    model = stack.stub_model(model_port)
    model_url = f"http://127.0.0.1:{model_port}"
    stack.create_model("bench-echo", model_url)
    counter = stack.redis_db(stack.COUNTER_DB)
    res = {"naive": [], **{f"ours-{g}": [] for g in GROUPS}}
    try:
        for i in range(RUNS):
            line = []
            for g in GROUPS:
                from app.config import get_settings, set_settings

                set_settings(get_settings().with_overrides(dispatch_group=g))  # the fill's dispatch publishes
                stack.truncate_jobs()
                stack.flush_redis()

                def worker(g=g):
                    return stack.celery_worker("worker", "workers.celery_app", "asynch-bench",
                                               extra_env={"ASYNCH_DISPATCH_GROUP": str(g)})
                if not LIVE:
                    _fill_ours(N)
                rate = _drain(worker, _done_ours, N, fill=(lambda: _fill_ours(N)) if LIVE else None)
                res[f"ours-{g}"].append(rate)
                line.append(f"ours (groups of {g}) {rate:.0f} jobs/s [{_groups_ours()}]")

            def naive_worker():
                return stack.celery_worker("naive-worker", "bench.naive", "naive")
            naive_done = lambda: int(counter.get("naive:done") or 0)  # noqa: E731
            fill_naive = lambda: _delay_naive(model_url + "/bench", N)  # noqa: E731
            if not LIVE:
                fill_naive()
            naive = _drain(naive_worker, naive_done, N, fill=fill_naive if LIVE else None)
            res["naive"].append(naive)
            print(f"  run {i + 1}: {', '.join(line)}, bare Celery HTTP task {naive:.0f} tasks/s", flush=True)
    finally:
        model.stop()
    naive = stack.median(res["naive"])
    summary = {"naive_tasks_s": naive, "worker_rss_mb": RSS.get("worker")}
    for g in GROUPS:
        summary[f"ours_jobs_s_group_{g}"] = stack.median(res[f"ours-{g}"])
        print(f"end to end ({N} jobs{', live' if LIVE else ''}), groups of {g}: ours {summary[f'ours_jobs_s_group_{g}']:.0f} jobs/s | bare "
              f"Celery HTTP task {naive:.0f} tasks/s | ratio {summary[f'ours_jobs_s_group_{g}'] / naive:.2f}x")
    summary["ours_jobs_s"] = summary[f"ours_jobs_s_group_{GROUPS[-1]}"]
    summary["ratio"] = summary["ours_jobs_s"] / naive
    print(f"worker RSS max {summary['worker_rss_mb']:.0f} MB")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
