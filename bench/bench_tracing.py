"""Tracing off vs on (issue 34 item 1), side by side in one run, rounds interleaved, medians:

- admission: POST /v1/models/{m}/jobs on `asynch api` (gunicorn gevent, 2 workers), 32 concurrent
  connections from an aiohttp client for BENCH_SECONDS, one API server with no OTEL_* environment
  (tracing off: the default), one exporting every trace to an OTLP/HTTP sink in this process (on), one
  sampling 10% of the traces (parentbased_traceidratio 0.1);
- end to end: BENCH_TRACING_JOBS jobs filled while no worker runs, then drained by one worker node
  (prefork -c 2) with an instant stub model: jobs/s, the worker in each of the three environments
  (the fill too: the jobs carry their trace context);
- the hooks: the microseconds one job spends in the tracing calls of its path, in this process.

    PYTHONPATH=. python -m bench.bench_tracing     (BENCH_RUNS=3 BENCH_SECONDS=5 BENCH_TRACING_JOBS=1000)

Private servers: BENCH_REDIS (start your own redis-server) and BENCH_PG_ADMIN; the database is
asynch_bench_tracing (BENCH_DB to change it).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench import stack

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
JOBS = int(os.environ.get("BENCH_TRACING_JOBS", "1000"))
stack.DB_NAME = os.environ.get("BENCH_DB", "asynch_bench_tracing")


class Sink:
    """An OTLP/HTTP endpoint that accepts every export and counts the bytes (a collector's cost is not ours)."""

    def __init__(self) -> None:
        self.bytes = self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                owner.bytes += n
                owner.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def _api(name: str, port: int, otel: dict) -> stack.Proc:
    from app.cli.processes import api_argv
    from app.infra.metrics import group_env

    p = stack.Proc(name, api_argv(f"127.0.0.1:{port}", workers=2, threads=16, worker_class="gevent"),
                   {"ASYNCH_LOG_LEVEL": "WARNING", **group_env(), **otel})
    p.wait_for(r"Booting worker with pid")
    stack._wait_http(port)
    return p


async def _load(url: str, key: str, seconds: float, connections: int = 32) -> dict:
    import aiohttp

    lat: list[float] = []
    errors = 0
    body = json.dumps({"prompt": "hello", "n": 1})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    stop = time.monotonic() + seconds

    async def one(session):
        nonlocal errors
        while time.monotonic() < stop:
            t0 = time.monotonic()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 202:
                    errors += 1
            lat.append(time.monotonic() - t0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(one(session) for _ in range(connections)))
        took = time.monotonic() - t0
    lat.sort()
    return {"rps": len(lat) / took, "p50_ms": stack.pct(lat, 50) * 1000, "p99_ms": stack.pct(lat, 99) * 1000,
            "errors": errors}


def _tracing(otel: dict) -> None:
    """This process's tracing (the fill's submissions) as ``otel`` says."""
    from app.infra import tracing

    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[k]
    os.environ.update(otel)
    tracing.reset()


def _fill(n: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from app.jobs import handoff, service as jobs
    from app.tenancy.keys import Principal

    p = Principal("bench", "user", None)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: jobs.submit(p, "bench-echo", {"i": i}), range(n)))
    handoff.flush()


def _done() -> int:
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.state == 2)).scalar_one()


def _drain(otel: dict) -> float:
    w = stack.celery_worker("worker-tracing", "workers.celery_app", "asynch-bench", extra_env=otel)
    try:
        t0 = time.monotonic()
        while _done() < JOBS:
            if time.monotonic() - t0 > 600:
                raise RuntimeError("drain did not finish")
            time.sleep(0.02)
        return JOBS / (time.monotonic() - t0)
    finally:
        w.stop()


def hooks_per_job(otel: dict, n: int = 20000) -> float:
    """Microseconds one job spends in the tracing hooks of its path (submit, admission, claim, model call,
    storage, terminal write, a delivery), in this process, the way ``otel`` sets tracing: with it off, the
    whole cost tracing adds to a job."""
    from types import SimpleNamespace

    from app.infra import tracing
    from app.jobs import traces

    _tracing(otel)
    token = tracing.accept(None, None)
    tracing.for_new_job("job_warm", "m", "t")  # the SDK's import and provider: once per process, not per job
    now = time.time()
    t0 = time.perf_counter()
    for i in range(n):  # the loop's own cost (the rows), subtracted below
        SimpleNamespace(id=f"job_{i}", model_name="m", tenant_id="t", attempt=1, retry_count=0, busy_count=0,
                        priority=5, worker="w", created_at=None, enqueue_at=None, started_at=None,
                        traceparent=None, tracestate=None)
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        ctx = tracing.for_new_job(f"job_{i}", "m", "t")
        row = SimpleNamespace(id=f"job_{i}", model_name="m", tenant_id="t", attempt=1, retry_count=0, busy_count=0,
                              priority=5, worker="w", created_at=None, enqueue_at=None, started_at=None,
                              traceparent=ctx.get("traceparent"), tracestate=ctx.get("tracestate"))
        if tracing.enabled():
            from datetime import datetime, timezone
            row.created_at = row.enqueue_at = row.started_at = datetime.fromtimestamp(now, timezone.utc)
            tracing.record_many("asynch.admission", [row], now, now, {"asynch.batch": 1})
        traces.claimed([row], now, now)
        with tracing.client_call("asynch.model_call", row, "POST", "http://127.0.0.1:9/x") as traced:
            traced.answered(200)
        with tracing.span("asynch.storage", row):
            pass
        traces.written([row], now, now, "done")
        with tracing.client_call("asynch.delivery", row, "GET", "http://127.0.0.1:9/cb") as traced:
            traced.answered(200)
    took = (time.perf_counter() - t0 - bare) / n * 1e6
    tracing.flush()
    tracing.forget(token)
    _tracing({})
    return took


def main() -> dict:
    stack.fresh()
    sink = Sink()
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_SERVICE_NAME": "bench"}
    modes = {"off": {}, "on": on,
             "10%": {**on, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}}
    model_port = stack.free_port()
    model = stack.stub_model(model_port)
    stack.create_model("bench-echo", f"http://127.0.0.1:{model_port}")
    key = stack.create_key()
    apis = {}
    adm: dict[str, list[dict]] = {m: [] for m in modes}
    e2e: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for mode, otel in modes.items():
            port = stack.free_port()
            apis[mode] = (_api(f"api-tracing-{mode}", port, otel), f"http://127.0.0.1:{port}/v1/models/bench-echo/jobs")
        for i in range(RUNS):
            for mode in modes:
                r = asyncio.run(_load(apis[mode][1], key, SECONDS))
                adm[mode].append(r)
                print(f"  run {i + 1} admission tracing {mode:3s}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:5.1f} ms  "
                      f"p99 {r['p99_ms']:6.1f} ms  errors {r['errors']}", flush=True)
        # The API servers hand their last jobs to the dispatcher after a load ends: stopped before the
        # end-to-end rounds start from empty tables and an empty Redis.
        for p, _u in apis.values():
            p.stop()
        stack.truncate_jobs()
        stack.flush_redis()
        for i in range(RUNS):
            for mode, otel in modes.items():
                _tracing(otel)
                _fill(JOBS)
                rate = _drain(otel)
                e2e[mode].append(rate)
                print(f"  run {i + 1} end to end tracing {mode:3s}: {rate:7.1f} jobs/s", flush=True)
                stack.truncate_jobs()
                stack.flush_redis()
    finally:
        _tracing({})
        for p, _u in apis.values():
            p.stop()
        model.stop()
    out = {"hooks_us_off": hooks_per_job({}),  # on: fewer jobs, and a queue that holds them all (none dropped)
           "hooks_us_on": hooks_per_job({**modes["on"], "OTEL_BSP_MAX_QUEUE_SIZE": "100000"}, 3000),
           "hooks_us_on_10pct": hooks_per_job({**modes["on"], "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                               "OTEL_TRACES_SAMPLER_ARG": "0.1"}, 5000)}
    print(f"tracing hooks per job, in process: off {out['hooks_us_off']:.2f} us | on {out['hooks_us_on']:.1f} us "
          f"| on, 10% of traces sampled {out['hooks_us_on_10pct']:.1f} us (spans made, queued, and encoded by the "
          "SDK's export thread meanwhile)")
    for mode in modes:
        out[f"admission_rps_{mode}"] = stack.median([r["rps"] for r in adm[mode]])
        out[f"admission_p99_ms_{mode}"] = stack.median([r["p99_ms"] for r in adm[mode]])
        out[f"e2e_jobs_s_{mode}"] = stack.median(e2e[mode])
    print(f"admission ({SECONDS:.0f} s x {RUNS}, 32 connections): tracing off {out['admission_rps_off']:.0f} req/s "
          f"p99 {out['admission_p99_ms_off']:.1f} ms | on {out['admission_rps_on']:.0f} req/s "
          f"p99 {out['admission_p99_ms_on']:.1f} ms ({out['admission_rps_on'] / out['admission_rps_off']:.2f}x) | "
          f"on, 10% sampled {out['admission_rps_10%']:.0f} req/s p99 {out['admission_p99_ms_10%']:.1f} ms "
          f"({out['admission_rps_10%'] / out['admission_rps_off']:.2f}x)")
    print(f"end to end ({JOBS} jobs x {RUNS}): tracing off {out['e2e_jobs_s_off']:.0f} jobs/s | on "
          f"{out['e2e_jobs_s_on']:.0f} jobs/s ({out['e2e_jobs_s_on'] / out['e2e_jobs_s_off']:.2f}x) | on, 10% sampled "
          f"{out['e2e_jobs_s_10%']:.0f} jobs/s ({out['e2e_jobs_s_10%'] / out['e2e_jobs_s_off']:.2f}x); "
          f"the sink took {sink.requests} exports, {sink.bytes / 1e6:.1f} MB")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
