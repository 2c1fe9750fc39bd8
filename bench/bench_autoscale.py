"""How the autoscaling signal moves: a burst of jobs onto one worker node,
then the drain, sampling GET /metrics/cluster every 0.5 s and printing the
three per-model series a scaler reads (docs/operations.md, "Autoscaling
workers on the queue"):

  asynch_jobs{state="pending"}   asynch_jobs{state="running"}   asynch_oldest_pending_age_seconds

Midway a second worker node starts (what a scaler would do): the pending
count turns down and the oldest age stops growing.  The table goes to
docs/performance.md, "Autoscaling signal".

  python -m bench.bench_autoscale [--jobs 600] [--sleep-ms 50]
"""
from __future__ import annotations

import argparse
import re
import sys
import threading
import time

import requests

from bench import stack

SERIES = re.compile(r'^(asynch_jobs\{model="burst",state="(pending|running)"\}|'
                    r'asynch_oldest_pending_age_seconds\{model="burst"\}) (\S+)$', re.M)


def sample(base: str) -> tuple[float, float, float]:
    text = requests.get(f"{base}/metrics/cluster", timeout=10).text
    got = {"pending": 0.0, "running": 0.0, "age": 0.0}
    for m in SERIES.finditer(text):
        got[m.group(2) or "age"] = float(m.group(3))
    return got["pending"], got["running"], got["age"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--sleep-ms", type=int, default=50)
    ap.add_argument("--scale-at", type=float, default=6.0, help="seconds after the burst to add a worker node")
    args = ap.parse_args()

    stack.fresh()
    model_port, api_port = stack.free_port(), stack.free_port()
    procs = [stack.stub_model(model_port)]
    try:
        procs.append(stack.gunicorn("api", "app.wsgi:app", api_port, workers=2))
        procs.append(stack.celery_worker("w1", "workers.celery_app", "asynch-bench", concurrency=4))
        stack.create_model("burst", f"http://127.0.0.1:{model_port}", max_concurrency=16)
        key = stack.create_key()
        base = f"http://127.0.0.1:{api_port}"
        rows: list[tuple[float, float, float, float, str]] = []
        t0 = time.time()
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                p, r, a = sample(base)
                rows.append((time.time() - t0, p, r, a, ""))
                time.sleep(0.5)

        threading.Thread(target=sampler, daemon=True).start()
        time.sleep(1.5)  # idle baseline
        s = requests.Session()
        for i in range(args.jobs):  # the burst
            s.post(f"{base}/v1/models/burst/jobs", json={"sleep_ms": args.sleep_ms, "i": i},
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
        burst_end = time.time() - t0
        time.sleep(max(0.0, args.scale_at - (time.time() - t0 - burst_end)))
        scaled = time.time() - t0
        procs.append(stack.celery_worker("w2", "workers.celery_app", "asynch-bench", concurrency=4))
        deadline = time.time() + 300
        while time.time() < deadline and (not rows or rows[-1][1] + rows[-1][2] > 0):
            time.sleep(0.5)
        time.sleep(1.5)
        stop.set()
        print(f"burst of {args.jobs} jobs ({args.sleep_ms} ms each) ended at {burst_end:.1f}s; "
              f"second worker node (4 processes) started at {scaled:.1f}s")
        print(f"{'t (s)':>6} {'pending':>8} {'running':>8} {'oldest age (s)':>15}")
        for t, p, r, a, _ in rows[::2]:
            print(f"{t:6.1f} {p:8.0f} {r:8.0f} {a:15.1f}")
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    sys.exit(main())
