"""Capacity isolation, measured: what tenant A's misbehaviour costs tenant B,
each figure beside its baseline (the same measurement without A) in the
same run, with the ratio.

  waiters   B's submit p99 with and without A's long-polls (bench_waiters)
  backlog   B's one job (0.5 s) alone, and behind A's 150 queued 0.5 s jobs
            (A at max_concurrency 2; one worker node, 2 processes)
  tarpit    B's 20 jobs alone, and while A's 8 callbacks hit a receiver that
            sends one byte every 0.5 s (job worker -c 2, callback worker -c 2)
  deep      A's queue 1,000 vs 100,000 jobs deep (max_concurrency 4, 20 ms
            jobs, 20 s): jobs done/s, run_job messages published/s (broker
            LPUSH calls), worker CPU s/s -- flat means the backlog costs nothing
  cost      tenants of 0.1 s and of 2 s jobs at equal weight, both backlogged
            (one node, 2 processes, dispatch window 2): each one's model time
            (worker seconds, claim to end) over 30 s, by cost
            (ASYNCH_DISPATCH_FAIRNESS=cost) and by turns (the old stride
            scheduling) in the same run; the target is within 10% by cost

Usage: PYTHONPATH=. python -m bench.bench_fairness [waiters backlog tarpit deep cost] (--cost: cost alone)
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import redis
import requests

from bench import stack

CLK = os.sysconf("SC_CLK_TCK")


def _api(port: int):
    return stack.Proc("fair-api", [sys.executable, "-m", "app.cli", "api", "--bind", f"127.0.0.1:{port}",
                                   "--workers", "2"])


def _setup(mport: int) -> tuple[str, str, str]:
    from app.tenancy.keys import create_key

    stack.create_model("fair", f"http://127.0.0.1:{mport}", route="/echo", max_concurrency=2, queue_limit=100_000,
                       timeout_seconds=30)
    a, _ = create_key("tenant-a", "user")
    b, _ = create_key("tenant-b", "user")
    admin, _ = create_key("ops", "admin")
    return a, b, admin


def _submit(base: str, key: str, body: dict, **headers) -> str:
    r = requests.post(f"{base}/v1/models/fair/jobs", json=body, headers={"Authorization": f"Bearer {key}", **headers},
                      timeout=30)
    r.raise_for_status()
    return r.json()["job_id"]


def _wait_done(base: str, key: str, ids: list[str], give_up: float = 120) -> float:
    t0 = time.monotonic()
    pending = set(ids)
    while pending:
        for j in list(pending):
            r = requests.get(f"{base}/v1/models/fair/jobs/{j}/wait?timeout=2000",
                             headers={"Authorization": f"Bearer {key}"}, timeout=10)
            if r.json()["state"] in ("done", "failed", "timeout", "canceled"):
                pending.discard(j)
        if time.monotonic() - t0 > give_up:
            return float("inf")
    return time.monotonic() - t0


def _timed(base: str, key: str, bodies: list[dict]) -> float:
    t0 = time.monotonic()
    ids = [_submit(base, key, b) for b in bodies]
    _wait_done(base, key, ids)
    return time.monotonic() - t0


def backlog(base: str, a: str, b: str) -> dict:
    alone = _timed(base, b, [{"sleep_ms": 500, "who": "b"}])
    backlog_ids = [_submit(base, a, {"sleep_ms": 500, "i": i}) for i in range(150)]
    time.sleep(1.0)  # A's first jobs running, the rest queued
    behind = _timed(base, b, [{"sleep_ms": 500, "who": "b-behind"}])
    for j in backlog_ids:  # let the workers go
        requests.post(f"{base}/v1/models/fair/jobs/{j}/cancel", headers={"Authorization": f"Bearer {a}"}, timeout=10)
    print(f"backlog: B's one 0.5 s job alone {alone:.2f} s | behind A's 150 queued jobs {behind:.2f} s | "
          f"ratio {behind / alone:.2f} (target: own time + about one of A's 0.5 s jobs)")
    return {"alone": alone, "behind": behind}


class _Tarpit:
    """Accepts, then sends an HTTP status line one byte every 0.5 s."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn) -> None:
        try:
            for ch in b"HTTP/1.1 200 OK\r\n" * 100:
                conn.send(bytes([ch]))
                time.sleep(0.5)
        except OSError:
            pass
        finally:
            conn.close()


def tarpit(base: str, a: str, b: str) -> dict:
    pit = _Tarpit()
    bodies = [{"sleep_ms": 50, "i": i} for i in range(20)]
    alone = _timed(base, b, bodies)
    for i in range(8):
        _submit(base, a, {"i": i}, **{"X-Callback-Url": f"http://127.0.0.1:{pit.port}/hook"})
    time.sleep(1.0)  # A's jobs done, their callbacks in the tarpit
    during = _timed(base, b, bodies)
    pit.stop = True
    pit.sock.close()
    print(f"tarpit: B's 20 jobs alone {alone:.2f} s | while A's callbacks hit a tarpit {during:.2f} s | "
          f"ratio {during / alone:.2f} (bound: 3x + 2 s = {3 * alone + 2:.2f} s)")
    return {"alone": alone, "during": during}


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / CLK
        except (FileNotFoundError, IndexError):
            pass
    return total


def _deep_fill(n: int) -> None:
    """``n`` admitted jobs of tenant A, as admission leaves them (row, gate
    slots, tenant queue), written in bulk: 100,000 through HTTP would take
    minutes and measure admission, not the backlog."""
    import json
    import secrets
    from datetime import datetime, timezone

    import psycopg2
    from psycopg2.extras import execute_values

    from app.infra.redis import dispatch as rd
    from app.infra.redis import keys
    from app.infra.redis.client import get_redis

    now = datetime.now(timezone.utc)
    ids = [f"job_{secrets.token_hex(12)}" for _ in range(n)]
    conn = psycopg2.connect(stack.db_dsn())
    with conn, conn.cursor() as cur:
        rows = [(j, "tenant-a", "fair", json.dumps({"sleep_ms": 20}), "h", 0, now, now, now) for j in ids]
        execute_values(cur, "INSERT INTO asynch_task (id, tenant_id, model_name, request_payload, request_hash, "
                       "state, created_at, enqueue_at, updated_at) VALUES %s", rows, page_size=5000)
    conn.close()
    r = get_redis()
    for i in range(0, n, 5000):
        chunk = ids[i:i + 5000]
        r.zadd(keys.gate("fair"), {j: time.time() for j in chunk})
        r.zadd(keys.tenant_gate("fair", "tenant-a"), {j: time.time() for j in chunk})
        rd.enqueue("fair", [("tenant-a", j, i + k, 0, "") for k, j in enumerate(chunk)], cap=4, most=0)


def deep(worker_pids, depth: int, seconds: float = 20.0) -> dict:
    from sqlalchemy import func, select, text

    from app.infra.db import get_engine
    from app.infra.tables import tasks
    from app.jobs import dispatch
    from app.maintenance.recovery import model_caps

    with get_engine().begin() as c:
        c.execute(text("TRUNCATE asynch_task CASCADE"))
    stack.flush_redis()
    _deep_fill(depth)
    broker = stack.redis_db(stack.BROKER_DB)
    dispatch.kick_all(model_caps())

    def done() -> int:
        with get_engine().connect() as c:
            return c.execute(select(func.count()).select_from(tasks).where(tasks.c.state == 2)).scalar_one()

    def lpushes() -> int:
        return int(broker.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))

    time.sleep(2)  # warm
    d0, p0, c0, t0 = done(), lpushes(), _cpu(worker_pids()), time.monotonic()
    time.sleep(seconds)
    d1, p1, c1, t1 = done(), lpushes(), _cpu(worker_pids()), time.monotonic()
    span = t1 - t0
    out = {"jobs_per_s": (d1 - d0) / span, "lpush_per_s": (p1 - p0) / span, "worker_cpu": (c1 - c0) / span}
    print(f"deep, {depth:>7,} queued: {out['jobs_per_s']:.1f} jobs/s, {out['lpush_per_s']:.1f} broker LPUSH/s, "
          f"worker CPU {out['worker_cpu']:.2f} s/s")
    return out


def model_seconds(tenants, t0, t1) -> dict[str, float]:
    """Worker seconds each tenant's attempts held within [t0, t1] (claim to
    end; a running one: to t1), from the rows."""
    from sqlalchemy import select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        rows = conn.execute(select(tasks.c.tenant_id, tasks.c.started_at, tasks.c.finished_at).where(
            tasks.c.tenant_id.in_(tenants), tasks.c.started_at.is_not(None))).all()
    out = dict.fromkeys(tenants, 0.0)
    for t, start, end in rows:
        out[t] += max(0.0, (min(end or t1, t1) - max(start, t0)).total_seconds())
    return out


def cost(fairness: str, seconds: float = 30.0, warmup: float = 4.0) -> dict:
    from datetime import timedelta

    from app.clock import now
    from app.config import get_settings, set_settings
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    stack.truncate_jobs()
    stack.flush_redis()
    set_settings(get_settings().with_overrides(dispatch_fairness=fairness))
    worker = stack.celery_worker(f"fair-cost-{fairness}", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"], 2,
                                 {"ASYNCH_DISPATCH_FAIRNESS": fairness})
    try:
        for i in range(480):
            for tenant, ms in (("fast", 100),) + ((("slow", 2000),) if i % 8 == 0 else ()):
                jobs.submit(Principal(tenant, "user", None), "costly", {"sleep_ms": ms, "i": i},
                            jobs.SubmitOptions(model_key=f"X-Stub-Tenant:{tenant}"))
        t0 = now() + timedelta(seconds=warmup)
        time.sleep(warmup + seconds)
        got = model_seconds(("fast", "slow"), t0, t0 + timedelta(seconds=seconds))
    finally:
        worker.stop()
    spread = abs(got["fast"] - got["slow"]) / max(max(got.values()), 1e-9)
    print(f"cost, by {fairness:5}: model seconds in {seconds:.0f} s: 0.1 s jobs {got['fast']:.1f}, "
          f"2 s jobs {got['slow']:.1f} (slow's share {got['slow'] / max(sum(got.values()), 1e-9):.0%}, "
          f"apart by {spread:.0%})")
    return {**got, "spread": spread}


def main(parts: list[str]) -> None:
    parts = ["cost" if p == "--cost" else p for p in parts]
    stack.fresh(ASYNCH_DELIVERY_ALLOW_HOSTS="127.0.0.1", ASYNCH_DELIVERY_TIMEOUT_SECONDS="2",
                ASYNCH_DELIVERY_BACKOFF_SECONDS="0.2", ASYNCH_WORKER_METRICS_PORT="0")
    if "waiters" in parts:
        from bench import bench_waiters

        bench_waiters.main()
    mport, port = stack.free_port(), stack.free_port()
    procs = [stack.stub_model(mport)]
    try:
        a, b, _admin = _setup(mport)
        if "cost" in parts:  # before the others' worker, which would serve its jobs too
            stack.create_model("costly", f"http://127.0.0.1:{mport}", route="/echo", max_concurrency=10,
                               queue_limit=100_000, timeout_seconds=30, model_key_headers="X-Stub-Tenant")
            by_cost, by_turns = cost("cost"), cost("turns")
            print(f"cost: apart by {by_cost['spread']:.0%} by cost (target <= 10%) vs {by_turns['spread']:.0%} "
                  "by turns")
        if not set(parts) & {"backlog", "tarpit", "deep"}:
            return
        procs.append(_api(port))
        procs[-1].wait_for(r"Booting worker|Listening at", 60)
        stack._wait_http(port)
        base = f"http://127.0.0.1:{port}"
        worker = stack.celery_worker("fair-w", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"], 2)
        procs.append(worker)
        procs.append(stack.celery_worker("fair-cb", "workers.celery_app", "asynch-callbacks", 2))
        if "backlog" in parts:
            backlog(base, a, b)
        if "tarpit" in parts:
            tarpit(base, a, b)
        if "deep" in parts:
            from app.catalog.registry import update_model
            from app.catalog.schemas import ModelPatch

            update_model("fair", ModelPatch(max_concurrency=4))
            shallow = deep(worker.pids, 1_000)
            deeper = deep(worker.pids, 100_000)
            print("deep: ratio 100,000 / 1,000 queued: "
                  + ", ".join(f"{k} {deeper[k] / shallow[k]:.2f}" for k in shallow if shallow[k]))
    finally:
        for p in reversed(procs):
            p.stop()

if __name__ == "__main__":
    main(sys.argv[1:] or ["backlog", "tarpit", "deep"])
