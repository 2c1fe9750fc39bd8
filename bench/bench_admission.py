"""Admission: POST /v1/models/{m}/jobs (key check, form check, Redis gate,
INSERT, publish) versus a naive Flask endpoint doing only Celery .delay(),
both under gunicorn with the same settings, 32 connections, medians of 3."""
from __future__ import annotations

import json
import sys

from bench import stack
from bench.wrk import run_wrk

RUNS = int(__import__("os").environ.get("BENCH_RUNS", "3"))
SECONDS = int(__import__("os").environ.get("BENCH_SECONDS", "10"))


def main() -> dict:
    stack.apply_env()
    stack.recreate_database()
    stack.flush_redis()
    from app.config import load_settings, set_settings

    set_settings(load_settings())
    stack.create_model("bench-echo", "http://127.0.0.1:9")
    key = stack.create_key()
    body = json.dumps({"prompt": "hello", "n": 1})
    ours_port, naive_port = stack.free_port(), stack.free_port()
    ours = stack.gunicorn("api", "app.wsgi:app", ours_port)
    naive = stack.gunicorn("naive-api", "bench.naive:naive_app", naive_port)
    res = {"ours": [], "naive": []}
    try:
        for i in range(RUNS):
            for name, url, hdr in (("naive", f"http://127.0.0.1:{naive_port}/jobs", {}),
                                   ("ours", f"http://127.0.0.1:{ours_port}/v1/models/bench-echo/jobs",
                                    {"Authorization": f"Bearer {key}"})):
                r = run_wrk(url, body, hdr, seconds=SECONDS)
                r.pop("raw")
                res[name].append(r)
                print(f"  run {i + 1} {name:5s}: {r['rps']:8.1f} req/s  p50 {r['p50_ms']:.1f} ms  "
                      f"p99 {r['p99_ms']:.1f} ms  non-2xx {r['non_2xx']} {r['socket_errors']}", flush=True)
            stack.truncate_jobs()
            stack.flush_redis()
        rss = ours.rss_mb()
    finally:
        ours.stop()
        naive.stop()
    summary = {k: {m: stack.median([x[m] for x in v]) for m in ("rps", "p50_ms", "p99_ms")} for k, v in res.items()}
    summary["ratio_rps"] = summary["ours"]["rps"] / summary["naive"]["rps"]
    summary["api_rss_mb_max"] = max(rss) if rss else None
    print(f"admission: ours {summary['ours']['rps']:.0f} req/s p50 {summary['ours']['p50_ms']:.1f} ms "
          f"p99 {summary['ours']['p99_ms']:.1f} ms | naive .delay() {summary['naive']['rps']:.0f} req/s "
          f"p99 {summary['naive']['p99_ms']:.1f} ms | ratio {summary['ratio_rps']:.2f}x | "
          f"API RSS max {summary['api_rss_mb_max']:.0f} MB")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
