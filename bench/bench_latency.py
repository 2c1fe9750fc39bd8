"""Latency a caller sees (docs/performance.md, "Latency"), idle and loaded:

- submit -> model-call start: the client's send time to the stub model's
  receipt of the call (the stub runs in this process: one clock);
- terminal commit -> a waiting client: the job's finished_at to the receipt
  of its long-poll ``/wait`` answer.

Baselines in the same run: a bare Celery ``.delay()`` to the same stub
(submit -> call start, same worker shape: prefork -c 2), and the same client
polling GET status every 100 ms (wake-up, idle).

Idle: one job at a time, 20 a second.  Loaded: open-loop submissions at 80%
of the throughput measured first in this run (1,000 jobs through the API as
fast as 8 clients go, to the last done); every 10th job is waited on.  A
waited-on job sleeps 10 ms at the stub so its waiter is waiting before it
ends; a wait that still arrived after the end is not counted (reported).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from bench import stack

N_IDLE = int(os.environ.get("BENCH_LATENCY_JOBS", "200"))
LOAD_SECONDS = float(os.environ.get("BENCH_LATENCY_SECONDS", "10"))
SAMPLE_SLEEP_MS = 10


class Run:
    """One phase's submissions: tag -> send time, tag -> job id, and the wake-up samples."""

    def __init__(self, api: str, key: str) -> None:
        self.api, self.h = api, {"Authorization": f"Bearer {key}"}
        self.sent: dict[str, float] = {}
        self.jobs: dict[str, str] = {}
        self.woke: dict[str, tuple[float, float]] = {}  # job id -> (wait sent, answer received)
        self.waiters: list[threading.Thread] = []
        self.local = threading.local()

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "s"):
            self.local.s = requests.Session()
        return self.local.s

    def submit(self, wait: str | None = None) -> None:
        """One job; ``wait``: 'wait' (long-poll) or 'poll' (every 100 ms) for its end."""
        tag = uuid.uuid4().hex
        body = {"n": tag, "sleep_ms": SAMPLE_SLEEP_MS} if wait else {"n": tag}
        self.sent[tag] = time.time()
        r = self._session().post(f"{self.api}/v1/models/bench-echo/jobs", json=body, headers=self.h, timeout=30)
        r.raise_for_status()
        self.jobs[tag] = job_id = r.json()["job_id"]
        if wait:
            t = threading.Thread(target=self._wait, args=(job_id, wait), daemon=True)
            t.start()
            self.waiters.append(t)

    def _wait(self, job_id: str, mode: str) -> None:
        s, url = requests.Session(), f"{self.api}/v1/models/bench-echo/jobs/{job_id}"
        first = time.time()
        while True:
            body = s.get(url + "/wait?timeout=30000" if mode == "wait" else url, headers=self.h, timeout=40).json()
            if body["state"] in ("done", "failed", "timeout", "canceled"):
                self.woke[job_id] = (first, time.time())
                return
            if mode == "poll":
                time.sleep(0.1)

    def join(self) -> None:
        for t in self.waiters:
            t.join(60)


def _started(stub, sent: dict[str, float], timeout: float = 120) -> list[float]:
    """ms from each tag's send to the stub's receipt of its call (waits for every call)."""
    deadline = time.time() + timeout
    while True:
        with stub.state.lock:
            at = {c["payload"].get("n"): c["t"] for c in stub.state.calls if isinstance(c["payload"], dict)}
        if all(t in at for t in sent) or time.time() > deadline:
            break
        time.sleep(0.05)
    missing = [t for t in sent if t not in at]
    if missing:
        raise RuntimeError(f"{len(missing)} calls never reached the stub")
    return [(at[t] - s) * 1000 for t, s in sent.items()]


def _breakdown(stub, run: Run) -> None:
    """Where submit -> call start goes, per job (medians): to the row's created_at (the API), to its
    started_at (outbox, dispatch step, broker, worker, claim commit), to the stub's receipt."""
    from sqlalchemy import select

    from app.clock import as_utc
    from app.infra.db import transaction
    from app.infra.tables import tasks

    with stub.state.lock:
        at = {c["payload"].get("n"): c["t"] for c in stub.state.calls if isinstance(c["payload"], dict)}
    with transaction() as conn:
        rows = {r.id: r for r in conn.execute(select(tasks.c.id, tasks.c.created_at, tasks.c.started_at).where(
            tasks.c.id.in_(list(run.jobs.values()))))}
    parts = {"API (send -> created_at)": [], "dispatch, broker, claim (created_at -> started_at)": [],
             "claim -> call (started_at -> stub)": []}
    for tag, job in run.jobs.items():
        r, sent = rows[job], run.sent[tag]
        c, s = as_utc(r.created_at).timestamp(), as_utc(r.started_at).timestamp()
        for name, v in zip(parts, (c - sent, s - c, at[tag] - s)):
            parts[name].append(v * 1000)
    print("   " + " | ".join(f"{k}: p50 {stack.pct(v, 50):.1f} p99 {stack.pct(v, 99):.1f} ms"
                            for k, v in parts.items()), flush=True)


def _woken(run: Run) -> tuple[list[float], int]:
    """ms from each waited-on job's terminal commit to its client's answer; and how many waits came too late."""
    from sqlalchemy import select

    from app.clock import as_utc
    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        fin = {r.id: as_utc(r.finished_at).timestamp() for r in conn.execute(
            select(tasks.c.id, tasks.c.finished_at).where(tasks.c.id.in_(list(run.woke))))}
    ok = [j for j, (first, _got) in run.woke.items() if first < fin[j]]
    return [(run.woke[j][1] - fin[j]) * 1000 for j in ok], len(run.woke) - len(ok)


def _paced(rate: float, seconds: float, fire, workers: int = 16) -> float:
    """Open loop: call ``fire(i)`` at ``rate`` a second for ``seconds``; returns the rate really sent."""
    n, t0 = int(rate * seconds), time.time()
    with ThreadPoolExecutor(workers) as ex:
        futs = []
        for i in range(n):
            delay = t0 + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            futs.append(ex.submit(fire, i))
        for f in futs:
            f.result()
    return n / (time.time() - t0)


def _line(name: str, values: list[float]) -> dict:
    out = {"p50_ms": stack.pct(values, 50), "p99_ms": stack.pct(values, 99), "n": len(values)}
    print(f"  {name}: p50 {out['p50_ms']:.1f} ms  p99 {out['p99_ms']:.1f} ms  (n={out['n']})", flush=True)
    return out


def main() -> dict:
    stack.fresh()
    from tests.stubs import StubModelServer  # the demo model, recording its calls

    stub = StubModelServer().start()
    stack.create_model("bench-echo", stub.url, max_concurrency=64)
    key, aport = stack.create_key(), stack.free_port()
    api = stack.gunicorn("api", "app.wsgi:app", aport, workers=2, threads=64)
    api_url = f"http://127.0.0.1:{aport}"
    worker = stack.celery_worker("worker", "workers.celery_app", "asynch-bench")
    naive = stack.celery_worker("naive-worker", "bench.naive", "naive")
    from bench.naive import http_call

    out: dict = {}
    try:
        # Idle: one at a time.
        for mode in ("wait", "poll"):
            run = Run(api_url, key)
            for i in range(N_IDLE // 2):
                run.submit(wait=mode)
                time.sleep(0.05)
            run.join()
            out[f"idle_start_{mode}"] = _line(f"idle, submit -> call start ({mode} clients)", _started(stub, run.sent))
            _breakdown(stub, run)
            woke, late = _woken(run)
            out[f"idle_wake_{mode}"] = _line(f"idle, terminal commit -> client ({mode}; {late} waits too late)", woke)
        sent = {}
        for i in range(N_IDLE // 2):
            tag = uuid.uuid4().hex
            sent[tag] = time.time()
            http_call.delay(stub.url + "/bench", {"n": tag})
            time.sleep(0.05)
        out["idle_start_bare"] = _line("idle, bare .delay() -> call start", _started(stub, sent))

        # Throughput through the API, then 80% of it, open loop.
        run = Run(api_url, key)
        t0 = time.time()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda _i: run.submit(), range(1000)))
        _started(stub, run.sent)
        rate = 1000 / (time.time() - t0)
        load = 0.8 * rate
        print(f"  throughput through the API: {rate:.0f} jobs/s; loaded phases at {load:.0f}/s", flush=True)
        run = Run(api_url, key)
        real = _paced(load, LOAD_SECONDS, lambda i: run.submit(wait="wait" if i % 10 == 0 else None))
        run.join()
        out["loaded_start"] = _line(f"loaded ({real:.0f}/s), submit -> call start", _started(stub, run.sent))
        _breakdown(stub, run)
        woke, late = _woken(run)
        out["loaded_wake"] = _line(f"loaded, terminal commit -> client (long-poll; {late} waits too late)", woke)
        sent = {}

        def bare(_i: int) -> None:
            tag = uuid.uuid4().hex
            sent[tag] = time.time()
            http_call.delay(stub.url + "/bench", {"n": tag})

        real = _paced(load, LOAD_SECONDS, bare)
        out["loaded_start_bare"] = _line(f"loaded ({real:.0f}/s), bare .delay() -> call start", _started(stub, sent))
        out["throughput"] = rate
    finally:
        naive.stop()
        worker.stop()
        api.stop()
        stub.stop()
    print(f"latency: idle submit->start p50 {out['idle_start_wait']['p50_ms']:.1f} p99 "
          f"{out['idle_start_wait']['p99_ms']:.1f} ms (bare .delay() p50 {out['idle_start_bare']['p50_ms']:.1f} p99 "
          f"{out['idle_start_bare']['p99_ms']:.1f}) | idle wake p50 {out['idle_wake_wait']['p50_ms']:.1f} p99 "
          f"{out['idle_wake_wait']['p99_ms']:.1f} ms (100 ms polling p50 {out['idle_wake_poll']['p50_ms']:.1f}) | "
          f"loaded at {0.8 * out['throughput']:.0f}/s: submit->start p50 {out['loaded_start']['p50_ms']:.1f} p99 "
          f"{out['loaded_start']['p99_ms']:.1f} ms (bare p50 {out['loaded_start_bare']['p50_ms']:.1f} p99 "
          f"{out['loaded_start_bare']['p99_ms']:.1f}), wake p50 {out['loaded_wake']['p50_ms']:.1f} p99 "
          f"{out['loaded_wake']['p99_ms']:.1f} ms")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
