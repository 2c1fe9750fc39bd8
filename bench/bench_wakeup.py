"""Wake-up latency: 200 clients long-poll /wait on 200 jobs that finish at
staggered times; latency = client receipt - the job's finished_at (the
terminal commit).  Baseline: the same clients polling GET status every 100 ms
(what the seed's old code did at 500 ms)."""
from __future__ import annotations

import sys
import threading
import time

import requests

from bench import stack

WAITERS = 200


def _measure(api: str, key: str, ids: list[str], mode: str) -> list[float]:
    from sqlalchemy import select

    from app.clock import as_utc
    from app.infra.db import transaction
    from app.infra.tables import tasks

    got: dict[str, float] = {}
    first_sent: dict[str, float] = {}
    h = {"Authorization": f"Bearer {key}"}

    def waiter(job_id: str) -> None:
        s = requests.Session()
        url = f"{api}/v1/models/bench-echo/jobs/{job_id}"
        while True:
            first_sent.setdefault(job_id, time.time())
            if mode == "wait":
                body = s.get(url + "/wait?timeout=60000", headers=h, timeout=70).json()
            else:
                body = s.get(url, headers=h, timeout=10).json()
            if body["state"] in ("done", "failed", "timeout", "canceled"):
                got[job_id] = time.time()
                return
            if mode == "poll":
                time.sleep(0.1)

    ts = [threading.Thread(target=waiter, args=(j,)) for j in ids]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with transaction() as conn:
        fin = {r.id: as_utc(r.finished_at).timestamp()
               for r in conn.execute(select(tasks.c.id, tasks.c.finished_at).where(tasks.c.id.in_(ids)))}
    late = [j for j in ids if first_sent[j] > fin[j]]
    if late:  # a client that asked after its job ended measures its own start-up, not the wake-up
        raise RuntimeError(f"{len(late)} clients started after their job finished: raise the jobs' sleep")
    if mode == "wait":
        t0 = min(fin.values())
        worst = sorted(ids, key=lambda j: got[j] - fin[j])[-8:]
        print("   slowest at (s after the first finish):",
              ", ".join(f"{fin[j] - t0:.2f}s:{(got[j] - fin[j]) * 1000:.0f}ms" for j in worst))
    return [(got[j] - fin[j]) * 1000 for j in ids]


def _submit(api: str, key: str) -> list[str]:
    h = {"Authorization": f"Bearer {key}"}
    # Staggered finishing times over 2 s, starting 3 s after the last
    # submission at the earliest, so every client is waiting before its job
    # ends (checked in _measure) and wake-ups do not all coincide.
    return [requests.post(f"{api}/v1/models/bench-echo/jobs", json={"sleep_ms": 3000 + (i * 10) % 2000},
                          headers=h, timeout=10).json()["job_id"] for i in range(WAITERS)]


def main() -> dict:
    stack.fresh()

    mport, aport = stack.free_port(), stack.free_port()
    model = stack.stub_model(mport)
    stack.create_model("bench-echo", f"http://127.0.0.1:{mport}", max_concurrency=200)
    key = stack.create_key()
    api = stack.gunicorn("api", "app.wsgi:app", aport, workers=2, threads=160)
    api_url = f"http://127.0.0.1:{aport}"
    # Enough worker threads that 200 sleeping model calls overlap.
    worker = stack.Proc("worker", [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-P",
                                   "threads", "-c", "40", "-Q", "asynch-bench", "--without-gossip",
                                   "--without-mingle", "--loglevel", "INFO", "-n", "wake@%h"])
    worker.wait_for(r"ready\.", timeout=180)
    out = {}
    try:
        for mode in ("wait", "poll"):
            lat = _measure(api_url, key, _submit(api_url, key), mode)
            out[mode] = {"p50_ms": stack.pct(lat, 50), "p99_ms": stack.pct(lat, 99), "n": len(lat)}
            print(f"  {mode}: p50 {out[mode]['p50_ms']:.1f} ms  p99 {out[mode]['p99_ms']:.1f} ms  (n={len(lat)}; "
                  f"slowest {', '.join(f'{x:.0f}' for x in sorted(lat)[-5:])} ms)", flush=True)
    finally:
        worker.stop()
        api.stop()
        model.stop()
    print(f"wake-up ({WAITERS} waiters): long-poll p50 {out['wait']['p50_ms']:.1f} ms p99 {out['wait']['p99_ms']:.1f}"
          f" ms | 100 ms polling p50 {out['poll']['p50_ms']:.1f} ms p99 {out['poll']['p99_ms']:.1f} ms")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
