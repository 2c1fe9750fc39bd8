"""Admission: POST /v1/models/{m}/jobs (key check, form check, the gate, the
durable row, the doorbell) against a hand-written Flask endpoint doing only
Celery ``.delay()``, under gunicorn, 32 connections (wrk), medians of the
rounds, all in one run and interleaved round by round.

Servers:
  ours (gevent)   what `asynch api` runs: gunicorn gevent, 2 workers (group
                  commit batches the requests a worker holds at once)
  ours (gthread)  gunicorn gthread 2 x 16 (the other worker class we ship)
  naive (gthread) Flask + .delay(), gthread 2 x 8 (the issue's baseline)
  naive (gevent)  Flask + .delay(), gevent 2 workers
The ratio is ours (gevent) over the faster naive server of the run.

    PYTHONPATH=. python -m bench.bench_admission      (BENCH_RUNS=3 BENCH_SECONDS=10)
"""
from __future__ import annotations

import json
import os
import sys

from bench import stack
from bench.wrk import run_wrk

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))


def _ours(name: str, port: int, worker_class: str) -> stack.Proc:
    from app.cli.processes import api_argv
    from app.infra.metrics import group_env

    p = stack.Proc(name, api_argv(f"127.0.0.1:{port}", workers=2, threads=16, worker_class=worker_class),
                   {"ASYNCH_LOG_LEVEL": "WARNING", **group_env()})
    p.wait_for(r"Booting worker with pid")
    stack._wait_http(port)
    return p


def _naive(name: str, port: int, worker_class: str) -> stack.Proc:
    import sys as _sys

    args = ["-k", "gevent", "--worker-connections", "1000"] if worker_class == "gevent" else ["-k", "gthread",
                                                                                              "--threads", "8"]
    p = stack.Proc(name, [_sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "2", *args,
                          "--backlog", "2048", "bench.naive:naive_app"])
    p.wait_for(r"Booting worker with pid")
    stack._wait_http(port)
    return p


def main() -> dict:
    stack.fresh()

    stack.create_model("bench-echo", "http://127.0.0.1:9")
    key = stack.create_key()
    body = json.dumps({"prompt": "hello", "n": 1})
    servers: dict[str, tuple[stack.Proc, str, dict]] = {}
    try:
        for name, start, kind in (("ours-gevent", _ours, "gevent"), ("ours-gthread", _ours, "gthread"),
                                  ("naive-gthread", _naive, "gthread"), ("naive-gevent", _naive, "gevent")):
            port = stack.free_port()
            proc = start(name, port, kind)
            if name.startswith("ours"):
                url, hdr = f"http://127.0.0.1:{port}/v1/models/bench-echo/jobs", {"Authorization": f"Bearer {key}"}
            else:
                url, hdr = f"http://127.0.0.1:{port}/jobs", {}
            servers[name] = (proc, url, hdr)
        res: dict[str, list[dict]] = {n: [] for n in servers}
        for i in range(RUNS):
            for name, (_p, url, hdr) in servers.items():
                r = run_wrk(url, body, hdr, seconds=SECONDS)
                r.pop("raw")
                res[name].append(r)
                print(f"  run {i + 1} {name:13s}: {r['rps']:8.1f} req/s  p50 {r['p50_ms']:.1f} ms  "
                      f"p99 {r['p99_ms']:.1f} ms  non-2xx {r['non_2xx']} {r['socket_errors']}", flush=True)
            stack.truncate_jobs()
            stack.flush_redis()
        rss = {n: max(p.rss_mb() or [0]) for n, (p, _u, _h) in servers.items()}
    finally:
        for p, _u, _h in servers.values():
            p.stop()
    summary = {k: {m: stack.median([x[m] for x in v]) for m in ("rps", "p50_ms", "p99_ms")} for k, v in res.items()}
    best_naive = max(("naive-gthread", "naive-gevent"), key=lambda n: summary[n]["rps"])
    summary["ratio_rps"] = summary["ours-gevent"]["rps"] / summary[best_naive]["rps"]
    summary["api_rss_mb_max"] = rss["ours-gevent"]
    for n in servers:
        s = summary[n]
        print(f"admission {n:13s}: {s['rps']:7.0f} req/s  p50 {s['p50_ms']:5.1f} ms  p99 {s['p99_ms']:6.1f} ms  "
              f"RSS max {rss[n]:.0f} MB per process")
    print(f"admission: ours (gevent) / {best_naive} = {summary['ratio_rps']:.2f}x "
          f"(target >= 1.0x, p99 <= 60 ms); API RSS max {summary['api_rss_mb_max']:.0f} MB (target <= 120 MB)")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
