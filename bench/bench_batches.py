"""Batches (issue 33), measured beside their baselines in one run:

1. A BENCH_BATCH_LINES-line batch (default 50,000): time from create (the POST) to every line admitted as a job,
   with no worker running (admission alone), and the create request's own time.
2. Drain rate (jobs done per second over BENCH_DRAIN_SECONDS, default 20) of that batch with BENCH_WORKERS worker
   processes (default 2) against the stub model -- beside the same number of jobs submitted through
   ``jobs:batch`` (1,000 per request) and drained by the same workers: the baseline.
3. Another tenant's single job during the batch drain: its wait (created -> started), median of 15, beside the same
   job's wait on an idle model (goal: at most 1.5x) and during the drain of the jobs:batch jobs.
4. The API's peak RSS (its gunicorn worker processes) while a file of each of BENCH_UPLOAD_MB (default 200,1024)
   MB is uploaded through /v1/files (streamed), beside its RSS before the upload (goal: at most 150 MB; the 1 GB
   file's peak the same as the 200 MB one's: flat).

The batches pass runs in this process in a loop (what beat's asynch.batches does every second).  Own servers:
BENCH_REDIS (start one: redis-server --port 6390 --save '' --daemonize yes) and a database of its own
(asynch_bench_batches) on BENCH_PG_ADMIN.

Usage: BENCH_REDIS=redis://127.0.0.1:6390 PYTHONPATH=. python -m bench.bench_batches
"""
from __future__ import annotations

import io
import json
import os
import statistics
import threading
import time

import requests

from bench import stack

stack.DB_NAME = "asynch_bench_batches"
LINES = int(os.environ.get("BENCH_BATCH_LINES", "50000"))
DRAIN_SECONDS = float(os.environ.get("BENCH_DRAIN_SECONDS", "20"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
UPLOAD_MB = [int(x) for x in os.environ.get("BENCH_UPLOAD_MB", "200,1024").split(",")]
ENV = {"ASYNCH_STORAGE_URL": f"file://{stack.ROOT}/bench/logs/batches-files", "ASYNCH_LOG_LEVEL": "WARNING",
       "ASYNCH_INLINE_RESULT_BYTES": "4096", "ASYNCH_FILES_MAX_BYTES": str(max(*UPLOAD_MB, 1024) << 20)}


def _count(where: str) -> int:
    from sqlalchemy import text

    from app.infra.db import transaction

    with transaction() as conn:
        return conn.execute(text(f"SELECT count(*) FROM asynch_task WHERE {where}")).scalar_one()


def _pass_loop(stop: threading.Event) -> None:
    from app.batches import progress

    while not stop.is_set():
        try:
            progress.advance_all()
        except Exception as exc:  # noqa: BLE001 - a bench keeps going; the figure shows it
            print("pass failed:", exc)
        stop.wait(0.2)


def _jsonl(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "bench", "prompt": f"line {i}"}}) + "\n"
                   for i in range(n)).encode()


def _wait_for(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.1)
    raise RuntimeError(f"timed out: {what}")


def _drain_rate(seconds: float) -> float:
    d0, t0 = _count("state IN (2, 4)"), time.monotonic()
    time.sleep(seconds)
    return (_count("state IN (2, 4)") - d0) / (time.monotonic() - t0)


def _other_wait(api: str, key: str, n: int = 15) -> float:
    from sqlalchemy import text

    from app.infra.db import transaction

    waits = []
    for i in range(n):
        r = requests.post(f"{api}/v1/models/bench/jobs", json={"prompt": f"other {i}"},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)
        job = r.json()["job_id"]

        def started():
            with transaction() as conn:
                return conn.execute(text("SELECT started_at - created_at FROM asynch_task WHERE id = :i AND "
                                         "started_at IS NOT NULL"), {"i": job}).scalar()
        waited = None
        t0 = time.monotonic()
        while waited is None and time.monotonic() - t0 < 60:
            waited = started()
            time.sleep(0.02)
        waits.append(waited.total_seconds())
        time.sleep(0.3)
    return statistics.median(waits)


def _upload_rss(api, c, mb: int) -> None:
    before = max(api.rss_mb())
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], max(api.rss_mb() or [0]))
            time.sleep(0.02)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    path = stack.LOGS / "upload.bin"
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(mb):
            f.write(block)
    t0 = time.monotonic()
    up = c.upload_file(path, "user_data")
    took = time.monotonic() - t0
    done.set()
    t.join()
    path.unlink()
    c.delete_file(up["id"])
    print(f"upload of {mb} MB in {took:.1f} s ({up['bytes'] / took / 1e6:.0f} MB/s): API RSS {before:.0f} MB "
          f"before, peak {peak[0]:.0f} MB during (goal <= 150 MB)")


def main() -> None:
    stack.fresh(**ENV)
    port, model_port = stack.free_port(), stack.free_port()
    stub = stack.stub_model(model_port)
    api = stack.gunicorn("batches-api", "app.wsgi:app", port, workers=1, threads=8, extra_env=ENV)
    base = f"http://127.0.0.1:{port}"
    stack.create_model("bench", f"http://127.0.0.1:{model_port}", queue_limit=4 * LINES, max_concurrency=64)
    key, other = stack.create_key("bulk"), stack.create_key("other")
    from model_asynch import Client

    c = Client(base, key, timeout=600)
    stop = threading.Event()
    passer = threading.Thread(target=_pass_loop, args=(stop,), daemon=True)
    workers = None
    try:
        # 1. create -> all admitted (no workers: admission alone)
        fid = c.upload_file(io.BytesIO(_jsonl(LINES)), "batch", filename="bench.jsonl")["id"]
        t0 = time.monotonic()
        b = c.create_batch(fid, "/v1/completions", "24h")
        create_s = time.monotonic() - t0
        passer.start()
        admitted_s = create_s + _wait_for(lambda: _count("true") >= LINES, 1800, "all lines admitted")
        print(f"batch of {LINES}: create answered in {create_s:.2f} s ({b['status']}); all admitted "
              f"{admitted_s:.1f} s after create ({LINES / admitted_s:.0f} lines/s)")

        # 2 + 3. idle wait first (workers up, nothing queued but the batch is held back: measured before it runs)
        workers = stack.celery_worker("batches-w", "workers.celery_app", "asynch-bench", WORKERS, extra_env=ENV)
        # The batch's jobs are all pending now: the "idle" figure needs an idle model, so measure it after the
        # drain below; during the drain, the other tenant's wait:
        time.sleep(2)
        during = _other_wait(base, other)
        batch_rate = _drain_rate(DRAIN_SECONDS)
        print(f"drain of the batch: {batch_rate:.0f} jobs/s over {DRAIN_SECONDS:.0f} s ({WORKERS} worker processes)")
        stop.set()
        passer.join(30)
        workers.stop()
        from app.jobs import service as jobs  # noqa: F401 (settings loaded)
        stack.truncate_jobs()
        stack.flush_redis()

        # baseline: the same number of jobs through jobs:batch
        t0 = time.monotonic()
        for i in range(0, LINES, 1000):
            r = requests.post(f"{base}/v1/models/bench/jobs:batch", headers={"Authorization": f"Bearer {key}"},
                              json={"jobs": [{"payload": {"prompt": f"line {j}"}} for j in range(i, min(LINES, i + 1000))]},
                              timeout=120)
            assert r.status_code == 207, r.text
        submit_s = time.monotonic() - t0
        print(f"baseline jobs:batch: {LINES} jobs submitted in {submit_s:.1f} s ({LINES / submit_s:.0f} jobs/s)")
        workers = stack.celery_worker("batches-w2", "workers.celery_app", "asynch-bench", WORKERS, extra_env=ENV)
        time.sleep(2)
        during_base = _other_wait(base, other)
        base_rate = _drain_rate(DRAIN_SECONDS)
        print(f"drain of jobs:batch jobs: {base_rate:.0f} jobs/s over {DRAIN_SECONDS:.0f} s")
        stack.truncate_jobs()
        stack.flush_redis()
        time.sleep(2)
        idle = _other_wait(base, other)
        print(f"another tenant's single job: waited {during * 1000:.0f} ms during the batch vs {idle * 1000:.0f} ms "
              f"idle ({during / max(idle, 1e-6):.2f}x; goal <= 1.5x); {during_base * 1000:.0f} ms during the same "
              f"number of jobs:batch jobs ({during / max(during_base, 1e-6):.2f}x)")

        # 4. the API's RSS while large files are uploaded
        for mb in UPLOAD_MB:
            _upload_rss(api, c, mb)
    finally:
        stop.set()
        for p in (workers, api, stub):
            if p is not None:
                p.stop()


if __name__ == "__main__":
    main()
