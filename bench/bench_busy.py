"""Busy answers belong to whoever caused them, measured (issue 31 item 1), each figure beside its baseline in
the same run.  One Celery node (BENCH_WORKERS processes, default 2, as `asynch dev`), the stub model in this
process, the beat's run_work pass every 5 s (retries re-admitted, dispatch kicked), default settings.

  isolation  tenant B's 0.1 s jobs (40, 10 a second) on a model with nothing else, and again while tenant A's
             calls on the same model are refused: 429 + Retry-After: 30 for its payload (20 jobs) and for its
             own X-Model-Key (20 jobs).  B's creation -> finish p50 / p90 and the ratio (goal: <= 1.5x).
  bare       8 jobs against a bare 429 (no Retry-After) for 3 s: calls per job (goal: a handful; 21 on 58d5bec)
             and 429s in all (49 on 58d5bec).
  flaky      a flaky upstream (each call: 20 % HTTP 500, 10 % 429 + Retry-After: 1, 3 % hang until the 5 s
             timeout) and the same upstream without its 429 answers (those calls answer as usual), 150 jobs
             each, side by side at 10 a second, retry_times 3: creation -> finish p50 / p90 / max and the
             ratio of the medians (goal: <= 2x; 29.5 s against 0.8 s for a healthy model on 58d5bec).

Usage: PYTHONPATH=. python -m bench.bench_busy [isolation bare flaky]
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter

from bench import stack

WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))


def _submit(model: str, tenant: str, payload: dict, **opts) -> str:
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    return jobs.submit(Principal(tenant, "user", None), model, payload, jobs.SubmitOptions(**opts)).row.id


def _rows(ids: list[str]) -> list:
    from sqlalchemy import select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(tasks.c.id, tasks.c.state, tasks.c.created_at, tasks.c.finished_at)
                            .where(tasks.c.id.in_(ids))).all()


def _wait_ended(ids: list[str], give_up: float = 600) -> list:
    t0 = time.monotonic()
    while time.monotonic() - t0 < give_up:
        rows = _rows(ids)
        if all(r.finished_at is not None for r in rows) and len(rows) == len(ids):
            return rows
        time.sleep(0.2)
    raise RuntimeError("jobs did not end")


def _latencies(rows) -> list[float]:
    return sorted((r.finished_at - r.created_at).total_seconds() for r in rows)


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _paced(model: str, tenant: str, payloads: list[dict], rate: float, **opts) -> list[str]:
    ids, t0 = [], time.monotonic()
    for i, p in enumerate(payloads):
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        ids.append(_submit(model, tenant, p, **opts))
    return ids


def isolation(stub) -> dict:
    stack.create_model("iso", stub.url, route="/v1", max_concurrency=8, queue_limit=10_000, timeout_seconds=10,
                       model_key_headers="X-Stub-Key")
    b = [{"sleep_ms": 100, "i": i} for i in range(40)]
    alone = _latencies(_wait_ended(_paced("iso", "tenant-b", b, 10)))
    until = time.time() + 3600
    a_ids = [_submit("iso", "tenant-a", {"busy_until": until, "retry_after": "30", "i": i}) for i in range(20)]
    a_ids += [_submit("iso", "tenant-a", {"busy_key": "spent", "retry_after": "30", "i": i},
                      model_key="X-Stub-Key:spent") for i in range(20)]
    time.sleep(1.0)  # A's first answers are in: its scopes are paused
    beside = _latencies(_wait_ended(_paced("iso", "tenant-b", b, 10)))
    busy = stub.state.busy_answers
    out = {"b_alone_p50": _pct(alone, 0.5), "b_alone_p90": _pct(alone, 0.9), "b_beside_p50": _pct(beside, 0.5),
           "b_beside_p90": _pct(beside, 0.9), "a_busy_answers": busy}
    out["ratio_p50"] = out["b_beside_p50"] / out["b_alone_p50"]
    print(f"isolation: B alone p50 {out['b_alone_p50'] * 1000:.0f} ms p90 {out['b_alone_p90'] * 1000:.0f} ms; "
          f"beside A's refused calls p50 {out['b_beside_p50'] * 1000:.0f} ms p90 {out['b_beside_p90'] * 1000:.0f} ms: "
          f"{out['ratio_p50']:.2f}x (goal <= 1.5x); A drew {busy} answers of 429 meanwhile")
    return out


def bare(stub) -> dict:
    stack.create_model("bare", stub.url, route="/v1", max_concurrency=8, queue_limit=10_000, timeout_seconds=10)
    stub.state.reset()
    until = time.time() + 3
    ids = [_submit("bare", "tenant-c", {"busy_until": until, "i": i}) for i in range(8)]
    _wait_ended(ids, 120)
    calls = Counter(c["headers"].get("X-Asynch-Job-Id") for c in stub.state.calls)
    per_job = sorted(calls[j] for j in ids)
    out = {"calls_per_job": per_job, "answers_429": stub.state.busy_answers}
    print(f"bare 429 for 3 s: calls per job {per_job} (goal: a handful; 21 on 58d5bec), "
          f"{out['answers_429']} answers of 429 in all (49 on 58d5bec)")
    return out


def flaky(stub) -> dict:
    common = dict(route="/v1", max_concurrency=8, queue_limit=10_000, timeout_seconds=5, retry_times=3)
    stack.create_model("flaky", stub.url, **common)
    stack.create_model("flaky-no429", stub.url, **common)
    n, out = int(os.environ.get("BENCH_FLAKY_JOBS", "150")), {}
    ids: dict[str, list[str]] = {"flaky": [], "flaky-no429": []}

    def run(model: str, busy: float) -> None:
        body = {"sleep_ms": 100, "flaky": [20, busy, 3], "retry_after": "1"}
        ids[model] = _paced(model, f"tenant-{model}", [{**body, "i": i} for i in range(n)], 10)

    threads = [threading.Thread(target=run, args=m) for m in (("flaky", 10), ("flaky-no429", 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, jids in ids.items():
        rows = _wait_ended(jids)
        lat = _latencies(rows)
        done = sum(1 for r in rows if r.state == 2)
        out[model] = {"p50": _pct(lat, 0.5), "p90": _pct(lat, 0.9), "max": lat[-1], "done": done, "jobs": n}
    out["ratio_p50"] = out["flaky"]["p50"] / out["flaky-no429"]["p50"]
    for model in ("flaky-no429", "flaky"):
        r = out[model]
        print(f"flaky upstream{' with' if model == 'flaky' else ' without'} its 429 answers: creation -> finish "
              f"p50 {r['p50']:.2f} s p90 {r['p90']:.2f} s max {r['max']:.1f} s, {r['done']}/{r['jobs']} done")
    print(f"flaky: the 429 answers cost {out['ratio_p50']:.2f}x at the median (goal <= 2x; on 58d5bec 29.5 s "
          f"against 0.8 s for a healthy model)")
    return out


def main(argv: list[str]) -> None:
    parts = argv or ["isolation", "bare", "flaky"]
    stack.fresh()
    from app.maintenance import passes
    from tests.stubs import StubModelServer

    worker = stack.celery_worker("busy", "workers.celery_app", "asynch-bench", WORKERS)
    stop = threading.Event()

    def beat():  # the leader's run_work every ASYNCH_BEAT_RETRY_SECONDS (5 s)
        while not stop.wait(5.0):
            try:
                passes.run_work(0)
            except Exception as exc:  # a pass that failed is the next one's
                print(f"run_work: {exc}", file=sys.stderr)

    threading.Thread(target=beat, daemon=True).start()
    results = {}
    try:
        with StubModelServer() as stub:
            for part in parts:
                results[part] = globals()[part](stub)
    finally:
        stop.set()
        worker.stop()
    print("BUSY-JSON " + json.dumps(results, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
