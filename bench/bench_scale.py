"""Scale: the hot queries against 1,000,000 rows in asynch_task.

Seeds the table with SQL (generate_series), then runs every hot operation
through the real service code while capturing the SQL it sends, and prints
EXPLAIN (ANALYZE) of each captured statement, flagging any sequential scan
of asynch_task.  Also times getTaskBatch(1,000 ids) over 11 fresh id sets (median) and a
cleanup pass over 100,000 expired claimed jobs with their result files.
"""
from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager

import psycopg2
from sqlalchemy import event

from bench import stack

ROWS = int(os.environ.get("BENCH_SCALE_ROWS", "1000000"))
EXPIRED = int(os.environ.get("BENCH_SCALE_EXPIRED", "100000"))

SEED_SQL = """
INSERT INTO asynch_task (id, tenant_id, creator, model_name, biz_name, request_payload, request_hash, state,
    attempt, retry_count, result_location, result_content_type, result_size, created_at, enqueue_at, started_at,
    finished_at, claimed_at, expire_at, deadline_at, updated_at)
SELECT 'job_' || lpad(to_hex(i), 24, '0'), 'tenant-' || (i %% 50), '', 'model-' || (i %% 10), 'biz', '{}', 'h',
    CASE WHEN i <= %(expired)s THEN 4 WHEN i %% 100 = 0 THEN 3 WHEN i %% 7 = 0 THEN 4 ELSE 2 END,
    1, 0, 'file:seed/' || i, 'application/json', 10,
    now() - (i %% 43200) * interval '1 minute', now() - (i %% 43200) * interval '1 minute',
    now() - (i %% 43200) * interval '1 minute', now() - (i %% 43200) * interval '1 minute' + interval '2 seconds',
    CASE WHEN i <= %(expired)s OR i %% 7 = 0 THEN now() - interval '1 day' END,
    CASE WHEN i <= %(expired)s THEN now() - interval '1 hour' WHEN i %% 7 = 0 THEN now() + interval '1 day' END,
    now() + interval '1 day', now() - (i %% 43200) * interval '1 minute'
FROM generate_series(1, %(rows)s) AS s(i)
"""


def seed_objects() -> float:
    """The expired jobs' result files, so cleanup deletes real objects."""
    from app.infra.storage import get_storage

    t0 = time.monotonic()
    root = get_storage().root / "seed"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, EXPIRED + 1):
        (root / str(i)).write_bytes(b'{"ok":1}\n')
    return time.monotonic() - t0


def seed() -> float:
    t0 = time.monotonic()
    conn = psycopg2.connect(stack.db_dsn())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(SEED_SQL, {"rows": ROWS, "expired": EXPIRED})
        for i in range(10):
            cur.execute("INSERT INTO asynch_models (model_name, base_url, created_at, updated_at, auto_clean_seconds)"
                        " VALUES (%s, 'http://127.0.0.1:9', now(), now(), 3600) ON CONFLICT DO NOTHING",
                        (f"model-{i}",))
        cur.execute("ANALYZE asynch_task")
    conn.close()
    return time.monotonic() - t0


@contextmanager
def capture(*engines):
    """Every statement sent through these engines (both pools: transactions
    and single statements)."""
    seen: list[tuple[str, object]] = []

    def before(_conn, _cur, statement, parameters, _ctx, _many):
        seen.append((statement, parameters))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", before)


def explain(engine, statement: str, params) -> str:
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("BEGIN")
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + statement, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("ROLLBACK")  # EXPLAIN ANALYZE executes writes: never keep them
        return plan
    finally:
        raw.close()


def hot_operations():
    """(name, callable) pairs, each calling the real service code."""
    from app.jobs import service as jobs
    from app.jobs.requests import JobListQuery
    from app.maintenance import passes, recovery
    from app.tenancy.keys import Principal

    p = Principal("tenant-7", "user", None)
    ops = [
        ("status", lambda: jobs.get_job(p, "job_" + "7".zfill(24))),
        ("list tenant jobs", lambda: jobs.list_jobs(p, JobListQuery(limit=50))),
        ("list tenant+model", lambda: jobs.list_jobs(p, JobListQuery(limit=50), model_name="model-7")),
        ("retry due", passes.retry_due),
        ("recover leases", recovery.recover_expired_leases),
        ("time out overdue", recovery.time_out_overdue),
        ("republish stale pending", recovery.republish_stale_pending),
        ("reconcile gates", recovery.reconcile_gates),
    ]
    from app.jobs import service

    ids = ["job_" + format(i, "x").zfill(24) for i in range(EXPIRED + 1, EXPIRED + 1001)]
    ops.append(("getTaskBatch 1000", lambda: service.get_task_batch(Principal("admin", "admin", None), ids)))
    return ops


def timed_batches(n: int = 11) -> dict:
    """getTaskBatch over n fresh sets of 1,000 ids (each set ~85% done rows,
    the rest failed or already claimed): every call claims for real."""
    import statistics

    from app.jobs import service
    from app.tenancy.keys import Principal

    admin = Principal("admin", "admin", None)
    took, claimed = [], 0
    for k in range(1, n + 1):
        start = EXPIRED + 1 + k * 1000
        ids = ["job_" + format(i, "x").zfill(24) for i in range(start, start + 1000)]
        t0 = time.monotonic()
        out = service.get_task_batch(admin, ids)
        took.append((time.monotonic() - t0) * 1000)
        claimed += sum(1 for d in out if d.claimed)
    med = statistics.median(took)
    print(f"\ngetTaskBatch(1,000 ids) x{n}, fresh ids each: median {med:.1f} ms, "
          f"min {min(took):.1f}, max {max(took):.1f} ({claimed / n:.0f} claimed per call)")
    return {"median_ms": med, "min_ms": min(took), "max_ms": max(took), "calls": n}


def timed_cleanup() -> dict:
    """A full cleanup pass over the EXPIRED claimed jobs (retention of other
    terminal jobs pushed out of reach so only those qualify)."""
    from app.config import get_settings, set_settings
    from app.maintenance import passes as maintenance

    set_settings(get_settings().with_overrides(failed_retention_seconds=10 ** 8, done_retention_seconds=10 ** 8))
    t0 = time.monotonic()
    rep = maintenance.cleanup()
    took = time.monotonic() - t0
    deleted = rep.details["claimed"]
    from app.infra.storage import get_storage

    left = sum(1 for _ in (get_storage().root / "seed").iterdir())
    print(f"cleanup report: {rep.as_dict()}; seeded objects left on disk: {left}")
    print(f"\ncleanup: {deleted} expired claimed jobs (and their objects) deleted in {took:.1f} s "
          f"= {deleted / took:.0f} jobs/s")
    return {"deleted": deleted, "seconds": took, "jobs_per_s": deleted / took}


def main() -> dict:
    stack.fresh()

    from app.infra.db import get_engine

    took = seed()
    print(f"seeded {ROWS} rows in {took:.1f} s")
    print(f"wrote {EXPIRED} result objects in {seed_objects():.1f} s")
    engine = get_engine()
    out = {"rows": ROWS, "seed_s": took, "ops": {}}
    for name, fn in hot_operations():
        with capture(engine, get_engine(autocommit=True)) as seen:
            t0 = time.monotonic()
            fn()
            ms = (time.monotonic() - t0) * 1000
        plans = []
        for stmt, params in seen:
            if not re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT)", stmt, re.I) or "asynch_task" not in stmt:
                continue
            plans.append(explain(engine, stmt, params))
        seq = any(re.search(r"Seq Scan on asynch_task", pl) for pl in plans)
        out["ops"][name] = {"ms": ms, "statements": len(plans), "seq_scan": seq}
        print(f"\n== {name}: {ms:.1f} ms, {len(plans)} statements on asynch_task"
              f"{'  !! SEQUENTIAL SCAN' if seq else ''}")
        for pl in plans:
            print("   " + pl.replace("\n", "\n   "))
    out["get_task_batch"] = timed_batches()
    out["cleanup"] = timed_cleanup()
    bad = [k for k, v in out["ops"].items() if v["seq_scan"]]
    print(f"\nscale: {len(out['ops'])} hot operations at {ROWS} rows; sequential scans: {bad or 'none'}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
