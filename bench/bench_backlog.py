"""Flat cost under a deep backlog: the same measurements on an empty task
table and with 1,000,000 rows of which 100,000 are pending (their gate
slots and tenant A's dispatch queue in Redis, as admission leaves them),
printed side by side in one run with their ratio.

  admission   wrk POST /v1/models/deep/jobs, 32 connections (tenant B)
  status      wrk GET  /v1/models/deep/jobs/{id}, 32 connections
  dispatch    FINISH steps per second, each freeing a permit and dispatching
              the next job of the model (in-process, the Lua step workers run)
  metrics     GET /metrics/cluster (the cluster gauges), median and max of 20
  console     GET /v1/overview (the console's models page data) and
              GET /v1/jobs?limit=50 (its jobs page), median and max of 20

The API is `asynch api` (gevent, 2 workers).  Targets (issue "Performance,
second round"): admission, dispatch and status within 10% of empty; metrics
and console under 100 ms.

    PYTHONPATH=. python -m bench.bench_backlog      (BENCH_BACKLOG_ROWS, BENCH_BACKLOG_PENDING)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import psycopg2
import requests

from bench import stack
from bench.wrk import run_wrk

ROWS = int(os.environ.get("BENCH_BACKLOG_ROWS", "1000000"))
PENDING = int(os.environ.get("BENCH_BACKLOG_PENDING", "100000"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "8"))

# 900,000 finished rows of ten other models and 100,000 pending rows of "deep", tenant A.
SEED_SQL = """
INSERT INTO asynch_task (id, tenant_id, creator, model_name, biz_name, request_payload, request_hash, state,
    attempt, retry_count, result_location, result_content_type, result_size, created_at, enqueue_at, started_at,
    finished_at, deadline_at, updated_at)
SELECT 'job_' || lpad(to_hex(i), 24, '0'),
    CASE WHEN i <= %(pending)s THEN 'tenant-a' ELSE 'tenant-' || (i %% 50) END, '',
    CASE WHEN i <= %(pending)s THEN 'deep' ELSE 'model-' || (i %% 10) END, '', '{}', 'h',
    CASE WHEN i <= %(pending)s THEN 0 WHEN i %% 100 = 0 THEN 3 ELSE 2 END,
    CASE WHEN i <= %(pending)s THEN 0 ELSE 1 END, 0,
    CASE WHEN i <= %(pending)s THEN NULL ELSE 'file:seed/' || i END, 'application/json', 10,
    now() - (i %% 43200) * interval '1 minute', now() - (i %% 43200) * interval '1 minute',
    CASE WHEN i <= %(pending)s THEN NULL ELSE now() - (i %% 43200) * interval '1 minute' END,
    CASE WHEN i <= %(pending)s THEN NULL ELSE now() - (i %% 43200) * interval '1 minute' + interval '2 seconds' END,
    now() + interval '1 day', now() - (i %% 43200) * interval '1 minute'
FROM generate_series(1, %(rows)s) AS s(i)
"""


def _seed() -> float:
    from app.infra.redis import dispatch as rd
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    t0 = time.monotonic()
    conn = psycopg2.connect(stack.db_dsn())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(SEED_SQL, {"rows": ROWS, "pending": PENDING})
        for i in range(10):
            cur.execute("INSERT INTO asynch_models (model_name, base_url, created_at, updated_at) VALUES "
                        "(%s, 'http://127.0.0.1:9', now(), now()) ON CONFLICT DO NOTHING", (f"model-{i}",))
        # A table that grew to 1,000,000 rows over time has been vacuumed by
        # autovacuum many times; one loaded in a single statement has not,
        # its visibility map is empty and no index-only scan is possible.
        # VACUUM gives the steady state the benchmark means to measure.
        cur.execute("VACUUM ANALYZE asynch_task")
        # VACUUM marks a page all-visible only once the inserting commit is flushed: on a server with
        # synchronous_commit off (BENCH_OWN_SERVERS' throwaway one) the first pass can mark none, so
        # every index-only scan would read the heap.  Vacuum again until the map covers the table.
        for _ in range(10):
            cur.execute("SELECT relallvisible >= 0.99 * relpages FROM pg_class WHERE relname = 'asynch_task'")
            if cur.fetchone()[0]:
                break
            time.sleep(1)
            cur.execute("VACUUM asynch_task")
    conn.close()
    r = get_redis()
    ids = ["job_" + format(i, "x").zfill(24) for i in range(1, PENDING + 1)]
    now = time.time()
    for i in range(0, len(ids), 5000):
        chunk = ids[i:i + 5000]
        r.zadd(keys.gate("deep"), {j: now for j in chunk})
        r.zadd(keys.tenant_gate("deep", "tenant-a"), {j: now for j in chunk})
        # queued only: nothing is pulled until a slot asks (A's permits are the dispatch part's to use)
        rd.enqueue("deep", [("tenant-a", j, i + k, 0, "") for k, j in enumerate(chunk)])
    return time.monotonic() - t0


def _latency(url: str, headers: dict, n: int = 20) -> dict:
    took = []
    for _ in range(n):
        t0 = time.monotonic()
        r = requests.get(url, headers=headers, timeout=30)
        took.append((time.monotonic() - t0) * 1000)
        assert r.status_code == 200, (url, r.status_code, r.text[:200])
    return {"median_ms": statistics.median(took), "max_ms": max(took)}


def _dispatch_rate(steps: int = 2000) -> float:
    """FINISH steps/s on model "deep": tenant C's jobs, each finish frees the
    permit and pulls the ring's next job for the freed slot (the ring also
    holds A's deep queue when there is one)."""
    from app.infra.redis import dispatch as rd

    ids = [f"job_disp_{i:08d}" for i in range(steps + 1)]
    rd.enqueue("deep", [("tenant-c", j, i, 0, "") for i, j in enumerate(ids)], cap=1)
    held = rd.pull("deep", 1, 30.0, cap=1).pulled
    t0 = time.monotonic()
    for _ in range(steps):
        _, step = rd.finish("deep", [(t, j, None, None, None) for t, j, _a in held], cap=1, most=1, lease=30.0)
        held = step.pulled
    return steps / (time.monotonic() - t0)


def measure(base: str, key_b: str, admin: str, job_id: str) -> dict:
    body = json.dumps({"prompt": "hello"})
    out = {}
    out["admission_rps"] = run_wrk(f"{base}/v1/models/deep/jobs", body, {"Authorization": f"Bearer {key_b}"},
                                   seconds=SECONDS)["rps"]
    st = run_wrk(f"{base}/v1/models/deep/jobs/{job_id}", "", {"Authorization": f"Bearer {key_b}"},
                 seconds=SECONDS)
    out["status_rps"] = st["rps"]
    out["dispatch_steps_per_s"] = _dispatch_rate()
    out["metrics_cluster"] = _latency(f"{base}/metrics/cluster", {})
    out["overview"] = _latency(f"{base}/v1/overview", {"Authorization": f"Bearer {admin}"})
    out["jobs_page"] = _latency(f"{base}/v1/jobs?limit=50", {"Authorization": f"Bearer {admin}"})
    return out


def main() -> dict:
    stack.fresh()
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal, create_key

    stack.create_model("deep", "http://127.0.0.1:9", queue_limit=1_000_000, tenant_queue_limit=1_000_000, max_concurrency=4)
    key_b = create_key("tenant-b", "user")[0]
    admin = create_key("ops", "admin")[0]
    port = stack.free_port()
    from bench.bench_admission import _ours

    api = _ours("backlog-api", port, "gevent")
    base = f"http://127.0.0.1:{port}"
    try:
        poll_job = jobs.submit(Principal("tenant-b", "user", None), "deep", {"p": 1}).row.id
        empty = measure(base, key_b, admin, poll_job)
        stack.truncate_jobs()
        stack.flush_redis()
        seeded = _seed()
        poll_job = jobs.submit(Principal("tenant-b", "user", None), "deep", {"p": 1}).row.id
        deep = measure(base, key_b, admin, poll_job)
    finally:
        api.stop()
    print(f"backlog: seeded {ROWS:,} rows ({PENDING:,} pending, their slots and queue) in {seeded:.0f} s")
    print(f"{'':22s} {'empty':>12s} {'deep':>12s} {'ratio':>7s}")
    for k in ("admission_rps", "status_rps", "dispatch_steps_per_s"):
        print(f"{k:22s} {empty[k]:12.1f} {deep[k]:12.1f} {deep[k] / empty[k]:7.2f}   (target >= 0.90)")
    for k in ("metrics_cluster", "overview", "jobs_page"):
        print(f"{k + ' ms (med/max)':22s} {empty[k]['median_ms']:5.1f}/{empty[k]['max_ms']:5.1f} "
              f"{deep[k]['median_ms']:5.1f}/{deep[k]['max_ms']:5.1f}   (target < 100 ms)")
    return {"empty": empty, "deep": deep}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
