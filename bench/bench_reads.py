"""Operator reads at depth: every read the console's pages and the cluster
scrape make, timed on an empty task table and then with bench_backlog's
1,000,000 rows of which 100,000 are pending (their gate slots and tenant A's
dispatch queue in Redis, as admission leaves them), side by side in one run.

  GET /metrics/cluster, /v1/overview, /v1/workers, /v1/maintenance/state,
      /v1/tenants, /v1/tenants/tenant-a/state      median and max of 20 each

The API is `asynch api` (gevent, 2 workers), as in bench_backlog.  Target
(issue 25, goal 4): each at most 20 ms median and 50 ms max at depth.

    PYTHONPATH=. python -m bench.bench_reads      (BENCH_BACKLOG_ROWS, BENCH_BACKLOG_PENDING)

BENCH_PG_ADMIN and BENCH_REDIS name the servers (bench/stack.py); BENCH_OWN_SERVERS=1
starts a throwaway PostgreSQL and Valkey on free ports instead (app/cli/engines.py).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bench import stack

ROUTES = {"metrics_cluster": "/metrics/cluster", "overview": "/v1/overview", "workers": "/v1/workers",
          "maintenance_state": "/v1/maintenance/state", "tenants": "/v1/tenants",
          "tenant_state": "/v1/tenants/tenant-a/state"}
TARGET_MEDIAN_MS, TARGET_MAX_MS = 20.0, 50.0


def measure(base: str, admin: str) -> dict:
    from bench.bench_backlog import _latency

    # One warm-up request per route: the first hit of a gunicorn worker loads its caches.
    out = {}
    for name, path in ROUTES.items():
        headers = {} if path.startswith("/metrics") else {"Authorization": f"Bearer {admin}"}
        _latency(base + path, headers, n=2)
        out[name] = _latency(base + path, headers)
    return out


def run() -> dict:
    stack.fresh()
    from app.tenancy.keys import create_key
    from bench.bench_admission import _ours
    from bench.bench_backlog import PENDING, ROWS, _seed

    stack.create_model("deep", "http://127.0.0.1:9", queue_limit=1_000_000, tenant_queue_limit=1_000_000,
                       max_concurrency=4)
    create_key("tenant-a", "user")
    admin = create_key("ops", "admin")[0]
    port = stack.free_port()
    api = _ours("reads-api", port, "gevent")
    base = f"http://127.0.0.1:{port}"
    try:
        empty = measure(base, admin)
        seeded = _seed()
        deep = measure(base, admin)
    finally:
        api.stop()
    print(f"reads: seeded {ROWS:,} rows ({PENDING:,} pending, their slots and queue) in {seeded:.0f} s")
    print(f"{'ms (median/max of 20)':24s} {'empty':>13s} {'deep':>13s}   target <= {TARGET_MEDIAN_MS:.0f}/"
          f"{TARGET_MAX_MS:.0f}")
    met = True
    for k in ROUTES:
        ok = deep[k]["median_ms"] <= TARGET_MEDIAN_MS and deep[k]["max_ms"] <= TARGET_MAX_MS
        met = met and ok
        print(f"{k:24s} {empty[k]['median_ms']:6.1f}/{empty[k]['max_ms']:6.1f} "
              f"{deep[k]['median_ms']:6.1f}/{deep[k]['max_ms']:6.1f}   {'yes' if ok else 'no'}")
    return {"empty": empty, "deep": deep, "met": met}


def main() -> dict:
    if os.environ.get("BENCH_OWN_SERVERS") != "1":
        return run()
    from app.cli.engines import Postgres, Valkey, free_port

    root = Path(tempfile.mkdtemp(prefix="asynch-bench-reads-"))
    pg = Postgres(root / "pg", free_port(), "bench-pg", durable=False).init().start()
    valkey = Valkey(root / "valkey", free_port(), "bench-valkey", durable=False).start()
    try:
        # bench/stack.py reads these at import: set them and import it afresh.
        os.environ["BENCH_PG_ADMIN"] = pg.url(driver="postgresql")
        os.environ["BENCH_REDIS"] = valkey.url().rsplit("/", 1)[0]
        import importlib

        for mod in (stack, sys.modules.get("bench.bench_admission"), sys.modules.get("bench.bench_backlog")):
            if mod is not None:
                importlib.reload(mod)
        return run()
    finally:
        valkey.stop()
        pg.stop()


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
