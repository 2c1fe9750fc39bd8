"""Queue estimates, measured: each job's estimated start (the 202's
``estimated_start_at``, app/jobs/estimates.py) against its real start (the
claim's ``started_at``), over a mixed load, beside a baseline -- the naive
estimate a caller could make alone: now + (gate depth at submit /
max_concurrency) x expected_seconds, FIFO, one line for every tenant.

The load (model max_concurrency 2, expected_seconds 1 while the jobs really
take 0.2-0.8 s; one worker node, 4 processes): tenant A submits 40 jobs at
once, a quarter of them at priority 9; tenant B (weight 2) submits 12 jobs,
one every 0.4 s, meanwhile.  Errors are seconds from the submit, |estimate -
real|, and relative to the real wait (+1 s, the acceptance bound's slack).

Usage: PYTHONPATH=. python -m bench.bench_estimates
(BENCH_PG_ADMIN / BENCH_REDIS as the other benchmarks; unset: it starts its
own embedded PostgreSQL and Valkey in a temporary directory.)
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path


def _own_servers():
    from app.cli.engines import Postgres, Valkey, free_port

    d = Path(tempfile.mkdtemp(prefix="asynch-bench-est-"))
    pg = Postgres(d / "pg", free_port(), "bench-pg", durable=False).init().start()
    rv = Valkey(d / "valkey", free_port(), "bench-valkey", durable=False).start()
    os.environ["BENCH_PG_ADMIN"] = pg.url(driver="postgresql")
    os.environ["BENCH_REDIS"] = rv.url().rsplit("/", 1)[0]
    return [rv, pg]


def _at(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def main() -> None:
    servers = [] if os.environ.get("BENCH_PG_ADMIN") else _own_servers()
    from bench import stack  # reads BENCH_* at import

    stack.fresh(ASYNCH_WORKER_METRICS_PORT="0")
    import requests

    from app.infra.redis import keys
    from app.infra.redis.client import get_redis
    from app.tenancy.keys import create_key

    mport, port = stack.free_port(), stack.free_port()
    procs = [stack.stub_model(mport)]
    try:
        stack.create_model("est", f"http://127.0.0.1:{mport}", route="/echo", max_concurrency=2, queue_limit=10_000,
                           expected_seconds=1)
        a, b = create_key("tenant-a", "user")[0], create_key("tenant-b", "user")[0]
        admin = create_key("ops", "admin")[0]
        api = stack.Proc("est-api", [sys.executable, "-m", "app.cli", "api", "--bind", f"127.0.0.1:{port}",
                                     "--workers", "2"])
        procs.append(api)
        api.wait_for(r"Booting worker|Listening at", 60)
        stack._wait_http(port)
        base = f"http://127.0.0.1:{port}"
        requests.patch(f"{base}/v1/tenants/tenant-b/limits", json={"weight": 2},
                       headers={"Authorization": f"Bearer {admin}"}, timeout=10).raise_for_status()
        procs.append(stack.celery_worker("est-w", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"], 4))
        rng = random.Random(24)
        seen: list[dict] = []
        lock = threading.Lock()

        def submit(key: str, priority: int) -> None:
            depth = get_redis().zcard(keys.gate("est"))
            t0 = time.time()
            r = requests.post(f"{base}/v1/models/est/jobs", json={"sleep_ms": rng.randint(200, 800)},
                              headers={"Authorization": f"Bearer {key}", "X-Priority": str(priority)}, timeout=30)
            r.raise_for_status()
            body = r.json()
            with lock:
                seen.append({"id": body["job_id"], "t0": t0, "est": _at(body["estimated_start_at"]) - t0,
                             "naive": depth / 2 * 1.0, "pos": body["queue_position"]})

        def tenant_b() -> None:
            for _ in range(12):
                submit(b, 5)
                time.sleep(0.4)

        tb = threading.Thread(target=tenant_b)
        tb.start()
        for i in range(40):
            submit(a, 9 if i % 4 == 3 else 5)
        tb.join()
        from sqlalchemy import select

        from app.infra.db import get_engine
        from app.infra.tables import tasks

        deadline = time.time() + 120
        while time.time() < deadline:
            with get_engine().connect() as c:
                rows = {r.id: r for r in c.execute(select(tasks.c.id, tasks.c.state, tasks.c.started_at))}
            if all(rows[j["id"]].state == 2 for j in seen):
                break
            time.sleep(0.5)
        real = {j: r.started_at.timestamp() for j, r in rows.items() if r.started_at is not None}
        for name in ("est", "naive"):
            errs = sorted(abs(j[name] - (real[j["id"]] - j["t0"])) for j in seen if j["id"] in real)
            rel = sorted(abs(j[name] - (real[j["id"]] - j["t0"])) / ((real[j["id"]] - j["t0"]) + 1)
                         for j in seen if j["id"] in real)
            within = sum(1 for j in seen if j["id"] in real
                         and abs(j[name] - (real[j["id"]] - j["t0"])) <= 0.5 * (real[j["id"]] - j["t0"]) + 1)
            label = "estimated_start_at" if name == "est" else "naive baseline   "
            print(f"{label}: |error| p50 {stack.pct(errs, 50):.2f} s, p90 {stack.pct(errs, 90):.2f} s, "
                  f"max {errs[-1]:.2f} s | relative p50 {stack.pct(rel, 50):.2f}, p90 {stack.pct(rel, 90):.2f} | "
                  f"within 50% (+1 s) of the real start: {within}/{len(errs)}")
        waits = sorted(real[j["id"]] - j["t0"] for j in seen if j["id"] in real)
        print(f"jobs: {len(seen)} (A 40, B 12), real waits p50 {stack.pct(waits, 50):.2f} s, max {waits[-1]:.2f} s")
    finally:
        for p in reversed(procs):
            p.stop()
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
