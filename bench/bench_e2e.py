"""End to end: jobs/s from a filled queue to done with an instant stub model,
versus bare Celery tasks making the same HTTP call, same worker settings
(prefork -c 2, acks_late, prefetch 1).  Both queues are filled while no
worker runs; the clock starts when the worker reports ready and stops when
the last job is done.  Medians of 3.

``BENCH_E2E_GROUPS`` (default "8", the product's ASYNCH_DISPATCH_GROUP): the group sizes ours runs at,
interleaved in each run ("1,4,8": one job per message as before run_jobs, beside groups of 4 and 8)."""
from __future__ import annotations

import sys
import time

import redis
from sqlalchemy import func, select

from bench import stack

N = int(__import__("os").environ.get("BENCH_E2E_JOBS", "2000"))
RUNS = int(__import__("os").environ.get("BENCH_RUNS", "3"))
GROUPS = [int(g) for g in __import__("os").environ.get("BENCH_E2E_GROUPS", "8").split(",")]


def _fill_ours(n: int, model: str = "bench-echo") -> None:
    from concurrent.futures import ThreadPoolExecutor

    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    p = Principal("bench", "user", None)
    from app.jobs import outbox

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: jobs.submit(p, model, {"i": i}), range(n)))
    outbox.flush()  # every message on the broker before the clock starts


def _done_ours() -> int:
    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.state == 2)).scalar_one()


RSS: dict[str, float] = {}


def _drain(start_worker, done, n: int) -> float:
    w = start_worker()
    t0 = time.monotonic()
    try:
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
                _fill_ours(N)
                rate = _drain(lambda g=g: stack.celery_worker("worker", "workers.celery_app", "asynch-bench",
                                                              extra_env={"ASYNCH_DISPATCH_GROUP": str(g)}),
                              _done_ours, N)
                res[f"ours-{g}"].append(rate)
                line.append(f"ours (groups of {g}) {rate:.0f} jobs/s")

            from bench.naive import http_call

            for j in range(N):
                http_call.delay(model_url + "/bench", {"i": j})
            naive = _drain(lambda: stack.celery_worker("naive-worker", "bench.naive", "naive"),
                           lambda: int(counter.get("naive:done") or 0), N)
            res["naive"].append(naive)
            print(f"  run {i + 1}: {', '.join(line)}, bare Celery HTTP task {naive:.0f} tasks/s", flush=True)
    finally:
        model.stop()
    naive = stack.median(res["naive"])
    summary = {"naive_tasks_s": naive, "worker_rss_mb": RSS.get("worker")}
    for g in GROUPS:
        summary[f"ours_jobs_s_group_{g}"] = stack.median(res[f"ours-{g}"])
        print(f"end to end ({N} jobs), groups of {g}: ours {summary[f'ours_jobs_s_group_{g}']:.0f} jobs/s | bare "
              f"Celery HTTP task {naive:.0f} tasks/s | ratio {summary[f'ours_jobs_s_group_{g}'] / naive:.2f}x")
    summary["ours_jobs_s"] = summary[f"ours_jobs_s_group_{GROUPS[-1]}"]
    summary["ratio"] = summary["ours_jobs_s"] / naive
    print(f"worker RSS max {summary['worker_rss_mb']:.0f} MB")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
